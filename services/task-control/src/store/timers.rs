//! Work driven by the clock: question deadlines and reminders, expired leases, the bound on a
//! task's running time, and tasks' own deadlines. Each sweep takes its rows with `FOR UPDATE SKIP LOCKED`, so any number
//! of task-control replicas may sweep at once without doing anything twice.

use std::time::Duration;

use hark_core::domain::{
    DeadlinePolicy, QuestionId, QuestionOutcome, TaskId, TaskState,
    decide::{self, Command, Decision},
};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Cas, ChatRoute, Error, OutboxMessage, QuestionRow, Store};
use crate::render;

/// How long after a reminder the owner may be reminded again on request.
pub const REMIND_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// A question just marked reminded, with the database's clock.
#[derive(Debug, sqlx::FromRow)]
struct Reminded {
    #[sqlx(flatten)]
    question: QuestionRow,
    db_now: OffsetDateTime,
}

/// A task whose own deadline passed before it ended.
#[derive(Debug, Clone)]
pub struct Overdue {
    pub task: TaskId,
    /// What its deadline's passing does to it.
    pub policy: DeadlinePolicy,
    pub deadline: OffsetDateTime,
}

#[derive(Debug, sqlx::FromRow)]
struct DueQuestion {
    handle: String,
    text: String,
    asked_at: OffsetDateTime,
    deadline: Option<OffsetDateTime>,
    task_id: Uuid,
    generation: i64,
    #[sqlx(flatten)]
    task: crate::rows::Lifecycle,
    platform: Option<String>,
    bot_id: Option<String>,
    stream: Option<String>,
    chat_message_id: Option<String>,
    /// The database's clock, which every deadline is set by.
    db_now: OffsetDateTime,
}

#[derive(Debug, sqlx::FromRow)]
struct DueTask {
    id: Uuid,
    generation: i64,
    #[sqlx(flatten)]
    task: crate::rows::Lifecycle,
    platform: Option<String>,
    bot_id: Option<String>,
    stream: Option<String>,
    db_now: OffsetDateTime,
}

impl DueTask {
    /// The running task as the lifecycle decides on it (the sweeps pick running tasks, which
    /// wait on no question).
    fn lifecycle(&self) -> Result<decide::Task, Error> {
        self.task.task(None).ok_or_else(|| {
            Error::Internal(format!(
                "task {}: a sweep of running tasks read {}",
                self.id, self.task.state
            ))
        })
    }
}

fn route(
    platform: &Option<String>,
    bot_id: &Option<String>,
    stream: &Option<String>,
) -> Option<ChatRoute> {
    ChatRoute::of(platform, bot_id, stream, &None)
}

