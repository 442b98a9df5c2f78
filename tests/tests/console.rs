//! The web console in a real browser: Debian's chromium driven by playwright-core (installed by
//! `.ci/run` with `npm ci --prefix tests/console`), against hark in processes with the scripted
//! model. The browser signs in, sees a question arrive live, answers it by its choice, sees the
//! task complete with its timeline, and plays a chat user in the playground, through the
//! gateway's HTTP adapter. Screenshots are kept in `target/test-artifacts/console/`.

use std::{path::PathBuf, process::Stdio};

use hark_e2e::Env;
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::{Value, json};

const TOKEN: &str = "console-token-7f3a";

fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().expect("metadata"),
    );
    request
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn a_person_answers_in_the_console_and_plays_in_the_playground() {
    let driver = manifest_dir().join("console/node_modules/playwright-core");
    assert!(
        driver.exists(),
        "{} is missing: run `npm ci --prefix tests/console` (as .ci/run does)",
        driver.display()
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium (as .ci/run does)"
    );

    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            json!({"question": "Pick a colour", "choices": ["red", "green", "blue"]}),
        ),
        Step::say("You chose {answer}"),
    ]))
    .await
    .expect("scripted LLM");
    llm.set_script(
        "pg",
        Script::new(vec![
            Step::ask("What is your name?"),
            Step::say("Hello {answer}"),
        ]),
    );
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_CONTROL__API_TOKENS", TOKEN);
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", "web");
    env.set("HARK_GATEWAY__HTTP__BOTS", "web:playground");
    // The chat speaks Chinese; the console follows each reader's browser instead.
    env.set("HARK_CHAT__LANGUAGE", "zh");
    // The gateway first: the console's playground reaches it at gateway.listen.
    let mut gateway = env.spawn(&["gateway"], &[]);
    env.gateway_port().await;
    let mut control = env.spawn(&["control"], &[]);
    let mut client = env.client().await;
    let console_port = control.addr("control.http_listen").await.port();
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    // Before any page listens: a question whose chat message waits for the playground's bot.
    // The browser's driver reports it undeliverable, as an app would, while the inbox is open.
    let lost_task = a_question_for_nobody(&client).await;
    let gateway_url = format!("http://127.0.0.1:{}", env.gateway_port().await);

    let shots = manifest_dir().join("../target/test-artifacts/console");
    let _ = std::fs::remove_dir_all(&shots);
    let driven = tokio::process::Command::new(hark_testkit::node())
        .arg(manifest_dir().join("console/drive.mjs"))
        .env("CONSOLE_URL", format!("http://127.0.0.1:{console_port}/"))
        .env("CONSOLE_TOKEN", TOKEN)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &chromium)
        .env("UNDELIVERED_TASK", &lost_task)
        .env("GATEWAY_URL", &gateway_url)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&driven.stdout);
    let stderr = String::from_utf8_lossy(&driven.stderr);
    assert!(
        driven.status.success(),
        "the browser did not get through (screenshots in {}):\n{stderr}\n{stdout}\n{}\n{}",
        shots.display(),
        control.output(),
        gateway.output(),
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .expect("the driver's JSON line");

    assert_eq!(seen["wrong_token_refused"], true);
    assert_eq!(seen["question_text"], "Pick a colour");
    // The question nobody saw is in the inbox too. Once the app reported that it can never send
    // it, the open inbox said why, at once, in English; and in Chinese too.
    assert_eq!(seen["badge"], "2");
    assert_eq!(seen["set_aside"], true, "{seen}");
    assert_eq!(seen["delivered_before"], 0, "{seen}");
    let lost_reason = undelivered_of(&client, &lost_task).await;
    assert_eq!(
        lost_reason,
        "web:playground could not send it (attempt 1): private:lost is gone"
    );
    assert_eq!(
        seen["undelivered"],
        json!(format!("Never reached the chat: {lost_reason}")),
        "{seen}"
    );
    assert_eq!(
        seen["zh_undelivered"],
        json!(format!("没能发到会话：{lost_reason}")),
        "{seen}"
    );
    assert!(
        seen["output"].as_str().is_some_and(|o| o.contains("green")),
        "{seen}"
    );
    assert!(
        seen["answered_line"]
            .as_str()
            .is_some_and(|l| l.contains("Answered by console") && l.contains("green")),
        "{seen}"
    );
    assert!(seen["rounds"].as_u64().is_some_and(|r| r >= 2), "{seen}");
    // The page open while its task waited and was answered there: each round once.
    assert_eq!(seen["live_rounds_waiting"], 1, "{seen}");
    assert_eq!(seen["live_rounds_done"], 2, "{seen}");
    assert!(
        seen["live_output"]
            .as_str()
            .is_some_and(|o| o.contains("blue")),
        "{seen}"
    );
    assert!(
        seen["playground_result"]
            .as_str()
            .is_some_and(|r| r.contains("Hello Ada")),
        "{seen}"
    );
    assert!(seen["page_errors"].is_null(), "{seen}");
    // A first visit speaks the browser's language.
    assert_eq!(seen["browser_zh"]["lang"], "zh-CN", "{seen}");
    assert!(
        seen["browser_zh"]["nav"]
            .as_str()
            .is_some_and(|n| n.contains("任务")),
        "{seen}"
    );
    assert_eq!(seen["browser_en"]["lang"], "en", "{seen}");
    assert!(
        seen["browser_en"]["nav"]
            .as_str()
            .is_some_and(|n| n.contains("Tasks") && !n.contains("任务")),
        "{seen}"
    );
    // The page in Chinese.
    assert_eq!(seen["zh_lang"], "zh-CN", "{seen}");
    assert!(
        seen["zh_nav"]
            .as_str()
            .is_some_and(|n| ["待回答", "任务", "试用", "退出"]
                .iter()
                .all(|w| n.contains(w))),
        "{seen}"
    );
    assert_eq!(seen["zh_state"], "已完成", "{seen}");

    // What the browser saw is what the API says.
    let task = client
        .get_task(authed(pb::GetTaskRequest {
            task_id: seen["task_id"].as_str().expect("task id").into(),
        }))
        .await
        .expect("get task")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(task.state, pb::TaskState::Completed as i32);
    assert!(task.result.contains("green"), "{}", task.result);
    let user = seen["playground_user"].as_str().expect("playground user");
    let played = client
        .list_tasks(authed(pb::ListTasksRequest {
            owner: user.into(),
            ..Default::default()
        }))
        .await
        .expect("list tasks")
        .into_inner()
        .tasks;
    assert_eq!(played.len(), 1, "{user}: {played:?}");
    assert_eq!(played[0].state, pb::TaskState::Completed as i32);
    assert!(
        played[0].result.contains("Hello Ada"),
        "{}",
        played[0].result
    );
    let shots_taken = std::fs::read_dir(&shots).map_or(0, |d| d.count());
    assert!(
        shots_taken >= 8,
        "{shots_taken} screenshots in {}",
        shots.display()
    );

    worker.stop().await;
    gateway.stop().await;
    control.stop().await;
    drop(llm);
    env.cleanup().await;
}

