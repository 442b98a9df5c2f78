//! Decisions taken in batches. Workers claim a task for every run job they take and complete
//! it when its run ends, so under load many such requests wait at once; one statement then
//! decides all of them (each still a compare-and-set on its own task's `(state, generation)`),
//! and one commit makes them durable. A lone request is decided at once, without waiting for
//! company. When a batch's statement fails, each of its requests is decided alone, so a request
//! the database refuses fails by itself and never takes the others down with it.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::future::BoxFuture;
use hark_core::domain::{Event, QuestionId, QuestionOutcome, TaskId, TaskState, decide};
use hark_proto::v1 as pb;
use sqlx::{PgConnection, Postgres, pool::PoolConnection, types::Json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::{
    Answer, AnswerTarget, AskInput, CasRow, Error, Lease, NewTask, OutboxMessage, Store, TaskRow,
    connect,
};

/// The most requests one statement decides.
const MAX_BATCH: usize = 64;

/// A kind of request decided in batches: the statement that decides a batch of them, and the
/// queue they wait in.
pub(super) trait Batched: Sized + Send + Sync + 'static {
    /// What each request is told.
    type Decision: Send + 'static;

    /// One statement for all of `batch`: one decision per request, in order.
    fn decide<'a>(
        store: &'a Store,
        conn: &'a mut PgConnection,
        batch: &'a [Self],
    ) -> BoxFuture<'a, Result<Vec<Self::Decision>, Error>>;

    fn queue(store: &Store) -> &Batches<Self>;
}

type Pending<Q> = (Q, oneshot::Sender<Result<<Q as Batched>::Decision, Error>>);

/// Requests waiting for the next statement. The first request starts the loop that decides them
/// (and starts it again should it ever have stopped).
pub(super) struct Batches<Q: Batched> {
    sender: Mutex<Option<mpsc::UnboundedSender<Pending<Q>>>>,
}

impl<Q: Batched> Default for Batches<Q> {
    fn default() -> Self {
        Self {
            sender: Mutex::new(None),
        }
    }
}

impl<Q: Batched> std::fmt::Debug for Batches<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches").finish_non_exhaustive()
    }
}

impl Store {
    /// Decides `request` together with whatever other requests of its kind wait at the same
    /// time.
    pub(super) async fn decide<Q: Batched>(&self, request: Q) -> Result<Q::Decision, Error> {
        let sender = {
            let mut sender = Q::queue(self)
                .sender
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match &*sender {
                Some(open) if !open.is_closed() => open.clone(),
                _ => {
                    let (open, receiver) = mpsc::unbounded_channel();
                    tokio::spawn(run(self.clone(), receiver));
                    *sender = Some(open.clone());
                    open
                }
            }
        };
        let (reply, decided) = oneshot::channel();
        // The deciding loop only stops with the runtime: the store is going away.
        let stopped = || Error::Busy("the store is shutting down".into());
        sender.send((request, reply)).map_err(|_| stopped())?;
        decided.await.map_err(|_| stopped())?
    }
}

/// How long a deciding loop keeps its connection after its last statement. A request that comes
/// meanwhile runs on the same connection: its statement is already planned there and that
/// backend's caches are warm, where the pool would hand out the connection idle the longest.
const KEEP_FOR: Duration = Duration::from_secs(10);

/// A connection a deciding loop keeps between its statements, and its share of the pool.
struct Kept {
    conn: PoolConnection<Postgres>,
    share: OwnedSemaphorePermit,
    /// [`connect::losses`] when it was kept: after a loss since, it may be dead.
    losses: u64,
}

/// How many of a pool's connections the deciding loops may keep between statements: half, so
/// that the other half always turns over for everything else.
pub(super) fn keepable(pool: &sqlx::PgPool) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        pool.options().get_max_connections() as usize / 2,
    ))
}

async fn run<Q: Batched>(store: Store, mut receiver: mpsc::UnboundedReceiver<Pending<Q>>) {
    let mut kept: Option<Kept> = None;
    loop {
        let first = match kept {
            None => receiver.recv().await,
            // Given back when nothing comes for a while, and at once when the pool closes,
            // which waits for every connection.
            Some(_) => tokio::select! {
                first = receiver.recv() => first,
                _ = tokio::time::sleep(KEEP_FOR) => {
                    kept = None;
                    receiver.recv().await
                }
                _ = store.pool.close_event() => {
                    kept = None;
                    receiver.recv().await
                }
            },
        };
        let Some(first) = first else { return };
        let mut requests = Vec::with_capacity(MAX_BATCH);
        let mut replies = Vec::with_capacity(MAX_BATCH);
        let mut next = Some(first);
        while let Some((request, reply)) = next {
            requests.push(request);
            replies.push(reply);
            next = if requests.len() < MAX_BATCH {
                receiver.try_recv().ok()
            } else {
                None
            };
        }
        // One kept from before a connection was lost goes back to the pool, which checks the
        // connections made before a loss.
        let reused = kept
            .take()
            .filter(|k| k.losses == connect::losses())
            .map(|k| (k.conn, Some(k.share)));
        let (mut conn, share) = match reused {
            Some(reused) => reused,
            None => match store.pool.acquire().await {
                Ok(conn) => (conn, None),
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(Error::from(again(&e))));
                    }
                    continue;
                }
            },
        };
        match Q::decide(&store, &mut conn, &requests).await {
            Ok(answers) if answers.len() == requests.len() => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
                kept = store.keep(conn, share);
            }
            // Every decision answers each request; a statement that did not has committed
            // something unknown, so nothing is decided again.
            Ok(answers) => {
                tracing::error!(
                    answers = answers.len(),
                    requests = requests.len(),
                    "a batch answered the wrong number of requests"
                );
                for reply in replies {
                    let _ = reply.send(Err(Error::Internal(format!(
                        "a batch gave {} answers for {} requests",
                        answers.len(),
                        requests.len()
                    ))));
                }
            }
            Err(e) if requests.len() == 1 => {
                if let Some(reply) = replies.into_iter().next() {
                    let _ = reply.send(Err(e));
                }
            }
            // A failed statement changed nothing (and a compare-and-set decided again cannot
            // apply twice): each request is decided alone, and only one the database refuses
            // fails.
            Err(e) => {
                tracing::debug!(requests = requests.len(), error = %e, "a batch failed; deciding its requests one by one");
                // On connections from the pool, as the failure may have been this one's.
                drop(conn);
                for (request, reply) in requests.iter().zip(replies) {
                    let alone = match store.pool.acquire().await {
                        Ok(mut conn) => {
                            Q::decide(&store, &mut conn, std::slice::from_ref(request)).await
                        }
                        Err(e) => Err(e.into()),
                    };
                    let _ = reply.send(alone.and_then(|mut a| {
                        a.pop().ok_or(Error::Internal(
                            "a request decided alone got no answer".into(),
                        ))
                    }));
                }
            }
        }
    }
}

