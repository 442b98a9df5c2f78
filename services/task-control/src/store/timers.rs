//! What the clock finds due: questions past their deadline or near it, expired leases, runs
//! past their bound, and tasks past their own deadline. Each sweep takes its rows with
//! `FOR UPDATE SKIP LOCKED`, so any number of task-control replicas may sweep at once without
//! doing anything twice; the use cases decide what each due row becomes.

use std::time::Duration;

use hark_core::domain::{
    DeadlinePolicy, QuestionId, QuestionOutcome, TaskId, TaskState,
    decide::{self, Decision},
};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Cas, ChatRoute, Error, OutboxMessage, QuestionRow, Store};

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

/// The running tasks `$rest` picks (a condition, then its order and limit), as [`DueTask`]s,
/// locked for a sweep.
macro_rules! running_due {
    ($rest:literal) => {
        concat!(
            "SELECT t.id, t.generation, ",
            lifecycle_columns!(),
            ", t.platform, t.bot_id, t.stream, now() AS db_now FROM tasks t WHERE t.state = ",
            sql_state!(running),
            " AND ",
            $rest,
            " FOR UPDATE SKIP LOCKED"
        )
    };
}

/// Tasks a timer found due, locked until the sweep commits, so that no other replica's sweep
/// takes them meanwhile. The caller decides each one and applies the decision with
/// [`Store::apply_due`]; nothing is written until [`Store::commit_sweep`].
pub struct Sweep {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    sent: Vec<OutboxMessage>,
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep")
            .field("sent", &self.sent.len())
            .finish_non_exhaustive()
    }
}

/// A task a timer found due, as the lifecycle decides on it.
#[derive(Debug)]
pub struct Due {
    pub task: TaskId,
    generation: i64,
    pause_requested: bool,
    pub lifecycle: decide::Task,
    chat: Option<ChatRoute>,
    /// The chat message of the question that expires, which the notice answers.
    reply_to: Option<String>,
    /// The database's clock, which every deadline is set by.
    pub now: OffsetDateTime,
}

impl Sweep {
    /// A sweep of the running tasks `rows`, read and locked in `tx`.
    fn of_running(
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        rows: Vec<DueTask>,
    ) -> Result<(Sweep, Vec<Due>), Error> {
        let due = rows
            .into_iter()
            .map(DueTask::due)
            .collect::<Result<_, _>>()?;
        let sent = Vec::new();
        Ok((Sweep { tx, sent }, due))
    }
}

impl DueTask {
    /// The running task as the lifecycle decides on it (the sweeps pick running tasks, which
    /// wait on no question).
    fn due(self) -> Result<Due, Error> {
        let task = TaskId::from_uuid(self.id);
        let lifecycle = self.task.task(None).ok_or_else(|| {
            Error::Internal(format!(
                "task {task}: a sweep of running tasks read {}",
                self.task.state
            ))
        })?;
        Ok(Due {
            task,
            generation: self.generation,
            pause_requested: self.task.pause_requested,
            lifecycle,
            chat: route(&self.platform, &self.bot_id, &self.stream),
            reply_to: None,
            now: self.db_now,
        })
    }
}

