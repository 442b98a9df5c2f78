//! What every platform's connections share: the link to the bus, the spool, the notices of
//! messages not taken, and the metrics. It knows no platform: each keeps its own connections.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hark_core::bus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    Settings,
    spool::{Spool, Spooled},
};

/// At most one "could not take your message" notice per chat in this long.
const NOTICE_EVERY: Duration = Duration::from_secs(60);

/// The gateway's connections and its link to the bus.
#[derive(Debug)]
pub struct Hub {
    pub nats: async_nats::Client,
    pub js: async_nats::jetstream::Context,
    pub names: bus::Names,
    pub settings: Settings,
    /// Bots, messages and failed sends per platform.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where inbound messages wait until JetStream has them.
    pub spool: Arc<Spool>,
    pub spool_dir: std::path::PathBuf,
    /// Spooled messages, in order, for the publisher.
    publisher: mpsc::UnboundedSender<Spooled>,
    /// Chats told lately that a message was not taken.
    pub(crate) notices: Notices,
    /// Outbound messages this gateway sent lately, so that one JetStream delivers again (its ack
    /// lost in a leader election) is not posted twice.
    pub sent: Sent,
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
            .chain(parts.settings.http_platforms.iter().cloned())
            .chain(parts.settings.langbot.bots().into_iter().map(|(p, _)| p));
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
            settings: parts.settings,
            spool: parts.spool,
            spool_dir: parts.spool_dir,
            publisher,
            notices: Default::default(),
            sent: Default::default(),
            ready: CancellationToken::new(),
            shutdown: parts.shutdown,
        });
        (hub, queue)
    }

    /// Queues a spooled message for JetStream.
    pub fn to_publish(&self, message: Spooled) {
        let _ = self.publisher.send(message);
    }
}

/// When each chat was last told a message was not taken.
#[derive(Debug, Default)]
pub struct Notices(Mutex<HashMap<(String, String), Instant>>);

impl Notices {
    /// Whether the chat `(bot, stream)` may be told now.
    pub fn due(&self, bot: &str, stream: &str) -> bool {
        let mut told = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if told.len() > 10_000 {
            told.retain(|_, at| now.duration_since(*at) < NOTICE_EVERY);
        }
        let key = (bot.to_owned(), stream.to_owned());
        match told.get(&key) {
            Some(at) if now.duration_since(*at) < NOTICE_EVERY => false,
            _ => {
                told.insert(key, now);
                true
            }
        }
    }
}

/// How long a sent outbound message is remembered: longer than JetStream takes to deliver one
/// whose ack was lost again (`gateway.send_timeout` + 5 s, and a leader election).
const SENT_FOR: Duration = Duration::from_secs(15 * 60);

/// At most this many sent messages are remembered; the oldest are forgotten first.
const SENT_AT_MOST: usize = 200_000;

/// The outbound messages sent lately, by id, with the platform's id of each where it gave one;
/// oldest first.
#[derive(Debug, Default)]
pub struct Sent(Mutex<SentIds>);

#[derive(Debug, Default)]
struct SentIds {
    ids: HashMap<String, Option<String>>,
    order: VecDeque<(Instant, String)>,
}

impl Sent {
    /// Remembers that the outbound message `id` was sent, as the platform's message
    /// `platform_id`.
    pub fn remember(&self, id: &str, platform_id: Option<String>) {
        if id.is_empty() {
            return;
        }
        let mut sent = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while let Some((at, _)) = sent.order.front() {
            if now.duration_since(*at) < SENT_FOR && sent.order.len() < SENT_AT_MOST {
                break;
            }
            if let Some((_, old)) = sent.order.pop_front() {
                sent.ids.remove(&old);
            }
        }
        if sent.ids.insert(id.to_owned(), platform_id).is_none() {
            sent.order.push_back((now, id.to_owned()));
        }
    }

    /// When the outbound message `id` was sent lately: the platform's id of it, if it gave one.
    pub fn sent(&self, id: &str) -> Option<Option<String>> {
        if id.is_empty() {
            return None;
        }
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .get(id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_message_is_remembered_and_the_oldest_are_forgotten_past_the_bound() {
        let sent = Sent::default();
        assert_eq!(sent.sent("a"), None);
        sent.remember("a", Some("p-1".into()));
        sent.remember("a", Some("p-1".into()));
        assert_eq!(sent.sent("a"), Some(Some("p-1".into())));
        sent.remember("", None);
        assert!(
            sent.sent("").is_none(),
            "a message without an id is never taken as sent"
        );
        for i in 0..SENT_AT_MOST {
            sent.remember(&i.to_string(), None);
        }
        assert!(
            sent.sent("a").is_none(),
            "the oldest is forgotten past the bound"
        );
        assert_eq!(sent.sent(&(SENT_AT_MOST - 1).to_string()), Some(None));
        let held = sent.0.lock().unwrap();
        assert_eq!(held.ids.len(), held.order.len());
        assert!(held.ids.len() <= SENT_AT_MOST);
    }
}
