//! Passing an open question on to another person, in one transaction: the question's askee
//! moves by compare-and-set, the audit records who passed it to whom, and the new askee is asked
//! through the outbox.

use hark_core::domain::{Owner, QuestionId, decide::Decision};

use super::{Error, OutboxMessage, QuestionRow, Store, TaskRow};

/// A question to pass on.
#[derive(Debug, Clone, Copy)]
pub struct Delegation<'a> {
    pub question: QuestionId,
    /// Whom it is asked of now, as the caller read it: it moves only from them.
    pub from: &'a Owner,
    pub to: &'a Owner,
    /// The chat it is asked in from now on, when it moves to another one (a question asked in
    /// a private chat goes to the new askee's own).
    pub stream: Option<&'a str>,
    /// Who passed it on, for the audit.
    pub actor: &'a str,
    /// The inbound message (or request) id: the same key applied twice moves it once.
    pub inbound_key: Option<&'a str>,
}

/// What passing a question on did.
#[derive(Debug, Clone)]
pub enum Delegated {
    /// It is asked of the new askee now: the question and its task as they are after the move.
    Moved {
        question: Box<QuestionRow>,
        task: Box<TaskRow>,
    },
    /// This inbound message was applied before; nothing changed.
    Duplicate,
}

impl Store {
    /// Passes `d.question` on from `d.from` to `d.to`, as `decide` decides for its task, and
    /// `ask` makes the messages that ask the new askee; both from the question and its task as
    /// they are after the move. Refused when the question is closed, was passed on meanwhile,
    /// or its task cannot take it.
    pub async fn delegate(
        &self,
        d: &Delegation<'_>,
        decide: impl FnOnce(&TaskRow, &QuestionRow) -> Result<Decision, Error>,
        ask: impl FnOnce(&QuestionRow, &TaskRow) -> Vec<OutboxMessage>,
    ) -> Result<Delegated, Error> {
        let mut tx = self.pool.begin().await?;
        if let Some(key) = d.inbound_key {
            let fresh = sqlx::query(
                "INSERT INTO applied_inbound (key, task_id)
                 SELECT $1, task_id FROM questions WHERE id = $2
                 ON CONFLICT DO NOTHING",
            )
            .bind(key)
            .bind(d.question.as_uuid())
            .execute(&mut *tx)
            .await?
            .rows_affected()
                > 0;
            if !fresh {
                return Ok(Delegated::Duplicate);
            }
        }
        // Its task takes a new generation with the move, though its state stays: a move of the
        // task (an answer, a cancel) waits for this commit, and an answer decided from what was
        // read before it (whom the question was asked of then) loses its compare-and-set.
        let task = sqlx::query_as::<_, TaskRow>(concat!(
            "UPDATE tasks SET ",
            set_moved!(stays),
            " WHERE id = (SELECT task_id FROM questions WHERE id = $1) RETURNING ",
            task_columns!()
        ))
        .bind(d.question.as_uuid())
        .fetch_optional(&mut *tx)
        .await?;
        let moved = sqlx::query_as::<_, QuestionRow>(concat!(
            "UPDATE questions SET owner = $2, stream = coalesce($3, stream)
             WHERE id = $1 AND owner = $4 AND outcome = ",
            sql_outcome!(open),
            " RETURNING ",
            question_columns!()
        ))
        .bind(d.question.as_uuid())
        .bind(d.to.as_str())
        .bind(d.stream)
        .bind(d.from.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let (Some(question), Some(task)) = (moved, task) else {
            drop(tx);
            let now = self.get_question(d.question).await?;
            if !now.outcome.is_open() {
                return Err(Error::QuestionClosed {
                    id: d.question.to_string(),
                    outcome: now.outcome,
                });
            }
            return Err(Error::Moved {
                handle: now.handle,
                askee: now.owner.to_string(),
            });
        };
        let decision = decide(&task, &question)?;
        sqlx::query(concat!(
            audit_into!(),
            " VALUES ($1, $2, $3, $4, $5, $6, $7)"
        ))
        .bind(task.id.as_uuid())
        .bind(decision.from.as_str())
        .bind(decision.to.as_str())
        .bind(decision.event.as_str())
        .bind(task.generation)
        .bind(d.actor)
        .bind(format!("#{} to {}", question.handle, d.to))
        .execute(&mut *tx)
        .await?;
        let mut sent = Vec::new();
        self.enqueue(&mut tx, ask(&question, &task), &mut sent)
            .await?;
        tx.commit().await?;
        hark_core::failpoint::hit("delegate.after_commit");
        self.published(sent);
        Ok(Delegated::Moved {
            question: Box::new(question),
            task: Box::new(task),
        })
    }
}
