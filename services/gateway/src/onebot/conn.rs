//! Bot connections, whichever side dialled: the [`Hub`] knows which bots are online, replaces a
//! bot's old connection when a new one arrives, turns inbound frames into `ChatMessage`s on
//! `CHAT_IN`, and lets the outbound side call actions on a bot and await their answers.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hark_core::bus;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::event::{self, Frame};
use crate::{
    Settings, inbound, outbound,
    spool::{Spool, Spooled},
};

/// A frame from a bot, whatever the WebSocket library.
#[derive(Debug)]
pub enum Incoming {
    Text(String),
    Binary(usize),
    /// A WebSocket ping or pong: the peer is there.
    Alive,
    /// A frame larger than `gateway.max_frame_bytes`: the connection is closed with 1009.
    TooBig,
    /// The connection ended; the reason, if any, for the log.
    Closed(String),
}

/// The WebSocket library's messages the writer sends.
#[derive(Debug)]
pub struct Frames<M> {
    /// Wraps a text frame.
    pub text: fn(String) -> M,
    /// A ping, sent every third of the idle timeout so that a live peer answers.
    pub ping: fn() -> M,
    /// A close frame with its code and reason.
    pub close: fn(u16, String) -> M,
}

/// WebSocket close codes hark sends.
pub mod close_code {
    /// The connection did its job (hark stops, or a newer connection replaced it).
    pub const NORMAL: u16 = 1000;
    /// The peer sent a message larger than hark accepts.
    pub const TOO_BIG: u16 = 1009;
}

