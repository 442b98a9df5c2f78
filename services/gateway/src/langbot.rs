//! LangBot in front of the chat, with no code on LangBot's side.
//!
//! LangBot's webhook posts each message its bots receive (`bot.person_message`,
//! `bot.group_message`) to `POST /api/v1/langbot/webhook?token=…`. hark takes it as a chat
//! message of the platform `gateway.langbot.bots` gives the bot, waits for task-control's verdict,
//! and answers `{"skip_pipeline": true}` when hark took it, so that LangBot's own pipeline (its
//! LLM) leaves it alone. What hark says goes out through LangBot's HTTP API
//! (`POST /api/v1/platform/bots/<bot uuid>/send_message` with `X-API-Key`), from one durable
//! consumer per bot like every platform's.

use std::{sync::Arc, time::Duration};

use axum::{
    Json,
    body::Bytes,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use futures_util::future::BoxFuture;
use hark_core::{
    config::LangBotConfig,
    domain::{StreamId, ids},
    secret::Secret,
};
use hark_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    http::{Refusal, error},
    hub::Hub,
    platform::{Inbound, Platform, SendError},
};

/// An event of LangBot's webhook, as LangBot's `WebhookPusher` builds it.
#[derive(Debug, Deserialize)]
struct Event {
    uuid: String,
    event_type: String,
    data: EventData,
}

#[derive(Debug, Deserialize)]
struct EventData {
    bot_uuid: String,
    #[serde(default)]
    group: Option<Party>,
    sender: Party,
    /// LangBot's message chain: `Source` (the platform's id of the message), `Plain`, `Quote`,
    /// `At` and others, each with its `type`.
    #[serde(default)]
    message: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct Party {
    #[serde(deserialize_with = "id_string")]
    id: String,
}

/// An id LangBot gives as a string or a number.
fn id_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    })
}

