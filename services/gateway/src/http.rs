//! The generic HTTP adapter, for apps that are not OneBot bots.
//!
//! Inbound: `POST /api/v1/messages` with a normalised message as JSON. Outbound, for the bots
//! named in `gateway.http.bots`: POSTed to `gateway.http.webhook_url` (retried until the app
//! answers 2xx), or, without a webhook, streamed to clients of `GET /api/v1/stream` as
//! server-sent events while at least one is connected.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
};

use async_nats::jetstream::AckKind;
use axum::{
    Json,
    body::Bytes,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use hark_core::{
    bus,
    domain::{StreamId, ids},
    secret::Secret,
};
use hark_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::{
    hub::Hub,
    outbound,
    platform::{Inbound, Platform, SendError},
};

/// An inbound message as an app sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboundJson {
    pub platform: String,
    pub bot_id: String,
    /// `group:<id>` or `private:<user id>`.
    pub stream: String,
    pub sender: SenderJson,
    pub text: String,
    /// The app's id of this message; a message sent twice with one id is applied once.
    pub message_id: String,
    #[serde(default)]
    pub quoted_message_id: String,
    /// The text and the author (user id) of the quoted message, when the app knows them.
    #[serde(default)]
    pub quoted_text: String,
    #[serde(default)]
    pub quoted_sender: String,
    #[serde(default)]
    pub mentions: Vec<String>,
    #[serde(default)]
    pub mentions_bot: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderJson {
    pub user_id: String,
    #[serde(default)]
    pub nickname: String,
}

/// An outbound message as the webhook and the stream carry it.
#[derive(Debug, Clone, Serialize)]
pub struct OutboundJson {
    pub id: String,
    pub platform: String,
    pub bot_id: String,
    pub stream: String,
    pub text: String,
    pub reply_to_message_id: String,
    pub question_id: String,
}

impl From<&pb::OutboundMessage> for OutboundJson {
    fn from(m: &pb::OutboundMessage) -> Self {
        let route = m.route.clone().unwrap_or_default();
        Self {
            id: m.id.clone(),
            platform: route.platform,
            bot_id: route.bot_id,
            stream: route.stream,
            text: m.text.clone(),
            reply_to_message_id: m.reply_to_message_id.clone(),
            question_id: m.question_id.clone(),
        }
    }
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn check_token(hub: &Hub, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let expected = &hub.settings.http_token;
    if expected.is_empty() {
        return loopback_only(headers);
    }
    if crate::bearer(headers).is_some_and(|given| expected.matches(given)) {
        Ok(())
    } else {
        Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "wrong or missing token: send Authorization: Bearer <gateway.http.token>",
        )))
    }
}

/// Without a token the adapter listens on loopback only; what still reaches it there is a web
/// page the developer opened. Such a page can send no `Content-Type: application/json` across
/// sites without a preflight the adapter never answers, and a DNS-rebound name arrives with its
/// own `Host`: so a token-less adapter takes requests for loopback names only, and JSON only.
pub(crate) fn loopback_only(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !hark_core::config::loopback_host(host) {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            format!(
                "Host `{}` is not a loopback name: without gateway.http.token the HTTP adapter \
                 answers only requests for 127.0.0.1, [::1] or localhost; set the token to serve \
                 other names",
                hark_core::domain::ids::shown(host)
            ),
        )));
    }
    Ok(())
}

/// A body of any other type than JSON is refused: see [`loopback_only`].
fn json_only(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if json {
        Ok(())
    } else {
        Err(Box::new(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be sent as Content-Type: application/json",
        )))
    }
}

/// The HTTP adapter as a [`Platform`]: it speaks for the platforms of `gateway.http.platforms`,
/// and sends the messages of the bots of `gateway.http.bots` to the webhook or, without one, to
/// the clients of the outbound stream.
#[derive(Debug)]
pub struct Adapter {
    platforms: Vec<String>,
    /// The bots of `gateway.http.bots`: the only ones a message may be for, since no other's
    /// replies would ever be delivered.
    bots: Vec<(String, String)>,
    webhook: Option<Webhook>,
    /// Subscribers of the outbound stream, per bot.
    streams: Streams,
}

