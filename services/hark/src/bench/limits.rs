//! What the infrastructure allows on this machine, measured in the same run: single-row UPDATE
//! commits in Postgres (with the `synchronous_commit` hark runs under), and JetStream publish
//! round trips with their ack.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use serde_json::json;
use sqlx::Connection as _;

use super::{Bench, Report, ms, percentile};

const COMMITS: usize = 2000;
const PUBLISHES: usize = 2000;

/// A table of one row, whose counter each single-row update of a loop bumps in a commit of its
/// own; removed once measured. Made by [`counter!`] from the table's name.
pub(super) struct Counter {
    create: &'static str,
    seed: &'static str,
    /// The update that bumps the counter.
    pub(super) bump: &'static str,
    remove: &'static str,
}

/// The [`Counter`] of the table named by a literal.
macro_rules! counter {
    ($table:literal) => {
        $crate::bench::limits::Counter::of(
            concat!(
                "CREATE TABLE IF NOT EXISTS ",
                $table,
                " (id int PRIMARY KEY, n bigint NOT NULL)"
            ),
            concat!(
                "INSERT INTO ",
                $table,
                " VALUES (1, 0) ON CONFLICT DO NOTHING"
            ),
            concat!("UPDATE ", $table, " SET n = n + 1 WHERE id = 1"),
            concat!("DROP TABLE IF EXISTS ", $table),
        )
    };
}
pub(super) use counter;

impl Counter {
    pub(super) const fn of(
        create: &'static str,
        seed: &'static str,
        bump: &'static str,
        remove: &'static str,
    ) -> Self {
        Self {
            create,
            seed,
            bump,
            remove,
        }
    }

    pub(super) async fn create(&self, conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
        sqlx::query(self.create).execute(&mut *conn).await?;
        sqlx::query(self.seed).execute(conn).await?;
        Ok(())
    }

    pub(super) async fn remove(&self, conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
        sqlx::query(self.remove).execute(conn).await?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub synchronous_commit: String,
    pub commits_per_s: f64,
    pub commit_p50: Duration,
    pub publish_per_s: f64,
    pub publish_p50: Duration,
}

impl Limits {
    pub fn report(&self) -> Report {
        Report {
            json: json!({
                "workload": "limits",
                "synchronous_commit": self.synchronous_commit,
                "pg_update_commits_per_s": self.commits_per_s.round(),
                "pg_commit_p50_ms": ms(self.commit_p50),
                "js_publish_acks_per_s": self.publish_per_s.round(),
                "js_publish_ack_p50_ms": ms(self.publish_p50),
            }),
            rows: vec![
                (
                    "limits".into(),
                    format!(
                        "Postgres single-row UPDATE commits/s (synchronous_commit={})",
                        self.synchronous_commit
                    ),
                    format!(
                        "{:.0} (p50 {:.3} ms)",
                        self.commits_per_s,
                        ms(self.commit_p50)
                    ),
                ),
                (
                    "limits".into(),
                    "JetStream publish + ack round trips/s".into(),
                    format!(
                        "{:.0} (p50 {:.3} ms)",
                        self.publish_per_s,
                        ms(self.publish_p50)
                    ),
                ),
            ],
        }
    }
}

pub async fn measure(bench: &Bench) -> anyhow::Result<Limits> {
    let mut conn = sqlx::PgConnection::connect(bench.config.database.url.expose()).await?;
    let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut conn)
        .await?;
    let counter = counter!("bench_limit");
    counter.create(&mut conn).await?;
    let mut samples = Vec::with_capacity(COMMITS);
    let start = Instant::now();
    for _ in 0..COMMITS {
        let t = Instant::now();
        sqlx::query(counter.bump).execute(&mut conn).await?;
        samples.push(t.elapsed());
    }
    let commits_per_s = COMMITS as f64 / start.elapsed().as_secs_f64();
    counter.remove(&mut conn).await?;
    conn.close().await?;
    samples.sort();
    let commit_p50 = percentile(&samples, 50.0);

    let js = jetstream::new(bench.nats.clone());
    let name = format!(
        "{}_BENCH_LIMIT",
        bench.config.nats.namespace.to_ascii_uppercase()
    );
    let subject = format!("{}.bench.limit", bench.config.nats.namespace);
    js.create_or_update_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    let mut samples = Vec::with_capacity(PUBLISHES);
    let start = Instant::now();
    for i in 0..PUBLISHES {
        let t = Instant::now();
        js.publish(subject.clone(), format!("{i}").into())
            .await?
            .await?;
        samples.push(t.elapsed());
    }
    let publish_per_s = PUBLISHES as f64 / start.elapsed().as_secs_f64();
    let _ = js.delete_stream(&name).await;
    samples.sort();
    Ok(Limits {
        synchronous_commit,
        commits_per_s,
        commit_p50,
        publish_per_s,
        publish_p50: percentile(&samples, 50.0),
    })
}
