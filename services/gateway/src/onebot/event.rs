//! Parsing OneBot v11 frames from a bot: events (messages, meta events, notices, requests) and
//! responses to our actions. Pure: no I/O, and no input makes it panic.

use hark_proto::v1 as pb;
use serde_json::Value;

use super::cq::{self, Segment};

/// What a frame from a bot is.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A chat message for hark.
    Message(Box<pb::ChatMessage>),
    /// A message the bot itself sent (`message_sent`, or from its own account): ignored.
    Own,
    /// `lifecycle` or `heartbeat`: the connection is alive.
    Meta { kind: String },
    /// Notices and requests hark does not use.
    Ignored { post_type: String },
    /// The answer to one of our actions.
    Response {
        echo: String,
        ok: bool,
        data: Value,
        message: String,
    },
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the frame is not JSON: {0}")]
    NotJson(String),
    #[error("the frame is a JSON {0}, not an object")]
    NotObject(&'static str),
    #[error("unknown post_type `{0}`")]
    UnknownPostType(String),
    #[error("the {kind} event lacks `{field}`")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("unknown message_type `{0}`")]
    UnknownMessageType(String),
    #[error(transparent)]
    BadId(#[from] hark_core::domain::IdError),
}

/// An id given as a number or a string (negative ids included).
fn id(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Parses one text frame. `platform` names the platform of this bot's messages.
pub fn parse(text: &str, platform: &str) -> Result<Frame, Error> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::NotJson(e.to_string()))?;
    parse_value(&value, platform)
}

