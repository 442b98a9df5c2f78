//! The one way hark publishes a message to a JetStream stream. The outbox relay and its sweep,
//! the hand-over's fallback, the gateway's spool, chat replies and delivery receipts all send
//! through [`send`] (or [`publish`], which also waits for the acknowledgement).
//!
//! - A message goes with its deduplication id (`Nats-Msg-Id`): one sent twice is stored once.
//! - It carries the trace context it continues. While traces are exported the send is a span of
//!   its own, open until the stream acknowledges it, and the receiver continues from that span.
//! - Its acknowledgement is awaited for at most [`ACK_WAIT`].
//! - Each outcome is counted in `hark_publish_total{outcome}`, and the wait for an
//!   acknowledgement in `hark_publish_ack_seconds`.
//!
//! A message is [`Unsent::Never`] when JetStream can never take it as it is (its id cannot be a
//! header, or it is larger than the server's `max_payload`), and [`Unsent::Later`] otherwise: a
//! caller keeps it and tries again.

use std::{
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use async_nats::jetstream::{
    self,
    context::{PublishAckFuture, PublishErrorKind},
};
use bytes::Bytes;

use crate::{
    bus::MSG_ID_HEADER,
    error::{Classified, Kind},
    metrics::{self, Collect, CollectFuture, Counter, Family, Histogram, Labels, Text},
    trace,
};

/// The longest a publish waits for the stream's acknowledgement.
pub const ACK_WAIT: Duration = Duration::from_secs(5);
/// The longest message id JetStream takes as a header value.
pub const MAX_MSG_ID_BYTES: usize = 1024;

/// A message for a stream.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    pub subject: String,
    /// Its deduplication id.
    pub msg_id: &'a str,
    pub payload: Bytes,
    /// The trace context (a `traceparent`) it continues; `None` continues the current span's.
    pub trace: Option<&'a str>,
}

/// Why a message was not published.
#[derive(Debug, thiserror::Error)]
pub enum Unsent {
    /// JetStream will never take it as it is.
    #[error("{subject} will never take this message: {reason}")]
    Never { subject: String, reason: String },
    /// It was not taken now; it may be later.
    #[error("cannot publish to {subject} now: {reason}")]
    Later { subject: String, reason: String },
}

impl Classified for Unsent {
    fn kind(&self) -> Kind {
        match self {
            Unsent::Never { .. } => Kind::Invalid,
            Unsent::Later { .. } => Kind::Unavailable,
        }
    }
}

/// A message handed to the server, its acknowledgement not yet awaited: many are sent before
/// any is awaited, so that they travel pipelined.
#[must_use = "a sent message is published only once it is acknowledged"]
pub struct Sent {
    subject: String,
    ack: PublishAckFuture,
    sent: Instant,
    /// The send's span, open until the acknowledgement.
    _span: tracing::Span,
}

impl std::fmt::Debug for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sent")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Sent {
    /// Waits, at most [`ACK_WAIT`], for the stream to store the message.
    pub async fn acked(self) -> Result<jetstream::publish::PublishAck, Unsent> {
        let later = |reason: String| Unsent::Later {
            subject: self.subject.clone(),
            reason,
        };
        let acked = match tokio::time::timeout(ACK_WAIT, self.ack.into_future()).await {
            Ok(Ok(ack)) => Ok(ack),
            Ok(Err(e)) => Err(later(e.to_string())),
            Err(_) => Err(later(format!("no acknowledgement within {ACK_WAIT:?}"))),
        };
        let counted = collector();
        match &acked {
            Ok(_) => {
                counted.ack_wait.observe_duration(self.sent.elapsed());
                counted.outcomes.of(ACKED).inc();
            }
            Err(_) => counted.outcomes.of(UNACKED).inc(),
        }
        acked
    }
}

/// Hands `message` to the server; [`Sent::acked`] then waits for the stream to store it.
pub async fn send(js: &jetstream::Context, message: Outgoing<'_>) -> Result<Sent, Unsent> {
    send_with_headers(js, message, async_nats::HeaderMap::new()).await
}

