//! A questionnaire's answer and its next step, in one statement. No model runs for a
//! questionnaire, so its next step after an answer — ask the next question, or complete with
//! every answer — needs no worker: the statement that records the answer also takes the step.
//! Its moves come decided as one `decide::Chain`, and the audit keeps them, one row each: the
//! answer (`waiting_input → pending`), the claim by `task-control` (`pending → running`), and the
//! ask (`running → waiting_input`) or the finish (`running → completed`); the task row goes from
//! the first state to the last in one compare-and-set on its generation.

use futures_util::future::BoxFuture;
use hark_core::domain::{
    Handle, QuestionId, decide, form::FormQuestion, form::progress, shape::Shape,
};
use sqlx::{PgConnection, types::Json};

use super::{
    Answer, AnswerOutcome, Error, OutboxMessage, QuestionRow, Store, TaskRow,
    batch::{
        AskedColumns, BatchQuery, Batched, Batches, Closing, Move, OutboxColumns, column, in_order,
    },
};

/// What an answer to a questionnaire leads to.
#[derive(Debug)]
pub enum Step<'a> {
    /// Its next question.
    Ask(&'a FormQuestion),
    /// Its completion with this output.
    Finish(String),
}

/// A questionnaire's step after an answer, as the answer's own statement takes it.
#[derive(Debug)]
pub struct FormStep<'a> {
    /// The round the step stores, with its messages (every answer so far).
    pub round: i32,
    pub messages: serde_json::Value,
    pub step: Step<'a>,
}

/// What both statements share, for each request `t` (the task row after its move, with the
/// request's columns `c_*`): the answered question, the applied inbound id, the step's round and
/// the audit of the three decided moves (`c_a*`: the answer, `c_c*`: the claim, `c_l*`: the ask
/// or finish; `*f`, `*t`, `*e`: from, to, event), the last with `$detail`. The questions close as
/// the answer's decision says (`c_outcome`, `c_others`); `$open` is the parameter that holds the
/// outcome of an open question (see `store::OPEN`).
macro_rules! answered_and_audit {
    ($detail:literal, $open:literal) => {
        concat!(
            "answered AS (
                UPDATE questions q SET outcome = t.c_outcome, closed_at = now(), answerer = t.c_answerer,
                                       answer = t.c_answer, inbound_message_id = t.c_inbound
                FROM t WHERE q.id = t.c_answered AND q.outcome = ",
            $open,
            "
            ), ", supersede_others!("c_answered", "c_others"), ", applied AS (
                INSERT INTO applied_inbound (key, task_id, question_id)
                SELECT c_inbound, id, c_answered FROM t WHERE c_inbound IS NOT NULL
                ON CONFLICT DO NOTHING
            ), checkpoint AS (
                INSERT INTO checkpoints (task_id, round, messages) SELECT id, c_round, c_messages FROM t
                ON CONFLICT DO NOTHING
            ), audit AS (
                ", audit_into!(), "
                SELECT id, c_af, c_at, c_ae, generation - 2, c_answerer, '' FROM t
                UNION ALL SELECT id, c_cf, c_ct, c_ce, generation - 1, 'task-control', '' FROM t
                UNION ALL SELECT id, c_lf, c_lt, c_le, generation, 'task-control', ",
            $detail,
            " FROM t
            )"
        )
    };
}

/// The moves a questionnaire's step takes, each decided by `decide`: the answer, the claim by
/// task-control, and the ask of the next question or the finish.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moves {
    pub(super) answer: Move,
    pub(super) claim: Move,
    pub(super) last: Move,
    /// How long after it is asked the question the last move opens expires, in milliseconds;
    /// `None`: never, or no question.
    pub(super) expires_ms: Option<i64>,
}

impl Moves {
    /// The moves of `chain`, which must take a step of task-control's own.
    fn of(chain: &decide::Chain) -> Result<Self, Error> {
        let then = chain.then.as_ref().ok_or_else(|| {
            Error::Internal("a questionnaire's step was decided without its ask or finish".into())
        })?;
        Ok(Self {
            answer: Move::of(&chain.answer),
            claim: Move::of(&chain.claim),
            last: Move::of(then),
            expires_ms: then.question_expires_after().map(super::worker::millis),
        })
    }