/// A task in a chat of the playground's bot that waits on its question, whose chat message
/// nobody has pulled yet: its id.
async fn a_question_for_nobody(
    client: &pb::task_service_client::TaskServiceClient<tonic::transport::Channel>,
) -> String {
    let task = client
        .clone()
        .create_task(authed(pb::CreateTaskRequest {
            owner: "web:lost".into(),
            goal: "choose a colour where nobody reads".into(),
            chat: Some(pb::ChatRoute {
                platform: "web".into(),
                bot_id: "playground".into(),
                stream: "private:lost".into(),
                origin_message_id: String::new(),
            }),
            ..Default::default()
        }))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    hark_e2e::eventually("the task asks", std::time::Duration::from_secs(60), || {
        let (mut client, id) = (client.clone(), task.id.clone());
        async move {
            let task = client
                .get_task(authed(pb::GetTaskRequest { task_id: id }))
                .await
                .ok()?
                .into_inner()
                .task?;
            (task.state == pb::TaskState::WaitingInput as i32).then_some(())
        }
    })
    .await;
    task.id
}

/// Why `task`'s question says it was never delivered.
async fn undelivered_of(
    client: &pb::task_service_client::TaskServiceClient<tonic::transport::Channel>,
    task: &str,
) -> String {
    client
        .clone()
        .get_task(authed(pb::GetTaskRequest {
            task_id: task.into(),
        }))
        .await
        .expect("get task")
        .into_inner()
        .questions
        .into_iter()
        .map(|q| q.undelivered)
        .find(|u| !u.is_empty())
        .unwrap_or_default()
}

/// A page of the playground, reading what hark says in its user's chat.
struct Page {
    response: reqwest::Response,
    pending: String,
}