impl Store {
    /// Closes open questions whose deadline passed and applies each task's policy: `resume`
    /// queues the task with the expiry notice for the model, `fail` ends it. Returns how many
    /// questions expired.
    pub async fn expire_due(&self, limit: i64) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, DueQuestion>(concat!(
            "SELECT q.handle, q.text, q.asked_at, q.deadline, t.id AS task_id, t.generation, ",
            lifecycle_columns!(),
            ", t.platform, t.bot_id, t.stream, q.chat_message_id, now() AS db_now
             FROM questions q JOIN tasks t ON t.id = q.task_id
             WHERE q.outcome = ",
            sql_outcome!(open),
            " AND q.deadline IS NOT NULL AND q.deadline <= now()
               AND t.state = $2
             ORDER BY q.deadline
             LIMIT $1
             FOR UPDATE OF t SKIP LOCKED",
        ))
        .bind(limit)
        .bind(TaskState::WaitingInput.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let mut expired = 0;
        for q in due {
            let task = TaskId::from_uuid(q.task_id);
            let open = decide::OpenQuestion {
                handle: q.handle.clone(),
                text: q.text.clone(),
                asked_at: q.asked_at,
                deadline: q.deadline,
            };
            let Some(lifecycle) = q.task.task(Some(open)) else {
                continue;
            };
            let decision = match decide::decide(&lifecycle, &Command::Expire, q.db_now, self.policy)
            {
                Ok(decision) => decision,
                Err(refusal) => {
                    tracing::warn!(%task, %refusal, "an open question past its deadline stays open");
                    continue;
                }
            };
            let chat = route(&q.platform, &q.bot_id, &q.stream);
            let outbox = self.effects.of(
                task,
                q.generation + 1,
                chat.as_ref(),
                q.chat_message_id.as_deref(),
                &decision,
            );
            let error = decision.error().unwrap_or_default().to_owned();
            let mut change = Cas::new(task, q.generation, decision, "timer");
            change.detail = &error;
            change.outbox = outbox;
            if self.cas(&mut tx, change, &mut sent).await?.is_some() {
                expired += 1;
            }
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
        let due = sqlx::query_as::<_, Reminded>(concat!(
            "UPDATE questions SET reminded_at = now()
             WHERE id IN (
                 SELECT id FROM questions q
                 WHERE outcome = ",
            sql_outcome!(open),
            " AND reminded_at IS NULL AND deadline IS NOT NULL
                   AND stream IS NOT NULL AND deadline > now()
                   AND deadline - $1 * interval '1 millisecond' <= now()
                   AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = q.task_id AND t.state = $3)
                 ORDER BY deadline LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             RETURNING now() AS db_now, ",
            question_columns!()
        ))
        .bind(before.as_millis() as i64)
        .bind(limit)
        .bind(TaskState::WaitingInput.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let outbox = self.reminders(&due, Command::Remind { before });
        self.enqueue(&mut tx, outbox, &mut sent).await?;
        tx.commit().await?;
        self.published(sent);
        Ok(due.len())
    }

    /// Reminds the owner of the open question `id` now, deadline or not (the console's
    /// "remind"), and marks it reminded. Refused when the question is not open, its task does
    /// not wait on it (paused, say), it has no chat to remind in, or its deadline passed; and
    /// throttled: refused while a reminder went out less than [`REMIND_AGAIN_AFTER`] ago.
    pub async fn remind_now(&self, id: QuestionId) -> Result<QuestionRow, Error> {
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let reminded = sqlx::query_as::<_, Reminded>(concat!(
            "UPDATE questions q SET reminded_at = now()
             WHERE id = $1 AND outcome = ",
            sql_outcome!(open),
            " AND stream IS NOT NULL
               AND (deadline IS NULL OR deadline > now())
               AND (reminded_at IS NULL OR reminded_at <= now() - make_interval(secs => $3))
               AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = q.task_id AND t.state = $2)
             RETURNING now() AS db_now, ",
            question_columns!()
        ))
        .bind(id.as_uuid())
        .bind(TaskState::WaitingInput.as_str())
        .bind(REMIND_AGAIN_AFTER.as_secs_f64())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(reminded) = reminded else {
            let question = self.get_question(id).await?;
            if question.outcome == QuestionOutcome::Open
                && let Some(at) = question.reminded_at
                && OffsetDateTime::now_utc() - at < REMIND_AGAIN_AFTER
            {
                return Err(Error::RemindedRecently {
                    handle: question.handle,
                    again_after: REMIND_AGAIN_AFTER.as_secs(),
                });
            }
            return Err(Error::NotRemindable {
                handle: question.handle,
                why: if question.outcome != QuestionOutcome::Open {
                    "it is not open any more"
                } else if question.stream.is_none() {
                    "it was not asked in a chat; answer it here instead"
                } else {
                    "its task does not wait on it now (paused, or its deadline just passed)"
                },
            });
        };
        let outbox = self.reminders(std::slice::from_ref(&reminded), Command::Nudge);
        self.enqueue(&mut tx, outbox, &mut sent).await?;
        tx.commit().await?;
        self.published(sent);
        Ok(reminded.question)
    }

    /// The chat messages that remind the owners of `due`, as `command` decides them.
    fn reminders(&self, due: &[Reminded], command: Command<'_>) -> Vec<OutboxMessage> {
        let mut outbox = Vec::new();
        for Reminded {
            question: q,
            db_now,
        } in due
        {
            let Some(route) = route(&q.platform, &q.bot_id, &q.stream) else {
                continue;
            };
            // The statement picked the question of a task that waits on it.
            let Some(state) = q
                .open()
                .map(|question| decide::State::WaitingInput { question })
            else {
                continue;
            };
            let Ok(decision) = decide::decide_on_state(state, &command, *db_now, self.policy)
            else {
                continue;
            };
            outbox.extend(self.effects.of(
                q.task_id,
                0,
                Some(&route),
                q.chat_message_id.as_deref(),
                &decision,
            ));
        }
        outbox
    }

    /// Returns running tasks whose lease ran out to `pending`, to continue from their last
    /// checkpoint on another worker, or fails them once `max_attempts` runs were lost. Returns
    /// how many tasks were recovered or failed.
    pub async fn recover_leases(&self, max_attempts: i32, limit: i64) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let mut sent: Vec<OutboxMessage> = Vec::new();
        let due = sqlx::query_as::<_, DueTask>(concat!(
            "SELECT t.id, t.generation, ",
            lifecycle_columns!(),
            ", t.platform, t.bot_id, t.stream, now() AS db_now
             FROM tasks t
             WHERE t.state = $2 AND lease_until < now()
             ORDER BY lease_until LIMIT $1
             FOR UPDATE SKIP LOCKED",
        ))
        .bind(limit)
        .bind(TaskState::Running.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let mut moved = 0;
        let policy = decide::Policy { max_attempts };
        for t in due {
            match decide::decide(&t.lifecycle()?, &Command::LeaseExpired, t.db_now, policy) {
                Ok(decision) => {
                    if self.timer_applies(&mut tx, &t, decision, &mut sent).await? {
                        moved += 1;
                    }
                }
                Err(refusal) => tracing::warn!(task = %t.id, %refusal, "a lapsed lease stays"),
            }
        }
        tx.commit().await?;
        self.published(sent);
        Ok(moved)
    }

    /// Fails running tasks whose total running time passed `max`, and tells their workers to
    /// stop. Returns their ids.
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
        let due = sqlx::query_as::<_, DueTask>(concat!(
            "SELECT t.id, t.generation, ",
            lifecycle_columns!(),
            ", t.platform, t.bot_id, t.stream, now() AS db_now
             FROM tasks t
             WHERE t.state = $3
               AND run_ms + extract(epoch FROM now() - coalesce(running_since, now())) * 1000 > $1
             LIMIT $2
             FOR UPDATE SKIP LOCKED",
        ))
        .bind(max.as_millis() as i64)
        .bind(limit)
        .bind(TaskState::Running.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let error = format!(
            "the task ran longer than task.max_runtime = {}",
            render::human(max)
        );
        let mut failed = Vec::new();
        for t in due {
            let command = Command::Fail { error: &error };
            let decision = decide::decide(&t.lifecycle()?, &command, t.db_now, self.policy)
                .map_err(|r| Error::refused(t.id, r))?;
            // The worker still runs it: told to stop, unlike a worker that failed its own task.
            let hint = self.effects.stop_hint(TaskId::from_uuid(t.id));
            if self.timer_applies(&mut tx, &t, decision, &mut sent).await? {
                sent.push(hint);
                failed.push(TaskId::from_uuid(t.id));
            }
        }
        tx.commit().await?;
        self.published(sent);
        Ok(failed)
    }

    /// The tasks whose own deadline passed before they ended, at most `limit`, the earliest
    /// first.
    pub async fn overdue(&self, limit: i64) -> Result<Vec<Overdue>, Error> {
        let due: Vec<(Uuid, String, OffsetDateTime)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id, on_deadline, deadline_at FROM tasks
             WHERE deadline_at <= now() AND state IN ({})
             ORDER BY deadline_at LIMIT $1",
                active_states!()
            )))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        due.into_iter()
            .map(|(id, policy, deadline)| {
                let task = TaskId::from_uuid(id);
                let policy = policy
                    .parse()
                    .map_err(|e| Error::Internal(format!("task {task}: {e}")))?;
                Ok(Overdue {
                    task,
                    policy,
                    deadline,
                })
            })
            .collect()
    }

    /// Applies a timer's `decision` on the running task `t`; whether it won.
    async fn timer_applies(
        &self,
        conn: &mut sqlx::PgConnection,
        t: &DueTask,
        decision: Decision,
        sent: &mut Vec<OutboxMessage>,
    ) -> Result<bool, Error> {
        let task = TaskId::from_uuid(t.id);
        let chat = route(&t.platform, &t.bot_id, &t.stream);
        let outbox = self
            .effects
            .of(task, t.generation + 1, chat.as_ref(), None, &decision);
        let detail = decision.error().unwrap_or_default().to_owned();
        let mut change = Cas::new(task, t.generation, decision, "timer");
        change.pause_guard = Some(t.task.pause_requested);
        change.detail = &detail;
        change.outbox = outbox;
        Ok(self.cas(conn, change, sent).await?.is_some())
    }
}