/// `error` once more, for each of the requests that could not get a connection (one wait for a
/// connection answers the whole batch). What cannot be copied keeps its text, as a failure of the
/// connection.
fn again(error: &sqlx::Error) -> sqlx::Error {
    match error {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        sqlx::Error::Io(e) => sqlx::Error::Io(std::io::Error::new(e.kind(), e.to_string())),
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

impl Store {
    /// Keeps `conn` for a deciding loop's next statement while the pool has others to spare and
    /// the loops' share of it allows; `None` gives it back.
    fn keep(
        &self,
        conn: PoolConnection<Postgres>,
        share: Option<OwnedSemaphorePermit>,
    ) -> Option<Kept> {
        let spare = self.pool.num_idle() > 0
            || self.pool.size() < self.pool.options().get_max_connections();
        if !spare {
            return None;
        }
        let share = match share {
            Some(share) => share,
            None => self.keepable.clone().try_acquire_owned().ok()?,
        };
        Some(Kept {
            conn,
            share,
            losses: connect::losses(),
        })
    }
}

/// What a worker asks: `task`, if it is still pending at `generation`.
#[derive(Debug)]
pub(super) struct ClaimRequest {
    pub(super) task: TaskId,
    pub(super) generation: i64,
    pub(super) worker: String,
    pub(super) lease: Duration,
    /// The move `decide` chose for a claim.
    pub(super) decided: Move,
    /// Whether the claim yields to a pending task of a higher priority, as decided.
    pub(super) yields: bool,
}

/// The move of a decision, as a hot statement binds it: from which state, to which, recorded
/// as which event.
#[derive(Debug, Clone, Copy)]
pub(super) struct Move {
    pub(super) from: &'static str,
    pub(super) to: &'static str,
    pub(super) event: &'static str,
}

impl Move {
    pub(super) fn of(decision: &decide::Decision) -> Self {
        Self {
            from: decision.from.as_str(),
            to: decision.to.as_str(),
            event: decision.event.as_str(),
        }
    }
}

/// How an answer's decision closes questions, as the answer statements bind it: the answered
/// question's outcome, the outcome of the same ask's questions put to others (`None` leaves them
/// open), and whether the answer is applied only when its inbound message was not applied before.
#[derive(Debug, Clone, Copy)]
pub(super) struct Closing {
    pub(super) outcome: &'static str,
    pub(super) others: Option<&'static str>,
    pub(super) once: bool,
}

impl Closing {
    /// How `decision` closes questions; an answer decided without closing its question is a
    /// defect.
    pub(super) fn of(decision: &decide::Decision) -> Result<Self, Error> {
        let outcome = decision.closes().ok_or_else(|| {
            Error::Internal(format!(
                "an answer was decided without closing its question: {decision:?}"
            ))
        })?;
        Ok(Self {
            outcome: outcome.as_str(),
            others: decision.closes_others().map(QuestionOutcome::as_str),
            once: decision.guarded(decide::Guard::Once),
        })
    }

    /// Binds every request's closing as three arrays: the outcome, the others' outcome and
    /// whether it applies once.
    pub(super) fn bind<'q, T, R>(
        query: BatchQuery<'q, R>,
        batch: &'q [T],
        of: fn(&T) -> &Closing,
    ) -> BatchQuery<'q, R> {
        query
            .bind(column(batch, |r| of(r).outcome))
            .bind(column(batch, |r| of(r).others))
            .bind(column(batch, |r| of(r).once))
    }
}

/// A run that ended: its lease, its last round, its result, and the chat message telling it.
#[derive(Debug)]
pub(super) struct CompleteRequest {
    pub(super) lease: Lease,
    pub(super) round: Option<(i32, serde_json::Value)>,
    pub(super) result: String,
    pub(super) outbox: Vec<OutboxMessage>,
    /// The move `decide` chose for the finish.
    pub(super) decided: Move,
}

/// How a creation was decided.
#[derive(Debug)]
pub(super) enum Created {
    New(Box<TaskRow>),
    /// Its request id was used before, or its owner is at the limit of active tasks.
    NotInserted,
}

/// A task to create, with its id and the run job that starts it.
#[derive(Debug)]
pub(super) struct CreateRequest {
    pub(super) id: TaskId,
    pub(super) new: NewTask,
    pub(super) job: OutboxMessage,
}