#[derive(Debug)]
struct Webhook {
    /// `None` when no client could be built; every send then says why.
    client: Option<reqwest::Client>,
    url: String,
    token: Secret,
}

/// Why the adapter refused a message: the status to answer with, and what to tell the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Adapter {
    pub fn new(settings: &crate::Settings) -> Self {
        let webhook = (!settings.webhook_url.is_empty()).then(|| Webhook {
            client: reqwest::Client::builder()
                .timeout(settings.send_timeout)
                .build()
                .inspect_err(|e| tracing::error!(error = %e, "cannot build the webhook client"))
                .ok(),
            url: settings.webhook_url.clone(),
            token: settings.http_token.clone(),
        });
        Self {
            platforms: settings.http_platforms.clone(),
            bots: settings.http_bots.clone(),
            webhook,
            streams: Streams::default(),
        }
    }
}

impl Platform for Adapter {
    type Delivery = [u8];
    type Other = Infallible;
    type Refusal = Refusal;

    fn normalise(&self, body: &[u8]) -> Result<Inbound<Infallible>, Refusal> {
        let refuse = |status, message: String| Refusal { status, message };
        let field =
            |name: &str, why: String| refuse(StatusCode::BAD_REQUEST, format!("{name}: {why}"));
        let inbound: InboundJson = serde_json::from_slice(body).map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("the body is not a valid message: {e}"),
            )
        })?;
        bus::token(&inbound.platform).map_err(|e| field("platform", e.to_string()))?;
        // The adapter speaks only for its own platforms: never as a OneBot bot's user.
        if !self.platforms.contains(&inbound.platform) {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "platform: `{}` is not one of gateway.http.platforms ({}); this adapter does not speak for it",
                    hark_core::domain::ids::shown(&inbound.platform),
                    self.platforms.join(", ")
                ),
            ));
        }
        ids::bot_id("bot_id", &inbound.bot_id).map_err(|e| field("bot_id", e.to_string()))?;
        if !self
            .bots
            .iter()
            .any(|(p, b)| *p == inbound.platform && *b == inbound.bot_id)
        {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "bot_id: `{}:{}` is not one of gateway.http.bots, so its replies would never be \
                     delivered; add it there",
                    inbound.platform, inbound.bot_id
                ),
            ));
        }
        inbound
            .stream
            .parse::<StreamId>()
            .map_err(|e| field("stream", e.to_string()))?;
        if inbound.sender.user_id.trim().is_empty() {
            return Err(field("sender.user_id", "must not be empty".into()));
        }
        ids::chat_id("sender.user_id", &inbound.sender.user_id)
            .map_err(|e| field("sender.user_id", e.to_string()))?;
        if inbound.message_id.trim().is_empty() {
            return Err(field(
                "message_id",
                "must not be empty: it is how duplicates are dropped".into(),
            ));
        }
        ids::chat_id("message_id", &inbound.message_id)
            .map_err(|e| field("message_id", e.to_string()))?;
        if !inbound.quoted_message_id.is_empty() {
            ids::chat_id("quoted_message_id", &inbound.quoted_message_id)
                .map_err(|e| field("quoted_message_id", e.to_string()))?;
        }
        Ok(Inbound::Message(Box::new(crate::platform::received(
            pb::ChatMessage {
                platform: inbound.platform,
                bot_id: inbound.bot_id,
                stream: inbound.stream,
                sender: Some(pb::Sender {
                    user_id: inbound.sender.user_id,
                    nickname: inbound.sender.nickname,
                }),
                text: inbound.text,
                quoted_message_id: inbound.quoted_message_id,
                quoted_text: inbound.quoted_text,
                quoted_sender: inbound.quoted_sender,
                mentions: inbound.mentions,
                mentions_bot: inbound.mentions_bot,
                message_id: inbound.message_id,
                ..Default::default()
            },
        ))))
    }

    fn send(
        &self,
        message: pb::OutboundMessage,
    ) -> BoxFuture<'_, Result<Option<String>, SendError>> {
        Box::pin(async move {
            let Some(webhook) = &self.webhook else {
                return self.streams.send(&message);
            };
            let url = &webhook.url;
            let shown = hark_core::secret::redact_url(url);
            let client = webhook.client.as_ref().ok_or_else(|| {
                SendError::Retry(format!(
                    "no HTTP client for the webhook {shown} (see the error at startup)"
                ))
            })?;
            let mut request = client.post(url).json(&OutboundJson::from(&message));
            if !webhook.token.is_empty() {
                request = request.bearer_auth(webhook.token.expose());
            }
            let body = crate::platform::call_api(request, &format!("webhook {shown}")).await?;
            Ok(crate::platform::message_id(body.get("message_id")))
        })
    }
}

