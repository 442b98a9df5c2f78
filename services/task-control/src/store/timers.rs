//! Work driven by the clock: question deadlines and reminders, expired leases, and the bound on
//! a task's running time. Each sweep takes its rows with `FOR UPDATE SKIP LOCKED`, so any number
//! of task-control replicas may sweep at once without doing anything twice.

use std::time::Duration;

use hark_core::domain::{Event, TaskId, TaskState, TimeoutPolicy};
use hark_proto::v1 as pb;
use uuid::Uuid;

use super::{ChatRoute, Error, OutboxMessage, QuestionRow, Store, ops::Cas};
use crate::render;

#[derive(Debug, sqlx::FromRow)]
struct DueQuestion {
    question_id: Uuid,
    handle: String,
    task_id: Uuid,
    generation: i64,
    on_timeout: String,
    waited_ms: i64,
    platform: Option<String>,
    bot_id: Option<String>,
    stream: Option<String>,
    chat_message_id: Option<String>,
}

#[derive(Debug, sqlx::FromRow)]
struct DueTask {
    id: Uuid,
    generation: i64,
    attempt: i32,
    platform: Option<String>,
    bot_id: Option<String>,
    stream: Option<String>,
}

fn route(
    platform: &Option<String>,
    bot_id: &Option<String>,
    stream: &Option<String>,
) -> Option<ChatRoute> {
    Some(ChatRoute {
        platform: platform.clone()?,
        bot_id: bot_id.clone().unwrap_or_default(),
        stream: stream.clone()?,
        origin_message_id: None,
    })
}

impl Store {
    /// Closes open questions whose deadline passed and applies each task's policy: `resume`
    /// queues the task with the expiry notice for the model, `fail` ends it. Returns how many
    /// questions expired.
    pub async fn expire_due(&self, limit: i64) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, DueQuestion>(
            "SELECT q.id AS question_id, q.handle, t.id AS task_id, t.generation, t.on_timeout,
                    (extract(epoch FROM q.deadline - q.asked_at) * 1000)::bigint AS waited_ms,
                    t.platform, t.bot_id, t.stream, q.chat_message_id
             FROM questions q JOIN tasks t ON t.id = q.task_id
             WHERE q.outcome = 'open' AND q.deadline IS NOT NULL AND q.deadline <= now()
               AND t.state = 'waiting_input'
             ORDER BY q.deadline
             LIMIT $1
             FOR UPDATE OF t SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut expired = 0;
        for q in due {
            let task = TaskId::from_uuid(q.task_id);
            let policy: TimeoutPolicy = q.on_timeout.parse().unwrap_or_default();
            let waited = render::human(Duration::from_millis(
                u64::try_from(q.waited_ms).unwrap_or(0),
            ));
            let outcome = match policy {
                TimeoutPolicy::Resume => "the task goes on without it",
                TimeoutPolicy::Fail => "the task failed",
                TimeoutPolicy::Never => {
                    tracing::warn!(%task, "a question of a task without deadlines had one; leaving it open");
                    continue;
                }
            };
            let note = format!(
                "[task {} · #{}] no answer within {waited}; {outcome}.",
                task.short(),
                q.handle
            );
            let mut change = Cas::new(
                task,
                TaskState::WaitingInput,
                q.generation,
                Event::Expire(policy),
                "timer",
            );
            if policy == TimeoutPolicy::Resume {
                change.outbox.push(self.run_msg(
                    task,
                    q.generation + 1,
                    pb::RunReason::ResumeTimeout,
                ));
            }
            let error = format!("no answer within {waited}");
            if policy == TimeoutPolicy::Fail {
                change.error = Some(&error);
            }
            if let Some(route) = route(&q.platform, &q.bot_id, &q.stream) {
                change.outbox.extend(self.chat_msgs(
                    &route,
                    &note,
                    None,
                    q.chat_message_id.as_deref(),
                ));
            }
            if self.cas(&mut tx, change, &mut sent).await?.is_none() {
                continue;
            }
            sqlx::query("UPDATE questions SET outcome = 'expired', closed_at = now() WHERE id = $1 AND outcome = 'open'")
                .bind(q.question_id)
                .execute(&mut *tx)
                .await?;
            expired += 1;
        }
        tx.commit().await?;
        self.published(sent);
        Ok(expired)
    }

