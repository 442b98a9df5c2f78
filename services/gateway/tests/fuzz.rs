//! The OneBot frame parser never panics, whatever it is given: arbitrary bytes, arbitrary JSON,
//! and arbitrary JSON shaped like OneBot events.

use hark_gateway::onebot::event;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::String),
        prop::sample::select(vec![
            "message",
            "private",
            "group",
            "meta_event",
            "notice",
            "text",
            "at",
            "reply",
            "[CQ:at,qq=1]",
            "ok"
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "post_type",
                        "message_type",
                        "self_id",
                        "user_id",
                        "group_id",
                        "message_id",
                        "message",
                        "type",
                        "data",
                        "text",
                        "qq",
                        "id",
                        "status",
                        "echo",
                        "sender",
                        "x"
                    ]),
                    inner
                ),
                0..8
            )
            .prop_map(|pairs| Value::Object(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = event::parse(&text, "qq");
    }

    #[test]
    fn arbitrary_json_never_panics(value in arbitrary_json()) {
        let _ = event::parse_value(&value, "qq");
        let _ = event::parse(&value.to_string(), "qq");
    }

    #[test]
    fn message_shaped_json_never_panics(message in arbitrary_json(), ids in prop::collection::vec(arbitrary_json(), 4)) {
        let event = json!({"post_type": "message", "message_type": "group", "self_id": ids[0],
            "user_id": ids[1], "group_id": ids[2], "message_id": ids[3], "message": message});
        if let Ok(event::Frame::Message(m)) = event::parse_value(&event, "qq") {
            prop_assert!(m.stream.starts_with("group:"));
        }
    }

    #[test]
    fn cq_strings_never_panic(text in "(\\[CQ:[a-z]{0,5}(,[a-z]{1,3}=[^\\]]{0,5}){0,3}\\]?|&#?[a-z0-9]{0,4};?|.{0,8}){0,8}") {
        let _ = hark_gateway::onebot::cq::parse_cq(&text);
    }
}
