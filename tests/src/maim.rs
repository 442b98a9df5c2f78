//! A chat platform's adapter for MaiBot, played over maim_message's WebSocket as the Napcat
//! adapter plays it for QQ: it dials MaiBot's `/ws` naming its platform, sends the chat's
//! messages, records what MaiBot posts, gives each posted message a platform id and tells MaiBot
//! that id (`message_id_echo`), so that a quote of it reads as the message it quotes. The chat
//! is played through a [`Bot`], as with a OneBot v11 bot.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

use crate::bot::{Bot, Sent, Speaks};

/// Connects to MaiBot's maim_message WebSocket on `port` as `platform`'s adapter for the bot
/// account `account`, retrying while MaiBot starts (it may take a minute on a loaded machine).
/// The chat is then played through the [`Bot`] returned, as with a OneBot v11 bot.
pub async fn connect(port: u16, platform: &str, account: i64) -> Bot {
    let url = format!("ws://127.0.0.1:{port}/ws");
    let mut socket = None;
    for _ in 0..1200 {
        let mut request = url.clone().into_client_request().expect("request");
        request
            .headers_mut()
            .insert("platform", platform.parse().expect("header"));
        if let Ok((ws, _)) = tokio_tungstenite::connect_async(request).await {
            socket = Some(ws);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let socket =
        socket.unwrap_or_else(|| panic!("MaiBot did not accept an adapter on {url} within 120s"));
    let (sink, mut stream) = socket.split();
    let to_maibot = crate::bot::writer(sink);
    let (sent_tx, sent) = mpsc::channel(256);
    let echoes = to_maibot.clone();
    tokio::spawn(async move {
        let mut next_message_id = 9000i64;
        while let Some(Ok(frame)) = stream.next().await {
            let Message::Text(text) = frame else { continue };
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let info = &message["message_info"];
            let Some(maibot_id) = info["message_id"].as_str() else {
                continue;
            };
            next_message_id += 1;
            let stream_id = match info["group_info"]["group_id"].as_str() {
                Some(group) => format!("group:{group}"),
                None => format!(
                    "private:{}",
                    info["receiver_info"]["user_info"]["user_id"]
                        .as_str()
                        .or(info["additional_config"]["platform_io_target_user_id"].as_str())
                        .unwrap_or_default()
                ),
            };
            let mut body = String::new();
            let mut reply_to = String::new();
            let mut mentions = Vec::new();
            read_segment(
                &message["message_segment"],
                &mut body,
                &mut reply_to,
                &mut mentions,
            );
            let echo = json!({"is_custom_message": true, "message_type_name": "message_id_echo",
                "content": {"type": "echo", "echo": maibot_id, "actual_id": next_message_id.to_string()}});
            let _ = echoes.send(echo.to_string()).await;
            let _ = sent_tx
                .send(Sent {
                    stream: stream_id,
                    text: body,
                    message_id: next_message_id,
                    reply_to,
                    mentions,
                })
                .await;
        }
    });
    Bot::from_parts(
        account,
        to_maibot,
        sent,
        Speaks::Maim {
            platform: platform.to_owned(),
        },
    )
}

/// A message of the chat as the adapter hands it to MaiBot: `user` writes `text` in `group` (or
/// to the bot), quoting the platform message `quote` and mentioning `mentions`. It names the bot's
/// `account` at its top level, where MaiBot 1.3 asks adapters to (MaiBot's own replies that quote
/// need it).
#[expect(clippy::too_many_arguments, reason = "one message's fields")]
pub(crate) fn message(
    platform: &str,
    account: i64,
    id: i64,
    user: i64,
    group: Option<i64>,
    text: &str,
    quote: Option<i64>,
    mentions: &[i64],
) -> Value {
    let mut segments = Vec::new();
    if let Some(quoted) = quote {
        segments.push(json!({"type": "reply", "data": quoted.to_string()}));
    }
    segments.push(json!({"type": "text", "data": text}));
    for user in mentions {
        segments.push(json!({"type": "at", "data": user.to_string()}));
    }
    let mut info = json!({"platform": platform, "message_id": id.to_string(),
        "time": 1_700_000_000 + id,
        "user_info": {"platform": platform, "user_id": user.to_string(), "user_nickname": format!("member {user}")},
        "format_info": {"content_format": ["text"], "accept_format": ["text", "reply", "at"]}});
    if let Some(group) = group {
        info["group_info"] = json!({"platform": platform, "group_id": group.to_string(), "group_name": format!("group {group}")});
    }
    json!({"message_info": info, "message_segment": {"type": "seglist", "data": segments},
        "account_id": account.to_string()})
}

/// The text, quote and mentions of a maim_message segment (a `seglist` of them, nested).
fn read_segment(
    segment: &Value,
    body: &mut String,
    reply_to: &mut String,
    mentions: &mut Vec<String>,
) {
    match segment["type"].as_str() {
        Some("seglist") => {
            for part in segment["data"].as_array().into_iter().flatten() {
                read_segment(part, body, reply_to, mentions);
            }
        }
        Some("text") => body.push_str(segment["data"].as_str().unwrap_or_default()),
        Some("reply") => *reply_to = segment["data"].as_str().unwrap_or_default().to_owned(),
        Some("at") => mentions.push(segment["data"].as_str().unwrap_or_default().to_owned()),
        _ => {}
    }
}