fn id_of(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn plain_text(chain: &[Value]) -> String {
    chain
        .iter()
        .filter(|c| c["type"] == "Plain")
        .filter_map(|c| c["text"].as_str())
        .collect::<String>()
}

/// LangBot as a [`Platform`]: its webhook's events in, its HTTP API out.
#[derive(Debug)]
pub struct LangBot {
    /// `(platform, bot uuid)` of `gateway.langbot.bots`.
    bots: Vec<(String, String)>,
    url: String,
    api_key: Secret,
    /// `None` when no client could be built; every send then says why.
    client: Option<reqwest::Client>,
}

impl LangBot {
    pub fn new(config: &LangBotConfig, send_timeout: Duration) -> Self {
        hark_core::install_crypto();
        Self {
            bots: config.bots(),
            url: config.url.trim_end_matches('/').to_owned(),
            api_key: config.api_key.clone(),
            client: reqwest::Client::builder()
                .timeout(send_timeout)
                .build()
                .inspect_err(|e| tracing::error!(error = %e, "cannot build LangBot's client"))
                .ok(),
        }
    }

    pub fn bots(&self) -> &[(String, String)] {
        &self.bots
    }
}

impl Platform for LangBot {
    type Delivery = [u8];
    /// An event of another type than a chat message.
    type Other = String;
    type Refusal = Refusal;

    fn normalise(&self, body: &[u8]) -> Result<Inbound<String>, Refusal> {
        let refuse = |status, message: String| Refusal { status, message };
        let event: Event = serde_json::from_slice(body).map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("the body is not an event of LangBot's webhook: {e}"),
            )
        })?;
        let stream = match event.event_type.as_str() {
            "bot.group_message" => match &event.data.group {
                Some(group) => format!("group:{}", group.id),
                None => {
                    return Err(refuse(
                        StatusCode::BAD_REQUEST,
                        "data.group: a group message must name its group".into(),
                    ));
                }
            },
            "bot.person_message" => format!("private:{}", event.data.sender.id),
            other => return Ok(Inbound::Other(other.to_owned())),
        };
        let data = event.data;
        let Some((platform, _)) = self.bots.iter().find(|(_, b)| *b == data.bot_uuid) else {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "data.bot_uuid: `{}` is not one of gateway.langbot.bots; add it there as \
                     platform:bot_uuid",
                    ids::shown(&data.bot_uuid)
                ),
            ));
        };
        stream
            .parse::<StreamId>()
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("the chat: {e}")))?;
        let field = |name: &'static str, value: &str| {
            ids::chat_id(name, value)
                .map(drop)
                .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("{name}: {e}")))
        };
        field("data.sender.id", &data.sender.id)?;
        let mut message_id = String::new();
        let (mut quoted, mut quoted_text, mut quoted_sender) =
            (String::new(), String::new(), String::new());
        let mut mentions = Vec::new();
        for component in &data.message {
            match component["type"].as_str() {
                Some("Source") => message_id = id_of(component.get("id")),
                Some("Quote") => {
                    quoted = id_of(component.get("id"));
                    quoted_sender = id_of(component.get("sender_id"));
                    quoted_text = component["origin"]
                        .as_array()
                        .map(|origin| plain_text(origin))
                        .unwrap_or_default();
                }
                Some("At") => mentions.push(id_of(component.get("target"))),
                _ => {}
            }
        }
        // Without the platform's id, the event's own: LangBot posts each message once.
        if message_id.is_empty() {
            message_id = event.uuid;
        }
        field("the message id", &message_id)?;
        if !quoted.is_empty() {
            field("the quoted message id", &quoted)?;
        }
        Ok(Inbound::Message(Box::new(crate::platform::received(
            pb::ChatMessage {
                platform: platform.clone(),
                bot_id: data.bot_uuid,
                stream,
                sender: Some(pb::Sender {
                    user_id: data.sender.id,
                    nickname: String::new(),
                }),
                text: plain_text(&data.message).trim().to_owned(),
                quoted_message_id: quoted,
                quoted_text,
                quoted_sender,
                mentions,
                mentions_bot: false,
                message_id,
                ..Default::default()
            },
        ))))
    }

    fn send(
        &self,
        message: pb::OutboundMessage,
    ) -> BoxFuture<'_, Result<Option<String>, SendError>> {
        Box::pin(async move {
            let route = message.route.clone().unwrap_or_default();
            let (target_type, target_id) = match route.stream.split_once(':') {
                Some(("group", id)) => ("group", id),
                Some(("private", id)) => ("person", id),
                _ => {
                    return Err(SendError::Retry(format!(
                        "LangBot cannot send to the chat `{}`",
                        ids::shown(&route.stream)
                    )));
                }
            };
            let client = self.client.as_ref().ok_or_else(|| {
                SendError::Retry("no HTTP client for LangBot (see the error at startup)".into())
            })?;
            let url = format!(
                "{}/api/v1/platform/bots/{}/send_message",
                self.url, route.bot_id
            );
            let shown = hark_core::secret::redact_url(&url);
            let request = client
                .post(&url)
                .header("X-API-Key", self.api_key.expose())
                .json(&json!({
                    "target_type": target_type,
                    "target_id": target_id,
                    "message_chain": [{"type": "Plain", "text": message.text}],
                }));
            crate::platform::call_api(request, &format!("LangBot at {shown}")).await?;
            // LangBot's API does not name the sent message: a quote of a question is matched by
            // the quoted text instead.
            Ok(None)
        })
    }
}

/// What the webhook's requests share.
#[derive(Debug, Clone)]
pub struct Door {
    pub hub: Arc<Hub>,
    pub langbot: Arc<LangBot>,
    token: Secret,
    wait: Duration,
}

