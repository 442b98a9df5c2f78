//! Answers: finding the question an answer is for, and applying it in one compare-and-set.

use hark_core::domain::{
    Event, Owner, QuestionId, QuestionOutcome, TaskId, TaskState,
    decide::{self, Command},
    form::{FormQuestion, progress},
    shape::Shape,
};
use hark_proto::v1 as pb;
use sqlx::types::Json;
use time::OffsetDateTime;

use super::{Answer, Error, QuestionRow, Store, TaskRow, batch::Move};
use crate::rows::Sibling;

/// Workers waiting for a job, to whom an answer hands its task's claim in its own statement
/// (see [`Store::with_idle_workers`]). The store only takes one and gives it back or hands it
/// the claim; how a worker waits and is handed a claim is the caller's.
pub trait IdleWorkers: Send + Sync + std::fmt::Debug {
    /// The worker that has waited longest, taken; `None` when none waits.
    fn take(&self) -> Option<Box<dyn IdleWorker>>;
}

/// A worker taken from [`IdleWorkers`], to be given back or handed a claim.
pub trait IdleWorker: Send {
    /// The worker's id, which the claim names.
    fn worker(&self) -> &str;
    /// Nothing was claimed for it: it waits again, first.
    fn put_back(self: Box<Self>);
    /// Its claim of a task committed: `job` is the run job the claim stands for (never
    /// published), `trace` the context the run continues.
    fn hand(self: Box<Self>, claimed: super::Claimed, job: pb::RunJob, trace: Option<String>);
}

/// Where answers hand claims (see [`Store::with_idle_workers`]).
#[derive(Debug, Clone)]
pub(super) struct Handoffs {
    pub(super) idle: std::sync::Arc<dyn IdleWorkers>,
    /// The lease a claim grants (`task.lease`).
    pub(super) lease: std::time::Duration,
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
    /// The answer is kept, and its ask, put to several people, waits for more: `have` of the
    /// `need` answers are in.
    Counted {
        task: Box<TaskRow>,
        question: Box<QuestionRow>,
        have: usize,
        need: usize,
    },
}

/// Every answer to an ask put to several people, as `(by, text)` in the order they came:
/// the answers `before`, then `answer`.
fn authored<'a>(before: &[&'a Sibling], answer: &'a Answer) -> Vec<(&'a str, &'a str)> {
    before
        .iter()
        .map(|s| {
            (
                s.answerer.as_deref().unwrap_or(&s.owner),
                s.answer.as_deref().unwrap_or_default(),
            )
        })
        .chain([(answer.answerer.as_str(), answer.text.as_str())])
        .collect()
}

/// What the model reads of an ask put to several people: every answer with its author, in the
/// order they came (`answer` the last). For an approval, the decision they make together: a
/// denial, or an approval (for the rest of the task when every approver said so) with the first
/// arguments an approver changed.
fn together(shape: &Shape, before: &[&Sibling], answer: &Answer, denied: bool) -> String {
    let all = authored(before, answer);
    let answers: Vec<serde_json::Value> = all
        .iter()
        .map(|(by, text)| serde_json::json!({"by": by, "answer": shape.value_of(text)}))
        .collect();
    if !matches!(shape, Shape::Approval { .. }) {
        return serde_json::json!({ "answers": answers }).to_string();
    }
    let mut decision = if denied {
        shape.value_of(&answer.text)
    } else {
        let values: Vec<serde_json::Value> = all.iter().map(|(_, t)| shape.value_of(t)).collect();
        let for_task = values.iter().all(|v| v["decision"] == "approve_for_task");
        let mut approved = serde_json::json!({
            "decision": if for_task { "approve_for_task" } else { "approve" }
        });
        if let Some(arguments) = values.iter().find_map(|v| v.get("arguments")) {
            approved["arguments"] = arguments.clone();
        }
        approved
    };
    decision["answers"] = serde_json::Value::Array(answers);
    decision.to_string()
}

