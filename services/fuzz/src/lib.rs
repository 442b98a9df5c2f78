//! Fuzz targets for every parser of what strangers send hark. Each takes any bytes and checks
//! that nothing panics and that what must round-trip does; a broken property panics, which the
//! fuzzer records as a crash.
//!
//! They run in two ways: coverage-guided under AFL++ (the `fuzz-*` binaries, see `README.md`),
//! and in `cargo test`, over the corpus in `corpus/<target>/` and mutations of it
//! (`tests/corpus.rs`).

use std::sync::OnceLock;

use hark_core::domain::{StreamId, ids, schedule, shape::Shape};
use hark_gateway::{
    onebot::{
        cq::{self, Segment},
        event::{self, Frame},
    },
    platform::{Inbound, Platform},
    satori,
};
use serde_json::Value;

/// A fuzz target: it takes any bytes, and panics when a property does not hold.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory.
pub const TARGETS: [(&str, Target); 7] = [
    ("onebot", onebot),
    ("cq", cq),
    ("satori", satori),
    ("http", http),
    ("console", console),
    ("shape", shape),
    ("cron", cron),
];

/// A OneBot v11 frame, as a bot sends it over its WebSocket. A chat message that comes out of
/// it names a bot, a stream and a message id hark can use as they are.
pub fn onebot(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Frame::Message(message)) = event::parse(text, "qq") {
        assert!(
            ids::bot_id("bot_id", &message.bot_id).is_ok(),
            "{message:?}"
        );
        assert!(message.stream.parse::<StreamId>().is_ok(), "{message:?}");
        assert!(ids::chat_id("message_id", &message.message_id).is_ok());
        assert!(
            message.quoted_message_id.is_empty()
                || ids::chat_id("quote", &message.quoted_message_id).is_ok()
        );
    }
}

/// A CQ-code string. Escaping round-trips, and segments written as CQ codes read back as the
/// same segments.
pub fn cq(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    assert_eq!(cq::unescape(&cq::escape(&text)), text);
    let segments = cq::parse_cq(&text);
    let written = cq::to_cq(&segments);
    assert_eq!(
        merged(&cq::parse_cq(&written)),
        merged(&segments),
        "{text:?} was written as {written:?}"
    );
    // A segment array says the same as its CQ string.
    let array: Vec<Value> = segments
        .iter()
        .map(|s| {
            let data: serde_json::Map<String, Value> = s
                .data
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            serde_json::json!({"type": s.kind, "data": data})
        })
        .collect();
    let from_array = cq::parse_array(&array);
    assert_eq!(merged(&keyed(&from_array)), merged(&keyed(&segments)));
}

/// Segments as hark reads them: adjacent texts as one, empty texts left out, a text segment
/// only its text.
fn merged(segments: &[Segment]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for segment in segments {
        if segment.kind == "text" {
            let text = segment.get("text").unwrap_or_default();
            if text.is_empty() {
                continue;
            }
            if let Some(last) = out.last_mut().filter(|s| s.kind == "text") {
                let joined = format!("{}{text}", last.get("text").unwrap_or_default());
                *last = Segment::text(&joined);
                continue;
            }
            out.push(Segment::text(text));
        } else {
            out.push(segment.clone());
        }
    }
    out
}

/// Segments as a JSON object holds their data: each key once (the last value), in key order;
/// a text segment only its text.
fn keyed(segments: &[Segment]) -> Vec<Segment> {
    segments
        .iter()
        .map(|s| {
            if s.kind == "text" {
                return Segment::text(s.get("text").unwrap_or_default());
            }
            let data: std::collections::BTreeMap<&str, &str> = s
                .data
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            Segment {
                kind: s.kind.clone(),
                data: data
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            }
        })
        .collect()
}

fn satori_platform() -> &'static satori::Satori {
    static SATORI: OnceLock<satori::Satori> = OnceLock::new();
    SATORI.get_or_init(|| {
        satori::Satori::new(
            &hark_core::config::SatoriConfig {
                url: "http://127.0.0.1:5140".into(),
                ..Default::default()
            },
            std::time::Duration::from_secs(1),
        )
    })
}

