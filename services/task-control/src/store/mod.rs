//! The Postgres store of tasks, checkpoints, questions, instructions, the transition audit, the
//! applied inbound ids and the outbox.
//!
//! Every state change is one transaction that ends in a compare-and-set on `(state, generation)`
//! and reports whether it won. Messages the change implies (a run job, a chat message, a task
//! event) are written to the outbox in the same transaction and relayed to NATS after the
//! commit, so a crash between the two loses nothing.
//!
//! The store decides nothing: every move comes decided by [`decide`](hark_core::domain::decide)
//! from the use cases (`crate::cases`), which read through the store, and the store applies it.
//!
//! - `apply`: a decision becomes one compare-and-set; `batch` applies many requests of one
//!   kind in one statement.
//! - `ops`: creating tasks; `worker`: what a worker does under its lease; `answers`: applying
//!   answers; `form`: a questionnaire's steps; `timers`: what the clock finds due (held in a
//!   [`Sweep`] while it is decided), and reminders; `escalate`, `delegate`: asking another
//!   person; `schedules`: scheduled and recurring tasks.
//! - `reads`: reading; `chat`: what chat routing reads and marks; `outbox`: the relay.
//! - `retention`, `upkeep`: deleting what ended long ago, and vacuuming.

/// The columns of `tasks`, in the order of [`TaskRow`].
macro_rules! task_columns {
    () => {
        "id, owner, platform, bot_id, stream, origin_message_id, goal, state, generation, \
    attempt, worker_id, lease_until, on_timeout, ask_timeout_s, rounds, result, error, run_ms, running_since, \
    created_at, updated_at, finished_at, questionnaire, pause_requested, paused_at, schedule_id, priority, \
    deadline_at, on_deadline, asked_by, key_id"
    };
}

/// The `SET` clause of a task's move, the one template of every statement that moves tasks:
/// the state it reaches, its generation stepped once per move the statement applies, and where
/// its worker, its time run and its end stand after the move.
/// - `held($worker, $lease_ms)`: into `running`, held by `$worker` for `$lease_ms`
///   milliseconds unless renewed, and owed no run any more.
/// - `released(open)`, `released(ended)`: no worker holds it and the time it ran is counted; it
///   has ended (`finished_at`) or not.
/// - `stays`: its state does not change, but it takes a new generation, so that a move decided
///   from what was read before it is decided again.
macro_rules! set_moved {
    ($state:expr, $steps:literal, held($worker:expr, $lease_ms:expr)) => {
        concat!(
            set_moved!(@moved $state, $steps),
            ", worker_id = ",
            $worker,
            ", lease_until = now() + ",
            $lease_ms,
            " * interval '1 millisecond', running_since = now(), finished_at = NULL, owed = false"
        )
    };
    ($state:expr, $steps:literal, released(open)) => {
        concat!(set_moved!(@released $state, $steps), ", finished_at = NULL")
    };
    ($state:expr, $steps:literal, released(ended)) => {
        concat!(set_moved!(@released $state, $steps), ", finished_at = now()")
    };
    (stays) => {
        "generation = generation + 1, updated_at = now()"
    };
    (@released $state:expr, $steps:literal) => {
        concat!(
            set_moved!(@moved $state, $steps),
            ", ",
            run_ms_update!(),
            ", worker_id = NULL, lease_until = NULL, running_since = NULL"
        )
    };
    (@moved $state:expr, $steps:literal) => {
        concat!(
            "state = ",
            $state,
            ", generation = generation + ",
            $steps,
            ", updated_at = now()"
        )
    };
}

/// The head of every statement's audit rows: a `SELECT` or `VALUES` after it gives, per move,
/// the task, the state it left and the one it reached, the event, the generation it reached,
/// who moved it and why.
macro_rules! audit_into {
    () => {
        "INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)"
    };
}

