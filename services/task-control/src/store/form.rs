//! A questionnaire's answer and its next step, in one statement. No model runs for a
//! questionnaire, so its next step after an answer — ask the next question, or complete with
//! every answer — needs no worker: the statement that records the answer also takes the step.
//! The audit keeps the lifecycle's moves, one row each: the answer (`waiting_input → pending`),
//! the claim by `task-control` (`pending → running`), and the ask (`running → waiting_input`) or
//! the finish (`running → completed`); the task row goes from the first state to the last in one
//! compare-and-set on its generation.

use hark_core::domain::{
    Event, Handle, QuestionId, QuestionOutcome, TaskState, form::FormQuestion, form::progress,
    transition,
};
use hark_proto::v1 as pb;
use sqlx::types::Json;

use super::{Answer, AnswerOutcome, Error, OutboxMessage, QuestionRow, Store, TaskRow, ops};
use crate::render;

/// What an answer to a questionnaire leads to.
enum Step<'a> {
    Ask(&'a FormQuestion),
    Finish(String),
}

/// The part both statements share: the answered question, the applied inbound id, the audit of
/// the answer and the claim, and the step's round. `$1` task, `$2` generation, `$3` round, `$4`
/// answered question, `$5` answerer, `$6` answer, `$7` inbound key, `$8` the round's messages;
/// `t` is the task row as it is after the move.
macro_rules! answered {
    () => {
        "answered AS (
            UPDATE questions q SET outcome = 'answered', closed_at = now(), answerer = $5,
                                   answer = $6, inbound_message_id = $7
            FROM t WHERE q.id = $4 AND q.outcome = 'open'
        ), applied AS (
            INSERT INTO applied_inbound (key, task_id, question_id)
            SELECT $7, id, $4 FROM t WHERE $7::text IS NOT NULL
            ON CONFLICT DO NOTHING
        ), checkpoint AS (
            INSERT INTO checkpoints (task_id, round, messages) SELECT id, $3, $8 FROM t
            ON CONFLICT DO NOTHING
        )"
    };
}

/// The audit of the three moves; the last is `$event` into `$to`, with `$detail`.
macro_rules! audit {
    ($to:literal, $event:literal, $detail:literal) => {
        concat!(
            "audit AS (
                INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)
                SELECT id, 'waiting_input', 'pending', 'answer', generation - 2, $5, '' FROM t
                UNION ALL SELECT id, 'pending', 'running', 'claim', generation - 1, 'task-control', '' FROM t
                UNION ALL SELECT id, 'running', ",
            $to,
            ", ",
            $event,
            ", generation, 'task-control', ",
            $detail,
            " FROM t
            )"
        )
    };
}

