//! What the worker holding a task does under its lease: claim it, renew the lease, checkpoint
//! rounds, ask, send progress, and end or hand back the run.

use std::time::Duration;

use hark_core::domain::{
    Handle, Need, Owner, QuestionId, QuestionOutcome, StreamId, TaskId, TaskState, decide,
    shape::Shape,
};
use sqlx::types::Json;
use uuid::Uuid;

use super::{
    CasRow, ChatRoute, Error, Instruction, Lease, QuestionRow, RoundRow, Store, TaskRow,
    batch::Move, columns,
};
use crate::render;

/// The state of a task a worker holds, bound as a parameter in the statements that find it by
/// its lease. Spelt in the statement, it lets the planner read an index of active tasks instead
/// of the primary key, which reads every running task when the statistics say none runs.
const HELD: &str = TaskState::Running.as_str();

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
    /// The `traceparent` of the span that asked, when it was traced.
    pub asked_trace: Option<String>,
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
    /// What the question accepts.
    pub shape: Shape,
    /// The subtask whose end answers it, instead of a person.
    pub waits_for: Option<TaskId>,
    /// Whom it is asked of next while it stays unanswered.
    pub escalation: Escalation,
    /// The people it is put to at once, instead of the task's owner ("platform:user_id", or a
    /// bare user id on the platform of the task's chat), and how many of them must answer.
    pub ask_to: Vec<String>,
    pub need: Need,
}

/// The people `named` under `key`, each as `platform:user_id` on `platform` (the task's
/// chat's), once each in the order given; or why one cannot be asked there.
pub fn people_on(
    platform: Option<&str>,
    named: &[String],
    key: &str,
) -> Result<Vec<String>, Error> {
    let Some(platform) = platform else {
        return Err(Error::Invalid(format!(
            "{key}: this task has no chat, so nobody else can be asked in one; ask without {key}"
        )));
    };
    let mut people: Vec<String> = Vec::with_capacity(named.len());
    for named in named {
        let named = named.trim();
        let owner: Owner = if named.contains(':') {
            named.parse()
        } else {
            format!("{platform}:{named}").parse()
        }
        .map_err(|e| Error::Invalid(format!("{key}: `{named}` is not a person: {e}")))?;
        if owner.platform() != platform {
            return Err(Error::Invalid(format!(
                "{key}: {owner} is not on {platform}, where this task's chat is"
            )));
        }
        if !people.iter().any(|p| p == owner.as_str()) {
            people.push(owner.as_str().to_owned());
        }
    }
    Ok(people)
}

/// The people an ask is put to at once, as the ask statement takes them: the first is asked by
/// the ask itself, the others right after (see [`Store::escalate_due`]).
#[derive(Debug, Clone)]
pub(super) struct Audience {
    pub(super) first: Owner,
    /// Where the first is asked: the task's group, or their own private chat.
    pub(super) stream: String,
    pub(super) need: i16,
    pub(super) askees: i16,
}

impl Audience {
    /// Whom an ask put to the people `ask_to` at once (each on the platform of `chat`, the
    /// task's) goes to first, and where, with the escalation that asks the others right after;
    /// `None` when it names nobody. In a group, each is asked there; otherwise in their own
    /// private chat.
    pub(super) fn of(
        chat: Option<&ChatRoute>,
        ask_to: &[String],
        need: Need,
    ) -> Result<Option<(Audience, Escalation)>, Error> {
        if ask_to.is_empty() {
            return Ok(None);
        }
        let platform = chat.map(|c| c.platform.as_str());
        let people = people_on(platform, ask_to, "ask_to")?;
        let first: Owner = people[0]
            .parse()
            .map_err(|e| Error::Invalid(format!("ask_to: {e}")))?;
        let in_group = chat
            .and_then(|c| c.stream.parse::<StreamId>().ok())
            .filter(StreamId::is_group);
        let stream = match in_group {
            Some(group) => group.as_str().to_owned(),
            None => StreamId::private(first.user_id())
                .map_err(|e| Error::Invalid(format!("ask_to: {e}")))?
                .as_str()
                .to_owned(),
        };
        let audience = Audience {
            first,
            stream,
            need: need.of(people.len()),
            askees: i16::try_from(people.len()).unwrap_or(i16::MAX),
        };
        // The others are asked right after, as an escalation that does not wait.
        let others = Escalation {
            to: people[1..].to_vec(),
            after: Some(Duration::ZERO),
        };
        Ok(Some((audience, others)))
    }

