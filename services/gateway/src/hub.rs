//! What every platform's connections share: the link to the bus, the spool, the OneBot bots
//! online now, and the HTTP adapter.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use hark_core::bus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    Settings, inbound,
    onebot::conn::Bot,
    platform::Platform,
    spool::{Spool, Spooled},
};

/// The gateway's connections and its link to the bus.
#[derive(Debug)]
pub struct Hub {
    pub nats: async_nats::Client,
    pub js: async_nats::jetstream::Context,
    pub names: bus::Names,
    pub settings: Settings,
    /// The OneBot bots online, by `(platform, self id)`.
    pub(crate) bots: Mutex<HashMap<(String, String), Arc<Bot>>>,
    pub(crate) connections: AtomicU64,
    /// The HTTP adapter, with the subscribers of its outbound stream.
    pub http: Arc<crate::http::Adapter>,
    /// Bots, messages and failed sends per platform.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where inbound messages wait until JetStream has them.
    pub spool: Arc<Spool>,
    pub spool_dir: std::path::PathBuf,
    /// Spooled messages, in order, for the publisher.
    publisher: mpsc::UnboundedSender<Spooled>,
    /// Chats told lately that a message was not taken.
    notices: inbound::Notices,
    /// Cancelled once NATS answered and the streams exist.
    pub ready: CancellationToken,
    /// Stops everything at shutdown.
    pub shutdown: CancellationToken,
    /// Where messages that can never be published or delivered are set aside.
    pub dead: hark_core::consume::DeadLetters,
    /// Whether the spool's publisher and each bot's outbound consumer work; `/readyz` reports
    /// one that has not for a while.
    pub liveness: hark_core::consume::Liveness,
}

/// What a [`Hub`] is made of.
#[derive(Debug)]
pub struct Parts {
    pub nats: async_nats::Client,
    pub names: bus::Names,
    pub settings: Settings,
    pub spool: Arc<Spool>,
    pub spool_dir: std::path::PathBuf,
    pub shutdown: CancellationToken,
}

impl Hub {
    /// The hub, and the queue its publisher sends from.
    pub fn new(parts: Parts) -> (Arc<Self>, mpsc::UnboundedReceiver<Spooled>) {
        let (publisher, queue) = mpsc::unbounded_channel();
        let platforms = std::iter::once(parts.settings.platform.clone())
            .chain(parts.settings.http_platforms.iter().cloned());
        let metrics = Arc::new(crate::metrics::Metrics::new(platforms));
        hark_core::metrics::Registry::global().register(metrics.clone());
        let js = async_nats::jetstream::new(parts.nats.clone());
        let hub = Arc::new(Self {
            metrics,
            dead: hark_core::consume::DeadLetters::new(js.clone(), parts.names.clone()),
            liveness: Default::default(),
            js,
            nats: parts.nats,
            names: parts.names,
            http: Arc::new(crate::http::Adapter::new(&parts.settings)),
            settings: parts.settings,
            bots: Mutex::default(),
            connections: AtomicU64::new(1),
            spool: parts.spool,
            spool_dir: parts.spool_dir,
            publisher,
            notices: Default::default(),
            ready: CancellationToken::new(),
            shutdown: parts.shutdown,
        });
        (hub, queue)
    }

    /// Queues a spooled message for JetStream.
    pub fn to_publish(&self, message: Spooled) {
        let _ = self.publisher.send(message);
    }

    /// Tells a chat through `platform` that its last message was not taken (at most once a
    /// minute per chat).
    pub async fn tell_not_taken<P: Platform>(
        &self,
        platform: &P,
        route: &hark_proto::v1::ChatRoute,
    ) {
        if !self.notices.due(&route.bot_id, &route.stream) {
            return;
        }
        let notice = hark_proto::v1::OutboundMessage {
            route: Some(route.clone()),
            text: inbound::NOT_TAKEN.into(),
            ..Default::default()
        };
        if let Err(e) = platform.send(notice).await {
            tracing::warn!(error = ?e, "cannot tell the chat its message was not taken");
        }
    }

    pub(crate) fn lock_bots(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<Bot>>> {
        self.bots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The OneBot bots online now, as `(platform, self id)`.
    pub fn online(&self) -> Vec<(String, String)> {
        self.lock_bots().keys().cloned().collect()
    }

    pub fn bot(&self, platform: &str, self_id: &str) -> Option<Arc<Bot>> {
        self.lock_bots()
            .get(&(platform.to_owned(), self_id.to_owned()))
            .cloned()
    }

    /// Publishes an inbound message of the HTTP adapter to `CHAT_IN`, deduplicated by its
    /// platform message id, in the trace `trace` (a new one when the sender gave none), and
    /// returns once JetStream acknowledged it.
    pub async fn publish_now(
        &self,
        message: hark_proto::v1::ChatMessage,
        trace: Option<hark_core::trace::TraceContext>,
    ) -> Result<(), String> {
        let platform = message.platform.clone();
        let span = tracing::info_span!(
            "receive",
            otel.name = format!("receive {platform} message"),
            otel.kind = "server",
            chat.platform = %platform,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        hark_core::trace::scope_in(span, trace, async {
            let spooled = inbound::spooled(&self.names, message).map_err(|e| e.to_string())?;
            inbound::send(&self.js, &spooled)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
        self.metrics.inbound.of(&platform).inc();
        Ok(())
    }
}
