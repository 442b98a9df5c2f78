//! Reliable delivery of `CHAT_OUT` messages: one durable consumer per bot, pulled only by the
//! gateway that holds the bot, so messages for an offline bot wait in the stream. A message is
//! acknowledged only after the platform confirmed it; failures are retried with backoff, then
//! given up with an error line.

use std::{future::Future, sync::Arc, time::Duration};

use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use hark_core::{bus, codec};
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::onebot::conn::{ActionError, Bot, Hub};

/// Attempts before a message is given up.
pub const MAX_ATTEMPTS: u64 = 8;

/// Why a send did not go through.
#[derive(Debug)]
pub enum SendError {
    /// Try again later, after a backoff.
    Retry(String),
    /// The bot went away: deliver when it is back.
    Offline,
}

/// Delivers the outbound messages of one bot with `send` until `closed`. `send` returns the
/// platform's message id when it reports one.
pub async fn run<F, Fut>(
    hub: Arc<Hub>,
    platform: String,
    bot_id: String,
    closed: CancellationToken,
    send: F,
) where
    F: Fn(pb::OutboundMessage) -> Fut,
    Fut: Future<Output = Result<Option<String>, SendError>>,
{
    let consumer = loop {
        let config = (|| {
            Ok::<_, bus::Error>(bus::durable(
                &hub.names.gateway_consumer(&platform, &bot_id)?,
                hub.names.chat_out(&platform, &bot_id)?,
                // A bot has `gateway.send_timeout` to confirm; a message pulled by a gateway
                // that died meanwhile goes to the next one soon after.
                hub.settings.send_timeout + Duration::from_secs(5),
                -1,
            ))
        })();
        let config = match config {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "this bot's messages cannot be delivered");
                return;
            }
        };
        match bus::ensure_consumer(&hub.js, &hub.names.chat_out_stream(), config).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the outbound consumer; retrying");
                tokio::select! {
                    _ = closed.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    loop {
        let batch = tokio::select! {
            _ = closed.cancelled() => return,
            batch = consumer.fetch().max_messages(1).expires(Duration::from_secs(5)).messages() => batch,
        };
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot pull outbound messages; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(message) = batch.next().await {
            match message {
                Ok(message) => {
                    let trace = hark_core::trace::from_headers(message.headers.as_ref());
                    if !hark_core::trace::scope(trace, handle(&hub, &message, &send)).await {
                        return;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pull failed"),
            }
        }
    }
}

/// Delivers one message; returns false when the bot went offline.
async fn handle<F, Fut>(hub: &Hub, message: &Message, send: &F) -> bool
where
    F: Fn(pb::OutboundMessage) -> Fut,
    Fut: Future<Output = Result<Option<String>, SendError>>,
{
    let outbound: pb::OutboundMessage = match codec::decode(&message.payload) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "dropping an undecodable outbound message");
            let _ = message.ack_with(AckKind::Term).await;
            return true;
        }
    };
    let attempt = message.info().map_or(1, |i| i.delivered as u64);
    match send(outbound.clone()).await {
        Ok(platform_id) => {
            if let Err(e) = message.double_ack().await {
                tracing::warn!(error = %e, "delivered, but the ack was not confirmed; it may be sent again");
            }
            if let Some(platform_id) = platform_id
                && !outbound.question_id.is_empty()
            {
                let receipt = pb::DeliveryReceipt {
                    outbound_id: outbound.id.clone(),
                    question_id: outbound.question_id.clone(),
                    platform_message_id: platform_id,
                    ..Default::default()
                };
                if let Err(e) = bus::publish(
                    &hub.js,
                    hub.names.chat_receipt(),
                    &outbound.id,
                    codec::encode(receipt),
                )
                .await
                {
                    tracing::warn!(error = %e, "cannot report a delivered question's message id");
                }
            }
            true
        }
        Err(SendError::Offline) => {
            let _ = message.ack_with(AckKind::Nak(None)).await;
            false
        }
        Err(SendError::Retry(reason)) if attempt >= MAX_ATTEMPTS => {
            tracing::error!(
                id = outbound.id,
                attempt,
                reason,
                "giving up on an outbound message after {MAX_ATTEMPTS} attempts"
            );
            let _ = message.ack_with(AckKind::Term).await;
            true
        }
        Err(SendError::Retry(reason)) => {
            let delay =
                Duration::from_secs(2u64.pow(attempt.min(6) as u32)).min(Duration::from_secs(30));
            tracing::warn!(
                id = outbound.id,
                attempt,
                reason,
                ?delay,
                "sending failed; will retry"
            );
            let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
            true
        }
    }
}

/// A OneBot id as the protocol expects it: a number when it is one.
pub fn onebot_id(id: &str) -> Value {
    id.parse::<i64>().map_or_else(|_| json!(id), |n| json!(n))
}

/// The OneBot action that sends `message`.
pub fn onebot_action(message: &pb::OutboundMessage) -> Result<(&'static str, Value), String> {
    let route = message.route.as_ref().ok_or("the message has no route")?;
    let (kind, target) = route
        .stream
        .split_once(':')
        .ok_or_else(|| format!("`{}` is not a stream", route.stream))?;
    let mut segments = Vec::new();
    if !message.reply_to_message_id.is_empty() {
        segments.push(json!({"type": "reply", "data": {"id": message.reply_to_message_id}}));
    }
    segments.push(json!({"type": "text", "data": {"text": message.text}}));
    match kind {
        "group" => Ok((
            "send_group_msg",
            json!({"group_id": onebot_id(target), "message": segments}),
        )),
        "private" => Ok((
            "send_private_msg",
            json!({"user_id": onebot_id(target), "message": segments}),
        )),
        other => Err(format!("OneBot cannot send to a `{other}` stream")),
    }
}

/// Delivers the messages of a OneBot bot while its connection lasts.
pub async fn deliver(hub: Arc<Hub>, bot: Arc<Bot>) {
    let timeout = hub.settings.send_timeout;
    let (platform, self_id, closed) = (
        bot.platform.clone(),
        bot.self_id.clone(),
        bot.closed.clone(),
    );
    run(hub, platform, self_id, closed, move |message| {
        let bot = bot.clone();
        async move {
            let (action, params) = match onebot_action(&message) {
                Ok(a) => a,
                Err(e) => return Err(SendError::Retry(e)),
            };
            match bot.call(action, params, timeout).await {
                Ok(data) => Ok(data.get("message_id").and_then(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })),
                Err(ActionError::Disconnected { .. }) => Err(SendError::Offline),
                Err(e) => Err(SendError::Retry(e.to_string())),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_reply_becomes_send_group_msg_with_a_reply_segment() {
        let message = pb::OutboundMessage {
            route: Some(pb::ChatRoute {
                platform: "qq".into(),
                bot_id: "42".into(),
                stream: "group:777".into(),
                origin_message_id: String::new(),
            }),
            text: "hi".into(),
            reply_to_message_id: "-5".into(),
            ..Default::default()
        };
        let (action, params) = onebot_action(&message).expect("action");
        assert_eq!(action, "send_group_msg");
        assert_eq!(params["group_id"], json!(777));
        assert_eq!(
            params["message"][0],
            json!({"type": "reply", "data": {"id": "-5"}})
        );
        assert_eq!(params["message"][1]["data"]["text"], "hi");
    }
}