/// The outbox rows of a batch's statement: the messages bound as five arrays (the place of each
/// one's request in the batch, then subject, message id, payload and trace context; see
/// `batch::OutboxColumns`), written for the requests whose move won (`t`, with `c_ord`).
macro_rules! outbox_of_batch {
    ($ord:literal, $s:literal, $m:literal, $p:literal, $tp:literal) => {
        concat!(
            "INSERT INTO outbox (subject, msg_id, payload, traceparent)
             SELECT o.s, o.m, o.p, o.tp FROM t
             JOIN unnest(",
            $ord,
            "::bigint[], ",
            $s,
            "::text[], ",
            $m,
            "::text[], ",
            $p,
            "::bytea[], ",
            $tp,
            "::text[]) AS o(ord, s, m, p, tp) ON o.ord = t.c_ord"
        )
    };
}

/// Leaving `running` adds the time since `running_since` to `run_ms` (outside `running`,
/// `running_since` is NULL and this adds nothing).
macro_rules! run_ms_update {
    () => {
        "run_ms = run_ms + CASE WHEN running_since IS NULL THEN 0 \
         ELSE (extract(epoch FROM now() - running_since) * 1000)::bigint END"
    };
}

/// A task state's name as a SQL literal: the one place SQL gets state names from. A test checks
/// each against [`TaskState::as_str`](hark_core::domain::TaskState::as_str).
macro_rules! sql_state {
    (pending) => {
        "'pending'"
    };
    (running) => {
        "'running'"
    };
    (waiting_input) => {
        "'waiting_input'"
    };
    (paused) => {
        "'paused'"
    };
    (completed) => {
        "'completed'"
    };
    (failed) => {
        "'failed'"
    };
    (cancelled) => {
        "'cancelled'"
    };
}

/// A question's outcome as a SQL literal, as [`sql_state`] is for task states.
macro_rules! sql_outcome {
    (open) => {
        "'open'"
    };
    (answered) => {
        "'answered'"
    };
    (expired) => {
        "'expired'"
    };
    (cancelled) => {
        "'cancelled'"
    };
    (superseded) => {
        "'superseded'"
    };
}

/// When a question asked now expires, given how long after its ask it expires as the decision
/// opening it says (`$expires_ms`, a column of milliseconds; NULL: never).
macro_rules! expires_in {
    ($expires_ms:literal) => {
        concat!("now() + ", $expires_ms, " * interval '1 millisecond'")
    };
}

/// A schedule's state as a SQL literal.
macro_rules! sql_schedule {
    (active) => {
        "'active'"
    };
    (done) => {
        "'done'"
    };
    (cancelled) => {
        "'cancelled'"
    };
}

/// The states of a task that has ended, as a SQL list.
macro_rules! ended_states {
    () => {
        concat!(
            sql_state!(completed),
            ", ",
            sql_state!(failed),
            ", ",
            sql_state!(cancelled)
        )
    };
}

/// An event's name as a SQL literal, as [`sql_state`] is for states.
macro_rules! sql_event {
    (create) => {
        "'create'"
    };
    (claim) => {
        "'claim'"
    };
    (ask) => {
        "'ask'"
    };
    (answer) => {
        "'answer'"
    };
    (finish) => {
        "'finish'"
    };
}

/// The states of a task that has not ended, as a SQL list. The partial index
/// `tasks_active_by_owner` has the same predicate, so counting an owner's active tasks is an
/// index lookup.
macro_rules! active_states {
    () => {
        concat!(
            sql_state!(pending),
            ", ",
            sql_state!(running),
            ", ",
            sql_state!(waiting_input),
            ", ",
            sql_state!(paused)
        )
    };
}

/// The columns of a task the lifecycle decides on, read into [`crate::rows::Lifecycle`] (`t` is
/// the task).
macro_rules! lifecycle_columns {
    () => {
        "t.state AS task_state, t.on_timeout AS task_on_timeout, t.attempt AS task_attempt, \
    t.pause_requested AS task_pause_requested, \
    coalesce(t.paused_at, t.updated_at) AS task_paused_since, t.ask_timeout_s AS task_ask_timeout_s"
    };
}

/// What an answer's compare-and-set starts from, beside its question: the task as the
/// lifecycle decides on it and its generation, and for a questionnaire its questions and its
/// last round (`t` is the task).
macro_rules! answer_target_columns {
    () => {
        concat!(
            lifecycle_columns!(),
            ", t.generation AS task_generation, \
    t.platform AS task_platform, t.bot_id AS task_bot_id, t.stream AS task_stream, \
    t.origin_message_id AS task_origin_message_id, t.asked_by IS NOT NULL AS task_external, \
    t.questionnaire AS task_questionnaire, \
    CASE WHEN t.questionnaire IS NULL THEN NULL ELSE \
        (SELECT json_build_object('round', c.round, 'messages', c.messages) FROM checkpoints c \
         WHERE c.task_id = t.id ORDER BY c.round DESC LIMIT 1) END AS form_last_round, \
    CASE WHEN q.ask_group IS NULL THEN NULL ELSE \
        (SELECT json_agg(json_build_object('id', s.id, 'owner', s.owner, 'platform', s.platform, \
                'bot_id', s.bot_id, 'stream', s.stream, 'handle', s.handle, \
                'chat_message_id', s.chat_message_id, 'outcome', s.outcome, \
                'answerer', s.answerer, 'answer', s.answer) ORDER BY s.closed_at, s.asked_at) \
         FROM questions s WHERE s.task_id = q.task_id AND s.ask_group = q.ask_group \
           AND s.id <> q.id) END AS siblings"
        )
    };
}

/// The guard of a move applied once per inbound message, when its decision says so (`$once`):
/// the message keyed `$key` was not applied before.
macro_rules! not_applied_before {
    ($once:literal, $key:literal) => {
        concat!(
            " AND NOT (",
            $once,
            " AND EXISTS (SELECT 1 FROM applied_inbound a WHERE a.key = ",
            $key,
            "))"
        )
    };
}

/// The guard of a claim that yields to a pending task of a higher priority, when its decision
/// says so (`$yields`): no pending task outranks `$priority`. Once per statement, not per claim.
macro_rules! yields_to_priority {
    ($yields:literal, $priority:literal) => {
        concat!(
            " AND (NOT ",
            $yields,
            " OR ",
            $priority,
            " >= (SELECT coalesce(max(h.priority), -32768) FROM tasks h WHERE h.state = ",
            sql_state!(pending),
            "))"
        )
    };
}

/// The CTE that closes the other open questions of the ask an answer answered, with the
/// outcome its decision gives them: the same ask put to others, whose first answer closes theirs.
/// `$answered` names the column of `t` that holds the answered question and `$outcome` the one
/// that holds their outcome (`NULL` leaves them open). Only a question of an ask group has
/// others, looked up by the group, so a question of none costs one primary-key read.
macro_rules! supersede_others {
    ($answered:literal, $outcome:literal) => {
        concat!(
            "superseded AS (
                UPDATE questions q SET outcome = t.",
            $outcome,
            ", closed_at = now()
                FROM t JOIN questions a ON a.id = t.",
            $answered,
            "
                WHERE t.",
            $outcome,
            " IS NOT NULL AND q.ask_group = a.ask_group AND q.outcome = ",
            sql_outcome!(open),
            "
                  AND q.id <> t.",
            $answered,
            "
            )"
        )
    };
}

