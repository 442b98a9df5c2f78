//! The gateway against a OneBot bot played over WebSocket, and the real NATS.

mod common;

use common::{Running, nats_url, next, next_traced};

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::{SinkExt, StreamExt};
use hark_core::{bus::Names, codec, config::Config};
use hark_gateway::app::App;
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::{
    MaybeTlsStream, WebSocketStream, connect_async,
    tungstenite::{Message, client::IntoClientRequest},
};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct Gw {
    addr: std::net::SocketAddr,
    names: Names,
    js: jetstream::Context,
    inbound: PullConsumer,
    receipts: PullConsumer,
    running: Running,
}

impl Gw {
    async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = common::config();
        config.gateway.onebot.access_token = "tok".into();
        config.gateway.send_timeout = "2s".parse().expect("duration");
        tweak(&mut config);
        let running = Running::start(&config).await;
        Self {
            addr: running.addr,
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

    /// Waits until the gateway's /healthz no longer lists the bot.
    async fn until_offline(&self, bot: &str) {
        let what = format!("bot {bot} is offline");
        hark_testkit::eventually(&what, Duration::from_secs(5), || async {
            (!listed(self, bot).await).then_some(())
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("ws://{}{path}", self.addr)
    }

    async fn connect(
        &self,
        self_id: &str,
        token: Option<&str>,
    ) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
        self.connect_at("/onebot/v11/ws", self_id, token).await
    }

    async fn connect_at(
        &self,
        path: &str,
        self_id: &str,
        token: Option<&str>,
    ) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
        let mut request = self.url(path).into_client_request().expect("request");
        if !self_id.is_empty() {
            request
                .headers_mut()
                .insert("x-self-id", self_id.parse().expect("header"));
        }
        request
            .headers_mut()
            .insert("x-client-role", "Universal".parse().expect("header"));
        if let Some(token) = token {
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("header"),
            );
        }
        connect_async(request).await.map(|(ws, _)| ws)
    }

    async fn next_inbound(&self, wait: Duration) -> Option<pb::ChatMessage> {
        next(&self.inbound, wait).await
    }

    async fn publish_out(
        &self,
        bot: &str,
        stream: &str,
        text: &str,
        question: &str,
        reply_to: &str,
    ) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let message = pb::OutboundMessage {
            id: id.clone(),
            route: Some(pb::ChatRoute {
                platform: "qq".into(),
                bot_id: bot.into(),
                stream: stream.into(),
                origin_message_id: String::new(),
            }),
            text: text.into(),
            reply_to_message_id: reply_to.into(),
            question_id: question.into(),
            ..Default::default()
        };
        hark_core::publish::publish(
            &self.js,
            hark_core::publish::Outgoing {
                subject: self.names.chat_out("qq", bot).expect("subject"),
                msg_id: &id,
                payload: codec::encode(message),
                trace: None,
            },
        )
        .await
        .expect("published");
        id
    }
}

fn group_event(message: Value, message_id: i64, user: i64) -> String {
    json!({"time": 1700000000, "self_id": 42, "post_type": "message", "message_type": "group",
           "sub_type": "normal", "message_id": message_id, "group_id": 777, "user_id": user,
           "message": message, "raw_message": "", "font": 0,
           "sender": {"user_id": user, "nickname": "Ann", "card": ""}})
    .to_string()
}

/// Reads frames until an action arrives; returns it.
async fn next_action(ws: &mut Ws) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an action within 10s")
            .expect("open")
            .expect("frame");
        if let Message::Text(text) = frame {
            let value: Value = serde_json::from_str(&text).expect("json");
            if value.get("action").is_some() {
                return value;
            }
        }
    }
}

