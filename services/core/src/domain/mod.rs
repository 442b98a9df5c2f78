//! The task model, pure and without I/O.
//!
//! Values are parsed once where data enters (a chat frame, a gRPC request, a bus payload) into the
//! newtypes of [`ids`]; inside hark nothing re-validates a string. [`lifecycle`] holds the task
//! state machine of DESIGN.md as one transition function.

pub mod decide;
pub mod duration;
pub mod form;
pub mod ids;
pub mod lifecycle;
pub mod need;
pub mod schedule;
pub mod shape;
pub mod text;

pub use duration::HumanDuration;
pub use ids::{Handle, IdError, Owner, QuestionId, Role, StreamId, TaskId, TaskRef};
pub use lifecycle::{
    DeadlinePolicy, Event, QuestionOutcome, TaskState, TimeoutPolicy, TransitionError, transition,
};
pub use need::Need;
