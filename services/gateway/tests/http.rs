//! The generic HTTP adapter: inbound POSTs, the webhook and the SSE stream, on the real NATS.

mod common;

use common::Running;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::jetstream;
use axum::{Json, Router, extract::State, routing::post};
use futures_util::StreamExt;
use hark_core::{bus::Names, codec, config::Config};
use hark_proto::v1 as pb;
use serde_json::{Value, json};

struct Gw {
    base: String,
    names: Names,
    js: jetstream::Context,
    running: Running,
}

impl Gw {
    async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = common::config();
        config.gateway.http.platforms = vec!["myapp".into()];
        config.gateway.http.token = "app-secret".into();
        config.gateway.http.bots = vec!["myapp:main".into()];
        tweak(&mut config);
        let running = Running::start(&config).await;
        Self {
            base: format!("http://{}", running.addr),
            names: running.names.clone(),
            js: running.js.clone(),
            running,
        }
    }

    async fn stop(self) {
        self.running.stop().await;
    }

    /// The next delivery receipt, as task-control would take it.
    async fn next_receipt(&self) -> pb::DeliveryReceipt {
        let receipts = self
            .js
            .get_consumer_from_stream(Names::CONTROL_CONSUMER, self.names.chat_receipt_stream())
            .await
            .expect("consumer");
        common::next(&receipts, Duration::from_secs(10))
            .await
            .expect("a receipt")
    }

    /// The next message on `CHAT_IN` within a second, if any.
    async fn try_next_chat_in(&self) -> Option<jetstream::Message> {
        let consumer = self
            .js
            .get_consumer_from_stream(Names::CONTROL_CONSUMER, self.names.chat_in_stream())
            .await
            .expect("consumer");
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("fetch");
        batch.next().await.map(|m| m.expect("ok"))
    }

    /// The next message on `CHAT_IN`, as task-control would take it.
    async fn next_chat_in(&self) -> jetstream::Message {
        let consumer = self
            .js
            .get_consumer_from_stream(Names::CONTROL_CONSUMER, self.names.chat_in_stream())
            .await
            .expect("consumer");
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .expect("fetch");
        batch.next().await.expect("one").expect("ok")
    }

    async fn post(&self, body: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = reqwest::Client::new()
            .post(format!("{}/api/v1/messages", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn publish_out(&self, text: &str, question: &str) {
        let id = uuid::Uuid::new_v4().to_string();
        let message = pb::OutboundMessage {
            id: id.clone(),
            route: Some(pb::ChatRoute {
                platform: "myapp".into(),
                bot_id: "main".into(),
                stream: "private:u1".into(),
                origin_message_id: String::new(),
            }),
            text: text.into(),
            question_id: question.into(),
            ..Default::default()
        };
        hark_core::publish::publish(
            &self.js,
            hark_core::publish::Outgoing {
                subject: self.names.chat_out("myapp", "main").expect("subject"),
                msg_id: &id,
                payload: codec::encode(message),
                trace: None,
            },
        )
        .await
        .expect("published");
    }
}

/// What the test webhook saw: the bodies it accepted, and how often it was called.
type HookState = (Arc<Mutex<Vec<Value>>>, Arc<Mutex<u32>>);

fn message(id: &str) -> Value {
    json!({"platform": "myapp", "bot_id": "main", "stream": "private:u1",
           "sender": {"user_id": "u1", "nickname": "U"}, "text": "hello", "message_id": id})
}

#[tokio::test]
async fn a_posted_message_reaches_chat_in_and_bad_input_gets_a_clear_error() {
    let gw = Gw::start(|_| {}).await;
    let (status, body) = gw
        .post(&message("m1").to_string(), Some("app-secret"))
        .await;
    assert_eq!(status, 202, "{body}");
    let got: pb::ChatMessage = codec::decode(&gw.next_chat_in().await.payload).expect("decodes");
    assert_eq!(
        (
            got.platform.as_str(),
            got.stream.as_str(),
            got.text.as_str()
        ),
        ("myapp", "private:u1", "hello")
    );

    let (status, _) = gw.post(&message("m2").to_string(), None).await;
    assert_eq!(status, 401);
    let (status, body) = gw.post("{oops", Some("app-secret")).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("not a valid message"),
        "{body}"
    );
    let mut extra = message("m3");
    extra["colour"] = json!("red");
    let (status, body) = gw.post(&extra.to_string(), Some("app-secret")).await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap_or("").contains("colour"),
        "{body}"
    );
    let mut bad_stream = message("m4");
    bad_stream["stream"] = json!("nowhere");
    let (status, body) = gw.post(&bad_stream.to_string(), Some("app-secret")).await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap_or("").starts_with("stream:"),
        "{body}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn outbound_messages_are_posted_to_the_webhook_until_it_accepts_them() {
    // The app's webhook: refuses the first call, then accepts and names the message id.
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let calls = Arc::new(Mutex::new(0u32));
    let app = Router::new()
        .route(
            "/hook",
            post(
                |State((received, calls)): State<HookState>, Json(body): Json<Value>| async move {
                    let mut n = calls.lock().expect("lock");
                    *n += 1;
                    if *n == 1 {
                        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(json!({})));
                    }
                    received.lock().expect("lock").push(body);
                    (
                        axum::http::StatusCode::OK,
                        Json(json!({"message_id": "app-77"})),
                    )
                },
            ),
        )
        .with_state((received.clone(), calls.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hook = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let gw = Gw::start(|c| c.gateway.http.webhook_url = hook).await;
    gw.publish_out("Which plan?", "q-9").await;
    let receipts = gw
        .js
        .get_consumer_from_stream(Names::CONTROL_CONSUMER, gw.names.chat_receipt_stream())
        .await
        .expect("consumer");
    let mut batch = receipts
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(15))
        .messages()
        .await
        .expect("fetch");
    let receipt: pb::DeliveryReceipt =
        codec::decode(&batch.next().await.expect("a receipt").expect("ok").payload)
            .expect("decodes");
    assert_eq!(receipt.platform_message_id, "app-77");
    let got = received.lock().expect("lock").clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["text"], "Which plan?");
    assert_eq!(got[0]["stream"], "private:u1");
    assert_eq!(
        *calls.lock().expect("lock"),
        2,
        "the refused call was retried"
    );
    gw.stop().await;
}

