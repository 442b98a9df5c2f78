//! task-control: the only writer of hark's task state.
//!
//! - [`cases`] holds what can be asked of hark, each once (authorise, validate, decide, apply);
//!   chat, the API, the console and control requests all call it.
//! - [`store`] is the Postgres store: tasks, checkpoints, questions, instructions, the audit of
//!   transitions, applied inbound ids and the outbox, with every state change a compare-and-set.
//! - [`chat`] interprets inbound chat messages: commands, and answers routed to open questions.
//! - [`control`] answers the requests of agent workers over NATS; [`handoff`] holds idle
//!   workers' polls and hands them run jobs directly.
//! - [`api`] serves `hark.v1.TaskService` over gRPC, with health and reflection; [`console`]
//!   serves the web console on `control.http_listen` through the same API.
//! - [`timers`] sweeps deadlines, reminders, leases and running time; [`app`] wires it all up
//!   and relays the outbox.
//! - [`effects`] turns what a decision makes happen into outbox messages: run jobs, chat text
//!   (in the language of [`texts`]) and task events.
//! - [`metrics`] counts what the store decides and reads the rest at scrape time.
//! - [`watchers`] hands task events to the `WatchTask` streams of this process; [`events`] says
//!   what a task's event carries, waits for the next one after an answer, and streams many tasks'.

pub mod api;
pub mod app;
pub mod cases;
pub mod chat;
pub mod console;
pub mod control;
pub mod convert;
pub mod effects;
pub mod events;
pub mod limit;
pub mod mcp;
pub mod metrics;
pub mod parked;
pub mod render;
pub mod rows;
pub mod shared;
pub mod store;
pub mod texts;
pub mod timers;
pub mod traced;
pub mod watchers;