impl Page {
    async fn open(http: &reqwest::Client, base: &str, user: &str) -> Self {
        let response = http
            .get(format!("{base}/api/playground/stream?user={user}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("the console answers");
        assert_eq!(response.status(), 200, "the page listens");
        Self {
            response,
            pending: String::new(),
        }
    }

    /// The next message hark says to the page.
    async fn next(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return serde_json::from_str(data).expect("a message as JSON");
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .expect("hark says something within a minute")
                .expect("the stream stays open")
                .expect("the stream stays open");
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// The page showed `message`: hark hands it out no more.
async fn acknowledge(http: &reqwest::Client, base: &str, message: &Value) {
    let acked: Value = http
        .post(format!("{base}/api/playground/ack"))
        .bearer_auth(TOKEN)
        .json(&json!({"acks": [message["ack"]]}))
        .send()
        .await
        .expect("the console answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(acked["acks"][0]["acked"], true, "{acked}");
}

/// What `user` says in the playground; the id the console gave the message.
async fn say(http: &reqwest::Client, base: &str, user: &str, text: &str) -> String {
    let said: Value = http
        .post(format!("{base}/api/playground/messages"))
        .bearer_auth(TOKEN)
        .json(&json!({"user": user, "text": text}))
        .send()
        .await
        .expect("the console answers")
        .json()
        .await
        .expect("JSON");
    said["message_id"]
        .as_str()
        .unwrap_or_else(|| panic!("said: {said}"))
        .to_owned()
}

/// What hark says in a user's chat waits for their page, as a plugin's outbound does: said while
/// no page of theirs listened (while another user's page did, for as long as it did), it comes
/// when theirs opens; a
/// page that closed before it acknowledged a message leaves it to the next page; one
/// acknowledged does not come again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_gets_what_hark_said_while_its_page_was_away_and_only_once() {
    let mut env = Env::new().await;
    env.set("HARK_CONTROL__API_TOKENS", TOKEN);
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", "web");
    env.set("HARK_GATEWAY__HTTP__BOTS", "web:playground");
    // A message handed out and not acknowledged comes back soon.
    env.set("HARK_GATEWAY__SEND_TIMEOUT", "2s");
    let mut gateway = env.spawn(&["gateway"], &[]);
    env.gateway_port().await;
    let mut control = env.spawn(&["control"], &[]);
    env.client().await;
    let base = format!("http://{}", control.addr("control.http_listen").await);
    hark_core::install_crypto();
    let http = reqwest::Client::new();

    // Ann's page listens; Bob's does not. Each lists their tasks.
    let mut ann = Page::open(&http, &base, "ann").await;
    let bobs = say(&http, &base, "bob", "/task list").await;
    let anns = say(&http, &base, "ann", "/task list").await;
    let got = ann.next().await;
    assert_eq!(got["reply_to_message_id"], anns, "{got}");
    assert_eq!(got["stream"], "private:ann", "{got}");
    acknowledge(&http, &base, &got).await;

    // Meanwhile Ann's console puts Bob's reply off, again and again: more often than a message
    // may be handed out unsent, and it is not set aside for that. (A copy of it goes to the end
    // of the stream once it was handed out as often as a message may be.)
    let chat_out = env
        .js
        .get_stream(env.names.chat_out_stream())
        .await
        .expect("the outbound stream");
    let subject = env.names.chat_out("web", "playground").expect("subject");
    let held = hark_e2e::eventually(
        "Bob's reply put off more times than a message may be handed out unsent",
        std::time::Duration::from_secs(120),
        || {
            let (chat_out, subject) = (chat_out.clone(), subject.clone());
            async move {
                let last = chat_out
                    .get_last_raw_message_by_subject(&subject)
                    .await
                    .ok()?;
                let id = last.headers.get("Nats-Msg-Id")?.as_str().to_owned();
                id.starts_with("held:").then_some(last)
            }
        },
    )
    .await;
    let copy: pb::OutboundMessage = hark_core::codec::decode(&held.payload).expect("a message");
    assert_eq!(
        copy.route.expect("its route").stream,
        "private:bob",
        "the copy is Bob's reply"
    );
    let dead = env
        .js
        .get_stream(env.names.dead_letter_stream())
        .await
        .expect("the dead-letter stream")
        .info()
        .await
        .expect("its state")
        .state
        .messages;
    assert_eq!(dead, 0, "nothing was set aside");

    // Bob's page opens later and gets his reply, but closes before it acknowledges it.
    let mut bob = Page::open(&http, &base, "bob").await;
    let unshown = bob.next().await;
    assert_eq!(unshown["reply_to_message_id"], bobs, "{unshown}");
    assert_eq!(unshown["stream"], "private:bob", "{unshown}");
    drop(bob);
    // His next page gets it again, and acknowledges it.
    let mut bob = Page::open(&http, &base, "bob").await;
    let again = bob.next().await;
    assert_eq!(again["id"], unshown["id"], "{again}");
    acknowledge(&http, &base, &again).await;
    drop(bob);

    // Then only what is new comes.
    let list = say(&http, &base, "bob", "/task list").await;
    let mut bob = Page::open(&http, &base, "bob").await;
    let got = bob.next().await;
    assert_eq!(got["reply_to_message_id"], list, "{got}");
    drop(bob);
    drop(ann);

    gateway.stop().await;
    control.stop().await;
    env.cleanup().await;
}