#[tokio::test]
async fn without_a_webhook_outbound_messages_stream_as_server_sent_events() {
    let gw = Gw::start(|_| {}).await;
    gw.publish_out("queued before anyone listened", "").await;
    let response = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/stream?platform=myapp&bot_id=main",
            gw.base
        ))
        .bearer_auth("app-secret")
        .send()
        .await
        .expect("stream opens");
    assert_eq!(response.status().as_u16(), 200);
    let mut response = response;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("queued before anyone listened") {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("an event within 10s")
            .expect("chunk")
            .expect("stream open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: message"), "{seen}");
    let unknown = reqwest::Client::new()
        .get(format!("{}/api/v1/stream?platform=other&bot_id=x", gw.base))
        .bearer_auth("app-secret")
        .send()
        .await
        .expect("request");
    assert_eq!(unknown.status().as_u16(), 404);
    gw.stop().await;
}

#[tokio::test]
async fn a_posted_message_continues_the_trace_its_client_sent() {
    use hark_core::trace::TraceContext;
    let gw = Gw::start(|_| {}).await;
    let client = TraceContext::new_root();
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/messages", gw.base))
        .bearer_auth("app-secret")
        .header("content-type", "application/json")
        .header(hark_core::trace::HEADER, client.to_string())
        .body(message("m-traced").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 202);
    let published = gw.next_chat_in().await;
    let context = hark_core::trace::from_headers(published.headers.as_ref())
        .expect("the message carries a trace");
    assert_eq!(context.trace_id(), client.trace_id());
    assert_ne!(context, client, "sent from a span of its own");
    gw.stop().await;
}

