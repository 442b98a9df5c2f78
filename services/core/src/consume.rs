//! Taking messages off a JetStream consumer so that no single message can stop it.
//!
//! Every durable consumer of hark handles its messages through [`handle`]: the handler's future
//! runs with its unwind caught, so a panic on one message is that message's failure, not the
//! loop's end. What happens next follows from the failure's [`Kind`]:
//! - a retryable failure (a database that does not answer) is delivered again after a backoff,
//!   for as long as it takes;
//! - a failure that would happen again every time (an undecodable payload, a refused value) is
//!   set aside at once;
//! - a panic is tried [`PANIC_TRIES`] times, then set aside.
//!
//! Setting aside means: the message is copied, with its reason, to the dead-letter stream
//! (`<NS>_DEAD`, subjects `<ns>.dead.<source>`), counted in `hark_dead_letters_total`, and only
//! then terminated, so that it is neither delivered again nor lost. `hark health` shows the dead
//! letters. A message that cannot be copied (NATS is away) is delivered again instead.
//!
//! [`Liveness`] records whether each consumer is consuming; task-control's gRPC health and the
//! gateway's `/readyz` report one that has not been for [`STALLED_AFTER`].

use std::{
    collections::BTreeMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use async_nats::{
    HeaderMap,
    jetstream::{self, AckKind, context::PublishErrorKind},
};
use bytes::Bytes;
use futures_util::FutureExt as _;

use crate::{
    bus::{self, Names},
    error::{Kind, Settle},
    metrics::{self, Collect, CollectFuture, Counter, Family, Labels, Text},
};

/// How many deliveries a message whose handling panics gets before it is set aside.
pub const PANIC_TRIES: i64 = 3;
/// How long a consumer may be unable to pull before health reports it.
pub const STALLED_AFTER: Duration = Duration::from_secs(10);
/// The most bytes of a reason a dead letter keeps.
const REASON_BYTES: usize = 1024;

/// The headers a dead letter carries besides its original payload.
pub const REASON_HEADER: &str = "Hark-Dead-Reason";
pub const STREAM_HEADER: &str = "Hark-Dead-Stream";
pub const SUBJECT_HEADER: &str = "Hark-Dead-Subject";
pub const SEQUENCE_HEADER: &str = "Hark-Dead-Sequence";
pub const MSG_ID_HEADER: &str = "Hark-Dead-Msg-Id";
/// On a dead letter whose payload was too large to keep whole: how many bytes it had.
pub const CUT_HEADER: &str = "Hark-Dead-Cut-From";
/// How much of a payload too large for the server a dead letter keeps.
const CUT_TO: usize = 64 * 1024;

/// Where dead letters come from: one consumer (or the gateway's spool) each.
pub const SOURCES: [&str; 5] = ["chat_in", "chat_receipt", "task_run", "chat_out", "spool"];

/// Why handling one message failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: Kind,
    pub reason: String,
}

impl Failure {
    pub fn new(kind: Kind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Delivered again later.
    Retried,
    /// Copied to the dead-letter stream with this reason, and terminated.
    SetAside(String),
}

/// The dead-letter stream, as one role writes to it.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    js: jetstream::Context,
    names: Names,
}

impl DeadLetters {
    pub fn new(js: jetstream::Context, names: Names) -> Self {
        Self { js, names }
    }