    /// Binds every request's moves as nine text arrays.
    fn bind<'q, T, R>(
        query: BatchQuery<'q, R>,
        batch: &'q [T],
        of: fn(&T) -> &Moves,
    ) -> BatchQuery<'q, R> {
        query
            .bind(column(batch, |r| of(r).answer.from))
            .bind(column(batch, |r| of(r).answer.to))
            .bind(column(batch, |r| of(r).answer.event))
            .bind(column(batch, |r| of(r).claim.from))
            .bind(column(batch, |r| of(r).claim.to))
            .bind(column(batch, |r| of(r).claim.event))
            .bind(column(batch, |r| of(r).last.from))
            .bind(column(batch, |r| of(r).last.to))
            .bind(column(batch, |r| of(r).last.event))
    }
}

/// An answer to a questionnaire and the round of the step it leads to.
#[derive(Debug)]
pub(super) struct Answered {
    moves: Moves,
    closing: Closing,
    task: hark_core::domain::TaskId,
    generation: i64,
    round: i32,
    question: QuestionId,
    answer: Answer,
    messages: serde_json::Value,
}

impl Answered {
    /// Binds every request's answer as the statement's first arguments, `$1` to `$8`.
    fn bind<'q, T, R>(
        query: BatchQuery<'q, R>,
        batch: &'q [T],
        of: fn(&T) -> &Answered,
    ) -> BatchQuery<'q, R> {
        query
            .bind(column(batch, |r| of(r).task.as_uuid()))
            .bind(column(batch, |r| of(r).generation))
            .bind(column(batch, |r| of(r).round))
            .bind(column(batch, |r| of(r).question.as_uuid()))
            .bind(column(batch, |r| of(r).answer.answerer.as_str()))
            .bind(column(batch, |r| of(r).answer.text.as_str()))
            .bind(column(batch, |r| of(r).answer.inbound_key.as_deref()))
            .bind(column(batch, |r| Json(&of(r).messages)))
    }
}

impl Store {
    /// Hands the outbox messages of every request that won to the relay.
    fn publish_won<T, W>(
        &self,
        batch: &[T],
        won: &[Option<W>],
        outbox: fn(&T) -> &Vec<OutboxMessage>,
    ) {
        let sent = batch
            .iter()
            .zip(won)
            .filter(|(_, row)| row.is_some())
            .flat_map(|(request, _)| outbox(request).iter().cloned())
            .collect();
        self.published(sent);
    }
}

/// An answer and the next question, to ask in the same statement.
#[derive(Debug)]
pub(super) struct FormAsk {
    answered: Answered,
    question: QuestionId,
    text: String,
    handle: String,
    call_id: String,
    shape: Shape,
    /// Whom it is asked of next while it stays unanswered, and when (see [`super::Escalation`]).
    escalation: super::Escalation,
    /// The people it is put to at once instead of the owner.
    audience: Option<super::worker::Audience>,
    outbox: Vec<OutboxMessage>,
}

/// An answer and the completion with `output`, in the same statement.
#[derive(Debug)]
pub(super) struct FormFinish {
    answered: Answered,
    output: String,
    outbox: Vec<OutboxMessage>,
}

/// How an ask step was decided.
#[derive(Debug)]
pub(super) enum FormAsked {
    /// The task waits on the new question, whose deadline this is.
    Won(Box<TaskRow>, Option<time::OffsetDateTime>),
    /// The task moved since it was read.
    Lost,
    /// Another open question of the owner in the stream has this handle; draw another.
    HandleTaken,
}

impl Batched for FormAsk {
    type Decision = FormAsked;

    fn decide<'a>(
        store: &'a Store,
        conn: &'a mut PgConnection,
        batch: &'a [Self],
    ) -> BoxFuture<'a, Result<Vec<Self::Decision>, Error>> {
        Box::pin(async move {
            match store.form_ask_statement(conn, batch).await {
                Err(e) if batch.len() == 1 && super::batch::handle_taken(&e) => {
                    Ok(vec![FormAsked::HandleTaken])
                }
                decided => decided,
            }
        })
    }

    fn queue(store: &Store) -> &Batches<Self> {
        &store.form_asks
    }
}

impl Batched for FormFinish {
    type Decision = Option<TaskRow>;

    fn decide<'a>(
        store: &'a Store,
        conn: &'a mut PgConnection,
        batch: &'a [Self],
    ) -> BoxFuture<'a, Result<Vec<Self::Decision>, Error>> {
        Box::pin(store.form_finish_statement(conn, batch))
    }

    fn queue(store: &Store) -> &Batches<Self> {
        &store.form_finishes
    }
}

