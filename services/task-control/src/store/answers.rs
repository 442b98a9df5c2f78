//! Answers: finding the question an answer is for, and applying it in one compare-and-set.

use hark_core::domain::{Event, Owner, QuestionId, TaskId, TaskState, decide, form::FormQuestion};
use hark_proto::v1 as pb;
use sqlx::types::Json;

use super::{
    Answer, Error, QuestionRow, Store, TaskRow,
    batch::{Closing, Move},
};
use crate::rows::Sibling;

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

/// A question an answer may go to, read together with its task as the lifecycle decides on it
/// and its generation (what the answer's compare-and-set starts from) and with whether the
/// answer's inbound message was applied before.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AnswerTarget {
    #[sqlx(flatten)]
    pub question: QuestionRow,
    #[sqlx(flatten)]
    pub task: crate::rows::Lifecycle,
    #[sqlx(flatten)]
    pub chat: crate::rows::TaskChat,
    pub task_generation: i64,
    pub applied: bool,
    /// The questions of a questionnaire, and its last round as `{round, messages}`.
    pub task_questionnaire: Option<Json<Vec<FormQuestion>>>,
    pub form_last_round: Option<Json<serde_json::Value>>,
    /// The questions of the same ask, put to other people: the answer closes the open ones.
    pub siblings: Option<Json<Vec<crate::rows::Sibling>>>,
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
            chat: task.chat_columns(),
            task_generation: task.generation,
            applied: false,
            task_questionnaire: task.questionnaire.clone(),
            form_last_round,
            siblings: None,
        })
    }
}

/// An open question waiting for a subtask that has ended.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SubtaskEnded {
    #[sqlx(try_from = "uuid::Uuid")]
    pub question: QuestionId,
    #[sqlx(try_from = "uuid::Uuid")]
    pub subtask: TaskId,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    pub result: Option<String>,
    pub error: Option<String>,
}

/// Who answers a question that waits for `subtask`: the subtask itself.
pub fn subtask_answerer(subtask: uuid::Uuid) -> String {
    format!("task:{subtask}")
}