    /// Copies `payload` with its reason to the dead-letter stream and counts it.
    pub async fn keep(
        &self,
        source: &str,
        origin: Origin<'_>,
        payload: Bytes,
        reason: &str,
    ) -> Result<(), bus::Error> {
        let mut headers = HeaderMap::new();
        headers.insert(REASON_HEADER, header_text(reason).as_str());
        headers.insert(STREAM_HEADER, header_text(origin.stream).as_str());
        headers.insert(SUBJECT_HEADER, header_text(origin.subject).as_str());
        headers.insert(SEQUENCE_HEADER, origin.sequence.to_string().as_str());
        if !origin.msg_id.is_empty() {
            headers.insert(MSG_ID_HEADER, header_text(origin.msg_id).as_str());
            // The same message set aside twice (by two replicas, or again after a crash) is
            // kept once.
            headers.insert(
                bus::MSG_ID_HEADER,
                header_text(&format!("{source}:{}", origin.msg_id)).as_str(),
            );
        }
        let subject = self.names.dead_letter(source);
        let fail = |e: async_nats::Error| bus::Error::Publish {
            subject: subject.clone(),
            source: e,
        };
        let publish = |headers: HeaderMap, payload: Bytes| async {
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers, payload)
                .await?;
            ack.await
        };
        let ack = tokio::time::timeout(Duration::from_secs(5), async {
            match publish(headers.clone(), payload.clone()).await {
                // Too large for the server, as it may well have been when it was first sent: the
                // letter keeps its start, and says how large it was.
                Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    let mut headers = headers;
                    headers.insert(CUT_HEADER, payload.len().to_string().as_str());
                    publish(headers, payload.slice(..payload.len().min(CUT_TO))).await
                }
                sent => sent,
            }
            .map_err(|e| fail(e.into()))
        })
        .await;
        match ack {
            Ok(Ok(_)) => {
                dead_letters().of(source).inc();
                tracing::error!(
                    source,
                    stream = origin.stream,
                    sequence = origin.sequence,
                    reason = crate::domain::ids::shown(reason),
                    "set a message aside in the dead-letter stream; the rest flow on (hark health lists them)"
                );
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(fail("no acknowledgement within 5s".into())),
        }
    }
}

impl DeadLetters {
    /// Keeps a JetStream message that can never be handled, with where it came from, and
    /// terminates it; one that cannot be kept yet is delivered again after `retry`.
    pub async fn set_aside(
        &self,
        source: &str,
        message: &jetstream::Message,
        reason: &str,
        retry: Duration,
    ) -> Outcome {
        let (stream, sequence) = message.info().map_or((String::new(), 0), |i| {
            (i.stream.to_owned(), i.stream_sequence)
        });
        let msg_id = msg_id_of(message.headers.as_ref(), &stream, sequence);
        let origin = Origin {
            stream: &stream,
            subject: message.subject.as_str(),
            sequence,
            msg_id: &msg_id,
        };
        match self
            .keep(source, origin, message.payload.clone(), reason)
            .await
        {
            Ok(()) => {
                ack(message, source, AckKind::Term).await;
                Outcome::SetAside(reason.to_owned())
            }
            Err(e) => {
                tracing::warn!(source, error = %e, "cannot set a message aside; it comes back");
                ack(message, source, AckKind::Nak(Some(retry))).await;
                Outcome::Retried
            }
        }
    }
}

impl DeadLetters {
    /// Keeps the message stored at `stored.sequence` of `stream`, read back from the stream
    /// (rather than delivered), with its reason. The caller settles its delivery.
    pub async fn keep_stored(
        &self,
        source: &str,
        stream: &str,
        stored: jetstream::message::StreamMessage,
        reason: &str,
    ) -> Result<(), bus::Error> {
        let msg_id = msg_id_of(Some(&stored.headers), stream, stored.sequence);
        let origin = Origin {
            stream,
            subject: stored.subject.as_str(),
            sequence: stored.sequence,
            msg_id: &msg_id,
        };
        self.keep(source, origin, stored.payload, reason).await
    }
}

/// What names a message across its copies: its `Nats-Msg-Id`, else its place in its stream.
fn msg_id_of(headers: Option<&HeaderMap>, stream: &str, sequence: u64) -> String {
    headers
        .and_then(|h| h.get(bus::MSG_ID_HEADER))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_else(|| format!("{stream}:{sequence}"))
}

async fn ack(message: &jetstream::Message, source: &str, kind: AckKind) {
    if let Err(e) = message.ack_with(kind).await {
        tracing::warn!(source, error = %e, "cannot settle a message; it comes back");
    }
}

