//! A OneBot v11 bot played over WebSocket: it dials the gateway's reverse WebSocket, sends group
//! messages as a QQ group would, and answers the gateway's send actions, recording what the
//! bot "posted" in the group.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

/// Writes each frame sent to the returned channel to `sink`, in order, until the connection ends.
pub(crate) fn writer<S>(mut sink: S) -> mpsc::Sender<String>
where
    S: futures_util::Sink<Message> + Unpin + Send + 'static,
{
    let (frames, mut outgoing) = mpsc::channel::<String>(64);
    tokio::spawn(async move {
        while let Some(text) = outgoing.recv().await {
            if sink.send(Message::text(text)).await.is_err() {
                return;
            }
        }
    });
    frames
}

/// A message the bot posted in a chat on hark's behalf.
#[derive(Debug, Clone)]
pub struct Sent {
    pub stream: String,
    pub text: String,
    /// The platform message id the bot gave it.
    pub message_id: i64,
    /// The message it quotes, if any.
    pub reply_to: String,
    /// The users it mentions (its `at` segments).
    pub mentions: Vec<String>,
}

#[derive(Debug)]
pub struct Bot {
    pub self_id: i64,
    to_gateway: mpsc::Sender<String>,
    sent: mpsc::Receiver<Sent>,
    next_id: i64,
    /// How its chat's messages are framed.
    speaks: Speaks,
}

/// The protocol between the chat and what the bot connects to.
#[derive(Debug, Clone)]
pub(crate) enum Speaks {
    /// OneBot v11 events.
    OneBot,
    /// maim_message, as a platform adapter of MaiBot's speaks it.
    Maim { platform: String },
}

impl Bot {
    /// Connects to the gateway at `port`, retrying while it starts.
    pub async fn connect(port: u16, self_id: i64, token: &str) -> Self {
        Self::connect_at(port, "/onebot/v11/ws", self_id, token).await
    }

