//! A fresh Postgres database per test, on the real server.

#![allow(dead_code)]

use hark_control::store::{self, Store};
use hark_core::bus::Names;

pub use hark_testkit::postgres_url as server_url;

/// A database and a NATS namespace of one test's own: [`TestDb::drop`] removes both, and so
/// does dropping it (a panic too).
pub struct TestDb {
    pub store: Store,
    pub name: String,
    database: hark_testkit::Database,
    namespace: hark_testkit::Namespace,
}

impl TestDb {
    /// Creates a database of its own (through the same code production uses) and migrates it.
    pub async fn new() -> Self {
        let database = hark_testkit::Database::new();
        let namespace = hark_testkit::Namespace::new();
        let name = database.name.clone();
        let pool = store::connect(&database.url(), 20)
            .await
            .expect("Postgres must answer on HARK_TEST_DATABASE_URL or 127.0.0.1:5432");
        store::migrate(&pool).await.expect("migrations run");
        let names = Names::new(namespace.name.parse().expect("namespace"));
        Self {
            store: Store::new(
                pool,
                names,
                hark_control::texts::Languages::new(&Default::default()),
            ),
            name,
            database,
            namespace,
        }
    }

    /// Another store on the same database, over a single connection: every statement it runs
    /// comes from one backend, whose statistics that connection can flush.
    pub async fn one_connection(&self) -> Store {
        self.connections(1).await
    }

    /// Another store on the same database, with a pool of `max` connections.
    pub async fn connections(&self, max: u32) -> Store {
        let pool = store::connect(&self.database.url(), max)
            .await
            .expect("Postgres answers");
        Store::new(
            pool,
            Names::new(self.namespace.name.parse().expect("namespace")),
            hark_control::texts::Languages::new(&Default::default()),
        )
    }

    pub async fn drop(self) {
        self.store.pool().close().await;
        self.database.remove().await;
        self.namespace.remove().await;
    }
}

pub mod control;
pub mod tasks;

/// The use cases of answering and claiming, on a store alone: as a replica that no worker polls
/// applies them (every resume goes to the run queue).
pub trait Cases {
    fn claim<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        generation: i64,
        worker: &'a str,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<store::Claimed, store::Error>> + Send + 'a;

    fn answer<'a>(
        &'a self,
        question: hark_core::domain::QuestionId,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a;

    fn answer_task<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a;

    fn answer_target<'a>(
        &'a self,
        target: store::AnswerTarget,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a;

    fn cancel<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
        reason: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a;

