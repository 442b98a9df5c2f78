//! The least a W1 answer can take on this machine when it is committed before the reply: a gRPC
//! unary call to a server in the bench that updates one row in Postgres, then replies. The same
//! clients as `w1-client` time it after the same think time, and beside it the same call without
//! the update. hark's answer does at least this much, so a W1 p50 below the floor is out of reach
//! here for any server that commits before it replies.

use std::{pin::Pin, time::Duration};

use anyhow::Context as _;
use futures_util::Stream;
use serde_json::{Value, json};
use sqlx::Connection as _;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse,
    health_check_response::ServingStatus,
    health_client::HealthClient,
    health_server::{Health, HealthServer},
};

use super::{Bench, Report, client, summary};

/// The service name a call asks for to have its row updated and committed first.
const COMMIT: &str = "commit";
/// And one that replies at once.
const NOTHING: &str = "nothing";

/// Answers the health check of [`COMMIT`] after one committed update on a connection of its own.
struct Floor {
    conn: Mutex<sqlx::PgConnection>,
}

#[tonic::async_trait]
impl Health for Floor {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        if request.get_ref().service == COMMIT {
            let mut conn = self.conn.lock().await;
            sqlx::query("UPDATE bench_floor SET n = n + 1 WHERE id = 1")
                .execute(&mut *conn)
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        }
        Ok(tonic::Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>>;

    async fn watch(
        &self,
        _request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "the bench's floor answers checks only",
        ))
    }
}

/// Times the floor from the Rust client and, with `python`, from Python's grpcio: with and
/// without the commit, `rounds` calls after `warmup`, each after `think`.
pub async fn run(
    bench: &Bench,
    python: Option<&std::path::Path>,
    think: Duration,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Report> {
    let url = bench.config.database.url.expose();
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)")
        .execute(&mut conn)
        .await?;
    sqlx::query("INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        .execute(&mut conn)
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let floor = Floor {
            conn: Mutex::new(conn),
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(floor))
            .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned())
    });
    let measured = measure(addr, python, think, warmup, rounds).await;
    stop.cancel();
    let _ = server.await;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query("DROP TABLE IF EXISTS bench_floor")
        .execute(&mut conn)
        .await?;
    let measured = measured?;

    let think_ms = think.as_millis() as u64;
    let mut json = json!({"workload": "w1-floor", "think_ms": think_ms, "rounds": rounds,
        "warmup": warmup});
    let mut rows = Vec::new();
    for (client, service, mut samples) in measured {
        let stats = summary(&mut samples);
        let key = if client == RUST { "rust" } else { "python" };
        json[format!("{key}_{service}")] = stats.clone();
        let what = match service {
            COMMIT => "a gRPC call that commits one row before its reply",
            _ => "a gRPC call that replies at once",
        };
        rows.push((
            "w1-floor".to_owned(),
            format!("{what}, from {client} after {think_ms} ms of thought (p50 / p90 / p99)"),
            format!(
                "{} / {} / {} ms",
                stats["p50_ms"], stats["p90_ms"], stats["p99_ms"]
            ),
        ));
    }
    Ok(Report { json, rows })
}

const RUST: &str = "hark's Rust client";
const PYTHON: &str = "Python grpcio";

/// Per client and service, the calls' times.
type Samples = Vec<(&'static str, &'static str, Vec<Duration>)>;

async fn measure(
    addr: std::net::SocketAddr,
    python: Option<&std::path::Path>,
    think: Duration,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Samples> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("cannot reach the bench's floor server")?;
    let mut health = HealthClient::new(channel);
    let mut measured = Samples::new();
    for service in [COMMIT, NOTHING] {
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..warmup + rounds {
            tokio::time::sleep(think).await;
            let t = std::time::Instant::now();
            health
                .check(HealthCheckRequest {
                    service: service.to_owned(),
                })
                .await
                .with_context(|| format!("the floor's `{service}` call failed"))?;
            if round >= warmup {
                samples.push(t.elapsed());
            }
        }
        measured.push((RUST, service, samples));
    }
    let Some(python) = python else {
        return Ok(measured);
    };
    for service in [COMMIT, NOTHING] {
        let mut run = client::Python::start_at(
            python,
            &addr.to_string(),
            &[
                ("--workload", "floor".into()),
                ("--service", service.into()),
                ("--rounds", rounds.to_string()),
                ("--warmup", warmup.to_string()),
                ("--think-ms", think.as_millis().to_string()),
            ],
        )?;
        let done = run.until("samples_ms").await?;
        run.finish().await?;
        let samples = done["samples_ms"]
            .as_array()
            .context("the Python client printed no samples")?
            .iter()
            .filter_map(Value::as_f64)
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .collect();
        measured.push((PYTHON, service, samples));
    }
    Ok(measured)
}