/// Whom a new question goes to beside the owner, from the columns `batch::AskedColumns` binds:
/// the values of `escalate_to, escalate_every_ms, escalate_at, need, askees, ask_group`, read
/// from the lateral `asked_escalation!()` (`e`).
macro_rules! asked_values {
    () => {
        "e.people,
                       CASE WHEN cardinality(e.people) > 0 THEN e.every END,
                       CASE WHEN cardinality(e.people) > 0 THEN now() + e.every * interval '1 millisecond' END,
                       c_need, c_askees, c_group"
    };
}

/// To whom a new question escalates (`e.people`) and how long after it is asked (`e.every`):
/// at its first reminder unless told when, `remind_before` ahead of its deadline (`d.deadline`)
/// or after it was asked without one; put to several at once (0), right away.
macro_rules! asked_escalation {
    () => {
        "CROSS JOIN LATERAL (SELECT
                       ARRAY(SELECT jsonb_array_elements_text(t.c_escalate_to)) AS people,
                       CASE WHEN t.c_escalate_ms = 0 THEN 0 ELSE
                       greatest(1000, coalesce(t.c_escalate_ms,
                           (extract(epoch FROM d.deadline - now()) * 1000)::bigint - t.c_remind_ms,
                           t.c_remind_ms)) END AS every) e"
    };
}

/// The tasks a batch creates, bound as its first eighteen arguments (see
/// `batch::bind_new_tasks`): `n`, each with its request's place `ord` (from 1), and `counted`,
/// each with how many tasks that have not ended its owner would have with it (`would_have`; 0
/// without a limit), counting the batch's own requests in order.
macro_rules! new_tasks {
    () => {
        concat!(
            "n AS (
                SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                     $7::text[], $8::text[], $9::int[], $10::text[], $11::bigint[],
                                     $12::jsonb[], $13::uuid[], $14::smallint[], $15::bigint[],
                                     $16::text[], $17::text[], $18::uuid[])
                    WITH ORDINALITY
                    AS n(id, owner, platform, bot_id, stream, origin, goal, on_timeout, ask_timeout_s,
                         request_id, active_limit, questionnaire, schedule_id, priority, deadline_ms,
                         on_deadline, asked_by, key_id, ord)
            ), counted AS (
                SELECT n.*,
                    CASE WHEN n.active_limit = 0 THEN 0 ELSE
                        (SELECT count(*) FROM tasks a WHERE a.owner = n.owner AND a.state IN (",
            active_states!(),
            "))
                        + row_number() OVER (PARTITION BY n.owner ORDER BY n.ord)
                    END AS would_have
                FROM n
            )"
        )
    };
}

/// Inserts the tasks of [`new_tasks`] in `$state` at `$generation` with `$rounds` rounds, unless
/// its request id was used before or its owner is at its limit; returns the rows inserted.
macro_rules! insert_new_tasks {
    ($state:expr, $generation:literal, $rounds:literal) => {
        concat!(
            "INSERT INTO tasks (id, owner, platform, bot_id, stream, origin_message_id, goal, state,
                               generation, rounds, on_timeout, ask_timeout_s, request_id, questionnaire,
                               schedule_id, priority, deadline_at, on_deadline, asked_by, key_id)
            SELECT id, owner, platform, bot_id, stream, origin, goal, ",
            $state,
            ", ",
            $generation,
            ", ",
            $rounds,
            ", on_timeout, ask_timeout_s, request_id, questionnaire, schedule_id, priority,
                   now() + deadline_ms * interval '1 millisecond', on_deadline, asked_by, key_id
            FROM counted
            WHERE active_limit = 0 OR would_have <= active_limit
            ORDER BY ord
            ON CONFLICT (request_id) WHERE request_id IS NOT NULL DO NOTHING
            RETURNING ",
            task_columns!()
        )
    };
}