/// A question an answer may go to, read together with its task as the lifecycle decides on it
/// and its generation (what the answer's compare-and-set starts from) and with whether the
/// answer's inbound message was applied before.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AnswerTarget {
    #[sqlx(flatten)]
    pub question: QuestionRow,
    #[sqlx(flatten)]
    task: crate::rows::Lifecycle,
    task_generation: i64,
    applied: bool,
    /// The questions of a questionnaire, and its last round as `{round, messages}`.
    task_questionnaire: Option<Json<Vec<FormQuestion>>>,
    form_last_round: Option<Json<serde_json::Value>>,
    /// The other open questions of the same ask, put to other people: the answer closes them.
    siblings: Option<Json<Vec<crate::rows::Sibling>>>,
}

impl AnswerTarget {
    /// A question just asked, as an answer starts from it while its task stays at the
    /// generation the ask left it at: `task` is the task's row after the ask, `last_round` the
    /// round the ask stored. Only for a question of a task without a chat that waits for no
    /// subtask: nothing changes such a question but a move of its task (a chat's question is
    /// also reminded and given its message's id), so the answer's compare-and-set on the
    /// generation is all the check it needs. Whether the answer's inbound message was applied
    /// before is left to that statement (it refuses one that was).
    pub(super) fn asked(
        question: &QuestionRow,
        task: &TaskRow,
        last_round: (i32, &serde_json::Value),
    ) -> Option<Self> {
        // A question's chat is its task's.
        if question.stream.is_some() || question.waits_for.is_some() {
            return None;
        }
        let form_last_round = task
            .questionnaire
            .as_ref()
            .map(|_| Json(serde_json::json!({"round": last_round.0, "messages": last_round.1})));
        Some(Self {
            question: question.clone(),
            task: task.lifecycle_columns(),
            task_generation: task.generation,
            applied: false,
            task_questionnaire: task.questionnaire.clone(),
            form_last_round,
            siblings: None,
        })
    }
}

/// An open question waiting for a subtask that has ended: (question, subtask, its state,
/// result, error).
type SubtaskEnded = (
    uuid::Uuid,
    uuid::Uuid,
    String,
    Option<String>,
    Option<String>,
);

/// Who answers a question that waits for `subtask`: the subtask itself.
pub fn subtask_answerer(subtask: uuid::Uuid) -> String {
    format!("task:{subtask}")
}

