//! A real task-control (the same `App` production runs) on a fresh database and namespace, with
//! helpers that play the gateway (publish chat messages, read outbound ones) and a worker (send
//! control requests) over the real NATS.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use hark_control::{app::App, store::Store};
use hark_core::{
    bus::{self, ControlOp, Names},
    codec,
    config::Config,
};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use prost::Message;
use tokio_util::sync::CancellationToken;

pub const PLATFORM: &str = "qq";
pub const BOT: &str = "42";
pub const GROUP: &str = "group:777";
pub const OTHER_GROUP: &str = "group:888";

/// The next message of a consumer within `wait`, acknowledged and decoded.
async fn next_from<M: codec::Versioned>(consumer: &PullConsumer, wait: Duration) -> Option<M> {
    next_traced(consumer, wait).await.map(|(m, _)| m)
}

/// The next message, acknowledged, with the trace context it was published with.
async fn next_traced<M: codec::Versioned>(
    consumer: &PullConsumer,
    wait: Duration,
) -> Option<(M, Option<hark_core::trace::TraceContext>)> {
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .expect("fetch");
    let message = batch.next().await?.expect("message");
    message.ack().await.expect("ack");
    let trace = hark_core::trace::from_headers(message.headers.as_ref());
    Some((
        codec::decode(&message.payload).expect("the message decodes"),
        trace,
    ))
}

pub use hark_testkit::nats_url;

pub struct TestControl {
    pub store: Store,
    /// What the running task-control's doors share, for calling its use cases directly.
    pub shared: hark_control::shared::Shared,
    pub watchers: std::sync::Arc<hark_control::watchers::Watchers>,
    pub names: Names,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub grpc: String,
    /// The web console's base URL, when it listens.
    pub console: Option<String>,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
    db: super::TestDb,
    outbound: PullConsumer,
    jobs: PullConsumer,
    next_message: std::sync::atomic::AtomicU64,
}

