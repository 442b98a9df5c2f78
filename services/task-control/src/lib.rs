//! task-control: the only writer of hark's task state.
//!
//! - [`store`] is the Postgres store: tasks, checkpoints, questions, instructions, the audit of
//!   transitions, applied inbound ids and the outbox, with every state change a compare-and-set.
//! - [`render`] writes the short texts hark puts into chats.

pub mod render;
pub mod store;