#[tokio::test]
async fn the_adapter_is_off_unless_it_is_given_platforms() {
    let gw = Gw::start(|c| {
        c.gateway.http = Default::default();
    })
    .await;
    let (status, _) = gw.post(&message("m1").to_string(), None).await;
    assert_eq!(status, 404, "no HTTP adapter is mounted");
    let stream = reqwest::get(format!(
        "{}/api/v1/stream?platform=myapp&bot_id=main",
        gw.base
    ))
    .await
    .expect("request");
    assert_eq!(stream.status().as_u16(), 404);
    assert!(
        gw.try_next_chat_in().await.is_none(),
        "nothing reached CHAT_IN"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_post_as_a_onebot_user_or_another_platform_is_refused_and_reaches_nothing() {
    let gw = Gw::start(|_| {}).await;
    // The spoofed answer of the security review: a QQ user, through the HTTP adapter.
    let spoof = json!({"platform": "qq", "bot_id": "3889001", "stream": "group:5001",
        "sender": {"user_id": "20001"}, "text": "spoofed answer", "message_id": "x1"});
    let (status, body) = gw.post(&spoof.to_string(), Some("app-secret")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("gateway.http.platforms"),
        "{body}"
    );
    let mut other = message("m2");
    other["platform"] = json!("otherapp");
    let (status, _) = gw.post(&other.to_string(), Some("app-secret")).await;
    assert_eq!(status, 403);
    assert!(
        gw.try_next_chat_in().await.is_none(),
        "nothing reached CHAT_IN"
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_accepted_in_any_case() {
    let gw = Gw::start(|_| {}).await;
    for (n, header) in [
        "bearer app-secret",
        "BEARER app-secret",
        "Bearer  app-secret",
    ]
    .into_iter()
    .enumerate()
    {
        let response = reqwest::Client::new()
            .post(format!("{}/api/v1/messages", gw.base))
            .header("content-type", "application/json")
            .header("authorization", header)
            .body(message(&format!("case-{n}")).to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 202, "{header}");
    }
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/messages", gw.base))
        .header("authorization", "Basic app-secret")
        .body(message("basic").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 401);
    gw.stop().await;
}

#[tokio::test]
async fn without_a_token_only_json_for_a_loopback_host_is_taken() {
    let gw = Gw::start(|c| c.gateway.http.token = "".into()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/messages", gw.base);
    // What a web page can send across sites without a preflight: a text/plain form post.
    let plain = client
        .post(&url)
        .header("content-type", "text/plain")
        .body(message("p1").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(plain.status().as_u16(), 415);
    // A DNS-rebound name reaches the loopback listener with its own Host.
    let rebound = client
        .post(&url)
        .header("content-type", "application/json")
        .header("host", "attacker.example:8080")
        .body(message("p2").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(rebound.status().as_u16(), 403);
    let body: Value = rebound.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("gateway.http.token"),
        "{body}"
    );
    let stream = client
        .get(format!(
            "{}/api/v1/stream?platform=myapp&bot_id=main",
            gw.base
        ))
        .header("host", "attacker.example")
        .send()
        .await
        .expect("request");
    assert_eq!(stream.status().as_u16(), 403);
    assert!(
        gw.try_next_chat_in().await.is_none(),
        "a refused post reached CHAT_IN"
    );
    // The developer's own client, as `hark dev`'s playground sends it.
    let (status, body) = gw.post(&message("p3").to_string(), None).await;
    assert_eq!(status, 202, "{body}");
    gw.stop().await;
}

#[tokio::test]
async fn ids_that_cannot_be_headers_or_bots_that_are_not_configured_are_refused_and_the_next_message_goes_through()
 {
    let gw = Gw::start(|_| {}).await;
    let with = |field: &str, value: Value| {
        let mut m = message("ok-1");
        m[field] = value;
        m.to_string()
    };
    let cases = [
        ("message_id", with("message_id", json!("a\nb"))),
        ("message_id", with("message_id", json!("9".repeat(20_000)))),
        ("message_id", with("message_id", json!("a\u{202E}b"))),
        ("bot_id", with("bot_id", json!("other"))),
        ("bot_id", with("bot_id", json!("a/b"))),
        (
            "quoted_message_id",
            with("quoted_message_id", json!("q\r\n")),
        ),
    ];
    for (field, body) in cases {
        let (status, answer) = gw.post(&body, Some("app-secret")).await;
        assert!(status == 400 || status == 403, "{field}: {status} {answer}");
        assert!(
            answer["error"].as_str().unwrap_or_default().contains(field),
            "{field}: {answer}"
        );
    }
    let mut sender = message("ok-2");
    sender["sender"]["user_id"] = json!("u\u{200B}1");
    let (status, _) = gw.post(&sender.to_string(), Some("app-secret")).await;
    assert_eq!(status, 400);
    let (status, body) = gw
        .post(&message("ok-3").to_string(), Some("app-secret"))
        .await;
    assert_eq!(status, 202, "{body}");
    let got: pb::ChatMessage = codec::decode(&gw.next_chat_in().await.payload).expect("decodes");
    assert_eq!(got.message_id, "ok-3");
    gw.stop().await;
}

#[tokio::test]
async fn a_post_that_waits_gets_the_verdict_task_control_tells_and_without_one_is_still_accepted() {
    let gw = Gw::start(|_| {}).await;
    let nats = async_nats::connect(common::nats_url()).await.expect("nats");
    // Plays task-control: takes the message from CHAT_IN, then tells its verdict.
    let teller = {
        let (js, names, nats) = (gw.js.clone(), gw.names.clone(), nats.clone());
        tokio::spawn(async move {
            let consumer: jetstream::consumer::PullConsumer = js
                .get_consumer_from_stream(Names::CONTROL_CONSUMER, names.chat_in_stream())
                .await
                .expect("consumer");
            let mut messages = consumer.messages().await.expect("messages");
            let message = messages.next().await.expect("one").expect("ok");
            let got: pb::ChatMessage = codec::decode(&message.payload).expect("decodes");
            message.ack().await.expect("ack");
            let key =
                Names::chat_in_msg_id(&got.platform, &got.bot_id, &got.stream, &got.message_id);
            nats.publish(
                names.chat_verdict(&key),
                json!({"taken": true, "as": "answer"}).to_string().into(),
            )
            .await
            .expect("verdict");
            nats.flush().await.expect("flush");
        })
    };
    let post = |id: &str, wait_ms: u64| {
        reqwest::Client::new()
            .post(format!("{}/api/v1/messages?wait_ms={wait_ms}", gw.base))
            .bearer_auth("app-secret")
            .json(&message(id))
            .send()
    };
    let response = post("v1", 10_000).await.expect("request");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        (&body["accepted"], &body["taken"], &body["as"]),
        (&json!(true), &json!(true), &json!("answer")),
        "{body}"
    );
    teller.await.expect("teller");

    // Nobody tells a verdict: after the wait, the message is accepted all the same.
    let response = post("v2", 200).await.expect("request");
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        (&body["accepted"], &body["taken"]),
        (&json!(true), &Value::Null)
    );
    let got: pb::ChatMessage = codec::decode(&gw.next_chat_in().await.payload).expect("decodes");
    assert_eq!(got.message_id, "v2");
    // The same message again is a duplicate, and not a second message.
    let response = post("v2", 0).await.expect("request");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["duplicate"], json!(true), "{body}");
    assert!(gw.try_next_chat_in().await.is_none());
    gw.stop().await;
}

/// Pulls the bot's messages through `GET /api/v1/outbound`.
async fn pull(gw: &Gw, bot: &str, wait_ms: u64) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/outbound?platform=myapp&bot_id={bot}&wait_ms={wait_ms}",
            gw.base
        ))
        .bearer_auth("app-secret")
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn ack(gw: &Gw, bot: &str, acks: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/outbound/ack", gw.base))
        .bearer_auth("app-secret")
        .json(&json!({"platform": "myapp", "bot_id": bot, "acks": acks}))
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn pulled_messages_come_again_until_acknowledged_and_never_after() {
    let gw = Gw::start(|c| {
        c.gateway.http.bots = vec!["myapp:main".into(), "myapp:other".into()];
        // A pulled message not acknowledged comes back after send_timeout + 5 s.
        c.gateway.send_timeout = hark_core::domain::HumanDuration::from_secs(1);
    })
    .await;
    gw.publish_out("Which plan?", "q-7").await;
    gw.publish_out("second", "").await;
    let (status, body) = pull(&gw, "main", 5_000).await;
    assert_eq!(status, 200, "{body}");
    let first = body["messages"].as_array().cloned().unwrap_or_default();
    let texts: Vec<&str> = first.iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["Which plan?", "second"], "{body}");
    // The app dies before acknowledging "second": it is handed out again, and only it.
    let (status, body) = ack(
        &gw,
        "main",
        json!([{"ack": first[0]["ack"], "message_id": 555}]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["acks"][0]["acked"], json!(true), "{body}");
    let again = loop {
        let (status, body) = pull(&gw, "main", 10_000).await;
        assert_eq!(status, 200, "{body}");
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if !messages.is_empty() {
            break messages;
        }
    };
    let texts: Vec<&str> = again.iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["second"]);
    assert_eq!(again[0]["id"], first[1]["id"]);
    let (_, body) = ack(&gw, "main", json!([{"ack": again[0]["ack"]}])).await;
    assert_eq!(body["acks"][0]["acked"], json!(true), "{body}");
    // The question's platform id was reported, for quotes.
    let receipt = gw.next_receipt().await;
    assert_eq!(
        (
            receipt.question_id.as_str(),
            receipt.platform_message_id.as_str()
        ),
        ("q-7", "555")
    );
    // Nothing is handed out twice once acknowledged, well past the acknowledgement wait.
    let (_, body) = pull(&gw, "main", 7_000).await;
    assert_eq!(body["messages"], json!([]), "{body}");

    // Another bot's token, a made-up token and a bot not configured are refused.
    gw.publish_out("third", "").await;
    let (_, body) = pull(&gw, "main", 5_000).await;
    let third = body["messages"][0]["ack"].clone();
    let (status, body) = ack(&gw, "other", json!([{"ack": third}])).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = ack(&gw, "main", json!([{"ack": "$JS.ACK.X.Y.1.2.3.4.5 a b"}])).await;
    assert_eq!(status, 400);
    let (status, _) = pull(&gw, "nobody", 10).await;
    assert_eq!(status, 404);
    let too_many: Vec<Value> = (0..101).map(|_| json!({"ack": third})).collect();
    let (status, body) = ack(&gw, "main", json!(too_many)).await;
    assert_eq!(status, 400, "{body}");
    let (_, body) = ack(&gw, "main", json!([{"ack": third}])).await;
    assert_eq!(body["acks"][0]["acked"], json!(true), "{body}");
    gw.stop().await;
}

/// Pulls until a message comes, at most `within`.
async fn pull_some(gw: &Gw, within: Duration) -> Vec<Value> {
    hark_testkit::eventually("a message is handed out", within, || async {
        let (status, body) = pull(gw, "main", 2_000).await;
        assert_eq!(status, 200, "{body}");
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        (!messages.is_empty()).then_some(messages)
    })
    .await
}

/// The reasons of the dead letters of this namespace, once there are `count`.
async fn dead_reasons(gw: &Gw, count: u64) -> Vec<(String, String)> {
    let dead = gw
        .js
        .get_stream(gw.names.dead_letter_stream())
        .await
        .expect("dead-letter stream");
    hark_testkit::eventually("set aside", Duration::from_secs(20), || {
        let mut dead = dead.clone();
        async move { (dead.info().await.ok()?.state.messages >= count).then_some(()) }
    })
    .await;
    let mut letters = Vec::new();
    for seq in 1..=count {
        let letter = dead.get_raw_message(seq).await.expect("dead letter");
        let reason = letter
            .headers
            .get(hark_core::consume::REASON_HEADER)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        let text = codec::decode::<pb::OutboundMessage>(&letter.payload)
            .expect("the message itself")
            .text;
        letters.push((text, reason));
    }
    letters
}

#[tokio::test]
async fn a_message_the_app_cannot_send_comes_again_and_is_set_aside_without_holding_up_the_rest() {
    let gw = Gw::start(|c| {
        c.gateway.send_timeout = hark_core::domain::HumanDuration::from_secs(1);
    })
    .await;
    gw.publish_out("to a chat that does not exist", "q-9").await;
    gw.publish_out("fine", "").await;
    let first = pull_some(&gw, Duration::from_secs(10)).await;
    let texts: Vec<&str> = first.iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["to a chat that does not exist", "fine"]);
    assert_eq!(first[0]["attempt"], json!(1), "{first:?}");

    // The app sends the second, and could not send the first: it comes again, after a while.
    let (status, body) = ack(
        &gw,
        "main",
        json!([
            {"ack": first[0]["ack"], "failed": "the bot is not connected yet"},
            {"ack": first[1]["ack"], "message_id": 9},
        ]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["acks"][0]["acked"], json!(false), "{body}");
    assert_eq!(body["acks"][0]["again_in_ms"], json!(1000), "{body}");
    assert_eq!(body["acks"][1]["acked"], json!(true), "{body}");
    let again = pull_some(&gw, Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["id"], first[0]["id"]);
    assert_eq!(again[0]["attempt"], json!(2), "{again:?}");

    // It never can be: set aside at once, with the app's reason, and never handed out again.
    let (status, body) = ack(
        &gw,
        "main",
        json!([{"ack": again[0]["ack"], "failed": "group abc\ndoes not exist", "retry": false}]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["acks"][0]["set_aside"], json!(true), "{body}");
    let letters = dead_reasons(&gw, 1).await;
    assert_eq!(letters[0].0, "to a chat that does not exist");
    assert_eq!(
        letters[0].1,
        "myapp:main could not send it (attempt 2): group abc does not exist"
    );
    // Its question learns why nobody in the chat saw it.
    let receipt = gw.next_receipt().await;
    assert_eq!(
        (
            receipt.question_id.as_str(),
            receipt.platform_message_id.as_str(),
            receipt.failed.as_str()
        ),
        ("q-9", "", letters[0].1.as_str())
    );
    // Past the acknowledgement wait, nothing comes again.
    let (_, body) = pull(&gw, "main", 7_000).await;
    assert_eq!(body["messages"], json!([]), "{body}");

    // An app that stops on a message, and so never acknowledges it, gets it so many times and
    // then no more. (Each delivery is let go at once here, rather than after the wait.)
    gw.publish_out("stops the app", "").await;
    for attempt in 1..=hark_gateway::outbound::MAX_ATTEMPTS {
        let (_, body) = pull(&gw, "main", 5_000).await;
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 1, "{body}");
        assert_eq!(messages[0]["text"], json!("stops the app"), "{body}");
        assert_eq!(messages[0]["attempt"], json!(attempt), "{body}");
        let reply = messages[0]["ack"]
            .as_str()
            .and_then(|t| t.split(' ').next());
        let nats = &gw.running.hub.nats;
        nats.publish(reply.expect("a token").to_owned(), "-NAK".into())
            .await
            .expect("nak");
        nats.flush().await.expect("flush");
    }
    gw.publish_out("after it", "").await;
    let last = pull_some(&gw, Duration::from_secs(10)).await;
    let texts: Vec<&str> = last.iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["after it"], "{last:?}");
    let letters = dead_reasons(&gw, 2).await;
    assert_eq!(letters[1].0, "stops the app");
    assert_eq!(
        letters[1].1,
        format!(
            "handed out {} times to myapp:main and never acknowledged",
            hark_gateway::outbound::MAX_ATTEMPTS
        )
    );
    // A reason of any length is kept short.
    gw.publish_out("with a long story", "").await;
    let long = pull_some(&gw, Duration::from_secs(10)).await;
    let story = "why ".repeat(5_000);
    let (_, body) = ack(
        &gw,
        "main",
        json!([{"ack": long[0]["ack"], "failed": story, "retry": false}]),
    )
    .await;
    assert_eq!(body["acks"][0]["set_aside"], json!(true), "{body}");
    let letters = dead_reasons(&gw, 3).await;
    assert_eq!(letters[2].0, "with a long story");
    assert!(
        letters[2].1.len() < 600 && letters[2].1.contains("why why"),
        "{}",
        letters[2].1
    );
    // A failure reported for another bot's message, or with a made-up token, is refused.
    let (status, _) = ack(
        &gw,
        "main",
        json!([{"ack": "$JS.ACK.X.Y.1.2.3.4.5 a b", "failed": "no"}]),
    )
    .await;
    assert_eq!(status, 400);
    gw.stop().await;
}

