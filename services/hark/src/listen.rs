//! The process's metrics listener (`metrics.listen`): `GET /metrics` for every role the process
//! runs and, when it runs a worker, the worker's `GET /healthz`.

use std::net::SocketAddr;

use axum::{Json, http::StatusCode, response::IntoResponse, routing::get};
use hark_core::config::Config;
use hark_worker::worker::Health;
use tokio_util::sync::CancellationToken;

/// Serves `metrics.listen` until `shutdown`, when it is set. `worker` is the health of the
/// process's worker, if it runs one.
pub async fn metrics(
    config: &Config,
    worker: Option<Health>,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(addr) = config.metrics_listen()? else {
        return Ok(None);
    };
    let mut router = hark_core::metrics::router(config.metrics.token.clone());
    if let Some(health) = worker {
        router = router.route(
            "/healthz",
            get(move || {
                let health = health.clone();
                async move {
                    match health.check().await {
                        Ok(seen) => (StatusCode::OK, Json(seen)).into_response(),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            Json(serde_json::json!({"status": "unhealthy", "reason": why})),
                        )
                            .into_response(),
                    }
                }
            }),
        );
    }
    Ok(Some(
        hark_core::metrics::serve(addr, router, shutdown).await?,
    ))
}