/// What the HTTP adapter's requests share: the gateway's hub, and the adapter.
#[derive(Debug, Clone)]
pub struct Door {
    pub hub: Arc<Hub>,
    pub adapter: Arc<Adapter>,
}

impl Door {
    pub fn new(hub: Arc<Hub>) -> Self {
        let adapter = Arc::new(Adapter::new(&hub.settings));
        Self { hub, adapter }
    }
}

/// `POST /api/v1/messages?wait_ms=…`.
#[derive(Debug, Default, Deserialize)]
pub struct PostQuery {
    /// How long to wait for hark's verdict on the message (whether it took it), in
    /// milliseconds, at most [`MAX_VERDICT_WAIT`]; 0, the default: answer once it is accepted.
    #[serde(default)]
    pub wait_ms: u64,
}

/// The longest a sender may wait for a message's verdict.
pub const MAX_VERDICT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `POST /api/v1/messages`: 202 once JetStream has the message. With `wait_ms`, 200 and hark's
/// verdict when it comes within that time: `taken` (an answer, a command, or a hint hark
/// replied with: the sender's other handlers should leave the message alone) and `as`.
pub async fn post_message(
    State(door): State<Door>,
    Query(query): Query<PostQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hub = &door.hub;
    if let Err(response) = check_token(hub, &headers).and_then(|()| json_only(&headers)) {
        return *response;
    }
    let message = match door.adapter.normalise(&body) {
        Ok(Inbound::Message(message)) => message,
        Err(refusal) => return error(refusal.status, refusal.message),
    };
    // A client that traces its requests continues its trace through hark.
    let trace = headers
        .get(hark_core::trace::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(hark_core::trace::TraceContext::parse);
    let wait = std::time::Duration::from_millis(query.wait_ms).min(MAX_VERDICT_WAIT);
    let posted = match crate::inbound::publish_for_verdict(hub, *message, trace, wait).await {
        Ok(posted) => posted,
        Err(e) => {
            tracing::warn!(error = %e, "an HTTP adapter message was not taken: NATS does not answer");
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "hark cannot take messages right now (its message bus does not answer); send it again with the same message_id",
            );
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("5"));
            return response;
        }
    };
    // Accepted only once JetStream has it: a 202 is a promise.
    let mut body = json!({"accepted": true, "taken": null});
    if posted.duplicate {
        body["duplicate"] = json!(true);
    }
    match posted.verdict {
        Some(verdict) => {
            body["taken"] = json!(verdict.taken);
            body["as"] = json!(verdict.kind);
            (StatusCode::OK, Json(body)).into_response()
        }
        // No verdict in time: the message is hark's all the same, and handled when it can be.
        None => (StatusCode::ACCEPTED, Json(body)).into_response(),
    }
}

/// Stream subscribers per HTTP bot, and the delivery loop that runs while there are any.
#[derive(Debug, Default)]
pub struct Streams {
    bots: Mutex<HashMap<(String, String), StreamBot>>,
}

#[derive(Debug)]
struct StreamBot {
    tx: broadcast::Sender<OutboundJson>,
    subscribers: usize,
    delivering: CancellationToken,
}

impl Streams {
    /// Hands `message` to the subscribers of its bot's stream; offline when there are none.
    fn send(&self, message: &pb::OutboundMessage) -> Result<Option<String>, SendError> {
        let route = message.route.clone().unwrap_or_default();
        let tx = self
            .bots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(route.platform, route.bot_id))
            .map(|bot| bot.tx.clone());
        match tx {
            Some(tx) if tx.send(OutboundJson::from(message)).is_ok() => Ok(None),
            _ => Err(SendError::Offline),
        }
    }
}

