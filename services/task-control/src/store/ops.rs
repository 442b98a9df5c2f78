//! The store's operations. Every state change goes through [`cas`]: one statement that moves the
//! task from `(state, generation)` to the next state, writes the audit row and the outbox
//! messages, and reports whether it won.

use std::time::Duration;

use bytes::Bytes;
use hark_core::domain::{
    Event, Handle, Owner, QuestionId, QuestionOutcome, TaskId, TaskState, TimeoutPolicy,
    decide::{self, Command, Decision, Effect},
    form::FormQuestion,
};
use hark_proto::v1 as pb;
use sqlx::{Arguments as _, AssertSqlSafe, PgConnection, postgres::PgArguments, types::Json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    ChatRoute, Error, Instruction, Lease, QuestionRow, RoundRow, Store, TaskRow, TransitionRow,
};
use crate::render;

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
}

/// What a worker receives when its claim wins.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub task: TaskRow,
    pub lease: Lease,
    pub rounds: Vec<RoundRow>,
    pub resume: Option<Resume>,
    pub instructions: Vec<Instruction>,
}

/// The result of the pending ask_user call of a resumed task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub question_id: QuestionId,
    pub tool_call_id: String,
    pub expired: bool,
    pub text: String,
}

/// What the agent asked, with the round that ends in the ask_user call.
#[derive(Debug, Clone)]
pub struct AskInput {
    pub round: i32,
    pub messages: serde_json::Value,
    pub consumed_instructions: Vec<Uuid>,
    pub tool_call_id: String,
    pub question: String,
    pub context: String,
    /// Overrides the task's deadline for this question.
    pub timeout: Option<Duration>,
    /// The answers the question accepts, when it offers choices.
    pub choices: Vec<String>,
}

/// An answer to apply.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `platform:user_id`, or the API caller.
    pub answerer: String,
    pub text: String,
    /// The inbound message (or request) id; the same key applied twice changes nothing.
    pub inbound_key: Option<String>,
}

#[derive(Debug, Clone)]
pub enum AnswerOutcome {
    Applied {
        task: Box<TaskRow>,
        question: Box<QuestionRow>,
        /// The next question, when the answer's own statement asked it (a questionnaire's).
        asked: Option<Box<pb::Question>>,
    },
    /// This inbound message was applied before; nothing changed. The question is the one it
    /// answered, when the lookup found it.
    Duplicate { question: Box<QuestionRow> },
}

/// When a told instruction reaches the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TellDelivery {
    NextRound,
    OnResume,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEntry {
    pub id: i64,
    pub subject: String,
    pub msg_id: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

/// Which tasks to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub owner: Option<Owner>,
    pub states: Vec<TaskState>,
    pub platform: Option<String>,
    pub stream: Option<String>,
    /// Only tasks created before this one (the paging cursor).
    pub before: Option<TaskId>,
    pub limit: i64,
}