    /// The route the first is asked on, in the task's chat `route`, and whom the question
    /// mentions there (the first, in a group).
    pub(super) fn route(&self, route: &ChatRoute) -> (ChatRoute, Vec<String>) {
        let route = ChatRoute {
            stream: self.stream.clone(),
            ..route.clone()
        };
        let mentions = if route.stream.starts_with("group:") {
            vec![self.first.user_id().to_owned()]
        } else {
            Vec::new()
        };
        (route, mentions)
    }

    /// `question`, as the ask statement created it, put to this audience.
    pub(super) fn asked(&self, question: &mut QuestionRow) {
        question.owner = self.first.clone();
        question.stream = Some(self.stream.clone());
        question.need = self.need;
        question.askees = self.askees;
        question.ask_group = (self.askees > 1).then(|| question.id.as_uuid());
    }
}

/// The question an ask created, as the statement that won it left `task`: `id`, by its
/// `handle`, with its `deadline`, asked of the task's owner or of `audience`.
pub(super) fn asked_question(
    task: &TaskRow,
    id: QuestionId,
    handle: &str,
    input: &AskInput,
    audience: Option<&Audience>,
    deadline: Option<time::OffsetDateTime>,
) -> QuestionRow {
    let mut question = QuestionRow::asked(
        task,
        crate::rows::Asked {
            id,
            handle,
            text: &input.question,
            context: &input.context,
            shape: &input.shape,
            deadline,
        },
        &input.tool_call_id,
        input.round,
        input.waits_for,
    );
    if let Some(audience) = audience {
        audience.asked(&mut question);
    }
    question
}

/// Whom an unanswered question is asked of next, one after another, and when.
#[derive(Debug, Clone, Default)]
pub struct Escalation {
    /// People as `platform:user_id`, or a bare user id on the platform of the task's chat.
    pub to: Vec<String>,
    /// Unanswered this long after it was asked, it goes to the first of `to`, and as long again
    /// to each next one. `None`: at its first reminder, `task.remind_before` ahead of its
    /// deadline (without a deadline, `task.remind_before` after it was asked).
    pub after: Option<Duration>,
}

impl Escalation {
    /// `after` as the ask statements take it, in milliseconds.
    pub(super) fn after_ms(&self) -> Option<i64> {
        self.after
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The people as the `escalate_to` column keeps them; `None` when nobody is named.
    pub(super) fn column(&self) -> Option<Json<&[String]>> {
        (!self.to.is_empty()).then_some(Json(self.to.as_slice()))
    }

    /// The people named, each as `platform:user_id` on `platform` (the task's chat's), or
    /// why one cannot be asked there.
    fn resolved(mut self, platform: Option<&str>) -> Result<Self, Error> {
        if !self.to.is_empty() {
            self.to = people_on(platform, &self.to, "escalate_to")?;
        }
        Ok(self)
    }
}

/// The resume of a claimed task from the last question, as the claim statement returns it.
fn resume_from_json(question: &serde_json::Value) -> Option<Resume> {
    let id: QuestionId = question["id"].as_str()?.parse().ok()?;
    let tool_call_id = question["tool_call_id"].as_str()?.to_owned();
    let (expired, text) = match question["outcome"].as_str()?.parse().ok()? {
        QuestionOutcome::Answered => (
            false,
            question["answer"].as_str().unwrap_or_default().to_owned(),
        ),
        QuestionOutcome::Expired => {
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
        asked_trace: question["traceparent"].as_str().map(str::to_owned),
    })
}

/// Where an ask leads, decided for the running task with and without a pause waiting for it:
/// the ask statement takes the one the row's pause request calls for.
#[derive(Debug, Clone)]
pub struct AskDecided {
    /// No pause waits: the task waits on the question.
    pub waits: decide::Decision,
    /// A pause waits: the task pauses with the question open.
    pub pauses: decide::Decision,
}

/// An [`AskDecided`] as the ask statement binds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct AskMoves {
    pub(super) waits: Move,
    pub(super) pauses: Move,
    /// How long after it is asked the question expires, in milliseconds; `None`: never.
    pub(super) expires_ms: Option<i64>,
    /// What a question the task still has open is closed as (an ask decided without it fails
    /// the statement on the column's constraint).
    pub(super) closes: Option<&'static str>,
}