/// Drops a subscription when its SSE stream ends.
struct Subscription {
    adapter: Arc<Adapter>,
    key: (String, String),
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut bots = self
            .adapter
            .streams
            .bots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(bot) = bots.get_mut(&self.key) {
            bot.subscribers -= 1;
            if bot.subscribers == 0 {
                bot.delivering.cancel();
                bots.remove(&self.key);
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct StreamQuery {
    pub platform: String,
    pub bot_id: String,
}

/// `GET /api/v1/stream?platform=…&bot_id=…`: outbound messages as server-sent events.
pub async fn stream(
    State(door): State<Door>,
    headers: HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Response> {
    let hub = &door.hub;
    check_token(hub, &headers).map_err(|r| *r)?;
    let key = (query.platform.clone(), query.bot_id.clone());
    if !hub.settings.http_bots.contains(&key) {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "{}:{} is not in gateway.http.bots",
                query.platform, query.bot_id
            ),
        ));
    }
    if !hub.settings.webhook_url.is_empty() {
        return Err(error(
            StatusCode::CONFLICT,
            "outbound messages go to gateway.http.webhook_url; the stream is off",
        ));
    }
    let rx = {
        let mut bots = door
            .adapter
            .streams
            .bots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let bot = bots.entry(key.clone()).or_insert_with(|| StreamBot {
            tx: broadcast::channel(256).0,
            subscribers: 0,
            delivering: hub.shutdown.child_token(),
        });
        bot.subscribers += 1;
        let rx = bot.tx.subscribe();
        if bot.subscribers == 1 {
            tokio::spawn(outbound::run(
                hub.clone(),
                door.adapter.clone(),
                key.0.clone(),
                key.1.clone(),
                bot.delivering.clone(),
            ));
        }
        rx
    };
    let guard = Subscription {
        adapter: door.adapter.clone(),
        key,
    };
    let events = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |item| {
        let _keep = &guard;
        async move {
            let message = item.ok()?;
            let data = serde_json::to_string(&message).ok()?;
            Some(Ok(Event::default().event("message").data(data)))
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Delivers one HTTP bot's messages to the webhook until shutdown.
pub async fn webhook(door: Door, platform: String, bot_id: String) {
    let closed = door.hub.shutdown.clone();
    outbound::run(door.hub, door.adapter, platform, bot_id, closed).await;
}

/// `GET /api/v1/outbound?platform=…&bot_id=…&wait_ms=…&max=…`.
#[derive(Debug, Deserialize)]
pub struct PullQuery {
    pub platform: String,
    pub bot_id: String,
    /// How long to wait for a first message, in milliseconds, at most [`MAX_PULL_WAIT`].
    #[serde(default)]
    pub wait_ms: u64,
    /// The most messages one answer holds, 1 to 100 (default 20).
    #[serde(default)]
    pub max: Option<usize>,
}

/// The longest a pull waits for a first message.
pub const MAX_PULL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A pulled outbound message: what the stream carries, and the token that acknowledges it.
#[derive(Debug, Serialize)]
pub struct PulledJson {
    #[serde(flatten)]
    pub message: OutboundJson,
    /// Given back to `POST /api/v1/outbound/ack` once the message is sent; a message not
    /// acknowledged within `gateway.send_timeout` + 5 s is pulled again.
    pub ack: String,
    /// How many times this message was handed out, this time included. One handed out
    /// [`outbound::MAX_ATTEMPTS`] times and never sent is set aside instead of a further time.
    pub attempt: u64,
}

/// The bot a pull or an acknowledgement is for, checked: one of `gateway.http.bots`, delivered
/// by pulling (no webhook).
fn pulled_bot(hub: &Hub, platform: &str, bot_id: &str) -> Result<(), Box<Response>> {
    if !hub
        .settings
        .http_bots
        .iter()
        .any(|(p, b)| p == platform && b == bot_id)
    {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "{}:{} is not in gateway.http.bots",
                ids::shown(platform),
                ids::shown(bot_id)
            ),
        )));
    }
    if !hub.settings.webhook_url.is_empty() {
        return Err(Box::new(error(
            StatusCode::CONFLICT,
            "outbound messages go to gateway.http.webhook_url; there is nothing to pull",
        )));
    }
    Ok(())
}