#[tokio::test]
async fn a_wrong_or_missing_token_or_self_id_is_refused() {
    let gw = Gw::start(|_| {}).await;
    let err = gw.connect("42", None).await.expect_err("no token");
    assert!(err.to_string().contains("401"), "{err}");
    let err = gw
        .connect("42", Some("nope"))
        .await
        .expect_err("wrong token");
    assert!(err.to_string().contains("401"), "{err}");
    let err = gw.connect("", Some("tok")).await.expect_err("no self id");
    assert!(err.to_string().contains("400"), "{err}");
    // The token may also come as a query parameter, on any of NoneBot's paths.
    for path in ["/onebot/v11/ws/", "/onebot/v11/"] {
        let mut request = gw
            .url(&format!("{path}?access_token=tok"))
            .into_client_request()
            .expect("request");
        request
            .headers_mut()
            .insert("x-self-id", "42".parse().expect("header"));
        connect_async(request).await.expect("query token accepted");
    }
    gw.stop().await;
}

#[tokio::test]
async fn group_and_private_messages_are_normalised_the_same_from_cq_strings_and_segments() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    ws.send(Message::text(group_event(
        json!("[CQ:reply,id=-9][CQ:at,qq=42] hello &amp; bye"),
        1,
        100,
    )))
    .await
    .expect("send");
    ws.send(Message::text(group_event(
        json!([{"type": "reply", "data": {"id": -9}}, {"type": "at", "data": {"qq": 42}},
               {"type": "text", "data": {"text": " hello & bye"}}]),
        2,
        100,
    )))
    .await
    .expect("send");
    let private = json!({"time": 1700000001, "self_id": 42, "post_type": "message", "message_type": "private",
                         "message_id": "3", "user_id": "100", "message": "psst"});
    ws.send(Message::text(private.to_string()))
        .await
        .expect("send");

    let a = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("first");
    let b = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("second");
    let c = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("third");
    assert_eq!(a.message_id, "1");
    assert_eq!(b.message_id, "2");
    // Each was read at its own moment; the rest must be the same.
    let read = |m: &pb::ChatMessage| m.received_at.is_some();
    assert!(
        read(&a) && read(&b) && read(&c),
        "the gateway notes when it read each"
    );
    let (a, b) = (
        pb::ChatMessage {
            received_at: None,
            ..a.clone()
        },
        pb::ChatMessage {
            received_at: None,
            ..b.clone()
        },
    );
    assert_eq!(
        pb::ChatMessage {
            message_id: String::new(),
            ..a.clone()
        },
        pb::ChatMessage {
            message_id: String::new(),
            ..b
        },
        "a CQ string and a segment array give the same message"
    );
    assert_eq!(a.platform, "qq");
    assert_eq!(a.bot_id, "42");
    assert_eq!(a.stream, "group:777");
    assert_eq!(a.text, "hello & bye");
    assert_eq!(a.quoted_message_id, "-9");
    assert!(a.mentions_bot);
    assert_eq!(c.stream, "private:100");
    assert_eq!(c.text, "psst");
    gw.stop().await;
}