/// An answer to apply: the task moves from `waiting_input` at `generation` back to `pending`,
/// the question is answered and the run job queued.
#[derive(Debug)]
pub(super) struct AnswerRequest {
    pub(super) task: TaskId,
    pub(super) generation: i64,
    pub(super) question: QuestionId,
    pub(super) answer: Answer,
    /// Where the decision found the task and where it moves it.
    pub(super) from: TaskState,
    pub(super) to: TaskState,
    /// How the decision closes the question and the same ask's others.
    pub(super) closing: Closing,
    /// The run the move queues (none for a paused task, which runs once resumed), and what the
    /// others asked the same are told.
    pub(super) outbox: Vec<OutboxMessage>,
    /// What the model reads, when the question belongs to an ask put to several people.
    pub(super) model_answer: Option<String>,
}

/// Where an answer goes: the question `question`, or the open question of `task`; with whether
/// the inbound message it came in was applied before.
#[derive(Debug)]
pub(super) struct AnswerLookup {
    pub(super) question: Option<QuestionId>,
    pub(super) task: Option<TaskId>,
    pub(super) inbound_key: Option<String>,
}

/// A question to ask: the running task held under `lease` moves to `waiting_input`, its round
/// is stored, the instructions that round consumed are marked, any open question of the task is
/// superseded, the question is created and its chat message queued.
#[derive(Debug)]
pub(super) struct AskRequest {
    pub(super) lease: Lease,
    pub(super) input: AskInput,
    pub(super) question: QuestionId,
    pub(super) handle: String,
    pub(super) outbox: Vec<OutboxMessage>,
    /// The `traceparent` of the span that asked.
    pub(super) trace: Option<String>,
    /// The people it is put to at once, when not the task's owner.
    pub(super) audience: Option<super::worker::Audience>,
    /// Where the ask leads, with and without a pause waiting.
    pub(super) decided: super::worker::AskMoves,
}

impl AskRequest {
    /// The question this ask created, as the task that won it holds it.
    fn asked(&self, task: &TaskRow, deadline: Option<time::OffsetDateTime>) -> pb::Question {
        crate::convert::question(&super::worker::asked_question(
            task,
            self.question,
            &self.handle,
            &self.input,
            self.audience.as_ref(),
            deadline,
        ))
    }
}

/// How an ask was decided.
#[derive(Debug)]
pub(super) enum Asked {
    /// The task waits on the question; the row holds the question's deadline.
    Won(Box<CasRow>),
    /// The lease no longer held.
    Lost,
    /// Another open question of the owner in the stream has this handle; draw another.
    HandleTaken,
}

/// The durable outbox messages of a batch's requests as parallel arrays for `unnest`, each with
/// its request's place in the batch (from 1, as `WITH ORDINALITY` counts).
pub(super) struct OutboxColumns<'a> {
    pub(super) ords: Vec<i64>,
    pub(super) subjects: Vec<&'a str>,
    pub(super) msg_ids: Vec<&'a str>,
    pub(super) payloads: Vec<Vec<u8>>,
    pub(super) traces: Vec<Option<&'a str>>,
}

/// A statement of a batch, its arguments bound so far.
pub(super) type BatchQuery<'q, R> =
    sqlx::query::QueryAs<'q, sqlx::Postgres, R, sqlx::postgres::PgArguments>;

/// Whom each of a batch of asks goes to beside the owner, as both ask statements take it: the
/// escalation's people, its wait and the reminder's lead in milliseconds, then the audience's
/// first person, stream, need, number of people and group.
pub(super) struct AskedColumns<'a> {
    pub(super) escalation: &'a super::Escalation,
    pub(super) audience: Option<&'a super::worker::Audience>,
    pub(super) question: QuestionId,
}

impl<'a> AskedColumns<'a> {
    /// Binds the eight columns of `batch`, in order, as the next arguments of `query`.
    pub(super) fn bind<'q, T, R>(
        query: BatchQuery<'q, R>,
        batch: &'a [T],
        remind_before_ms: i64,
        of: impl Fn(&'a T) -> AskedColumns<'a>,
    ) -> BatchQuery<'q, R>
    where
        'a: 'q,
    {
        let asks: Vec<AskedColumns<'a>> = batch.iter().map(of).collect();
        query
            .bind(column(&asks, |a| a.escalation.column()))
            .bind(column(&asks, |a| a.escalation.after_ms()))
            .bind(column(&asks, |_| remind_before_ms))
            .bind(column(&asks, |a| a.audience.map(|a| a.first.as_str())))
            .bind(column(&asks, |a| a.audience.map(|a| a.stream.as_str())))
            .bind(column(&asks, |a| a.audience.map_or(1, |a| a.need)))
            .bind(column(&asks, |a| a.audience.map_or(1, |a| a.askees)))
            .bind(column(&asks, |a| {
                a.audience
                    .filter(|a| a.askees > 1)
                    .map(|_| a.question.as_uuid())
            }))
    }
}

impl<'a> OutboxColumns<'a> {
    /// Binds the five columns, in order, as the next arguments of `query`.
    pub(super) fn bind_to<'q, R>(self, query: BatchQuery<'q, R>) -> BatchQuery<'q, R>
    where
        'a: 'q,
    {
        query
            .bind(self.ords)
            .bind(self.subjects)
            .bind(self.msg_ids)
            .bind(self.payloads)
            .bind(self.traces)
    }

    pub(super) fn of(outboxes: impl Iterator<Item = &'a [OutboxMessage]>) -> Self {
        let mut columns = Self {
            ords: Vec::new(),
            subjects: Vec::new(),
            msg_ids: Vec::new(),
            payloads: Vec::new(),
            traces: Vec::new(),
        };
        for (ord, outbox) in (1..).zip(outboxes) {
            for message in outbox.iter().filter(|m| m.durable) {
                columns.ords.push(ord);
                columns.subjects.push(&message.subject);
                columns.msg_ids.push(&message.msg_id);
                columns.payloads.push(message.payload.to_vec());
                columns.traces.push(message.trace.as_deref());
            }
        }
        columns
    }
}

