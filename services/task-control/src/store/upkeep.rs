//! Statistics and dead rows of hark's own tables.
//!
//! Every task leaves dead row versions behind (each move writes a new version of its row, and
//! every outbox row is deleted once relayed), and Postgres plans queries from table statistics.
//! A fresh database has none: plans chosen while the tables were empty keep scanning every open
//! question, and autovacuum, even when on, looks at a table only every minute or so. So
//! task-control analyzes its tables after migrating a database that never had statistics, and
//! whenever a table grew past a threshold since its last analyze, whether autovacuum is on or
//! not. With autovacuum off — as on some CI machines and hand-tuned servers — it also vacuums,
//! with autovacuum's thresholds. One replica at a time does either.

use sqlx::{AssertSqlSafe, PgConnection};

use super::{Error, Store};

/// hark's tables.
const TABLES: [&str; 12] = [
    "tasks",
    "schedules",
    "questions",
    "question_messages",
    "checkpoints",
    "transitions",
    "instructions",
    "applied_inbound",
    "outbox",
    "person_keys",
    "person_chats",
    "mcp_grants",
];

/// Act once this many rows, plus this share of the rows the table had when last looked after,
/// changed (autovacuum's rule). Vacuum at autovacuum's default share; analyze less often than it,
/// once the table doubled (all but `questions`, below): hark's statements are point lookups whose
/// best plan does not change as a table grows, and every ANALYZE makes each connection plan its
/// statements anew.
const BASE_ROWS: f64 = 50.0;
const ANALYZE_SHARE: f64 = 1.0;
const VACUUM_SHARE: f64 = 0.2;

/// `questions` is analyzed at autovacuum's share instead. Every index the open questions are
/// found by is partial (it holds the open questions only), and the planner sizes each from the
/// share of open questions the last analyze saw, not from the index. Statistics taken while
/// none was open make every such index look empty, and a burst of asks then has every sweep and
/// answer scan them all, whichever index it picks: at 10,000 waiting, an answer's statement
/// cost 4 ms of Postgres time instead of 0.2 ms. A burst changes that share without doubling
/// the table.
const QUESTIONS_ANALYZE_SHARE: f64 = 0.1;

/// The share of a table's rows that must change before it is analyzed again.
fn analyze_share(table: &str) -> f64 {
    if table == "questions" {
        QUESTIONS_ANALYZE_SHARE
    } else {
        ANALYZE_SHARE
    }
}

/// The advisory lock a replica holds while it looks after the tables (`harkup` in ASCII).
pub const UPKEEP_LOCK: i64 = 0x6861_726b_7570;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Upkeep {
    pub analyzed: Vec<String>,
    pub vacuumed: Vec<String>,
}

#[derive(sqlx::FromRow)]
struct TableStats {
    relname: String,
    /// Rows at the last vacuum or analyze; 0 when the table never had either.
    reltuples: f64,
    n_dead_tup: i64,
    n_mod_since_analyze: i64,
}

impl Store {
    /// Whether the server's autovacuum is on; when it is, [`Store::upkeep`] does nothing.
    pub async fn autovacuum_on(&self) -> Result<bool, Error> {
        Ok(
            sqlx::query_scalar("SELECT current_setting('autovacuum') = 'on'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Analyzes and vacuums the tables that changed enough since they last were. Another
    /// replica doing the same meanwhile makes this pass do nothing.
    pub async fn upkeep(&self) -> Result<Upkeep, Error> {
        self.upkeep_with(true).await
    }

    /// Analyzes the tables that grew enough since their last analyze, and, with `vacuum`,
    /// vacuums those with enough dead rows.
    pub async fn upkeep_with(&self, vacuum: bool) -> Result<Upkeep, Error> {
        let mut conn = self.pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(UPKEEP_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if !locked {
            return Ok(Upkeep::default());
        }
        let done = upkeep_locked(&mut conn, vacuum).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(UPKEEP_LOCK)
            .execute(&mut *conn)
            .await;
        if unlocked.is_err() {
            // A connection that may still hold the lock must not go back to the pool.
            drop(conn.detach());
        }
        done
    }
}

/// Analyzes every hark table that never had statistics (a database just created), so that the
/// first statements are planned from what the tables hold.
pub(super) async fn analyze_new_tables(pool: &sqlx::PgPool) -> Result<Vec<String>, Error> {
    let fresh: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_stat_user_tables
         WHERE schemaname = current_schema() AND relname = ANY($1)
           AND last_analyze IS NULL AND last_autoanalyze IS NULL",
    )
    .bind(&TABLES[..])
    .fetch_all(pool)
    .await?;
    let mut analyzed = Vec::new();
    for table in fresh {
        // The name comes from TABLES, not from the server.
        if let Some(name) = TABLES.iter().find(|t| **t == table) {
            sqlx::query(AssertSqlSafe(format!("ANALYZE {name}")))
                .execute(pool)
                .await?;
            analyzed.push(table);
        }
    }
    Ok(analyzed)
}

async fn upkeep_locked(conn: &mut PgConnection, vacuum: bool) -> Result<Upkeep, Error> {
    let stats: Vec<TableStats> = sqlx::query_as(
        "SELECT s.relname::text AS relname, greatest(c.reltuples, 0)::float8 AS reltuples,
                s.n_dead_tup, s.n_mod_since_analyze
         FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
         WHERE s.schemaname = current_schema() AND s.relname = ANY($1)",
    )
    .bind(&TABLES[..])
    .fetch_all(&mut *conn)
    .await?;
    let mut done = Upkeep::default();
    for table in stats {
        let live = table.reltuples;
        let vacuum_due = vacuum && table.n_dead_tup as f64 > BASE_ROWS + VACUUM_SHARE * live;
        let analyze_due =
            table.n_mod_since_analyze as f64 > BASE_ROWS + analyze_share(&table.relname) * live;
        // A vacuum analyzes only when an analyze is due as well: sampling the rows costs several
        // times what the vacuum does, and a table whose rows only move (each answered task's
        // row, say) needs its dead versions gone far more often than new statistics.
        let command = match (vacuum_due, analyze_due) {
            (true, true) => "VACUUM (ANALYZE)",
            (true, false) => "VACUUM",
            (false, true) => "ANALYZE",
            (false, false) => continue,
        };
        if vacuum_due {
            done.vacuumed.push(table.relname.clone());
        }
        if analyze_due {
            done.analyzed.push(table.relname.clone());
        }
        // The name comes from TABLES, not from the server.
        let Some(name) = TABLES.iter().find(|t| **t == table.relname) else {
            continue;
        };
        sqlx::query(AssertSqlSafe(format!("{command} {name}")))
            .execute(&mut *conn)
            .await?;
    }
    Ok(done)
}