/// `GET /api/v1/outbound`: the bot's pending outbound messages, oldest first, each with the
/// token that acknowledges it. A message stays hark's until it is acknowledged: one pulled and
/// never acknowledged (the app died before sending it) is pulled again after the bot's
/// acknowledgement wait, by whichever gateway replica is asked.
pub async fn pull(
    State(door): State<Door>,
    headers: HeaderMap,
    Query(query): Query<PullQuery>,
) -> Response {
    let hub = &door.hub;
    if let Err(response) = check_token(hub, &headers) {
        return *response;
    }
    if let Err(response) = pulled_bot(hub, &query.platform, &query.bot_id) {
        return *response;
    }
    let max = query.max.unwrap_or(20).clamp(1, 100);
    let wait = std::time::Duration::from_millis(query.wait_ms)
        .clamp(std::time::Duration::from_millis(10), MAX_PULL_WAIT);
    let unavailable = |why: String| {
        tracing::warn!(why, "cannot pull outbound messages");
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("hark cannot hand out messages right now ({why}); ask again"),
        );
        response
            .headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        response
    };
    let consumer = match outbound::consumer(hub, &query.platform, &query.bot_id).await {
        Ok(c) => c,
        Err(outbound::Opened::Never(e)) => return error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(outbound::Opened::NotNow(e)) => return unavailable(e.to_string()),
    };
    let batch = consumer
        .fetch()
        .max_messages(max)
        .expires(wait)
        .messages()
        .await;
    let mut batch = match batch {
        Ok(b) => b,
        Err(e) => return unavailable(e.to_string()),
    };
    let mut pulled = Vec::new();
    while let Some(message) = batch.next().await {
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "a pull ended early");
                break;
            }
        };
        let Some(reply) = message.reply.as_ref().map(|r| r.to_string()) else {
            continue;
        };
        let outbound: pb::OutboundMessage = match hark_core::codec::decode(&message.payload) {
            Ok(m) => m,
            Err(e) => {
                outbound::set_aside(hub, &message, &format!("undecodable outbound message: {e}"))
                    .await;
                continue;
            }
        };
        let attempt = message.info().map_or(1, |i| i.delivered.max(1) as u64);
        if attempt > outbound::MAX_ATTEMPTS {
            // Handed out that often and never sent: the app cannot send it (it fails on it,
            // or stops on it), and it would keep coming back.
            hub.metrics.given_up.of(&query.platform).inc();
            let reason = format!(
                "handed out {} times to {}:{} and never acknowledged",
                attempt - 1,
                query.platform,
                query.bot_id
            );
            tracing::error!(
                id = outbound.id,
                reason,
                "setting an outbound message aside"
            );
            outbound::set_aside(hub, &message, &reason).await;
            outbound::report_undelivered(hub, &outbound.id, &outbound.question_id, &reason).await;
            continue;
        }
        let ack = AckToken {
            reply,
            id: outbound.id.clone(),
            question_id: outbound.question_id.clone(),
        }
        .to_string();
        pulled.push(PulledJson {
            message: OutboundJson::from(&outbound),
            ack,
            attempt,
        });
    }
    Json(json!({"messages": pulled})).into_response()
}

/// What an acknowledgement token carries: the JetStream acknowledgement subject of the pulled
/// delivery, and what the receipt of a delivered question needs.
#[derive(Debug, PartialEq, Eq)]
struct AckToken {
    reply: String,
    id: String,
    question_id: String,
}

impl std::fmt::Display for AckToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.reply, self.id, self.question_id)
    }
}