    fn ask<'a>(
        &'a self,
        lease: &'a store::Lease,
        input: &'a store::AskInput,
    ) -> impl Future<Output = Result<store::QuestionRow, store::Error>> + Send + 'a;

    fn expire_due(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_;

    fn remind_due(
        &self,
        before: std::time::Duration,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_;

    fn escalate_due(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_;

    fn recover_leases(
        &self,
        max_attempts: i32,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_;

    fn complete<'a>(
        &'a self,
        lease: &'a store::Lease,
        final_round: Option<(i32, &'a serde_json::Value)>,
        result: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a;

    fn pause<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a;

    fn resume<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a;
}

impl Cases for Store {
    fn claim<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        generation: i64,
        worker: &'a str,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<store::Claimed, store::Error>> + Send + 'a {
        hark_control::cases::claim::claim(self, task, generation, worker, lease)
    }

    fn answer<'a>(
        &'a self,
        question: hark_core::domain::QuestionId,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a {
        hark_control::cases::answer::Answers::in_store(self).answer(question, answer)
    }

    fn answer_task<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a {
        hark_control::cases::answer::Answers::in_store(self).answer_task(task, answer)
    }

    fn answer_target<'a>(
        &'a self,
        target: store::AnswerTarget,
        answer: &'a store::Answer,
    ) -> impl Future<Output = Result<store::AnswerOutcome, store::Error>> + Send + 'a {
        hark_control::cases::answer::Answers::in_store(self).target(target, answer)
    }

    fn cancel<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
        reason: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a {
        hark_control::cases::command::cancel(self, task, actor, reason)
    }

    fn ask<'a>(
        &'a self,
        lease: &'a store::Lease,
        input: &'a store::AskInput,
    ) -> impl Future<Output = Result<store::QuestionRow, store::Error>> + Send + 'a {
        hark_control::cases::run::ask(self, lease, input)
    }

    fn expire_due(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_ {
        hark_control::cases::clock::expire_due(self, limit)
    }

    fn remind_due(
        &self,
        before: std::time::Duration,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_ {
        hark_control::cases::clock::remind_due(self, before, limit)
    }

    fn escalate_due(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_ {
        hark_control::cases::clock::escalate_due(self, limit)
    }

    fn recover_leases(
        &self,
        max_attempts: i32,
        limit: i64,
    ) -> impl Future<Output = Result<usize, store::Error>> + Send + '_ {
        hark_control::cases::clock::recover_leases(self, max_attempts, limit)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a store::Lease,
        final_round: Option<(i32, &'a serde_json::Value)>,
        result: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a {
        hark_control::cases::run::complete(self, lease, final_round, result)
    }

    fn pause<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a {
        hark_control::cases::command::pause(self, task, actor)
    }

    fn resume<'a>(
        &'a self,
        task: hark_core::domain::TaskId,
        actor: &'a str,
    ) -> impl Future<Output = Result<store::TaskRow, store::Error>> + Send + 'a {
        hark_control::cases::command::resume(self, task, actor)
    }
}

/// A table's statistics kept as they are: task-control's upkeep does not run while its lock is
/// held here, and Postgres's autovacuum leaves the table alone. [`HeldStatistics::release`] lets
/// the upkeep run again.
pub struct HeldStatistics {
    upkeep: sqlx::pool::PoolConnection<sqlx::Postgres>,
}

impl HeldStatistics {
    /// Takes the upkeep lock and turns autovacuum off for `table`.
    pub async fn of(pool: &sqlx::PgPool, table: &str) -> Self {
        let mut upkeep = pool.acquire().await.expect("connection");
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(store::UPKEEP_LOCK)
            .execute(&mut *upkeep)
            .await
            .expect("the upkeep lock");
        let off = format!("ALTER TABLE {table} SET (autovacuum_enabled = false)");
        sqlx::query(sqlx::AssertSqlSafe(off))
            .execute(&mut *upkeep)
            .await
            .expect("autovacuum off");
        Self { upkeep }
    }

    /// Lets task-control's upkeep take the statistics again.
    pub async fn release(mut self) {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(store::UPKEEP_LOCK)
            .execute(&mut *self.upkeep)
            .await
            .expect("unlocked");
    }
}

/// How many index entries of `table` the backend of `store` has read: `store` must run on one
/// connection ([`TestDb::one_connection`]), whose statistics this flushes first.
pub async fn index_reads(store: &Store, table: &str) -> i64 {
    flushed_count(
        store,
        table,
        "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
         WHERE relname = $1",
    )
    .await
}

/// How many rows of `table` the backend of `store` has read, through its indexes or by scanning
/// it, as [`index_reads`] counts.
pub async fn rows_read(store: &Store, table: &str) -> i64 {
    flushed_count(
        store,
        table,
        "SELECT (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
                 WHERE relname = $1)::bigint
              + (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables
                 WHERE relname = $1)::bigint",
    )
    .await
}

/// The count `sql` reads of `table` from the statistics, flushed first.
async fn flushed_count(store: &Store, table: &str, sql: &'static str) -> i64 {
    let mut conn = store.pool().acquire().await.expect("the one connection");
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .expect("flush");
    // The flush happens when the flushing statement ends.
    sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .expect("flushed");
    sqlx::query_scalar(sql)
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .expect("table stats")
}
