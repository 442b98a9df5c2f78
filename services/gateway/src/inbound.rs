//! Inbound chat messages, from the moment a bot's frame is parsed to JetStream's
//! acknowledgement.
//!
//! Each bot connection hands its messages, in order, to its own ingest task: a message is
//! completed by its platform (OneBot asks the bot for a quoted message's text and author),
//! then written to the [`crate::spool::Spool`] and synced. Only then does it count as received; if the spool
//! is full, the chat is told instead. One publisher per gateway sends spooled messages to
//! JetStream in order, with `Nats-Msg-Id = platform:bot:stream:message_id`, and forgets each once
//! acknowledged; while NATS is away it tries again, and what it has not sent waits on disk.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hark_core::{bus, codec, trace};
use hark_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{hub::Hub, platform::Platform, spool::Spooled};
/// How long one publish waits for JetStream's acknowledgement.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one "could not take your message" notice per chat in this long.
const NOTICE_EVERY: Duration = Duration::from_secs(60);

/// The spooled message for `message`, in the current trace.
pub fn spooled(names: &bus::Names, message: pb::ChatMessage) -> Result<Spooled, bus::Error> {
    let subject = names.chat_in(&message.platform)?;
    let msg_id = bus::Names::chat_in_msg_id(
        &message.platform,
        &message.bot_id,
        &message.stream,
        &message.message_id,
    );
    Ok(Spooled {
        seq: 0,
        subject,
        msg_id,
        trace: trace::outgoing(),
        payload: codec::encode(message),
    })
}

/// Receives one connection's messages in order, completes each through its platform and spools
/// it; returns when the connection's sender closes.
pub async fn ingest<P: Platform>(
    hub: Arc<Hub>,
    platform: Arc<P>,
    mut messages: mpsc::Receiver<pb::ChatMessage>,
) {
    while let Some(message) = messages.recv().await {
        // Each message starts a trace of its own, which its spooled copy carries on.
        let span = tracing::info_span!(
            "receive",
            otel.name = format!("receive {} message", message.platform),
            otel.kind = "consumer",
            chat.platform = %message.platform,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        trace::scope_in(span, None, ingest_one(&hub, &*platform, message)).await;
    }
}

async fn ingest_one<P: Platform>(hub: &Arc<Hub>, platform: &P, mut message: pb::ChatMessage) {
    platform.complete(&mut message).await;
    let route = crate::platform::route(&message.platform, &message.bot_id, &message.stream);
    let spooled = match spooled(&hub.names, message) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "dropping a message whose platform cannot form a subject");
            return;
        }
    };
    match hub.spool.append(spooled).await {
        Ok(spooled) => {
            hark_core::failpoint::hit("inbound.after_spool");
            hub.metrics.inbound.of(&route.platform).inc();
            hub.to_publish(spooled)
        }
        Err(e) => {
            // Not taken: the message is refused to its sender, who is told in the chat.
            tracing::error!(
                bot = route.bot_id,
                stream = route.stream,
                error = %e,
                "refused an inbound message: the spool cannot take it"
            );
            hub.tell_not_taken(platform, &route).await;
        }
    }
}

