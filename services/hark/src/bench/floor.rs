//! The least a W1 answer can take on this machine when it is committed before the reply: a gRPC
//! unary call to a server in the bench that updates one row in Postgres, then replies. The same
//! clients as `w1-client` time it after the same think time, and beside it the same call without
//! the update. hark's answer does at least this much, so a W1 p50 below the floor is out of reach
//! here for any server that commits before it replies.

use std::{pin::Pin, time::Duration};

use anyhow::Context as _;
use futures_util::Stream;
use serde_json::json;
use sqlx::Connection as _;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse,
    health_check_response::ServingStatus,
    health_client::HealthClient,
    health_server::{Health, HealthServer},
};

use super::{Bench, Report, client, limits, summary};

/// The service name a call asks for to have its row updated and committed first.
const COMMIT: &str = "commit";
/// And one that replies at once.
const NOTHING: &str = "nothing";

/// Answers the health check of [`COMMIT`] after one committed update on a connection of its own.
struct Floor {
    /// The statement that updates the row.
    bump: &'static str,
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
            sqlx::query(self.bump)
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
    let counter = limits::counter!("bench_floor");
    counter.create(&mut conn).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let floor = Floor {
            bump: counter.bump,
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
    counter.remove(&mut conn).await?;
    let measured = measured?;

    let think_ms = think.as_millis() as u64;
    let mut json = json!({"workload": "w1-floor", "think_ms": think_ms, "rounds": rounds,
        "warmup": warmup});
    let mut rows = Vec::new();
    for (client, service, mut samples) in measured {
        let stats = summary(&mut samples);
        json[format!("{}_{service}", client.key())] = stats.clone();
        let what = match service {
            COMMIT => "a gRPC call that commits one row before its reply",
            _ => "a gRPC call that replies at once",
        };
        rows.push((
            "w1-floor".to_owned(),
            format!(
                "{what}, from {} after {think_ms} ms of thought (p50 / p90 / p99)",
                client.label()
            ),
            format!(
                "{} / {} / {} ms",
                stats["p50_ms"], stats["p90_ms"], stats["p99_ms"]
            ),
        ));
    }
    Ok(Report { json, rows })
}

#[derive(Debug, Clone, Copy)]
enum Client {
    Rust,
    Python,
}

impl Client {
    /// Its name in the JSON line.
    fn key(self) -> &'static str {
        match self {
            Client::Rust => "rust",
            Client::Python => "python",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Client::Rust => "hark's Rust client",
            Client::Python => "Python grpcio",
        }
    }
}

/// Per client and service, the calls' times.
type Samples = Vec<(Client, &'static str, Vec<Duration>)>;

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
        measured.push((Client::Rust, service, samples));
    }
    let Some(python) = python else {
        return Ok(measured);
    };
    for service in [COMMIT, NOTHING] {
        let run = client::Python::start_at(
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
        measured.push((Client::Python, service, run.samples().await?));
    }
    Ok(measured)
}