/// One batch's row: a request that won, and its place in the batch.
#[derive(sqlx::FromRow)]
struct BatchRow {
    #[sqlx(flatten)]
    row: CasRow,
    ord: i64,
}

/// A task row and its request's place in the batch.
#[derive(sqlx::FromRow)]
struct OrderedTask {
    #[sqlx(flatten)]
    task: TaskRow,
    ord: i64,
}

/// The target of one lookup, and the lookup's place in the batch.
#[derive(sqlx::FromRow)]
struct OrderedTarget {
    #[sqlx(flatten)]
    target: AnswerTarget,
    ord: i64,
}

/// Binds the tasks `batch` creates as the first eighteen arguments of `query`, in the order
/// `new_tasks!` reads them.
pub(super) fn bind_new_tasks<'q, T, R>(
    query: BatchQuery<'q, R>,
    batch: &'q [T],
    of: fn(&T) -> (TaskId, &NewTask),
) -> BatchQuery<'q, R> {
    let new = |r: &'q T| of(r).1;
    query
        .bind(column(batch, |r| of(r).0.as_uuid()))
        .bind(column(batch, |r| new(r).owner.as_str()))
        .bind(column(batch, |r| {
            new(r).chat.as_ref().map(|c| c.platform.as_str())
        }))
        .bind(column(batch, |r| {
            new(r).chat.as_ref().map(|c| c.bot_id.as_str())
        }))
        .bind(column(batch, |r| {
            new(r).chat.as_ref().map(|c| c.stream.as_str())
        }))
        .bind(column(batch, |r| {
            new(r)
                .chat
                .as_ref()
                .and_then(|c| c.origin_message_id.as_deref())
        }))
        .bind(column(batch, |r| new(r).goal.as_str()))
        .bind(column(batch, |r| new(r).on_timeout.as_str()))
        .bind(column(batch, |r| {
            i32::try_from(new(r).ask_timeout.as_secs()).unwrap_or(i32::MAX)
        }))
        .bind(column(batch, |r| new(r).request_id.as_deref()))
        .bind(column(batch, |r| i64::from(new(r).active_limit)))
        .bind(column(batch, |r| new(r).questionnaire.as_ref().map(Json)))
        .bind(column(batch, |r| new(r).schedule))
        .bind(column(batch, |r| new(r).priority))
        .bind(column(batch, |r| {
            new(r)
                .deadline
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }))
        .bind(column(batch, |r| new(r).on_deadline.as_str()))
        .bind(column(batch, |r| new(r).asked_by.as_deref()))
        .bind(column(batch, |r| new(r).key_id))
}

/// One column of a batch's requests, as an array to bind for `unnest`.
pub(super) fn column<'a, T, U>(batch: &'a [T], value: impl FnMut(&'a T) -> U) -> Vec<U> {
    batch.iter().map(value).collect()
}

/// Each request's row, placed by its request's place in the batch (from 1); `None` for a request
/// that has no row (it lost, or found nothing).
pub(super) fn in_order<R>(
    count: usize,
    rows: impl IntoIterator<Item = (i64, R)>,
) -> Vec<Option<R>> {
    let mut placed: Vec<Option<R>> = (0..count).map(|_| None).collect();
    for (ord, row) in rows {
        if let Some(slot) = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| placed.get_mut(i))
        {
            *slot = Some(row);
        }
    }
    placed
}

fn cas_rows(rows: Vec<BatchRow>) -> impl Iterator<Item = (i64, CasRow)> {
    rows.into_iter().map(|BatchRow { row, ord }| (ord, row))
}

macro_rules! batched {
    ($request:ty, $decision:ty, $queue:ident, $statement:ident) => {
        impl Batched for $request {
            type Decision = $decision;

            fn decide<'a>(
                store: &'a Store,
                conn: &'a mut PgConnection,
                batch: &'a [Self],
            ) -> BoxFuture<'a, Result<Vec<Self::Decision>, Error>> {
                Box::pin(store.$statement(conn, batch))
            }

            fn queue(store: &Store) -> &Batches<Self> {
                &store.$queue
            }
        }
    };
}

batched!(CreateRequest, Created, creations, create_batch);
batched!(ClaimRequest, Option<CasRow>, claims, claim_batch);
batched!(AskRequest, Asked, asks, ask_batch);
batched!(AnswerLookup, Option<AnswerTarget>, lookups, lookup_batch);
batched!(AnswerRequest, Option<TaskRow>, answers, answer_batch);
batched!(CompleteRequest, Option<CasRow>, completions, complete_batch);

