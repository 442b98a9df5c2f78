//! `hark dev`: the whole of hark in one process, for trying it out and for small installations.

use anyhow::Context as _;
use hark_core::config::Config;
use hark_worker::worker::Worker;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub async fn run(config: Config, workers: u32, shutdown: CancellationToken) -> anyhow::Result<()> {
    anyhow::ensure!(workers >= 1, "--workers must be at least 1");
    let Some(control) = hark_control::app::App::build_waiting(config.clone(), &shutdown)
        .await
        .context("task-control did not start")?
    else {
        return Ok(());
    };
    let gateway = hark_gateway::app::App::build(&config)
        .await
        .context("the gateway did not start")?;
    let (settings, demo) = crate::llm_settings(&config).await?;
    let mut built = Vec::new();
    for n in 1..=workers {
        let id = format!("{}-dev{n}", crate::default_worker_id());
        match Worker::build_waiting(&config, settings.clone(), id, &shutdown).await? {
            Some(worker) => built.push(worker),
            None => return Ok(()),
        }
    }

    let metrics =
        crate::listen::metrics(&config, built.first().map(Worker::health), shutdown.clone())
            .await?;
    let onebot = format!("ws://{}/onebot/v11/ws", gateway.addr());
    let llm = match &demo {
        Some(demo) => format!(
            "the built-in DEMO model at {} (set llm.base_url for a real one)",
            demo.base_url()
        ),
        None => format!(
            "{} (model {})",
            config.llm.base_url,
            if config.llm.model.is_empty() {
                "unset"
            } else {
                &config.llm.model
            }
        ),
    };
    eprintln!(
        "\nhark dev is up\n  OneBot reverse WebSocket: {onebot}{}\n  HTTP adapter:             http://{}/api/v1/messages\n  gRPC API:                 http://{}\n  metrics:                  http://{}/metrics\n  LLM:                      {llm}\n  workers:                  {workers}\n  database:                 {}\n  NATS:                     {} (namespace {})\nStop with Ctrl-C; a second Ctrl-C exits at once.\n",
        if config.gateway.onebot.access_token.is_empty() {
            " (no access token)"
        } else {
            " (access token required)"
        },
        gateway.addr(),
        control.grpc_addr(),
        metrics.unwrap_or(gateway.addr()),
        hark_core::secret::redact_url(config.database.url.expose()),
        hark_core::secret::redact_url(config.nats.url.expose()),
        config.nats.namespace,
    );

    let tracker = TaskTracker::new();
    let failed = CancellationToken::new();
    {
        let (stop, failed) = (shutdown.clone(), failed.clone());
        tracker.spawn(async move {
            if let Err(e) = control.run_until_stopped(stop.clone()).await {
                tracing::error!(error = %e, "task-control stopped");
                failed.cancel();
                stop.cancel();
            }
        });
    }
    {
        let (stop, failed) = (shutdown.clone(), failed.clone());
        tracker.spawn(async move {
            if let Err(e) = gateway.run_until_stopped(stop.clone()).await {
                tracing::error!(error = %e, "the gateway stopped");
                failed.cancel();
                stop.cancel();
            }
        });
    }
    for worker in built {
        let (stop, failed) = (shutdown.clone(), failed.clone());
        tracker.spawn(async move {
            if let Err(e) = worker.run_until_stopped(stop.clone()).await {
                tracing::error!(error = %e, "a worker stopped");
                failed.cancel();
                stop.cancel();
            }
        });
    }
    tracker.close();
    tracker.wait().await;
    drop(demo);
    anyhow::ensure!(
        !failed.is_cancelled(),
        "hark dev stopped because a part of it failed"
    );
    tracing::info!("hark dev stopped");
    Ok(())
}