impl Store {
    /// Up to `limit` open questions that wait for a subtask which has ended, with how it ended.
    pub async fn ended_subtasks(&self, limit: i64) -> Result<Vec<SubtaskEnded>, Error> {
        Ok(sqlx::query_as(concat!(
            "SELECT q.id AS question, t.id AS subtask, t.state, t.result, t.error
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
        .await?)
    }

    /// The question an answer goes to: `question`, or the open question of `task`, read with
    /// its task as the answer decides on it and with whether `inbound_key` was applied before.
    pub async fn find_answer_target(
        &self,
        question: Option<QuestionId>,
        task: Option<TaskId>,
        inbound_key: Option<String>,
    ) -> Result<Option<AnswerTarget>, Error> {
        self.decide(super::batch::AnswerLookup {
            question,
            task: task.filter(|_| question.is_none()),
            inbound_key,
        })
        .await
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
    pub fn take_remembered(
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

    /// Counts an applied answer, with how long its question waited.
    pub fn count_answered(&self, outcome: &AnswerOutcome) {
        if let AnswerOutcome::Applied { task, question, .. } = outcome {
            let waited = task.updated_at - question.asked_at;
            self.metrics()
                .answered(waited.try_into().unwrap_or_default());
        }
    }

    /// Applies an answer that moves its task (decided as `decision`): the question is
    /// answered, the inbound message recorded as applied, the task moved from the generation
    /// `generation` with its run queued when it resumes, the other open questions of its ask
    /// (`open_others`) closed and their askees told. `model_answer` is what the model reads
    /// when the question was one of an ask put to several people. Says how it lost when the
    /// task moved since.
    pub async fn answer_moving(
        &self,
        mut question: QuestionRow,
        generation: i64,
        answer: &Answer,
        decision: &decide::Decision,
        open_others: &[Sibling],
        model_answer: Option<String>,
    ) -> Result<AnswerOutcome, Error> {
        let task_id = question.task_id;
        let won = self
            .decide(super::batch::AnswerRequest {
                task: task_id,
                generation,
                question: question.id,
                answer: answer.clone(),
                from: decision.from,
                to: decision.to,
                closing: Closing::of(decision)?,
                outbox: decision
                    .run()
                    .map(|reason| self.effects.run(task_id, generation + 1, reason))
                    .into_iter()
                    .chain(
                        self.effects
                            .answered_elsewhere(open_others, &answer.answerer),
                    )
                    .collect(),
                model_answer,
            })
            .await?;
        let Some(task) = won else {
            return self.answer_lost(question.id, &question.owner, answer).await;
        };
        // The statement changed exactly these fields of the question read above.
        question.answered_with(answer, task.updated_at);
        Ok(AnswerOutcome::Applied {
            task: Box::new(task),
            question: Box::new(question),
            asked: None,
        })
    }

    /// Keeps one answer of an ask that needs more (`have` of `need` with this one): the
    /// question is answered, its task takes a new generation in its state (so two answers
    /// decided from the same read cannot both count as the last one missing), and the audit
    /// records it.
    pub async fn collect(
        &self,
        mut question: QuestionRow,
        generation: i64,
        answer: &Answer,
        decision: &decide::Decision,
        (have, need): (usize, usize),
    ) -> Result<AnswerOutcome, Error> {
        let closing = Closing::of(decision)?;
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET ",
            set_moved!(stays),
            "
                WHERE id = $1 AND state = $7 AND generation = $2",
            not_applied_before!("$11::bool", "$6"),
            "
                RETURNING ",
            task_columns!(),
            "
            ), answered AS (
                UPDATE questions q SET outcome = $10, closed_at = now(),
                                       answerer = $4, answer = $5, inbound_message_id = $6
                FROM t WHERE q.id = $3 AND q.outcome = $12
            ), applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT $6, id, $3 FROM t WHERE $6::text IS NOT NULL
                ON CONFLICT DO NOTHING
            ), audit AS (
                ",
            audit_into!(),
            "
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
            .bind(closing.outcome)
            .bind(closing.once)
            .bind(super::OPEN)
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

    /// Applies the answer and claims its task for `worker` under the lease `chain` grants, in
    /// one statement (`waiting_input → pending → running` as `chain` decided, both moves in the
    /// audit, one commit). `None`, and nothing changed, when a task of a higher priority is
    /// pending (it goes first) or the task moved since it was read.
    pub async fn answer_and_claim(
        &self,
        question: &QuestionRow,
        generation: i64,
        answer: &Answer,
        worker: &str,
        chain: &decide::Chain,
    ) -> Result<Option<super::Claimed>, Error> {
        let lease = super::granted(&chain.claim)?;
        let Some(row) = self
            .answer_claim_statement(
                question,
                generation,
                answer,
                worker,
                lease,
                (Move::of(&chain.answer), Closing::of(&chain.answer)?),
                (
                    Move::of(&chain.claim),
                    chain.claim.guarded(decide::Guard::Priority),
                ),
            )
            .await?
        else {
            return Ok(None);
        };
        hark_core::failpoint::hit("answer_claim.after_commit");
        // The resume's latency (none: the answer's commit is the claim's) is recorded here.
        let claimed = self.claimed(row, worker);
        self.published(vec![self.effects.event(
            &claimed.task,
            Event::Claim.as_str(),
            None,
        )]);
        Ok(Some(claimed))
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
        (answered, closing): (Move, Closing),
        (claimed, yields): (Move, bool),
    ) -> Result<Option<super::CasRow>, Error> {
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET ",
            set_moved!("$13", 2, held("$7", "$8")),
            "
                WHERE id = $1 AND state = $9 AND generation = $2",
            not_applied_before!("$16::bool", "$6"),
            yields_to_priority!("$17::bool", "priority"),
            "
                RETURNING ",
            task_columns!(),
            "
            ), answered AS (
                UPDATE questions q SET outcome = $15, closed_at = now(), answerer = $4,
                                       answer = $5, inbound_message_id = $6
                FROM t WHERE q.id = $3 AND q.outcome = $18
                RETURNING q.id, q.tool_call_id, q.round, q.traceparent
            ), applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT $6, id, $3 FROM t WHERE $6::text IS NOT NULL
                ON CONFLICT DO NOTHING
            ), audit AS (
                ", audit_into!(), "
                SELECT id, $9, $10, $11, generation - 1, $4, '' FROM t
                UNION ALL SELECT id, $12, $13, $14, generation, $7, '' FROM t
            )
            SELECT t.*, NULL::timestamptz AS asked_deadline,
                (SELECT coalesce(json_agg(json_build_object('round', round, 'messages', messages) ORDER BY round), '[]')
                 FROM checkpoints WHERE task_id = t.id) AS ctx_rounds,
                (SELECT json_build_object('id', a.id, 'tool_call_id', a.tool_call_id, 'round', a.round,
                        'outcome', $15::text, 'answer', $5::text, 'since_closed_ms', 0,
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
            .bind(closing.outcome)
            .bind(closing.once)
            .bind(yields)
            .bind(super::OPEN)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// What an answer whose compare-and-set lost is told: another writer won — the same
    /// message applied concurrently, or a cancel or an expiry. Says which.
    /// `asked_of` is whom the question was asked of when the answer was decided.
    pub async fn answer_lost(
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
