//! The console's playground: the page talks to hark as a chat user of a private chat does,
//! through the gateway's HTTP adapter. What the user writes is posted to
//! `POST /api/v1/messages`; what hark says back comes from the adapter's `GET /api/v1/stream`,
//! passed on to the page for that user's chat only.
//!
//! It takes the first bot of `gateway.http.bots` (streamed, so without `webhook_url`), at
//! `control.playground_url` or else `gateway.listen` on this host, with `gateway.http.token`.

use std::{convert::Infallible, time::Duration};

use axum::{
    Json,
    extract::{Query, State},
    http::StatusCode,
    response::sse::{Event, KeepAlive, Sse},
};
use futures_util::Stream;
use hark_core::{config::Config, secret::Secret};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Body, Console, Failure, error};

/// Where the playground talks, or why it cannot.
#[derive(Debug)]
pub struct Playground {
    target: Result<Target, String>,
}

#[derive(Debug)]
struct Target {
    base: String,
    platform: String,
    bot_id: String,
    token: Secret,
    client: reqwest::Client,
}

impl Playground {
    pub fn new(config: &Config) -> Self {
        Self {
            target: target(config),
        }
    }

    /// What the page is told: the bot it plays with, or why there is none.
    pub fn describe(&self) -> Value {
        match &self.target {
            Ok(t) => json!({"enabled": true, "platform": t.platform, "bot_id": t.bot_id}),
            Err(why) => json!({"enabled": false, "why": why}),
        }
    }

    fn target(&self) -> Result<&Target, Failure> {
        self.target
            .as_ref()
            .map_err(|why| error(StatusCode::NOT_FOUND, why.clone()))
    }
}

fn target(config: &Config) -> Result<Target, String> {
    let http = &config.gateway.http;
    if !http.webhook_url.is_empty() {
        return Err(
            "the HTTP adapter sends to gateway.http.webhook_url, so there is no stream to play \
             with; the playground needs an adapter without a webhook"
                .into(),
        );
    }
    let bot = http.bots.first().ok_or_else(|| {
        "no bot to play with: set gateway.http.platforms (e.g. [\"web\"]) and gateway.http.bots \
         (e.g. [\"web:playground\"]), or run `hark dev`, which does"
            .to_owned()
    })?;
    let (platform, bot_id) = bot
        .split_once(':')
        .ok_or_else(|| format!("gateway.http.bots: `{bot}` is not `platform:bot_id`"))?;
    let base = match config.control.playground_url.trim() {
        "" => format!("http://{}", hark_core::config::dial(config.gateway.listen)),
        url => url.trim_end_matches('/').to_owned(),
    };
    hark_core::install_crypto();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("cannot build the playground's HTTP client: {e}"))?;
    Ok(Target {
        base,
        platform: platform.to_owned(),
        bot_id: bot_id.to_owned(),
        token: http.token.clone(),
        client,
    })
}

