//! The gateway as a whole: [`App::build`] opens the inbound spool and binds the listener;
//! [`App::run_until_stopped`] serves bots and HTTP clients until shutdown. Neither waits for
//! NATS: bots are served from the start, their messages wait in the spool until NATS answers and
//! the streams exist, and `/readyz` says which it is.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, State},
    routing::{any, get, post},
    serve::ListenerExt,
};
use hark_core::{bus, config::Config};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Settings, http, hub::Hub, onebot};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] hark_core::config::Error),
    #[error(transparent)]
    Spool(#[from] crate::spool::Error),
    #[error(transparent)]
    Bus(#[from] bus::Error),
    #[error("cannot listen on gateway.listen = {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the gateway's server failed: {0}")]
    Serve(std::io::Error),
}

#[derive(Debug)]
pub struct App {
    hub: Arc<Hub>,
    /// The spool's messages for the publisher, those a previous run left first.
    queue: tokio::sync::mpsc::UnboundedReceiver<crate::spool::Spooled>,
    listener: TcpListener,
    forward: Vec<String>,
    satori: hark_core::config::SatoriConfig,
    nats: hark_core::config::NatsConfig,
    /// What `GET /metrics` asks for: `metrics.token`; `None`: it is refused (the gateway listens
    /// beyond loopback and there is no `metrics.token`; a bot's token never reads metrics).
    metrics_token: Option<hark_core::secret::Secret>,
    shutdown: CancellationToken,
}

impl App {
    pub async fn build(config: &Config) -> Result<Self, Error> {
        hark_core::install_crypto();
        config.check_gateway_exposure()?;
        let names = bus::Names::of(&config.nats)?;
        let addr = config.gateway.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        if let Ok(bound) = listener.local_addr() {
            hark_core::listen::bound("gateway.listen", bound);
        }
        let spool_dir = config.gateway.spool_path();
        let (spool, left) = crate::spool::Spool::open(&spool_dir, config.gateway.spool_max_bytes)?;
        if !left.is_empty() {
            tracing::info!(
                messages = left.len(),
                spool = %spool_dir.display(),
                "the spool holds messages a previous run did not send; they go first"
            );
        }
        let nats = bus::connect_in_background(&config.nats, "hark gateway").await?;
        let shutdown = CancellationToken::new();
        let (hub, queue) = Hub::new(crate::hub::Parts {
            nats,
            names,
            settings: Settings::from_config(&config.gateway),
            spool,
            spool_dir,
            shutdown: shutdown.clone(),
        });
        for message in left {
            hub.to_publish(crate::inbound::resubject(&hub.names, message));
        }
        Ok(Self {
            hub,
            queue,
            listener,
            forward: config.gateway.onebot.forward.clone(),
            satori: config.gateway.satori.clone(),
            nats: config.nats.clone(),
            metrics_token: Some(config.metrics.token.clone())
                .filter(|token| !token.is_empty() || addr.ip().is_loopback()),
            shutdown,
        })
    }

    /// Cancelled once NATS answered and the streams exist.
    pub fn ready(&self) -> CancellationToken {
        self.hub.ready.clone()
    }

    /// The address the gateway listens on (the real port when the config said 0).
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Self {
            hub,
            queue,
            listener,
            forward,
            satori,
            nats,
            metrics_token,
            shutdown: own,
        } = self;
        // The streams, once NATS answers; then the spooled messages go out. A NATS that refuses
        // for good (JetStream off, credentials refused) stops the gateway with its cause.
        let (refused_tx, refused) = tokio::sync::oneshot::channel::<bus::Error>();
        {
            let (hub, stop) = (hub.clone(), own.clone());
            tokio::spawn(async move {
                let what = format!(
                    "NATS with JetStream at nats.url = {}",
                    hark_core::secret::redact_url(nats.url.expose())
                );
                match hark_core::startup::wait_for(&what, &stop, || {
                    bus::ensure(&hub.js, &hub.names)
                })
                .await
                {
                    Ok(Some(())) => {
                        hub.ready.cancel();
                        crate::inbound::publish(hub, queue, stop).await;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = refused_tx.send(e);
                        stop.cancel();
                    }
                }
            });
        }
        // Each platform: its connections, and its routes with a state of its own.
        let onebot = onebot::Door {
            hub: hub.clone(),
            bots: Arc::default(),
        };
        for url in forward {
            tokio::spawn(onebot::forward::keep_connected(onebot.clone(), url));
        }
        let adapter = http::Door::new(hub.clone());
        if !hub.settings.webhook_url.is_empty() {
            for (platform, bot) in hub.settings.http_bots.clone() {
                tokio::spawn(http::webhook(adapter.clone(), platform, bot));
            }
        }
        if !satori.url.is_empty() {
            tokio::spawn(crate::satori::keep_connected(hub.clone(), satori));
        }
        let langbot = crate::langbot::Door::new(hub.clone(), &hub.settings.langbot);
        for (platform, bot) in langbot.langbot.bots().to_vec() {
            tokio::spawn(crate::langbot::deliver(langbot.clone(), platform, bot));
        }
        let limit = hub.settings.max_frame_bytes;
        let health_state = Health {
            hub: hub.clone(),
            onebot: onebot.bots.clone(),
        };
        let mut router = Router::new()
            .route("/onebot/v11/ws", any(onebot::reverse::upgrade))
            .route("/onebot/v11/ws/", any(onebot::reverse::upgrade))
            .route("/onebot/v11/", any(onebot::reverse::upgrade))
            .route("/onebot/v11", any(onebot::reverse::upgrade))
            .with_state(onebot)
            .merge(
                Router::new()
                    .route("/healthz", get(health))
                    .with_state(health_state),
            )
            .merge(
                Router::new()
                    .route("/readyz", get(ready))
                    .with_state(hub.clone()),
            );
        // The HTTP adapter exists only when it was given platforms to speak for.
        if hub.settings.http_enabled() {
            router = router.merge(
                Router::new()
                    .route("/api/v1/messages", post(http::post_message))
                    .route("/api/v1/stream", get(http::stream))
                    .route("/api/v1/outbound", get(http::pull))
                    .route("/api/v1/outbound/ack", post(http::ack))
                    .with_state(adapter),
            );
        }
        // LangBot's webhook exists only when it was given bots.
        if !langbot.langbot.bots().is_empty() {
            router = router.merge(
                Router::new()
                    .route("/api/v1/langbot/webhook", post(crate::langbot::webhook))
                    .with_state(langbot),
            );
        }
        let router = router
            .layer(DefaultBodyLimit::max(limit))
            .merge(match metrics_token {
                Some(token) => hark_core::metrics::router(token),
                None => Router::new().route("/metrics", get(metrics_refused)),
            })
            .layer(axum::middleware::from_fn_with_state(
                hark_core::secret::Failures::default(),
                hark_core::secret::throttle,
            ));
        let stop = shutdown.clone();
        let stopped_here = own.clone();
        // Chat frames are small and latency matters more than packet count.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        let served = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = stopped_here.cancelled() => {}
            }
        })
        .await;
        own.cancel();
        let mut refused = refused;
        if let Ok(e) = refused.try_recv() {
            return Err(Error::Bus(e));
        }
        served.map_err(Error::Serve)
    }
}

