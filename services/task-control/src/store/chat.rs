//! What chat routing reads and marks: the open questions a sender may answer, a question by its
//! handle or by the message that carried it, applied inbound messages, and told instructions.

use hark_core::domain::{Event, Owner, QuestionId, TaskId, TaskState};
use uuid::Uuid;

use super::{AnswerTarget, Error, QuestionRow, Store};

/// When a told instruction reaches the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TellDelivery {
    NextRound,
    OnResume,
}

impl Store {
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
        match state.as_deref().map(str::parse::<TaskState>) {
            Some(Ok(TaskState::Running)) => Ok((id, TellDelivery::NextRound)),
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
                    " FROM questions WHERE outcome = ", sql_outcome!(open), " AND stream = $2 AND waits_for IS NULL AND ",
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

    /// Records why the chat message of `question` could never be delivered, unless a copy of
    /// it was; whether it was recorded.
    pub async fn set_undelivered(&self, question: QuestionId, reason: &str) -> Result<bool, Error> {
        Ok(sqlx::query(
            "UPDATE questions SET undelivered = $2
             WHERE id = $1 AND chat_message_id IS NULL",
        )
        .bind(question.as_uuid())
        .bind(reason)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
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
                UPDATE questions SET chat_message_id = coalesce(chat_message_id, $2),
                    undelivered = NULL
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
}
