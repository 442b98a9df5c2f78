//! Satori (satori.js.org): one protocol to many chat platforms, served by Koishi's
//! `server-satori`, satori-python, Chronocat and others. hark is a client of such a server:
//!
//! - its event stream, a WebSocket at `<url>/v1/events`: IDENTIFY with the token and the `sn` of
//!   the last event hark spooled, so that the server replays what hark missed while it was away;
//!   READY names the server's logins, each a bot; PING every 10 s;
//! - its API over HTTP: `message.create` (hark's messages, a quoted question as `<quote>`), and
//!   `user.channel.create` (the direct channel of a private chat);
//! - buttons: where a login offers them (its `features` list `message.button`, or its platform
//!   is in `gateway.satori.buttons`), a question's choices go out as `<button type="action">`s
//!   too, each with the reply it stands for (`#a3f9 2`) in its id; the `interaction/button`
//!   event of a press is read as that reply, typed by whoever pressed.
//!
//! A login of the Satori platform `p` is the hark platform `satori-p`, its bot the login's user
//! id; a channel of type DIRECT is the stream `private:<user>`, any other `group:<channel>`.
//! Messages go through the spool like OneBot's, and the `sn` is written next to it only once the
//! event is spooled. Nothing outside this module knows Satori.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::{SinkExt, StreamExt, future::BoxFuture};
use hark_core::{config::SatoriConfig, domain::ids, secret::Secret};
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

use crate::{
    hub::Hub,
    platform::{Inbound, Platform, SendError},
};

/// Satori's opcodes.
const EVENT: u64 = 0;
const PING: u64 = 1;
const IDENTIFY: u64 = 3;
const READY: u64 = 4;

/// The feature of a login that shows buttons.
const BUTTON_FEATURE: &str = "message.button";
/// What starts the id of a button hark sent; a press of any other button is not hark's.
const BUTTON_ID: &str = "hark:";
/// What starts the message id hark gives a press, which is no message to quote.
const PRESS_ID: &str = "press-";

/// How often hark pings the server.
const PING_EVERY: Duration = Duration::from_secs(10);

/// The hark platform of the Satori platform `platform`.
pub fn hark_platform(platform: &str) -> String {
    let name: String = platform
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("satori-{name}")
}

/// A Satori server as a [`Platform`].
#[derive(Debug)]
pub struct Satori {
    /// `<url>/v1`.
    api: String,
    token: Secret,
    client: Option<reqwest::Client>,
    /// The Satori platform of each hark platform, from the logins seen.
    platforms: Mutex<HashMap<String, String>>,
    /// Direct channels by `(bot, user)`, as `user.channel.create` gave them.
    direct: Mutex<HashMap<(String, String), String>>,
    /// The Satori platforms (lowercase) whose logins get buttons, from the configuration.
    button_platforms: HashSet<String>,
    /// The logins, as `(hark platform, bot)`, that get buttons.
    buttons: Mutex<HashSet<(String, String)>>,
}

impl Satori {
    pub fn new(config: &SatoriConfig, send_timeout: Duration) -> Self {
        hark_core::install_crypto();
        Self {
            api: format!("{}/v1", config.url.trim_end_matches('/')),
            token: config.token.clone(),
            client: reqwest::Client::builder()
                .timeout(send_timeout)
                .build()
                .inspect_err(|e| tracing::error!(error = %e, "cannot build Satori's client"))
                .ok(),
            platforms: Mutex::default(),
            direct: Mutex::default(),
            button_platforms: config
                .buttons
                .iter()
                .map(|p| p.trim().to_lowercase())
                .collect(),
            buttons: Mutex::default(),
        }
    }

