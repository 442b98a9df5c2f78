//! Applying decisions. Every state change goes through [`Store::cas`]: one statement that moves
//! the task from `(state, generation)` to the next state, writes the audit row and the outbox
//! messages, and reports whether it won.

use hark_core::domain::{
    QuestionOutcome, TaskId, TaskState,
    decide::{self, Decision, Effect},
};
use sqlx::{Arguments as _, AssertSqlSafe, PgConnection, postgres::PgArguments, types::Json};
use time::OffsetDateTime;

use super::{Error, Lease, OutboxMessage, Store, TaskRow};

/// One compare-and-set: a decision applied to the task it was decided for, if the task is still
/// where the decision started.
#[derive(Debug)]
pub(super) struct Cas<'a> {
    pub(super) task: TaskId,
    pub(super) generation: i64,
    pub(super) decision: Decision,
    /// When set, the row's worker must be this one (lease-guarded writes).
    pub(super) worker_guard: Option<&'a str>,
    /// When set, the row's requested pause must be this (the decision depended on it).
    pub(super) pause_guard: Option<bool>,
    pub(super) actor: &'a str,
    pub(super) detail: &'a str,
    pub(super) outbox: Vec<OutboxMessage>,
}

/// A task with its open question, when it has one.
#[derive(Debug, sqlx::FromRow)]
struct WithOpenQuestion {
    #[sqlx(flatten)]
    task: TaskRow,
    q_handle: Option<String>,
    q_text: Option<String>,
    q_asked_at: Option<OffsetDateTime>,
    q_deadline: Option<OffsetDateTime>,
}

/// The row a compare-and-set returns: the task, and for a claim what a worker needs to run it.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct CasRow {
    #[sqlx(flatten)]
    pub(super) task: TaskRow,
    pub(super) ctx_rounds: Option<Json<serde_json::Value>>,
    pub(super) ctx_question: Option<Json<serde_json::Value>>,
    pub(super) ctx_instructions: Option<Json<serde_json::Value>>,
    /// The deadline of the question an `ask` created.
    pub(super) asked_deadline: Option<OffsetDateTime>,
}

impl<'a> Cas<'a> {
    pub(super) fn new(task: TaskId, generation: i64, decision: Decision, actor: &'a str) -> Self {
        Self {
            task,
            generation,
            decision,
            worker_guard: None,
            pause_guard: None,
            actor,
            detail: "",
            outbox: Vec::new(),
        }
    }
}

/// A statement built from the parts an operation needs, its arguments numbered as they are bound.
/// Each operation thus runs a lean statement of its own whose plan Postgres caches, instead of
/// one statement carrying every optional part behind null guards (which Postgres re-planned on
/// most calls, since a plan for given arguments can drop the guarded parts).
#[derive(Default)]
struct Statement {
    arguments: PgArguments,
    error: Option<sqlx::error::BoxDynError>,
}

impl Statement {
    /// Binds `value` and returns its placeholder.
    fn bind<'q, T>(&mut self, value: T) -> String
    where
        T: sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        if let Err(e) = self.arguments.add(value) {
            self.error.get_or_insert(e);
        }
        format!("${}", self.arguments.len())
    }

    fn arguments(self) -> Result<PgArguments, Error> {
        match self.error {
            Some(e) => Err(Error::Database(sqlx::Error::Encode(e))),
            None => Ok(self.arguments),
        }
    }
}