impl Store {
    /// Applies `answer` to `question` of a questionnaire waiting at `generation`, and takes the
    /// step it leads to in the same statement. `last` is the questionnaire's last round.
    pub(super) async fn answer_form(
        &self,
        mut question: QuestionRow,
        generation: i64,
        answer: &Answer,
        questions: &[FormQuestion],
        last: Option<serde_json::Value>,
    ) -> Result<AnswerOutcome, Error> {
        let task = question.task_id;
        let (number, mut answers) = match &last {
            None => (1, serde_json::Map::new()),
            Some(round) => (
                round["round"].as_i64().unwrap_or(0) as i32 + 1,
                progress::answers_in(&round["messages"]).map_err(|e| {
                    Error::Internal(format!("the last round of questionnaire {task}: {e}"))
                })?,
            ),
        };
        progress::record(&mut answers, &question.tool_call_id, false, &answer.text);
        let keys = questions.iter().map(|q| q.key.as_str());
        let step = match progress::next(keys.clone(), &answers)
            .and_then(|k| questions.iter().find(|q| q.key == k))
        {
            Some(next) => Step::Ask(next),
            None => Step::Finish(progress::output(keys, &answers)),
        };
        // The moves the statement takes, each as the lifecycle allows it.
        let last_event = match step {
            Step::Ask(_) => Event::Ask,
            Step::Finish(_) => Event::Finish,
        };
        for (from, event) in [
            (TaskState::Pending, Event::Claim),
            (TaskState::Running, last_event),
        ] {
            transition(from, event).map_err(|e| Error::wrong_state(task, e))?;
        }
        let asking = match step {
            Step::Ask(next) => Some(next.key.as_str()),
            Step::Finish(_) => None,
        };
        let messages = serde_json::Value::Array(progress::step(&answers, asking));
        let chat = self.chat_of(task).await?;
        let row = match &step {
            Step::Finish(output) => {
                let outbox = chat
                    .map(|route| {
                        self.chat_msgs(&route, &render::completed(task, output), None, None)
                    })
                    .unwrap_or_default();
                let row = self
                    .form_finish(
                        &question, generation, number, answer, &messages, output, outbox,
                    )
                    .await?;
                row.map(|row| (row, None))
            }
            Step::Ask(next) => {
                let mut asked = None;
                for _ in 0..8 {
                    match self
                        .form_ask(
                            &question,
                            generation,
                            number,
                            answer,
                            &messages,
                            next,
                            chat.as_ref(),
                        )
                        .await
                    {
                        Err(e) if super::batch::handle_taken(&e) => continue,
                        decided => {
                            asked = Some(decided?);
                            break;
                        }
                    }
                }
                let Some(won) = asked else {
                    return Err(Error::Busy("no free question handle after 8 tries".into()));
                };
                won.map(|(row, q)| (row, Some(q)))
            }
        };
        let Some((row, next)) = row else {
            return self.answer_lost(question.id, answer).await;
        };
        self.published(vec![self.event_msg(&row, last_event.as_str(), next)]);
        question.outcome = QuestionOutcome::Answered;
        question.closed_at = Some(row.updated_at);
        question.answerer = Some(answer.answerer.clone());
        question.answer = Some(answer.text.clone());
        question.inbound_message_id = answer.inbound_key.clone();
        Ok(AnswerOutcome::Applied {
            task: Box::new(row),
            question: Box::new(question),
        })
    }

