//! OneBot forward mode: hark dials the bot's own WebSocket server (NapCat's `websocketServers`)
//! and keeps the connection, reconnecting with backoff.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{
    Message, client::IntoClientRequest, protocol::WebSocketConfig,
};

use crate::onebot::{
    Door,
    conn::{self, Frames, Incoming, write_frames},
};

/// Keeps one forward connection up until shutdown.
pub async fn keep_connected(door: Door, url: String) {
    let hub = &door.hub;
    let shown = hark_core::secret::redact_url(&url);
    let mut backoff = Duration::from_secs(1);
    loop {
        if hub.shutdown.is_cancelled() {
            return;
        }
        match connect_once(&door, &url, &shown).await {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(e) => {
                tracing::warn!(url = shown, error = %e, ?backoff, "forward OneBot connection failed; reconnecting")
            }
        }
        tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn connect_once(door: &Door, url: &str, shown: &str) -> Result<(), String> {
    let hub = &door.hub;
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if !hub.settings.access_token.is_empty() {
        let value = format!("Bearer {}", hub.settings.access_token.expose())
            .parse()
            .map_err(|_| "the access token cannot be sent as a header".to_owned())?;
        request.headers_mut().insert("authorization", value);
    }
    let max = hub.settings.max_frame_bytes;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let (socket, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(|e| e.to_string())?;
    let (sink, mut stream) = socket.split();

    // The bot names itself in its first event (the lifecycle event, or any other).
    let first = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(frame) = stream.next().await {
            if let Ok(Message::Text(text)) = frame
                && let Ok(value) = serde_json::from_str::<Value>(&text)
                && let Some(id) = value.get("self_id").and_then(|v| match v {
                    Value::Number(n) => Some(n.to_string()),
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
            {
                return Some((id, text.to_string()));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .ok_or("the bot did not say who it is (no event with self_id within 15s)")?;
    let (self_id, first_text) = first;
    tracing::info!(url = shown, bot = self_id, "forward OneBot connection up");

    let platform = hub.settings.platform.clone();
    let (bot, outgoing) = conn::attach(door, &platform, &self_id);
    let (tx, rx) = mpsc::channel(256);
    let _ = tx.send(Incoming::Text(first_text)).await;
    let writer = tokio::spawn(write_frames(
        sink,
        outgoing,
        bot.clone(),
        Frames {
            text: |t| Message::Text(t.into()),
            ping: || Message::Ping(Default::default()),
            close: |code, reason| {
                Message::Close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
                    code: code.into(),
                    reason: reason.into(),
                }))
            },
        },
        hub.settings.idle_timeout,
    ));
    let reader = tokio::spawn(async move {
        while let Some(frame) = stream.next().await {
            let incoming = match frame {
                Ok(Message::Text(text)) => Incoming::Text(text.to_string()),
                Ok(Message::Binary(bytes)) => Incoming::Binary(bytes.len()),
                Ok(Message::Close(_)) => break,
                Ok(Message::Ping(_) | Message::Pong(_)) => Incoming::Alive,
                Ok(_) => continue,
                Err(tokio_tungstenite::tungstenite::Error::Capacity(_)) => {
                    let _ = tx.send(Incoming::TooBig).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Incoming::Closed(e.to_string())).await;
                    return;
                }
            };
            if tx.send(incoming).await.is_err() {
                return;
            }
        }
        let _ = tx
            .send(Incoming::Closed("the bot closed the connection".into()))
            .await;
    });
    conn::serve(door.clone(), bot, rx).await;
    reader.abort();
    let _ = writer.await;
    Ok(())
}