/// The compare-and-set statement of `change`: the task's move, its audit row, and only the
/// parts `change` asks for.
fn cas_sql(s: &mut Statement, change: &Cas<'_>, outbox: &[OutboxMessage]) -> String {
    let decision = &change.decision;
    let (from_state, to) = (decision.from, decision.to);
    let id = s.bind(change.task.as_uuid());
    let from = s.bind(from_state.as_str());
    let generation = s.bind(change.generation);
    let mut set = format!("pause_requested = {}", s.bind(decision.pause_requested));
    // A decision that does not move the task (a pause requested of a running one) leaves its
    // generation, and so its worker's lease, as they are.
    if decision.moves() {
        // Claims, the only move into `running`, are decided in batches (see `batch`).
        debug_assert_ne!(to, TaskState::Running, "claims do not go through cas");
        let state = s.bind(to.as_str());
        set += &if to.is_terminal() {
            format!(concat!(", ", set_moved!("{}", 1, released(ended))), state)
        } else {
            format!(concat!(", ", set_moved!("{}", 1, released(open))), state)
        };
        set += if to == TaskState::Paused {
            ", paused_at = now()"
        } else {
            ", paused_at = NULL"
        };
    } else {
        set += ", updated_at = now()";
    }
    if decision.counts_attempt() {
        set += ", attempt = attempt + 1";
    }
    if let Some(error) = decision.error() {
        set += &format!(", error = {}", s.bind(error));
    }
    let mut guard = format!("id = {id} AND state = {from} AND generation = {generation}");
    if let Some(worker) = change.worker_guard {
        guard += &format!(" AND worker_id = {}", s.bind(worker));
    }
    if let Some(pause) = change.pause_guard {
        guard += &format!(" AND pause_requested = {}", s.bind(pause));
    }
    let mut sql = format!(
        concat!(
            "WITH t AS (UPDATE tasks SET {set} WHERE {guard} RETURNING {columns})
         , audit AS (",
            audit_into!(),
            " SELECT id, {from}, state, {event}, generation, {actor}, {detail} FROM t)"
        ),
        set = set,
        guard = guard,
        from = from,
        columns = task_columns!(),
        event = s.bind(decision.event.as_str()),
        actor = s.bind(change.actor),
        detail = s.bind(change.detail),
    );
    if outbox.iter().any(|o| o.durable) {
        let (subjects, msg_ids, payloads, traces) = columns(outbox.to_vec());
        sql += &format!(
            ", out AS (
                INSERT INTO outbox (subject, msg_id, payload, traceparent)
                SELECT x.s, x.m, x.p, x.tp
                FROM t, unnest({}::text[], {}::text[], {}::bytea[], {}::text[]) AS x(s, m, p, tp))",
            s.bind(subjects),
            s.bind(msg_ids),
            s.bind(payloads),
            s.bind(traces)
        );
    }
    if let Some(outcome) = decision.closes() {
        sql += &format!(
            ", closed AS (
                UPDATE questions SET outcome = {}, closed_at = now()
                WHERE task_id = {id} AND outcome = {open} AND EXISTS (SELECT 1 FROM t))",
            s.bind(outcome.as_str()),
            open = s.bind(QuestionOutcome::Open.as_str()),
        );
    }
    for effect in &decision.effects {
        if let Effect::ShiftDeadline(by) = effect {
            sql += &format!(
                ", shifted AS (
                    UPDATE questions SET deadline = deadline + {by} * interval '1 millisecond',
                        escalate_at = escalate_at + {by} * interval '1 millisecond'
                    WHERE task_id = {id} AND outcome = {open}
                      AND (deadline IS NOT NULL OR escalate_at IS NOT NULL)
                      AND EXISTS (SELECT 1 FROM t))",
                by = s.bind(i64::try_from(by.as_millis()).unwrap_or(i64::MAX)),
                open = s.bind(QuestionOutcome::Open.as_str()),
            );
        }
    }
    sql += " SELECT t.*, NULL::timestamptz AS asked_deadline,
            NULL::json AS ctx_rounds, NULL::json AS ctx_question, NULL::json AS ctx_instructions
          FROM t";
    sql
}

/// The outbox messages as three parallel arrays, for `unnest`.
/// The durable messages of `outbox` as parallel arrays for `unnest`: subjects, message ids,
/// payloads and trace contexts.
type Columns = (Vec<String>, Vec<String>, Vec<Vec<u8>>, Vec<Option<String>>);

pub(super) fn columns(outbox: Vec<OutboxMessage>) -> Columns {
    let mut subjects = Vec::with_capacity(outbox.len());
    let mut msg_ids = Vec::with_capacity(outbox.len());
    let mut payloads = Vec::with_capacity(outbox.len());
    let mut traces = Vec::with_capacity(outbox.len());
    for o in outbox.into_iter().filter(|o| o.durable) {
        subjects.push(o.subject);
        msg_ids.push(o.msg_id);
        payloads.push(o.payload.to_vec());
        traces.push(o.trace);
    }
    (subjects, msg_ids, payloads, traces)
}

impl Store {
    /// Moves a task by one event if it is still at `(from, generation)`. Returns the new row,
    /// or `None` when another writer got there first. The audit row and the outbox messages are
    /// written by the same statement, so they exist exactly when the move won.
    pub(super) async fn cas(
        &self,
        conn: &mut PgConnection,
        change: Cas<'_>,
        sent: &mut Vec<OutboxMessage>,
    ) -> Result<Option<TaskRow>, Error> {
        Ok(self.cas_row(conn, change, sent).await?.map(|row| row.task))
    }