/// [`send`], with `headers` of the caller's own beside the deduplication id and trace context.
pub async fn send_with_headers(
    js: &jetstream::Context,
    message: Outgoing<'_>,
    headers: async_nats::HeaderMap,
) -> Result<Sent, Unsent> {
    let sent = send_unacked(js, message, headers).await;
    if let Err(e) = &sent {
        collector().outcomes.of(refusal(e)).inc();
    }
    sent
}

/// Publishes `message` and waits for the stream to store it.
pub async fn publish(
    js: &jetstream::Context,
    message: Outgoing<'_>,
) -> Result<jetstream::publish::PublishAck, Unsent> {
    send(js, message).await?.acked().await
}

async fn send_unacked(
    js: &jetstream::Context,
    message: Outgoing<'_>,
    mut headers: async_nats::HeaderMap,
) -> Result<Sent, Unsent> {
    let Outgoing {
        subject,
        msg_id,
        payload,
        trace: continues,
    } = message;
    let never = |reason: &str| Unsent::Never {
        subject: subject.clone(),
        reason: reason.to_owned(),
    };
    if msg_id.len() > MAX_MSG_ID_BYTES {
        return Err(never("its message id is longer than 1024 bytes"));
    }
    let msg_id: async_nats::HeaderValue = msg_id
        .parse()
        .map_err(|_| never("its message id has a line break"))?;
    headers.insert(MSG_ID_HEADER, msg_id);
    let (span, traceparent) = sending(&subject, continues);
    if let Some(value) = traceparent
        .as_deref()
        .and_then(|t| t.parse::<async_nats::HeaderValue>().ok())
    {
        headers.insert(trace::HEADER, value);
    }
    let ack = js
        .publish_with_headers(subject.clone(), headers, payload)
        .await
        .map_err(|e| match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => Unsent::Never {
                subject: subject.clone(),
                reason: e.to_string(),
            },
            _ => Unsent::Later {
                subject: subject.clone(),
                reason: e.to_string(),
            },
        })?;
    Ok(Sent {
        subject,
        ack,
        sent: Instant::now(),
        _span: span,
    })
}

/// The span of a send to `subject` that continues `continues` (the current span's context when
/// `None`), and the context its receiver continues. While traces are exported the span is a real
/// one and the receiver continues from it; otherwise no span is made and the receiver continues
/// what the message does.
pub fn sending(subject: &str, continues: Option<&str>) -> (tracing::Span, Option<String>) {
    let parent = continues.map(str::to_owned).or_else(trace::outgoing);
    if !crate::telemetry::exporting() {
        return (tracing::Span::none(), parent);
    }
    let span = trace::send_span(subject);
    trace::set_parent(
        &span,
        parent.as_deref().and_then(trace::TraceContext::parse),
    );
    let traceparent = span.in_scope(trace::outgoing).or(parent);
    (span, traceparent)
}

const ACKED: &str = "acked";
const UNACKED: &str = "unacked";
const REFUSED: &str = "refused";
const UNSENT: &str = "unsent";
const OUTCOMES: [&str; 4] = [ACKED, UNACKED, REFUSED, UNSENT];

fn refusal(unsent: &Unsent) -> &'static str {
    match unsent {
        Unsent::Never { .. } => REFUSED,
        Unsent::Later { .. } => UNSENT,
    }
}

struct Collector {
    outcomes: Family<Counter>,
    ack_wait: Histogram,
}

impl Collect for Collector {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()> {
        Box::pin(async move {
            out.counters(
                "hark_publish_total",
                "Messages published to a stream, by outcome: acked (stored), unacked (no acknowledgement in time; sent again later), refused (never storable as it is), unsent (not handed to the server now).",
                &self.outcomes,
            );
            out.histogram(
                "hark_publish_ack_seconds",
                "How long a stream took to acknowledge a published message.",
                &self.ack_wait,
            );
        })
    }
}

fn collector() -> &'static Arc<Collector> {
    static COLLECTOR: OnceLock<Arc<Collector>> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let collector = Arc::new(Collector {
            outcomes: Family::counters(Labels::new("outcome", OUTCOMES)),
            ack_wait: Histogram::new(&ACK_BOUNDS),
        });
        metrics::Registry::global().register(collector.clone());
        collector
    })
}

static ACK_BOUNDS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];