/// Writes a connection's outgoing frames until it closes or is replaced, then sends a close
/// frame. While `idle_timeout` is set, pings go out every third of it.
pub async fn write_frames<S, M>(
    mut sink: S,
    mut outgoing: mpsc::Receiver<String>,
    bot: Arc<Bot>,
    frames: Frames<M>,
    idle_timeout: Option<Duration>,
) where
    S: futures_util::Sink<M> + Unpin,
{
    use futures_util::SinkExt;
    let period = idle_timeout.map_or(Duration::from_secs(3600), |t| t / 3);
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = bot.closed.cancelled() => {
                let (code, reason) = bot.close_reason();
                let _ = sink.send((frames.close)(code, reason)).await;
                return;
            }
            _ = pings.tick(), if idle_timeout.is_some() => {
                if sink.send((frames.ping)()).await.is_err() {
                    return;
                }
            }
            frame = outgoing.recv() => match frame {
                Some(frame) => {
                    if sink.send((frames.text)(frame)).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("the bot answered {action} with an error: {message}")]
    Refused { action: String, message: String },
    #[error("the bot did not answer {action} within {timeout:?}")]
    Timeout { action: String, timeout: Duration },
    #[error("the bot's connection closed before it answered {action}")]
    Disconnected { action: String },
}

/// One online bot.
#[derive(Debug)]
pub struct Bot {
    pub platform: String,
    pub self_id: String,
    /// Which connection of this bot this is; a newer one replaces it.
    pub connection: u64,
    /// Text frames to send to the bot.
    out: mpsc::Sender<String>,
    /// Actions awaiting their answer, by echo.
    pending: Mutex<HashMap<String, oneshot::Sender<Result<Value, String>>>>,
    /// Cancelled when this connection ends or is replaced.
    pub closed: CancellationToken,
    /// When the bot last sent anything (a heartbeat included).
    pub last_seen: Mutex<Instant>,
    /// Why this connection is closed, when hark closes it for a reason of the peer's making.
    closing: Mutex<Option<(u16, String)>>,
}

impl Bot {
    /// The close frame's code and reason for this connection.
    pub fn close_reason(&self) -> (u16, String) {
        self.closing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| (close_code::NORMAL, "closed by hark".into()))
    }

    fn close_with(&self, code: u16, reason: String) {
        *self.closing.lock().unwrap_or_else(|p| p.into_inner()) = Some((code, reason));
        self.closed.cancel();
    }

    /// Calls an action and waits for its answer's `data`.
    pub async fn call(
        &self,
        action: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, ActionError> {
        let echo = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = oneshot::channel();
        self.lock_pending().insert(echo.clone(), tx);
        let frame = json!({"action": action, "params": params, "echo": echo}).to_string();
        let disconnected = || ActionError::Disconnected {
            action: action.into(),
        };
        if self.out.send(frame).await.is_err() {
            self.lock_pending().remove(&echo);
            return Err(disconnected());
        }
        // An answer that arrived just before the connection closed still counts: the bot did send.
        let answer = tokio::select! {
            biased;
            answer = tokio::time::timeout(timeout, rx) => match answer {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) => Err(disconnected()),
                Err(_) => Err(ActionError::Timeout { action: action.into(), timeout }),
            },
            _ = self.closed.cancelled() => Err(disconnected()),
        };
        self.lock_pending().remove(&echo);
        answer?.map_err(|message| ActionError::Refused {
            action: action.into(),
            message,
        })
    }

    fn lock_pending(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Result<Value, String>>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resolve(&self, echo: &str, answer: Result<Value, String>) {
        if let Some(tx) = self.lock_pending().remove(echo) {
            let _ = tx.send(answer);
        }
    }
}

/// A token bucket: `rate` frames a second, bursts up to `burst`.
#[derive(Debug)]
struct Limiter {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Limiter {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self {
            rate,
            burst: rate * 2.0,
            tokens: rate * 2.0,
            at: Instant::now(),
        }
    }

    fn allow(&mut self) -> bool {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The gateway's bots and its link to the bus.
#[derive(Debug)]
pub struct Hub {
    pub nats: async_nats::Client,
    pub js: async_nats::jetstream::Context,
    pub names: bus::Names,
    pub settings: Settings,
    bots: Mutex<HashMap<(String, String), Arc<Bot>>>,
    connections: AtomicU64,
    /// Subscribers of the HTTP adapter's outbound stream.
    pub streams: crate::http::Streams,
    /// Where inbound messages wait until JetStream has them.
    pub spool: Arc<Spool>,
    pub spool_dir: std::path::PathBuf,
    /// Spooled messages, in order, for the publisher.
    publisher: mpsc::UnboundedSender<Spooled>,
    /// Chats told lately that a message was not taken.
    notices: inbound::Notices,
    /// Cancelled once NATS answered and the streams exist.
    pub ready: CancellationToken,
    /// Stops everything at shutdown.
    pub shutdown: CancellationToken,
}

/// What a [`Hub`] is made of.
#[derive(Debug)]
pub struct Parts {
    pub nats: async_nats::Client,
    pub names: bus::Names,
    pub settings: Settings,
    pub spool: Arc<Spool>,
    pub spool_dir: std::path::PathBuf,
    pub shutdown: CancellationToken,
}

impl Hub {
    /// The hub, and the queue its publisher sends from.
    pub fn new(parts: Parts) -> (Arc<Self>, mpsc::UnboundedReceiver<Spooled>) {
        let (publisher, queue) = mpsc::unbounded_channel();
        let hub = Arc::new(Self {
            js: async_nats::jetstream::new(parts.nats.clone()),
            nats: parts.nats,
            names: parts.names,
            settings: parts.settings,
            bots: Mutex::default(),
            connections: AtomicU64::new(1),
            streams: Default::default(),
            spool: parts.spool,
            spool_dir: parts.spool_dir,
            publisher,
            notices: Default::default(),
            ready: CancellationToken::new(),
            shutdown: parts.shutdown,
        });
        (hub, queue)
    }

    /// Queues a spooled message for JetStream.
    pub fn to_publish(&self, message: Spooled) {
        let _ = self.publisher.send(message);
    }

    /// Tells a chat, through its bot, that its last message was not taken (at most once a
    /// minute per chat).
    pub async fn tell_not_taken(&self, bot: &Bot, stream: &str) {
        if !self.notices.due(&bot.self_id, stream) {
            return;
        }
        let notice = hark_proto::v1::OutboundMessage {
            route: Some(hark_proto::v1::ChatRoute {
                platform: bot.platform.clone(),
                bot_id: bot.self_id.clone(),
                stream: stream.to_owned(),
                origin_message_id: String::new(),
            }),
            text: inbound::NOT_TAKEN.into(),
            ..Default::default()
        };
        if let Ok((action, params)) = outbound::onebot_action(&notice)
            && let Err(e) = bot.call(action, params, self.settings.send_timeout).await
        {
            tracing::warn!(error = %e, "cannot tell the chat its message was not taken");
        }
    }

    fn lock_bots(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<Bot>>> {
        self.bots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bots online now, as `(platform, self id)`.
    pub fn online(&self) -> Vec<(String, String)> {
        self.lock_bots().keys().cloned().collect()
    }

    pub fn bot(&self, platform: &str, self_id: &str) -> Option<Arc<Bot>> {
        self.lock_bots()
            .get(&(platform.to_owned(), self_id.to_owned()))
            .cloned()
    }

    /// Registers a new connection of a bot, replacing (and closing) its previous one, and starts
    /// delivering its outbound messages. Returns the bot and the frames to write to the socket.
    pub fn attach(
        self: &Arc<Self>,
        platform: &str,
        self_id: &str,
    ) -> (Arc<Bot>, mpsc::Receiver<String>) {
        let (out, rx) = mpsc::channel(64);
        let bot = Arc::new(Bot {
            platform: platform.to_owned(),
            self_id: self_id.to_owned(),
            connection: self.connections.fetch_add(1, Ordering::Relaxed),
            out,
            pending: Mutex::default(),
            closed: self.shutdown.child_token(),
            last_seen: Mutex::new(Instant::now()),
            closing: Mutex::new(None),
        });
        let previous = self
            .lock_bots()
            .insert((platform.to_owned(), self_id.to_owned()), bot.clone());
        if let Some(previous) = previous {
            tracing::info!(
                platform,
                bot = self_id,
                "a new connection replaces the bot's previous one"
            );
            previous.closed.cancel();
        }
        tracing::info!(
            platform,
            bot = self_id,
            connection = bot.connection,
            "bot online"
        );
        tokio::spawn(outbound::deliver(self.clone(), bot.clone()));
        (bot, rx)
    }

    fn detach(&self, bot: &Bot) {
        let key = (bot.platform.clone(), bot.self_id.clone());
        let mut bots = self.lock_bots();
        if bots
            .get(&key)
            .is_some_and(|b| b.connection == bot.connection)
        {
            bots.remove(&key);
            tracing::info!(platform = bot.platform, bot = bot.self_id, "bot offline");
        }
        bot.closed.cancel();
    }

    /// Handles a connection's inbound frames until it closes or is replaced. Bad frames are
    /// logged and dropped; the connection stays up. Messages go, in order, to the connection's
    /// ingest task, which spools them.
    pub async fn serve(self: Arc<Self>, bot: Arc<Bot>, mut incoming: mpsc::Receiver<Incoming>) {
        let (messages, ingesting) = mpsc::channel(256);
        let ingest = tokio::spawn(inbound::ingest(self.clone(), bot.clone(), ingesting));
        let mut limiter = Limiter::new(self.settings.rate_limit);
        let mut dropped = 0u64;
        let idle_timeout = self.settings.idle_timeout;
        let period = idle_timeout.map_or(Duration::from_secs(3600), |t| t / 3);
        let mut checks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            let frame = tokio::select! {
                _ = bot.closed.cancelled() => break,
                frame = incoming.recv() => frame,
                _ = checks.tick(), if idle_timeout.is_some() => {
                    let silent = bot.last_seen.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                    if idle_timeout.is_some_and(|limit| silent >= limit) {
                        tracing::warn!(
                            bot = bot.self_id,
                            silent_s = silent.as_secs(),
                            "closing a bot connection that sent nothing, not even a pong \
                             (gateway.onebot.idle_timeout); the bot is expected to connect again"
                        );
                        break;
                    }
                    continue;
                }
            };
            let Some(frame) = frame else { break };
            *bot.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            let text = match frame {
                Incoming::Text(text) => text,
                Incoming::Alive => continue,
                Incoming::TooBig => {
                    let limit = self.settings.max_frame_bytes;
                    tracing::warn!(
                        bot = bot.self_id,
                        limit,
                        "closing a bot connection that sent a frame larger than gateway.max_frame_bytes"
                    );
                    bot.close_with(
                        close_code::TOO_BIG,
                        format!(
                            "message too big: the limit is {limit} bytes (gateway.max_frame_bytes)"
                        ),
                    );
                    break;
                }
                Incoming::Binary(len) => {
                    tracing::warn!(
                        bot = bot.self_id,
                        len,
                        "dropping a binary frame: OneBot frames are JSON text"
                    );
                    continue;
                }
                Incoming::Closed(reason) => {
                    tracing::info!(bot = bot.self_id, reason, "bot connection closed");
                    break;
                }
            };
            match event::parse(&text, &bot.platform) {
                Ok(Frame::Response {
                    echo,
                    ok,
                    data,
                    message,
                }) => {
                    bot.resolve(&echo, if ok { Ok(data) } else { Err(message) });
                }
                Ok(_) if !limiter.allow() => {
                    dropped += 1;
                    if dropped.is_power_of_two() {
                        tracing::warn!(
                            bot = bot.self_id,
                            dropped,
                            "rate limit: dropping events from a flooding bot"
                        );
                    }
                }
                // A frame speaks only for its own connection: a bot that claims to be another
                // bot is not believed.
                Ok(Frame::Message(message)) if message.bot_id != bot.self_id => {
                    tracing::warn!(
                        connection_bot = bot.self_id,
                        frame_self_id = message.bot_id,
                        "dropping a message whose self_id is not the bot of its connection"
                    );
                }
                Ok(Frame::Message(message)) => {
                    if messages.send(*message).await.is_err() {
                        break;
                    }
                }
                Ok(Frame::Meta { kind }) => tracing::trace!(bot = bot.self_id, kind, "meta event"),
                Ok(Frame::Own) => {}
                Ok(Frame::Ignored { post_type }) => {
                    tracing::debug!(bot = bot.self_id, post_type, "ignoring event")
                }
                Err(e) => {
                    let preview: String = text.chars().take(80).collect();
                    tracing::warn!(bot = bot.self_id, error = %e, preview, "dropping a bad frame");
                }
            }
        }
        self.detach(&bot);
        // What was read is spooled before the connection's task ends.
        drop(messages);
        let _ = ingest.await;
    }

    /// Publishes an inbound message of the HTTP adapter to `CHAT_IN`, deduplicated by its
    /// platform message id, in the trace `trace` (a new one when the sender gave none), and
    /// returns once JetStream acknowledged it.
    pub async fn publish_now(
        &self,
        message: hark_proto::v1::ChatMessage,
        trace: Option<hark_core::trace::TraceContext>,
    ) -> Result<(), String> {
        hark_core::trace::scope(trace, async {
            let spooled = inbound::spooled(&self.names, message).map_err(|e| e.to_string())?;
            inbound::send(&self.js, &spooled).await
        })
        .await
    }
}