/// One row of an ask step's statement: the task, its request's place, and the new deadline.
#[derive(sqlx::FromRow)]
struct FormRow {
    #[sqlx(flatten)]
    task: TaskRow,
    ord: i64,
    asked_deadline: Option<time::OffsetDateTime>,
}

/// One row of a finish step's statement.
#[derive(sqlx::FromRow)]
struct FinishRow {
    #[sqlx(flatten)]
    task: TaskRow,
    ord: i64,
}

impl Store {
    /// Applies `answer` to `question` of a questionnaire waiting at `generation`, and takes
    /// `step` in the same statement, moving the task as `chain` decided. `fixed` is what never
    /// changes of the task, as read with the question; `open_others` are the questions of the
    /// same ask asked of others, which the answer closes.
    #[allow(clippy::too_many_arguments)]
    pub async fn answer_form(
        &self,
        mut question: QuestionRow,
        fixed: &crate::rows::Fixed,
        chain: &decide::Chain,
        generation: i64,
        answer: &Answer,
        FormStep {
            round: number,
            messages,
            step,
        }: FormStep<'_>,
        open_others: &[crate::rows::Sibling],
    ) -> Result<AnswerOutcome, Error> {
        let task = question.task_id;
        let moves = Moves::of(chain)?;
        let last = chain.last();
        let chat = fixed.chat.as_ref();
        let closing = Closing::of(&chain.answer)?;
        let answered = |messages: serde_json::Value| Answered {
            moves,
            closing,
            task,
            generation,
            round: number,
            question: question.id,
            answer: answer.clone(),
            messages,
        };
        let row = match &step {
            Step::Finish(output) => {
                let told = fixed.end_told_in();
                let mut outbox = self.effects.of(task, generation + 3, told, None, last);
                outbox.extend(
                    self.effects
                        .answered_elsewhere(open_others, &answer.answerer),
                );
                self.decide(FormFinish {
                    answered: answered(messages),
                    output: output.clone(),
                    outbox,
                })
                .await?
                .map(|row| (row, None))
            }
            Step::Ask(next) => {
                let id = QuestionId::new();
                let (audience, escalation) = asked_of(task, chat, next)?;
                let shape = next.shape();
                let mut won = None;
                // A handle is unique among the owner's open questions in the stream; one taken
                // fails the statement, and another is drawn.
                for _ in 0..8 {
                    let handle = Handle::random().to_string();
                    let mut outbox = self.asking(
                        chat,
                        audience.as_ref(),
                        task,
                        id,
                        &handle,
                        (&next.text, &next.context, &shape),
                    );
                    outbox.extend(
                        self.effects
                            .answered_elsewhere(open_others, &answer.answerer),
                    );
                    let decided = self
                        .decide(FormAsk {
                            answered: answered(messages.clone()),
                            question: id,
                            text: next.text.clone(),
                            handle: handle.clone(),
                            call_id: progress::call_id(&next.key),
                            shape: shape.clone(),
                            escalation: escalation.clone(),
                            audience: audience.clone(),
                            outbox,
                        })
                        .await?;
                    match decided {
                        FormAsked::HandleTaken => continue,
                        FormAsked::Lost => {
                            won = Some(None);
                            break;
                        }
                        FormAsked::Won(row, deadline) => {
                            let asked = crate::rows::Asked {
                                id,
                                handle: &handle,
                                text: &next.text,
                                context: "",
                                shape: &shape,
                                deadline,
                            };
                            let call_id = progress::call_id(&next.key);
                            let question = self.form_asked(
                                &row,
                                asked,
                                &call_id,
                                audience.as_ref(),
                                (number, &messages),
                            );
                            let asked = crate::convert::question(&question);
                            won = Some(Some((*row, Some(asked))));
                            break;
                        }
                    }
                }
                won.ok_or_else(|| Error::Busy("no free question handle after 8 tries".into()))?
            }
        };
        let Some((row, next)) = row else {
            return self.answer_lost(question.id, &question.owner, answer).await;
        };
        self.published(vec![self.effects.event(
            &row,
            last.event.as_str(),
            next.clone(),
        )]);
        question.answered_with(answer, row.updated_at);
        Ok(AnswerOutcome::Applied {
            task: Box::new(row),
            question: Box::new(question),
            asked: next.map(Box::new),
        })
    }