impl AskMoves {
    fn of(decided: &AskDecided) -> Self {
        debug_assert_eq!(
            decided.waits.question_expires_after(),
            decided.pauses.question_expires_after()
        );
        Self {
            waits: Move::of(&decided.waits),
            pauses: Move::of(&decided.pauses),
            expires_ms: decided.waits.question_expires_after().map(millis),
            closes: decided.waits.closes().map(QuestionOutcome::as_str),
        }
    }
}

/// A wait as the statements bind it.
pub(super) fn millis(wait: Duration) -> i64 {
    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)
}

/// Which task a claim for a run job takes (see [`Store::claim_task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The job's own task.
    Own,
    /// A task of a higher priority, or one the job is owed to.
    Instead,
}

impl Store {
    /// Claims a task for `worker` under the lease `decided` grants, moving it as `decided`, for
    /// the run job of `task` at `generation`: with [`Take::Own`] that task, when it is still pending at
    /// that generation and no task of a higher priority is pending; with [`Take::Instead`] the
    /// task the job stands for when its own is not the one to take (see [`Store::claim_best`]).
    /// One statement decides the claim and returns what the worker needs: the checkpoint, the
    /// answer (or expiry notice) for its pending ask, and the instructions told meanwhile.
    /// `None` when there is no such task.
    pub async fn claim_task(
        &self,
        take: Take,
        (task, generation): (TaskId, i64),
        worker: &str,
        decided: &decide::Decision,
    ) -> Result<Option<Claimed>, Error> {
        let lease = super::granted(decided)?;
        let row = match take {
            Take::Own => {
                self.decide(super::batch::ClaimRequest {
                    task,
                    generation,
                    worker: worker.to_owned(),
                    lease,
                    decided: Move::of(decided),
                    yields: decided.guarded(decide::Guard::Priority),
                })
                .await?
            }
            Take::Instead => {
                self.claim_best(task, generation, worker, lease, Move::of(decided))
                    .await?
            }
        };
        Ok(row.map(|row| self.claimed(row, worker)))
    }

    /// What a worker needs of a task its claim won, from the claim statement's row.
    pub(super) fn claimed(&self, row: CasRow, worker: &str) -> Claimed {
        self.routes.remember(row.task.id, row.task.fixed());
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
        let pending_ask = row
            .ctx_question
            .map(|j| j.0)
            .filter(|q| q["round"].as_i64().unwrap_or(0) >= i64::from(last_round));
        let resume = pending_ask.as_ref().and_then(resume_from_json);
        if let (Some(resume), Some(q)) = (&resume, &pending_ask)
            && !resume.expired
            && let Some(ms) = q["since_closed_ms"].as_u64()
        {
            self.metrics().resumed(Duration::from_millis(ms));
        }
        Claimed {
            lease: Lease {
                task: row.task.id,
                generation: row.task.generation,
                worker_id: worker.to_owned(),
            },
            task: row.task,
            rounds,
            resume,
            instructions,
        }
    }

