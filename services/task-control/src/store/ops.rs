//! Creating tasks, and the commands anyone with the right may give one: cancel, pause, resume.
//! Each is decided by [`decide`](hark_core::domain::decide::decide) and applied by
//! [`apply`](super::apply).

use std::time::Duration;

use hark_core::domain::{
    DeadlinePolicy, Owner, TaskId, TimeoutPolicy, decide::Command, form::FormQuestion,
};
use hark_proto::v1 as pb;
use uuid::Uuid;

use super::{ChatRoute, Error, Store, TaskRow};

/// A task to create.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub owner: Owner,
    pub goal: String,
    pub chat: Option<ChatRoute>,
    /// Default deadline of its questions.
    pub ask_timeout: Duration,
    pub on_timeout: TimeoutPolicy,
    /// Idempotency key: creating twice with one key returns the first task.
    pub request_id: Option<String>,
    /// How many tasks that have not ended the owner may have, this one included; `0`: no limit
    /// (`task.max_active_per_owner`).
    pub active_limit: u32,
    /// The questions of a questionnaire, which no agent runs; `None` for an agent task.
    pub questionnaire: Option<Vec<FormQuestion>>,
    /// The schedule whose run starts it.
    pub schedule: Option<Uuid>,
    /// Claimed before every pending task of a lower priority (`-100..=100`, `0` by default).
    pub priority: i16,
    /// How long it may take from its creation, across all its questions and runs; `None`: no
    /// deadline.
    pub deadline: Option<Duration>,
    /// What the deadline's passing does to it.
    pub on_deadline: DeadlinePolicy,
}

impl Store {
    /// Creates a task in `pending` and queues its first run, in one statement. A request id used
    /// before returns the task it created; an owner at `new.active_limit` is refused.
    pub async fn create_task(&self, new: &NewTask) -> Result<TaskRow, Error> {
        let id = TaskId::new();
        let created = self
            .decide(super::batch::CreateRequest {
                id,
                new: new.clone(),
                job: self.effects.run(id, 1, pb::RunReason::Start),
            })
            .await?;
        if let super::batch::Created::New(task) = created {
            self.routes.remember(task.id, task.chat());
            tracing::info!(task = %task.id, owner = %task.owner, "task created");
            return Ok(*task);
        }
        // The request id was used before: that task is the answer.
        if let Some(request_id) = &new.request_id
            && let Some(task) = sqlx::query_as::<_, TaskRow>(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE request_id = $1"
            ))
            .bind(request_id)
            .fetch_optional(&self.pool)
            .await?
        {
            return Ok(task);
        }
        Err(Error::TooManyActive {
            owner: new.owner.to_string(),
            active: self.active_tasks_of(&new.owner).await?,
        })
    }

    /// Cancels a task that has not ended; its open question is closed as cancelled and the chat
    /// is told, in one statement.
    pub async fn cancel(&self, task: TaskId, actor: &str, reason: &str) -> Result<TaskRow, Error> {
        let cancelled = self
            .command(task, Command::Cancel { reason }, actor, reason)
            .await?;
        tracing::info!(task = %task, by = actor, "task cancelled");
        Ok(cancelled)
    }

    /// Pauses a task: a pending or waiting one at once, a running one at its next round
    /// boundary. A paused task holds no worker, and its question's deadline stands still.
    pub async fn pause(&self, task: TaskId, actor: &str) -> Result<TaskRow, Error> {
        self.command(task, Command::Pause, actor, "").await
    }

    /// Resumes a paused task: it waits on its open question again, its deadline moved on by
    /// the time it stood still, or, with none open, it is queued to run.
    pub async fn resume(&self, task: TaskId, actor: &str) -> Result<TaskRow, Error> {
        self.command(task, Command::Resume, actor, "").await
    }
}