/// Settles a message of `source` as its handling came out: the one place a consumer's outcome
/// becomes an ack, a redelivery (after [`bus::retry_delay`], or at once) or a termination. A
/// message that can never be handled is set aside first, with [`DeadLetters::set_aside`].
pub async fn settle(message: &jetstream::Message, source: &str, settle: Settle) {
    match settle {
        Settle::Done => ack(message, source, AckKind::Ack).await,
        Settle::Confirmed => {
            if let Err(e) = message.double_ack().await {
                tracing::warn!(source, error = %e, "handled, but the ack was not confirmed; it may be handled again");
            }
        }
        Settle::Retry => {
            let delivered = message.info().map_or(1, |i| i.delivered);
            let delay = bus::retry_delay(delivered);
            ack(message, source, AckKind::Nak(Some(delay))).await;
        }
        Settle::Again => ack(message, source, AckKind::Nak(None)).await,
        Settle::Drop => ack(message, source, AckKind::Term).await,
    }
}

/// Where a dead letter came from.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub stream: &'a str,
    pub subject: &'a str,
    pub sequence: u64,
    pub msg_id: &'a str,
}

/// A header value: one line, without the characters NATS headers cannot carry, cut short.
fn header_text(text: &str) -> String {
    let mut out = crate::domain::ids::one_line(text);
    out.truncate(crate::domain::text::floor_char_boundary(&out, REASON_BYTES));
    out
}

/// Handles one message with `handler` and settles it: acknowledged when it succeeded, delivered
/// again when it failed retryably, set aside when it never will succeed.
pub async fn handle<F>(
    message: &jetstream::Message,
    source: &str,
    dead: &DeadLetters,
    handler: F,
) -> Outcome
where
    F: Future<Output = Result<(), Failure>>,
{
    let delivered = message.info().map_or(1, |i| i.delivered);
    let result = match unwound(handler).await {
        Ok(result) => result,
        Err(what) => {
            metrics_panics().inc();
            if delivered < PANIC_TRIES {
                tracing::error!(
                    source,
                    delivered,
                    panic = what,
                    "handling a message panicked; it is tried again"
                );
                Err(Failure::new(Kind::Unavailable, what))
            } else {
                Err(Failure::new(
                    Kind::Internal,
                    format!("handling it panicked {delivered} times: {what}"),
                ))
            }
        }
    };
    settle_result(message, source, dead, delivered, result).await
}

async fn settle_result(
    message: &jetstream::Message,
    source: &str,
    dead: &DeadLetters,
    delivered: i64,
    result: Result<(), Failure>,
) -> Outcome {
    match result {
        Ok(()) => {
            settle(message, source, Settle::Done).await;
            Outcome::Done
        }
        Err(failure) if failure.kind.is_retryable() => {
            settle(message, source, Settle::Retry).await;
            Outcome::Retried
        }
        Err(failure) => {
            let reason = format!("{}: {}", failure.kind, failure.reason);
            dead.set_aside(source, message, &reason, bus::retry_delay(delivered))
                .await
        }
    }
}

/// Runs `work` to its end, or to a panic, whose message is then the error: for a loop that
/// must go on whatever one of its steps does.
pub async fn unwound<T>(work: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|panic| panic_text(&panic))
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Pulls the durable consumer `durable` of `stream` and hands each message, in order, to
/// `handler`, until `shutdown`. A consumer that cannot be opened or pulled is tried again every
/// second, and `liveness` says so meanwhile.
pub async fn run<H, Fut>(
    js: &jetstream::Context,
    consumer: Consumer<'_>,
    dead: &DeadLetters,
    liveness: &Liveness,
    shutdown: &tokio_util::sync::CancellationToken,
    mut handler: H,
) where
    H: FnMut(jetstream::Message) -> Fut,
    Fut: Future<Output = Result<(), Failure>>,
{
    use futures_util::StreamExt as _;
    let Consumer {
        stream,
        durable,
        source,
        name,
    } = consumer;
    loop {
        let messages = async {
            let consumer: jetstream::consumer::PullConsumer =
                js.get_consumer_from_stream(durable, stream).await?;
            Ok::<_, async_nats::Error>(consumer.messages().await?)
        };
        let mut messages = match messages.await {
            Ok(m) => {
                liveness.consuming(name);
                m
            }
            Err(e) => {
                liveness.stalled(name, &format!("cannot pull {durable} on {stream}: {e}"));
                tracing::warn!(stream, error = %e, "cannot open consumer; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    liveness.stalled(name, &format!("pull of {durable} on {stream} failed: {e}"));
                    tracing::warn!(stream, error = %e, "pull failed");
                    break;
                }
                None => break,
            };
            liveness.consuming(name);
            handle(&message, source, dead, handler(message.clone())).await;
        }
    }
}