    /// The checkpointed rounds after `after`, for the worker that holds the task under `lease`.
    pub async fn rounds_after(&self, lease: &Lease, after: i32) -> Result<Vec<RoundRow>, Error> {
        let rows: Vec<(Option<i32>, Option<Json<serde_json::Value>>)> = sqlx::query_as(
            "SELECT c.round, c.messages
             FROM tasks t LEFT JOIN checkpoints c ON c.task_id = t.id AND c.round > $4
             WHERE t.id = $1 AND t.state = $5 AND t.generation = $2 AND t.worker_id = $3
             ORDER BY c.round",
        )
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(after)
        .bind(HELD)
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

    /// The task `lease` holds, while it holds it; refused as any request of a lease no longer
    /// held is.
    pub async fn held(&self, lease: &Lease) -> Result<TaskRow, Error> {
        let held = sqlx::query_as::<_, TaskRow>(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = $1 AND state = $4 AND generation = $2 AND worker_id = $3"
        ))
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(HELD)
        .fetch_optional(&self.pool)
        .await?;
        match held {
            Some(task) => Ok(task),
            None => Err(self.refusal(lease).await),
        }
    }

    /// The tasks of the owner of the task `lease` holds, newest first, in `states` (all when
    /// empty); refused as any request of a lease no longer held is.
    pub async fn owner_tasks(
        &self,
        lease: &Lease,
        states: &[TaskState],
        limit: i64,
    ) -> Result<Vec<TaskRow>, Error> {
        let held = self.held(lease).await?;
        self.list_tasks(&super::TaskFilter {
            owner: Some(held.owner),
            states: states.to_vec(),
            limit,
            ..Default::default()
        })
        .await
    }