/// A Satori event, and a message's content (its elements). Escaped text reads back as itself,
/// and a chat message that comes out of an event names a bot and a stream hark can use.
pub fn satori(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    assert_eq!(satori::unescape(&satori::escape(&text)), text);
    let read = satori::read_content(&satori::escape(&text), "me");
    assert_eq!(read.text, text);
    assert!(read.mentions.is_empty() && read.quoted.is_empty());
    let _ = satori::read_content(&text, "me");
    let Ok(event) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(Inbound::Message(message)) = satori_platform().normalise(&event) {
        assert!(
            ids::bot_id("bot_id", &message.bot_id).is_ok(),
            "{message:?}"
        );
        assert!(message.stream.parse::<StreamId>().is_ok(), "{message:?}");
        assert!(ids::chat_id("message_id", &message.message_id).is_ok());
    }
}

fn http_adapter() -> &'static hark_gateway::http::Adapter {
    static ADAPTER: OnceLock<hark_gateway::http::Adapter> = OnceLock::new();
    ADAPTER.get_or_init(|| {
        let mut config = hark_core::config::GatewayConfig::default();
        config.http.platforms = vec!["app".into()];
        config.http.bots = vec!["app:desk".into()];
        hark_gateway::http::Adapter::new(&hark_gateway::Settings::from_config(&config))
    })
}

/// The body of the HTTP adapter's `POST /api/v1/messages`. A message it takes is one of its
/// own platform and bots, with ids hark can use.
pub fn http(data: &[u8]) {
    match http_adapter().normalise(data) {
        Ok(Inbound::Message(message)) => {
            assert_eq!(
                (message.platform.as_str(), message.bot_id.as_str()),
                ("app", "desk")
            );
            assert!(message.stream.parse::<StreamId>().is_ok(), "{message:?}");
            assert!(ids::chat_id("message_id", &message.message_id).is_ok());
        }
        Ok(Inbound::Other(never)) => match never {},
        Err(refusal) => assert!(!refusal.to_string().is_empty()),
    }
}

/// Every JSON body the console takes. A refused one says what is wrong.
pub fn console(data: &[u8]) {
    for read in hark_control::console::read_every_body(data) {
        if let Err(why) = read {
            assert!(!why.is_empty());
        }
    }
}

/// An answer read by a question's shape. The first line is the shape (as stored, or an MCP
/// elicitation schema), checked as a request's would be; the rest is the answer. What an answer
/// reads as is accepted again as a value over the API, and survives the round trip through the
/// text the agent reads.
pub fn shape(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (head, answer) = text.split_once('\n').unwrap_or((&text, ""));
    let Some(shape) = shape_of(head) else {
        return;
    };
    let _ = shape.expects();
    let Ok(value) = shape.read(answer) else {
        return;
    };
    assert_eq!(
        shape.check(&value).as_ref(),
        Ok(&value),
        "{shape:?} read {answer:?} as {value}"
    );
    let for_model = shape.for_model(&value);
    if !matches!(shape, Shape::Approval { .. }) {
        assert_eq!(shape.value_of(&for_model), value, "{shape:?} {for_model:?}");
    }
}

fn shape_of(head: &str) -> Option<Shape> {
    let json: Value = serde_json::from_str(head).ok()?;
    if let Some(shape) = Shape::from_schema(&json) {
        return Some(shape);
    }
    let stored: Shape = serde_json::from_value(json).ok()?;
    let (kind, choices, multiple, fields) = stored.to_proto();
    Shape::from_proto(&kind, &choices, multiple, &fields).ok()
}

/// A cron expression (a schedule's `cron`) and a time (its `at`). An expression that reads
/// reads the same from how it is shown, and its next run is after the time asked.
pub fn cron(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tz = schedule::time_zone("Asia/Shanghai").expect("a time zone");
    let _ = schedule::at(text, &tz);
    let Ok(cron) = text.parse::<schedule::Cron>() else {
        return;
    };
    let shown = cron.to_string();
    let again: schedule::Cron = shown.parse().expect("a shown cron reads back");
    assert_eq!(again.to_string(), shown);
    let after = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a time");
    let next = cron.next_after(after, &tz);
    assert_eq!(next, again.next_after(after, &tz));
    if let Some(next) = next {
        assert!(next > after);
    }
}
