//! Creating tasks.

use std::time::Duration;

use hark_core::domain::{DeadlinePolicy, Owner, TaskId, TimeoutPolicy, form::FormQuestion};
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
    /// Of an `external` task: who asked (the key's name) and with which key.
    pub asked_by: Option<String>,
    pub key_id: Option<Uuid>,
}

impl Store {
    /// Creates a task in `pending` and queues its first run, in one statement. A request id used
    /// before returns the task it created; an owner at `new.active_limit` is refused.
    ///
    /// A questionnaire is created waiting on its first question, in the same statement: no run
    /// job and no worker, since its first step is known.
    pub async fn create_task(&self, new: &NewTask) -> Result<TaskRow, Error> {
        let id = TaskId::new();
        let first = new
            .questionnaire
            .as_ref()
            .and_then(|q| q.first())
            .filter(|_| self.takes_form_steps());
        let created = match first {
            Some(first) => self.create_form(id, new, first).await?,
            None => match self
                .decide(super::batch::CreateRequest {
                    id,
                    new: new.clone(),
                    job: self.effects.run(id, 1, pb::RunReason::Start),
                })
                .await?
            {
                super::batch::Created::New(task) => Some(*task),
                super::batch::Created::NotInserted => None,
            },
        };
        if let Some(task) = created {
            self.routes.remember(task.id, task.fixed());
            tracing::info!(task = %task.id, owner = %task.owner, "task created");
            return Ok(task);
        }
        // The request id was used before: that task is the answer.
        if let Some(request_id) = &new.request_id
            && let Some(task) = self.task_of_request(request_id).await?
        {
            return Ok(task);
        }
        Err(Error::TooManyActive {
            owner: new.owner.to_string(),
            active: self.active_tasks_of(&new.owner).await?,
        })
    }
}