#[tokio::test]
async fn garbage_frames_are_dropped_and_a_normal_message_still_goes_through() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    for garbage in [
        Message::text("{not json"),
        Message::text("[1, 2, 3]"),
        Message::text(r#"{"post_type": "bogus"}"#),
        Message::text(r#"{"post_type": "message", "self_id": 42}"#),
        Message::text(r#"{"post_type": "notice", "notice_type": "group_upload"}"#),
        Message::text(
            r#"{"post_type": "meta_event", "meta_event_type": "heartbeat", "self_id": 42}"#,
        ),
        Message::binary(vec![0u8, 159, 146, 150]),
        Message::text(group_event(json!("my own words"), 10, 42)),
    ] {
        ws.send(garbage).await.expect("send");
    }
    ws.send(Message::text(group_event(json!("still here"), 11, 100)))
        .await
        .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("the normal message arrives");
    assert_eq!(m.text, "still here");
    assert!(
        gw.next_inbound(Duration::from_millis(300)).await.is_none(),
        "nothing else was published"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_oversized_frame_closes_that_connection_only() {
    let gw = Gw::start(|c| c.gateway.max_frame_bytes = 4096).await;
    let mut big = gw.connect("42", Some("tok")).await.expect("connects");
    let mut other = gw.connect("43", Some("tok")).await.expect("connects");
    let _ = big.send(Message::text("x".repeat(10_000))).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match big.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .expect("the oversized connection is closed");
    assert_eq!(
        closed,
        Some(1009),
        "closed as too big, not as a normal close"
    );
    let event = json!({"self_id": 43, "post_type": "message", "message_type": "private",
                       "message_id": 5, "user_id": 100, "message": "fine"});
    other
        .send(Message::text(event.to_string()))
        .await
        .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("the other bot is unaffected");
    assert_eq!(m.bot_id, "43");
    gw.stop().await;
}

#[tokio::test]
async fn a_flooding_connection_is_rate_limited() {
    let gw = Gw::start(|c| c.gateway.rate_limit = 5).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    for i in 0..100 {
        ws.send(Message::text(group_event(
            json!(format!("spam {i}")),
            1000 + i,
            100,
        )))
        .await
        .expect("send");
    }
    let mut got = 0;
    while gw.next_inbound(Duration::from_millis(500)).await.is_some() {
        got += 1;
    }
    assert!(
        (5..=30).contains(&got),
        "{got} of 100 flood messages passed a limit of 5/s"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_outbound_message_is_sent_with_echo_and_its_message_id_reported() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    gw.publish_out("42", "group:777", "Which city?", "q-1", "-9")
        .await;
    let action = next_action(&mut ws).await;
    assert_eq!(action["action"], "send_group_msg");
    assert_eq!(action["params"]["group_id"], 777);
    assert_eq!(action["params"]["message"][0]["type"], "reply");
    assert_eq!(
        action["params"]["message"][1]["data"]["text"],
        "Which city?"
    );
    let echo = action["echo"].clone();
    ws.send(Message::text(
        json!({"status": "ok", "retcode": 0, "data": {"message_id": 31337}, "echo": echo})
            .to_string(),
    ))
    .await
    .expect("send");
    let receipt: pb::DeliveryReceipt = next(&gw.receipts, Duration::from_secs(5))
        .await
        .expect("receipt");
    assert_eq!(receipt.question_id, "q-1");
    assert_eq!(receipt.platform_message_id, "31337");
    gw.stop().await;
}

#[tokio::test]
async fn a_failed_send_is_retried_and_messages_wait_while_the_bot_is_offline() {
    let gw = Gw::start(|_| {}).await;
    // Queued before the bot ever connects.
    gw.publish_out("42", "private:100", "first", "", "").await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    let action = next_action(&mut ws).await;
    assert_eq!(action["action"], "send_private_msg");
    assert_eq!(action["params"]["message"][0]["data"]["text"], "first");
    // The bot refuses; the gateway tries again.
    ws.send(Message::text(
        json!({"status": "failed", "retcode": 1200, "echo": action["echo"]}).to_string(),
    ))
    .await
    .expect("send");
    let retry = next_action(&mut ws).await;
    assert_eq!(retry["params"]["message"][0]["data"]["text"], "first");
    ws.send(Message::text(
        json!({"status": "ok", "retcode": 0, "data": {"message_id": 1}, "echo": retry["echo"]})
            .to_string(),
    ))
    .await
    .expect("send");

    // The bot goes away; a message waits; a new connection gets it.
    drop(ws);
    gw.until_offline("42").await;
    gw.publish_out("42", "private:100", "while you were away", "", "")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("reconnects");
    let action = next_action(&mut ws).await;
    assert_eq!(
        action["params"]["message"][0]["data"]["text"],
        "while you were away"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_new_connection_for_the_same_bot_replaces_the_old_one() {
    let gw = Gw::start(|_| {}).await;
    let mut old = gw.connect("42", Some("tok")).await.expect("connects");
    let mut new = gw.connect("42", Some("tok")).await.expect("connects again");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match old.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "the old connection is closed");
    gw.publish_out("42", "group:777", "to the new one", "", "")
        .await;
    let action = next_action(&mut new).await;
    assert_eq!(
        action["params"]["message"][0]["data"]["text"],
        "to the new one"
    );
    gw.stop().await;
}

#[tokio::test]
#[allow(clippy::result_large_err)]
async fn forward_mode_dials_the_bots_own_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let bot_addr = listener.local_addr().expect("addr");
    let gw = Gw::start(|c| c.gateway.onebot.forward = vec![format!("ws://{bot_addr}")]).await;
    let (tcp, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the gateway dials in")
        .expect("accept");
    let mut ws = tokio_tungstenite::accept_hdr_async(
        tcp,
        |request: &tokio_tungstenite::tungstenite::handshake::server::Request, response| {
            assert_eq!(
                request
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok()),
                Some("Bearer tok")
            );
            Ok(response)
        },
    )
    .await
    .expect("handshake");
    ws.send(Message::text(
        json!({"post_type": "meta_event", "meta_event_type": "lifecycle", "sub_type": "connect", "self_id": 4242}).to_string(),
    ))
    .await
    .expect("send");
    ws.send(Message::text(
        json!({"self_id": 4242, "post_type": "message", "message_type": "private", "message_id": 8,
               "user_id": 100, "message": "forward hello"})
        .to_string(),
    ))
    .await
    .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(5))
        .await
        .expect("message");
    assert_eq!(
        (m.bot_id.as_str(), m.text.as_str()),
        ("4242", "forward hello")
    );
    gw.stop().await;
}

/// The gateway's /healthz, asked with `token` as the bearer token.
async fn health(gw: &Gw, token: Option<&str>) -> Value {
    let mut request = reqwest::Client::new().get(format!("http://{}/healthz", gw.addr));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request
        .send()
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json")
}

/// Whether the gateway's /healthz lists the bot as online.
async fn listed(gw: &Gw, bot: &str) -> bool {
    let health = health(gw, Some("tok")).await;
    health["bots"]
        .as_array()
        .is_some_and(|b| b.iter().any(|x| x == &json!(format!("qq:{bot}"))))
}

#[tokio::test]
async fn a_silent_connection_is_closed_and_one_that_answers_pings_is_kept() {
    let gw = Gw::start(|c| c.gateway.onebot.idle_timeout = "3s".parse().expect("duration")).await;
    // Bot 42 never reads its socket, so it answers no ping; bot 43 reads (its WebSocket library
    // answers each ping with a pong) but sends nothing either.
    let mut silent = gw.connect("42", Some("tok")).await.expect("connects");
    let mut live = gw.connect("43", Some("tok")).await.expect("connects");
    let (pings_tx, mut pings) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(frame) = live.next().await {
            match frame {
                Ok(Message::Ping(_)) => {
                    let _ = pings_tx.send(());
                }
                Ok(Message::Close(_)) | Err(_) => return "closed",
                Ok(_) => {}
            }
        }
        "ended"
    });
    assert!(listed(&gw, "42").await && listed(&gw, "43").await);
    let mut offline = false;
    for _ in 0..300 {
        if !listed(&gw, "42").await {
            offline = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(offline, "the silent bot is still online after 15s");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match silent.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "the silent connection is closed");
    // Bot 43 has been silent as long, but answered the pings: it stays, through two more timeouts.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        listed(&gw, "43").await,
        "the bot that answers pings was closed"
    );
    assert!(!reader.is_finished(), "the live connection ended");
    assert!(pings.try_recv().is_ok(), "the gateway sent no ping");
    reader.abort();
    gw.stop().await;
}

#[tokio::test]
async fn a_silent_forward_connection_is_closed_and_dialled_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let bot_addr = listener.local_addr().expect("addr");
    let gw = Gw::start(|c| {
        c.gateway.onebot.forward = vec![format!("ws://{bot_addr}")];
        c.gateway.onebot.idle_timeout = "3s".parse().expect("duration");
    })
    .await;
    let hello = json!({"post_type": "meta_event", "meta_event_type": "lifecycle",
                       "sub_type": "connect", "self_id": 4242})
    .to_string();
    // The bot's server says who it is, then never reads again: no pong answers the pings.
    let accept = || async {
        let (tcp, _) = tokio::time::timeout(Duration::from_secs(15), listener.accept())
            .await
            .expect("the gateway dials in")
            .expect("accept");
        let mut ws = tokio_tungstenite::accept_async(tcp)
            .await
            .expect("handshake");
        ws.send(Message::text(hello.clone())).await.expect("send");
        ws
    };
    let mut first = accept().await;
    let mut online = false;
    for _ in 0..100 {
        if listed(&gw, "4242").await {
            online = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(online, "the forward bot never came online");
    // After the idle timeout the gateway gives up on this connection and dials again.
    let _second = accept().await;
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match first.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "the silent connection was not closed");
    gw.stop().await;
}

#[tokio::test]
async fn each_inbound_message_starts_a_trace_of_its_own() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    let mut traces = Vec::new();
    for id in [11, 12] {
        ws.send(Message::text(group_event(json!("hello"), id, 100)))
            .await
            .expect("send");
        let (message, trace): (pb::ChatMessage, _) =
            next_traced(&gw.inbound, Duration::from_secs(5))
                .await
                .expect("inbound");
        assert_eq!(message.message_id, id.to_string());
        traces.push(trace.expect("the message carries a trace").trace_id());
    }
    assert_ne!(traces[0], traces[1], "two messages share a trace");
    gw.stop().await;
}

#[tokio::test]
async fn a_frame_claiming_another_bots_self_id_is_dropped_and_the_other_bot_is_not_used() {
    let gw = Gw::start(|_| {}).await;
    let mut a = gw
        .connect("42", Some("tok"))
        .await
        .expect("bot 42 connects");
    let mut b = gw
        .connect("43", Some("tok"))
        .await
        .expect("bot 43 connects");
    assert!(listed(&gw, "42").await && listed(&gw, "43").await);
    // Bot 42's connection sends a message claiming to come through bot 43.
    let spoofed = json!({"self_id": 43, "post_type": "message", "message_type": "group",
        "message_id": 901, "group_id": 777, "user_id": 100, "message": "spoofed"});
    a.send(Message::text(spoofed.to_string()))
        .await
        .expect("send");
    // Then each bot sends one message of its own.
    a.send(Message::text(group_event(json!("from 42"), 902, 100)))
        .await
        .expect("send");
    let own = json!({"self_id": 43, "post_type": "message", "message_type": "group",
        "message_id": 903, "group_id": 777, "user_id": 100, "message": "from 43"});
    b.send(Message::text(own.to_string())).await.expect("send");
    let mut got = Vec::new();
    while let Some(m) = gw.next_inbound(Duration::from_secs(3)).await {
        got.push((m.bot_id, m.text));
        if got.len() == 2 {
            break;
        }
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("42".to_owned(), "from 42".to_owned()),
            ("43".to_owned(), "from 43".to_owned())
        ],
        "only each connection's own messages reach hark"
    );
    assert!(
        gw.next_inbound(Duration::from_millis(500)).await.is_none(),
        "the spoofed frame was not published late"
    );
    gw.stop().await;
}