/// A message to publish once the transaction that decided it commits.
#[derive(Debug, Clone)]
pub struct OutboxMessage {
    pub subject: String,
    pub msg_id: String,
    pub payload: Bytes,
    /// Written to the outbox table and published with an ack. Task events are not: they are
    /// published once, best effort (watchers also read the task row), which keeps them off the
    /// database and out of JetStream's acknowledgement path.
    pub durable: bool,
    /// The W3C `traceparent` to publish it with: a child of the trace that caused it.
    pub trace: Option<String>,
}

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

    // Creating and reading.

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

    /// How many tasks of `owner` have not ended.
    pub async fn active_tasks_of(&self, owner: &Owner) -> Result<i64, Error> {
        Ok(sqlx::query_scalar(concat!(
            "SELECT count(*) FROM tasks WHERE owner = $1 AND state IN (",
            active_states!(),
            ")"
        ))
        .bind(owner.as_str())
        .fetch_one(&self.pool)
        .await?)
    }

    pub async fn get_task(&self, id: TaskId) -> Result<TaskRow, Error> {
        let sql = concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1");
        sqlx::query_as::<_, TaskRow>(sql)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| Error::TaskNotFound(id.to_string()))
    }

    /// Finds the one task whose id is `reference` or starts with it.
    /// With `visible_to`, only that owner's tasks are candidates, so a prefix reveals nothing
    /// of anyone else's tasks.
    pub async fn resolve_task(
        &self,
        reference: &hark_core::domain::TaskRef,
        visible_to: Option<&Owner>,
    ) -> Result<TaskRow, Error> {
        let prefix = match reference {
            hark_core::domain::TaskRef::Full(id) => return self.get_task(*id).await,
            hark_core::domain::TaskRef::Prefix(p) => p,
        };
        // The ids that start with the prefix are one range of the primary key.
        let bound = |fill: char| {
            let hex: String = prefix
                .chars()
                .chain(std::iter::repeat(fill))
                .take(32)
                .collect();
            Uuid::parse_str(&hex).map_err(|_| Error::TaskNotFound(prefix.clone()))
        };
        let (low, high) = (bound('0')?, bound('f')?);
        let sql = concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id BETWEEN $1 AND $2 AND ($3::text IS NULL OR owner = $3)
             ORDER BY id LIMIT 2"
        );
        let mut rows = sqlx::query_as::<_, TaskRow>(sql)
            .bind(low)
            .bind(high)
            .bind(visible_to.map(Owner::as_str))
            .fetch_all(&self.pool)
            .await?;
        match rows.len() {
            0 => Err(Error::TaskNotFound(prefix.clone())),
            1 => Ok(rows.remove(0)),
            count => Err(Error::AmbiguousTask {
                prefix: prefix.clone(),
                count,
            }),
        }
    }

    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRow>, Error> {
        let sql = concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks
             WHERE ($1::text IS NULL OR owner = $1)
               AND (cardinality($2::text[]) = 0 OR state = ANY($2))
               AND ($3::text IS NULL OR platform = $3)
               AND ($4::text IS NULL OR stream = $4)
               AND ($5::uuid IS NULL OR (created_at, id) < (SELECT created_at, id FROM tasks WHERE id = $5))
             ORDER BY created_at DESC, id DESC LIMIT $6"
        );
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        Ok(sqlx::query_as::<_, TaskRow>(sql)
            .bind(filter.owner.as_ref().map(Owner::as_str))
            .bind(states)
            .bind(filter.platform.as_deref())
            .bind(filter.stream.as_deref())
            .bind(filter.before.map(|t| t.as_uuid()))
            .bind(filter.limit.clamp(1, 500))
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn questions_of(&self, task: TaskId) -> Result<Vec<QuestionRow>, Error> {
        let sql = concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions WHERE task_id = $1 ORDER BY asked_at, id"
        );
        Ok(sqlx::query_as::<_, QuestionRow>(sql)
            .bind(task.as_uuid())
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn get_question(&self, id: QuestionId) -> Result<QuestionRow, Error> {
        let sql = concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions WHERE id = $1"
        );
        sqlx::query_as::<_, QuestionRow>(sql)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| Error::QuestionNotFound(id.to_string()))
    }

    pub async fn transitions_of(&self, task: TaskId) -> Result<Vec<TransitionRow>, Error> {
        Ok(sqlx::query_as::<_, TransitionRow>(
            "SELECT from_state, to_state, event, generation, actor, detail, at
             FROM transitions WHERE task_id = $1 ORDER BY id",
        )
        .bind(task.as_uuid())
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn rounds_of(&self, task: TaskId) -> Result<Vec<RoundRow>, Error> {
        Ok(sqlx::query_as::<_, RoundRow>(
            "SELECT round, messages FROM checkpoints WHERE task_id = $1 ORDER BY round",
        )
        .bind(task.as_uuid())
        .fetch_all(&self.pool)
        .await?)
    }

    // Worker operations.

    /// Takes a pending task for `worker`: the job's own task if its generation is still current
    /// and no task of a higher priority is pending; else that task of a higher priority, or a
    /// task this job is owed to (see [`Store::claim_best`]), so the claimed task may not be the
    /// job's. One statement decides the claim and returns what the worker
    /// needs: the checkpoint, the answer (or expiry notice) for its pending ask, and the
    /// instructions told meanwhile.
    pub async fn claim(
        &self,
        task: TaskId,
        job_generation: i64,
        worker: &str,
        lease: Duration,
    ) -> Result<Claimed, Error> {
        // The job's own task; when it is not the one to take, a task of a higher priority or
        // one this job is owed to; when that went meanwhile, the job's own task again.
        let mut attempts = 0;
        let row = loop {
            let own = self
                .decide(super::batch::ClaimRequest {
                    task,
                    generation: job_generation,
                    worker: worker.to_owned(),
                    lease,
                })
                .await?;
            if let Some(row) = own {
                break row;
            }
            if let Some(row) = self.claim_best(task, job_generation, worker, lease).await? {
                break row;
            }
            let current = self.get_task(task).await?;
            attempts += 1;
            if current.state == TaskState::Pending
                && current.generation == job_generation
                && attempts < 3
            {
                continue;
            }
            return Err(match current.state {
                TaskState::Cancelled => Error::Cancelled {
                    task: task.to_string(),
                },
                state => Error::StaleJob {
                    task: task.to_string(),
                    state,
                    current: current.generation,
                    job: job_generation,
                },
            });
        };
        self.routes.remember(row.task.id, row.task.chat());
        let rounds: Vec<RoundRow> = row
            .ctx_rounds
            .map(|j| j.0)
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .map(|r| RoundRow {
                round: r["round"].as_i64().unwrap_or(0) as i32,
                messages: Json(r["messages"].clone()),
            })
            .collect();
        let instructions = row
            .ctx_instructions
            .map(|j| j.0)
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| {
                Some(Instruction {
                    id: i["id"].as_str()?.parse().ok()?,
                    text: i["text"].as_str()?.to_owned(),
                    author: i["author"].as_str()?.to_owned(),
                })
            })
            .collect();
        let last_round = rounds.last().map_or(0, |r| r.round);
        let resume = row
            .ctx_question
            .map(|j| j.0)
            .filter(|q| q["round"].as_i64().unwrap_or(0) >= i64::from(last_round))
            .and_then(|q| resume_from_json(&q));
        Ok(Claimed {
            lease: Lease {
                task: row.task.id,
                generation: row.task.generation,
                worker_id: worker.to_owned(),
            },
            task: row.task,
            rounds,
            resume,
            instructions,
        })
    }

    /// Explains why a lease-guarded write did not match.
    pub(super) async fn refusal(&self, lease: &Lease) -> Error {
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

    /// The checkpointed rounds after `after`, for the worker that holds the task under `lease`.
    pub async fn rounds_after(&self, lease: &Lease, after: i32) -> Result<Vec<RoundRow>, Error> {
        let rows: Vec<(Option<i32>, Option<Json<serde_json::Value>>)> = sqlx::query_as(concat!(
            "SELECT c.round, c.messages
             FROM tasks t LEFT JOIN checkpoints c ON c.task_id = t.id AND c.round > $4
             WHERE t.id = $1 AND t.state = ",
            sql_state!(running),
            " AND t.generation = $2 AND t.worker_id = $3
             ORDER BY c.round"
        ))
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Err(self.refusal(lease).await);
        }
        Ok(rows
            .into_iter()
            .filter_map(|(round, messages)| {
                Some(RoundRow {
                    round: round?,
                    messages: messages?,
                })
            })
            .collect())
    }

    /// Renews the lease; returns the instructions not yet consumed.
    pub async fn heartbeat(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> Result<Vec<Instruction>, Error> {
        let renewed = sqlx::query(concat!(
            "UPDATE tasks SET lease_until = now() + $4 * interval '1 millisecond'
             WHERE id = $1 AND state = ",
            sql_state!(running),
            " AND generation = $2 AND worker_id = $3"
        ))
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(duration.as_millis() as i64)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if renewed == 0 {
            return Err(self.refusal(lease).await);
        }
        self.instructions_of(lease.task).await
    }

    /// Stores one round under the lease. Storing the same round again changes nothing. Returns
    /// whether a pause waits for the task: the round is its boundary.
    pub async fn checkpoint(
        &self,
        lease: &Lease,
        round: i32,
        messages: &serde_json::Value,
        consumed_instructions: &[Uuid],
    ) -> Result<bool, Error> {
        let (held, pause): (bool, bool) = sqlx::query_as(
            "WITH t AS (
                UPDATE tasks SET rounds = greatest(rounds, $4), updated_at = now()
                WHERE id = $1 AND state = $7 AND generation = $2 AND worker_id = $3
                RETURNING id, pause_requested
            ), c AS (
                INSERT INTO checkpoints (task_id, round, messages) SELECT id, $4, $5 FROM t
                ON CONFLICT DO NOTHING
            ), i AS (
                UPDATE instructions SET consumed_round = $4
                WHERE task_id = $1 AND id = ANY($6) AND consumed_round IS NULL AND EXISTS (SELECT 1 FROM t)
            )
            SELECT EXISTS (SELECT 1 FROM t), coalesce((SELECT pause_requested FROM t), false)",
        )
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(round)
        .bind(Json(messages))
        .bind(consumed_instructions)
        .bind(TaskState::Running.as_str())
        .fetch_one(&self.pool)
        .await?;
        if held {
            Ok(pause)
        } else {
            Err(self.refusal(lease).await)
        }
    }

    /// Suspends the task on a question: running → waiting_input, the round that ends in the
    /// ask_user call, and the question row, all committed before the question is queued for the
    /// chat (through the outbox, in the same transaction).
    pub async fn ask(&self, lease: &Lease, input: &AskInput) -> Result<QuestionRow, Error> {
        // The statement checks the lease; only the (unchanging) chat is needed beforehand.
        let chat = self.chat_of(lease.task).await?;

        let question_id = QuestionId::new();
        // A handle is unique among the open questions of one owner in one stream; a collision
        // fails the statement on the unique index, and a new handle is drawn.
        for _ in 0..8 {
            let handle = Handle::random().to_string();
            let outbox = match &chat {
                Some(route) => self.effects.question(
                    route,
                    lease.task,
                    question_id,
                    &handle,
                    &input.question,
                    &input.context,
                    &input.choices,
                ),
                None => Vec::new(),
            };
            let asked = self
                .decide(super::batch::AskRequest {
                    lease: lease.clone(),
                    input: input.clone(),
                    question: question_id,
                    handle: handle.clone(),
                    outbox,
                })
                .await?;
            let row = match asked {
                super::batch::Asked::Won(row) => row,
                super::batch::Asked::Lost => return Err(self.refusal(lease).await),
                super::batch::Asked::HandleTaken => continue,
            };
            // The question as the statement created it.
            return Ok(QuestionRow {
                id: question_id,
                task_id: lease.task,
                handle,
                text: input.question.clone(),
                context: input.context.clone(),
                tool_call_id: input.tool_call_id.clone(),
                round: input.round,
                owner: row.task.owner.clone(),
                platform: row.task.platform.clone(),
                bot_id: row.task.bot_id.clone(),
                stream: row.task.stream.clone(),
                outcome: QuestionOutcome::Open,
                asked_at: row.task.updated_at,
                deadline: row.asked_deadline,
                reminded_at: None,
                closed_at: None,
                answerer: None,
                answer: None,
                inbound_message_id: None,
                chat_message_id: None,
                choices: (!input.choices.is_empty()).then(|| Json(input.choices.clone())),
            });
        }
        Err(Error::Busy("no free question handle after 8 tries".into()))
    }

    /// Applies an answer to an open question: the question becomes answered, the inbound message
    /// is recorded as applied, and the task goes from waiting_input to pending with its resume job
    /// queued, all in one statement.
    pub async fn answer(
        &self,
        question: QuestionId,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        self.apply_answer(Some(question), None, answer).await
    }

    /// Answers the open question of `task`, if it has one.
    pub async fn answer_task(&self, task: TaskId, answer: &Answer) -> Result<AnswerOutcome, Error> {
        self.apply_answer(None, Some(task), answer).await
    }

    /// Applies an answer to `question`, or to the open question of `task`.
    async fn apply_answer(
        &self,
        question: Option<QuestionId>,
        task: Option<TaskId>,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        if question.is_none() && task.is_none() {
            return Err(Error::QuestionNotFound(String::new()));
        }
        let found = self
            .decide(super::batch::AnswerLookup {
                question,
                task: task.filter(|_| question.is_none()),
                inbound_key: answer.inbound_key.clone(),
            })
            .await?;
        let Some(target) = found else {
            return Err(match (question, task) {
                (Some(q), _) => Error::QuestionNotFound(q.to_string()),
                (None, t) => Error::NoOpenQuestion {
                    task: t.map(|t| t.to_string()).unwrap_or_default(),
                },
            });
        };
        self.answer_target(target, answer).await
    }

    /// Applies an answer to the question of `target`, starting from the task's state and
    /// generation as `target` read them (a compare-and-set: a task that moved since is refused).
    /// `target.applied` must say whether `answer`'s inbound message was applied before.
    pub async fn answer_target(
        &self,
        target: AnswerTarget,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        let AnswerTarget {
            question: mut question_row,
            task_state: state,
            task_generation: generation,
            applied,
            task_questionnaire,
            form_last_round,
        } = target;
        let question = question_row.id;
        if applied {
            return Ok(AnswerOutcome::Duplicate {
                question: Box::new(question_row),
            });
        }
        let task_id = question_row.task_id;
        if !question_row.outcome.is_open() {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        }
        // A question with choices takes one of them, by number or by text, as that choice.
        let picked;
        let answer = match question_row.choices() {
            [] => answer,
            choices => match hark_core::domain::form::pick(choices, &answer.text) {
                Some(choice) => {
                    picked = Answer {
                        text: choice.to_owned(),
                        ..answer.clone()
                    };
                    &picked
                }
                None => {
                    return Err(Error::NotAChoice {
                        handle: question_row.handle.clone(),
                        answer: hark_core::domain::ids::shown(&answer.text),
                        choices: choices.to_vec(),
                    });
                }
            },
        };
        let state: TaskState = state
            .parse()
            .map_err(|_| Error::TaskNotFound(task_id.to_string()))?;
        // The task moves only from the generation just read. A question is only ever closed
        // together with a move of its task, so when this move wins the question is still open.
        let Some(open) = question_row.open() else {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        };
        let now = OffsetDateTime::now_utc();
        let lifecycle = decide::Task {
            state: match state {
                TaskState::WaitingInput => decide::State::WaitingInput { question: open },
                TaskState::Paused => decide::State::Paused {
                    since: now,
                    question: Some(open),
                },
                TaskState::Pending => decide::State::Pending,
                TaskState::Running => decide::State::Running {
                    pause_requested: false,
                },
                TaskState::Completed => decide::State::Completed,
                TaskState::Failed => decide::State::Failed,
                TaskState::Cancelled => decide::State::Cancelled,
            },
            on_timeout: TimeoutPolicy::Resume,
            attempt: 1,
        };
        let decision = decide::decide(&lifecycle, &Command::Answer, now, self.policy)
            .map_err(|r| Error::refused(task_id, r))?;
        if let Some(Json(questions)) = task_questionnaire.filter(|_| self.form_steps)
            && !questions.is_empty()
            && decision.to == TaskState::Pending
        {
            let last = form_last_round.map(|Json(round)| round);
            return self
                .answer_form(question_row, generation, answer, &questions, last)
                .await;
        }
        let won = self
            .decide(super::batch::AnswerRequest {
                task: task_id,
                generation,
                question,
                answer: answer.clone(),
                from: decision.from,
                to: decision.to,
                job: decision
                    .run()
                    .map(|reason| self.effects.run(task_id, generation + 1, reason)),
            })
            .await?;
        let Some(task) = won else {
            return self.answer_lost(question, answer).await;
        };
        // The statement changed exactly these fields of the question read above.
        question_row.answered_with(answer, task.updated_at);
        Ok(AnswerOutcome::Applied {
            task: Box::new(task),
            question: Box::new(question_row),
            asked: None,
        })
    }

    /// What an answer whose compare-and-set lost is told: another writer won — the same
    /// message applied concurrently, or a cancel or an expiry. Says which.
    pub(super) async fn answer_lost(
        &self,
        question: QuestionId,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        let now = self.get_question(question).await?;
        if let Some(key) = &answer.inbound_key
            && self.was_applied(key).await?
        {
            return Ok(AnswerOutcome::Duplicate {
                question: Box::new(now),
            });
        }
        Err(Error::QuestionClosed {
            id: question.to_string(),
            outcome: now.outcome,
        })
    }

    /// The instructions of a task not yet consumed by a checkpoint, oldest first.
    pub async fn instructions_of(&self, task: TaskId) -> Result<Vec<Instruction>, Error> {
        Ok(sqlx::query_as::<_, Instruction>(
            "SELECT id, text, author FROM instructions WHERE task_id = $1 AND consumed_round IS NULL
             ORDER BY created_at, id",
        )
        .bind(task.as_uuid())
        .fetch_all(&self.pool)
        .await?)
    }

    async fn was_applied(&self, key: &str) -> Result<bool, Error> {
        Ok(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM applied_inbound WHERE key = $1)")
                .bind(key)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The task as it is now and what `command` does to it: the row, with its open question
    /// when its state carries one.
    pub(super) async fn decide_now(
        &self,
        task: TaskId,
        command: &Command<'_>,
    ) -> Result<(TaskRow, Decision), Error> {
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
        let decision = decide::decide(&lifecycle, command, OffsetDateTime::now_utc(), self.policy)
            .map_err(|r| Error::refused(task, r))?;
        Ok((row, decision))
    }

    /// Applies `decision`, taken on `row`, as one compare-and-set that also writes the messages
    /// its effects imply. `None` when another writer moved the task first.
    pub(super) async fn apply(
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

    /// Decides `command` and applies it, deciding again when another writer moved the task
    /// first: a cancel, a pause or a resume must win eventually.
    async fn command(
        &self,
        task: TaskId,
        command: Command<'_>,
        actor: &str,
        detail: &str,
    ) -> Result<TaskRow, Error> {
        for _ in 0..16 {
            let (row, decision) = self.decide_now(task, &command).await?;
            if let Some(row) = self.apply(&row, decision, actor, detail, None).await? {
                return Ok(row);
            }
        }
        Err(Error::Busy(format!(
            "task {task}: `{}` kept losing races",
            command.event(TimeoutPolicy::Resume)
        )))
    }

    /// Cancels a task that has not ended; its open question is closed as cancelled and the chat
    /// is told, in one statement.
    pub async fn cancel(&self, task: TaskId, actor: &str, reason: &str) -> Result<TaskRow, Error> {
        self.command(task, Command::Cancel { reason }, actor, reason)
            .await
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

    /// Decides a lease-guarded `command` of the worker holding `lease` and applies it.
    async fn leased(
        &self,
        lease: &Lease,
        command: Command<'_>,
        detail: &str,
    ) -> Result<TaskRow, Error> {
        let row = self.get_task(lease.task).await?;
        if row.state != TaskState::Running
            || row.generation != lease.generation
            || row.worker_id.as_deref() != Some(lease.worker_id.as_str())
        {
            return Err(self.refusal(lease).await);
        }
        let lifecycle = row
            .lifecycle(None)
            .ok_or_else(|| Error::Internal(format!("task {} has no lifecycle", lease.task)))?;
        let decision = decide::decide(&lifecycle, &command, OffsetDateTime::now_utc(), self.policy)
            .map_err(|r| Error::refused(lease.task, r))?;
        match self
            .apply(
                &row,
                decision,
                &lease.worker_id,
                detail,
                Some(&lease.worker_id),
            )
            .await?
        {
            Some(row) => Ok(row),
            // A pause requested meanwhile changes what a hand-back does: decide again.
            None if matches!(command, Command::Release) => {
                let now = self.get_task(lease.task).await?;
                if now.state == TaskState::Running && now.generation == lease.generation {
                    return Box::pin(self.leased(lease, command, detail)).await;
                }
                Err(self.refusal(lease).await)
            }
            None => Err(self.refusal(lease).await),
        }
    }

    /// Ends a running task with its final answer, sent to its chat.
    pub async fn complete(
        &self,
        lease: &Lease,
        final_round: Option<(i32, &serde_json::Value)>,
        result: &str,
    ) -> Result<TaskRow, Error> {
        let chat = self.chat_of(lease.task).await?;
        let outbox = chat
            .map(|route| self.effects.completed(&route, lease.task, result))
            .unwrap_or_default();
        let won = self
            .decide(super::batch::CompleteRequest {
                lease: lease.clone(),
                round: final_round.map(|(n, m)| (n, m.clone())),
                result: result.to_owned(),
                outbox,
            })
            .await?;
        match won {
            Some(row) => Ok(row.task),
            None => Err(self.refusal(lease).await),
        }
    }

    /// Ends a running task as failed, telling its chat why.
    pub async fn fail(&self, lease: &Lease, error: &str) -> Result<TaskRow, Error> {
        self.leased(lease, Command::Fail { error }, error).await
    }

    /// Hands a running task back from a worker that stops at a round boundary: it is queued
    /// again at once to continue from its last checkpoint, and its attempts are not counted up;
    /// or, when a pause was asked of it, it pauses.
    pub async fn release(&self, lease: &Lease, reason: &str) -> Result<TaskRow, Error> {
        self.leased(lease, Command::Release, reason).await
    }

    /// Queues a progress message to the task's chat, if the lease still holds. With an
    /// idempotency key, sending again under the same key changes nothing.
    pub async fn send(&self, lease: &Lease, text: &str, key: Option<&str>) -> Result<bool, Error> {
        let Some(route) = self.chat_of(lease.task).await? else {
            return Ok(false);
        };
        let messages = self.effects.chat(&route, text, None, None);
        let (subjects, msg_ids, payloads, traces) = columns(messages.clone());
        let (held, queued): (bool, bool) = sqlx::query_as(concat!(
            "WITH t AS (
                SELECT id FROM tasks WHERE id = $1 AND state = ",
            sql_state!(running),
            " AND generation = $2 AND worker_id = $3
            ), fresh AS (
                INSERT INTO applied_inbound (key, task_id)
                SELECT 'send:' || $7, id FROM t WHERE $7::text IS NOT NULL
                ON CONFLICT DO NOTHING
                RETURNING 1
            ), o AS (
                INSERT INTO outbox (subject, msg_id, payload, traceparent)
                SELECT s, m, p, tp FROM unnest($4::text[], $5::text[], $6::bytea[], $8::text[])
                    AS x(s, m, p, tp)
                WHERE EXISTS (SELECT 1 FROM t) AND ($7::text IS NULL OR EXISTS (SELECT 1 FROM fresh))
                RETURNING 1
            )
            SELECT EXISTS (SELECT 1 FROM t), EXISTS (SELECT 1 FROM o)"
        ))
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(subjects)
        .bind(msg_ids)
        .bind(payloads)
        .bind(key)
        .bind(traces)
        .fetch_one(&self.pool)
        .await?;
        if !held {
            return Err(self.refusal(lease).await);
        }
        if queued {
            self.published(messages);
        }
        Ok(true)
    }

    /// The chat of a task. A task's chat never changes, so it is remembered.
    pub(super) async fn chat_of(&self, task: TaskId) -> Result<Option<ChatRoute>, Error> {
        if let Some(route) = self.routes.get(task) {
            return Ok(route);
        }
        let route = self.get_task(task).await?.chat();
        self.routes.remember(task, route.clone());
        Ok(route)
    }

    /// Records an instruction for a task that has not ended.
    pub async fn tell(
        &self,
        task: TaskId,
        text: &str,
        author: &str,
    ) -> Result<(Uuid, TellDelivery), Error> {
        let id = Uuid::now_v7();
        let state: Option<String> = sqlx::query_scalar(
            concat!(
                "WITH t AS (SELECT id, state FROM tasks WHERE id = $1 AND state IN (",
                active_states!(),
                "))
                 , i AS (INSERT INTO instructions (id, task_id, text, author) SELECT $2, id, $3, $4 FROM t)
                 SELECT state FROM t"
            ),
        )
        .bind(task.as_uuid())
        .bind(id)
        .bind(text)
        .bind(author)
        .fetch_optional(&self.pool)
        .await?;
        match state.as_deref() {
            Some("running") => Ok((id, TellDelivery::NextRound)),
            Some(_) => Ok((id, TellDelivery::OnResume)),
            None => {
                let current = self.get_task(task).await?;
                Err(Error::WrongState {
                    task: task.to_string(),
                    state: current.state,
                    event: Event::Claim,
                })
            }
        }
    }

    // The outbox.

    /// The oldest unrelayed messages. Rows taken by another relay are skipped.
    pub async fn outbox_batch(&self, limit: i64) -> Result<Vec<OutboxEntry>, Error> {
        Ok(sqlx::query_as::<_, OutboxEntry>(
            "SELECT id, subject, msg_id, payload, traceparent FROM outbox ORDER BY id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
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
    let mut set = format!(
        "updated_at = now(), pause_requested = {}",
        s.bind(decision.pause_requested)
    );
    // A decision that does not move the task (a pause requested of a running one) leaves its
    // generation, and so its worker's lease, as they are.
    if decision.moves() {
        set += &format!(
            concat!(
                ", state = {}, generation = generation + 1, ",
                run_ms_update!()
            ),
            s.bind(to.as_str())
        );
        // Claims, the only move into `running`, are decided in batches (see `batch`).
        debug_assert_ne!(to, TaskState::Running, "claims do not go through cas");
        set += ", worker_id = NULL, lease_until = NULL, running_since = NULL";
        set += if to == TaskState::Paused {
            ", paused_at = now()"
        } else {
            ", paused_at = NULL"
        };
        set += if to.is_terminal() {
            ", finished_at = now()"
        } else {
            ", finished_at = NULL"
        };
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
        "WITH t AS (UPDATE tasks SET {set} WHERE {guard} RETURNING {columns})
         , audit AS (
            INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)
            SELECT id, {from}, state, {event}, generation, {actor}, {detail} FROM t)",
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
                    UPDATE questions SET deadline = deadline + {} * interval '1 millisecond'
                    WHERE task_id = {id} AND outcome = {open} AND deadline IS NOT NULL
                      AND EXISTS (SELECT 1 FROM t))",
                s.bind(i64::try_from(by.as_millis()).unwrap_or(i64::MAX)),
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

/// The resume of a claimed task from the last question, as the claim statement returns it.
fn resume_from_json(question: &serde_json::Value) -> Option<Resume> {
    let id: QuestionId = question["id"].as_str()?.parse().ok()?;
    let tool_call_id = question["tool_call_id"].as_str()?.to_owned();
    let (expired, text) = match question["outcome"].as_str()? {
        "answered" => (
            false,
            question["answer"].as_str().unwrap_or_default().to_owned(),
        ),
        "expired" => {
            let waited = Duration::from_millis(
                u64::try_from(question["waited_ms"].as_i64().unwrap_or(0)).unwrap_or(0),
            );
            (true, render::expiry_notice(waited))
        }
        _ => return None,
    };
    Some(Resume {
        question_id: id,
        tool_call_id,
        expired,
        text,
    })
}

/// A question an answer may go to, read together with its task's state and generation (what
/// the answer's compare-and-set starts from) and with whether the answer's inbound message was
/// applied before.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AnswerTarget {
    #[sqlx(flatten)]
    pub question: QuestionRow,
    task_state: String,
    task_generation: i64,
    applied: bool,
    /// The questions of a questionnaire, and its last round as `{round, messages}`.
    task_questionnaire: Option<Json<Vec<FormQuestion>>>,
    form_last_round: Option<Json<serde_json::Value>>,
}

/// Which questions to list.
#[derive(Debug, Clone, Default)]
pub struct QuestionFilter {
    pub owner: Option<Owner>,
    pub platform: Option<String>,
    pub stream: Option<String>,
    pub include_closed: bool,
    /// Only questions asked after this one (the paging cursor).
    pub after: Option<QuestionId>,
    pub limit: i64,
}

impl Store {
    /// The open questions a sender may answer in one stream, oldest first, each as the target of
    /// an answer that came in the inbound message `inbound_key`. With a known platform the owner
    /// must be `platform:user_id` exactly; with an unknown (empty) one, the owner's `:user_id`
    /// suffix is compared.
    pub async fn open_questions_for_sender(
        &self,
        platform: &str,
        stream: &str,
        user_id: &str,
        inbound_key: Option<&str>,
    ) -> Result<Vec<AnswerTarget>, Error> {
        // The open questions the filter picks, each with its task and the inbound message's
        // applied flag; `$1` to `$4` are the platform, stream, owner (or user id) and key.
        macro_rules! targets {
            ($filter:literal) => {
                concat!(
                    "SELECT q.*, ",
                    answer_target_columns!(),
                    ",
                            EXISTS (SELECT 1 FROM applied_inbound WHERE key = $4) AS applied
                     FROM (SELECT ",
                    question_columns!(),
                    " FROM questions WHERE outcome = 'open' AND stream = $2 AND ",
                    $filter,
                    ") q
                     JOIN tasks t ON t.id = q.task_id
                     ORDER BY q.asked_at, q.id"
                )
            };
        }
        let (sql, owner) = if platform.is_empty() {
            (
                targets!("$1 = '' AND split_part(owner, ':', 2) = $3"),
                user_id.to_owned(),
            )
        } else {
            let Ok(owner) = Owner::new(platform, user_id) else {
                return Ok(Vec::new());
            };
            (
                targets!("platform = $1 AND owner = $3"),
                owner.as_str().to_owned(),
            )
        };
        Ok(sqlx::query_as::<_, AnswerTarget>(sql)
            .bind(platform)
            .bind(stream)
            .bind(owner)
            .bind(inbound_key)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The question carried by a chat message in a stream, whatever its outcome: any delivered
    /// copy of it.
    pub async fn question_by_chat_message(
        &self,
        platform: &str,
        stream: &str,
        message_id: &str,
    ) -> Result<Option<QuestionRow>, Error> {
        Ok(sqlx::query_as::<_, QuestionRow>(concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions
             WHERE id = (SELECT question_id FROM question_messages
                         WHERE platform = $1 AND stream = $2 AND message_id = $3)"
        ))
        .bind(platform)
        .bind(stream)
        .bind(message_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The latest question in a stream with this handle, whatever its outcome.
    pub async fn question_by_handle(
        &self,
        platform: &str,
        stream: &str,
        handle: &str,
    ) -> Result<Option<QuestionRow>, Error> {
        Ok(sqlx::query_as::<_, QuestionRow>(concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions
             WHERE ($1 = '' OR platform = $1) AND stream = $2 AND handle = $3
             ORDER BY asked_at DESC LIMIT 1"
        ))
        .bind(platform)
        .bind(stream)
        .bind(handle)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Records the platform message id of a chat message that carried a question, so that quote
    /// replies to it are routed to the question. Every delivered copy is kept; the question
    /// shows the first.
    pub async fn set_chat_message_id(
        &self,
        question: QuestionId,
        message_id: &str,
    ) -> Result<bool, Error> {
        Ok(sqlx::query(
            "WITH q AS (
                UPDATE questions SET chat_message_id = coalesce(chat_message_id, $2)
                WHERE id = $1 RETURNING id, platform, stream
            )
            INSERT INTO question_messages (platform, stream, message_id, question_id)
            SELECT platform, stream, $2, id FROM q
            WHERE platform IS NOT NULL AND stream IS NOT NULL
            ON CONFLICT DO NOTHING",
        )
        .bind(question.as_uuid())
        .bind(message_id)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
    }

    /// Records that an inbound message was handled; `false` when it had been before.
    pub async fn mark_inbound(&self, key: &str, task: Option<TaskId>) -> Result<bool, Error> {
        Ok(sqlx::query(
            "INSERT INTO applied_inbound (key, task_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(key)
        .bind(task.map(|t| t.as_uuid()))
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
    }

    pub async fn list_questions(&self, filter: &QuestionFilter) -> Result<Vec<QuestionRow>, Error> {
        Ok(sqlx::query_as::<_, QuestionRow>(concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions
             WHERE ($1::text IS NULL OR owner = $1)
               AND ($2::text IS NULL OR platform = $2)
               AND ($3::text IS NULL OR stream = $3)
               AND ($4 OR outcome = 'open')
               AND ($5::uuid IS NULL OR id > $5)
             ORDER BY id LIMIT $6"
        ))
        .bind(filter.owner.as_ref().map(Owner::as_str))
        .bind(filter.platform.as_deref())
        .bind(filter.stream.as_deref())
        .bind(filter.include_closed)
        .bind(filter.after.map(|q| q.as_uuid()))
        .bind(filter.limit.clamp(1, 500))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The open question of a task, if it waits for one.
    pub async fn open_question_of(&self, task: TaskId) -> Result<Option<QuestionRow>, Error> {
        Ok(sqlx::query_as::<_, QuestionRow>(concat!(
            "SELECT ",
            question_columns!(),
            " FROM questions WHERE task_id = $1 AND outcome = 'open' ORDER BY asked_at DESC LIMIT 1"
        ))
        .bind(task.as_uuid())
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Forgets outbox messages, named by subject and dedup id, once JetStream acknowledged them.
    pub async fn outbox_forget(&self, published: &[(String, String)]) -> Result<(), Error> {
        if published.is_empty() {
            return Ok(());
        }
        let (subjects, msg_ids): (Vec<&str>, Vec<&str>) = published
            .iter()
            .map(|(s, m)| (s.as_str(), m.as_str()))
            .unzip();
        sqlx::query(
            "DELETE FROM outbox o USING unnest($1::text[], $2::text[]) AS d(s, m)
             WHERE o.msg_id = d.m AND o.subject = d.s",
        )
        .bind(subjects)
        .bind(msg_ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Relays up to `limit` outbox messages older than `min_age` to JetStream and deletes those the stream
    /// acknowledged. Rows another relay holds are skipped. Returns how many were relayed.
    pub async fn relay_outbox(
        &self,
        js: &async_nats::jetstream::Context,
        limit: i64,
        min_age: Duration,
    ) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let batch = sqlx::query_as::<_, OutboxEntry>(
            "SELECT id, subject, msg_id, payload, traceparent FROM outbox
             WHERE created_at <= now() - $2 * interval '1 millisecond'
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .bind(min_age.as_millis() as i64)
        .fetch_all(&mut *tx)
        .await?;
        if batch.is_empty() {
            return Ok(0);
        }
        let mut pending = Vec::with_capacity(batch.len());
        for entry in &batch {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(hark_core::bus::MSG_ID_HEADER, entry.msg_id.as_str());
            if let Some(trace) = &entry.traceparent {
                headers.insert(hark_core::trace::HEADER, trace.as_str());
            }
            match js
                .publish_with_headers(entry.subject.clone(), headers, entry.payload.clone().into())
                .await
            {
                Ok(ack) => pending.push((entry.id, ack)),
                Err(e) => {
                    tracing::warn!(subject = entry.subject, error = %e, "cannot publish outbox message; will retry");
                    break;
                }
            }
        }
        let mut done = Vec::with_capacity(pending.len());
        for (id, ack) in pending {
            match ack.await {
                Ok(_) => done.push(id),
                Err(e) => tracing::warn!(error = %e, "outbox message not acknowledged; will retry"),
            }
        }
        sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
            .bind(&done)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.len())
    }
}