impl AckToken {
    /// Reads a token given back by an app, only when it acknowledges a delivery of the
    /// consumer `consumer` of the stream `stream`: an app speaks only for its own bot.
    fn parse(token: &str, stream: &str, consumer: &str) -> Option<Self> {
        let mut parts = token.splitn(3, ' ');
        let reply = parts.next()?;
        let id = parts.next().unwrap_or_default();
        let question_id = parts.next().unwrap_or_default();
        let tokens: Vec<&str> = reply.split('.').collect();
        let ours = tokens.len() >= 9
            && tokens[0] == "$JS"
            && tokens[1] == "ACK"
            && tokens
                .windows(2)
                .any(|pair| pair[0] == stream && pair[1] == consumer)
            && !reply
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '*' | '>'));
        ours.then(|| Self {
            reply: reply.to_owned(),
            id: id.to_owned(),
            question_id: question_id.to_owned(),
        })
    }

    /// How many times the delivery was handed out and the message's place in the stream, read
    /// from the acknowledgement subject: `…<stream>.<consumer>.<delivered>.<stream sequence>.…`.
    fn delivery(&self, stream: &str, consumer: &str) -> Option<(u64, u64)> {
        let tokens: Vec<&str> = self.reply.split('.').collect();
        let at = tokens
            .windows(2)
            .position(|pair| pair[0] == stream && pair[1] == consumer)?;
        let delivered = tokens.get(at + 2)?.parse().ok()?;
        let sequence = tokens.get(at + 3)?.parse().ok()?;
        Some((delivered, sequence))
    }
}

/// `POST /api/v1/outbound/ack`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcksJson {
    pub platform: String,
    pub bot_id: String,
    pub acks: Vec<AckJson>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckJson {
    pub ack: String,
    /// The platform's id of the sent message, when it gave one: a later quote of a question
    /// is matched by it.
    #[serde(default)]
    pub message_id: Option<Value>,
    /// The app could not send the message, and why. It is handed out again after a while, up
    /// to [`outbound::MAX_ATTEMPTS`] times in all, and then set aside with this reason.
    #[serde(default)]
    pub failed: Option<String>,
    /// With `failed`: `false` when sending it again cannot help (its chat does not exist for
    /// this bot, say), so it is set aside at once.
    #[serde(default)]
    pub retry: Option<bool>,
    /// Not sent, and not a failure: the app has nowhere to show it now (no page of its chat is
    /// open, say) and wants it handed out again after this many milliseconds, at most
    /// [`MAX_LATER`]. A message put off counts no attempt: it is never set aside for it, but
    /// one held for longer than the outbound stream keeps messages ([`outbound::HELD_AT_MOST`]).
    #[serde(default)]
    pub later_ms: Option<u64>,
}

/// The longest an app may put a message off at a time.
pub const MAX_LATER: std::time::Duration = std::time::Duration::from_secs(60);

/// The most of an app's reason for a message it could not send that is kept.
const MAX_FAILED_BYTES: usize = 500;

/// The most acknowledgements one request carries.
pub const MAX_ACKS: usize = 100;

/// How long an acknowledgement waits for JetStream to confirm it.
const ACK_CONFIRM: std::time::Duration = std::time::Duration::from_secs(5);