#[tokio::test]
async fn healthz_answers_everyone_but_lists_bots_only_to_a_token_holder() {
    let gw = Gw::start(|_| {}).await;
    let _bot = gw.connect("42", Some("tok")).await.expect("connects");
    assert!(listed(&gw, "42").await, "a token holder sees the bot");
    let anonymous = health(&gw, None).await;
    assert_eq!(anonymous["status"], "ok");
    assert!(anonymous.get("bots").is_none(), "{anonymous}");
    let wrong = health(&gw, Some("not-the-token")).await;
    assert!(wrong.get("bots").is_none(), "{wrong}");
    gw.stop().await;
}

#[tokio::test]
async fn a_gateway_reachable_from_other_hosts_does_not_start_without_its_tokens() {
    let mut config = Config::default();
    config.nats.url = nats_url().into();
    config.gateway.listen = "0.0.0.0:0".parse().expect("addr");
    let err = App::build(&config).await.expect_err("refused").to_string();
    assert!(err.contains("gateway.onebot.access_token"), "{err}");
    config.gateway.onebot.access_token = "3f9c2a7be41d08c6a5f3e9d27b1c40aa".into();
    config.gateway.http.platforms = vec!["myapp".into()];
    let err = App::build(&config).await.expect_err("refused").to_string();
    assert!(err.contains("gateway.http.token"), "{err}");
}