    /// Notes a login: its hark platform, and its bot.
    /// `None` for a login hark cannot name: its platform makes no owner id (`satori-` and at
    /// most 25 more characters), or its user id is no bot id.
    fn login(&self, login: &Value) -> Option<(String, String)> {
        let platform = login["platform"].as_str()?;
        let self_id = id_of(&login["user"]["id"]).or_else(|| id_of(&login["self_id"]))?;
        let hark = hark_platform(platform);
        let nameable = hark_core::domain::Owner::new(&hark, "x").is_ok()
            && ids::bot_id("satori", &self_id).is_ok();
        if !nameable {
            tracing::warn!(
                platform = ids::shown(platform),
                self_id = ids::shown(&self_id),
                "a Satori login hark cannot name; its messages are left alone"
            );
            return None;
        }
        self.platforms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(hark.clone(), platform.to_owned());
        // An event's login may leave its features out; only READY's logins say.
        if let Some(features) = login["features"].as_array() {
            let offered = features.iter().any(|f| f.as_str() == Some(BUTTON_FEATURE))
                || self.button_platforms.contains(&platform.to_lowercase());
            let mut buttons = self.buttons.lock().unwrap_or_else(|p| p.into_inner());
            if offered {
                buttons.insert((hark.clone(), self_id.clone()));
            } else {
                buttons.remove(&(hark.clone(), self_id.clone()));
            }
        }
        Some((hark, self_id))
    }

    /// Whether the bot `bot` of the hark platform `hark` shows buttons.
    fn shows_buttons(&self, hark: &str, bot: &str) -> bool {
        self.buttons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(hark.to_owned(), bot.to_owned()))
            || self
                .button_platforms
                .contains(&self.satori_platform(hark).to_lowercase())
    }

    fn satori_platform(&self, hark: &str) -> String {
        self.platforms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(hark)
            .cloned()
            .unwrap_or_else(|| hark.trim_start_matches("satori-").to_owned())
    }

    /// Calls the API `method` as the bot `self_id` of `platform`.
    async fn call(
        &self,
        platform: &str,
        self_id: &str,
        method: &str,
        body: Value,
    ) -> Result<Value, SendError> {
        let client = self.client.as_ref().ok_or_else(|| {
            SendError::Retry("no HTTP client for Satori (see the error at startup)".into())
        })?;
        let url = format!("{}/{method}", self.api);
        let shown = hark_core::secret::redact_url(&url);
        let mut request = client
            .post(&url)
            // Satori 1.1 names them Satori-*, 1.0 X-*.
            .header("Satori-Platform", platform)
            .header("Satori-User-ID", self_id)
            .header("X-Platform", platform)
            .header("X-Self-ID", self_id)
            .json(&body);
        if !self.token.is_empty() {
            request = request.bearer_auth(self.token.expose());
        }
        crate::platform::call_api(request, &format!("Satori at {shown}")).await
    }

    /// The channel a stream is sent to.
    async fn channel(
        &self,
        platform: &str,
        self_id: &str,
        stream: &str,
    ) -> Result<String, SendError> {
        match stream.split_once(':') {
            Some(("group", channel)) => Ok(channel.to_owned()),
            Some(("private", user)) => {
                let key = (self_id.to_owned(), user.to_owned());
                if let Some(channel) = self
                    .direct
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Ok(channel.clone());
                }
                let channel = self
                    .call(
                        platform,
                        self_id,
                        "user.channel.create",
                        json!({"user_id": user}),
                    )
                    .await?;
                let id = id_of(&channel["id"]).ok_or_else(|| {
                    SendError::Retry(format!(
                        "Satori's user.channel.create gave no channel for {}",
                        ids::shown(user)
                    ))
                })?;
                self.direct
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, id.clone());
                Ok(id)
            }
            _ => Err(SendError::Retry(format!(
                "Satori cannot send to the chat `{}`",
                ids::shown(stream)
            ))),
        }
    }
}

