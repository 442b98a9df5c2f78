//! OneBot v11 as a [`Platform`]: one instance per bot connection, since a OneBot frame speaks
//! only for the bot of the connection it came on, and a message is sent by calling an action
//! on that connection.

use std::{sync::Arc, time::Duration};

use futures_util::future::BoxFuture;
use hark_proto::v1 as pb;
use serde_json::{Value, json};

use super::{
    conn::{ActionError, Bot},
    cq,
    event::{self, Frame},
};
use crate::platform::{Inbound, Platform, SendError};

/// How long the bot has to answer `get_msg` for a quoted message.
const QUOTE_LOOKUP: Duration = Duration::from_secs(2);

/// One OneBot bot's connection.
#[derive(Debug, Clone)]
pub struct OneBot {
    bot: Arc<Bot>,
    /// How long the bot has to confirm a send (`gateway.send_timeout`).
    send_timeout: Duration,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Frame(#[from] event::Error),
    /// A frame speaks only for its own connection: a bot that claims to be another bot is not
    /// believed.
    #[error("the frame's self_id `{claimed}` is not the bot of its connection, `{connection}`")]
    OtherBot { claimed: String, connection: String },
}

impl OneBot {
    pub fn new(bot: Arc<Bot>, send_timeout: Duration) -> Self {
        Self { bot, send_timeout }
    }

    pub fn bot(&self) -> &Arc<Bot> {
        &self.bot
    }
}

impl Platform for OneBot {
    type Delivery = str;
    type Other = Frame;
    type Refusal = Refusal;

    fn normalise(&self, frame: &str) -> Result<Inbound<Frame>, Refusal> {
        match event::parse(frame, &self.bot.platform)? {
            Frame::Message(message) if message.bot_id != self.bot.self_id => {
                Err(Refusal::OtherBot {
                    claimed: hark_core::domain::ids::shown(&message.bot_id),
                    connection: self.bot.self_id.clone(),
                })
            }
            Frame::Message(message) => Ok(Inbound::Message(message)),
            other => Ok(Inbound::Other(other)),
        }
    }

    fn send(
        &self,
        message: pb::OutboundMessage,
    ) -> BoxFuture<'_, Result<Option<String>, SendError>> {
        Box::pin(async move {
            let (action, params) = send_action(&message).map_err(SendError::Retry)?;
            match self.bot.call(action, params, self.send_timeout).await {
                Ok(data) => Ok(crate::platform::message_id(data.get("message_id"))),
                Err(ActionError::Disconnected { .. }) => Err(SendError::Offline),
                Err(e) => Err(SendError::Retry(e.to_string())),
            }
        })
    }

    /// Asks the bot for the quoted message, and notes its text and author.
    fn complete<'a>(&'a self, message: &'a mut pb::ChatMessage) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if message.quoted_message_id.is_empty() {
                return;
            }
            let params = json!({"message_id": id(&message.quoted_message_id)});
            match self.bot.call("get_msg", params, QUOTE_LOOKUP).await {
                Ok(data) => {
                    let segments = match data.get("message") {
                        Some(m) if !m.is_null() => cq::parse_message(m),
                        _ => cq::parse_cq(data["raw_message"].as_str().unwrap_or_default()),
                    };
                    message.quoted_text = segments
                        .iter()
                        .filter(|s| s.kind == "text")
                        .filter_map(|s| s.get("text"))
                        .collect::<String>()
                        .chars()
                        .take(2000)
                        .collect();
                    message.quoted_sender =
                        crate::platform::message_id(data.pointer("/sender/user_id"))
                            .unwrap_or_default();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the bot did not say what the quoted message was")
                }
            }
        })
    }
}

/// A OneBot id as the protocol expects it: a number when it is one.
pub fn id(id: &str) -> Value {
    id.parse::<i64>().map_or_else(|_| json!(id), |n| json!(n))
}

/// The OneBot action that sends `message`.
pub fn send_action(message: &pb::OutboundMessage) -> Result<(&'static str, Value), String> {
    let route = message.route.as_ref().ok_or("the message has no route")?;
    let (kind, target) = route
        .stream
        .split_once(':')
        .ok_or_else(|| format!("`{}` is not a stream", route.stream))?;
    let mut segments = Vec::new();
    if !message.reply_to_message_id.is_empty() {
        segments.push(json!({"type": "reply", "data": {"id": message.reply_to_message_id}}));
    }
    if kind == "group" {
        for user in &message.mentions {
            segments.push(json!({"type": "at", "data": {"qq": id(user)}}));
            segments.push(json!({"type": "text", "data": {"text": " "}}));
        }
    }
    segments.push(json!({"type": "text", "data": {"text": message.text}}));
    match kind {
        "group" => Ok((
            "send_group_msg",
            json!({"group_id": id(target), "message": segments}),
        )),
        "private" => Ok((
            "send_private_msg",
            json!({"user_id": id(target), "message": segments}),
        )),
        other => Err(format!("OneBot cannot send to a `{other}` stream")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_reply_becomes_send_group_msg_with_a_reply_segment() {
        let message = pb::OutboundMessage {
            route: Some(crate::platform::route("qq", "42", "group:777")),
            text: "hi".into(),
            reply_to_message_id: "-5".into(),
            ..Default::default()
        };
        let (action, params) = send_action(&message).expect("action");
        assert_eq!(action, "send_group_msg");
        assert_eq!(params["group_id"], json!(777));
        assert_eq!(
            params["message"][0],
            json!({"type": "reply", "data": {"id": "-5"}})
        );
        assert_eq!(params["message"][1]["data"]["text"], "hi");
    }

    #[test]
    fn a_group_message_mentions_whom_it_names_and_a_private_one_does_not() {
        let mut message = pb::OutboundMessage {
            route: Some(crate::platform::route("qq", "42", "group:777")),
            text: "which one?".into(),
            mentions: vec!["10002".into()],
            ..Default::default()
        };
        let (_, params) = send_action(&message).expect("action");
        assert_eq!(
            params["message"],
            json!([
                {"type": "at", "data": {"qq": 10002}},
                {"type": "text", "data": {"text": " "}},
                {"type": "text", "data": {"text": "which one?"}},
            ])
        );
        message.route = Some(crate::platform::route("qq", "42", "private:10002"));
        let (_, params) = send_action(&message).expect("action");
        assert_eq!(
            params["message"],
            json!([{"type": "text", "data": {"text": "which one?"}}])
        );
    }

    #[test]
    fn a_private_message_goes_to_its_user_and_other_streams_are_refused() {
        let mut message = pb::OutboundMessage {
            route: Some(crate::platform::route("qq", "42", "private:1001")),
            text: "hi".into(),
            ..Default::default()
        };
        let (action, params) = send_action(&message).expect("action");
        assert_eq!(action, "send_private_msg");
        assert_eq!(params["user_id"], json!(1001));
        assert_eq!(params["message"].as_array().map(Vec::len), Some(1));
        message.route = Some(crate::platform::route("qq", "42", "channel:9"));
        assert!(send_action(&message).unwrap_err().contains("channel"));
        message.route = None;
        assert!(send_action(&message).is_err());
    }
}
