//! **Watchers**: what holding many streams of task events costs, in memory, the way clients hold
//! them: `WatchTask` streams of one task waiting on its question, and `WatchTasks` streams of
//! every task, each kind over connections of at most [`PER_CONNECTION`] streams. Resident memory of
//! task-control and of nats-server before, with every stream open, and once they closed.

use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt;
use hark_proto::v1 as pb;
use serde_json::json;
use tonic::transport::Channel;

use super::{Bench, Report, mib, procs};

/// Streams per client connection, below `control.max_watchers_per_connection`.
pub const PER_CONNECTION: usize = 900;

/// The resident memory of the first process called `name`, in bytes.
fn rss_of(name: &str) -> u64 {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        if std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == name)
            && let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>()
        {
            return procs::rss(pid);
        }
    }
    0
}

/// `message` with the bearer token, when there is one.
fn signed<T>(message: T, token: Option<&hark_core::secret::Secret>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token
        && let Ok(value) = format!("Bearer {}", token.expose()).parse()
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

pub async fn run(bench: &mut Bench, streams: usize) -> anyhow::Result<Report> {
    let control = bench
        .procs
        .list()
        .iter()
        .find(|p| p.role == "control")
        .map(|p| p.pid)
        .context("the watchers workload needs task-control's process on this machine")?;
    let task = bench
        .api
        .create_task(pb::CreateTaskRequest {
            owner: "bench:watchers".into(),
            goal: "wait".into(),
            questionnaire: vec![pb::FormQuestion {
                key: "go".into(),
                text: "Go on?".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await?
        .into_inner()
        .task
        .context("no task")?;
    let settle = || tokio::time::sleep(Duration::from_secs(2));
    settle().await;
    let before = (procs::rss(control), rss_of("nats-server"));
    let url = format!(
        "http://{}",
        hark_core::config::dial(bench.config.control.grpc_listen)
    );
    let token = bench.config.control.api_tokens.first().cloned();
    let mut held = Vec::new();
    let mut many = Vec::new();
    let mut opened = 0;
    while opened < streams {
        let channel = Channel::from_shared(url.clone())?.connect().await?;
        let mut api = pb::task_service_client::TaskServiceClient::new(channel);
        for _ in 0..PER_CONNECTION.min(streams - opened) {
            // Half of each kind.
            let request = |message| signed(message, token.as_ref());
            let many_request = |message| signed(message, token.as_ref());
            if opened % 2 == 0 {
                let mut stream = api
                    .watch_task(request(pb::WatchTaskRequest {
                        task_id: task.id.clone(),
                    }))
                    .await
                    .with_context(|| format!("WatchTask stream {opened} was refused"))?
                    .into_inner();
                stream.next().await.context("no current event")??;
                held.push(stream);
            } else {
                many.push(
                    api.watch_tasks(many_request(pb::WatchTasksRequest::default()))
                        .await
                        .with_context(|| format!("WatchTasks stream {opened} was refused"))?
                        .into_inner(),
                );
            }
            opened += 1;
        }
    }
    settle().await;
    let open = (procs::rss(control), rss_of("nats-server"));
    drop(held);
    drop(many);
    settle().await;
    let closed = (procs::rss(control), rss_of("nats-server"));
    let per_stream_kib = |at: u64, from: u64| {
        (at.saturating_sub(from) as f64 / 1024.0 / streams as f64 * 10.0).round() / 10.0
    };
    let json = json!({
        "workload": "watchers",
        "streams": streams,
        "control_rss_mib": {"before": mib(before.0), "open": mib(open.0), "closed": mib(closed.0)},
        "nats_rss_mib": {"before": mib(before.1), "open": mib(open.1), "closed": mib(closed.1)},
        "control_kib_per_stream": per_stream_kib(open.0, before.0),
        "nats_kib_per_stream": per_stream_kib(open.1, before.1),
    });
    let rows = vec![
        (
            "watchers".to_owned(),
            format!("task-control RSS: before · {streams} streams open · closed"),
            format!(
                "{} · {} · {} MiB",
                mib(before.0),
                mib(open.0),
                mib(closed.0)
            ),
        ),
        (
            "watchers".to_owned(),
            format!("nats-server RSS: before · {streams} streams open · closed"),
            format!(
                "{} · {} · {} MiB",
                mib(before.1),
                mib(open.1),
                mib(closed.1)
            ),
        ),
        (
            "watchers".to_owned(),
            "task-control per stream".to_owned(),
            format!("{} KiB", per_stream_kib(open.0, before.0)),
        ),
    ];
    Ok(Report { json, rows })
}