    /// The answer and the next question, asked, in one statement; `None` when the task moved.
    #[allow(clippy::too_many_arguments)]
    async fn form_ask(
        &self,
        answered: &QuestionRow,
        generation: i64,
        number: i32,
        answer: &Answer,
        messages: &serde_json::Value,
        next: &FormQuestion,
        chat: Option<&super::ChatRoute>,
    ) -> Result<Option<(TaskRow, pb::Question)>, Error> {
        let task = answered.task_id;
        let id = QuestionId::new();
        let handle = Handle::random().to_string();
        let outbox: Vec<OutboxMessage> = chat
            .map(|route| {
                let text = render::with_choices(
                    render::question(task, &handle, &next.text, "", &self.context_label),
                    &next.choices,
                );
                self.chat_msgs(route, &text, Some(id), route.origin_message_id.as_deref())
            })
            .unwrap_or_default();
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET state = 'waiting_input', generation = generation + 3,
                    updated_at = now(), rounds = greatest(rounds, $3), finished_at = NULL
                WHERE id = $1 AND state = 'waiting_input' AND generation = $2
                RETURNING ",
            task_columns!(),
            "), ",
            answered!(),
            ", ",
            audit!("'waiting_input'", "'ask'", "$10"),
            ", asked AS (
                INSERT INTO questions (id, task_id, handle, text, context, tool_call_id, round, owner,
                                       platform, bot_id, stream, choices, deadline)
                SELECT $9, id, $11, $10, '', $12, $3, owner, platform, bot_id, stream, $13,
                       CASE WHEN on_timeout = 'never' THEN NULL
                            WHEN ask_timeout_s > 0 THEN now() + ask_timeout_s * interval '1 second'
                       END
                FROM t RETURNING deadline
            ), out AS (
                INSERT INTO outbox (subject, msg_id, payload, traceparent)
                SELECT o.s, o.m, o.p, o.tp FROM t,
                    unnest($14::text[], $15::text[], $16::bytea[], $17::text[]) AS o(s, m, p, tp)
            )
            SELECT t.*, (SELECT deadline FROM asked) AS asked_deadline FROM t"
        );
        let (subjects, msg_ids, payloads, traces) = ops::columns(outbox.clone());
        let row: Option<FormRow> = sqlx::query_as(sql)
            .bind(task.as_uuid())
            .bind(generation)
            .bind(number)
            .bind(answered.id.as_uuid())
            .bind(&answer.answerer)
            .bind(&answer.text)
            .bind(answer.inbound_key.as_deref())
            .bind(Json(messages))
            .bind(id.as_uuid())
            .bind(&next.text)
            .bind(&handle)
            .bind(progress::call_id(&next.key))
            .bind((!next.choices.is_empty()).then_some(Json(&next.choices)))
            .bind(subjects)
            .bind(msg_ids)
            .bind(payloads)
            .bind(traces)
            .fetch_optional(&self.pool)
            .await?;
        hark_core::failpoint::hit("form_answer.after_commit");
        let Some(FormRow {
            task: row,
            asked_deadline,
        }) = row
        else {
            return Ok(None);
        };
        self.published(outbox);
        let question = pb::Question {
            id: id.to_string(),
            task_id: task.to_string(),
            handle,
            text: next.text.clone(),
            owner: row.owner.to_string(),
            chat: row.chat().map(|c| crate::convert::route(&c)),
            outcome: pb::QuestionOutcome::Open as i32,
            asked_at: Some(crate::convert::timestamp(row.updated_at)),
            deadline: asked_deadline.map(crate::convert::timestamp),
            choices: next.choices.clone(),
            ..Default::default()
        };
        Ok(Some((row, question)))
    }

    /// The answer and the completion with `output`, in one statement; `None` when the task moved.
    #[allow(clippy::too_many_arguments)]
    async fn form_finish(
        &self,
        answered: &QuestionRow,
        generation: i64,
        number: i32,
        answer: &Answer,
        messages: &serde_json::Value,
        output: &str,
        outbox: Vec<OutboxMessage>,
    ) -> Result<Option<TaskRow>, Error> {
        let sql = concat!(
            "WITH t AS (
                UPDATE tasks SET state = 'completed', generation = generation + 3,
                    updated_at = now(), rounds = greatest(rounds, $3), result = $9,
                    finished_at = now()
                WHERE id = $1 AND state = 'waiting_input' AND generation = $2
                RETURNING ",
            task_columns!(),
            "), ",
            answered!(),
            ", ",
            audit!("'completed'", "'finish'", "''"),
            ", out AS (
                INSERT INTO outbox (subject, msg_id, payload, traceparent)
                SELECT o.s, o.m, o.p, o.tp FROM t,
                    unnest($10::text[], $11::text[], $12::bytea[], $13::text[]) AS o(s, m, p, tp)
            )
            SELECT * FROM t"
        );
        let (subjects, msg_ids, payloads, traces) = ops::columns(outbox.clone());
        let row: Option<TaskRow> = sqlx::query_as(sql)
            .bind(answered.task_id.as_uuid())
            .bind(generation)
            .bind(number)
            .bind(answered.id.as_uuid())
            .bind(&answer.answerer)
            .bind(&answer.text)
            .bind(answer.inbound_key.as_deref())
            .bind(Json(messages))
            .bind(output)
            .bind(subjects)
            .bind(msg_ids)
            .bind(payloads)
            .bind(traces)
            .fetch_optional(&self.pool)
            .await?;
        hark_core::failpoint::hit("form_answer.after_commit");
        if row.is_some() {
            self.published(outbox);
        }
        Ok(row)
    }
}

/// The row of an ask step: the task, and the new question's deadline.
#[derive(sqlx::FromRow)]
struct FormRow {
    #[sqlx(flatten)]
    task: TaskRow,
    asked_deadline: Option<time::OffsetDateTime>,
}
