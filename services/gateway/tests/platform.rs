//! A platform the gateway has never heard of, added the way the next one (Telegram, Feishu,
//! WeCom) would be: one type implementing [`Platform`], started beside the others. Its messages
//! reach `CHAT_IN` through the spool, deduplicated per stream; hark's messages reach it through
//! the bot's durable consumer, and the id it reports comes back as a receipt. Real NATS.

mod common;

use common::{Running, next};

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::future::BoxFuture;
use hark_core::{bus::Names, codec};
use hark_gateway::{
    hub::Hub,
    platform::{Inbound, Platform, SendError},
};
use hark_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PLATFORM: &str = "lines";
const BOT: &str = "b1";

/// A platform whose deliveries are lines `<stream> <user> <message id> <text>`, whose message
/// ids are unique only per chat (as Telegram's are), and which numbers what it sends.
struct Lines {
    sent: mpsc::UnboundedSender<pb::OutboundMessage>,
    numbered: AtomicU64,
    /// Sends fail while this many are left to fail.
    failing: AtomicU64,
}

impl Platform for Lines {
    type Delivery = str;
    type Other = Infallible;
    type Refusal = String;

    fn normalise(&self, line: &str) -> Result<Inbound<Infallible>, String> {
        let mut parts = line.splitn(4, ' ');
        let (Some(stream), Some(user), Some(id), Some(text)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("`{line}` is not `<stream> <user> <id> <text>`"));
        };
        Ok(Inbound::Message(Box::new(pb::ChatMessage {
            version: hark_proto::WIRE_VERSION,
            platform: PLATFORM.into(),
            bot_id: BOT.into(),
            stream: stream.into(),
            sender: Some(pb::Sender {
                user_id: user.into(),
                nickname: String::new(),
            }),
            text: text.into(),
            message_id: id.into(),
            ..Default::default()
        })))
    }

    fn send(
        &self,
        message: pb::OutboundMessage,
    ) -> BoxFuture<'_, Result<Option<String>, SendError>> {
        Box::pin(async move {
            if self
                .failing
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(SendError::Retry("the platform answered 502".into()));
            }
            let n = self.numbered.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = self.sent.send(message);
            Ok(Some(format!("sent-{n}")))
        })
    }
}

struct Bed {
    hub: Arc<Hub>,
    names: Names,
    js: jetstream::Context,
    inbound: PullConsumer,
    receipts: PullConsumer,
    running: Running,
}

impl Bed {
    async fn start() -> Self {
        let running = Running::start(&common::config()).await;
        Self {
            hub: running.hub.clone(),
            names: running.names.clone(),
            js: running.js.clone(),
            inbound: running
                .control_consumer(running.names.chat_in_stream())
                .await,
            receipts: running
                .control_consumer(running.names.chat_receipt_stream())
                .await,
            running,
        }
    }

    async fn stop(self) {
        self.running.stop().await;
    }
}

fn lines() -> (Arc<Lines>, mpsc::UnboundedReceiver<pb::OutboundMessage>) {
    let (sent, received) = mpsc::unbounded_channel();
    let platform = Lines {
        sent,
        numbered: AtomicU64::new(0),
        failing: AtomicU64::new(0),
    };
    (Arc::new(platform), received)
}

#[tokio::test]
async fn a_new_platforms_messages_reach_chat_in_once_each_scoped_by_their_chat() {
    let bed = Bed::start().await;
    let (platform, _) = lines();
    let (messages, ingesting) = mpsc::channel(16);
    let ingest = tokio::spawn(hark_gateway::inbound::ingest(
        bed.hub.clone(),
        platform.clone(),
        ingesting,
    ));
    // Message id 1 in two chats are two messages; the same message delivered twice is one.
    for line in [
        "group:a u1 1 hello from a",
        "group:b u2 1 hello from b",
        "group:a u1 1 hello from a",
    ] {
        let Ok(Inbound::Message(message)) = platform.normalise(line) else {
            panic!("`{line}` normalises");
        };
        messages.send(*message).await.expect("ingesting");
    }
    assert!(platform.normalise("no spaces").is_err());
    drop(messages);
    ingest.await.expect("ingested");

    let mut seen = Vec::new();
    while let Some(m) = next::<pb::ChatMessage>(&bed.inbound, Duration::from_secs(2)).await {
        seen.push((m.platform, m.stream, m.message_id, m.text));
    }
    assert_eq!(
        seen,
        [
            (
                "lines".into(),
                "group:a".into(),
                "1".into(),
                "hello from a".into()
            ),
            (
                "lines".into(),
                "group:b".into(),
                "1".into(),
                "hello from b".into()
            ),
        ] as [(String, String, String, String); 2]
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_new_platform_gets_hark_messages_retried_and_its_message_id_comes_back_as_a_receipt() {
    let bed = Bed::start().await;
    let (platform, mut sent) = lines();
    platform.failing.store(1, Ordering::SeqCst);
    let delivering = CancellationToken::new();
    tokio::spawn(hark_gateway::outbound::run(
        bed.hub.clone(),
        platform.clone(),
        PLATFORM.into(),
        BOT.into(),
        delivering.clone(),
    ));
    let message = pb::OutboundMessage {
        id: "out-1".into(),
        route: Some(hark_gateway::platform::route(PLATFORM, BOT, "group:a")),
        text: "which one?".into(),
        question_id: "q-1".into(),
        ..Default::default()
    };
    hark_core::publish::publish(
        &bed.js,
        hark_core::publish::Outgoing {
            subject: bed.names.chat_out(PLATFORM, BOT).expect("subject"),
            msg_id: "out-1",
            payload: codec::encode(message),
            trace: None,
        },
    )
    .await
    .expect("published");

    // The first send fails; the message comes again after the backoff, and once.
    let delivered = tokio::time::timeout(Duration::from_secs(30), sent.recv())
        .await
        .expect("delivered after a retry")
        .expect("a message");
    assert_eq!(delivered.text, "which one?");
    assert_eq!(platform.failing.load(Ordering::SeqCst), 0);
    let receipt: pb::DeliveryReceipt = next(&bed.receipts, Duration::from_secs(10))
        .await
        .expect("a receipt");
    assert_eq!(receipt.outbound_id, "out-1");
    assert_eq!(receipt.question_id, "q-1");
    assert_eq!(receipt.platform_message_id, "sent-1");
    // Acknowledged: the bot's consumer holds nothing more, and nothing else was sent.
    let consumer = bed.hub.names.gateway_consumer(PLATFORM, BOT).expect("name");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut c: async_nats::jetstream::consumer::PullConsumer = bed
            .js
            .get_consumer_from_stream(&consumer, bed.names.chat_out_stream())
            .await
            .expect("the bot's consumer");
        let info = c.info().await.expect("info");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never acknowledged: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sent.try_recv().is_err(),
        "an acknowledged message is not sent again"
    );
    assert_eq!(platform.numbered.load(Ordering::SeqCst), 1, "sent once");
    delivering.cancel();
    bed.stop().await;
}
