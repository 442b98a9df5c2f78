//! agent-worker: runs the LLM tool loop of one task at a time per slot, keeping nothing between
//! jobs. It pulls run jobs from `TASK_RUN`, claims the task from task-control, and hands every
//! round, question and result back to task-control.