    /// One statement for all of `batch`: each questionnaire still waiting at its generation has
    /// its answer recorded and its next question asked.
    async fn form_ask_statement(
        &self,
        conn: &mut PgConnection,
        batch: &[FormAsk],
    ) -> Result<Vec<FormAsked>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::uuid[], $5::text[], $6::text[],
                                     $7::text[], $8::jsonb[], $9::uuid[], $10::text[], $11::text[], $12::text[],
                                     $13::jsonb[], $19::text[], $20::text[], $21::text[], $22::text[],
                                     $23::text[], $24::text[], $25::text[], $26::text[], $27::text[],
                                     $28::jsonb[], $29::bigint[], $30::bigint[], $31::text[], $32::text[],
                                     $33::smallint[], $34::smallint[], $35::uuid[], $36::bigint[],
                                     $37::text[], $38::text[], $39::bool[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_round, c_answered, c_answerer, c_answer,
                                         c_inbound, c_messages, c_question, c_text, c_handle, c_call,
                                         c_choices, c_af, c_at, c_ae, c_cf, c_ct, c_ce, c_lf, c_lt, c_le,
                                         c_escalate_to, c_escalate_ms, c_remind_ms, c_owner, c_stream,
                                         c_need, c_askees, c_group, c_expires_ms, c_outcome, c_others,
                                         c_once, c_ord)
            ), t AS (
                UPDATE tasks SET ", set_moved!("c.c_lt", 3, released(open)), ",
                    rounds = greatest(rounds, c.c_round)
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = c.c_af AND tasks.generation = c.c_generation
                  ", not_applied_before!("c.c_once", "c.c_inbound"), "
                RETURNING ",
            task_columns!(),
            ", c.*
            ), ",
            answered_and_audit!("c_text", "$40"),
            ", asked AS (
                INSERT INTO questions (id, task_id, handle, text, context, tool_call_id, round, owner,
                                       platform, bot_id, stream, choices, deadline, escalate_to,
                                       escalate_every_ms, escalate_at, need, askees, ask_group)
                SELECT c_question, id, c_handle, c_text, '', c_call, c_round, coalesce(c_owner, owner),
                       platform, bot_id, coalesce(c_stream, stream), c_choices, d.deadline, ", asked_values!(), "
                FROM t
                CROSS JOIN LATERAL (SELECT ", expires_in!("t.c_expires_ms"), " AS deadline) d
                ", asked_escalation!(), "
                RETURNING task_id, deadline
            ), out AS (
                ", outbox_of_batch!("$14", "$15", "$16", "$17", "$18"), "
            )
            SELECT t.*, t.c_ord AS ord,
                (SELECT deadline FROM asked WHERE asked.task_id = t.id) AS asked_deadline
            FROM t"
        );
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        let query = Answered::bind(sqlx::query_as(sql), batch, |r| &r.answered)
            .bind(column(batch, |r| r.question.as_uuid()))
            .bind(column(batch, |r| r.text.as_str()))
            .bind(column(batch, |r| r.handle.as_str()))
            .bind(column(batch, |r| r.call_id.as_str()))
            .bind(column(batch, |r| crate::rows::StoredShape::of(&r.shape)));
        let query = Moves::bind(out.bind_to(query), batch, |r| &r.answered.moves);
        let query = AskedColumns::bind(query, batch, self.remind_before_ms(), |r| AskedColumns {
            escalation: &r.escalation,
            audience: r.audience.as_ref(),
            question: r.question,
        })
        .bind(column(batch, |r| r.answered.moves.expires_ms));
        let query = Closing::bind(query, batch, |r| &r.answered.closing).bind(super::OPEN);
        let rows: Vec<FormRow> = query.fetch_all(&mut *conn).await?;
        hark_core::failpoint::hit("form_answer.after_commit");
        let won = in_order(
            batch.len(),
            rows.into_iter()
                .map(|r| (r.ord, (r.task, r.asked_deadline))),
        );
        self.publish_won(batch, &won, |r| &r.outbox);
        Ok(won
            .into_iter()
            .map(|row| match row {
                Some((task, deadline)) => FormAsked::Won(Box::new(task), deadline),
                None => FormAsked::Lost,
            })
            .collect())
    }

    /// One statement for all of `batch`: each questionnaire still waiting at its generation has
    /// its last answer recorded and completes with its output.
    async fn form_finish_statement(
        &self,
        conn: &mut PgConnection,
        batch: &[FormFinish],
    ) -> Result<Vec<Option<TaskRow>>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::uuid[], $5::text[], $6::text[],
                                     $7::text[], $8::jsonb[], $9::text[], $15::text[], $16::text[],
                                     $17::text[], $18::text[], $19::text[], $20::text[], $21::text[],
                                     $22::text[], $23::text[], $24::text[], $25::text[], $26::bool[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_round, c_answered, c_answerer, c_answer,
                                         c_inbound, c_messages, c_output, c_af, c_at, c_ae, c_cf, c_ct,
                                         c_ce, c_lf, c_lt, c_le, c_outcome, c_others, c_once, c_ord)
            ), t AS (
                UPDATE tasks SET ", set_moved!("c.c_lt", 3, released(ended)), ",
                    rounds = greatest(rounds, c.c_round), result = c.c_output
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = c.c_af AND tasks.generation = c.c_generation
                  ", not_applied_before!("c.c_once", "c.c_inbound"), "
                RETURNING ",
            task_columns!(),
            ", c.*
            ), ",
            answered_and_audit!("''", "$27"),
            ", out AS (
                ", outbox_of_batch!("$10", "$11", "$12", "$13", "$14"), "
            )
            SELECT t.*, t.c_ord AS ord FROM t"
        );
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        let query = Answered::bind(sqlx::query_as(sql), batch, |r| &r.answered)
            .bind(column(batch, |r| r.output.as_str()));
        let query = Moves::bind(out.bind_to(query), batch, |r| &r.answered.moves);
        let query = Closing::bind(query, batch, |r| &r.answered.closing).bind(super::OPEN);
        let rows: Vec<FinishRow> = query.fetch_all(&mut *conn).await?;
        hark_core::failpoint::hit("form_answer.after_commit");
        let won = in_order(batch.len(), rows.into_iter().map(|r| (r.ord, r.task)));
        self.publish_won(batch, &won, |r| &r.outbox);
        Ok(won)
    }
}

