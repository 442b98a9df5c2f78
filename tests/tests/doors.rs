//! Every door takes hostile input without stopping: the shapes that once stopped hark, and
//! random ones, sent to the real binary through chat commands, OneBot frames, the HTTP adapter,
//! the web console and the gRPC API. Each is refused or handled; no process exits or panics;
//! the next ordinary message is served through each door.

use std::time::Duration;

use hark_e2e::{Env, bot::Bot};
use hark_proto::v1 as pb;
use serde_json::{Value, json};

const TOKEN: &str = "3f9c2a7be41d08c6a5f3e9d27b1c40aa";
const HTTP_TOKEN: &str = "b7e1c9d24f6a08e35c1d7b9a2e4f6c80";

/// Text that once stopped a consumer or a connection, and its relatives.
fn hostile() -> Vec<String> {
    let mut shapes: Vec<String> = [
        "70000000h",
        "-5m",
        "0s",
        "9999-12-31 23:59",
        "0000-00-00",
        "99999999999999999999",
        "-9223372036854775808",
        "1e309",
        "NaN",
        "\n",
        "a\nb\r\nc",
        "\0",
        "\u{202e}gnp.exe",
        "\u{200b}\u{feff}",
        "🦀🦀🦀",
        "字",
        "%s%n%x",
        "'; DROP TABLE tasks; --",
        "{{}}",
        "[CQ:at,qq=all]",
        "\\",
        "\"",
        "#",
        "#999999999999",
        "------------------------------------------------",
        "*/5 * * * * *",
        "@every 0s",
    ]
    .map(String::from)
    .to_vec();
    shapes.push("x".repeat(70_000));
    shapes.push("字".repeat(30_000));
    shapes.push("\n".repeat(5_000));
    // Random ones, the same on every run.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet: Vec<char> = "abc019-:/#@ \n\t\"\\{}[]字🦀\u{202e}\u{0}%"
        .chars()
        .collect();
    for _ in 0..40 {
        let len = (next() % 64) as usize;
        shapes.push(
            (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect(),
        );
    }
    shapes
}

/// The chat commands each shape is put into.
fn commands(shape: &str) -> Vec<String> {
    [
        "/task new {}",
        "/task new --in {} x",
        "/task new --at {} x",
        "/task every {} x",
        "/task status {}",
        "/task cancel {}",
        "/task answer {}",
        "/task tell {} x",
        "/task {}",
        "{}",
    ]
    .iter()
    .map(|form| form.replace("{}", shape))
    .collect()
}

#[tokio::test]
async fn hostile_input_at_every_door_is_refused_or_handled_and_the_next_message_is_served() {
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", "myapp");
    env.set("HARK_GATEWAY__HTTP__BOTS", "myapp:main");
    env.set("HARK_GATEWAY__HTTP__TOKEN", HTTP_TOKEN);
    env.set("HARK_PERMISSION__ADMINS", "qq:100");
    // Every hostile input reaches hark, rather than the flood limits before it.
    env.set("HARK_GATEWAY__RATE_LIMIT", "1000000");
    env.set("HARK_CHAT__COMMANDS_PER_MINUTE", "0");
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let console_port = control.addr("control.http_listen").await.port();
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_001, TOKEN).await;
    let shapes = hostile();
    let mut sent = 0;

    // Served: an ordinary command through the chat gets its own answer, after whatever the
    // hostile ones got.
    let served = async |bot: &mut Bot, door: &str| {
        let marker = format!("abcdef{}", door.len());
        bot.group_message(5001, 100, &format!("/task status {marker}"))
            .await;
        bot.expect(
            &format!("the answer to an ordinary command after the {door}"),
            Duration::from_secs(120),
            |s| s.text.contains(&marker),
        )
        .await;
    };

    // 1. Chat commands, every shape in every command.
    for shape in &shapes {
        for command in commands(shape) {
            bot.group_message(5001, 100, &command).await;
            sent += 1;
        }
    }
    bot.drain(Duration::from_millis(200)).await;
    served(&mut bot, "chat commands").await;

    // 2. OneBot frames: the shapes as ids, kinds and whole frames.
    for shape in &shapes {
        let id = Value::String(shape.clone());
        for frame in [
            json!({"post_type": "message", "message_type": "group", "self_id": 3_889_001,
                   "message_id": id, "group_id": 5001, "user_id": 100,
                   "message": [{"type": "text", "data": {"text": "hi"}}]}),
            json!({"post_type": "message", "message_type": "group", "self_id": 3_889_001,
                   "message_id": 7, "group_id": id, "user_id": id,
                   "message": [{"type": id, "data": {"text": id}}]}),
            json!({"post_type": id, "message_type": id, "self_id": id}),
            json!({"post_type": "message", "message_type": "private", "self_id": 3_889_001,
                   "message_id": 8, "user_id": 100, "message": id}),
            json!({"echo": id, "status": id, "retcode": id}),
        ] {
            bot.raw(frame.to_string()).await;
            sent += 1;
        }
        bot.raw(shape.clone()).await;
    }
    bot.raw("[".repeat(10_000)).await;
    bot.drain(Duration::from_millis(200)).await;
    served(&mut bot, "OneBot frames").await;

    // 3. The HTTP adapter: hostile bodies; each is a 4xx, never a 5xx, and the next is taken.
    hark_core::install_crypto();
    let http = reqwest::Client::new();
    let adapter = format!(
        "http://127.0.0.1:{}/api/v1/messages",
        env.gateway_port().await
    );
    let post = |body: String| {
        http.post(&adapter)
            .bearer_auth(HTTP_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for shape in &shapes {
        let s = Value::String(shape.clone());
        for body in [
            json!({"platform": "myapp", "bot_id": "main", "stream": s, "sender": {"user_id": "u1"},
                   "text": "hi", "message_id": "m1"}),
            json!({"platform": "myapp", "bot_id": s, "stream": "c1", "sender": {"user_id": s},
                   "text": s, "message_id": s}),
            json!({"platform": s, "bot_id": "main", "stream": "c1", "sender": s, "text": 1}),
            json!([s]),
        ] {
            let status = post(body.to_string())
                .await
                .expect("the adapter answers")
                .status();
            assert!(!status.is_server_error(), "{status} for {body}");
            sent += 1;
        }
        let status = post(shape.clone()).await.expect("answers").status();
        assert!(!status.is_server_error(), "{status} for a bare shape");
    }
    let ordinary = json!({"platform": "myapp", "bot_id": "main", "stream": "group:c1",
        "sender": {"user_id": "u1"}, "text": "/task list", "message_id": "ordinary-1"});
    let status = post(ordinary.to_string()).await.expect("answers").status();
    assert!(status.is_success(), "an ordinary message: {status}");

    // 4. The web console's JSON.
    let console = format!("http://127.0.0.1:{console_port}/api");
    let task = api
        .create_task(pb::CreateTaskRequest {
            owner: "qq:100".into(),
            goal: "a task to poke at".into(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    for shape in &shapes {
        let s = Value::String(shape.clone());
        for (path, body) in [
            ("/tasks".to_owned(), json!({"owner": s, "goal": s})),
            (
                "/tasks".to_owned(),
                json!({"owner": "qq:1", "goal": "x", "start_at": s}),
            ),
            (format!("/tasks/{}/tell", task.id), json!({"text": s})),
            (
                format!("/tasks/{}/cancel", task.id),
                json!({"reason": s, "extra": s}),
            ),
            (
                "/questions/x/answer".to_owned(),
                json!({"answer": s, "value": s}),
            ),
            (format!("/tasks/{}/nope", task.id), json!({})),
        ] {
            let status = http
                .post(format!("{console}{path}"))
                .json(&body)
                .send()
                .await
                .expect("the console answers")
                .status();
            assert!(!status.is_server_error(), "{status} for {path} {body}");
            sent += 1;
        }
    }
    let listed = http
        .get(format!("{console}/tasks"))
        .send()
        .await
        .expect("the console answers");
    assert!(listed.status().is_success(), "{}", listed.status());

    // 5. gRPC fields.
    for shape in &shapes {
        let requests = [
            api.create_task(pb::CreateTaskRequest {
                owner: shape.clone(),
                goal: shape.clone(),
                request_id: shape.clone(),
                ..Default::default()
            })
            .await
            .err(),
            api.get_task(pb::GetTaskRequest {
                task_id: shape.clone(),
            })
            .await
            .err(),
            api.answer_question(pb::AnswerQuestionRequest {
                question_id: shape.clone(),
                answer: shape.clone(),
                answer_json: shape.clone(),
                ..Default::default()
            })
            .await
            .err(),
            api.watch_tasks(pb::WatchTasksRequest {
                resume_token: shape.clone(),
                owner: shape.clone(),
                ..Default::default()
            })
            .await
            .err(),
        ];
        for status in requests.into_iter().flatten() {
            assert!(
                !matches!(
                    status.code(),
                    tonic::Code::Internal | tonic::Code::Unknown | tonic::Code::Unavailable
                ),
                "{status:?}"
            );
            sent += 1;
        }
    }

    // Every process is still up, nothing panicked, and a whole task still runs through the chat.
    for process in [&mut control, &mut gateway, &mut worker] {
        assert!(
            process.running(),
            "{} exited:\n{}",
            process.name,
            process.output()
        );
        assert!(
            !process.output().contains("panicked"),
            "{} panicked:\n{}",
            process.name,
            process.output()
        );
    }
    bot.drain(Duration::from_millis(200)).await;
    hark_e2e::book_a_room(&mut bot, 5001, 100).await;
    eprintln!("{sent} hostile inputs sent through five doors");

    for process in [&mut worker, &mut gateway, &mut control] {
        process.stop().await;
    }
    env.cleanup().await;
}