/// The columns of `questions`, in the order of [`QuestionRow`].
macro_rules! question_columns {
    () => {
        "id, task_id, handle, text, context, tool_call_id, round, owner, platform, bot_id, \
    stream, outcome, asked_at, deadline, reminded_at, closed_at, answerer, answer, inbound_message_id, \
    chat_message_id, choices, waits_for, escalate_to, escalate_at, ask_group, need, askees, \
    undelivered"
    };
}

mod answers;
mod apply;
mod batch;
mod chat;
mod connect;
mod delegate;
mod escalate;
mod external;
mod form;
mod keys;
mod ops;
mod outbox;
mod reads;
mod retention;
mod schedules;
mod seen;
mod timers;
mod upkeep;
mod worker;

use apply::{Cas, CasRow, columns};

/// The outcome of an open question, bound as a parameter in the statements that close a
/// question found by its id or its task. Spelt in the statement, it lets the planner read an
/// index of open questions instead, which reads every open question when the statistics say
/// none is open.
const OPEN: &str = QuestionOutcome::Open.as_str();

pub use crate::rows::{
    Answer, ChatRoute, Instruction, KeyRow, Lease, QuestionRow, RoundRow, ScheduleRow, TaskRow,
    TransitionRow,
};
pub use answers::{AnswerOutcome, AnswerTarget, SubtaskEnded, subtask_answerer};
pub use chat::TellDelivery;
pub use connect::{connect, migrate, probe};
pub use delegate::{Delegated, Delegation};
pub use form::{FormStep, Step};
pub use hark_core::domain::Need;
pub use hark_core::domain::schedule::Overlap;
pub use keys::NewKey;
pub use ops::NewTask;
pub use outbox::{OutboxEntry, OutboxMessage};
pub use reads::{QuestionFilter, TaskFilter};
pub use retention::Purged;
pub use schedules::NewSchedule;
pub use seen::SeenChat;
pub use timers::{Due, Overdue, Sweep};
pub use upkeep::{UPKEEP_LOCK, Upkeep};
pub use worker::{AskDecided, AskInput, Claimed, Escalation, Resume, Take, people_on};

use hark_core::{
    domain::{Event, QuestionOutcome, TaskState},
    error::Kind,
};

/// What a person reads of a database error: Postgres's own message, without the line of
/// Postgres's source code sqlx adds to it.
pub fn said(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(e) => format!("Postgres says: {}", e.message()),
        other => format!("database error: {other}"),
    }
}

/// Why a store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", said(.0))]
    Database(sqlx::Error),
    #[error("cannot migrate the database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "cannot create database `{name}` (create it by hand, or give the user CREATEDB): {}",
        said(source)
    )]
    CreateDatabase {
        name: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("`{0}` is not a usable database URL: {1}")]
    DatabaseUrl(String, String),
    #[error(
        "Postgres at database.url = {url} refuses to let hark in ({said}): set database.url \
         (HARK_DATABASE__URL) to a user and password it takes, e.g. \
         postgres://postgres:<password>@127.0.0.1:5432/hark, or give that user access"
    )]
    Refused { url: String, said: String },
    #[error(
        "what answers at database.url = {url} is not Postgres ({said}): point database.url \
         (HARK_DATABASE__URL) at Postgres's port (usually 5432)"
    )]
    NotPostgres { url: String, said: String },
    #[error("nothing answered as Postgres at database.url = {url} within {within_s}s")]
    Unanswered { url: String, within_s: u64 },
    #[error("no task {0}")]
    TaskNotFound(String),
    #[error("`{prefix}` matches {count} tasks; give more of the id")]
    AmbiguousTask { prefix: String, count: usize },
    #[error("no question {0}")]
    QuestionNotFound(String),
    #[error("no key {0} (`hark key list` shows the keys)")]
    KeyNotFound(String),
    #[error("`{0}` matches more than one key; give more of its id")]
    AmbiguousKey(String),
    #[error("no schedule {0}")]
    ScheduleNotFound(String),
    #[error("schedule {0} has ended: it was cancelled or its one run is done")]
    ScheduleEnded(String),
    #[error("task {task} has no open question")]
    NoOpenQuestion { task: String },
    #[error("question #{handle} cannot be reminded of: {why}")]
    NotRemindable { handle: String, why: &'static str },
    #[error(
        "question #{handle} was reminded of less than {again_after}s ago; wait, then remind again"
    )]
    RemindedRecently { handle: String, again_after: u64 },
    #[error("question {id} is closed ({outcome})")]
    QuestionClosed {
        id: String,
        outcome: QuestionOutcome,
    },
    #[error("question #{handle} was passed on meanwhile: it is asked of {askee} now")]
    Moved { handle: String, askee: String },
    #[error("task {task} is already {state}")]
    Already { task: String, state: TaskState },
    #[error("task {task} is {state}: it cannot take `{event}`")]
    WrongState {
        task: String,
        state: TaskState,
        event: Event,
    },
    #[error("task {task} is no longer held under generation {generation} by {worker}")]
    LeaseLost {
        task: String,
        generation: i64,
        worker: String,
    },
    #[error("task {task} was cancelled")]
    Cancelled { task: String },
    #[error(
        "task {task} is {state} at generation {current}; the job for generation {job} is stale"
    )]
    StaleJob {
        task: String,
        state: TaskState,
        current: i64,
        job: i64,
    },
    #[error("round {round} of task {task} is not valid JSON: {message}")]
    BadRound {
        task: String,
        round: i32,
        message: String,
    },
    #[error(
        "{owner} has {active} active tasks, the most task.max_active_per_owner allows; cancel one or wait for one to end"
    )]
    TooManyActive { owner: String, active: i64 },
    #[error("answer: `{answer}` does not fit question #{handle}: {misfit}; it takes {}", .shape.expects())]
    Misfit {
        handle: String,
        answer: String,
        shape: Box<hark_core::domain::shape::Shape>,
        misfit: hark_core::domain::shape::Misfit,
    },
    #[error("question #{handle} waits for the subtask {subtask} to end; only that answers it")]
    WaitsForSubtask { handle: String, subtask: String },
    /// What was asked cannot be done as asked; the text says why and what to change.
    #[error("{0}")]
    Invalid(String),
    /// The task moved between the read an answer was decided from and its write, while the
    /// question stayed open to the same person (it was escalated, say): decided again.
    #[error("question {0} changed while it was answered")]
    Raced(String),
    /// Other writers kept winning; the same request later will likely go through.
    #[error("{0}; try again")]
    Busy(String),
    /// Something that must not happen did.
    #[error("internal error: {0}")]
    Internal(String),
}