impl Target {
    fn request(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if self.token.is_empty() {
            request
        } else {
            request.bearer_auth(self.token.expose())
        }
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> Failure {
        error(
            StatusCode::BAD_GATEWAY,
            format!(
                "the gateway's HTTP adapter at {} does not answer ({e}); is the gateway running? \
                 Set control.playground_url to where it listens",
                self.base
            ),
        )
    }
}

/// The chat of a playground user: a private chat with the bot.
fn chat_of(user: &str) -> Result<String, Failure> {
    let user = user.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if user.is_empty() || user.len() > 64 || !user.chars().all(plain) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "user: a user id of letters, digits, `-` or `_`, at most 64",
        ));
    }
    Ok(format!("private:{user}"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Say {
    user: String,
    text: String,
    /// The message quoted: its text, as the page showed it.
    #[serde(default)]
    quote: String,
}

/// `POST /api/playground/messages`: `text` from `user`, as the chat would carry it.
pub async fn say(
    State(console): State<Console>,
    who: super::Who,
    Body(say): Body<Say>,
) -> super::Answered {
    who.operator_only("the playground")?;
    let target = console.playground.target()?;
    let stream = chat_of(&say.user)?;
    let message_id = uuid::Uuid::now_v7().to_string();
    let body = json!({
        "platform": target.platform,
        "bot_id": target.bot_id,
        "stream": stream,
        "sender": {"user_id": say.user.trim(), "nickname": say.user.trim()},
        "text": say.text,
        "message_id": message_id,
        "quoted_text": say.quote,
        "quoted_sender": if say.quote.is_empty() { "" } else { target.bot_id.as_str() },
    });
    let response = target
        .request(
            target
                .client
                .post(format!("{}/api/v1/messages", target.base))
                .timeout(Duration::from_secs(10))
                .json(&body),
        )
        .send()
        .await
        .map_err(|e| target.unreachable(e))?;
    let status = response.status();
    let answered: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Ok(Json(json!({"message_id": message_id})))
    } else {
        let why = answered["error"].as_str().unwrap_or("no reason given");
        Err(error(
            StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
            format!("the gateway refused the message: {why}"),
        ))
    }
}

#[derive(Debug, Deserialize)]
pub struct Listen {
    user: String,
}

/// `GET /api/playground/stream?user=…`: what hark says in `user`'s chat, as server-sent events,
/// while the page listens.
pub async fn stream(
    State(console): State<Console>,
    who: super::Who,
    Query(listen): Query<Listen>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Failure> {
    who.operator_only("the playground")?;
    let target = console.playground.target()?;
    let stream = chat_of(&listen.user)?;
    let mut response = target
        .request(
            target
                .client
                // Both are NATS tokens (checked by the gateway's config): nothing to escape.
                .get(format!(
                    "{}/api/v1/stream?platform={}&bot_id={}",
                    target.base, target.platform, target.bot_id
                )),
        )
        .send()
        .await
        .map_err(|e| target.unreachable(e))?;
    if !response.status().is_success() {
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        return Err(error(
            StatusCode::BAD_GATEWAY,
            format!(
                "the gateway's stream answered {status}: {}",
                body["error"].as_str().unwrap_or("no reason given")
            ),
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let mut lines = Lines::default();
        loop {
            let chunk = tokio::select! {
                _ = tx.closed() => return,
                chunk = response.chunk() => chunk,
            };
            let Ok(Some(chunk)) = chunk else {
                let _ = tx.send(Ok(Event::default().event("lost").data("{}"))).await;
                return;
            };
            for data in lines.feed(&chunk) {
                let Ok(message) = serde_json::from_str::<Value>(&data) else {
                    continue;
                };
                if message["stream"].as_str() != Some(stream.as_str()) {
                    continue;
                }
                let event = Event::default().event("message").data(message.to_string());
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The `data` of server-sent events read in pieces of any size.
#[derive(Debug, Default)]
struct Lines {
    pending: Vec<u8>,
    data: String,
}

impl Lines {
    /// Takes `chunk`; returns the data of the events it completed.
    fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut done = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    done.push(std::mem::take(&mut self.data));
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(data.strip_prefix(' ').unwrap_or(data));
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_whatever_the_pieces() {
        let text = "event: message\ndata: {\"a\":1}\n\n: keep-alive\n\nevent: message\r\ndata: x\r\ndata: y\r\n\r\n";
        let whole = Lines::default().feed(text.as_bytes());
        assert_eq!(whole, vec!["{\"a\":1}".to_owned(), "x\ny".to_owned()]);
        let mut lines = Lines::default();
        let mut pieces = Vec::new();
        for byte in text.as_bytes() {
            pieces.extend(lines.feed(std::slice::from_ref(byte)));
        }
        assert_eq!(pieces, whole);
    }

    #[test]
    fn a_playground_user_is_a_plain_id() {
        assert_eq!(
            chat_of("web-user_1").ok(),
            Some("private:web-user_1".into())
        );
        for bad in ["", " ", "a b", "a:b", &"x".repeat(65)] {
            assert!(chat_of(bad).is_err(), "{bad:?}");
        }
    }
}
