//! OneBot connections, whichever side dialled: [`attach`] registers a bot with the [`Hub`],
//! replacing its old connection, and starts delivering its messages; [`serve`] reads its frames,
//! passing messages on to be spooled; [`Bot::call`] calls an action and awaits its answer.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Door, event::Frame, platform::OneBot};
use crate::{
    inbound, outbound,
    platform::{Inbound, Platform as _},
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

/// Registers a new connection of a bot, replacing (and closing) its previous one, and starts
/// delivering its outbound messages. Returns the bot and the frames to write to the socket.
pub fn attach(door: &Door, platform: &str, self_id: &str) -> (Arc<Bot>, mpsc::Receiver<String>) {
    let hub = &door.hub;
    let (out, rx) = mpsc::channel(64);
    let bot = Arc::new(Bot {
        platform: platform.to_owned(),
        self_id: self_id.to_owned(),
        connection: door.bots.next_connection(),
        out,
        pending: Mutex::default(),
        closed: hub.shutdown.child_token(),
        last_seen: Mutex::new(Instant::now()),
        closing: Mutex::new(None),
    });
    let previous = door
        .bots
        .lock()
        .insert((platform.to_owned(), self_id.to_owned()), bot.clone());
    if previous.is_none() {
        hub.metrics.bots.of(platform).add(1);
    }
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
    let platform = Arc::new(OneBot::new(bot.clone(), hub.settings.send_timeout));
    tokio::spawn(outbound::run(
        hub.clone(),
        platform,
        bot.platform.clone(),
        bot.self_id.clone(),
        bot.closed.clone(),
    ));
    (bot, rx)
}

fn detach(door: &Door, bot: &Bot) {
    let (hub, key) = (&door.hub, (bot.platform.clone(), bot.self_id.clone()));
    let mut bots = door.bots.lock();
    if bots
        .get(&key)
        .is_some_and(|b| b.connection == bot.connection)
    {
        bots.remove(&key);
        hub.metrics.bots.of(&bot.platform).add(-1);
        tracing::info!(platform = bot.platform, bot = bot.self_id, "bot offline");
    }
    bot.closed.cancel();
}

/// Handles a connection's inbound frames until it closes or is replaced. Bad frames are
/// logged and dropped; the connection stays up. Messages go, in order, to the connection's
/// ingest task, which spools them.
pub async fn serve(door: Door, bot: Arc<Bot>, mut incoming: mpsc::Receiver<Incoming>) {
    let hub = door.hub.clone();
    let (messages, ingesting) = mpsc::channel(256);
    let platform = Arc::new(OneBot::new(bot.clone(), hub.settings.send_timeout));
    let ingest = tokio::spawn(inbound::ingest(hub.clone(), platform.clone(), ingesting));
    let mut limiter = Limiter::new(hub.settings.rate_limit);
    let mut dropped = 0u64;
    let idle_timeout = hub.settings.idle_timeout;
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
                let limit = hub.settings.max_frame_bytes;
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
        match platform.normalise(&text) {
            Ok(Inbound::Other(Frame::Response {
                echo,
                ok,
                data,
                message,
            })) => {
                bot.resolve(&echo, if ok { Ok(data) } else { Err(message) });
            }
            _ if !limiter.allow() => {
                dropped += 1;
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        bot = bot.self_id,
                        dropped,
                        "rate limit: dropping events from a flooding bot"
                    );
                }
            }
            Ok(Inbound::Message(message)) => {
                if messages.send(*message).await.is_err() {
                    break;
                }
            }
            Ok(Inbound::Other(Frame::Meta { kind })) => {
                tracing::trace!(bot = bot.self_id, kind, "meta event")
            }
            Ok(Inbound::Other(Frame::Ignored { post_type })) => {
                tracing::debug!(bot = bot.self_id, post_type, "ignoring event")
            }
            Ok(Inbound::Other(_)) => {}
            Err(e) => {
                let preview: String = text.chars().take(80).collect();
                tracing::warn!(bot = bot.self_id, error = %e, preview, "dropping a frame");
            }
        }
    }
    detach(&door, &bot);
    // What was read is spooled before the connection's task ends.
    drop(messages);
    let _ = ingest.await;
}