    /// [`Store::cas`], returning the whole row of the statement.
    pub(super) async fn cas_row(
        &self,
        conn: &mut PgConnection,
        mut change: Cas<'_>,
        sent: &mut Vec<OutboxMessage>,
    ) -> Result<Option<CasRow>, Error> {
        let outbox = std::mem::take(&mut change.outbox);
        let mut s = Statement::default();
        let sql = cas_sql(&mut s, &change, &outbox);
        let row = sqlx::query_as_with::<_, CasRow, _>(AssertSqlSafe(sql), s.arguments()?)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = &row {
            for effect in &change.decision.effects {
                if let Effect::CloseQuestion(outcome) = effect {
                    self.metrics().closed(*outcome);
                }
            }
            sent.extend(outbox);
            sent.push(
                self.effects
                    .event(&row.task, change.decision.event.as_str(), None),
            );
        }
        Ok(row)
    }

    /// Hands messages whose transaction committed to the relay, which publishes them at once.
    /// Without a relay in this process, the outbox sweep picks them up.
    pub(super) fn published(&self, sent: Vec<OutboxMessage>) {
        if sent.is_empty() {
            return;
        }
        match &self.relay {
            Some(relay) if relay.send(sent).is_ok() => {}
            _ => self.outbox_ready.notify_one(),
        }
    }

    pub(super) async fn enqueue(
        &self,
        conn: &mut PgConnection,
        outbox: Vec<OutboxMessage>,
        sent: &mut Vec<OutboxMessage>,
    ) -> Result<(), Error> {
        if outbox.is_empty() {
            return Ok(());
        }
        let (subjects, msg_ids, payloads, traces) = columns(outbox.clone());
        sqlx::query(
            "INSERT INTO outbox (subject, msg_id, payload, traceparent)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[])",
        )
        .bind(subjects)
        .bind(msg_ids)
        .bind(payloads)
        .bind(traces)
        .execute(conn)
        .await?;
        sent.extend(outbox);
        Ok(())
    }

    /// Explains why a lease-guarded write did not match.
    pub async fn refusal(&self, lease: &Lease) -> Error {
        match self.get_task(lease.task).await {
            Ok(task) if task.state == TaskState::Cancelled => Error::Cancelled {
                task: lease.task.to_string(),
            },
            Ok(_) => Error::LeaseLost {
                task: lease.task.to_string(),
                generation: lease.generation,
                worker: lease.worker_id.clone(),
            },
            Err(e) => e,
        }
    }

    /// The task as it is now, as the lifecycle decides on it: the row, and its lifecycle with
    /// its open question when its state carries one.
    pub async fn task_now(&self, task: TaskId) -> Result<(TaskRow, decide::Task), Error> {
        // The task and its open question from one snapshot, so that an answer committing in
        // between cannot leave a waiting task without its question.
        let sql = concat!(
            "SELECT ",
            task_columns!(),
            ", q.handle AS q_handle, q.text AS q_text, q.asked_at AS q_asked_at,
                q.deadline AS q_deadline
             FROM tasks LEFT JOIN LATERAL (
                 SELECT handle, text, asked_at, deadline FROM questions
                 WHERE task_id = tasks.id AND outcome = $2 ORDER BY asked_at DESC LIMIT 1
             ) q ON true
             WHERE tasks.id = $1"
        );
        let found = sqlx::query_as::<_, WithOpenQuestion>(sql)
            .bind(task.as_uuid())
            .bind(QuestionOutcome::Open.as_str())
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| Error::TaskNotFound(task.to_string()))?;
        let question = match (found.q_handle, found.q_asked_at) {
            (Some(handle), Some(asked_at)) => Some(decide::OpenQuestion {
                handle,
                text: found.q_text.unwrap_or_default(),
                asked_at,
                deadline: found.q_deadline,
            }),
            _ => None,
        };
        let row = found.task;
        let lifecycle = row.lifecycle(question).ok_or_else(|| {
            Error::Internal(format!("task {task} waits without an open question"))
        })?;
        Ok((row, lifecycle))
    }

    /// Applies `decision`, taken on `row`, as one compare-and-set that also writes the messages
    /// its effects imply. With `worker_guard`, only while that worker holds the task. `None`
    /// when another writer moved the task first.
    pub async fn apply(
        &self,
        row: &TaskRow,
        decision: Decision,
        actor: &str,
        detail: &str,
        worker_guard: Option<&str>,
    ) -> Result<Option<TaskRow>, Error> {
        let outbox = self.effects.of(
            row.id,
            row.generation + 1,
            row.chat().as_ref(),
            None,
            &decision,
        );
        let mut change = Cas::new(row.id, row.generation, decision, actor);
        change.pause_guard = Some(row.pause_requested);
        change.worker_guard = worker_guard;
        change.detail = detail;
        change.outbox = outbox;
        let mut sent = Vec::new();
        let won = {
            let mut conn = self.pool.acquire().await?;
            self.cas(&mut conn, change, &mut sent).await?
        };
        if won.is_some() {
            self.published(sent);
        }
        Ok(won)
    }
}
