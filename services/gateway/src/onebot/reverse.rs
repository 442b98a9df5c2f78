//! The OneBot v11 reverse WebSocket server (the bot dials in), Universal role, at
//! `/onebot/v11/ws` and the other paths NoneBot serves.

use std::collections::HashMap;

use axum::{
    extract::{
        Query, State,
        ws::{Message, WebSocket, WebSocketUpgrade},
    },
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use futures_util::StreamExt;
use hark_core::secret::Secret;
use tokio::sync::mpsc;

use crate::onebot::{
    Door,
    conn::{self, Frames, Incoming, write_frames},
};

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Whether the request carries the configured access token, as a header or a query parameter.
pub fn authorized(expected: &Secret, headers: &HeaderMap, query: &HashMap<String, String>) -> bool {
    if expected.is_empty() {
        return true;
    }
    let from_header = crate::bearer(headers).or_else(|| {
        header(headers, "authorization").and_then(|h| h.strip_prefix("Token ").map(str::trim))
    });
    let given = from_header.or(query.get("access_token").map(|t| t.trim()));
    given.is_some_and(|g| expected.matches(g))
}

pub async fn upgrade(
    State(door): State<Door>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(self_id) = header(&headers, "x-self-id").map(str::to_owned) else {
        return (
            StatusCode::BAD_REQUEST,
            "missing X-Self-ID header: the bot's own account id",
        )
            .into_response();
    };
    if let Err(e) = hark_core::domain::ids::bot_id("X-Self-ID", &self_id) {
        return (
            StatusCode::BAD_REQUEST,
            format!("{e}: the bot's own account id"),
        )
            .into_response();
    }
    let hub = &door.hub;
    // A bot with a token of its own connects only with it; no other token speaks as it.
    let expected = hub.settings.token_of(&self_id);
    if !expected.is_some_and(|token| authorized(token, &headers, &query)) {
        let which = if hub.settings.bot_tokens.contains_key(&self_id) {
            format!("gateway.onebot.bots.{self_id}.access_token")
        } else {
            "gateway.onebot.access_token".to_owned()
        };
        tracing::warn!(
            bot = self_id,
            "refused a OneBot connection: wrong or missing access token"
        );
        return (
            StatusCode::UNAUTHORIZED,
            format!("wrong or missing access token: send Authorization: Bearer <{which}>"),
        )
            .into_response();
    }
    if let Some(role) = header(&headers, "x-client-role")
        && !role.eq_ignore_ascii_case("universal")
    {
        return (
            StatusCode::BAD_REQUEST,
            format!("X-Client-Role {role} is not supported: configure the bot's reverse WebSocket as Universal"),
        )
            .into_response();
    }
    let max = hub.settings.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| connection(door, socket, self_id))
}

async fn connection(door: Door, socket: WebSocket, self_id: String) {
    let hub = door.hub.clone();
    let platform = hub.settings.platform.clone();
    let (bot, outgoing) = conn::attach(&door, &platform, &self_id);
    let (sink, mut stream) = socket.split();
    let (tx, rx) = mpsc::channel(256);
    let writer = tokio::spawn(write_frames(
        sink,
        outgoing,
        bot.clone(),
        Frames {
            text: |t| Message::Text(t.into()),
            ping: || Message::Ping(Default::default()),
            close: |code, reason| {
                Message::Close(Some(axum::extract::ws::CloseFrame {
                    code,
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
                Ok(Message::Ping(_) | Message::Pong(_)) => Incoming::Alive,
                Ok(Message::Close(frame)) => {
                    let _ = tx
                        .send(Incoming::Closed(
                            frame.map(|f| f.reason.to_string()).unwrap_or_default(),
                        ))
                        .await;
                    return;
                }
                Err(e) => {
                    let inner = e.into_inner();
                    let incoming =
                        match inner.downcast_ref::<tokio_tungstenite::tungstenite::Error>() {
                            Some(tokio_tungstenite::tungstenite::Error::Capacity(_)) => {
                                Incoming::TooBig
                            }
                            _ => Incoming::Closed(inner.to_string()),
                        };
                    let _ = tx.send(incoming).await;
                    return;
                }
            };
            if tx.send(incoming).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Incoming::Closed("end of stream".into())).await;
    });
    conn::serve(door, bot, rx).await;
    reader.abort();
    let _ = writer.await;
}