/// `GET /metrics` on a gateway beyond loopback without `metrics.token`.
async fn metrics_refused() -> (axum::http::StatusCode, &'static str) {
    (
        axum::http::StatusCode::UNAUTHORIZED,
        "the gateway's metrics need metrics.token (HARK_METRICS__TOKEN) when it listens beyond \
         loopback; set it and give it to the scraper as Authorization: Bearer\n",
    )
}

/// `GET /readyz`: 200 once NATS answers and the streams exist, 503 before, while NATS is away, and
/// while a stream has no leader, naming it (bots are still served then: their messages wait in
/// the spool).
async fn ready(State(hub): State<Arc<Hub>>) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let connected = hub.nats.connection_state() == async_nats::connection::State::Connected;
    let stalled = hub.liveness.stalled_for(hark_core::consume::STALLED_AFTER);
    if hub.ready.is_cancelled() && connected && !stalled.is_empty() {
        let stalled: Vec<String> = stalled
            .into_iter()
            .map(|(name, why)| format!("{name}: {why}"))
            .collect();
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not consuming", "stalled": stalled, "spooled": hub.spool.pending()})),
        )
            .into_response()
    } else if hub.ready.is_cancelled() && connected {
        // On a cluster, a stream whose replicas are electing a leader takes nothing meanwhile.
        let leaderless =
            bus::leaderless(&hub.js, &hub.names, std::time::Duration::from_secs(2)).await;
        if leaderless.is_empty() {
            Json(json!({"status": "ready"})).into_response()
        } else {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "streams without a leader", "streams": leaderless, "spooled": hub.spool.pending()})),
            )
                .into_response()
        }
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "waiting for NATS", "spooled": hub.spool.pending()})),
        )
            .into_response()
    }
}

/// `GET /healthz`: liveness for anyone. Which bots are online is shown only to a caller with one
/// of the gateway's tokens (`gateway.onebot.access_token` or `gateway.http.token`), or to anyone
/// when the gateway has none (it then listens on loopback only).
/// What `/healthz` reads: the hub, and the bots online of each platform that has bots.
#[derive(Debug, Clone)]
struct Health {
    hub: Arc<Hub>,
    onebot: Arc<onebot::bots::Bots>,
}

async fn health(
    State(Health { hub, onebot }): State<Health>,
    headers: axum::http::HeaderMap,
) -> Json<serde_json::Value> {
    let tokens = [&hub.settings.access_token, &hub.settings.http_token];
    let open = tokens.iter().all(|t| t.is_empty());
    let given = crate::bearer(&headers);
    let trusted =
        open || given.is_some_and(|g| tokens.iter().any(|t| !t.is_empty() && t.matches(g)));
    if !trusted {
        return Json(json!({"status": "ok"}));
    }
    let bots: Vec<String> = onebot
        .online()
        .into_iter()
        .map(|(p, b)| format!("{p}:{b}"))
        .collect();
    Json(json!({
        "status": "ok",
        "bots": bots,
        "nats": hub.nats.connection_state() == async_nats::connection::State::Connected,
        "spooled": hub.spool.pending(),
    }))
}