impl hark_core::error::Classified for Error {
    fn kind(&self) -> Kind {
        match self {
            Error::Database(e) | Error::CreateDatabase { source: e, .. } => kind_of_sqlx(e),
            Error::Migrate(sqlx::migrate::MigrateError::Execute(e)) => kind_of_sqlx(e),
            Error::Migrate(_) => Kind::Internal,
            Error::Unanswered { .. } => Kind::Unavailable,
            Error::Refused { .. } | Error::NotPostgres { .. } => Kind::Invalid,
            Error::DatabaseUrl(..)
            | Error::AmbiguousTask { .. }
            | Error::AmbiguousKey(_)
            | Error::BadRound { .. }
            | Error::Misfit { .. }
            | Error::Invalid(_) => Kind::Invalid,
            Error::WaitsForSubtask { .. } => Kind::Conflict,
            Error::TaskNotFound(_)
            | Error::QuestionNotFound(_)
            | Error::ScheduleNotFound(_)
            | Error::KeyNotFound(_) => Kind::NotFound,
            Error::NoOpenQuestion { .. }
            | Error::NotRemindable { .. }
            | Error::ScheduleEnded(_)
            | Error::Already { .. }
            | Error::QuestionClosed { .. }
            | Error::Moved { .. }
            | Error::WrongState { .. } => Kind::Conflict,
            Error::LeaseLost { .. } | Error::Cancelled { .. } | Error::StaleJob { .. } => {
                Kind::Gone
            }
            Error::TooManyActive { .. } | Error::RemindedRecently { .. } => Kind::Exhausted,
            Error::Busy(_) | Error::Raced(_) => Kind::Unavailable,
            Error::Internal(_) => Kind::Internal,
        }
    }
}

