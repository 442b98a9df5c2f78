//! No single message stops a consumer: against the real nats-server with JetStream, a handler
//! that panics or refuses a message leaves it in the dead-letter stream with its reason, and the
//! next message is served.

mod common;

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use common::TestBus;
use hark_core::{
    bus::Names,
    consume::{self, DeadLetters, Failure, Liveness},
    error::Kind,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

impl TestBus {
    async fn send(&self, text: &'static str) {
        hark_core::publish::publish(
            &self.js,
            hark_core::publish::Outgoing {
                subject: self.names.chat_in("qq").expect("subject"),
                msg_id: text,
                payload: Bytes::from_static(text.as_bytes()),
                trace: None,
            },
        )
        .await
        .expect("published");
    }

    /// The dead letters so far, as (payload, reason), waiting until there are `count`.
    async fn dead_letters(&self, count: usize) -> Vec<(String, String)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut stream = self
                .js
                .get_stream(self.names.dead_letter_stream())
                .await
                .expect("dead-letter stream");
            let info = stream.info().await.expect("stream info");
            if info.state.messages as usize >= count {
                let mut letters = Vec::new();
                for seq in info.state.first_sequence..=info.state.last_sequence {
                    let raw = stream.get_raw_message(seq).await.expect("dead letter");
                    let reason = raw
                        .headers
                        .get(consume::REASON_HEADER)
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_default();
                    letters.push((String::from_utf8_lossy(&raw.payload).into_owned(), reason));
                }
                return letters;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{count} dead letters did not arrive; there are {}",
                info.state.messages
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Runs the consumer `durable` of `CHAT_IN` with a handler that panics on `panic`, refuses
/// `invalid` for good, and reports everything else it handled on the returned channel.
fn serve(
    bus: &TestBus,
    durable: &'static str,
    liveness: Liveness,
    shutdown: CancellationToken,
) -> (mpsc::UnboundedReceiver<String>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (js, names) = (bus.js.clone(), bus.names.clone());
    let served = tokio::spawn(async move {
        let dead = DeadLetters::new(js.clone(), names.clone());
        consume::run(
            &js,
            consume::Consumer {
                stream: &names.chat_in_stream(),
                durable,
                source: "chat_in",
                name: "chat_in",
            },
            &dead,
            &liveness,
            &shutdown,
            |message: jetstream::Message| {
                let tx = tx.clone();
                async move {
                    let text = String::from_utf8_lossy(&message.payload).into_owned();
                    match text.as_str() {
                        "panic" => panic!("the handler cannot take this"),
                        "invalid" => Err(Failure::new(Kind::Invalid, "not a chat message")),
                        _ => {
                            let _ = tx.send(text);
                            Ok(())
                        }
                    }
                }
            },
        )
        .await;
    });
    (rx, served)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("a message was handled")
        .expect("the consumer is running")
}

#[tokio::test]
async fn a_message_whose_handler_panics_is_set_aside_and_the_next_one_is_served() {
    let bus = TestBus::start().await;
    let liveness = Liveness::default();
    let shutdown = CancellationToken::new();
    let (mut handled, served) = serve(
        &bus,
        Names::CONTROL_CONSUMER,
        liveness.clone(),
        shutdown.clone(),
    );
    bus.send("panic").await;
    bus.send("after").await;
    assert_eq!(next(&mut handled).await, "after");
    let letters = bus.dead_letters(1).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].0, "panic");
    assert!(
        letters[0]
            .1
            .contains(&format!("panicked {} times", consume::PANIC_TRIES))
            && letters[0].1.contains("the handler cannot take this"),
        "{letters:?}"
    );
    // The consumer still consumes after the dead letter, and says it does.
    bus.send("later").await;
    assert_eq!(next(&mut handled).await, "later");
    assert!(liveness.stalled_for(Duration::ZERO).is_empty());
    shutdown.cancel();
    served
        .await
        .expect("the consumer ends at shutdown, not before");
    bus.stop().await;
}

#[tokio::test]
async fn a_message_refused_for_good_is_set_aside_at_once_with_its_reason() {
    let bus = TestBus::start().await;
    let shutdown = CancellationToken::new();
    let (mut handled, served) = serve(
        &bus,
        Names::CONTROL_CONSUMER,
        Liveness::default(),
        shutdown.clone(),
    );
    bus.send("invalid").await;
    bus.send("after").await;
    assert_eq!(next(&mut handled).await, "after");
    let letters = bus.dead_letters(1).await;
    assert_eq!(
        letters,
        vec![(
            "invalid".to_owned(),
            "invalid: not a chat message".to_owned()
        )]
    );
    shutdown.cancel();
    served.await.expect("stopped");
    bus.stop().await;
}

#[tokio::test]
async fn a_consumer_that_cannot_pull_is_reported_stalled() {
    let bus = TestBus::start().await;
    let liveness = Liveness::default();
    let shutdown = CancellationToken::new();
    // No such consumer: it cannot be opened.
    let (_handled, served) = serve(&bus, "nobody", liveness.clone(), shutdown.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stalled = liveness.stalled_for(Duration::ZERO);
        if let Some((name, why)) = stalled.first() {
            assert_eq!(name, "chat_in");
            assert!(why.contains("nobody"), "{why}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    served.await.expect("stopped");
    bus.stop().await;
}
