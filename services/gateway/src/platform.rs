//! The seam between hark and a chat platform.
//!
//! A platform does two things of its own: it turns what it delivers into hark's
//! [`pb::ChatMessage`] ([`Platform::normalise`], pure), and it sends hark's
//! [`pb::OutboundMessage`]s, saying which id the platform gave each ([`Platform::send`]). All the
//! rest is the gateway's, the same for every platform: the spool that makes a received message
//! durable before anything else ([`crate::inbound::ingest`]), JetStream with its deduplication
//! key, one durable consumer per bot with retries and backoff, and the receipt that lets a quote
//! of a question find it ([`crate::outbound::run`]).
//!
//! OneBot v11 ([`crate::onebot::platform::OneBot`]) and the HTTP adapter
//! ([`crate::http::Adapter`]) implement it. Another platform (Telegram, Feishu, WeCom) is one
//! module implementing it, its config section, and the line in [`crate::app`] that starts its
//! connections; nothing else in the gateway, and nothing in the other services, changes.

use futures_util::future::BoxFuture;
use hark_proto::v1 as pb;

/// What a platform delivered, normalised.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound<O> {
    /// A chat message for hark.
    Message(Box<pb::ChatMessage>),
    /// Something that is not a chat message but means something to the platform's own
    /// connection (OneBot's answers to actions, its heartbeats).
    Other(O),
}

/// Why a send did not go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Try again later, after a backoff.
    Retry(String),
    /// The bot went away: deliver when it is back.
    Offline,
}

/// A chat platform, as the gateway needs it.
pub trait Platform: Send + Sync + 'static {
    /// One delivery from the platform: a OneBot frame's text, an HTTP adapter request's body.
    type Delivery: ?Sized;
    /// What a delivery is when it is no chat message; [`std::convert::Infallible`] for a
    /// platform that delivers only messages.
    type Other;
    /// Why a delivery was refused, said to whoever sent it.
    type Refusal: std::fmt::Display;

    /// Turns one delivery into a chat message, or into what else it is. Pure: no I/O, and no
    /// input makes it panic. A delivery that speaks for another bot than the one it came from
    /// is refused here.
    fn normalise(&self, delivery: &Self::Delivery) -> Result<Inbound<Self::Other>, Self::Refusal>;

    /// Sends one message to its route's chat. Returns the platform's id of the sent message
    /// when the platform reports one: a later quote of a question is matched by it.
    fn send(
        &self,
        message: pb::OutboundMessage,
    ) -> BoxFuture<'_, Result<Option<String>, SendError>>;

    /// Completes what a normalised message could not say by itself before it is spooled. Most
    /// platforms deliver a quoted message's text and author with the message; OneBot asks its
    /// bot for them.
    fn complete<'a>(&'a self, message: &'a mut pb::ChatMessage) -> BoxFuture<'a, ()> {
        let _ = message;
        Box::pin(async {})
    }
}

/// The route of a message to `stream` of `bot` on `platform`.
pub fn route(platform: &str, bot: &str, stream: &str) -> pb::ChatRoute {
    pb::ChatRoute {
        platform: platform.to_owned(),
        bot_id: bot.to_owned(),
        stream: stream.to_owned(),
        origin_message_id: String::new(),
    }
}

/// A platform's id of a message as its JSON gives it: a string, or a number.
pub fn message_id(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `message` as received now: stamped with the wire version, and with the time the gateway read
/// it (for platforms that give no time of their own).
pub fn received(message: pb::ChatMessage) -> pb::ChatMessage {
    let received = now();
    pb::ChatMessage {
        version: hark_proto::WIRE_VERSION,
        time: Some(prost_types::Timestamp {
            seconds: received.seconds,
            nanos: 0,
        }),
        received_at: Some(received),
        ..message
    }
}

/// The time now, as a message's `received_at`.
pub fn now() -> prost_types::Timestamp {
    let now = time::OffsetDateTime::now_utc();
    prost_types::Timestamp {
        seconds: now.unix_timestamp(),
        nanos: now.nanosecond() as i32,
    }
}

/// Sends `request` to a platform's HTTP API (a webhook, LangBot's, a Satori server's) and returns
/// the JSON it answered (`null` when it answered none). `what` names the API in the error, e.g.
/// `LangBot at http://…` (its address redacted); every failure is worth retrying.
pub async fn call_api(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<serde_json::Value, SendError> {
    let response = request
        .send()
        .await
        .map_err(|e| SendError::Retry(format!("{what}: {}", e.without_url())))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(SendError::Retry(format!(
            "{what} answered {status}: {}",
            body.chars().take(200).collect::<String>()
        )));
    }
    Ok(response.json().await.unwrap_or(serde_json::Value::Null))
}