impl DueQuestion {
    /// The waiting task with the question whose deadline passed; `None` when the row is not
    /// one the lifecycle knows (the question is not open).
    fn due(self) -> Option<Due> {
        let open = decide::OpenQuestion {
            handle: self.handle,
            text: self.text,
            asked_at: self.asked_at,
            deadline: self.deadline,
        };
        let lifecycle = self.task.task(Some(open))?;
        Some(Due {
            task: TaskId::from_uuid(self.task_id),
            generation: self.generation,
            pause_requested: self.task.pause_requested,
            lifecycle,
            chat: route(&self.platform, &self.bot_id, &self.stream),
            reply_to: self.chat_message_id,
            now: self.db_now,
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
    /// The waiting tasks whose open question's deadline passed, at most `limit`, the earliest
    /// deadline first.
    pub async fn questions_past_deadline(&self, limit: i64) -> Result<(Sweep, Vec<Due>), Error> {
        let mut tx = self.pool.begin().await?;
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
        let due = due.into_iter().filter_map(DueQuestion::due).collect();
        Ok((
            Sweep {
                tx,
                sent: Vec::new(),
            },
            due,
        ))
    }

    /// Reminds owners of open questions whose deadline is less than `before` away, once per
    /// question. Returns how many reminders were queued.
    pub async fn remind_questions(
        &self,
        before: Duration,
        limit: i64,
        decide: impl Fn(&QuestionRow, OffsetDateTime) -> Option<Decision>,
    ) -> Result<usize, Error> {
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
                   -- A range of the open deadlines' index: the tick reads the questions due a
                   -- reminder, not every question that waits.
                   AND deadline <= now() + $1 * interval '1 millisecond'
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
        let outbox = self.reminders(&due, decide);
        self.enqueue(&mut tx, outbox, &mut sent).await?;
        tx.commit().await?;
        self.published(sent);
        Ok(due.len())
    }

    /// Reminds the owner of the open question `id` now, deadline or not (the console's
    /// "remind"), and marks it reminded. Refused when the question is not open, its task does
    /// not wait on it (paused, say), it has no chat to remind in, or its deadline passed; and
    /// throttled: refused while a reminder went out less than [`REMIND_AGAIN_AFTER`] ago.
    pub async fn remind_now(
        &self,
        id: QuestionId,
        decide: impl Fn(&QuestionRow, OffsetDateTime) -> Option<Decision>,
    ) -> Result<QuestionRow, Error> {
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
        let outbox = self.reminders(std::slice::from_ref(&reminded), decide);
        self.enqueue(&mut tx, outbox, &mut sent).await?;
        tx.commit().await?;
        self.published(sent);
        Ok(reminded.question)
    }

    /// The chat messages that remind the owners of `due`, as `decide` decides them.
    fn reminders(
        &self,
        due: &[Reminded],
        decide: impl Fn(&QuestionRow, OffsetDateTime) -> Option<Decision>,
    ) -> Vec<OutboxMessage> {
        let mut outbox = Vec::new();
        for Reminded {
            question: q,
            db_now,
        } in due
        {
            let Some(route) = route(&q.platform, &q.bot_id, &q.stream) else {
                continue;
            };
            let Some(decision) = decide(q, *db_now) else {
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

    /// The running tasks whose lease ran out, at most `limit`, the longest lapsed first.
    pub async fn leases_lapsed(&self, limit: i64) -> Result<(Sweep, Vec<Due>), Error> {
        let mut tx = self.pool.begin().await?;
        let due = sqlx::query_as::<_, DueTask>(running_due!(
            "lease_until < now() ORDER BY lease_until LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Sweep::of_running(tx, due)
    }

    /// The running tasks whose total running time passed `max`, at most `limit`.
    pub async fn over_runtime(
        &self,
        max: Duration,
        limit: i64,
    ) -> Result<(Sweep, Vec<Due>), Error> {
        let mut tx = self.pool.begin().await?;
        let due = sqlx::query_as::<_, DueTask>(running_due!(
            "run_ms + extract(epoch FROM now() - coalesce(running_since, now())) * 1000 > $1
             LIMIT $2"
        ))
        .bind(i64::try_from(max.as_millis()).unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Sweep::of_running(tx, due)
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

    /// Applies `decision`, decided on `due`, within `sweep`, with the messages its effects
    /// imply; whether it won. A task is locked by its sweep, so it wins unless the decision
    /// does not fit the row it was decided on.
    pub async fn apply_due(
        &self,
        sweep: &mut Sweep,
        due: &Due,
        decision: Decision,
    ) -> Result<bool, Error> {
        let outbox = self.effects.of(
            due.task,
            due.generation + 1,
            due.chat.as_ref(),
            due.reply_to.as_deref(),
            &decision,
        );
        let detail = decision.error().unwrap_or_default().to_owned();
        let mut change = Cas::new(due.task, due.generation, decision, "timer");
        change.pause_guard = Some(due.pause_requested);
        change.detail = &detail;
        change.outbox = outbox;
        Ok(self
            .cas(&mut sweep.tx, change, &mut sweep.sent)
            .await?
            .is_some())
    }

    /// Commits what `sweep` applied, and publishes its messages.
    pub async fn commit_sweep(&self, sweep: Sweep) -> Result<(), Error> {
        sweep.tx.commit().await?;
        self.published(sweep.sent);
        Ok(())
    }
}
