//! Reliable delivery of `CHAT_OUT` messages: one durable consumer per bot, pulled only by the
//! gateway that holds the bot, so messages for an offline bot wait in the stream. A message is
//! acknowledged only after the platform confirmed it; failures are retried with backoff, then
//! given up with an error line.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::Message;
use futures_util::StreamExt;
use hark_core::{bus, codec, consume, error::Settle, publish};
use hark_proto::v1 as pb;
use tokio_util::sync::CancellationToken;

use crate::{
    hub::Hub,
    platform::{Platform, SendError},
};

/// Attempts before a message is given up.
pub const MAX_ATTEMPTS: u64 = 8;

/// Where this consumer's messages come from, as dead letters and logs name it.
pub(crate) const SOURCE: &str = "chat_out";

/// Delivers the outbound messages of the bot `bot_id` of `platform` through `sender` until
/// `closed`.
pub async fn run<P: Platform>(
    hub: Arc<Hub>,
    sender: Arc<P>,
    platform: String,
    bot_id: String,
    closed: CancellationToken,
) {
    let consumer = loop {
        match consumer(&hub, &platform, &bot_id).await {
            Ok(c) => break c,
            Err(Opened::Never(e)) => {
                tracing::error!(error = %e, "this bot's messages cannot be delivered");
                return;
            }
            Err(Opened::NotNow(e)) => {
                tracing::warn!(error = %e, "cannot open the outbound consumer; retrying");
                tokio::select! {
                    _ = closed.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    let name = format!("chat_out {platform}:{bot_id}");
    let _forget = Forget(&hub, &name);
    loop {
        let batch = tokio::select! {
            _ = closed.cancelled() => return,
            batch = consumer.fetch().max_messages(1).expires(Duration::from_secs(5)).messages() => batch,
        };
        let mut batch = match batch {
            Ok(b) => {
                hub.liveness.consuming(&name);
                b
            }
            Err(e) => {
                hub.liveness
                    .stalled(&name, &format!("cannot pull outbound messages: {e}"));
                tracing::warn!(error = %e, "cannot pull outbound messages; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(message) = batch.next().await {
            match message {
                Ok(message) => {
                    let trace = hark_core::trace::from_headers(message.headers.as_ref());
                    let span = hark_core::trace::process_span(&message.subject);
                    let handled = hark_core::consume::unwound(hark_core::trace::scope_in(
                        span,
                        trace,
                        handle(&hub, &message, &*sender),
                    ))
                    .await;
                    match handled {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(panic) => {
                            set_aside(&hub, &message, &format!("delivering it panicked: {panic}"))
                                .await;
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pull failed"),
            }
        }
    }
}

/// Why a bot's outbound consumer is not open.
#[derive(Debug)]
pub enum Opened {
    /// The bot's names cannot form a consumer: it never will be.
    Never(bus::Error),
    /// JetStream did not answer as it should; try again.
    NotNow(bus::Error),
}

/// The durable consumer of the outbound messages of the bot `bot_id` of `platform`, created when
/// it does not exist. Every gateway replica opens the same one.
pub async fn consumer(
    hub: &Hub,
    platform: &str,
    bot_id: &str,
) -> Result<async_nats::jetstream::consumer::PullConsumer, Opened> {
    let config = (|| {
        Ok::<_, bus::Error>(async_nats::jetstream::consumer::pull::Config {
            // A bot gone for good does not keep its consumer forever; what waits for it stays
            // in the (work-queue) stream, and a new consumer delivers it.
            inactive_threshold: hub.settings.forget_bot_after,
            ..bus::durable(
                &hub.names.gateway_consumer(platform, bot_id)?,
                hub.names.chat_out(platform, bot_id)?,
                // A bot has `gateway.send_timeout` to confirm; a message pulled by a gateway
                // that died meanwhile goes to the next one soon after.
                hub.settings.send_timeout + Duration::from_secs(5),
                -1,
            )
        })
    })()
    .map_err(Opened::Never)?;
    bus::ensure_consumer(&hub.js, &hub.names.chat_out_stream(), config)
        .await
        .map_err(Opened::NotNow)
}

/// The most a message put off by an app ([`crate::http::AckJson::later_ms`]) is held, from when
/// it was first published: as long as the stream keeps one that no bot took.
pub const HELD_AT_MOST: Duration = bus::CHAT_OUT_MAX_AGE;

/// When a message put off was first published, in seconds since the epoch, on its copies.
const HELD_SINCE_HEADER: &str = "Hark-Held-Since";

/// What became of a message put off once more than its attempts allow.
#[derive(Debug)]
pub enum Held {
    /// A copy of it is in the stream, and will be handed out from its first attempt.
    Again,
    /// It was held longer than [`HELD_AT_MOST`]: set it aside, for this reason.
    TooLong(String),
}

/// Puts a copy of `stored`, a message of `CHAT_OUT` read back, at the end of its stream, so that
/// it is handed out again from its first attempt; the caller then acknowledges the original.
/// A copy published twice is stored once.
pub async fn hold_over(
    hub: &Hub,
    stored: &async_nats::jetstream::message::StreamMessage,
) -> Result<Held, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let since = stored
        .headers
        .get(HELD_SINCE_HEADER)
        .and_then(|v| v.as_str().parse::<u64>().ok())
        .unwrap_or_else(|| u64::try_from(stored.time.unix_timestamp()).unwrap_or(now));
    let held = Duration::from_secs(now.saturating_sub(since));
    if held > HELD_AT_MOST {
        return Ok(Held::TooLong(format!(
            "put off by the app for {} days and never sent",
            held.as_secs() / 86_400
        )));
    }
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HELD_SINCE_HEADER, since.to_string().as_str());
    let copy = publish::Outgoing {
        subject: stored.subject.to_string(),
        msg_id: &format!("held:{}", stored.sequence),
        payload: stored.payload.clone(),
        trace: stored
            .headers
            .get(hark_core::trace::HEADER)
            .map(|v| v.as_str()),
    };
    publish::send_with_headers(&hub.js, copy, headers)
        .await
        .map_err(|e| e.to_string())?
        .acked()
        .await
        .map_err(|e| e.to_string())?;
    Ok(Held::Again)
}

/// Reports the platform's id of a delivered question's message, so that a quote of it finds the
/// question.
pub async fn report_receipt(hub: &Hub, outbound_id: &str, question_id: &str, platform_id: String) {
    let receipt = pb::DeliveryReceipt {
        outbound_id: outbound_id.to_owned(),
        question_id: question_id.to_owned(),
        platform_message_id: platform_id,
        ..Default::default()
    };
    publish_receipt(hub, receipt, outbound_id.to_owned()).await;
}

/// Reports that a question's message was set aside, never delivered, and why: whoever reads the
/// question learns that nobody in its chat saw it.
pub async fn report_undelivered(hub: &Hub, outbound_id: &str, question_id: &str, reason: &str) {
    let receipt = pb::DeliveryReceipt {
        outbound_id: outbound_id.to_owned(),
        question_id: question_id.to_owned(),
        failed: reason.to_owned(),
        ..Default::default()
    };
    publish_receipt(hub, receipt, format!("{outbound_id}.undelivered")).await;
}

async fn publish_receipt(hub: &Hub, receipt: pb::DeliveryReceipt, msg_id: String) {
    if receipt.question_id.is_empty() {
        return;
    }
    let receipt = publish::Outgoing {
        subject: hub.names.chat_receipt(),
        msg_id: &msg_id,
        payload: codec::encode(receipt),
        trace: None,
    };
    if let Err(e) = publish::publish(&hub.js, receipt).await {
        tracing::warn!(error = %e, "cannot report how a question's message was delivered");
    }
}

/// Forgets a bot's outbound consumer in the gateway's liveness once its delivery ends.
struct Forget<'a>(&'a Hub, &'a str);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.liveness.forget(self.1);
    }
}

/// Keeps a message that can never be delivered in the dead-letter stream, then terminates it;
/// one that cannot be kept yet comes back later.
pub(crate) async fn set_aside(hub: &Hub, message: &Message, reason: &str) {
    hub.dead
        .set_aside(SOURCE, message, reason, Duration::from_secs(5))
        .await;
}

/// Acknowledges a sent message, again while the server does not confirm it (during a leader
/// election), until it would be delivered again anyway.
async fn confirm(message: &Message) {
    for wait in [100, 250, 500, 1_000, 2_000, 4_000] {
        match message.double_ack().await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "a sent message's ack was not confirmed; acknowledging again");
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }
    }
    consume::settle(message, SOURCE, Settle::Confirmed).await;
}

/// Delivers one message; returns false when the bot went offline.
async fn handle<P: Platform>(hub: &Hub, message: &Message, sender: &P) -> bool {
    let outbound: pb::OutboundMessage = match codec::decode(&message.payload) {
        Ok(m) => m,
        Err(e) => {
            set_aside(hub, message, &format!("undecodable outbound message: {e}")).await;
            return true;
        }
    };
    let attempt = message.info().map_or(1, |i| i.delivered as u64);
    let platform = outbound
        .route
        .as_ref()
        .map(|r| r.platform.as_str())
        .unwrap_or_default();
    let metrics = &hub.metrics;
    if let Some(platform_id) = hub.sent.sent(&outbound.id) {
        // Sent, but its ack was lost (as in a JetStream leader election): not posted again. Its
        // receipt is reported again, as it may have been lost the same way (JetStream drops the
        // copy by its id).
        tracing::info!(
            id = outbound.id,
            attempt,
            "an outbound message already sent came again; acknowledging it"
        );
        confirm(message).await;
        if let Some(platform_id) = platform_id {
            report_receipt(hub, &outbound.id, &outbound.question_id, platform_id).await;
        }
        return true;
    }
    match sender.send(outbound.clone()).await {
        Ok(platform_id) => {
            metrics.outbound.of(platform).inc();
            hub.sent.remember(&outbound.id, platform_id.clone());
            confirm(message).await;
            if let Some(platform_id) = platform_id {
                report_receipt(hub, &outbound.id, &outbound.question_id, platform_id).await;
            }
            true
        }
        Err(SendError::Offline) => {
            consume::settle(message, SOURCE, Settle::Again).await;
            false
        }
        Err(SendError::Retry(reason)) if attempt >= MAX_ATTEMPTS => {
            metrics.given_up.of(platform).inc();
            tracing::error!(
                id = outbound.id,
                attempt,
                reason,
                "giving up on an outbound message after {MAX_ATTEMPTS} attempts"
            );
            let reason = format!("the platform refused it {attempt} times, last: {reason}");
            set_aside(hub, message, &reason).await;
            report_undelivered(hub, &outbound.id, &outbound.question_id, &reason).await;
            true
        }
        Err(SendError::Retry(reason)) => {
            metrics.send_failures.of(platform).inc();
            tracing::warn!(
                id = outbound.id,
                attempt,
                reason,
                "sending failed; will retry"
            );
            consume::settle(message, SOURCE, Settle::Retry).await;
            true
        }
    }
}