/// An app that has nowhere to show a message now puts it off: it comes again soon, as often as
/// the app puts it off, and is never set aside for it, but once it was held for longer than the
/// stream keeps messages.
#[tokio::test]
async fn a_message_put_off_comes_again_for_as_long_as_the_stream_keeps_it() {
    let gw = Gw::start(|c| {
        c.gateway.send_timeout = hark_core::domain::HumanDuration::from_secs(30);
    })
    .await;
    gw.publish_out("for a page that is not open", "q-4").await;
    let mut id = Value::Null;
    for round in 1..=2 * hark_gateway::outbound::MAX_ATTEMPTS {
        // Handed out again well before the acknowledgement wait (35 s) would.
        let (_, body) = pull(&gw, "main", 10_000).await;
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 1, "round {round}: {body}");
        assert_eq!(messages[0]["text"], json!("for a page that is not open"));
        if round == 1 {
            id = messages[0]["id"].clone();
        }
        assert_eq!(messages[0]["id"], id, "the same message, by its id");
        let attempt = messages[0]["attempt"].as_u64().expect("attempt");
        assert!(
            attempt <= hark_gateway::outbound::MAX_ATTEMPTS,
            "round {round}: attempt {attempt}"
        );
        let (status, body) = ack(
            &gw,
            "main",
            json!([{"ack": messages[0]["ack"], "later_ms": 10}]),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["acks"][0]["acked"], json!(false), "{body}");
        assert!(body["acks"][0]["set_aside"].is_null(), "{body}");
    }
    // Shown at last, it is acknowledged, and comes no more.
    let shown = pull_some(&gw, Duration::from_secs(10)).await;
    assert_eq!(shown[0]["id"], id);
    let (_, body) = ack(&gw, "main", json!([{"ack": shown[0]["ack"]}])).await;
    assert_eq!(body["acks"][0]["acked"], json!(true), "{body}");
    let (_, body) = pull(&gw, "main", 500).await;
    assert_eq!(body["messages"], json!([]), "{body}");
    let dead = gw
        .js
        .get_stream(gw.names.dead_letter_stream())
        .await
        .expect("dead-letter stream")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(dead, 0, "nothing was set aside");

    // A delay with another verdict, or longer than a minute, is refused.
    gw.publish_out("put off wrongly", "").await;
    let wrong = pull_some(&gw, Duration::from_secs(10)).await;
    for entry in [
        json!({"ack": wrong[0]["ack"], "later_ms": 10, "failed": "no"}),
        json!({"ack": wrong[0]["ack"], "later_ms": 10, "message_id": 1}),
        json!({"ack": wrong[0]["ack"], "later_ms": 60_001}),
    ] {
        let (status, body) = ack(&gw, "main", json!([entry])).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("later_ms")),
            "{body}"
        );
    }
    let (_, body) = ack(&gw, "main", json!([{"ack": wrong[0]["ack"]}])).await;
    assert_eq!(body["acks"][0]["acked"], json!(true), "{body}");

    // A message held since long ago (its copies say since when) is set aside once its attempts
    // are spent, and its question learns why.
    let old = pb::OutboundMessage {
        id: "held-long".into(),
        route: Some(pb::ChatRoute {
            platform: "myapp".into(),
            bot_id: "main".into(),
            stream: "private:u1".into(),
            origin_message_id: String::new(),
        }),
        text: "from long ago".into(),
        question_id: "q-5".into(),
        ..Default::default()
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Hark-Held-Since", "1000");
    gw.js
        .publish_with_headers(
            gw.names.chat_out("myapp", "main").expect("subject"),
            headers,
            codec::encode(old),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
    let mut last = Value::Null;
    for _ in 1..=hark_gateway::outbound::MAX_ATTEMPTS {
        let got = pull_some(&gw, Duration::from_secs(10)).await;
        assert_eq!(got[0]["text"], json!("from long ago"), "{got:?}");
        let (_, body) = ack(&gw, "main", json!([{"ack": got[0]["ack"], "later_ms": 10}])).await;
        last = body;
    }
    assert_eq!(last["acks"][0]["set_aside"], json!(true), "{last}");
    let letters = dead_reasons(&gw, 1).await;
    assert_eq!(letters[0].0, "from long ago");
    assert!(
        letters[0].1.starts_with("put off by the app for ")
            && letters[0].1.ends_with(" days and never sent"),
        "{}",
        letters[0].1
    );
    let receipt = gw.next_receipt().await;
    assert_eq!(
        (receipt.question_id.as_str(), receipt.failed.as_str()),
        ("q-5", letters[0].1.as_str())
    );
    let (_, body) = pull(&gw, "main", 500).await;
    assert_eq!(body["messages"], json!([]), "{body}");
    gw.stop().await;
}