    /// Connects to the OneBot v11 reverse WebSocket at `path` on `port` (aiocqhttp serves
    /// `/ws`), retrying while it starts.
    pub async fn connect_at(port: u16, path: &str, self_id: i64, token: &str) -> Self {
        let url = format!("ws://127.0.0.1:{port}{path}");
        let mut socket = None;
        for _ in 0..300 {
            let mut request = url.clone().into_client_request().expect("request");
            request
                .headers_mut()
                .insert("x-self-id", self_id.to_string().parse().expect("header"));
            // One connection for both events and actions, as NapCat dials by default.
            request
                .headers_mut()
                .insert("x-client-role", "Universal".parse().expect("header"));
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("header"),
            );
            if let Ok((ws, _)) =
                tokio_tungstenite::connect_async_with_config(request, None, true).await
            {
                socket = Some(ws);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let socket = socket
            .unwrap_or_else(|| panic!("the gateway did not accept a bot on {url} within 30s"));
        let (sink, mut stream) = socket.split();
        let to_gateway = writer(sink);
        let (sent_tx, sent) = mpsc::channel(256);
        let replies = to_gateway.clone();
        let own_id = self_id;
        tokio::spawn(async move {
            let mut next_message_id = 9000i64;
            // What the bot posted, by message id, to answer get_msg as a real bot does.
            let mut posted: std::collections::HashMap<i64, String> = Default::default();
            while let Some(Ok(frame)) = stream.next().await {
                let Message::Text(text) = frame else { continue };
                let Ok(action) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let Some(name) = action["action"].as_str() else {
                    continue;
                };
                if name == "get_msg" {
                    let id = action["params"]["message_id"].as_i64().unwrap_or_default();
                    let response = match posted.get(&id) {
                        Some(text) => json!({"status": "ok", "retcode": 0, "echo": action["echo"],
                            "data": {"message_id": id, "real_id": id, "time": 1_700_000_000,
                                     "message_type": "group", "sender": {"user_id": own_id},
                                     "message": [{"type": "text", "data": {"text": text}}]}}),
                        None => json!({"status": "failed", "retcode": 100, "echo": action["echo"],
                            "message": "no such message"}),
                    };
                    let _ = replies.send(response.to_string()).await;
                    continue;
                }
                next_message_id += 1;
                let params = &action["params"];
                let stream_id = match (name, params["message_type"].as_str()) {
                    ("send_group_msg", _) | ("send_msg", Some("group")) => {
                        format!("group:{}", params["group_id"])
                    }
                    ("send_private_msg", _) | ("send_msg", Some("private")) => {
                        format!("private:{}", params["user_id"])
                    }
                    _ => String::new(),
                };
                let mut body = String::new();
                let mut reply_to = String::new();
                let mut mentions = Vec::new();
                for segment in params["message"].as_array().into_iter().flatten() {
                    match segment["type"].as_str() {
                        Some("text") => {
                            body.push_str(segment["data"]["text"].as_str().unwrap_or_default())
                        }
                        Some("reply") => {
                            reply_to = segment["data"]["id"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned()
                        }
                        Some("at") => mentions.push(segment["data"]["qq"].to_string()),
                        _ => {}
                    }
                }
                posted.insert(next_message_id, body.clone());
                let response = json!({"status": "ok", "retcode": 0, "data": {"message_id": next_message_id}, "echo": action["echo"]});
                let _ = replies.send(response.to_string()).await;
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
        Self::from_parts(self_id, to_gateway, sent, Speaks::OneBot)
    }

    /// A bot whose frames go to `to_gateway`, framed as it `speaks`, and whose posts arrive on
    /// `sent`.
    pub(crate) fn from_parts(
        self_id: i64,
        to_gateway: mpsc::Sender<String>,
        sent: mpsc::Receiver<Sent>,
        speaks: Speaks,
    ) -> Self {
        Self {
            self_id,
            to_gateway,
            sent,
            next_id: 1,
            speaks,
        }
    }

    /// A group member writes in group `group`; returns the platform message id.
    pub async fn group_message(&mut self, group: i64, user: i64, text: &str) -> i64 {
        self.group_message_quoting(group, user, text, None).await
    }

    pub async fn group_message_quoting(
        &mut self,
        group: i64,
        user: i64,
        text: &str,
        quote: Option<i64>,
    ) -> i64 {
        self.group_message_with(group, user, text, quote, &[]).await
    }

    /// A group member writes `text` after an @ of each of `mentions`, as QQ sends a mention.
    pub async fn group_message_mentioning(
        &mut self,
        group: i64,
        user: i64,
        text: &str,
        mentions: &[i64],
    ) -> i64 {
        self.group_message_with(group, user, text, None, mentions)
            .await
    }

    async fn group_message_with(
        &mut self,
        group: i64,
        user: i64,
        text: &str,
        quote: Option<i64>,
        mentions: &[i64],
    ) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let event = match &self.speaks {
            Speaks::OneBot => {
                let mut segments = Vec::new();
                if let Some(quoted) = quote {
                    segments.push(json!({"type": "reply", "data": {"id": quoted.to_string()}}));
                }
                segments.push(json!({"type": "text", "data": {"text": text}}));
                for user in mentions {
                    segments.push(json!({"type": "at", "data": {"qq": user.to_string(), "name": format!("member {user}")}}));
                }
                json!({"time": 1_700_000_000 + id, "self_id": self.self_id, "post_type": "message",
                    "message_type": "group", "sub_type": "normal", "message_id": id, "group_id": group,
                    "user_id": user, "message": segments, "raw_message": text, "font": 0,
                    "sender": {"user_id": user, "nickname": format!("member {user}"), "card": ""}})
            }
            Speaks::Maim { platform } => crate::maim::message(
                platform,
                self.self_id,
                id,
                user,
                Some(group),
                text,
                quote,
                mentions,
            ),
        };
        self.send(event).await;
        id
    }

    async fn send(&self, frame: Value) {
        self.to_gateway
            .send(frame.to_string())
            .await
            .expect("the bot's connection is open");
    }

    /// `user` writes `text` to the bot in their private chat.
    pub async fn private_message(&mut self, user: i64, text: &str) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let event = match &self.speaks {
            Speaks::OneBot => {
                json!({"time": 1_700_000_000 + id, "self_id": self.self_id, "post_type": "message",
                    "message_type": "private", "sub_type": "friend", "message_id": id, "user_id": user,
                    "message": [{"type": "text", "data": {"text": text}}], "raw_message": text, "font": 0,
                    "sender": {"user_id": user, "nickname": format!("member {user}")}})
            }
            Speaks::Maim { platform } => {
                crate::maim::message(platform, self.self_id, id, user, None, text, None, &[])
            }
        };
        self.send(event).await;
        id
    }

    /// Sends `frame` to the gateway as it is, whatever it holds.
    pub async fn raw(&self, frame: String) {
        self.to_gateway
            .send(frame)
            .await
            .expect("the bot's connection is open");
    }

    /// Waits for a posted message matching `matches`, skipping others.
    pub async fn expect(
        &mut self,
        what: &str,
        wait: Duration,
        matches: impl Fn(&Sent) -> bool,
    ) -> Sent {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.sent.recv()).await {
                Ok(Some(sent)) if matches(&sent) => return sent,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the bot's connection closed while waiting for {what}"),
                Err(_) => panic!("the bot posted no {what} within {wait:?}"),
            }
        }
    }

    /// Numbers the bot's next messages from `first`: a bot that connects again does not reuse
    /// the ids of its messages before, as a real one does not.
    pub fn numbering_from(mut self, first: i64) -> Self {
        self.next_id = first;
        self
    }

    /// The next posted message within `wait`, if any.
    pub async fn next_sent(&mut self, wait: Duration) -> Option<Sent> {
        tokio::time::timeout(wait, self.sent.recv())
            .await
            .ok()
            .flatten()
    }

    /// Collects everything posted within `wait`.
    pub async fn drain(&mut self, wait: Duration) -> Vec<Sent> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = Vec::new();
        while let Ok(Some(sent)) = tokio::time::timeout_at(deadline, self.sent.recv()).await {
            out.push(sent);
        }
        out
    }
}
