//! What hark's MCP server reads and keeps of the questions outside agents ask: a key's open
//! questions and its rate, a request asked before, and the tools a person approved for the rest
//! of a session.

use std::time::Duration;

use uuid::Uuid;

use super::{Error, Store, TaskRow};

impl Store {
    /// The task a request key made, if one did.
    pub async fn task_of_request(&self, key: &str) -> Result<Option<TaskRow>, Error> {
        Ok(sqlx::query_as::<_, TaskRow>(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE request_id = $1"
        ))
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How many of the questions `key` asked are open, and how many it asked in the last
    /// minute.
    pub async fn asked_with(&self, key: Uuid) -> Result<(i64, i64), Error> {
        Ok(sqlx::query_as(concat!(
            "SELECT count(*) FILTER (WHERE state IN (",
            active_states!(),
            ")),
                    count(*) FILTER (WHERE created_at > now() - interval '1 minute')
             FROM tasks WHERE key_id = $1
               AND (state IN (",
            active_states!(),
            ") OR created_at > now() - interval '1 minute')"
        ))
        .bind(key)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The external tasks that have not ended, of `key` or of every key, oldest first.
    pub async fn open_external(
        &self,
        key: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<TaskRow>, Error> {
        Ok(sqlx::query_as::<_, TaskRow>(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE asked_by IS NOT NULL AND ($1::uuid IS NULL OR key_id = $1)
               AND state IN (",
            active_states!(),
            ") ORDER BY created_at, id LIMIT $2"
        ))
        .bind(key)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Whether `key` was granted `tool` for the rest of `session`.
    pub async fn granted(&self, key: Uuid, session: &str, tool: &str) -> Result<bool, Error> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM mcp_grants
                            WHERE key_id = $1 AND session = $2 AND tool = $3 AND expires_at > now())",
        )
        .bind(key)
        .bind(session)
        .bind(tool)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Grants `tool` to `key` for the rest of `session`, for at most `lasting`.
    pub async fn grant(
        &self,
        key: Uuid,
        session: &str,
        tool: &str,
        by: &str,
        lasting: Duration,
    ) -> Result<(), Error> {
        sqlx::query(
            "INSERT INTO mcp_grants (key_id, session, tool, granted_by, expires_at)
             VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond')
             ON CONFLICT (key_id, session, tool)
             DO UPDATE SET granted_by = EXCLUDED.granted_by, expires_at = EXCLUDED.expires_at",
        )
        .bind(key)
        .bind(session)
        .bind(tool)
        .bind(by)
        .bind(i64::try_from(lasting.as_millis()).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
