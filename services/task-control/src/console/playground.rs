//! The console's playground: the page talks to hark as a chat user of a private chat does,
//! through the gateway's HTTP adapter. What the user writes is posted to
//! `POST /api/v1/messages`. What hark says back is pulled from the adapter's
//! `GET /api/v1/outbound` while the user's page listens, and passed on to it with its
//! acknowledgement token; the page acknowledges what it showed (`POST /api/playground/ack`), and
//! drops by its id one it is handed again. So a message of that user's chat said while no page
//! listened, or passed on to a page that closed before it showed it, comes to the next page, and
//! one shown is not handed out again. One pull serves every page open on this console. A
//! message of a chat no page listens to is put off (`later_ms`), so that the adapter hands it
//! out again a moment later, to a page opened since or to the console of another replica; being
//! put off costs it none of its attempts.
//!
//! It takes the first bot of `gateway.http.bots` (pulled, so without `webhook_url`), at
//! `control.playground_url` or else `gateway.listen` on this host, with `gateway.http.token`.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

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
    pages: Mutex<Pages>,
}

/// What a page is sent.
type PageTx = tokio::sync::mpsc::Sender<Result<Event, Infallible>>;

/// The pages open, by chat, and whether a pull serves them.
#[derive(Debug, Default)]
struct Pages {
    open: HashMap<String, Vec<PageTx>>,
    pulling: bool,
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
            pages: Mutex::default(),
        }
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, Pages> {
        self.pages.lock().unwrap_or_else(|p| p.into_inner())
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
    /// Sends `request` with the adapter's token; the JSON the gateway answered, or what it said
    /// was wrong with `what`.
    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Value, Failure> {
        let request = if self.token.is_empty() {
            request
        } else {
            request.bearer_auth(self.token.expose())
        };
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        Err(error(
            StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
            format!(
                "the gateway refused {what}: {}",
                body["error"].as_str().unwrap_or("no reason given")
            ),
        ))
    }

    /// One pull of the bot's outbound messages, waiting up to `wait` for a first one.
    async fn pull(&self, wait: Duration) -> Result<Vec<Value>, Failure> {
        let request = self
            .client
            // Both are NATS tokens (checked by the gateway's config): nothing to escape.
            .get(format!(
                "{}/api/v1/outbound?platform={}&bot_id={}&wait_ms={}",
                self.base,
                self.platform,
                self.bot_id,
                wait.as_millis()
            ))
            .timeout(wait + Duration::from_secs(10));
        let body = self.send(request, "the pull of its messages").await?;
        Ok(body["messages"].as_array().cloned().unwrap_or_default())
    }

    /// Acknowledges messages a page showed, so that they are not handed out again; the
    /// gateway's answer says which were.
    async fn acknowledge(&self, acks: Vec<Value>) -> Result<Value, Failure> {
        let request = self
            .client
            .post(format!("{}/api/v1/outbound/ack", self.base))
            .timeout(Duration::from_secs(10))
            .json(&json!({"platform": self.platform, "bot_id": self.bot_id, "acks": acks}));
        self.send(request, "the acknowledgements").await
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
    let request = target
        .client
        .post(format!("{}/api/v1/messages", target.base))
        .timeout(Duration::from_secs(10))
        .json(&body);
    target.send(request, "the message").await?;
    Ok(Json(json!({"message_id": message_id})))
}

#[derive(Debug, Deserialize)]
pub struct Listen {
    user: String,
}

/// `GET /api/playground/stream?user=…`: what hark says in `user`'s chat, as server-sent events,
/// while the page listens. The stream ends when the gateway stops answering; the page listens
/// again.
pub async fn stream(
    State(console): State<Console>,
    who: super::Who,
    Query(listen): Query<Listen>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Failure> {
    who.operator_only("the playground")?;
    let target = console.playground.target()?;
    let chat = chat_of(&listen.user)?;
    // A first pull answers at once: a gateway that cannot hand out messages is the page's error.
    let first = target.pull(Duration::from_millis(10)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    let start = {
        let mut pages = console.playground.pages();
        pages.open.entry(chat).or_default().push(tx);
        !std::mem::replace(&mut pages.pulling, true)
    };
    pass_on(&console.playground, first).await;
    if start {
        tokio::spawn(pull(console.playground.clone()));
    }
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// How long one pull of the playground waits for a message.
const PULL_WAIT: Duration = Duration::from_secs(20);

/// Pulls the bot's messages for the open pages until none is open. When the gateway stops
/// answering, every page's stream ends, and each page listens again (and is told why not).
async fn pull(playground: Arc<Playground>) {
    let Ok(target) = playground.target.as_ref() else {
        return;
    };
    loop {
        {
            let mut pages = playground.pages();
            pages.open.retain(|_, txs| {
                txs.retain(|tx| !tx.is_closed());
                !txs.is_empty()
            });
            if pages.open.is_empty() {
                pages.pulling = false;
                return;
            }
        }
        match target.pull(PULL_WAIT).await {
            Ok(messages) => pass_on(&playground, messages).await,
            Err(e) => {
                tracing::debug!(
                    error = e.message,
                    "the playground's pull failed; its pages listen again"
                );
                let mut pages = playground.pages();
                pages.open.clear();
                pages.pulling = false;
                return;
            }
        }
    }
}

/// How long a message of a chat that no page of this console listens to is put off: a page of
/// its chat opened since, here or on another replica's console, gets it this much later at
/// most.
const PUT_OFF: Duration = Duration::from_secs(2);

/// Passes pulled messages on to the pages of their chats, which acknowledge what they show. A
/// message of a chat no page listens to is put off, to be handed out again soon, for as long as
/// the stream keeps it; one that a page too slow to take it missed is not acknowledged, and is
/// handed out again once its acknowledgement wait ends. No page holds up the others.
async fn pass_on(playground: &Playground, pulled: Vec<Value>) {
    let mut put_off = Vec::new();
    for message in pulled {
        let txs = message["stream"]
            .as_str()
            .and_then(|chat| playground.pages().open.get(chat).cloned())
            .unwrap_or_default();
        if txs.is_empty() {
            put_off.push(json!({"ack": message["ack"], "later_ms": PUT_OFF.as_millis() as u64}));
            continue;
        }
        let data = message.to_string();
        for tx in txs {
            let _ = tx.try_send(Ok(Event::default().event("message").data(data.clone())));
        }
    }
    if put_off.is_empty() {
        return;
    }
    if let Ok(target) = playground.target.as_ref()
        && let Err(e) = target.acknowledge(put_off).await
    {
        // Not put off: each comes again once its acknowledgement wait ends.
        tracing::debug!(
            error = e.message,
            "the playground could not put off messages no page listens to"
        );
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acks {
    acks: Vec<String>,
}

/// `POST /api/playground/ack`: the page showed these messages (their `ack` tokens); they are not
/// handed out again.
pub async fn ack(
    State(console): State<Console>,
    who: super::Who,
    Body(acks): Body<Acks>,
) -> super::Answered {
    who.operator_only("the playground")?;
    let target = console.playground.target()?;
    if acks.acks.is_empty() || acks.acks.len() > 100 {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "acks: 1 to 100 acknowledgement tokens, as the stream gave them",
        ));
    }
    let acks = acks
        .acks
        .into_iter()
        .map(|ack| json!({"ack": ack}))
        .collect();
    Ok(Json(target.acknowledge(acks).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

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