#[tokio::test]
async fn a_quote_reply_carries_the_quoted_messages_text_and_author_as_the_bot_tells_them() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    ws.send(Message::text(group_event(
        json!([{"type": "reply", "data": {"id": "555"}}, {"type": "text", "data": {"text": "green"}}]),
        71,
        100,
    )))
    .await
    .expect("send");
    // The gateway asks the bot what message 555 was, and the bot says.
    let action = next_action(&mut ws).await;
    assert_eq!(action["action"], "get_msg");
    assert_eq!(action["params"]["message_id"], json!(555));
    let answer = json!({"status": "ok", "retcode": 0, "echo": action["echo"], "data": {
        "message_id": 555, "sender": {"user_id": 42, "nickname": "hark"},
        "message": [{"type": "text", "data": {"text": "[task 1a2b3c4d · #beef] Which colour?"}}]}});
    ws.send(Message::text(answer.to_string()))
        .await
        .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(10))
        .await
        .expect("the reply reaches CHAT_IN");
    assert_eq!(m.text, "green");
    assert_eq!(m.quoted_message_id, "555");
    assert_eq!(m.quoted_text, "[task 1a2b3c4d · #beef] Which colour?");
    assert_eq!(m.quoted_sender, "42");

    // A bot that does not answer get_msg still gets its message through, without the text.
    ws.send(Message::text(group_event(
        json!([{"type": "reply", "data": {"id": "556"}}, {"type": "text", "data": {"text": "red"}}]),
        72,
        100,
    )))
    .await
    .expect("send");
    let action = next_action(&mut ws).await;
    let refused = json!({"status": "failed", "retcode": 100, "echo": action["echo"], "message": "no such message"});
    ws.send(Message::text(refused.to_string()))
        .await
        .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(10))
        .await
        .expect("the reply reaches CHAT_IN");
    assert_eq!((m.text.as_str(), m.quoted_text.as_str()), ("red", ""));
    gw.stop().await;
}

