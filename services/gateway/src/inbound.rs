//! Inbound chat messages, from the moment a bot's frame is parsed to JetStream's
//! acknowledgement.
//!
//! Each bot connection hands its messages, in order, to its own ingest task: a message is
//! completed by its platform (OneBot asks the bot for a quoted message's text and author),
//! then written to the [`crate::spool::Spool`] and synced. Only then does it count as received; if the spool
//! is full, the chat is told instead. One publisher per gateway sends spooled messages to
//! JetStream in order, with `Nats-Msg-Id = platform:bot:stream:message_id`, and forgets each once
//! acknowledged; while NATS is away it tries again, and what it has not sent waits on disk.

use std::{sync::Arc, time::Duration};

use hark_core::{
    bus, codec,
    publish::{self, Unsent},
    trace,
};
use hark_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{hub::Hub, platform::Platform, spool::Spooled};
/// The spooled message for `message`, in the current trace.
pub fn spooled(names: &bus::Names, message: pb::ChatMessage) -> Result<Spooled, bus::Error> {
    let subject = names.chat_in_of(&message.platform, &message.stream)?;
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

/// A message a previous run spooled, with the subject of its chat's `CHAT_IN` partition now:
/// `nats.partitions` may have changed since, and a partition that is gone takes nothing.
pub fn resubject(names: &bus::Names, mut message: Spooled) -> Spooled {
    let chat = codec::decode::<pb::ChatMessage>(&message.payload).ok();
    if let Some(subject) = chat.and_then(|c| names.chat_in_of(&c.platform, &c.stream).ok()) {
        message.subject = subject;
    }
    message
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

/// Completes one message through its platform and spools it; a message the spool cannot take is
/// refused, and its chat told.
pub(crate) async fn ingest_one<P: Platform>(
    hub: &Arc<Hub>,
    platform: &P,
    mut message: pb::ChatMessage,
) {
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
            tell_not_taken(hub, platform, &route).await;
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
                Err(Unsent::Never { reason, .. }) => set_aside(&hub, &message, &reason).await,
                sent => sent.map(drop),
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
        .map_err(|e| Unsent::Later {
            subject: message.subject.clone(),
            reason: e.to_string(),
        })
}

/// Publishes a spooled message and waits for JetStream to store it: whether it had it already.
pub async fn send(js: &async_nats::jetstream::Context, message: &Spooled) -> Result<bool, Unsent> {
    let outgoing = publish::Outgoing {
        subject: message.subject.clone(),
        msg_id: &message.msg_id,
        payload: message.payload.clone(),
        trace: message.trace.as_deref(),
    };
    publish::publish(js, outgoing)
        .await
        .map(|ack| ack.duplicate)
}

/// The text a chat is told when the gateway cannot take a message.
pub const NOT_TAKEN: &str = "hark could not take your last message (it is overloaded); please send it again in a little while.";

/// Tells a chat through `platform` that its last message was not taken (at most once a
/// minute per chat).
pub async fn tell_not_taken<P: Platform>(
    hub: &Hub,
    platform: &P,
    route: &hark_proto::v1::ChatRoute,
) {
    if !hub.notices.due(&route.bot_id, &route.stream) {
        return;
    }
    let notice = hark_proto::v1::OutboundMessage {
        route: Some(route.clone()),
        text: NOT_TAKEN.into(),
        ..Default::default()
    };
    if let Err(e) = platform.send(notice).await {
        tracing::warn!(error = ?e, "cannot tell the chat its message was not taken");
    }
}

/// Publishes an inbound message of the HTTP adapter to `CHAT_IN`, deduplicated by its
/// platform message id, in the trace `trace` (a new one when the sender gave none), and
/// returns once JetStream acknowledged it: whether it had it already.
pub async fn publish_now(
    hub: &Hub,
    message: hark_proto::v1::ChatMessage,
    trace: Option<hark_core::trace::TraceContext>,
) -> Result<bool, String> {
    let platform = message.platform.clone();
    let span = tracing::info_span!(
        "receive",
        otel.name = format!("receive {platform} message"),
        otel.kind = "server",
        chat.platform = %platform,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    let duplicate = hark_core::trace::scope_in(span, trace, async {
        let spooled = spooled(&hub.names, message).map_err(|e| e.to_string())?;
        send(&hub.js, &spooled).await.map_err(|e| e.to_string())
    })
    .await?;
    if !duplicate {
        hub.metrics.inbound.of(&platform).inc();
    }
    Ok(duplicate)
}

/// A message published for a framework in front of the chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// JetStream had it already (the same message id).
    pub duplicate: bool,
    /// task-control's verdict, when it came within the wait.
    pub verdict: Option<bus::ChatVerdict>,
}

/// Publishes `message` as [`publish_now`] does and waits at most `wait` for task-control's
/// verdict on it (none is waited for when `wait` is zero).
pub async fn publish_for_verdict(
    hub: &Hub,
    message: hark_proto::v1::ChatMessage,
    trace: Option<hark_core::trace::TraceContext>,
    wait: Duration,
) -> Result<Posted, String> {
    // Listening before the message is published, so that no verdict can come before.
    let verdicts = if wait.is_zero() {
        None
    } else {
        let key = bus::Names::chat_in_msg_id(
            &message.platform,
            &message.bot_id,
            &message.stream,
            &message.message_id,
        );
        hub.nats
            .subscribe(hub.names.chat_verdict(&key))
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "cannot listen for a verdict"))
            .ok()
    };
    let duplicate = publish_now(hub, message, trace).await?;
    let verdict = match verdicts {
        Some(mut verdicts) => {
            use futures_util::StreamExt as _;
            match tokio::time::timeout(wait, verdicts.next()).await {
                Ok(Some(told)) => serde_json::from_slice(&told.payload).ok(),
                _ => None,
            }
        }
        None => None,
    };
    Ok(Posted { duplicate, verdict })
}