    /// Reminds owners of open questions whose deadline is less than `before` away, once per
    /// question. Returns how many reminders were queued.
    pub async fn remind_due(&self, before: Duration, limit: i64) -> Result<usize, Error> {
        if before.is_zero() {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, QuestionRow>(concat!(
            "UPDATE questions SET reminded_at = now()
             WHERE id IN (
                 SELECT id FROM questions
                 WHERE outcome = 'open' AND reminded_at IS NULL AND deadline IS NOT NULL
                   AND stream IS NOT NULL AND deadline > now()
                   AND deadline - $1 * interval '1 millisecond' <= now()
                 ORDER BY deadline LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             RETURNING ",
            question_columns!()
        ))
        .bind(before.as_millis() as i64)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut outbox = Vec::new();
        for q in &due {
            let Some(route) = route(&q.platform, &q.bot_id, &q.stream) else {
                continue;
            };
            let left = q
                .deadline
                .map(|d| (d - time::OffsetDateTime::now_utc()).unsigned_abs())
                .unwrap_or_default();
            let text = format!(
                "[task {} · #{}] still waiting for your answer ({} left): {}",
                q.task_id.short(),
                q.handle,
                render::human(left),
                q.text
            );
            outbox.extend(self.chat_msgs(&route, &text, None, q.chat_message_id.as_deref()));
        }
        self.enqueue(&mut tx, outbox, &mut sent).await?;
        tx.commit().await?;
        self.published(sent);
        Ok(due.len())
    }

    /// Returns running tasks whose lease ran out to `pending`, to continue from their last
    /// checkpoint on another worker, or fails them once `max_attempts` runs were lost. Returns
    /// how many tasks were recovered or failed.
    pub async fn recover_leases(&self, max_attempts: i32, limit: i64) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, DueTask>(
            "SELECT id, generation, attempt, platform, bot_id, stream FROM tasks
             WHERE state = 'running' AND lease_until < now()
             ORDER BY lease_until LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut moved = 0;
        for t in due {
            let task = TaskId::from_uuid(t.id);
            let error = format!(
                "the task lost its worker {} times (task.max_attempts = {max_attempts})",
                t.attempt
            );
            let change = if t.attempt >= max_attempts {
                self.timer_fails(&t, &error)
            } else {
                let mut change = Cas::new(
                    task,
                    TaskState::Running,
                    t.generation,
                    Event::LeaseExpired,
                    "timer",
                );
                change.attempt_inc = 1;
                change
                    .outbox
                    .push(self.run_msg(task, t.generation + 1, pb::RunReason::Recover));
                change
            };
            if self.cas(&mut tx, change, &mut sent).await?.is_some() {
                moved += 1;
            }
        }
        tx.commit().await?;
        self.published(sent);
        Ok(moved)
    }

    /// Fails running tasks whose total running time passed `max`. Returns their ids, so their
    /// workers can be told to stop.
    pub async fn enforce_max_runtime(
        &self,
        max: Duration,
        limit: i64,
    ) -> Result<Vec<TaskId>, Error> {
        if max.is_zero() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, DueTask>(
            "SELECT id, generation, attempt, platform, bot_id, stream FROM tasks
             WHERE state = 'running'
               AND run_ms + extract(epoch FROM now() - coalesce(running_since, now())) * 1000 > $1
             LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
        .bind(max.as_millis() as i64)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let error = format!(
            "the task ran longer than task.max_runtime = {}",
            render::human(max)
        );
        let mut failed = Vec::new();
        for t in due {
            let change = self.timer_fails(&t, &error);
            if self.cas(&mut tx, change, &mut sent).await?.is_some() {
                failed.push(TaskId::from_uuid(t.id));
            }
        }
        tx.commit().await?;
        self.published(sent);
        Ok(failed)
    }

    /// A timer failing the running task `t` with `error`, its chat told why.
    fn timer_fails<'a>(&self, t: &DueTask, error: &'a str) -> Cas<'a> {
        let task = TaskId::from_uuid(t.id);
        let mut change = Cas::new(task, TaskState::Running, t.generation, Event::Fail, "timer");
        change.error = Some(error);
        change.detail = error;
        if let Some(route) = route(&t.platform, &t.bot_id, &t.stream) {
            change
                .outbox
                .extend(self.chat_msgs(&route, &render::failed(task, error), None, None));
        }
        change
    }
}