/// Whom a questionnaire's question `q` of `task` is put to at once, and whom it escalates to.
fn asked_of(
    task: hark_core::domain::TaskId,
    chat: Option<&super::ChatRoute>,
    q: &FormQuestion,
) -> Result<(Option<super::worker::Audience>, super::Escalation), Error> {
    let need = q
        .need
        .parse()
        .map_err(|e| Error::Internal(format!("questionnaire {task}: {e}")))?;
    Ok(match super::worker::Audience::of(chat, &q.ask_to, need)? {
        Some((audience, others)) => (Some(audience), others),
        None => (
            None,
            super::Escalation {
                to: q.escalate_to.clone(),
                after: (q.escalate_after_s > 0)
                    .then(|| std::time::Duration::from_secs(q.escalate_after_s.into())),
            },
        ),
    })
}

impl Store {
    /// The question a questionnaire's statement asked of `row` (as it left the task), which
    /// the next answer finds without reading it again; the others it is put to are asked now.
    fn form_asked(
        &self,
        row: &TaskRow,
        asked: crate::rows::Asked<'_>,
        call_id: &str,
        audience: Option<&super::worker::Audience>,
        round: (i32, &serde_json::Value),
    ) -> QuestionRow {
        let mut question = QuestionRow::asked(row, asked, call_id, round.0, None);
        if let Some(audience) = audience {
            audience.asked(&mut question);
            // The others are asked now, not at the next tick.
            self.wake_timers();
        }
        self.remember_asked(super::answers::AnswerTarget::asked(&question, row, round));
        question
    }
}

/// A questionnaire created waiting on its first question, in one statement: the task, the
/// question, the first round of its checkpoint, the audit of its three moves (the creation,
/// the claim by `task-control`, the ask) and the question's chat messages. No run job and no
/// worker: its first step is known when it is created.
#[derive(Debug)]
pub(super) struct FormCreate {
    id: hark_core::domain::TaskId,
    new: super::NewTask,
    question: QuestionId,
    text: String,
    context: String,
    handle: String,
    call_id: String,
    shape: Shape,
    messages: serde_json::Value,
    escalation: super::Escalation,
    audience: Option<super::worker::Audience>,
    outbox: Vec<OutboxMessage>,
    trace: Option<String>,
    claim: Move,
    ask: Move,
    expires_ms: Option<i64>,
}

