//! Retention: a finished task is kept for `task.retention` after it ended, then deleted with
//! everything it owns: its audit rows, rounds and questions in the same statement, its told
//! instructions and its questions' chat messages by their foreign keys. The record of which inbound messages were applied is kept as long, and
//! so is a schedule after it ended. A tool approved for an MCP session goes when its day is over.

use std::time::Duration;

use super::{Error, Store};

/// What one purge deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub tasks: u64,
    pub applied_inbound: u64,
    /// Schedules that ended (done or cancelled).
    pub schedules: u64,
    /// Tools approved for an MCP session whose day is over.
    pub grants: u64,
}

impl Store {
    /// Deletes up to `limit` tasks that finished more than `keep` ago, and up to `limit` records
    /// of inbound messages applied more than `keep` ago. Rows another replica is deleting are
    /// skipped, so replicas may purge at once.
    pub async fn purge_finished(&self, keep: Duration, limit: i64) -> Result<Purged, Error> {
        let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
        // A task finished after it was created, so only tasks created before the cutoff can be
        // due: the scan walks the creation index from the oldest task.
        let tasks: i64 = sqlx::query_scalar(concat!(
            "WITH due AS (
                SELECT id FROM tasks
                WHERE created_at < now() - $1 * interval '1 millisecond'
                  AND state IN (",
            sql_state!(completed),
            ", ",
            sql_state!(failed),
            ", ",
            sql_state!(cancelled),
            ")
                  AND finished_at < now() - $1 * interval '1 millisecond'
                ORDER BY created_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ), gone AS (
                DELETE FROM tasks USING due WHERE tasks.id = due.id RETURNING tasks.id
            ), audit AS (
                DELETE FROM transitions USING gone WHERE transitions.task_id = gone.id
            ), rounds AS (
                DELETE FROM checkpoints USING gone WHERE checkpoints.task_id = gone.id
            ), asked AS (
                DELETE FROM questions USING gone WHERE questions.task_id = gone.id
            )
            SELECT count(*) FROM gone"
        ))
        .bind(keep_ms)
        .bind(limit)
        .fetch_one(&self.pool)
        .await?;
        let tasks = u64::try_from(tasks).unwrap_or_default();
        let applied_inbound = sqlx::query(
            "WITH due AS (
                SELECT key FROM applied_inbound
                WHERE applied_at < now() - $1 * interval '1 millisecond'
                ORDER BY applied_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM applied_inbound USING due WHERE applied_inbound.key = due.key",
        )
        .bind(keep_ms)
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let schedules = sqlx::query(concat!(
            "WITH due AS (
                SELECT id FROM schedules
                WHERE state <> ",
            sql_schedule!(active),
            " AND ended_at < now() - $1 * interval '1 millisecond'
                ORDER BY ended_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM schedules USING due WHERE schedules.id = due.id",
        ))
        .bind(keep_ms)
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let grants = sqlx::query(
            "WITH due AS (
                SELECT key_id, session, tool FROM mcp_grants WHERE expires_at < now()
                LIMIT $1
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM mcp_grants g USING due
            WHERE (g.key_id, g.session, g.tool) = (due.key_id, due.session, due.tool)",
        )
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(Purged {
            tasks,
            applied_inbound,
            schedules,
            grants,
        })
    }
}
