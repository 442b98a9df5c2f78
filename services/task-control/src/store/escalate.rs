//! Escalation: an open question still unanswered at its escalation time is asked of the next
//! person named for it as well, in their own chat, in one transaction: its task takes a new
//! generation (an answer decided from what was read before is decided again), the question of
//! the new askee is created beside the first, the audit records it and the new askee is asked
//! through the outbox. The first valid answer of any of them wins, and closes the others.

use std::time::Duration;

use hark_core::domain::{
    Event, Handle, Owner, QuestionId, StreamId, TaskState,
    decide::{Askees, Decision},
};
use time::OffsetDateTime;

use super::{ChatRoute, Error, OutboxMessage, QuestionRow, Store, TaskRow};

/// An open question whose escalation is due, with the database's clock.
#[derive(Debug, sqlx::FromRow)]
struct Due {
    #[sqlx(flatten)]
    question: QuestionRow,
    escalate_every_ms: Option<i64>,
    db_now: OffsetDateTime,
}

impl Store {
    /// Asks the next person of each open question whose escalation is due, as `decide`
    /// decides for its task from who is named and who is asked already, at the database's
    /// clock. Returns how many were asked.
    pub async fn escalate_questions(
        &self,
        limit: i64,
        decide: impl Fn(&TaskRow, &QuestionRow, Askees<'_>, OffsetDateTime) -> Result<Decision, Error>,
    ) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let due = sqlx::query_as::<_, Due>(concat!(
            "SELECT escalate_every_ms, now() AS db_now, ",
            question_columns!(),
            " FROM questions q
             WHERE outcome = ",
            sql_outcome!(open),
            " AND escalate_at <= now()
               AND EXISTS (SELECT 1 FROM tasks t WHERE t.id = q.task_id AND t.state = ",
            sql_state!(waiting_input),
            ")
             ORDER BY escalate_at LIMIT $1
             FOR UPDATE SKIP LOCKED"
        ))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut sent = Vec::new();
        let mut asked = 0;
        for due in due {
            if self.escalate_one(&mut tx, due, &decide, &mut sent).await? {
                asked += 1;
            }
        }
        tx.commit().await?;
        if asked > 0 {
            hark_core::failpoint::hit("escalate.after_commit");
        }
        self.published(sent);
        Ok(asked)
    }

    /// Escalates one due question in `tx`; `false` when its task moved meanwhile or the
    /// decision asks nobody. An ask put to several people at once (`escalate_every_ms` 0) is
    /// put to all of them; an escalation to the next one.
    async fn escalate_one(
        &self,
        tx: &mut sqlx::PgConnection,
        due: Due,
        decide: &impl Fn(&TaskRow, &QuestionRow, Askees<'_>, OffsetDateTime) -> Result<Decision, Error>,
        sent: &mut Vec<OutboxMessage>,
    ) -> Result<bool, Error> {
        let Due {
            question,
            escalate_every_ms,
            db_now,
        } = due;
        let at_once = escalate_every_ms == Some(0);
        let every = Duration::from_millis(escalate_every_ms.unwrap_or(0).max(1000) as u64);
        let group = question.ask_group.unwrap_or(question.id.as_uuid());
        // A task that moved since the question was read (an answer won) is left be.
        let task = sqlx::query_as::<_, TaskRow>(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = $1 AND state = ",
            sql_state!(waiting_input),
            " FOR UPDATE"
        ))
        .bind(question.task_id.as_uuid())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(task) = task else {
            return Ok(false);
        };
        let asked: Vec<String> = sqlx::query_scalar(
            "SELECT owner FROM questions WHERE task_id = $1 AND (id = $2 OR ask_group = $2)",
        )
        .bind(question.task_id.as_uuid())
        .bind(group)
        .fetch_all(&mut *tx)
        .await?;
        let askees = Askees {
            named: &question.escalate_to,
            asked: &asked,
            platform: question.platform.as_deref(),
            at_once,
        };
        let decision = decide(&task, &question, askees, db_now)?;
        debug_assert_eq!(decision.event, Event::Escalate);
        debug_assert_eq!(decision.to, TaskState::WaitingInput);
        let (next, later) = decision.asks_next();
        sqlx::query(
            "UPDATE questions SET escalate_to = $2,
                 escalate_at = CASE WHEN cardinality($2::text[]) > 0
                                    THEN now() + $3 * interval '1 millisecond' END,
                 ask_group = $4
             WHERE id = $1",
        )
        .bind(question.id.as_uuid())
        .bind(later)
        .bind(every.as_millis() as i64)
        .bind(group)
        .execute(&mut *tx)
        .await?;
        if next.is_empty() {
            return Ok(false);
        }
        // The task takes a new generation, its state unchanged, so an answer decided from what
        // was read before is decided again.
        let task = sqlx::query_as::<_, TaskRow>(concat!(
            "UPDATE tasks SET ",
            set_moved!(stays),
            " WHERE id = $1 RETURNING ",
            task_columns!()
        ))
        .bind(task.id.as_uuid())
        .fetch_one(&mut *tx)
        .await?;
        // Put to several at once in a group, each is asked there; escalated, in their own chat.
        let in_group = at_once
            && question
                .stream
                .as_deref()
                .and_then(|s| s.parse::<StreamId>().ok())
                .is_some_and(|s| s.is_group());
        let waited = (db_now - question.asked_at).unsigned_abs();
        let waited = Duration::from_secs(waited.as_secs());
        let mut outbox = Vec::new();
        for person in next {
            let stream = if in_group {
                question.stream.clone().unwrap_or_default()
            } else {
                match StreamId::private(person.user_id()) {
                    Ok(stream) => stream.as_str().to_owned(),
                    Err(_) => continue,
                }
            };
            let asked = self
                .ask_also(&mut *tx, &question, person, &stream, group)
                .await?;
            outbox.extend(if at_once {
                let route = ChatRoute::of(&asked.platform, &asked.bot_id, &asked.stream, &None);
                let mentions = if in_group {
                    vec![person.user_id().to_owned()]
                } else {
                    Vec::new()
                };
                route.map_or_else(Vec::new, |route| {
                    self.effects.question_mentioning(
                        &route,
                        task.id,
                        asked.id,
                        &asked.handle,
                        &asked.text,
                        &asked.context,
                        &asked.shape(),
                        &mentions,
                    )
                })
            } else {
                self.effects
                    .escalated(&asked, task.id, question.owner.as_str(), waited)
            });
        }
        let people: Vec<&str> = next.iter().map(Owner::as_str).collect();
        sqlx::query(concat!(
            audit_into!(),
            " VALUES ($1, $2, $3, $4, $5, 'timer', $6)"
        ))
        .bind(task.id.as_uuid())
        .bind(decision.from.as_str())
        .bind(decision.to.as_str())
        .bind(decision.event.as_str())
        .bind(task.generation)
        .bind(format!("#{} to {}", question.handle, people.join(", ")))
        .execute(&mut *tx)
        .await?;
        self.enqueue(&mut *tx, outbox, sent).await?;
        sent.push(self.effects.event(&task, decision.event.as_str(), None));
        Ok(true)
    }

    /// Creates the question of `first`'s ask for `person` in `stream`, in `group`: its handle
    /// unless that names another of their open questions there.
    async fn ask_also(
        &self,
        tx: &mut sqlx::PgConnection,
        first: &QuestionRow,
        person: &Owner,
        stream: &str,
        group: uuid::Uuid,
    ) -> Result<QuestionRow, Error> {
        let taken: Vec<String> = sqlx::query_scalar(concat!(
            "SELECT handle FROM questions WHERE platform = $1 AND stream = $2 AND owner = $3
               AND outcome = ",
            sql_outcome!(open)
        ))
        .bind(first.platform.as_deref())
        .bind(stream)
        .bind(person.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let mut handle = first.handle.clone();
        while taken.contains(&handle) {
            handle = Handle::random().to_string();
        }
        Ok(sqlx::query_as::<_, QuestionRow>(concat!(
            "INSERT INTO questions (id, task_id, handle, text, context, tool_call_id, round, owner,
                                    platform, bot_id, stream, choices, traceparent, deadline,
                                    reminded_at, ask_group, need, askees)
             SELECT $1, task_id, $2, text, context, tool_call_id, round, $3, platform, bot_id, $4,
                    choices, traceparent, deadline, now(), $5, need, askees
             FROM questions WHERE id = $6
             RETURNING ",
            question_columns!()
        ))
        .bind(QuestionId::new().as_uuid())
        .bind(&handle)
        .bind(person.as_str())
        .bind(stream)
        .bind(group)
        .bind(first.id.as_uuid())
        .fetch_one(&mut *tx)
        .await?)
    }
}