/// `POST /api/v1/outbound/ack`: the app sent these messages; they are not handed out again.
/// Answers which were confirmed: one not confirmed may be pulled again, and the app then
/// drops it by its `id`.
pub async fn ack(State(door): State<Door>, headers: HeaderMap, body: Bytes) -> Response {
    let hub = &door.hub;
    if let Err(response) = check_token(hub, &headers).and_then(|()| json_only(&headers)) {
        return *response;
    }
    let acks: AcksJson = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not a list of acknowledgements: {e}"),
            );
        }
    };
    if let Err(response) = pulled_bot(hub, &acks.platform, &acks.bot_id) {
        return *response;
    }
    if acks.acks.len() > MAX_ACKS {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "acks: {} acknowledgements in one request; send at most {MAX_ACKS}",
                acks.acks.len()
            ),
        );
    }
    let consumer = match hub.names.gateway_consumer(&acks.platform, &acks.bot_id) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let stream = hub.names.chat_out_stream();
    let mut tokens = Vec::with_capacity(acks.acks.len());
    for (i, entry) in acks.acks.iter().enumerate() {
        if let Some(later) = entry.later_ms {
            let verdicts = entry.failed.is_some() || entry.message_id.is_some();
            if verdicts || later > MAX_LATER.as_millis() as u64 {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "acks[{i}].later_ms: a delay of at most {} ms, and without `failed` or \
                         `message_id` (a message put off was neither sent nor failed)",
                        MAX_LATER.as_millis()
                    ),
                );
            }
        }
        match AckToken::parse(&entry.ack, &stream, &consumer) {
            Some(token) => tokens.push((token, entry)),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "acks[{i}].ack is not a token of a message pulled for {}:{}",
                        acks.platform, acks.bot_id
                    ),
                );
            }
        }
    }
    // Each is confirmed apart, all at once: one JetStream does not answer holds up no other.
    let platform = acks.platform.as_str();
    let (stream, consumer, acks) = (stream.as_str(), consumer.as_str(), &acks);
    let confirmed =
        futures_util::future::join_all(tokens.into_iter().map(|(token, entry)| async move {
            if let Some(failed) = &entry.failed {
                return not_sent(hub, acks, &token, (stream, consumer), failed, entry.retry).await;
            }
            if let Some(later) = entry.later_ms {
                let later = std::time::Duration::from_millis(later);
                return put_off(hub, acks, &token, (stream, consumer), later).await;
            }
            let ok = confirmed_ack(hub, &token.reply).await;
            if ok {
                hub.metrics.outbound.of(platform).inc();
                if let Some(platform_id) = crate::platform::message_id(entry.message_id.as_ref()) {
                    outbound::report_receipt(hub, &token.id, &token.question_id, platform_id).await;
                }
            } else {
                tracing::debug!(id = token.id, "an acknowledgement was not confirmed");
            }
            json!({"id": token.id, "acked": ok})
        }))
        .await;
    Json(json!({"acks": confirmed})).into_response()
}

/// A pulled message the app could not send: handed out again after a while, or set aside when
/// it was handed out [`outbound::MAX_ATTEMPTS`] times or `retry` is `false`.
async fn not_sent(
    hub: &Hub,
    acks: &AcksJson,
    token: &AckToken,
    (stream, consumer): (&str, &str),
    failed: &str,
    retry: Option<bool>,
) -> Value {
    let platform = acks.platform.as_str();
    let Some((attempt, sequence)) = token.delivery(stream, consumer) else {
        return json!({"id": token.id, "acked": false});
    };
    // What a person reads in a log line and a dead letter: one line, cut short.
    let mut failed = ids::one_line(failed);
    failed.truncate(hark_core::domain::text::floor_char_boundary(
        &failed,
        MAX_FAILED_BYTES,
    ));
    if retry != Some(false) && attempt < outbound::MAX_ATTEMPTS {
        hub.metrics.send_failures.of(platform).inc();
        tracing::warn!(
            id = token.id,
            attempt,
            reason = failed,
            "{platform}:{} could not send a message; it is handed out again",
            acks.bot_id
        );
        return again(hub, token, attempt).await;
    }
    hub.metrics.given_up.of(platform).inc();
    let reason = format!(
        "{platform}:{} could not send it (attempt {attempt}): {failed}",
        acks.bot_id
    );
    tracing::error!(id = token.id, reason, "setting an outbound message aside");
    let kept = async {
        let stored = read_pulled(hub, acks, sequence).await?;
        set_pulled_aside(hub, token, stored, &reason).await
    };
    match kept.await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, id = token.id, "cannot set a message aside; it comes back");
            again(hub, token, attempt).await
        }
    }
}

/// Keeps the pulled message `stored` in the dead letters for `reason`, lets its delivery go
/// and tells its question; the answer for the app.
async fn set_pulled_aside(
    hub: &Hub,
    token: &AckToken,
    stored: async_nats::jetstream::message::StreamMessage,
    reason: &str,
) -> Result<Value, String> {
    hub.dead
        .keep_stored(
            outbound::SOURCE,
            &hub.names.chat_out_stream(),
            stored,
            reason,
        )
        .await
        .map_err(|e| e.to_string())?;
    settle(hub, &token.reply, AckKind::Term).await;
    outbound::report_undelivered(hub, &token.id, &token.question_id, reason).await;
    Ok(json!({"id": token.id, "acked": true, "set_aside": true}))
}