impl TestControl {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let db = super::TestDb::new().await;
        let mut config = Config::default();
        config.database.url = format!("{}/{}", super::server_url(), db.name).into();
        config.nats.url = nats_url().into();
        config.nats.namespace = db.store.names().namespace().to_string();
        config.control.grpc_listen = "127.0.0.1:0".parse().expect("addr");
        config.control.http_listen = "127.0.0.1:0".into();
        config.permission.admins = vec!["qq:1".parse().expect("owner")];
        config.permission.users = vec![];
        // The tests read the English texts; the Chinese ones are tested where they are written
        // and by a test that leaves the language unset.
        config.chat.language = hark_core::config::ChatLanguage::En;
        tweak(&mut config);
        let names = db.store.names().clone();
        let app = App::build(config).await.expect("task-control builds");
        let grpc = format!("http://{}", app.grpc_addr());
        let console = app.console_addr().map(|a| format!("http://{a}"));
        let store = app.shared().store.clone();
        let shared = app.shared().clone();
        let watchers = app.shared().watchers.clone();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let handle = tokio::spawn(async move {
            app.run_until_stopped(token)
                .await
                .expect("task-control runs");
        });
        let nats = async_nats::connect(nats_url()).await.expect("nats");
        let js = jetstream::new(nats.clone());
        let outbound = bus::ensure_consumer(
            &js,
            &names.chat_out_stream(),
            bus::durable(
                &names.gateway_consumer(PLATFORM, BOT).expect("name"),
                names.chat_out(PLATFORM, BOT).expect("subject"),
                Duration::from_secs(30),
                -1,
            ),
        )
        .await
        .expect("outbound consumer");
        let jobs = js
            .get_consumer_from_stream(Names::WORKER_CONSUMER, names.task_run_stream())
            .await
            .expect("worker consumer");
        Self {
            store,
            shared,
            watchers,
            names,
            nats,
            js,
            grpc,
            console,
            shutdown,
            handle,
            db,
            outbound,
            jobs,
            next_message: 1.into(),
        }
    }

    /// Stops task-control, then removes its database and its namespace's streams.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.handle.await;
        self.db.drop().await;
    }

    pub async fn client(&self) -> TaskServiceClient<tonic::transport::Channel> {
        TaskServiceClient::connect(self.grpc.clone())
            .await
            .expect("gRPC connects")
    }

    /// A fresh platform message id.
    pub fn message_id(&self) -> String {
        format!(
            "m{}",
            self.next_message
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
    }

    /// Publishes a chat message as the gateway would; returns its platform message id.
    pub async fn say(&self, stream: &str, user: &str, text: &str) -> String {
        self.say_quoting(stream, user, text, "").await
    }

    pub async fn say_quoting(&self, stream: &str, user: &str, text: &str, quoted: &str) -> String {
        let id = self.message_id();
        self.publish_chat(
            stream,
            user,
            text,
            quoted,
            &id,
            &Names::chat_in_msg_id(PLATFORM, BOT, stream, &id),
        )
        .await;
        id
    }

    /// A quote-reply as a OneBot gateway publishes it, with the quoted message's text and author
    /// as the bot told them.
    pub async fn say_quoting_text(
        &self,
        stream: &str,
        user: &str,
        text: &str,
        quoted: &str,
        quoted_text: &str,
    ) -> String {
        let id = self.message_id();
        let message = pb::ChatMessage {
            quoted_text: quoted_text.into(),
            quoted_sender: BOT.into(),
            ..chat_message(stream, user, text, quoted, &id)
        };
        self.publish_message(message, &Names::chat_in_msg_id(PLATFORM, BOT, stream, &id))
            .await;
        id
    }

    /// Reports, as the gateway would, that the question in `shown` was delivered as the platform
    /// message `platform_id`.
    pub async fn receipt(&self, shown: &pb::OutboundMessage, platform_id: &str) {
        self.publish_receipt(pb::DeliveryReceipt {
            outbound_id: format!("{}-{platform_id}", shown.id),
            question_id: shown.question_id.clone(),
            platform_message_id: platform_id.into(),
            ..Default::default()
        })
        .await;
    }

    /// Reports, as the gateway would, that the message `shown` was set aside for `reason`.
    pub async fn undelivered(&self, shown: &pb::OutboundMessage, reason: &str) {
        self.publish_receipt(pb::DeliveryReceipt {
            outbound_id: format!("{}.undelivered", shown.id),
            question_id: shown.question_id.clone(),
            failed: reason.into(),
            ..Default::default()
        })
        .await;
    }

    async fn publish_receipt(&self, receipt: pb::DeliveryReceipt) {
        hark_core::publish::publish(
            &self.js,
            hark_core::publish::Outgoing {
                subject: self.names.chat_receipt(),
                msg_id: &receipt.outbound_id,
                payload: codec::encode(receipt.clone()),
                trace: None,
            },
        )
        .await
        .expect("receipt published");
    }

    /// Sends `text` from `user` in `stream` as the platform message `id`, keyed as the gateway
    /// keys it.
    /// Says `text` mentioning `mentions` (user ids), as a QQ @ does; returns the message id.
    pub async fn say_mentioning(
        &self,
        stream: &str,
        user: &str,
        text: &str,
        mentions: &[&str],
    ) -> String {
        let id = self.message_id();
        let message = pb::ChatMessage {
            mentions: mentions.iter().map(|m| (*m).to_owned()).collect(),
            ..chat_message(stream, user, text, "", &id)
        };
        self.publish_message(message, &Names::chat_in_msg_id(PLATFORM, BOT, stream, &id))
            .await;
        id
    }

    /// Publishes `message` again under its own dedup id, as a redelivery does (a new NATS
    /// message with the same chat message id).
    pub async fn say_again_mentioning(
        &self,
        stream: &str,
        user: &str,
        text: &str,
        mentions: &[&str],
        id: &str,
    ) {
        let message = pb::ChatMessage {
            mentions: mentions.iter().map(|m| (*m).to_owned()).collect(),
            ..chat_message(stream, user, text, "", id)
        };
        // Another NATS message id, so that JetStream does not drop it: hark's own key must.
        self.publish_message(message, &format!("again:{id}")).await;
    }

    pub async fn say_as(&self, stream: &str, user: &str, text: &str, id: &str) {
        self.publish_chat(
            stream,
            user,
            text,
            "",
            id,
            &Names::chat_in_msg_id(PLATFORM, BOT, stream, id),
        )
        .await;
    }

    pub async fn publish_chat(
        &self,
        stream: &str,
        user: &str,
        text: &str,
        quoted: &str,
        id: &str,
        dedup: &str,
    ) {
        self.publish_message(chat_message(stream, user, text, quoted, id), dedup)
            .await;
    }

    async fn publish_message(&self, message: pb::ChatMessage, dedup: &str) {
        hark_core::publish::publish(
            &self.js,
            hark_core::publish::Outgoing {
                subject: self.names.chat_in(PLATFORM).expect("subject"),
                msg_id: dedup,
                payload: codec::encode(message),
                trace: None,
            },
        )
        .await
        .expect("chat message published");
    }

    /// The next outbound chat message for the test bot, acknowledged as the gateway would.
    pub async fn next_out(&self) -> pb::OutboundMessage {
        self.try_next_out(Duration::from_secs(10))
            .await
            .expect("an outbound chat message within 10s")
    }

    pub async fn try_next_out(&self, wait: Duration) -> Option<pb::OutboundMessage> {
        next_from(&self.outbound, wait).await
    }

    /// Reads outbound messages until one contains `needle`.
    pub async fn out_containing(&self, needle: &str) -> pb::OutboundMessage {
        for _ in 0..20 {
            let out = self.next_out().await;
            if out.text.contains(needle) {
                return out;
            }
        }
        panic!("no outbound message contained {needle:?}");
    }

    /// Reads outbound messages until one contains each of `needles`, in whatever order they
    /// come; returns them in the order of `needles`.
    pub async fn outs_containing(&self, needles: &[&str]) -> Vec<pb::OutboundMessage> {
        let mut found: Vec<Option<pb::OutboundMessage>> = vec![None; needles.len()];
        for _ in 0..50 {
            if found.iter().all(Option::is_some) {
                break;
            }
            let out = self.next_out().await;
            if let Some(i) =
                (0..needles.len()).find(|&i| found[i].is_none() && out.text.contains(needles[i]))
            {
                found[i] = Some(out);
            }
        }
        found
            .into_iter()
            .zip(needles)
            .map(|(out, needle)| {
                out.unwrap_or_else(|| panic!("no outbound message contained {needle:?}"))
            })
            .collect()
    }

    /// Sends a command from `user` that is answered at once, and returns every outbound message
    /// before its answer. Chat messages are handled in order, so whatever the messages sent
    /// before it caused is among them: a check that nothing happened needs no waiting.
    pub async fn settle(&self, stream: &str, user: &str) -> Vec<pb::OutboundMessage> {
        self.say(stream, user, "/task help").await;
        let mut before = Vec::new();
        for _ in 0..500 {
            let out = self.next_out().await;
            if out.text.contains("just reply here") {
                return before;
            }
            before.push(out);
        }
        panic!("the help command was not answered");
    }

    /// The next run job, acknowledged as a worker would.
    pub async fn next_job(&self) -> pb::RunJob {
        self.try_next_job(Duration::from_secs(10))
            .await
            .expect("a run job within 10s")
    }

    pub async fn try_next_job(&self, wait: Duration) -> Option<pb::RunJob> {
        next_from(&self.jobs, wait).await
    }

    /// The next run job and the trace context it carries.
    pub async fn next_job_traced(&self) -> (pb::RunJob, Option<hark_core::trace::TraceContext>) {
        next_traced(&self.jobs, Duration::from_secs(10))
            .await
            .expect("a run job within 10s")
    }

    /// The next outbound chat message and the trace context it carries.
    pub async fn next_out_traced(
        &self,
    ) -> (pb::OutboundMessage, Option<hark_core::trace::TraceContext>) {
        next_traced(&self.outbound, Duration::from_secs(10))
            .await
            .expect("an outbound chat message within 10s")
    }

    /// Sends a control request as a worker (in the current trace, if any) and decodes the
    /// response.
    pub async fn request<Resp: Message + Default>(
        &self,
        op: ControlOp,
        payload: bytes::Bytes,
    ) -> Resp {
        let mut headers = async_nats::HeaderMap::new();
        hark_core::trace::inject(&mut headers);
        let reply = self
            .nats
            .request_with_headers(self.names.control(op), headers, payload)
            .await
            .expect("task-control answers control requests");
        Resp::decode(reply.payload).expect("response decodes")
    }

    pub async fn claim(&self, job: &pb::RunJob, worker: &str) -> pb::ClaimResponse {
        self.request(
            ControlOp::Claim,
            codec::encode(pb::ClaimRequest {
                task_id: job.task_id.clone(),
                generation: job.generation,
                worker_id: worker.into(),
                ..Default::default()
            }),
        )
        .await
    }

    /// Claims the next job as a worker would, expecting it to be `task`'s.
    pub async fn claim_next(&self, task: &str) -> pb::Lease {
        let job = self.next_job().await;
        assert_eq!(job.task_id, task);
        let claimed = self.claim(&job, "w1").await;
        assert!(claimed.refusal.is_none(), "{:?}", claimed.refusal);
        claimed.lease.expect("lease")
    }

    /// Completes the task of `lease` with `result`, as its worker would.
    pub async fn complete(&self, lease: pb::Lease, result: &str) {
        let done: pb::ControlAck = self
            .request(
                ControlOp::Complete,
                codec::encode(pb::CompleteRequest {
                    lease: Some(lease),
                    result: result.into(),
                    ..Default::default()
                }),
            )
            .await;
        assert!(done.refusal.is_none(), "{:?}", done.refusal);
    }

    /// Claims the task of the next job and asks `question`; returns the lease and the handle.
    pub async fn claim_and_ask(&self, question: &str, timeout_s: u32) -> (pb::Lease, String) {
        let job = self.next_job().await;
        let claimed = self.claim(&job, "w1").await;
        assert!(
            claimed.refusal.is_none(),
            "claim refused: {:?}",
            claimed.refusal
        );
        let lease = claimed.lease.expect("lease");
        let asked = self.ask(&lease, 1, "call-1", question, timeout_s).await;
        assert!(asked.refusal.is_none(), "ask refused: {:?}", asked.refusal);
        (lease, asked.handle)
    }

    pub async fn ask(
        &self,
        lease: &pb::Lease,
        round: u32,
        call: &str,
        question: &str,
        timeout_s: u32,
    ) -> pb::AskResponse {
        let messages = serde_json::json!([{
            "role": "assistant", "content": null,
            "tool_calls": [{"id": call, "type": "function",
                "function": {"name": "ask_user", "arguments": serde_json::json!({"question": question}).to_string()}}]
        }]);
        self.request(
            ControlOp::Ask,
            codec::encode(pb::AskRequest {
                lease: Some(lease.clone()),
                round: Some(pb::Round {
                    number: round,
                    messages_json: serde_json::to_vec(&messages).expect("json"),
                    ..Default::default()
                }),
                tool_call_id: call.into(),
                question: question.into(),
                context: String::new(),
                timeout_s,
                ..Default::default()
            }),
        )
        .await
    }

    pub async fn checkpoint(&self, lease: &pb::Lease, round: u32) -> pb::ControlAck {
        let messages =
            serde_json::json!([{"role": "assistant", "content": format!("round {round}")}]);
        self.request(
            ControlOp::Checkpoint,
            codec::encode(pb::CheckpointRequest {
                lease: Some(lease.clone()),
                round: Some(pb::Round {
                    number: round,
                    messages_json: serde_json::to_vec(&messages).expect("json"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
        .await
    }

    pub async fn heartbeat(&self, lease: &pb::Lease) -> pb::HeartbeatResponse {
        self.request(
            ControlOp::Heartbeat,
            codec::encode(pb::HeartbeatRequest {
                lease: Some(lease.clone()),
                ..Default::default()
            }),
        )
        .await
    }

    /// Creates a task from the chat as `user` in `stream`; returns the task id from the reply.
    pub async fn new_task_in_chat(&self, stream: &str, user: &str, goal: &str) -> String {
        self.say(stream, user, &format!("/task new {goal}")).await;
        let reply = self.out_containing("created").await;
        let short = reply
            .text
            .split_whitespace()
            .nth(1)
            .expect("the reply names the task")
            .to_owned();
        let task = self
            .store
            .resolve_task(&short.parse().expect("short id"), None)
            .await
            .expect("task exists");
        task.id.to_string()
    }

    /// Waits until `check` holds, polling; panics after 10s.
    pub async fn eventually<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        hark_testkit::eventually(what, Duration::from_secs(10), || {
            let holds = check();
            async move { holds.await.then_some(()) }
        })
        .await
    }
}

/// A chat message of `user` in `stream` as the test gateway publishes it.
fn chat_message(stream: &str, user: &str, text: &str, quoted: &str, id: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        platform: PLATFORM.into(),
        bot_id: BOT.into(),
        stream: stream.into(),
        sender: Some(pb::Sender {
            user_id: user.into(),
            nickname: format!("user {user}"),
        }),
        text: text.into(),
        quoted_message_id: quoted.into(),
        message_id: id.into(),
        ..Default::default()
    }
}