impl hark_core::startup::Permanent for Error {
    /// What waiting does not mend: a URL that cannot work, credentials or a database Postgres
    /// refuses, something else than Postgres at that port, a database hark may not create.
    fn permanent(&self) -> bool {
        match self {
            Error::DatabaseUrl(..) | Error::Refused { .. } | Error::NotPostgres { .. } => true,
            Error::CreateDatabase { source, .. } => kind_of_sqlx(source) != Kind::Unavailable,
            _ => false,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        connect::note(&error);
        Error::Database(error)
    }
}

/// The kind of a database error: the server refusing the data is the caller's fault; the server
/// or the connection to it being away is worth retrying; anything else is hark's.
///
/// A write whose connection died with its commit in flight (a primary killed, a failover) may or
/// may not have committed, and [`Kind::Unavailable`] sends it round again: the chat message is
/// redelivered, the worker or client repeats its request. That is safe for every write hark
/// makes, and must stay so: a state change is a compare-and-set on the task's generation, an
/// inbound message is applied once by its key (`applied_inbound`), a created task by its request
/// id, and an outbox row is published under its message id, so a second run finds the first one
/// done and answers as it would have.
pub fn kind_of_sqlx(error: &sqlx::Error) -> Kind {
    match error {
        sqlx::Error::Database(e) => match e.code().as_deref().map(|c| c.get(..2).unwrap_or(c)) {
            // Data exceptions (a NUL in a text, a value out of range) and integrity violations.
            Some("22" | "23") => Kind::Invalid,
            // Serialization failures and deadlocks, connection exceptions, insufficient
            // resources, and the server shutting down or starting.
            Some("40" | "08" | "53" | "57") => Kind::Unavailable,
            Some("42") if e.code().as_deref() == Some("42501") => Kind::Forbidden,
            // A standby met instead of the primary: a failover under way, or a URL that leads
            // to the wrong server; either way no fault of the caller's, and worth retrying.
            Some("25") if e.code().as_deref() == Some("25006") => Kind::Unavailable,
            _ => Kind::Internal,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Kind::Unavailable,
        sqlx::Error::InvalidArgument(_) => Kind::Invalid,
        _ => Kind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use hark_core::domain::{Event, TaskState};

    #[test]
    fn the_state_and_event_names_in_sql_are_the_lifecycles_own() {
        let states = [
            sql_state!(pending),
            sql_state!(running),
            sql_state!(waiting_input),
            sql_state!(paused),
            sql_state!(completed),
            sql_state!(failed),
            sql_state!(cancelled),
        ];
        let named: Vec<String> = TaskState::ALL
            .into_iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        assert_eq!(states.to_vec(), named);
        for (literal, event) in [
            (sql_event!(claim), Event::Claim),
            (sql_event!(ask), Event::Ask),
            (sql_event!(answer), Event::Answer),
            (sql_event!(finish), Event::Finish),
        ] {
            assert_eq!(literal, format!("'{}'", event.as_str()));
        }
        assert_eq!(sql_event!(create), "'create'");
    }

    /// The deadline an ask statement gives its question is the one the ask's decision opens it
    /// with, for every policy, with and without the ask's own timeout and the task's: evaluated
    /// by Postgres.
    #[tokio::test]
    async fn the_deadline_an_ask_statement_gives_is_the_decisions_own() {
        use std::time::Duration;

        use hark_core::domain::{TimeoutPolicy, decide::Wait};
        let pool = sqlx::PgPool::connect(&hark_testkit::postgres_url())
            .await
            .expect("Postgres answers");
        let sql = concat!(
            "SELECT now(), ",
            expires_in!("t.c_expires_ms"),
            " FROM (SELECT $1::bigint AS c_expires_ms) t"
        );
        let mut checked = 0;
        for on_timeout in TimeoutPolicy::ALL {
            for own in [None, Some(0), Some(1_500), Some(86_400_000)] {
                for ask_timeout in [0, 1, 3_600] {
                    let wait = Wait {
                        on_timeout,
                        ask_timeout: Duration::from_secs(ask_timeout),
                        own: own.map(Duration::from_millis),
                    };
                    let expires = wait.expires_after();
                    let (now, deadline): (time::OffsetDateTime, Option<time::OffsetDateTime>) =
                        sqlx::query_as(sql)
                            .bind(expires.map(super::worker::millis))
                            .fetch_one(&pool)
                            .await
                            .expect("the template evaluates");
                    assert_eq!(deadline, expires.map(|e| now + e), "{wait:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, TimeoutPolicy::ALL.len() * 12);
        pool.close().await;
    }

    #[test]
    fn the_outcome_and_schedule_names_in_sql_are_the_domains_own() {
        use hark_core::domain::{
            QuestionOutcome,
            schedule::{Overlap, ScheduleState},
        };
        let quoted = |names: Vec<&str>| -> Vec<String> {
            names.into_iter().map(|n| format!("'{n}'")).collect()
        };
        assert_eq!(
            [
                sql_outcome!(open),
                sql_outcome!(answered),
                sql_outcome!(expired),
                sql_outcome!(cancelled),
                sql_outcome!(superseded),
            ]
            .to_vec(),
            quoted(QuestionOutcome::ALL.map(QuestionOutcome::as_str).to_vec())
        );
        assert_eq!(
            [
                sql_schedule!(active),
                sql_schedule!(done),
                sql_schedule!(cancelled)
            ]
            .to_vec(),
            quoted(ScheduleState::ALL.map(ScheduleState::as_str).to_vec())
        );
        assert_eq!(Overlap::ALL.map(Overlap::as_str), ["skip", "allow"]);
        let ended: Vec<&str> = ended_states!()
            .split(", ")
            .map(|s| s.trim_matches('\''))
            .collect();
        let terminal: Vec<&str> = TaskState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(TaskState::as_str)
            .collect();
        assert_eq!(ended, terminal);
    }

    /// The sources of task-control, but for this module: none writes a state, outcome, policy
    /// or schedule name as a SQL literal of its own.
    #[test]
    fn no_statement_spells_a_name_that_this_module_owns() {
        use hark_core::domain::{
            QuestionOutcome, TimeoutPolicy,
            schedule::{Overlap, ScheduleState},
        };
        let mut names: Vec<&str> = TaskState::ALL.map(TaskState::as_str).to_vec();
        names.extend(QuestionOutcome::ALL.map(QuestionOutcome::as_str));
        names.extend(TimeoutPolicy::ALL.map(TimeoutPolicy::as_str));
        names.extend(ScheduleState::ALL.map(ScheduleState::as_str));
        names.extend(Overlap::ALL.map(Overlap::as_str));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![root.clone()];
        let mut found = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(
                    std::fs::read_dir(&path)
                        .expect("src")
                        .flatten()
                        .map(|e| e.path()),
                );
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("store/mod.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            for (n, line) in text.lines().enumerate() {
                for name in &names {
                    if line.contains(&format!("'{name}'")) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "spelt outside store/mod.rs:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn the_active_states_in_sql_are_the_states_that_have_not_ended() {
        let listed: Vec<&str> = active_states!()
            .split(", ")
            .map(|s| s.trim_matches('\''))
            .collect();
        let active: Vec<&str> = TaskState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .map(TaskState::as_str)
            .collect();
        assert_eq!(listed, active);
        let migration = include_str!("../../migrations/20261201000004_pause.sql");
        assert!(
            migration.contains(&format!("WHERE state IN ({})", active_states!())),
            "the partial index has the same predicate"
        );
    }
}

impl Error {
    /// Whether trying again later may succeed (the database was unreachable or a serialization
    /// conflict), as opposed to a decision that stands.
    pub fn is_retryable(&self) -> bool {
        use hark_core::error::Classified as _;
        self.kind().is_retryable()
    }

    /// What a refused decision tells the caller.
    pub fn refused(task: impl ToString, refusal: hark_core::domain::decide::Refusal) -> Self {
        use hark_core::domain::decide::Refusal;
        match refusal {
            Refusal::WrongState { from, event } => Error::WrongState {
                task: task.to_string(),
                state: from,
                event,
            },
            Refusal::Already(state) => Error::Already {
                task: task.to_string(),
                state,
            },
            Refusal::NotDue => Error::Busy(format!("task {}: not due yet", task.to_string())),
            Refusal::NeedsTask(event) => Error::Internal(format!(
                "task {}: `{event}` was decided without the task's row",
                task.to_string()
            )),
        }
    }
}

/// Access to the task store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: sqlx::PgPool,
    names: hark_core::bus::Names,
    /// Woken after every commit that wrote to the outbox, so the relay publishes at once.
    outbox_ready: std::sync::Arc<tokio::sync::Notify>,
    /// Woken when the clock has work now rather than at its next tick (the others of an ask
    /// put to several people).
    timers_due: std::sync::Arc<tokio::sync::Notify>,
    /// What decisions' effects become.
    effects: crate::effects::Effects,
    /// The limits decisions follow.
    policy: hark_core::domain::decide::Policy,
    /// Where committed outbox messages go to be published at once, when a relay runs here.
    relay: Option<tokio::sync::mpsc::UnboundedSender<Vec<OutboxMessage>>>,
    /// What never changes of recently seen tasks (their chats and how their questions wait),
    /// to spare a read per write.
    routes: std::sync::Arc<RouteCache>,
    /// The questions this process asked lately of tasks without a chat, as an answer over the
    /// API starts from them (see [`answers::AnswerTarget::asked`]).
    asked: std::sync::Arc<Recent<hark_core::domain::TaskId, answers::AnswerTarget>>,
    /// The tasks of the questions in `asked`.
    asked_of: std::sync::Arc<Recent<hark_core::domain::QuestionId, hark_core::domain::TaskId>>,
    /// When this process last wrote that a person was seen in a chat, by a hash of both.
    seen: std::sync::Arc<Recent<u64, std::time::Instant>>,
    /// Creations, claims, asks, answers (and their lookups) and completions waiting to be decided
    /// together.
    creations: std::sync::Arc<batch::Batches<batch::CreateRequest>>,
    claims: std::sync::Arc<batch::Batches<batch::ClaimRequest>>,
    asks: std::sync::Arc<batch::Batches<batch::AskRequest>>,
    form_asks: std::sync::Arc<batch::Batches<form::FormAsk>>,
    form_finishes: std::sync::Arc<batch::Batches<form::FormFinish>>,
    form_creates: std::sync::Arc<batch::Batches<form::FormCreate>>,
    lookups: std::sync::Arc<batch::Batches<batch::AnswerLookup>>,
    answers: std::sync::Arc<batch::Batches<batch::AnswerRequest>>,
    completions: std::sync::Arc<batch::Batches<batch::CompleteRequest>>,
    /// The share of the pool that deciding loops may keep between their statements.
    keepable: std::sync::Arc<tokio::sync::Semaphore>,
    /// Whether a questionnaire's answer takes its next step in the same statement (see
    /// [`form`]) instead of queueing a run for a worker.
    form_steps: bool,
    /// How long before its deadline an open question is reminded (`task.remind_before`): a
    /// question escalates then unless told when.
    remind_before: std::time::Duration,
}

/// The lease a claim's `decision` grants; a claim decided without one is a defect.
fn granted(decision: &hark_core::domain::decide::Decision) -> Result<std::time::Duration, Error> {
    decision.lease().ok_or_else(|| {
        Error::Internal(format!("a claim was decided without a lease: {decision:?}"))
    })
}

/// A bounded memory of recently seen values by key; when full it forgets the oldest entries.
/// What it holds is either never stale (a task's chat route) or only a hint that a
/// compare-and-set checks (the question an answer starts from).
#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    capacity: usize,
    inner: std::sync::Mutex<(
        std::collections::HashMap<K, V>,
        std::collections::VecDeque<K>,
    )>,
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Recent<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Default::default(),
        }
    }

    pub(crate) fn get(&self, key: K) -> Option<V> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(&key)
            .cloned()
    }

    /// Forgets `key`. (Its place in the order stays until it comes up, so a full memory may
    /// forget a key remembered again since a little early.)
    pub(crate) fn forget(&self, key: K) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .remove(&key);
    }

    /// Remembers `value` for `key`, in place of what it held.
    pub(crate) fn remember(&self, key: K, value: V) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(key, value).is_none() {
            order.push_back(key);
            while order.len() > self.capacity {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }
}

/// How many questions a replica remembers of its own asks (see [`answers::AnswerTarget::asked`]):
/// enough for the answers that follow their questions closely, a few KiB each.
const ASKED_REMEMBERED: usize = 256;

/// The chats of recently seen tasks. Routes never change, so it is never stale.
pub(crate) type RouteCache = Recent<hark_core::domain::TaskId, crate::rows::Fixed>;

impl Store {
    pub fn new(
        pool: sqlx::PgPool,
        names: hark_core::bus::Names,
        languages: crate::texts::Languages,
    ) -> Self {
        Self {
            keepable: batch::keepable(&pool),
            pool,
            effects: crate::effects::Effects::new(names.clone(), languages),
            policy: hark_core::domain::decide::Policy { max_attempts: 3 },
            names,
            outbox_ready: Default::default(),
            timers_due: Default::default(),
            relay: None,
            routes: std::sync::Arc::new(Recent::new(50_000)),
            asked: std::sync::Arc::new(Recent::new(ASKED_REMEMBERED)),
            asked_of: std::sync::Arc::new(Recent::new(ASKED_REMEMBERED)),
            seen: std::sync::Arc::new(Recent::new(50_000)),
            claims: Default::default(),
            completions: Default::default(),
            creations: Default::default(),
            lookups: Default::default(),
            answers: Default::default(),
            asks: Default::default(),
            form_asks: Default::default(),
            form_finishes: Default::default(),
            form_creates: Default::default(),
            form_steps: false,
            remind_before: std::time::Duration::from_secs(600),
        }
    }

    /// Counts into `metrics`.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.effects = self.effects.with_metrics(metrics);
        self
    }

    /// What decisions' effects become: the messages a move sends.
    pub fn effects(&self) -> &crate::effects::Effects {
        &self.effects
    }

    /// What the store counts and times (kept by its effects, which count every move).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        self.effects.metrics()
    }

    /// Decides by `policy` (`task.max_attempts` and the like).
    pub fn with_policy(mut self, policy: hark_core::domain::decide::Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Takes a questionnaire's next step with each answer, in the answer's own statement.
    /// `task.remind_before`, which an escalation without its own wait follows; zero (no
    /// reminders) keeps the default of 10 minutes.
    pub fn with_remind_before(mut self, remind_before: std::time::Duration) -> Self {
        if !remind_before.is_zero() {
            self.remind_before = remind_before;
        }
        self
    }

    /// `remind_before` as the ask statements take it, in milliseconds.
    fn remind_before_ms(&self) -> i64 {
        i64::try_from(self.remind_before.as_millis()).unwrap_or(i64::MAX)
    }

    /// What decisions follow (`task.max_attempts` and the like).
    pub fn policy(&self) -> hark_core::domain::decide::Policy {
        self.policy
    }

    /// Whether a questionnaire's answer takes its next step in its own statement.
    pub fn takes_form_steps(&self) -> bool {
        self.form_steps
    }

    pub fn with_questionnaire_steps(mut self) -> Self {
        self.form_steps = true;
        self
    }

    /// Sends committed outbox messages to `relay` for publishing at once.
    pub fn with_relay(
        mut self,
        relay: tokio::sync::mpsc::UnboundedSender<Vec<OutboxMessage>>,
    ) -> Self {
        self.relay = Some(relay);
        self
    }

    pub fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }

    pub fn names(&self) -> &hark_core::bus::Names {
        &self.names
    }

    /// Resolves when a commit wrote to the outbox.
    pub fn outbox_ready(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.outbox_ready.clone()
    }

    /// Resolves when the clock has work now (see [`Store::wake_timers`]).
    pub fn timers_due(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.timers_due.clone()
    }

    /// Tells the clock loop of this process to sweep now.
    pub(super) fn wake_timers(&self) {
        self.timers_due.notify_one();
    }
}