/// A pulled message the app put off: handed out again after `later`. Its delivery is let go
/// while it has attempts to spare; the one that would be its last is replaced by a copy of the
/// message, which starts again from its first attempt.
async fn put_off(
    hub: &Hub,
    acks: &AcksJson,
    token: &AckToken,
    (stream, consumer): (&str, &str),
    later: std::time::Duration,
) -> Value {
    let Some((attempt, sequence)) = token.delivery(stream, consumer) else {
        return json!({"id": token.id, "acked": false});
    };
    let again = json!({"id": token.id, "acked": false, "again_in_ms": later.as_millis() as u64});
    if attempt < outbound::MAX_ATTEMPTS {
        settle(hub, &token.reply, AckKind::Nak(Some(later))).await;
        return again;
    }
    let held = async {
        let stored = read_pulled(hub, acks, sequence).await?;
        match outbound::hold_over(hub, &stored).await? {
            outbound::Held::Again => {
                // Confirmed, so that the original does not come back as well, a last time.
                if !confirmed_ack(hub, &token.reply).await {
                    tracing::warn!(
                        id = token.id,
                        "a message put off was copied, but its original was not let go"
                    );
                }
                Ok(json!({"id": token.id, "acked": false, "again_in_ms": 0}))
            }
            outbound::Held::TooLong(reason) => {
                hub.metrics.given_up.of(&acks.platform).inc();
                tracing::error!(id = token.id, reason, "setting an outbound message aside");
                set_pulled_aside(hub, token, stored, &reason).await
            }
        }
    };
    match held.await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, id = token.id, "cannot put a message off; it comes back");
            settle(hub, &token.reply, AckKind::Nak(Some(later))).await;
            again
        }
    }
}

/// Hands the delivery `token` acknowledges out again once the delay after its `attempt` passed.
async fn again(hub: &Hub, token: &AckToken, attempt: u64) -> Value {
    let delay = bus::retry_delay(i64::try_from(attempt).unwrap_or(i64::MAX));
    settle(hub, &token.reply, AckKind::Nak(Some(delay))).await;
    json!({"id": token.id, "acked": false, "again_in_ms": delay.as_millis() as u64})
}

/// The pulled message at `sequence` of the outbound stream, read back, when it is a message of
/// the bot `acks` speaks for.
async fn read_pulled(
    hub: &Hub,
    acks: &AcksJson,
    sequence: u64,
) -> Result<async_nats::jetstream::message::StreamMessage, String> {
    let stream = hub.names.chat_out_stream();
    let subject = hub
        .names
        .chat_out(&acks.platform, &acks.bot_id)
        .map_err(|e| e.to_string())?;
    let stored = hub
        .js
        .get_stream_no_info(&stream)
        .await
        .map_err(|e| e.to_string())?
        .get_raw_message(sequence)
        .await
        .map_err(|e| e.to_string())?;
    if stored.subject.as_str() != subject {
        return Err(format!("message {sequence} is not one of {subject}"));
    }
    Ok(stored)
}

/// Acknowledges a pulled delivery twice over: whether JetStream answered that it recorded it.
async fn confirmed_ack(hub: &Hub, reply: &str) -> bool {
    let acked = tokio::time::timeout(
        ACK_CONFIRM,
        hub.nats.request(reply.to_owned(), "+ACK".into()),
    )
    .await;
    matches!(acked, Ok(Ok(_)))
}

/// Settles a pulled delivery (`-NAK` with a delay, `+TERM`); one that does not reach JetStream
/// is handed out again once its acknowledgement wait ends.
async fn settle(hub: &Hub, reply: &str, kind: AckKind) {
    if let Err(e) = hub.nats.publish(reply.to_owned(), kind.into()).await {
        tracing::warn!(error = %e, "cannot settle a pulled message; it comes back");
    }
}