    /// Renews the lease; returns the instructions not yet consumed.
    pub async fn heartbeat(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> Result<Vec<Instruction>, Error> {
        let renewed = sqlx::query(
            "UPDATE tasks SET lease_until = now() + $4 * interval '1 millisecond'
             WHERE id = $1 AND state = $5 AND generation = $2 AND worker_id = $3",
        )
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(duration.as_millis() as i64)
        .bind(HELD)
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

    /// Suspends the task on a question as `decided`: running → waiting_input (or paused), the
    /// round that ends in the ask_user call, and the question row, all committed before the
    /// question is queued for the chat (through the outbox, in the same transaction).
    pub async fn suspend(
        &self,
        lease: &Lease,
        input: &AskInput,
        decided: &AskDecided,
    ) -> Result<QuestionRow, Error> {
        // The statement checks the lease; only the (unchanging) chat is needed beforehand.
        let chat = self.chat_of(lease.task).await?;
        let platform = chat.as_ref().map(|c| c.platform.as_str());
        let mut input = std::borrow::Cow::Borrowed(input);
        if !input.escalation.to.is_empty() {
            let escalation = input.escalation.clone().resolved(platform)?;
            input.to_mut().escalation = escalation;
        }
        let audience = match Audience::of(chat.as_ref(), &input.ask_to, input.need)? {
            None => None,
            Some((audience, others)) => {
                input.to_mut().escalation = others;
                Some(audience)
            }
        };
        let input = input.as_ref();

        let question_id = QuestionId::new();
        // A handle is unique among the open questions of one owner in one stream; a collision
        // fails the statement on the unique index, and a new handle is drawn.
        for _ in 0..8 {
            let handle = Handle::random().to_string();
            // A question for a subtask is not for the chat.
            let outbox = if input.waits_for.is_some() {
                Vec::new()
            } else {
                self.asking(
                    chat.as_ref(),
                    audience.as_ref(),
                    lease.task,
                    question_id,
                    &handle,
                    (&input.question, &input.context, &input.shape),
                )
            };
            let asked = self
                .decide(super::batch::AskRequest {
                    lease: lease.clone(),
                    input: input.clone(),
                    question: question_id,
                    handle: handle.clone(),
                    outbox,
                    trace: hark_core::trace::outgoing(),
                    audience: audience.clone(),
                    decided: AskMoves::of(decided),
                })
                .await?;
            let row = match asked {
                super::batch::Asked::Won(row) => row,
                super::batch::Asked::Lost => return Err(self.refusal(lease).await),
                super::batch::Asked::HandleTaken => continue,
            };
            let question = asked_question(
                &row.task,
                question_id,
                &handle,
                input,
                audience.as_ref(),
                row.asked_deadline,
            );
            if audience.is_some() {
                // The others are asked now, not at the next tick.
                self.wake_timers();
            }
            self.remember_asked(super::answers::AnswerTarget::asked(
                &question,
                &row.task,
                (input.round, &input.messages),
            ));
            return Ok(question);
        }
        Err(Error::Busy("no free question handle after 8 tries".into()))
    }

    /// The chat messages that ask `question` of task `task`, by its `handle`, as its `text`,
    /// `context` and `shape`: in `chat`, the task's; when it is put to others than the owner
    /// (`audience`), in the group with a mention, or in private in their own chat. None
    /// without a chat.
    pub(super) fn asking(
        &self,
        chat: Option<&ChatRoute>,
        audience: Option<&Audience>,
        task: TaskId,
        question: QuestionId,
        handle: &str,
        (text, context, shape): (&str, &str, &Shape),
    ) -> Vec<super::OutboxMessage> {
        match (chat, audience) {
            (Some(route), Some(audience)) => {
                let (route, mentions) = audience.route(route);
                self.effects.question_mentioning(
                    &route, task, question, handle, text, context, shape, &mentions,
                )
            }
            (Some(route), None) => self
                .effects
                .question(route, task, question, handle, text, context, shape),
            (None, _) => Vec::new(),
        }
    }

    /// Ends the running task held under `lease` with its final answer, sent to its chat, as
    /// `finish` decided.
    pub async fn finish(
        &self,
        lease: &Lease,
        final_round: Option<(i32, &serde_json::Value)>,
        result: &str,
        finish: &decide::Decision,
    ) -> Result<TaskRow, Error> {
        let fixed = self.fixed_of(lease.task).await?;
        let decided = Move::of(finish);
        let told = fixed.end_told_in();
        let outbox = self
            .effects
            .of(lease.task, lease.generation + 1, told, None, finish);
        let won = self
            .decide(super::batch::CompleteRequest {
                lease: lease.clone(),
                round: final_round.map(|(n, m)| (n, m.clone())),
                result: result.to_owned(),
                outbox,
                decided,
            })
            .await?;
        match won {
            Some(row) => {
                tracing::info!(task = %lease.task, "task completed");
                Ok(row.task)
            }
            None => Err(self.refusal(lease).await),
        }
    }

    /// Queues a progress message to the task's chat, if the lease still holds. With an
    /// idempotency key, sending again under the same key changes nothing.
    pub async fn send(&self, lease: &Lease, text: &str, key: Option<&str>) -> Result<bool, Error> {
        let Some(route) = self.chat_of(lease.task).await? else {
            return Ok(false);
        };
        let messages = self.effects.chat(&route, text, None, None);
        let (subjects, msg_ids, payloads, traces) = columns(messages.clone());
        let (held, queued): (bool, bool) = sqlx::query_as(
            "WITH t AS (
                SELECT id FROM tasks WHERE id = $1 AND state = $9 AND generation = $2 AND worker_id = $3
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
            SELECT EXISTS (SELECT 1 FROM t), EXISTS (SELECT 1 FROM o)",
        )
        .bind(lease.task.as_uuid())
        .bind(lease.generation)
        .bind(&lease.worker_id)
        .bind(subjects)
        .bind(msg_ids)
        .bind(payloads)
        .bind(key)
        .bind(traces)
        .bind(HELD)
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
}