/// Sends spooled messages to JetStream in order, trying again while NATS is away, until
/// `shutdown`. A message JetStream can never take (its id cannot be a header, or the server
/// refuses it for what it is) is set aside in the dead-letter stream, and the rest flow on.
pub async fn publish(
    hub: Arc<Hub>,
    mut queue: mpsc::UnboundedReceiver<Spooled>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = queue.recv() => match message {
                Some(m) => m,
                None => return,
            },
        };
        let mut pause = Duration::from_millis(100);
        let mut failing = false;
        loop {
            let sent = match send(&hub.js, &message).await {
                Err(Unsent::Never(reason)) => set_aside(&hub, &message, &reason).await,
                sent => sent,
            };
            match sent {
                Ok(()) => {
                    hark_core::failpoint::hit("inbound.after_publish");
                    if let Err(e) = hub.spool.ack(message.seq) {
                        tracing::warn!(error = %e, "cannot note a sent message in the spool; it may be sent again");
                    }
                    hub.liveness.consuming(SPOOL);
                    if failing {
                        tracing::info!(
                            waiting = hub.spool.pending(),
                            "NATS takes inbound messages again; the spooled ones are being sent"
                        );
                    }
                    break;
                }
                Err(e) => {
                    hub.liveness
                        .stalled(SPOOL, &format!("cannot publish spooled messages: {e}"));
                    if !failing {
                        tracing::warn!(
                            error = %e,
                            waiting = hub.spool.pending(),
                            spool = %hub.spool_dir.display(),
                            "NATS does not take inbound messages now; they are kept in the spool \
                             (gateway.spool_dir) and sent when it is back"
                        );
                        failing = true;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// The name of the spool's publisher in the gateway's liveness and dead letters.
pub const SPOOL: &str = "spool";

/// Copies a spooled message JetStream will never take to the dead-letter stream; an error when
/// that did not work either (then it is tried again, in order).
async fn set_aside(hub: &Hub, message: &Spooled, reason: &str) -> Result<(), Unsent> {
    let origin = hark_core::consume::Origin {
        stream: "spool",
        subject: &message.subject,
        sequence: message.seq,
        msg_id: &message.msg_id,
    };
    hub.dead
        .keep(SPOOL, origin, message.payload.clone(), reason)
        .await
        .map_err(|e| Unsent::Later(e.to_string()))
}

/// Why a publish did not go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsent {
    /// NATS is away or slow: the same publish may work later.
    Later(String),
    /// JetStream can never take this message.
    Never(String),
}

impl std::fmt::Display for Unsent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsent::Later(why) | Unsent::Never(why) => f.write_str(why),
        }
    }
}

/// The most bytes of a deduplication id JetStream is handed; ids are checked far below this
/// where they enter, so only a message spooled before those checks can reach it.
const MAX_MSG_ID_BYTES: usize = 1024;

/// One publish, acknowledged by JetStream.
pub async fn send(js: &async_nats::jetstream::Context, message: &Spooled) -> Result<(), Unsent> {
    use tracing::Instrument as _;
    let span = trace::send_span(&message.subject);
    trace::set_parent(
        &span,
        message
            .trace
            .as_deref()
            .and_then(trace::TraceContext::parse),
    );
    send_once(js, message).instrument(span).await
}

async fn send_once(js: &async_nats::jetstream::Context, message: &Spooled) -> Result<(), Unsent> {
    let never = |why: &str| Unsent::Never(why.to_owned());
    if message.msg_id.len() > MAX_MSG_ID_BYTES {
        return Err(never("its message id is longer than 1024 bytes"));
    }
    let msg_id: async_nats::HeaderValue = message
        .msg_id
        .parse()
        .map_err(|_| never("its message id has a line break"))?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(bus::MSG_ID_HEADER, msg_id);
    // While traces are exported, the receiver continues from this send's span.
    let traceparent = if hark_core::telemetry::exporting() {
        trace::outgoing().or_else(|| message.trace.clone())
    } else {
        message.trace.clone()
    };
    if let Some(parent) = traceparent
        .as_deref()
        .and_then(|t| t.parse::<async_nats::HeaderValue>().ok())
    {
        headers.insert(trace::HEADER, parent);
    }
    let published = tokio::time::timeout(PUBLISH_TIMEOUT, async {
        let ack = js
            .publish_with_headers(message.subject.clone(), headers, message.payload.clone())
            .await
            .map_err(refused)?;
        ack.await.map_err(refused)
    })
    .await;
    match published {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Unsent::Later(format!(
            "no acknowledgement within {PUBLISH_TIMEOUT:?}"
        ))),
    }
}

/// Whether a publish was refused for what it is (larger than the server's `max_payload`, which
/// it will always be), or for now.
fn refused(error: async_nats::jetstream::context::PublishError) -> Unsent {
    use async_nats::jetstream::context::PublishErrorKind;
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => Unsent::Never(error.to_string()),
        _ => Unsent::Later(error.to_string()),
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

/// The text a chat is told when the gateway cannot take a message.
pub const NOT_TAKEN: &str = "hark could not take your last message (it is overloaded); please send it again in a little while.";