/// How a questionnaire's creation was decided.
#[derive(Debug)]
pub(super) enum FormCreated {
    /// It waits on its first question, whose deadline this is.
    New(Box<TaskRow>, Option<time::OffsetDateTime>),
    /// Its request id was used before, or its owner is at the limit of active tasks.
    NotInserted,
    /// Another open question of the owner in the stream has this handle; draw another.
    HandleTaken,
}

impl Batched for FormCreate {
    type Decision = FormCreated;

    fn decide<'a>(
        store: &'a Store,
        conn: &'a mut PgConnection,
        batch: &'a [Self],
    ) -> BoxFuture<'a, Result<Vec<Self::Decision>, Error>> {
        Box::pin(async move {
            match store.form_create_statement(conn, batch).await {
                Err(e) if batch.len() == 1 && super::batch::handle_taken(&e) => {
                    Ok(vec![FormCreated::HandleTaken])
                }
                decided => decided,
            }
        })
    }

    fn queue(store: &Store) -> &Batches<Self> {
        &store.form_creates
    }
}

impl Store {
    /// Creates the questionnaire `new`, whose first question is `first`, waiting on that
    /// question. `None` when its request id was used before or its owner is at the limit, as
    /// for any task.
    pub(super) async fn create_form(
        &self,
        id: hark_core::domain::TaskId,
        new: &super::NewTask,
        first: &FormQuestion,
    ) -> Result<Option<TaskRow>, Error> {
        let wait = decide::Wait {
            on_timeout: new.on_timeout,
            ask_timeout: new.ask_timeout,
            own: None,
        };
        let (claim, ask) =
            decide::create_then_ask(wait, time::OffsetDateTime::now_utc(), self.policy())
                .map_err(|e| Error::Internal(format!("a questionnaire's first step: {e:?}")))?;
        let chat = new.chat.as_ref();
        let (audience, escalation) = asked_of(id, chat, first)?;
        let shape = first.shape();
        let call_id = progress::call_id(&first.key);
        let messages =
            serde_json::Value::Array(progress::step(&serde_json::Map::new(), Some(&first.key)));
        let question = QuestionId::new();
        // A handle is unique among the owner's open questions in the stream; one taken fails
        // the statement, and another is drawn.
        for _ in 0..8 {
            let handle = Handle::random().to_string();
            let outbox = self.asking(
                chat,
                audience.as_ref(),
                id,
                question,
                &handle,
                (&first.text, &first.context, &shape),
            );
            let created = self
                .decide(FormCreate {
                    id,
                    new: new.clone(),
                    question,
                    text: first.text.clone(),
                    context: first.context.clone(),
                    handle: handle.clone(),
                    call_id: call_id.clone(),
                    shape: shape.clone(),
                    messages: messages.clone(),
                    escalation: escalation.clone(),
                    audience: audience.clone(),
                    outbox,
                    trace: hark_core::trace::outgoing(),
                    claim: Move::of(&claim),
                    ask: Move::of(&ask),
                    expires_ms: ask.question_expires_after().map(super::worker::millis),
                })
                .await?;
            let (row, deadline) = match created {
                FormCreated::HandleTaken => continue,
                FormCreated::NotInserted => return Ok(None),
                FormCreated::New(row, deadline) => (row, deadline),
            };
            let asked = crate::rows::Asked {
                id: question,
                handle: &handle,
                text: &first.text,
                context: &first.context,
                shape: &shape,
                deadline,
            };
            let asked = self.form_asked(&row, asked, &call_id, audience.as_ref(), (1, &messages));
            self.published(vec![self.effects.event(
                &row,
                ask.event.as_str(),
                Some(crate::convert::question(&asked)),
            )]);
            return Ok(Some(*row));
        }
        Err(Error::Busy("no free question handle after 8 tries".into()))
    }

