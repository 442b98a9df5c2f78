//! Reading tasks, their questions, rounds, instructions and audit.

use hark_core::domain::{Owner, QuestionId, TaskId, TaskState};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{ChatRoute, Error, Instruction, QuestionRow, RoundRow, Store, TaskRow, TransitionRow};

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

    /// A page of tasks, newest first: each filter walks its own index from the cursor (see the
    /// migration `task_pages`).
    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRow>, Error> {
        let sql = concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks_page($1, $2, $3, $4, $5, $6)"
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
        Ok(self
            .rounds_at(task, None)
            .await?
            .into_iter()
            .map(|(round, _)| round)
            .collect())
    }

    /// The rounds of a task (those after round `after`, if given) with when each was
    /// checkpointed, for its timeline. A round never changes once stored.
    pub async fn rounds_at(
        &self,
        task: TaskId,
        after: Option<i32>,
    ) -> Result<Vec<(RoundRow, OffsetDateTime)>, Error> {
        let rows =
            sqlx::query_as::<_, (i32, sqlx::types::Json<serde_json::Value>, OffsetDateTime)>(
                "SELECT round, messages, created_at FROM checkpoints
             WHERE task_id = $1 AND ($2::int IS NULL OR round > $2) ORDER BY round",
            )
            .bind(task.as_uuid())
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(round, messages, at)| (RoundRow { round, messages }, at))
            .collect())
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

    /// The chat of a task. A task's chat never changes, so it is remembered.
    pub(super) async fn chat_of(&self, task: TaskId) -> Result<Option<ChatRoute>, Error> {
        Ok(self.fixed_of(task).await?.chat)
    }

    /// What never changes of `task`: its chat, and how its questions wait.
    pub async fn fixed_of(&self, task: TaskId) -> Result<crate::rows::Fixed, Error> {
        if let Some(fixed) = self.routes.get(task) {
            return Ok(fixed);
        }
        let fixed = self.get_task(task).await?.fixed();
        self.routes.remember(task, fixed.clone());
        Ok(fixed)
    }

    /// A page of questions in id order (the order they were asked in). Each combination of
    /// filters is a statement of its own, so that every plan, generic ones included, reads a
    /// range of the index that fits it (`questions_open_by_owner_id`, `questions_open_by_id`)
    /// from the cursor on, however many questions wait. One owner's open ones come from the
    /// function `open_questions_page`, which walks their index in order even when the
    /// statistics have not seen the owner yet (see its migration).
    pub async fn list_questions(&self, filter: &QuestionFilter) -> Result<Vec<QuestionRow>, Error> {
        macro_rules! listed {
            ($owner:literal, $open:expr, $order:literal) => {
                concat!(
                    "SELECT ",
                    question_columns!(),
                    " FROM questions
                     WHERE ",
                    $owner,
                    $open,
                    " AND ($2::text IS NULL OR platform = $2)
                       AND ($3::text IS NULL OR stream = $3)
                       AND id > coalesce($4::uuid, '00000000-0000-0000-0000-000000000000'::uuid)
                     ORDER BY ",
                    $order,
                    " LIMIT $5"
                )
            };
        }
        let sql = match (filter.owner.is_some(), filter.include_closed) {
            // Planned inside the function, which allows only the walk of the owner's index.
            (true, false) => concat!(
                "SELECT ",
                question_columns!(),
                " FROM open_questions_page($1, $2, $3, $4, $5)"
            ),
            (true, true) => listed!("owner = $1", "", "owner, id"),
            (false, false) => listed!(
                "$1::text IS NULL",
                concat!(" AND outcome = ", sql_outcome!(open)),
                "id"
            ),
            (false, true) => listed!("$1::text IS NULL", "", "id"),
        };
        Ok(sqlx::query_as::<_, QuestionRow>(sql)
            .bind(filter.owner.as_ref().map(Owner::as_str))
            .bind(filter.platform.as_deref())
            .bind(filter.stream.as_deref())
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
            " FROM questions WHERE task_id = $1 AND outcome = ",
            sql_outcome!(open),
            " ORDER BY asked_at DESC LIMIT 1"
        ))
        .bind(task.as_uuid())
        .fetch_optional(&self.pool)
        .await?)
    }
}