#[tokio::test]
async fn ids_a_header_cannot_carry_are_dropped_at_the_frame_and_the_bot_goes_on() {
    let gw = Gw::start(|_| {}).await;
    let mut ws = gw.connect("42", Some("tok")).await.expect("connects");
    let with_id = |id: Value| {
        json!({"self_id": 42, "post_type": "message", "message_type": "group",
               "message_id": id, "group_id": 777, "user_id": 100, "message": "bad id"})
        .to_string()
    };
    for id in [
        json!("1\n2"),
        json!("9".repeat(65_000)),
        json!("1\u{202E}2"),
    ] {
        ws.send(Message::text(with_id(id))).await.expect("send");
    }
    let bad_group = json!({"self_id": 42, "post_type": "message", "message_type": "group",
                           "message_id": 5, "group_id": "7 7", "user_id": 100, "message": "x"});
    ws.send(Message::text(bad_group.to_string()))
        .await
        .expect("send");
    ws.send(Message::text(group_event(json!("still here"), 12, 100)))
        .await
        .expect("send");
    let m = gw
        .next_inbound(Duration::from_secs(10))
        .await
        .expect("the normal message arrives");
    assert_eq!(m.text, "still here");
    assert!(
        gw.next_inbound(Duration::from_millis(300)).await.is_none(),
        "no bad frame was published"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_x_self_id_that_cannot_name_a_consumer_is_refused() {
    let gw = Gw::start(|_| {}).await;
    for bad in ["a/b", "4.2", &"1".repeat(65)] {
        assert!(
            gw.connect(bad, Some("tok")).await.is_err(),
            "{bad:?} was accepted"
        );
    }
    assert!(gw.connect("42", Some("tok")).await.is_ok());
    gw.stop().await;
}

#[tokio::test]
async fn a_spooled_message_jetstream_can_never_take_is_set_aside_and_the_rest_flow_on() {
    let mut config = common::config();
    config.gateway.onebot.access_token = "tok".into();
    let names = Names::new(config.nats.namespace.parse().expect("ns"));
    // Spooled by an earlier gateway, before ids were checked where they enter: an id with a
    // line break (which no header can carry), one too long for a header, and a message larger
    // than the server's max_payload (1 MiB by default); then a good one.
    let huge = "字".repeat(400_000);
    {
        let (spool, _) = hark_gateway::spool::Spool::open(
            std::path::Path::new(&config.gateway.spool_dir),
            8 << 20,
        )
        .expect("spool");
        for (id, text) in [
            ("qq:42:group:777:1\n2", "bad"),
            (&*format!("qq:{}", "9".repeat(70_000)), "long"),
            ("qq:42:group:777:2", huge.as_str()),
            ("qq:42:group:777:3", "good"),
        ] {
            let message = pb::ChatMessage {
                platform: "qq".into(),
                bot_id: "42".into(),
                stream: "group:777".into(),
                text: text.into(),
                message_id: "x".into(),
                sender: Some(pb::Sender {
                    user_id: "100".into(),
                    nickname: String::new(),
                }),
                ..Default::default()
            };
            spool
                .append(hark_gateway::spool::Spooled {
                    seq: 0,
                    subject: names.chat_in("qq").expect("subject"),
                    msg_id: id.to_owned(),
                    trace: None,
                    payload: codec::encode(message),
                })
                .await
                .expect("spooled");
        }
    }
    let gw = Gw::start(|c| *c = config.clone()).await;
    let m = gw
        .next_inbound(Duration::from_secs(20))
        .await
        .expect("the good message arrives");
    assert_eq!(m.text, "good");
    let mut dead = gw
        .js
        .get_stream(names.dead_letter_stream())
        .await
        .expect("dead-letter stream");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while dead.info().await.expect("info").state.messages < 3 {
        assert!(tokio::time::Instant::now() < deadline, "not set aside");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut reasons = Vec::new();
    for seq in 1..=3 {
        let letter = dead.get_raw_message(seq).await.expect("dead letter");
        reasons.push(
            letter
                .headers
                .get(hark_core::consume::REASON_HEADER)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
        );
    }
    assert!(reasons[0].contains("line break"), "{reasons:?}");
    assert!(reasons[1].contains("longer than 1024 bytes"), "{reasons:?}");
    assert!(reasons[2].contains("max payload"), "{reasons:?}");
    // Too large to keep whole, the letter keeps its start and says how large it was.
    let cut = dead.get_raw_message(3).await.expect("dead letter");
    let from: usize = cut
        .headers
        .get(hark_core::consume::CUT_HEADER)
        .expect("marked as cut")
        .as_str()
        .parse()
        .expect("a size");
    assert!(from > 1 << 20 && cut.payload.len() < from, "{from}");
    assert_eq!(gw.running.hub.spool.pending(), 0, "the spool is empty");
    gw.stop().await;
}

#[tokio::test]
async fn a_bot_with_a_token_of_its_own_connects_only_with_it_and_no_other_token_speaks_as_it() {
    let gw = Gw::start(|c| {
        c.gateway.onebot.bots.insert(
            "42".into(),
            hark_core::config::OneBotBotConfig {
                access_token: "own-42".into(),
            },
        );
    })
    .await;
    // The shared token no longer connects as bot 42…
    let err = gw
        .connect("42", Some("tok"))
        .await
        .expect_err("shared token");
    assert!(err.to_string().contains("401"), "{err}");
    // …nor does another bot's own token, while 42's own does.
    let _bot = gw
        .connect("42", Some("own-42"))
        .await
        .expect("its own token");
    assert!(listed(&gw, "42").await);
    // Bots without a token of their own still connect with the shared one, and only with it.
    let err = gw
        .connect("7", Some("own-42"))
        .await
        .expect_err("42's token");
    assert!(err.to_string().contains("401"), "{err}");
    let _other = gw.connect("7", Some("tok")).await.expect("shared token");
    gw.stop().await;
}

#[tokio::test]
async fn an_address_that_keeps_guessing_the_token_is_refused_for_a_while() {
    let gw = Gw::start(|_| {}).await;
    for _ in 0..hark_core::secret::Failures::ALLOWED {
        let err = gw
            .connect("42", Some("guess"))
            .await
            .expect_err("wrong token");
        assert!(err.to_string().contains("401"), "{err}");
    }
    let err = gw.connect("42", Some("tok")).await.expect_err("throttled");
    assert!(err.to_string().contains("429"), "{err}");
    gw.stop().await;
}

/// `GET /metrics` on the gateway with `token` as the bearer token: its status.
async fn metrics_status(addr: std::net::SocketAddr, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("metrics answers")
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_gateways_metrics_never_take_a_bots_token() {
    // Beyond loopback without metrics.token: refused, the bot's token too.
    let bot_token = "3f9c2a7be41d08c6a5f3e9d27b1c40aa";
    let open = Gw::start(|c| {
        c.gateway.listen = "0.0.0.0:0".parse().expect("addr");
        c.gateway.onebot.access_token = bot_token.into();
    })
    .await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], open.addr.port()));
    assert_eq!(metrics_status(addr, bot_token).await, 401);
    open.stop().await;
    // With metrics.token: only it.
    let guarded = Gw::start(|c| c.metrics.token = "scrape".into()).await;
    assert_eq!(metrics_status(guarded.addr, "tok").await, 401);
    assert_eq!(metrics_status(guarded.addr, "scrape").await, 200);
    guarded.stop().await;
}

#[tokio::test]
async fn a_bot_gone_longer_than_forget_bot_after_loses_its_consumer_and_gets_its_messages_back() {
    let gw = Gw::start(|c| c.gateway.forget_bot_after = "2s".parse().expect("duration")).await;
    let consumer = gw.names.gateway_consumer("qq", "42").expect("name");
    let exists = |js: jetstream::Context, stream: String, name: String| async move {
        js.get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(name, stream)
            .await
            .is_ok()
    };
    let ws = gw.connect("42", Some("tok")).await.expect("connects");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !exists(gw.js.clone(), gw.names.chat_out_stream(), consumer.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no consumer for the bot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(ws);
    gw.until_offline("42").await;
    // A message for the bot while it is away, then the bot stays away past the bound.
    gw.publish_out("42", "private:100", "while you were away", "", "")
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while exists(gw.js.clone(), gw.names.chat_out_stream(), consumer.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumer of a bot gone past forget_bot_after was kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Back again: the message that waited is delivered.
    let mut ws = gw.connect("42", Some("tok")).await.expect("reconnects");
    let action = next_action(&mut ws).await;
    assert_eq!(
        action["params"]["message"][0]["data"]["text"], "while you were away",
        "{action}"
    );
    gw.stop().await;
}