/// The claim statement: each row of `$candidates` (`c_id`, `c_generation`, `c_worker`,
/// `c_lease_ms`, `c_ord`, and the decided move `c_from`, `c_to`, `c_event`) moves its task under a
/// lease when the task is still at that state and generation and `$guard` holds, and returns what
/// the worker needs to run it.
macro_rules! claim_sql {
    ($candidates:expr, $guard:expr) => {
        concat!("WITH ", claim_sql!(@ctes $candidates, $guard))
    };
    (@ctes $candidates:expr, $guard:expr) => {
        concat!(
            "c AS (",
            $candidates,
            "), t AS (
                UPDATE tasks SET ",
            set_moved!("c.c_to", 1, held("c.c_worker", "c.c_lease_ms")),
            "
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = c.c_from AND tasks.generation = c.c_generation",
            $guard,
            " RETURNING ",
            task_columns!(),
            ", c.c_ord, c.c_from, c.c_event
            ), audit AS (
                ", audit_into!(), "
                SELECT id, c_from, state, c_event, generation, worker_id, '' FROM t
            )
            SELECT t.*, t.c_ord AS ord, NULL::timestamptz AS asked_deadline,
                (SELECT coalesce(json_agg(json_build_object('round', round, 'messages', messages) ORDER BY round), '[]')
                 FROM checkpoints WHERE task_id = t.id) AS ctx_rounds,
                (SELECT json_build_object('id', id, 'tool_call_id', tool_call_id, 'round', round,
                        'outcome', outcome, 'answer', coalesce(model_answer, answer),
                        'waited_ms', (extract(epoch FROM deadline - asked_at) * 1000)::bigint,
                        'since_closed_ms', (extract(epoch FROM now() - closed_at) * 1000)::bigint,
                        'traceparent', traceparent)
                 FROM questions WHERE task_id = t.id
                   -- Of an ask put to several people, the answer that resumed it (or its expiry).
                   AND (ask_group IS NULL OR model_answer IS NOT NULL OR outcome = ", sql_outcome!(expired), ")
                 ORDER BY asked_at DESC, id DESC LIMIT 1) AS ctx_question,
                (SELECT coalesce(json_agg(json_build_object('id', id, 'text', text, 'author', author)
                                          ORDER BY created_at, id), '[]')
                 FROM instructions WHERE task_id = t.id AND consumed_round IS NULL) AS ctx_instructions
            FROM t"
        )
    };
}

