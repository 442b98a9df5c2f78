//! `hark health <role>`: a healthcheck for containers, with nothing but the hark binary.

use std::time::Duration;

use anyhow::{Context as _, bail};
use hark_core::{bus::Names, config::Config};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Role {
    /// task-control's gRPC health service reports SERVING.
    Control,
    /// The gateway's /healthz answers.
    Gateway,
    /// With `metrics.listen`, the worker's own /healthz (its pull loop, NATS, task-control);
    /// without, NATS answers and the run job stream exists.
    Worker,
}

fn local(mut addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip([127, 0, 0, 1].into());
    }
    addr
}

pub async fn check(config: &Config, role: Role) -> anyhow::Result<()> {
    let within = Duration::from_secs(5);
    match role {
        Role::Control => {
            let url = format!("http://{}", local(config.control.grpc_listen));
            let channel = tonic::transport::Endpoint::from_shared(url.clone())?
                .connect_timeout(within)
                .connect()
                .await
                .with_context(|| format!("task-control does not answer at {url}"))?;
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "hark.v1.TaskService".into(),
                })
                .await
                .context("task-control's health check failed")?
                .into_inner()
                .status;
            if status != tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                bail!("task-control is not serving (status {status})");
            }
        }
        Role::Gateway => get_ok(local(config.gateway.listen), "the gateway", within).await?,
        Role::Worker => match config.metrics_listen()? {
            Some(addr) => get_ok(local(addr), "the worker", within).await?,
            None => {
                let client = tokio::time::timeout(
                    within,
                    hark_core::bus::connect_client(&config.nats, "hark health"),
                )
                .await
                .context("NATS did not answer in time")??;
                let names = Names::new(config.nats.namespace.parse()?);
                async_nats::jetstream::new(client)
                    .get_stream(names.task_run_stream())
                    .await
                    .with_context(|| {
                        format!("the stream {} does not exist yet", names.task_run_stream())
                    })?;
            }
        },
    }
    Ok(())
}

/// `GET /healthz` of `what` at `addr` answers 200; otherwise says what it answered.
async fn get_ok(addr: std::net::SocketAddr, what: &str, within: Duration) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(within, tokio::net::TcpStream::connect(addr))
        .await
        .with_context(|| format!("{what} did not answer in time"))?
        .with_context(|| format!("{what} does not answer at {addr}"))?;
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut answer))
        .await
        .with_context(|| format!("{what} did not answer in time"))??;
    let answer = String::from_utf8_lossy(&answer);
    if !answer.starts_with("HTTP/1.1 200") {
        let status = answer.lines().next().unwrap_or_default();
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        bail!("{what}'s /healthz at {addr} answered {status}: {body}");
    }
    Ok(())
}
