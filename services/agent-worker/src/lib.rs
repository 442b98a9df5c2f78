//! agent-worker: runs the LLM tool loop, keeping nothing between jobs.
//!
//! - [`worker`] pulls run jobs from `TASK_RUN`, claims tasks from task-control and runs them in
//!   a bounded number of slots; a waiting task holds no slot and no memory.
//! - [`agent`] is the loop of one task: LLM call, tools, checkpoint, until a final answer, a
//!   question (the task is handed back and forgotten), cancellation or the round limit.
//! - [`tools`] is the tool registry: schemas, roles, visibility, argument checks.
//! - [`mcp`] connects the MCP servers of `[[tools.mcp]]` and calls their tools; [`approval`]
//!   asks a tool's owner before a call that needs consent runs.
//! - [`control`] is the client of task-control's control requests.
//! - [`llm`] is the OpenAI-compatible chat-completions client; [`limits`] bounds what a round
//!   keeps of it and of tools.
//! - [`metrics`] times model and tool calls and says whether the pull loop is alive.
//! - [`scripted`] is a scripted LLM server for tests and the demo model.

pub mod agent;
pub mod approval;
pub mod control;
pub mod fetch;
pub mod limits;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod scripted;
pub mod tools;
pub mod worker;
