//! The one publisher against the real nats-server with JetStream: what a message carries, that
//! it is stored once, and which refusals are for good.

mod common;

use bytes::Bytes;
use common::TestBus;
use hark_core::{
    bus::MSG_ID_HEADER,
    error::{Classified as _, Kind},
    publish::{self, Outgoing, Unsent},
    trace,
};

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn outgoing<'a>(bus: &TestBus, msg_id: &'a str, payload: &'static [u8]) -> Outgoing<'a> {
    Outgoing {
        subject: bus.names.chat_receipt(),
        msg_id,
        payload: Bytes::from_static(payload),
        trace: Some(TRACE),
    }
}

/// The `hark_publish_total` sample of `outcome`.
async fn published(outcome: &str) -> u64 {
    let text = hark_core::metrics::Registry::global().render().await;
    let sample = format!("hark_publish_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&sample))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_message_carries_its_id_and_trace_and_one_sent_twice_is_stored_once() {
    let bus = TestBus::start().await;
    let acked_before = published("acked").await;
    let first = publish::publish(&bus.js, outgoing(&bus, "receipt-1", b"one"))
        .await
        .expect("stored");
    let again = publish::publish(&bus.js, outgoing(&bus, "receipt-1", b"one"))
        .await
        .expect("acknowledged");
    assert!(!first.duplicate);
    assert!(again.duplicate, "the same id is stored once");
    // Sent pipelined, then awaited.
    let sent = publish::send(&bus.js, outgoing(&bus, "receipt-2", b"two"))
        .await
        .expect("sent");
    assert!(!sent.acked().await.expect("stored").duplicate);
    assert!(published("acked").await >= acked_before + 3);

    let stream = bus
        .js
        .get_stream(bus.names.chat_receipt_stream())
        .await
        .expect("the receipts' stream");
    let mut seen = Vec::new();
    for sequence in 1..=2 {
        let message = stream
            .get_raw_message(sequence)
            .await
            .expect("a stored message");
        seen.push((
            message.headers.get(MSG_ID_HEADER).map(|v| v.to_string()),
            message.headers.get(trace::HEADER).map(|v| v.to_string()),
            message.payload.clone(),
        ));
    }
    assert_eq!(stream.clone().info().await.expect("info").state.messages, 2);
    assert_eq!(
        seen,
        vec![
            (
                Some("receipt-1".into()),
                Some(TRACE.into()),
                Bytes::from_static(b"one")
            ),
            (
                Some("receipt-2".into()),
                Some(TRACE.into()),
                Bytes::from_static(b"two")
            ),
        ]
    );
    bus.stop().await;
}

#[tokio::test]
async fn what_jetstream_can_never_take_is_told_from_what_it_cannot_take_now() {
    let bus = TestBus::start().await;
    let refused_before = published("refused").await;
    let line_break = publish::publish(&bus.js, outgoing(&bus, "a\nb", b"x")).await;
    let long_id = "x".repeat(publish::MAX_MSG_ID_BYTES + 1);
    let too_long = publish::publish(&bus.js, outgoing(&bus, &long_id, b"x")).await;
    let huge = Outgoing {
        payload: Bytes::from(vec![0u8; 2 << 20]),
        ..outgoing(&bus, "huge", b"")
    };
    let too_large = publish::publish(&bus.js, huge).await;
    for (what, result, says) in [
        ("a line break in its id", line_break, "line break"),
        (
            "an id too long for a header",
            too_long,
            "longer than 1024 bytes",
        ),
        ("a payload over max_payload", too_large, ""),
    ] {
        match result {
            Err(Unsent::Never { reason, .. }) => {
                assert!(reason.contains(says), "{what}: {reason}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(published("refused").await >= refused_before + 3);

    // No stream takes this subject: not now, maybe later.
    let nowhere = Outgoing {
        subject: format!("{}.nowhere", bus.names.namespace()),
        ..outgoing(&bus, "n-1", b"x")
    };
    let error = publish::publish(&bus.js, nowhere)
        .await
        .expect_err("no stream");
    assert!(matches!(error, Unsent::Later { .. }), "{error:?}");
    assert_eq!(error.kind(), Kind::Unavailable);
    assert!(error.to_string().contains(".nowhere"), "{error}");
    bus.stop().await;
}