impl Store {
    /// Answers the open questions that wait for a subtask which has ended, with how it ended:
    /// `{"task": id, "state": …, "result": …}` (or `"error"`). Each answer carries an inbound
    /// key of its question, so one applied twice (by two replicas, or again after a crash)
    /// changes nothing. Returns how many were answered.
    pub async fn settle_subtasks(&self, limit: i64) -> Result<usize, Error> {
        let due: Vec<SubtaskEnded> = sqlx::query_as(concat!(
            "SELECT q.id, t.id, t.state, t.result, t.error
                 FROM questions q JOIN tasks t ON t.id = q.waits_for
                 WHERE q.outcome = ",
            sql_outcome!(open),
            " AND q.waits_for IS NOT NULL
                   AND t.state IN (",
            ended_states!(),
            ")
                 LIMIT $1",
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut answered = 0;
        for (question, subtask, state, result, error) in due {
            let mut text = serde_json::json!({"task": subtask.to_string(), "state": state});
            if let Some(result) = result {
                text["result"] = serde_json::json!(result);
            }
            if let Some(error) = error {
                text["error"] = serde_json::json!(error);
            }
            let answer = Answer {
                answerer: subtask_answerer(subtask),
                text: text.to_string(),
                json: None,
                inbound_key: Some(format!("subtask:{question}")),
            };
            match self.answer(QuestionId::from_uuid(question), &answer).await {
                Ok(AnswerOutcome::Applied { .. }) => answered += 1,
                Ok(_) => {}
                // Closed meanwhile (the parent was cancelled, say): nothing waits any more.
                Err(
                    Error::QuestionClosed { .. } | Error::WrongState { .. } | Error::Already { .. },
                ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(answered)
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
        // A question this process asked starts the answer without a read. Only an applied
        // answer counts: anything else (the task moved since, the message was applied before,
        // the answer does not fit) is decided again from a read, as if nothing were remembered.
        if let Some(remembered) = self.take_remembered(question, task) {
            // Once: a task that moved since is decided from a read below.
            let outcome = self.answer_target_once(remembered, answer).await;
            if let Ok(applied @ AnswerOutcome::Applied { .. }) = outcome {
                self.count_answered(&applied);
                self.metrics().answer_start(crate::metrics::REMEMBERED);
                return Ok(applied);
            }
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
        let outcome = self.answer_target(target, answer).await;
        if let Ok(AnswerOutcome::Applied { .. }) = &outcome {
            self.metrics().answer_start(crate::metrics::READ);
        }
        outcome
    }

    /// Remembers a question just asked (see [`AnswerTarget::asked`]) as its task's open one.
    pub(super) fn remember_asked(&self, target: Option<AnswerTarget>) {
        if let Some(target) = target {
            self.asked_of
                .remember(target.question.id, target.question.task_id);
            self.asked.remember(target.question.task_id, target);
        }
    }

    /// The question remembered as `question`, or as the open question of `task`, forgotten as
    /// it is taken: an answer starts from it once (the step the answer takes may remember the
    /// task's next question).
    fn take_remembered(
        &self,
        question: Option<QuestionId>,
        task: Option<TaskId>,
    ) -> Option<AnswerTarget> {
        let task = match question {
            Some(question) => self.asked_of.get(question)?,
            None => task?,
        };
        let target = self
            .asked
            .get(task)
            .filter(|target| question.is_none_or(|q| target.question.id == q))?;
        self.asked.forget(task);
        Some(target)
    }

    /// Applies an answer to the question of `target`, starting from the task's state and
    /// generation as `target` read them (a compare-and-set: a task that moved since is refused).
    /// `target.applied` must say whether `answer`'s inbound message was applied before.
    pub async fn answer_target(
        &self,
        mut target: AnswerTarget,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        // The task moved under the question, which stayed open to the same person (it was
        // escalated, say): the answer is decided again from a fresh read.
        let mut tries = 0;
        let outcome = loop {
            let question = target.question.id;
            match self.answer_target_once(target, answer).await {
                Err(Error::Raced(_)) if tries < 3 => {
                    tries += 1;
                    target = self
                        .decide(super::batch::AnswerLookup {
                            question: Some(question),
                            task: None,
                            inbound_key: answer.inbound_key.clone(),
                        })
                        .await?
                        .ok_or_else(|| Error::QuestionNotFound(question.to_string()))?;
                }
                Err(Error::Raced(_)) => {
                    return Err(Error::Busy(format!(
                        "question {question} kept changing while it was answered"
                    )));
                }
                outcome => break outcome?,
            }
        };
        self.count_answered(&outcome);
        Ok(outcome)
    }

    /// Counts an applied answer, with how long its question waited.
    fn count_answered(&self, outcome: &AnswerOutcome) {
        if let AnswerOutcome::Applied { task, question, .. } = outcome {
            let waited = task.updated_at - question.asked_at;
            self.metrics()
                .answered(waited.try_into().unwrap_or_default());
        }
    }

    async fn answer_target_once(
        &self,
        target: AnswerTarget,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        let AnswerTarget {
            question: mut question_row,
            task,
            task_generation: generation,
            applied,
            task_questionnaire,
            form_last_round,
            siblings,
        } = target;
        let siblings = siblings.map(|Json(s)| s).unwrap_or_default();
        let question = question_row.id;
        if applied {
            return Ok(AnswerOutcome::Duplicate {
                question: Box::new(question_row),
            });
        }
        let task_id = question_row.task_id;
        // Only the end of the subtask a question waits for answers it.
        if let Some(subtask) = question_row.waits_for
            && answer.answerer != subtask_answerer(subtask)
        {
            return Err(Error::WaitsForSubtask {
                handle: question_row.handle.clone(),
                subtask: subtask.to_string(),
            });
        }
        if !question_row.outcome.is_open() {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        }
        // A question of a shape takes an answer that fits it, kept as the agent reads it (a
        // questionnaire keeps a choice's text as it is); one that does not fit changes nothing.
        let shape = question_row.shape();
        let questionnaire = task_questionnaire.as_ref().is_some_and(|q| !q.0.is_empty());
        let read;
        let answer = match (&shape, &answer.json) {
            (hark_core::domain::shape::Shape::Text, None) => answer,
            (_, json) => {
                let value = match json {
                    Some(value) => shape.check(value),
                    None => shape.read(&answer.text),
                }
                .map_err(|misfit| Error::Misfit {
                    handle: question_row.handle.clone(),
                    answer: hark_core::domain::ids::shown(&match json {
                        Some(value) => value.to_string(),
                        None => answer.text.clone(),
                    }),
                    shape: Box::new(shape.clone()),
                    misfit,
                })?;
                let text = match value {
                    serde_json::Value::String(text) if shape.is_text() || questionnaire => text,
                    value if questionnaire => value.to_string(),
                    value => shape.for_model(&value),
                };
                read = Answer {
                    text,
                    json: None,
                    ..answer.clone()
                };
                &read
            }
        };
        // The task moves only from the generation just read. A question is only ever closed
        // together with a move of its task, so when this move wins the question is still open.
        let Some(lifecycle) = question_row.open().and_then(|open| task.task(Some(open))) else {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        };
        let now = OffsetDateTime::now_utc();
        // Of an ask put to several people: more answers may be needed, and the model reads them
        // all with their authors; one denial of an approval ends it.
        let answered_before: Vec<&Sibling> = siblings
            .iter()
            .filter(|s| s.outcome == QuestionOutcome::Answered)
            .collect();
        let denied = matches!(shape, Shape::Approval { .. })
            && shape.value_of(&answer.text)["decision"] == "deny";
        let have = answered_before.len() + 1;
        let need = usize::try_from(question_row.need).unwrap_or(1).max(1);
        if have < need && !denied {
            let decision = decide::decide(&lifecycle, &Command::Collect, now, self.policy)
                .map_err(|r| Error::refused(task_id, r))?;
            return self
                .collect(question_row, generation, answer, &decision, (have, need))
                .await;
        }
        // A questionnaire records every answer with its author, each as its output keeps it.
        let form_answers = (questionnaire && question_row.askees > 1)
            .then(|| progress::together(authored(&answered_before, answer), &shape));
        let model_answer = question_row.ask_group.map(|_| match &form_answers {
            Some(all) => serde_json::json!({ "answers": all }).to_string(),
            None if question_row.askees > 1 => together(&shape, &answered_before, answer, denied),
            None => answer.text.clone(),
        });
        let open_others: Vec<Sibling> = siblings
            .iter()
            .filter(|s| s.outcome.is_open())
            .cloned()
            .collect();
        let decision = decide::decide(&lifecycle, &Command::Answer, now, self.policy)
            .map_err(|r| Error::refused(task_id, r))?;
        if let Some(Json(questions)) = task_questionnaire.filter(|_| self.form_steps)
            && !questions.is_empty()
            && decision.to == TaskState::Pending
        {
            let last = form_last_round.map(|Json(round)| round);
            return self
                .answer_form(
                    question_row,
                    super::batch::Move::of(&decision),
                    generation,
                    answer,
                    (&questions, last),
                    &open_others,
                    form_answers,
                )
                .await;
        }
        // An answer that closes others' questions tells them, which only the plain statement does.
        if decision.to == TaskState::Pending
            && model_answer.is_none()
            && let Some(claimed) = self
                .answer_and_claim(&question_row, generation, answer, &decision)
                .await?
        {
            question_row.answered_with(answer, claimed.updated_at);
            return Ok(AnswerOutcome::Applied {
                task: claimed,
                question: Box::new(question_row),
                asked: None,
            });
        }
        let won = self
            .decide(super::batch::AnswerRequest {
                task: task_id,
                generation,
                question,
                answer: answer.clone(),
                from: decision.from,
                to: decision.to,
                outbox: decision
                    .run()
                    .map(|reason| self.effects.run(task_id, generation + 1, reason))
                    .into_iter()
                    .chain(
                        self.effects
                            .answered_elsewhere(&open_others, &answer.answerer),
                    )
                    .collect(),
                model_answer,
            })
            .await?;
        let Some(task) = won else {
            return self
                .answer_lost(question, &question_row.owner, answer)
                .await;
        };
        // The statement changed exactly these fields of the question read above.
        question_row.answered_with(answer, task.updated_at);
        Ok(AnswerOutcome::Applied {
            task: Box::new(task),
            question: Box::new(question_row),
            asked: None,
        })
    }

    /// Keeps one answer of an ask that needs more (`have` of `need` with this one): the
    /// question is answered, its task takes a new generation in its state (so two answers
    /// decided from the same read cannot both count as the last one missing), and the audit
    /// records it.
    async fn collect(
        &self,
        mut question: QuestionRow,
        generation: i64,
        answer: &Answer,
        decision: &decide::Decision,
        (have, need): (usize, usize),
    ) -> Result<AnswerOutcome, Error> {
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET generation = generation + 1, updated_at = now()
                WHERE id = $1 AND state = $7 AND generation = $2
                  AND NOT EXISTS (SELECT 1 FROM applied_inbound a WHERE a.key = $6)
                RETURNING ",
            task_columns!(),
            "
            ), answered AS (
                UPDATE questions q SET outcome = ", sql_outcome!(answered), ", closed_at = now(),
                                       answerer = $4, answer = $5, inbound_message_id = $6
                FROM t WHERE q.id = $3 AND q.outcome = ", sql_outcome!(open), "
            ), applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT $6, id, $3 FROM t WHERE $6::text IS NOT NULL
                ON CONFLICT DO NOTHING
            ), audit AS (
                INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)
                SELECT id, $7, $7, $8, generation, $4, $9 FROM t
            )
            SELECT * FROM t"
        );
        let task: Option<TaskRow> = sqlx::query_as(sql)
            .bind(question.task_id.as_uuid())
            .bind(generation)
            .bind(question.id.as_uuid())
            .bind(answer.answerer.as_str())
            .bind(answer.text.as_str())
            .bind(answer.inbound_key.as_deref())
            .bind(decision.from.as_str())
            .bind(decision.event.as_str())
            .bind(format!("#{}: {have} of {need}", question.handle))
            .fetch_optional(&self.pool)
            .await?;
        let Some(task) = task else {
            return self.answer_lost(question.id, &question.owner, answer).await;
        };
        hark_core::failpoint::hit("collect.after_commit");
        self.published(vec![self.effects.event(
            &task,
            decision.event.as_str(),
            None,
        )]);
        question.answered_with(answer, task.updated_at);
        Ok(AnswerOutcome::Counted {
            task: Box::new(task),
            question: Box::new(question),
            have,
            need,
        })
    }

    /// With a worker polling here, applies the answer and claims the task for that worker in one
    /// statement (`waiting_input → pending → running`, both moves in the audit, one commit), and
    /// sends the claim to be handed over. `None`, and nothing changed, when no worker polls, a
    /// task of a higher priority is pending (it goes first: the answer then queues its run as
    /// usual), or the task moved since it was read (the plain answer then says how).
    async fn answer_and_claim(
        &self,
        question: &QuestionRow,
        generation: i64,
        answer: &Answer,
        answered: &decide::Decision,
    ) -> Result<Option<Box<TaskRow>>, Error> {
        let Some(handoffs) = &self.handoffs else {
            return Ok(None);
        };
        let Some(waiter) = handoffs.idle.take() else {
            return Ok(None);
        };
        let task = question.task_id;
        let decided = self
            .decide_from(task, decide::State::Pending, &Command::Claim)
            .map(|claim| (Move::of(answered), Move::of(&claim)));
        let row = match decided {
            Ok((answer_move, claim_move)) => {
                self.answer_claim_statement(
                    question,
                    generation,
                    answer,
                    waiter.worker(),
                    handoffs.lease,
                    answer_move,
                    claim_move,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let row = match row {
            Ok(Some(row)) => row,
            other => {
                waiter.put_back();
                return other.map(|_| None);
            }
        };
        hark_core::failpoint::hit("answer_claim.after_commit");
        // The resume's latency (none: the answer's commit is the claim's) is recorded here.
        let claimed = self.claimed(row, waiter.worker());
        self.published(vec![self.effects.event(
            &claimed.task,
            Event::Claim.as_str(),
            None,
        )]);
        let task_row = Box::new(claimed.task.clone());
        let job = pb::RunJob {
            task_id: task.to_string(),
            generation: (generation + 1) as u64,
            reason: pb::RunReason::ResumeReply as i32,
            ..Default::default()
        };
        waiter.hand(claimed, job, hark_core::trace::outgoing());
        Ok(Some(task_row))
    }

    /// The statement of [`Store::answer_and_claim`]: the row the claim returns, or `None`.
    #[allow(clippy::too_many_arguments)]
    async fn answer_claim_statement(
        &self,
        question: &QuestionRow,
        generation: i64,
        answer: &Answer,
        worker: &str,
        lease: std::time::Duration,
        answered: Move,
        claimed: Move,
    ) -> Result<Option<super::CasRow>, Error> {
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET
                    state = $13,
                    generation = generation + 2,
                    updated_at = now(),
                    worker_id = $7,
                    lease_until = now() + $8 * interval '1 millisecond',
                    running_since = now(),
                    finished_at = NULL,
                    owed = false
                WHERE id = $1 AND state = $9 AND generation = $2
                  AND NOT EXISTS (SELECT 1 FROM applied_inbound a WHERE a.key = $6)
                  AND priority >= (SELECT coalesce(max(h.priority), -32768) FROM tasks h
                                   WHERE h.state = ",
            sql_state!(pending),
            ")
                RETURNING ",
            task_columns!(),
            "
            ), answered AS (
                UPDATE questions q SET outcome = ", sql_outcome!(answered), ", closed_at = now(), answerer = $4,
                                       answer = $5, inbound_message_id = $6
                FROM t WHERE q.id = $3 AND q.outcome = ", sql_outcome!(open), "
                RETURNING q.id, q.tool_call_id, q.round, q.traceparent
            ), applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT $6, id, $3 FROM t WHERE $6::text IS NOT NULL
                ON CONFLICT DO NOTHING
            ), audit AS (
                INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)
                SELECT id, $9, $10, $11, generation - 1, $4, '' FROM t
                UNION ALL SELECT id, $12, $13, $14, generation, $7, '' FROM t
            )
            SELECT t.*, NULL::timestamptz AS asked_deadline,
                (SELECT coalesce(json_agg(json_build_object('round', round, 'messages', messages) ORDER BY round), '[]')
                 FROM checkpoints WHERE task_id = t.id) AS ctx_rounds,
                (SELECT json_build_object('id', a.id, 'tool_call_id', a.tool_call_id, 'round', a.round,
                        'outcome', ", sql_outcome!(answered), ", 'answer', $5::text, 'since_closed_ms', 0,
                        'traceparent', a.traceparent)
                 FROM answered a) AS ctx_question,
                (SELECT coalesce(json_agg(json_build_object('id', id, 'text', text, 'author', author)
                                          ORDER BY created_at, id), '[]')
                 FROM instructions WHERE task_id = t.id AND consumed_round IS NULL) AS ctx_instructions
            FROM t"
        );
        Ok(sqlx::query_as(sql)
            .bind(question.task_id.as_uuid())
            .bind(generation)
            .bind(question.id.as_uuid())
            .bind(answer.answerer.as_str())
            .bind(answer.text.as_str())
            .bind(answer.inbound_key.as_deref())
            .bind(worker)
            .bind(lease.as_millis() as i64)
            .bind(answered.from)
            .bind(answered.to)
            .bind(answered.event)
            .bind(claimed.from)
            .bind(claimed.to)
            .bind(claimed.event)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// What an answer whose compare-and-set lost is told: another writer won — the same
    /// message applied concurrently, or a cancel or an expiry. Says which.
    /// `asked_of` is whom the question was asked of when the answer was decided.
    pub(super) async fn answer_lost(
        &self,
        question: QuestionId,
        asked_of: &Owner,
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
        // Passed on to someone else meanwhile: it waits for their answer.
        if now.outcome.is_open() && now.owner != *asked_of {
            return Err(Error::Moved {
                handle: now.handle,
                askee: now.owner.to_string(),
            });
        }
        // Still open to the same person: the task moved for another reason (the question was
        // escalated), so the answer is decided again.
        if now.outcome.is_open() {
            return Err(Error::Raced(question.to_string()));
        }
        Err(Error::QuestionClosed {
            id: question.to_string(),
            outcome: now.outcome,
        })
    }

    /// Whether the inbound message (or request) `key` was applied before.
    pub async fn was_applied(&self, key: &str) -> Result<bool, Error> {
        Ok(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM applied_inbound WHERE key = $1)")
                .bind(key)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
