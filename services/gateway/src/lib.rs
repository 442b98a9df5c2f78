//! gateway: the only place that knows a chat platform's wire format.
//!
//! - [`platform`] is the seam a chat platform implements: normalise what it delivers, send
//!   what hark says and report the message id.
//! - [`onebot`] is OneBot v11: frames, bot connections and the bots online, the reverse
//!   WebSocket server bots dial into and the bots' own servers hark dials, and its
//!   [`platform::Platform`].
//! - [`hub`] holds what all connections share, and knows no platform: the bus, the spool.
//! - [`inbound`] takes messages from bots to JetStream through the [`spool`] on disk.
//! - [`outbound`] delivers `CHAT_OUT` messages per bot, acknowledging only confirmed sends.
//! - [`http`] is the generic HTTP adapter for other apps, and the seam for bot frameworks in
//!   front of the chat.
//! - [`langbot`] is LangBot in front of the chat: its webhook in, its HTTP API out.
//! - [`satori`] is a client of a Satori server, for the many platforms it reaches.
//! - [`metrics`] counts bots, messages and failed sends per platform.
//! - [`app`] binds the listener and runs it all.

pub mod app;
pub mod http;
pub mod hub;
pub mod inbound;
pub mod langbot;
pub mod metrics;
pub mod onebot;
pub mod outbound;
pub mod platform;
pub mod satori;
pub mod spool;

use std::time::Duration;

use hark_core::secret::Secret;

/// The gateway's settings, from the `gateway` config section.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Platform name of OneBot bots' messages.
    pub platform: String,
    /// The token bots not named in `bot_tokens` connect with (`gateway.onebot.access_token`).
    pub access_token: Secret,
    /// Bots with a token of their own (`gateway.onebot.bots.<id>.access_token`).
    pub bot_tokens: std::collections::BTreeMap<String, Secret>,
    pub max_frame_bytes: usize,
    pub rate_limit: u32,
    pub send_timeout: Duration,
    /// How long a bot's durable consumer outlives its last connection (`gateway.forget_bot_after`).
    pub forget_bot_after: Duration,
    /// A OneBot connection silent this long is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// The platforms the HTTP adapter accepts messages for; empty: the adapter is off.
    pub http_platforms: Vec<String>,
    pub http_token: Secret,
    pub http_bots: Vec<(String, String)>,
    pub webhook_url: String,
    /// LangBot in front of the chat (`gateway.langbot`); off without bots.
    pub langbot: hark_core::config::LangBotConfig,
}

impl Settings {
    pub fn from_config(config: &hark_core::config::GatewayConfig) -> Self {
        Self {
            platform: config.onebot.platform.clone(),
            access_token: config.onebot.access_token.clone(),
            bot_tokens: config
                .onebot
                .bots
                .iter()
                .map(|(id, bot)| (id.clone(), bot.access_token.clone()))
                .collect(),
            max_frame_bytes: usize::try_from(config.max_frame_bytes).unwrap_or(usize::MAX),
            rate_limit: config.rate_limit,
            send_timeout: config.send_timeout.0,
            forget_bot_after: config.forget_bot_after.0,
            idle_timeout: Some(config.onebot.idle_timeout.0).filter(|d| !d.is_zero()),
            http_platforms: config.http.platforms.clone(),
            http_token: config.http.token.clone(),
            http_bots: config
                .http
                .bots
                .iter()
                .filter_map(|b| b.split_once(':'))
                .map(|(p, b)| (p.to_owned(), b.to_owned()))
                .collect(),
            webhook_url: config.http.webhook_url.clone(),
            langbot: config.langbot.clone(),
        }
    }
}

impl Settings {
    /// What a OneBot bot that names itself `self_id` must present: its own token when it has one,
    /// else the shared one. `None`: it may not connect at all (bots have tokens of their own, and
    /// it is not one of them, and there is no shared token).
    pub fn token_of(&self, self_id: &str) -> Option<&Secret> {
        match self.bot_tokens.get(self_id) {
            Some(own) => Some(own),
            None if self.access_token.is_empty() && !self.bot_tokens.is_empty() => None,
            None => Some(&self.access_token),
        }
    }

    /// Whether the HTTP adapter is on.
    pub fn http_enabled(&self) -> bool {
        !self.http_platforms.is_empty()
    }
}

pub use hark_core::secret::bearer;