fn id_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl Platform for Satori {
    /// One event's body.
    type Delivery = Value;
    /// An event that is no chat message: its type.
    type Other = String;
    type Refusal = String;

    fn normalise(&self, event: &Value) -> Result<Inbound<String>, String> {
        let kind = event["type"].as_str().unwrap_or_default();
        let press = match kind {
            "message-created" => None,
            "interaction/button" => match event["button"]["id"]
                .as_str()
                .and_then(|id| id.strip_prefix(BUTTON_ID))
            {
                Some(reply) => Some(reply.to_owned()),
                None => return Ok(Inbound::Other("a press of a button not hark's".into())),
            },
            _ => return Ok(Inbound::Other(kind.to_owned())),
        };
        let login = if event["login"].is_object() {
            event["login"].clone()
        } else {
            json!({"platform": event["platform"], "self_id": event["self_id"]})
        };
        let (platform, bot) = self
            .login(&login)
            .ok_or("the event names no login (platform and user id)")?;
        let user = id_of(&event["user"]["id"]).ok_or("the event names no user")?;
        if user == bot {
            return Ok(Inbound::Other("the bot's own message".into()));
        }
        let channel = id_of(&event["channel"]["id"]).ok_or("the event names no channel")?;
        let direct = event["channel"]["type"].as_u64() == Some(1);
        let stream = if direct {
            format!("private:{user}")
        } else {
            format!("group:{channel}")
        };
        if direct {
            self.direct
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((bot.clone(), user.clone()), channel);
        }
        stream
            .parse::<hark_core::domain::StreamId>()
            .map_err(|e| format!("the chat: {e}"))?;
        let message_id = match &press {
            // A press is no message; the event's number is its id, the same when replayed.
            Some(_) => match event["sn"].as_u64().or_else(|| event["id"].as_u64()) {
                Some(sn) if sn > 0 => format!("{PRESS_ID}{sn}"),
                _ => format!(
                    "{PRESS_ID}{}-{user}",
                    event["timestamp"].as_u64().unwrap_or_default()
                ),
            },
            None => id_of(&event["message"]["id"]).ok_or("the message has no id")?,
        };
        for (name, value) in [("user id", &user), ("message id", &message_id)] {
            ids::chat_id("satori", value).map_err(|e| format!("{name}: {e}"))?;
        }
        let content = match &press {
            Some(reply) => escape(reply),
            None => event["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        let read = read_content(&content, &bot);
        let mut quoted = read.quoted;
        let mut quoted_text = read.quoted_text;
        let mut quoted_sender = read.quoted_sender;
        // Satori 1.1 also gives the quoted message as an object.
        if press.is_none()
            && let Some(quote) = event["message"]["quote"].as_object()
        {
            if let Some(id) = quote.get("id").and_then(id_of) {
                quoted = id;
            }
            if let Some(text) = quote.get("content").and_then(Value::as_str) {
                quoted_text = read_content(text, &bot).text;
            }
            if let Some(author) = quote.get("user").and_then(|u| id_of(&u["id"])) {
                quoted_sender = author;
            }
        }
        let nickname = event["member"]["nick"]
            .as_str()
            .or_else(|| event["user"]["name"].as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(Inbound::Message(Box::new(crate::platform::received(
            pb::ChatMessage {
                platform,
                bot_id: bot,
                stream,
                sender: Some(pb::Sender {
                    user_id: user,
                    nickname,
                }),
                text: read.text.trim().to_owned(),
                quoted_message_id: quoted,
                quoted_text,
                quoted_sender,
                mentions: read.mentions,
                mentions_bot: read.mentions_bot,
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
            let platform = self.satori_platform(&route.platform);
            let channel = self
                .channel(&platform, &route.bot_id, &route.stream)
                .await?;
            let mut content = String::new();
            if !message.reply_to_message_id.is_empty()
                && !message.reply_to_message_id.starts_with(PRESS_ID)
            {
                content.push_str(&format!(
                    "<quote id=\"{}\"/>",
                    escape(&message.reply_to_message_id)
                ));
            }
            content.push_str(&escape(&message.text));
            if self.shows_buttons(&route.platform, &route.bot_id) {
                for button in &message.buttons {
                    content.push_str(&format!(
                        "<button type=\"action\" id=\"{}\">{}</button>",
                        escape(&format!("{BUTTON_ID}{}", button.reply)),
                        escape(&button.label)
                    ));
                }
            }
            let sent = self
                .call(
                    &platform,
                    &route.bot_id,
                    "message.create",
                    json!({"channel_id": channel, "content": content}),
                )
                .await?;
            Ok(sent
                .as_array()
                .and_then(|messages| messages.first())
                .and_then(|m| id_of(&m["id"])))
        })
    }
}

/// Escapes text for a Satori message's content.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// Reads the entities of escaped text.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';').filter(|&end| end <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// What a message's content says, read for hark.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Content {
    pub text: String,
    pub mentions: Vec<String>,
    pub mentions_bot: bool,
    pub quoted: String,
    pub quoted_text: String,
    pub quoted_sender: String,
}

/// One tag of a message's content.
struct Tag<'a> {
    name: &'a str,
    closing: bool,
    self_closing: bool,
    attrs: Vec<(&'a str, String)>,
}

impl Tag<'_> {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads `<name a="x" b/>`, `<name>` or `</name>` (without its angle brackets).
fn tag(inside: &str) -> Tag<'_> {
    let closing = inside.starts_with('/');
    let inside = inside.trim_start_matches('/');
    let self_closing = inside.ends_with('/');
    let inside = inside.trim_end_matches('/').trim();
    let name_end = inside
        .find(|c: char| c.is_whitespace())
        .unwrap_or(inside.len());
    let (name, mut rest) = inside.split_at(name_end);
    let mut attrs = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let (key, after) = rest.split_at(key_end);
        if let Some(value) = after.strip_prefix('=') {
            let quote = value.chars().next().filter(|q| *q == '"' || *q == '\'');
            let (value, after) = match quote {
                Some(q) => {
                    let body = &value[1..];
                    let end = body.find(q).unwrap_or(body.len());
                    (&body[..end], body.get(end + 1..).unwrap_or(""))
                }
                None => {
                    let end = value
                        .find(|c: char| c.is_whitespace())
                        .unwrap_or(value.len());
                    (&value[..end], &value[end..])
                }
            };
            attrs.push((key, unescape(value)));
            rest = after;
        } else {
            attrs.push((key, String::new()));
            rest = after;
        }
        if key.is_empty() {
            break;
        }
    }
    Tag {
        name,
        closing,
        self_closing,
        attrs,
    }
}

/// Reads a message's content (Satori's elements): its text, its `<at>`s, and the message its
/// `<quote>` quotes. Other elements (images, files) are left out; the text inside unknown paired
/// elements is kept. No input makes it panic.
pub fn read_content(content: &str, self_id: &str) -> Content {
    let mut read = Content::default();
    let mut rest = content;
    // Inside a <quote>…</quote>: its text is the quoted message's, not this one's.
    let mut quote_depth = 0usize;
    while !rest.is_empty() {
        let Some(open) = rest.find('<') else {
            push_text(&mut read, quote_depth, &unescape(rest));
            break;
        };
        push_text(&mut read, quote_depth, &unescape(&rest[..open]));
        let Some(close) = rest[open..].find('>') else {
            push_text(&mut read, quote_depth, &unescape(&rest[open..]));
            break;
        };
        let element = tag(&rest[open + 1..open + close]);
        rest = &rest[open + close + 1..];
        match element.name {
            "at" if !element.closing => {
                if element.attr("type").is_none()
                    && let Some(id) = element.attr("id")
                {
                    if id == self_id {
                        read.mentions_bot = true;
                    } else if quote_depth == 0 {
                        read.mentions.push(id.to_owned());
                    }
                }
            }
            "quote" if element.closing => quote_depth = quote_depth.saturating_sub(1),
            "quote" => {
                if let Some(id) = element.attr("id") {
                    read.quoted = id.to_owned();
                }
                if !element.self_closing {
                    quote_depth += 1;
                }
            }
            "author" if quote_depth > 0 && !element.closing => {
                if let Some(id) = element.attr("id")
                    && read.quoted_sender.is_empty()
                {
                    read.quoted_sender = id.to_owned();
                }
            }
            "br" => push_text(&mut read, quote_depth, "\n"),
            "p" if element.closing => push_text(&mut read, quote_depth, "\n"),
            _ => {}
        }
    }
    read
}

fn push_text(read: &mut Content, quote_depth: usize, text: &str) {
    if quote_depth > 0 {
        read.quoted_text.push_str(text);
    } else {
        read.text.push_str(text);
    }
}

/// The `sn` of the last event spooled, kept next to the spool so that a restarted gateway asks
/// the server for what it missed.
#[derive(Debug)]
struct LastSeen {
    path: PathBuf,
    sn: Option<u64>,
}

impl LastSeen {
    fn open(path: PathBuf) -> Self {
        let sn = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Self { path, sn }
    }

    fn note(&mut self, sn: u64) {
        self.sn = Some(sn);
        if let Err(e) = std::fs::write(&self.path, sn.to_string()) {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot note the last Satori event");
        }
    }
}

/// Keeps the connection to the Satori server up until shutdown, reconnecting with backoff.
pub async fn keep_connected(hub: Arc<Hub>, config: SatoriConfig) {
    let satori = Arc::new(Satori::new(&config, hub.settings.send_timeout));
    let mut last = LastSeen::open(hub.spool_dir.join("satori-sn"));
    let mut delivering = HashSet::new();
    let events = format!(
        "{}/v1/events",
        config.url.trim_end_matches('/').replacen("http", "ws", 1)
    );
    let shown = hark_core::secret::redact_url(&events);
    let mut backoff = Duration::from_secs(1);
    loop {
        let connected = tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            connected = connect_once(&hub, &satori, &config, &events, &mut last, &mut delivering) => connected,
        };
        match connected {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(e) => {
                tracing::warn!(url = shown, error = %e, ?backoff, "the Satori connection failed; reconnecting")
            }
        }
        tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn connect_once(
    hub: &Arc<Hub>,
    satori: &Arc<Satori>,
    config: &SatoriConfig,
    url: &str,
    last: &mut LastSeen,
    delivering: &mut HashSet<(String, String)>,
) -> Result<(), String> {
    let request = url.into_client_request().map_err(|e| e.to_string())?;
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sink, mut stream) = socket.split();
    let mut identify = json!({"token": config.token.expose()});
    if let Some(sn) = last.sn {
        // `sequence` is what Satori 1.0 servers read.
        identify["sn"] = json!(sn);
        identify["sequence"] = json!(sn);
    }
    sink.send(Message::Text(
        json!({"op": IDENTIFY, "body": identify}).to_string().into(),
    ))
    .await
    .map_err(|e| e.to_string())?;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        let frame = tokio::select! {
            _ = ping.tick() => {
                sink.send(Message::Text(json!({"op": PING}).to_string().into()))
                    .await
                    .map_err(|e| e.to_string())?;
                continue;
            }
            frame = stream.next() => frame,
        };
        let text = match frame {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(reason))) => {
                return Err(format!("the server closed the connection: {reason:?}"));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("the server closed the connection".into()),
        };
        let Ok(frame) = serde_json::from_str::<Value>(&text) else {
            tracing::debug!("a Satori frame that is not JSON");
            continue;
        };
        match frame["op"].as_u64() {
            Some(READY) => {
                let logins = frame["body"]["logins"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                tracing::info!(logins = logins.len(), "Satori connection up");
                for login in &logins {
                    if let Some(bot) = satori.login(login)
                        && delivering.insert(bot.clone())
                    {
                        let (platform, self_id) = bot;
                        tokio::spawn(crate::outbound::run(
                            hub.clone(),
                            satori.clone(),
                            platform,
                            self_id,
                            hub.shutdown.clone(),
                        ));
                    }
                }
            }
            Some(EVENT) => {
                let body = &frame["body"];
                match satori.normalise(body) {
                    Ok(Inbound::Message(message)) => {
                        let bot = (message.platform.clone(), message.bot_id.clone());
                        if delivering.insert(bot.clone()) {
                            tokio::spawn(crate::outbound::run(
                                hub.clone(),
                                satori.clone(),
                                bot.0,
                                bot.1,
                                hub.shutdown.clone(),
                            ));
                        }
                        crate::inbound::ingest_one(hub, &**satori, *message).await;
                    }
                    Ok(Inbound::Other(kind)) => {
                        tracing::debug!(kind, "a Satori event that is no chat message");
                    }
                    Err(why) => tracing::warn!(why, "a Satori event hark cannot read"),
                }
                // Spooled (or refused for good): not asked for again.
                if let Some(sn) = body["sn"].as_u64().or_else(|| body["id"].as_u64()) {
                    last.note(sn);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_gives_its_text_mentions_and_quote() {
        let read = read_content(
            "<quote id=\"q-1\"><author id=\"42\"/>Which colour?</quote><at id=\"42\"/> green &amp; <at id=\"7\" name=\"Bob\"/>blue<br/>ok <img src=\"x\"/>",
            "42",
        );
        assert_eq!(read.text, " green & blue\nok ");
        assert_eq!(read.mentions, ["7"]);
        assert!(read.mentions_bot);
        assert_eq!(
            (
                read.quoted.as_str(),
                read.quoted_text.as_str(),
                read.quoted_sender.as_str()
            ),
            ("q-1", "Which colour?", "42")
        );
        let read = read_content("<quote id=\"9\"/>red", "42");
        assert_eq!((read.quoted.as_str(), read.text.as_str()), ("9", "red"));
    }

    #[test]
    fn a_press_of_harks_button_is_its_reply_and_buttons_go_to_logins_that_show_them() {
        let satori = Satori::new(
            &SatoriConfig {
                url: "http://127.0.0.1:5140".into(),
                buttons: vec!["Discord".into()],
                ..Default::default()
            },
            Duration::from_secs(1),
        );
        let login = |platform: &str, features: Value| json!({"platform": platform, "user": {"id": "42"}, "features": features});
        assert!(
            satori
                .login(&login("qq", json!(["message.button"])))
                .is_some()
        );
        assert!(
            satori
                .login(&login("kook", json!(["message.delete"])))
                .is_some()
        );
        assert!(satori.login(&login("discord", json!([]))).is_some());
        assert!(satori.shows_buttons("satori-qq", "42"));
        assert!(!satori.shows_buttons("satori-qq", "43"));
        assert!(!satori.shows_buttons("satori-kook", "42"));
        assert!(satori.shows_buttons("satori-discord", "42"));
        // A login that stops offering them gets none; an event's login without features changes
        // nothing.
        satori.login(&json!({"platform": "qq", "user": {"id": "42"}}));
        assert!(satori.shows_buttons("satori-qq", "42"));
        satori.login(&login("qq", json!([])));
        assert!(!satori.shows_buttons("satori-qq", "42"));

        let press = |user: &str, id: &str, sn: u64| {
            json!({"sn": sn, "type": "interaction/button", "timestamp": 1,
                "login": {"platform": "qq", "user": {"id": "42"}},
                "channel": {"id": "777", "type": 0}, "user": {"id": user},
                "button": {"id": id}})
        };
        let Ok(Inbound::Message(m)) = satori.normalise(&press("100", "hark:#a3f9 2", 7)) else {
            panic!("a press of hark's button is a message")
        };
        assert_eq!(
            (
                m.stream.as_str(),
                m.text.as_str(),
                m.message_id.as_str(),
                m.quoted_message_id.as_str()
            ),
            ("group:777", "#a3f9 2", "press-7", "")
        );
        assert_eq!(m.sender.map(|s| s.user_id).as_deref(), Some("100"));
        // Markup in a button's id stays text.
        let Ok(Inbound::Message(m)) = satori.normalise(&press("100", "hark:<at id=\"1\"/>x", 8))
        else {
            panic!("a message")
        };
        assert_eq!((m.text.as_str(), m.mentions.len()), ("<at id=\"1\"/>x", 0));
        assert!(matches!(
            satori.normalise(&press("100", "vote:1", 9)),
            Ok(Inbound::Other(_))
        ));
        assert!(
            satori
                .normalise(&press("42", "hark:#a3f9 1", 10))
                .is_ok_and(|read| matches!(read, Inbound::Other(_)))
        );
    }

    #[test]
    fn escaping_round_trips_and_broken_content_is_read_as_far_as_it_goes() {
        for text in [
            "a < b && c > \"d\"",
            "&amp;lt;",
            "中文 <at id=1/>",
            "&#x4e2d;",
        ] {
            assert_eq!(unescape(&escape(text)), text);
            assert_eq!(read_content(&escape(text), "me").text, text);
        }
        assert_eq!(unescape("&#x4e2d;&#25991;&bogus;&"), "中文&bogus;&");
        for broken in [
            "<",
            "<at id=\"",
            "a<b",
            "</quote></quote>x",
            "<quote id='1'",
            "&#99999999999;",
        ] {
            let _ = read_content(broken, "me");
        }
        assert_eq!(read_content("a<b", "me").text, "a<b");
    }

    #[test]
    fn a_message_event_is_a_chat_message_of_its_login() {
        let satori = Satori::new(
            &SatoriConfig {
                url: "http://127.0.0.1:5140".into(),
                ..Default::default()
            },
            Duration::from_secs(1),
        );
        let event = json!({"sn": 3, "type": "message-created", "timestamp": 1,
            "login": {"platform": "QQ", "user": {"id": "42"}, "status": 1},
            "channel": {"id": "dm-100", "type": 1}, "user": {"id": "100", "name": "Ann"},
            "message": {"id": "m-1", "content": "/task help"}});
        let Ok(Inbound::Message(m)) = satori.normalise(&event) else {
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
            ("satori-qq", "42", "private:100", "m-1", "/task help")
        );
        assert_eq!(satori.satori_platform("satori-qq"), "QQ");
        let own = json!({"type": "message-created", "login": {"platform": "qq", "user": {"id": "42"}},
            "channel": {"id": "777", "type": 0}, "user": {"id": "42"}, "message": {"id": "m-2", "content": "x"}});
        assert!(matches!(satori.normalise(&own), Ok(Inbound::Other(_))));
        let other = json!({"type": "guild-member-added"});
        assert_eq!(
            satori.normalise(&other),
            Ok(Inbound::Other("guild-member-added".into()))
        );
        assert!(
            satori
                .normalise(&json!({"type": "message-created"}))
                .is_err()
        );
        // A login or a chat hark cannot name is refused, not passed on to fail later.
        let odd_bot = json!({"type": "message-created", "login": {"platform": "qq", "user": {"id": "a.b"}},
            "channel": {"id": "777", "type": 0}, "user": {"id": "1"}, "message": {"id": "m", "content": "x"}});
        assert!(satori.normalise(&odd_bot).is_err());
        let long = json!({"type": "message-created", "login": {"platform": "p".repeat(40), "user": {"id": "42"}},
            "channel": {"id": "777", "type": 0}, "user": {"id": "1"}, "message": {"id": "m", "content": "x"}});
        assert!(satori.normalise(&long).is_err());
        let odd_chat = json!({"type": "message-created", "login": {"platform": "qq", "user": {"id": "42"}},
            "channel": {"id": "7 7", "type": 0}, "user": {"id": "1"}, "message": {"id": "m", "content": "x"}});
        assert!(satori.normalise(&odd_chat).is_err());
    }
}