impl Door {
    pub fn new(hub: Arc<Hub>, config: &LangBotConfig) -> Self {
        let langbot = Arc::new(LangBot::new(config, hub.settings.send_timeout));
        Self {
            hub,
            langbot,
            token: config.token.clone(),
            wait: config.wait.0,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct TokenQuery {
    #[serde(default)]
    pub token: String,
}

/// The answer LangBot reads: `skip_pipeline` when hark took the message.
fn answer(status: StatusCode, skip: bool) -> Response {
    (status, Json(json!({"status": "ok", "skip_pipeline": skip}))).into_response()
}

/// `POST /api/v1/langbot/webhook?token=…`.
pub async fn webhook(
    State(door): State<Door>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if door.token.is_empty() {
        if let Err(refused) = crate::http::loopback_only(&headers) {
            return *refused;
        }
    } else if !door.token.matches(&query.token) {
        return error(
            StatusCode::UNAUTHORIZED,
            "wrong or missing token: end the webhook's URL in LangBot with ?token=<gateway.langbot.token>",
        );
    }
    let message = match door.langbot.normalise(&body) {
        Ok(Inbound::Message(message)) => message,
        Ok(Inbound::Other(kind)) => {
            tracing::debug!(kind, "a LangBot event that is no chat message");
            return answer(StatusCode::OK, false);
        }
        Err(refusal) => return error(refusal.status, refusal.message),
    };
    match crate::inbound::publish_for_verdict(&door.hub, *message, None, door.wait).await {
        Ok(posted) => answer(
            StatusCode::OK,
            posted.verdict.is_some_and(|verdict| verdict.taken),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "a LangBot message was not taken: NATS does not answer");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "hark cannot take messages right now (its message bus does not answer)",
            )
        }
    }
}

/// Delivers one LangBot bot's messages until shutdown.
pub async fn deliver(door: Door, platform: String, bot_uuid: String) {
    let closed = door.hub.shutdown.clone();
    crate::outbound::run(door.hub, door.langbot, platform, bot_uuid, closed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn langbot() -> LangBot {
        LangBot::new(
            &LangBotConfig {
                url: "http://127.0.0.1:5300".into(),
                bots: vec!["langbot-qq:b-1".into()],
                ..Default::default()
            },
            Duration::from_secs(1),
        )
    }

    #[test]
    fn a_group_message_with_a_quote_is_read_as_langbot_posts_it() {
        let event = json!({"uuid": "e-1", "event_type": "bot.group_message", "data": {
            "bot_uuid": "b-1", "adapter_name": "aiocqhttp",
            "group": {"id": "777", "name": "g"}, "sender": {"id": 100, "name": "Ann"},
            "message": [
                {"type": "Source", "id": 9001, "time": "2026-12-05T10:00:00"},
                {"type": "Quote", "id": 55, "sender_id": "42", "origin": [{"type": "Plain", "text": "Which colour?"}]},
                {"type": "At", "target": 200, "display": "Bob"},
                {"type": "Plain", "text": " green "}
            ],
            "timestamp": 1_733_000_000}});
        let Ok(Inbound::Message(m)) = langbot().normalise(event.to_string().as_bytes()) else {
            panic!("a message")
        };
        assert_eq!(
            (
                m.platform.as_str(),
                m.bot_id.as_str(),
                m.stream.as_str(),
                m.message_id.as_str(),
                m.text.as_str()
            ),
            ("langbot-qq", "b-1", "group:777", "9001", "green")
        );
        assert_eq!(m.sender.expect("sender").user_id, "100");
        assert_eq!(
            (
                m.quoted_message_id.as_str(),
                m.quoted_text.as_str(),
                m.quoted_sender.as_str()
            ),
            ("55", "Which colour?", "42")
        );
        assert_eq!(m.mentions, ["200"]);
    }

    #[test]
    fn another_bot_another_event_and_bad_bodies_are_told_apart() {
        let lb = langbot();
        let other_bot = json!({"uuid": "e", "event_type": "bot.person_message", "data": {
            "bot_uuid": "b-2", "sender": {"id": "1"}, "message": []}});
        let refused = lb
            .normalise(other_bot.to_string().as_bytes())
            .expect_err("refused");
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(
            refused.message.contains("gateway.langbot.bots"),
            "{refused}"
        );
        let other = json!({"uuid": "e", "event_type": "bot.joined", "data": {
            "bot_uuid": "b-1", "sender": {"id": "1"}}});
        assert_eq!(
            lb.normalise(other.to_string().as_bytes()),
            Ok(Inbound::Other("bot.joined".into()))
        );
        let refused = lb.normalise(b"{oops").expect_err("refused");
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        // A person message without a Source takes the event's id.
        let plain = json!({"uuid": "e-7", "event_type": "bot.person_message", "data": {
            "bot_uuid": "b-1", "sender": {"id": "1"},
            "message": [{"type": "Plain", "text": "/task help"}]}});
        let Ok(Inbound::Message(m)) = lb.normalise(plain.to_string().as_bytes()) else {
            panic!("a message")
        };
        assert_eq!(
            (m.stream.as_str(), m.message_id.as_str(), m.text.as_str()),
            ("private:1", "e-7", "/task help")
        );
    }
}