pub fn parse_value(value: &Value, platform: &str) -> Result<Frame, Error> {
    let object = value.as_object().ok_or(Error::NotObject(kind_of(value)))?;
    if let Some(post_type) = object.get("post_type") {
        let post_type = post_type.as_str().unwrap_or_default();
        return match post_type {
            "message" => message(value, platform),
            "message_sent" => Ok(Frame::Own),
            "meta_event" => Ok(Frame::Meta {
                kind: value["meta_event_type"]
                    .as_str()
                    .unwrap_or("unknown")
                    .to_owned(),
            }),
            "notice" | "request" => Ok(Frame::Ignored {
                post_type: post_type.to_owned(),
            }),
            other => Err(Error::UnknownPostType(other.chars().take(40).collect())),
        };
    }
    if object.contains_key("status") || object.contains_key("retcode") {
        let echo = match object.get("echo") {
            Some(Value::String(s)) => s.clone(),
            Some(other) if !other.is_null() => other.to_string(),
            _ => String::new(),
        };
        let ok = object.get("status").and_then(Value::as_str) == Some("ok")
            || object.get("retcode").and_then(Value::as_i64) == Some(0);
        let message = ["wording", "message", "msg"]
            .iter()
            .find_map(|k| object.get(*k).and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned();
        return Ok(Frame::Response {
            echo,
            ok,
            data: object.get("data").cloned().unwrap_or(Value::Null),
            message,
        });
    }
    Err(Error::UnknownPostType("(none)".into()))
}

fn message(value: &Value, platform: &str) -> Result<Frame, Error> {
    let missing = |field| Error::Missing {
        kind: "message",
        field,
    };
    use hark_core::domain::ids;
    let self_id = id(value.get("self_id")).ok_or_else(|| missing("self_id"))?;
    ids::bot_id("self_id", &self_id)?;
    let user_id = id(value.get("user_id"))
        .or_else(|| id(value.pointer("/sender/user_id")))
        .ok_or_else(|| missing("user_id"))?;
    ids::chat_id("user_id", &user_id)?;
    if user_id == self_id {
        return Ok(Frame::Own);
    }
    let message_type = value["message_type"]
        .as_str()
        .ok_or_else(|| missing("message_type"))?;
    let stream = match message_type {
        "group" => {
            let group = id(value.get("group_id")).ok_or_else(|| missing("group_id"))?;
            format!("group:{}", ids::chat_id("group_id", &group)?)
        }
        "private" => format!("private:{user_id}"),
        other => return Err(Error::UnknownMessageType(other.chars().take(40).collect())),
    };
    let message_id = id(value.get("message_id")).ok_or_else(|| missing("message_id"))?;
    ids::chat_id("message_id", &message_id)?;
    let segments = match value.get("message") {
        Some(m) if !m.is_null() => cq::parse_message(m),
        _ => cq::parse_cq(value["raw_message"].as_str().unwrap_or_default()),
    };
    let mut content = content(&segments, &self_id);
    // A quote of an id hark could not use is no quote: the message is still read.
    if ids::chat_id("reply id", &content.quoted).is_err() {
        content.quoted.clear();
    }
    let nickname = ["card", "nickname"]
        .iter()
        .find_map(|k| {
            value
                .pointer(&format!("/sender/{k}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_default()
        .to_owned();
    let time = value["time"]
        .as_i64()
        .map(|seconds| prost_types::Timestamp { seconds, nanos: 0 });
    Ok(Frame::Message(Box::new(pb::ChatMessage {
        version: hark_proto::WIRE_VERSION,
        platform: platform.to_owned(),
        bot_id: self_id,
        stream,
        sender: Some(pb::Sender { user_id, nickname }),
        text: content.text,
        quoted_message_id: content.quoted,
        mentions: content.mentions,
        mentions_bot: content.mentions_bot,
        time,
        message_id,
        // Filled in by the gateway, which asks the bot (see `inbound`).
        quoted_text: String::new(),
        quoted_sender: String::new(),
        received_at: Some(now()),
    })))
}

pub use crate::platform::now;

/// What hark reads from a message's segments.
#[derive(Debug, Default, PartialEq)]
struct Content {
    text: String,
    quoted: String,
    mentions: Vec<String>,
    mentions_bot: bool,
}

fn content(segments: &[Segment], self_id: &str) -> Content {
    let mut out = Content::default();
    for segment in segments {
        match segment.kind.as_str() {
            "text" => out.text.push_str(segment.get("text").unwrap_or_default()),
            "reply" if out.quoted.is_empty() => {
                out.quoted = segment.get("id").unwrap_or_default().to_owned();
            }
            "at" => {
                let target = segment.get("qq").unwrap_or_default();
                if target == self_id {
                    out.mentions_bot = true;
                } else if !target.is_empty() {
                    out.mentions.push(target.to_owned());
                    if target == "all" {
                        continue;
                    }
                    let name = segment.get("name").unwrap_or(target);
                    out.text.push('@');
                    out.text.push_str(name);
                }
            }
            _ => {}
        }
    }
    out.text = out.text.trim().to_owned();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn group(message: Value) -> Value {
        json!({"time": 1700000000, "self_id": 42, "post_type": "message", "message_type": "group",
               "sub_type": "normal", "message_id": -2147480000i64, "group_id": "777", "user_id": 100,
               "message": message, "raw_message": "", "font": 0,
               "sender": {"user_id": 100, "nickname": "Ann", "card": ""}})
    }

    fn chat(frame: Frame) -> pb::ChatMessage {
        match frame {
            Frame::Message(m) => *m,
            other => panic!("not a message: {other:?}"),
        }
    }

    #[test]
    fn a_group_message_is_normalised() {
        let m = chat(
            parse_value(
                &group(json!([{"type": "text", "data": {"text": " hi "}}])),
                "qq",
            )
            .expect("parses"),
        );
        assert_eq!(m.platform, "qq");
        assert_eq!(m.bot_id, "42");
        assert_eq!(m.stream, "group:777");
        assert_eq!(m.sender.expect("sender").user_id, "100");
        assert_eq!(m.text, "hi");
        assert_eq!(m.message_id, "-2147480000");
        assert_eq!(m.time.expect("time").seconds, 1700000000);
    }

    #[test]
    fn reply_and_at_are_read_and_the_bots_own_at_is_dropped_from_the_text() {
        let cq = chat(
            parse_value(
                &group(json!(
                    "[CQ:reply,id=555][CQ:at,qq=42] /task list [CQ:at,qq=7]"
                )),
                "qq",
            )
            .expect("cq"),
        );
        let array = chat(
            parse_value(
                &group(json!([
                    {"type": "reply", "data": {"id": "555"}},
                    {"type": "at", "data": {"qq": 42}},
                    {"type": "text", "data": {"text": " /task list "}},
                    {"type": "at", "data": {"qq": "7"}}
                ])),
                "qq",
            )
            .expect("array"),
        );
        let (mut cq, mut array) = (cq, array);
        cq.received_at = None;
        array.received_at = None;
        assert_eq!(cq, array);
        assert_eq!(cq.quoted_message_id, "555");
        assert!(cq.mentions_bot);
        assert_eq!(cq.mentions, ["7"]);
        assert_eq!(cq.text, "/task list @7");
    }

    #[test]
    fn a_private_message_streams_by_its_sender_and_own_messages_are_skipped() {
        let private = json!({"self_id": "42", "post_type": "message", "message_type": "private",
                             "message_id": 9, "user_id": "100", "message": "hello"});
        let m = chat(parse_value(&private, "qq").expect("parses"));
        assert_eq!(m.stream, "private:100");
        let mut own = private.clone();
        own["user_id"] = json!(42);
        assert_eq!(parse_value(&own, "qq"), Ok(Frame::Own));
        assert_eq!(
            parse_value(&json!({"post_type": "message_sent", "self_id": 42}), "qq"),
            Ok(Frame::Own)
        );
    }

    #[test]
    fn meta_events_notices_and_responses_are_told_apart() {
        assert_eq!(
            parse(
                r#"{"post_type":"meta_event","meta_event_type":"heartbeat","self_id":42}"#,
                "qq"
            ),
            Ok(Frame::Meta {
                kind: "heartbeat".into()
            })
        );
        assert_eq!(
            parse(
                r#"{"post_type":"notice","notice_type":"group_increase"}"#,
                "qq"
            ),
            Ok(Frame::Ignored {
                post_type: "notice".into()
            })
        );
        let response = parse(
            r#"{"status":"ok","retcode":0,"data":{"message_id":77},"echo":"e1"}"#,
            "qq",
        );
        assert!(matches!(response, Ok(Frame::Response { ref echo, ok: true, .. }) if echo == "e1"));
        let failed = parse(
            r#"{"status":"failed","retcode":1400,"wording":"bad group","echo":"e2"}"#,
            "qq",
        );
        assert!(
            matches!(failed, Ok(Frame::Response { ok: false, ref message, .. }) if message == "bad group")
        );
    }

    #[test]
    fn bad_frames_are_refused_with_a_reason() {
        assert!(matches!(parse("{nope", "qq"), Err(Error::NotJson(_))));
        assert_eq!(parse("[1,2]", "qq"), Err(Error::NotObject("array")));
        assert!(matches!(
            parse(r#"{"post_type":"bogus"}"#, "qq"),
            Err(Error::UnknownPostType(_))
        ));
        assert!(matches!(
            parse(
                r#"{"post_type":"message","self_id":1,"user_id":2,"message_type":"group","message_id":3}"#,
                "qq"
            ),
            Err(Error::Missing {
                field: "group_id",
                ..
            })
        ));
    }
}