    /// One statement for all of `batch`.
    async fn form_create_statement(
        &self,
        conn: &mut PgConnection,
        batch: &[FormCreate],
    ) -> Result<Vec<FormCreated>, Error> {
        let sql = concat!(
            "WITH ",
            new_tasks!(),
            ", q AS (
                SELECT * FROM unnest($19::uuid[], $20::text[], $21::text[], $22::text[], $23::text[],
                                     $24::jsonb[], $25::jsonb[], $26::bigint[], $27::text[],
                                     $28::jsonb[], $29::bigint[], $30::bigint[], $31::text[], $32::text[],
                                     $33::smallint[], $34::smallint[], $35::uuid[])
                    WITH ORDINALITY AS q(c_question, c_text, c_context, c_handle, c_call, c_choices,
                                         c_messages, c_expires_ms, c_traceparent, c_escalate_to,
                                         c_escalate_ms, c_remind_ms, c_owner, c_stream, c_need,
                                         c_askees, c_group, c_ord)
            ), inserted AS (",
            insert_new_tasks!("$41", 3, 1),
            "
            ), t AS (
                SELECT inserted.*, q.* FROM inserted
                JOIN n ON n.id = inserted.id JOIN q ON q.c_ord = n.ord
            ), audit AS (
                ", audit_into!(), "
                SELECT id, NULL, ", sql_state!(pending), ", ", sql_event!(create), ", 1, owner, '' FROM t
                UNION ALL SELECT id, $42, $43, $44, 2, 'task-control', '' FROM t
                UNION ALL SELECT id, $45, $41, $46, 3, 'task-control', c_text FROM t
            ), checkpoint AS (
                INSERT INTO checkpoints (task_id, round, messages) SELECT id, 1, c_messages FROM t
            ), asked AS (
                INSERT INTO questions (id, task_id, handle, text, context, tool_call_id, round, owner,
                                       platform, bot_id, stream, choices, traceparent, deadline,
                                       escalate_to, escalate_every_ms, escalate_at, need, askees,
                                       ask_group)
                SELECT c_question, id, c_handle, c_text, c_context, c_call, 1, coalesce(c_owner, owner),
                       platform, bot_id, coalesce(c_stream, stream), c_choices, c_traceparent,
                       d.deadline, ", asked_values!(), "
                FROM t
                CROSS JOIN LATERAL (SELECT ", expires_in!("t.c_expires_ms"), " AS deadline) d
                ", asked_escalation!(), "
                RETURNING task_id, deadline
            ), out AS (
                ", outbox_of_batch!("$36", "$37", "$38", "$39", "$40"), "
            )
            SELECT t.*, t.c_ord AS ord,
                (SELECT deadline FROM asked WHERE asked.task_id = t.id) AS asked_deadline
            FROM t"
        );
        let Some(first) = batch.first() else {
            return Ok(Vec::new());
        };
        let query = super::batch::bind_new_tasks(sqlx::query_as(sql), batch, |r| (r.id, &r.new))
            .bind(column(batch, |r| r.question.as_uuid()))
            .bind(column(batch, |r| r.text.as_str()))
            .bind(column(batch, |r| r.context.as_str()))
            .bind(column(batch, |r| r.handle.as_str()))
            .bind(column(batch, |r| r.call_id.as_str()))
            .bind(column(batch, |r| crate::rows::StoredShape::of(&r.shape)))
            .bind(column(batch, |r| Json(&r.messages)))
            .bind(column(batch, |r| r.expires_ms))
            .bind(column(batch, |r| r.trace.as_deref()));
        let query = AskedColumns::bind(query, batch, self.remind_before_ms(), |r| AskedColumns {
            escalation: &r.escalation,
            audience: r.audience.as_ref(),
            question: r.question,
        });
        let out = OutboxColumns::of(batch.iter().map(|r| r.outbox.as_slice()));
        // Every creation of a batch is decided alike: its moves are the first one's.
        let rows: Vec<FormRow> = out
            .bind_to(query)
            .bind(first.ask.to)
            .bind(first.claim.from)
            .bind(first.claim.to)
            .bind(first.claim.event)
            .bind(first.ask.from)
            .bind(first.ask.event)
            .fetch_all(&mut *conn)
            .await?;
        hark_core::failpoint::hit("form_create.after_commit");
        let won = in_order(
            batch.len(),
            rows.into_iter()
                .map(|r| (r.ord, (r.task, r.asked_deadline))),
        );
        self.publish_won(batch, &won, |r| &r.outbox);
        Ok(won
            .into_iter()
            .map(|row| match row {
                Some((task, deadline)) => FormCreated::New(Box::new(task), deadline),
                None => FormCreated::NotInserted,
            })
            .collect())
    }
}