/// A durable consumer of a stream, the source its dead letters are named by, and the name its
/// liveness is reported by: the source itself, or one per partition of a split stream
/// (`chat_in_1`), so that one partition's flow does not hide another's stall.
#[derive(Debug, Clone, Copy)]
pub struct Consumer<'a> {
    pub stream: &'a str,
    pub durable: &'a str,
    pub source: &'static str,
    pub name: &'a str,
}

/// Whether each consumer of a process is consuming.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Mutex<BTreeMap<String, State>>>);

#[derive(Debug, Clone)]
enum State {
    Consuming,
    Stalled { since: Instant, why: String },
}

impl Liveness {
    pub fn consuming(&self, name: &str) {
        let mut states = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Called for every message: the usual case allocates nothing.
        if !matches!(states.get(name), Some(State::Consuming)) {
            states.insert(name.to_owned(), State::Consuming);
        }
    }

    /// Records that `name` cannot consume now, and why; the first time counts for how long.
    pub fn stalled(&self, name: &str, why: &str) {
        let mut states = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match states.get_mut(name) {
            Some(State::Stalled { why: old, .. }) => *old = why.to_owned(),
            _ => {
                states.insert(
                    name.to_owned(),
                    State::Stalled {
                        since: Instant::now(),
                        why: why.to_owned(),
                    },
                );
            }
        }
    }

    /// Forgets `name` (a bot that went away).
    pub fn forget(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// The consumers stalled for at least `after`, with why, by name.
    pub fn stalled_for(&self, after: Duration) -> Vec<(String, String)> {
        let now = Instant::now();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(name, state)| match state {
                State::Stalled { since, why } if now.duration_since(*since) >= after => {
                    Some((name.clone(), why.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

fn dead_letters() -> &'static Family<Counter> {
    &collector().dead
}

fn metrics_panics() -> &'static Counter {
    &collector().panics
}

#[derive(Debug)]
struct Collector {
    dead: Family<Counter>,
    panics: Counter,
}

impl Collect for Collector {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()> {
        Box::pin(async move {
            out.counters(
                "hark_dead_letters_total",
                "Messages set aside in the dead-letter stream because they can never be handled, by source.",
                &self.dead,
            );
            out.counter(
                "hark_handler_panics_total",
                "Panics while handling one message, caught; the consumer goes on.",
                &self.panics,
            );
        })
    }
}

fn collector() -> &'static Arc<Collector> {
    static COLLECTOR: OnceLock<Arc<Collector>> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let collector = Arc::new(Collector {
            dead: Family::counters(Labels::new("source", SOURCES)),
            panics: Counter::default(),
        });
        metrics::Registry::global().register(collector.clone());
        collector
    })
}

/// Registers the dead-letter counters with the process's registry, so that they show as zero
/// before the first dead letter.
pub fn register_metrics() {
    let _ = collector();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_text_is_one_bounded_line() {
        let text = header_text(&format!("a\r\nb{}", "é".repeat(2000)));
        assert!(!text.contains(['\r', '\n']));
        assert!(text.len() <= REASON_BYTES);
        assert!(text.starts_with("a  b"));
    }

    #[test]
    fn a_stall_is_reported_only_after_its_time_and_until_consuming_again() {
        let live = Liveness::default();
        live.stalled("chat_in", "no stream");
        assert!(live.stalled_for(Duration::from_secs(3600)).is_empty());
        assert_eq!(
            live.stalled_for(Duration::ZERO),
            vec![("chat_in".to_owned(), "no stream".to_owned())]
        );
        live.consuming("chat_in");
        assert!(live.stalled_for(Duration::ZERO).is_empty());
    }
}