impl Store {
    /// The claim of a job whose own task was not the one to take. Either a task of a higher
    /// priority is pending while the job's task still is: the best pending task (the highest
    /// priority, the longest pending among equals) is claimed, and the job's task is marked owed,
    /// since its job was spent. Or the job's task was taken that way by another task's job: the
    /// best task owed is claimed. Every task has a job of its own or is owed one, so the jobs do
    /// not run out before the tasks do; a job with neither case is stale. `None` then.
    pub(super) async fn claim_best(
        &self,
        job: TaskId,
        job_generation: i64,
        worker: &str,
        lease: Duration,
        decided: Move,
    ) -> Result<Option<CasRow>, Error> {
        let sql = concat!(
            "WITH owing AS (
                SELECT EXISTS (SELECT 1 FROM tasks j WHERE j.id = $3 AND j.state = ",
            sql_state!(pending),
            " AND j.generation = $4) AS displaced
            ), owe AS (
                UPDATE tasks SET owed = true
                WHERE id = $3 AND state = ",
            sql_state!(pending),
            " AND generation = $4
                  AND (SELECT displaced FROM owing)
                  AND EXISTS (SELECT 1 FROM tasks h WHERE h.state = ",
            sql_state!(pending),
            " AND h.priority > tasks.priority)
            ), ",
            claim_sql!(@ctes
                concat!(
                    "SELECT id AS c_id, generation AS c_generation, $1::text AS c_worker,
                            $2::bigint AS c_lease_ms, 1::bigint AS c_ord,
                            $5::text AS c_from, $6::text AS c_to, $7::text AS c_event
                     FROM tasks WHERE state = ",
                    sql_state!(pending),
                    " AND id <> $3
                       AND (owed OR ((SELECT displaced FROM owing)
                                     AND priority > (SELECT priority FROM tasks WHERE id = $3)))
                     ORDER BY priority DESC, updated_at LIMIT 1 FOR UPDATE SKIP LOCKED"
                ),
                ""
            )
        );
        let row: Option<BatchRow> = sqlx::query_as(sql)
            .bind(worker)
            .bind(lease.as_millis() as i64)
            .bind(job.as_uuid())
            .bind(job_generation)
            .bind(decided.from)
            .bind(decided.to)
            .bind(decided.event)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| {
            self.published(vec![self.effects.event(&r.row.task, decided.event, None)]);
            r.row
        }))
    }

    /// One statement for all of `batch`; the result holds, in order, the row of each claim that
    /// won. A claim wins its job's task unless a task of a higher priority is pending (see
    /// [`Store::claim_best`]).
    async fn claim_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[ClaimRequest],
    ) -> Result<Vec<Option<CasRow>>, Error> {
        let sql = claim_sql!(
            "SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::bigint[],
                                  $5::text[], $6::text[], $7::text[], $8::bool[])
                WITH ORDINALITY AS c(c_id, c_generation, c_worker, c_lease_ms, c_from, c_to, c_event,
                                     c_yields, c_ord)",
            yields_to_priority!("c.c_yields", "tasks.priority")
        );
        let rows: Vec<BatchRow> = sqlx::query_as(sql)
            .bind(column(batch, |r| r.task.as_uuid()))
            .bind(column(batch, |r| r.generation))
            .bind(column(batch, |r| r.worker.as_str()))
            .bind(column(batch, |r| r.lease.as_millis() as i64))
            .bind(column(batch, |r| r.decided.from))
            .bind(column(batch, |r| r.decided.to))
            .bind(column(batch, |r| r.decided.event))
            .bind(column(batch, |r| r.yields))
            .fetch_all(&mut *conn)
            .await?;
        let events = rows
            .iter()
            .filter_map(|r| {
                let request = batch.get(usize::try_from(r.ord - 1).ok()?)?;
                Some(self.effects.event(&r.row.task, request.decided.event, None))
            })
            .collect();
        self.published(events);
        Ok(in_order(batch.len(), cas_rows(rows)))
    }

    /// One statement for all of `batch`: each running task held under its lease moves to
    /// `completed` with its result, its audit row, its last round and its chat message.
    async fn complete_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[CompleteRequest],
    ) -> Result<Vec<Option<CasRow>>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::int[], $6::jsonb[],
                                     $12::text[], $13::text[], $14::text[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_worker, c_result, c_round, c_messages,
                                         c_from, c_to, c_event, c_ord)
            ), t AS (
                UPDATE tasks SET ", set_moved!("c.c_to", 1, released(ended)), ",
                    rounds = greatest(rounds, coalesce(c.c_round, 0)),
                    result = c.c_result
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = c.c_from AND tasks.generation = c.c_generation
                  AND tasks.worker_id = c.c_worker
                RETURNING ",
            task_columns!(),
            ", c.c_ord, c.c_worker, c.c_round, c.c_messages, c.c_from, c.c_event
            ), audit AS (
                ", audit_into!(), "
                SELECT id, c_from, state, c_event, generation, c_worker, '' FROM t
            ), checkpoint AS (
                INSERT INTO checkpoints (task_id, round, messages)
                SELECT id, c_round, c_messages FROM t WHERE c_round IS NOT NULL
                ON CONFLICT DO NOTHING
            ), out AS (
                ", outbox_of_batch!("$7", "$8", "$9", "$10", "$11"), "
            )
            SELECT t.*, t.c_ord AS ord, NULL::timestamptz AS asked_deadline,
                NULL::json AS ctx_rounds, NULL::json AS ctx_question, NULL::json AS ctx_instructions
            FROM t"
        );
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        let query = sqlx::query_as(sql)
            .bind(column(batch, |r| r.lease.task.as_uuid()))
            .bind(column(batch, |r| r.lease.generation))
            .bind(column(batch, |r| r.lease.worker_id.as_str()))
            .bind(column(batch, |r| r.result.as_str()))
            .bind(column(batch, |r| r.round.as_ref().map(|(n, _)| *n)))
            .bind(column(batch, |r| r.round.as_ref().map(|(_, m)| Json(m))));
        let rows: Vec<BatchRow> = out
            .bind_to(query)
            .bind(column(batch, |r| r.decided.from))
            .bind(column(batch, |r| r.decided.to))
            .bind(column(batch, |r| r.decided.event))
            .fetch_all(&mut *conn)
            .await?;
        let mut sent = Vec::new();
        for r in &rows {
            let task = &r.row.task;
            if let Some(request) = usize::try_from(r.ord - 1).ok().and_then(|i| batch.get(i)) {
                sent.extend(request.outbox.iter().cloned());
                sent.push(self.effects.event(task, request.decided.event, None));
            }
        }
        self.published(sent);
        Ok(in_order(batch.len(), cas_rows(rows)))
    }

    /// One statement for all of `batch`: each task inserted in `pending` with its audit row and
    /// its first run job, unless its request id was used before or its owner already has as many
    /// tasks that have not ended as its limit allows (counting the batch's own requests in
    /// order). A request without a row is then told which of the two it was.
    async fn create_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[CreateRequest],
    ) -> Result<Vec<Created>, Error> {
        let sql = concat!(
            "WITH ",
            new_tasks!(),
            ", t AS (",
            insert_new_tasks!(sql_state!(pending), 1, 0),
            "
            ), audit AS (
                ",
            audit_into!(),
            "
                SELECT id, NULL, ",
            sql_state!(pending),
            ", ",
            sql_event!(create),
            ", generation, owner, '' FROM t
            ), out AS (
                INSERT INTO outbox (subject, msg_id, payload, traceparent)
                SELECT o.s, o.m, o.p, o.tp FROM t
                JOIN unnest($19::uuid[], $20::text[], $21::text[], $22::bytea[], $23::text[])
                    AS o(task, s, m, p, tp)
                  ON o.task = t.id
            )
            SELECT * FROM t"
        );
        let rows: Vec<TaskRow> = bind_new_tasks(sqlx::query_as(sql), batch, |r| (r.id, &r.new))
            .bind(column(batch, |r| r.id.as_uuid()))
            .bind(column(batch, |r| r.job.subject.as_str()))
            .bind(column(batch, |r| r.job.msg_id.as_str()))
            .bind(column(batch, |r| r.job.payload.to_vec()))
            .bind(column(batch, |r| r.job.trace.as_deref()))
            .fetch_all(&mut *conn)
            .await?;
        let mut created: Vec<Created> = batch.iter().map(|_| Created::NotInserted).collect();
        let mut sent = Vec::with_capacity(rows.len() * 2);
        for row in rows {
            if let Some(i) = batch.iter().position(|r| r.id == row.id) {
                sent.push(batch[i].job.clone());
                sent.push(self.effects.event(&row, "create", None));
                created[i] = Created::New(Box::new(row));
            }
        }
        self.published(sent);
        Ok(created)
    }

    /// One read for all of `batch`: each lookup's question (by id, or the newest open one of its
    /// task) with its task's state and generation, and whether its inbound message was applied.
    async fn lookup_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[AnswerLookup],
    ) -> Result<Vec<Option<AnswerTarget>>, Error> {
        // A lookup whose inbound message was applied before finds the question that message
        // answered, whatever the task did since, so a retried answer gets its first outcome
        // back. Otherwise it has either a question or a task; the other branch finds nothing by
        // a NULL. Branches rather than one condition with an OR, so each is a plain index lookup.
        let sql = concat!(
            "SELECT q.*, ",
            answer_target_columns!(),
            ",
                    EXISTS (SELECT 1 FROM applied_inbound WHERE key = l.l_inbound) AS applied,
                    l.l_ord AS ord
             FROM unnest($1::uuid[], $2::uuid[], $3::text[])
                 WITH ORDINALITY AS l(l_question, l_task, l_inbound, l_ord)
             CROSS JOIN LATERAL (
                 (SELECT ",
            question_columns!(),
            " FROM questions
                  WHERE id = (SELECT question_id FROM applied_inbound WHERE key = l.l_inbound))
                 UNION ALL
                 (SELECT ",
            question_columns!(),
            " FROM questions WHERE id = l.l_question)
                 UNION ALL
                 (SELECT ",
            question_columns!(),
            " FROM questions
                  WHERE task_id = l.l_task AND outcome = $4 ORDER BY asked_at DESC LIMIT 1)
                 LIMIT 1
             ) q
             JOIN tasks t ON t.id = q.task_id"
        );
        let rows: Vec<OrderedTarget> = sqlx::query_as(sql)
            .bind(column(batch, |l| l.question.map(|q| q.as_uuid())))
            .bind(column(batch, |l| l.task.map(|t| t.as_uuid())))
            .bind(column(batch, |l| l.inbound_key.as_deref()))
            .bind(super::OPEN)
            .fetch_all(&mut *conn)
            .await?;
        Ok(in_order(
            batch.len(),
            rows.into_iter().map(|r| (r.ord, r.target)),
        ))
    }

    /// One statement for all of `batch`: each task still waiting at its generation moves to
    /// `pending`, its question is answered, the inbound id recorded and the run job queued.
    async fn answer_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[AnswerRequest],
    ) -> Result<Vec<Option<TaskRow>>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                                     $12::text[], $13::text[], $15::text[], $16::text[], $17::text[],
                                     $18::bool[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_question, c_answerer, c_text, c_inbound,
                                         c_from, c_to, c_model, c_outcome, c_others, c_once, c_ord)
            ), t AS (
                UPDATE tasks SET ", set_moved!("c.c_to", 1, released(open)), "
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = c.c_from AND tasks.generation = c.c_generation
                  ", not_applied_before!("c.c_once", "c.c_inbound"), "
                RETURNING ",
            task_columns!(),
            ", c.c_ord, c.c_question, c.c_answerer, c.c_text, c.c_inbound, c.c_from, c.c_model,
               c.c_outcome, c.c_others
            ), audit AS (
                ", audit_into!(), "
                SELECT id, c_from, state, $14, generation, c_answerer, '' FROM t
            ), answered AS (
                UPDATE questions q SET outcome = t.c_outcome, closed_at = now(), answerer = t.c_answerer,
                                       answer = t.c_text, inbound_message_id = t.c_inbound,
                                       model_answer = t.c_model
                FROM t WHERE q.id = t.c_question AND q.outcome = $19
            ), ", supersede_others!("c_question", "c_others"), ", applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT c_inbound, id, c_question FROM t WHERE c_inbound IS NOT NULL
                ON CONFLICT DO NOTHING
            ), out AS (
                ", outbox_of_batch!("$7", "$8", "$9", "$10", "$11"), "
            )
            SELECT t.*, t.c_ord AS ord FROM t"
        );
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        let query = sqlx::query_as(sql)
            .bind(column(batch, |r| r.task.as_uuid()))
            .bind(column(batch, |r| r.generation))
            .bind(column(batch, |r| r.question.as_uuid()))
            .bind(column(batch, |r| r.answer.answerer.as_str()))
            .bind(column(batch, |r| r.answer.text.as_str()))
            .bind(column(batch, |r| r.answer.inbound_key.as_deref()));
        let query = out
            .bind_to(query)
            .bind(column(batch, |r| r.from.as_str()))
            .bind(column(batch, |r| r.to.as_str()))
            .bind(Event::Answer.as_str())
            .bind(column(batch, |r| r.model_answer.as_deref()));
        let rows: Vec<OrderedTask> = Closing::bind(query, batch, |r| &r.closing)
            .bind(super::OPEN)
            .fetch_all(&mut *conn)
            .await?;
        hark_core::failpoint::hit("answer.after_commit");
        let won = in_order(batch.len(), rows.into_iter().map(|r| (r.ord, r.task)));
        let mut sent = Vec::with_capacity(batch.len() * 2);
        for (request, task) in batch.iter().zip(&won) {
            if let Some(task) = task {
                sent.extend(request.outbox.iter().cloned());
                sent.push(self.effects.event(task, Event::Answer.as_str(), None));
            }
        }
        self.published(sent);
        Ok(won)
    }

    /// [`Store::ask_statement`] for all of `batch`. A handle already taken fails the whole
    /// statement; the batch's asks are then decided one by one (see [`run`]), and the one whose
    /// handle is taken draws another.
    async fn ask_batch(
        &self,
        conn: &mut PgConnection,
        batch: &[AskRequest],
    ) -> Result<Vec<Asked>, Error> {
        match self.ask_statement(conn, batch).await {
            Err(e) if batch.len() == 1 && handle_taken(&e) => Ok(vec![Asked::HandleTaken]),
            decided => decided,
        }
    }

    /// One statement for all of `batch`. The task's state is compared with the state the ask
    /// was decided from, a parameter: a literal `running` would let the planner read an index of
    /// active tasks instead of the primary key, and with statistics taken while none ran, it
    /// does, reading every running task for each ask.
    async fn ask_statement(
        &self,
        conn: &mut PgConnection,
        batch: &[AskRequest],
    ) -> Result<Vec<Asked>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::int[], $5::jsonb[],
                                     $6::uuid[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[],
                                     $19::jsonb[], $24::text[], $25::uuid[], $26::jsonb[], $27::bigint[],
                                     $28::bigint[], $29::text[], $30::text[], $31::smallint[],
                                     $32::smallint[], $33::uuid[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_worker, c_round, c_messages, c_question,
                                         c_handle, c_text, c_context, c_tool_call_id, c_expires_ms,
                                         c_choices, c_traceparent, c_waits_for, c_escalate_to,
                                         c_escalate_ms, c_remind_ms, c_owner, c_stream, c_need,
                                         c_askees, c_group, c_ord)
            ), t AS (
                UPDATE tasks SET ",
            set_moved!(
                "CASE WHEN tasks.pause_requested THEN $21 ELSE $20 END",
                1,
                released(open)
            ),
            ",
                    paused_at = CASE WHEN tasks.pause_requested THEN now() END,
                    pause_requested = false,
                    rounds = greatest(rounds, c.c_round)
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = $22 AND tasks.generation = c.c_generation
                  AND tasks.worker_id = c.c_worker
                RETURNING ",
            task_columns!(),
            ", c.*
            ), audit AS (
                ", audit_into!(), "
                SELECT id, $22, state, $23, generation, c_worker, c_text FROM t
            ), closed AS (
                UPDATE questions q SET outcome = $34, closed_at = now()
                FROM t WHERE q.task_id = t.id AND q.outcome = $35
            ), checkpoint AS (
                INSERT INTO checkpoints (task_id, round, messages)
                SELECT id, c_round, c_messages FROM t
                ON CONFLICT DO NOTHING
            ), consumed AS (
                UPDATE instructions i SET consumed_round = t.c_round
                FROM t JOIN unnest($12::bigint[], $13::uuid[]) AS u(ord, id) ON u.ord = t.c_ord
                WHERE i.id = u.id AND i.task_id = t.id AND i.consumed_round IS NULL
            ), asked AS (
                INSERT INTO questions (id, task_id, handle, text, context, tool_call_id, round, owner,
                                       platform, bot_id, stream, choices, traceparent, waits_for,
                                       deadline, escalate_to, escalate_every_ms, escalate_at,
                                       need, askees, ask_group)
                SELECT c_question, id, c_handle, c_text, c_context, c_tool_call_id, c_round,
                       coalesce(c_owner, owner), platform, bot_id, coalesce(c_stream, stream),
                       c_choices, c_traceparent, c_waits_for, d.deadline, ", asked_values!(), "
                FROM t
                CROSS JOIN LATERAL (SELECT ", expires_in!("t.c_expires_ms"), " AS deadline) d
                ", asked_escalation!(), "
                RETURNING task_id, deadline
            ), out AS (
                ", outbox_of_batch!("$14", "$15", "$16", "$17", "$18"), "
            )
            SELECT t.*, t.c_ord AS ord,
                (SELECT deadline FROM asked WHERE asked.task_id = t.id) AS asked_deadline,
                NULL::json AS ctx_rounds, NULL::json AS ctx_question, NULL::json AS ctx_instructions
            FROM t"
        );
        let mut consumed_ords = Vec::new();
        let mut consumed_ids = Vec::new();
        for (ord, request) in (1..).zip(batch) {
            for id in &request.input.consumed_instructions {
                consumed_ords.push(ord);
                consumed_ids.push(*id);
            }
        }
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        let query = sqlx::query_as(sql)
            .bind(column(batch, |r| r.lease.task.as_uuid()))
            .bind(column(batch, |r| r.lease.generation))
            .bind(column(batch, |r| r.lease.worker_id.as_str()))
            .bind(column(batch, |r| r.input.round))
            .bind(column(batch, |r| Json(&r.input.messages)))
            .bind(column(batch, |r| r.question.as_uuid()))
            .bind(column(batch, |r| r.handle.as_str()))
            .bind(column(batch, |r| r.input.question.as_str()))
            .bind(column(batch, |r| r.input.context.as_str()))
            .bind(column(batch, |r| r.input.tool_call_id.as_str()))
            .bind(column(batch, |r| r.decided.expires_ms))
            .bind(consumed_ords)
            .bind(consumed_ids);
        // Every ask of a batch was decided from a running task by the same command, so the
        // first one's moves are the batch's.
        let Some(decided) = batch.first().map(|r| r.decided) else {
            return Ok(Vec::new());
        };
        debug_assert_eq!(decided.waits.from, decided.pauses.from);
        debug_assert_eq!(decided.waits.event, decided.pauses.event);
        let query = out
            .bind_to(query)
            .bind(column(batch, |r| {
                crate::rows::StoredShape::of(&r.input.shape)
            }))
            .bind(decided.waits.to)
            .bind(decided.pauses.to)
            .bind(decided.waits.from)
            .bind(decided.waits.event)
            .bind(column(batch, |r| r.trace.as_deref()))
            .bind(column(batch, |r| r.input.waits_for.map(|t| t.as_uuid())));
        let rows: Vec<BatchRow> =
            AskedColumns::bind(query, batch, self.remind_before_ms(), |r| AskedColumns {
                escalation: &r.input.escalation,
                audience: r.audience.as_ref(),
                question: r.question,
            })
            .bind(decided.closes)
            .bind(super::OPEN)
            .fetch_all(&mut *conn)
            .await?;
        let mut sent = Vec::new();
        for r in &rows {
            let task = &r.row.task;
            let Some(request) = usize::try_from(r.ord - 1).ok().and_then(|i| batch.get(i)) else {
                continue;
            };
            sent.extend(request.outbox.iter().cloned());
            let question = request.asked(task, r.row.asked_deadline);
            sent.push(
                self.effects
                    .event(task, decided.waits.event, Some(question)),
            );
        }
        self.published(sent);
        Ok(in_order(batch.len(), cas_rows(rows))
            .into_iter()
            .map(|row| row.map_or(Asked::Lost, |row| Asked::Won(Box::new(row))))
            .collect())
    }
}

/// Whether `error` is the unique index on open question handles refusing a handle.
pub(super) fn handle_taken(error: &Error) -> bool {
    matches!(error, Error::Database(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505"))
}
