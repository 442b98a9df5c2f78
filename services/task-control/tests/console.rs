//! The web console's routes, over HTTP against a real task-control: who may use it, what a page of
//! another site cannot make it do, reminding a question's owner now, and the event stream that a
//! reconnect continues. (The page itself is driven in a browser by `tests/tests/console.rs`.)

mod common;

use std::time::Duration;

use common::control::{BOT, GROUP, PLATFORM, TestControl};
use hark_proto::v1 as pb;
use serde_json::{Value, json};

const TOKEN: &str = "console-secret-1";
const WAIT: Duration = Duration::from_secs(20);

fn http() -> reqwest::Client {
    hark_core::install_crypto();
    reqwest::Client::new()
}

/// A task in the group whose worker asked `Noodles or rice?`.
async fn ask_in_group(tc: &TestControl) -> pb::Task {
    ask_in_group_as(tc, tonic::Request::new).await
}

/// As [`ask_in_group`], created through `request` (which may add a token).
async fn ask_in_group_as(
    tc: &TestControl,
    request: impl FnOnce(pb::CreateTaskRequest) -> tonic::Request<pb::CreateTaskRequest>,
) -> pb::Task {
    let task = tc
        .client()
        .await
        .create_task(request(pb::CreateTaskRequest {
            owner: format!("{PLATFORM}:100"),
            goal: "lunch".into(),
            chat: Some(pb::ChatRoute {
                platform: PLATFORM.into(),
                bot_id: BOT.into(),
                stream: GROUP.into(),
                ..Default::default()
            }),
            ..Default::default()
        }))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    tc.claim_and_ask("Noodles or rice?", 600).await;
    task
}

/// Reads server-sent events from `response` until `done` says stop; returns them as
/// (id, data).
async fn read_events(
    response: &mut reqwest::Response,
    done: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(&events) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("the next event in time")
            .expect("the stream reads")
            .expect("the stream goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let mut id = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if let Ok(value) = serde_json::from_str(&data) {
                events.push((id, value));
            }
        }
    }
    events
}

#[tokio::test]
async fn the_console_asks_for_a_token_and_serves_its_page_to_anyone() {
    let tc = TestControl::start_with(|c| c.control.api_tokens = vec![TOKEN.into()]).await;
    let base = tc.console.clone().expect("the console listens");
    let client = http();

    let page = client.get(format!("{base}/")).send().await.expect("page");
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .to_owned();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert!(page.text().await.expect("html").contains("/assets/app.js"));
    for asset in ["app.js", "app.css"] {
        let got = client
            .get(format!("{base}/assets/{asset}"))
            .send()
            .await
            .expect("asset");
        assert_eq!(got.status(), 200, "{asset}");
    }
    let missing = client
        .get(format!("{base}/assets/../../etc/passwd"))
        .send()
        .await
        .expect("asset");
    assert_eq!(missing.status(), 404);

    let session: Value = client
        .get(format!("{base}/api/session"))
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("json");
    assert_eq!(session["token_required"], true);
    assert_eq!(session["signed_in"], false);
    assert_eq!(session["language"], "en");

    for (token, status) in [(None, 401), (Some("wrong"), 401), (Some(TOKEN), 200)] {
        let mut request = client.get(format!("{base}/api/tasks"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let got = request.send().await.expect("tasks");
        assert_eq!(got.status(), status, "{token:?}");
    }
    let refused = client
        .post(format!("{base}/api/tasks"))
        .json(&json!({"owner": "qq:1", "goal": "sneak in"}))
        .send()
        .await
        .expect("create");
    assert_eq!(refused.status(), 401);
    let listed: Value = client
        .get(format!("{base}/api/tasks"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("tasks")
        .json()
        .await
        .expect("json");
    assert_eq!(
        listed["tasks"],
        json!([]),
        "the refused create made nothing"
    );
    tc.stop().await;
}

#[tokio::test]
async fn without_tokens_only_loopback_names_and_json_writes_are_taken() {
    let tc = TestControl::start().await;
    let base = tc.console.clone().expect("the console listens");
    let client = http();
    let task = ask_in_group(&tc).await;

    // Another site's page, reaching 127.0.0.1 through a name of its own (DNS rebinding).
    let rebound = client
        .get(format!("{base}/api/questions"))
        .header("host", "evil.example:8081")
        .send()
        .await
        .expect("questions");
    assert_eq!(rebound.status(), 421);
    // A form post from another page (no preflight) is not JSON, and is refused.
    let form = client
        .post(format!("{base}/api/tasks/{}/cancel", task.id))
        .header("content-type", "text/plain")
        .body(r#"{"reason":"csrf"}"#)
        .send()
        .await
        .expect("cancel");
    assert_eq!(form.status(), 415);
    let still: Value = client
        .get(format!("{base}/api/tasks/{}", task.id))
        .send()
        .await
        .expect("task")
        .json()
        .await
        .expect("json");
    assert_eq!(still["task"]["state"], "waiting_input");
    // A page that has the task's rounds asks only for those after its last one.
    let rounds = still["rounds"].as_array().expect("rounds");
    let last = rounds.last().expect("the ask's round")["round"]
        .as_i64()
        .expect("number");
    let after = |round: String| {
        client
            .get(format!("{base}/api/tasks/{}?after_round={round}", task.id))
            .send()
    };
    let newer: Value = after(last.to_string())
        .await
        .expect("task")
        .json()
        .await
        .expect("json");
    assert_eq!(newer["rounds"], json!([]), "{newer}");
    assert_eq!(newer["task"]["state"], "waiting_input");
    let from_before: Value = after((last - 1).to_string())
        .await
        .expect("task")
        .json()
        .await
        .expect("json");
    assert_eq!(
        from_before["rounds"],
        json!([rounds.last()]),
        "{from_before}"
    );
    let garbled = after("seven".into()).await.expect("task");
    assert_eq!(garbled.status(), 400);
    let said: Value = garbled.json().await.expect("json");
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|e| e.contains("after_round")),
        "{said}"
    );

    // Bad input says what is wrong and changes nothing.
    let bad = client
        .get(format!("{base}/api/tasks?state=sleeping"))
        .send()
        .await
        .expect("tasks");
    assert_eq!(bad.status(), 400);
    let said: Value = bad.json().await.expect("json");
    assert!(
        said["error"].as_str().is_some_and(|e| e.contains("state")),
        "{said}"
    );
    let garbled = client
        .post(format!("{base}/api/tasks"))
        .header("content-type", "application/json")
        .body(r#"{"owner": "qq:1", "goal": 3}"#)
        .send()
        .await
        .expect("create");
    assert_eq!(garbled.status(), 400);
    let said: Value = garbled.json().await.expect("json");
    assert!(
        said["error"].as_str().is_some_and(|e| e.contains("goal")),
        "{said}"
    );
    let unknown = client
        .post(format!("{base}/api/tasks/{}/explode", task.id))
        .json(&json!({}))
        .send()
        .await
        .expect("act");
    assert_eq!(unknown.status(), 404);
    let empty = client
        .post(format!(
            "{base}/api/questions/{}/answer",
            still["task"]["open_question"]["id"].as_str().expect("open")
        ))
        .json(&json!({"answer": "  "}))
        .send()
        .await
        .expect("answer");
    assert_eq!(empty.status(), 400);
    let said: Value = empty.json().await.expect("json");
    assert!(
        said["error"].as_str().is_some_and(|e| e.contains("answer")),
        "{said}"
    );
    tc.stop().await;
}

#[tokio::test]
async fn remind_now_reaches_the_chat_and_the_event_stream_goes_on_after_a_reconnect() {
    let tc = TestControl::start().await;
    let base = tc.console.clone().expect("the console listens");
    let client = http();

    let mut stream = client
        .get(format!("{base}/api/events"))
        .send()
        .await
        .expect("events");
    assert_eq!(stream.status(), 200);
    let task = ask_in_group(&tc).await;
    let asked = tc.next_out().await;
    assert!(asked.text.contains("Noodles or rice?"), "{}", asked.text);

    let inbox: Value = client
        .get(format!("{base}/api/questions"))
        .send()
        .await
        .expect("questions")
        .json()
        .await
        .expect("json");
    let question = inbox["questions"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["task_id"] == task.id.as_str()))
        .expect("the question is in the inbox")
        .clone();
    assert_eq!(question["kind"], "text");
    let id = question["id"].as_str().expect("id");

    let reminded = client
        .post(format!("{base}/api/questions/{id}/remind"))
        .json(&json!({}))
        .send()
        .await
        .expect("remind");
    assert_eq!(reminded.status(), 200);
    let reminder = tc.next_out().await;
    assert!(
        reminder.text.contains("still waiting for your answer")
            && reminder.text.contains("Noodles or rice?"),
        "{}",
        reminder.text
    );
    let shown: Value = reminded.json().await.expect("json");
    assert!(shown["question"]["reminded_at"].is_number(), "{shown}");
    // Again at once: throttled, and nothing more goes to the chat. Without a JSON body: refused
    // before anything is done.
    let again = client
        .post(format!("{base}/api/questions/{id}/remind"))
        .json(&json!({}))
        .send()
        .await
        .expect("remind again");
    assert_eq!(again.status(), 429);
    let said: Value = again.json().await.expect("json");
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|e| e.contains("less than 60s ago")),
        "{said}"
    );
    let bare = client
        .post(format!("{base}/api/questions/{id}/remind"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .expect("remind as text");
    assert_eq!(bare.status(), 415);

    let answered = client
        .post(format!("{base}/api/questions/{id}/answer"))
        .json(&json!({"answer": "rice"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(answered.status(), 200);
    let lease = tc.claim_next(&task.id).await;
    tc.complete(lease, "Rice it is.").await;
    let events = read_events(&mut stream, |e| {
        e.iter()
            .any(|(_, v)| v["task_id"] == task.id.as_str() && v["state"] == "completed")
    })
    .await;
    let ours: Vec<&(String, Value)> = events
        .iter()
        .filter(|(_, v)| v["task_id"] == task.id.as_str())
        .collect();
    let waiting = ours
        .iter()
        .find(|(_, v)| v["state"] == "waiting_input")
        .expect("the question's event");
    assert_eq!(waiting.1["question"]["text"], "Noodles or rice?");
    let done = &ours.last().expect("events").1;
    assert_eq!(done["result"], "Rice it is.");
    // A reminder to a closed question is refused, saying why.
    let late = client
        .post(format!("{base}/api/questions/{id}/remind"))
        .json(&json!({}))
        .send()
        .await
        .expect("remind");
    assert_eq!(late.status(), 409);
    drop(stream);

    // Reconnecting with the id of the question's event replays what came after it.
    let mut again = client
        .get(format!("{base}/api/events"))
        .header("last-event-id", &waiting.0)
        .send()
        .await
        .expect("events");
    assert_eq!(again.status(), 200);
    let replayed = read_events(&mut again, |e| {
        e.iter()
            .any(|(_, v)| v["task_id"] == task.id.as_str() && v["state"] == "completed")
    })
    .await;
    assert!(
        replayed.iter().all(|(id, _)| id != &waiting.0),
        "the stream goes on after the token, not from it"
    );
    let bogus = client
        .get(format!("{base}/api/events"))
        .header("last-event-id", "not-a-token")
        .send()
        .await
        .expect("events");
    assert_eq!(bogus.status(), 400);
    tc.stop().await;
}

#[tokio::test]
async fn a_question_is_passed_on_from_the_console_and_asked_of_the_new_person() {
    let tc = TestControl::start().await;
    let base = tc.console.clone().expect("the console listens");
    let client = http();
    let task = ask_in_group(&tc).await;
    tc.out_containing("Noodles or rice?").await;
    let question = tc
        .store
        .open_question_of(task.id.parse().expect("id"))
        .await
        .expect("read")
        .expect("open");
    let url = format!("{base}/api/questions/{}/delegate", question.id);

    let nobody = client
        .post(&url)
        .json(&json!({"to": "nobody"}))
        .send()
        .await
        .expect("refused");
    assert_eq!(nobody.status(), 400);
    let said: Value = nobody.json().await.expect("json");
    assert!(
        said["error"].as_str().is_some_and(|e| e.starts_with("to:")),
        "{said}"
    );

    let moved = client
        .post(&url)
        .json(&json!({"to": format!("{PLATFORM}:200")}))
        .send()
        .await
        .expect("passed on");
    assert_eq!(moved.status(), 200);
    let shown: Value = moved.json().await.expect("json");
    assert_eq!(shown["question"]["owner"], format!("{PLATFORM}:200"));
    let asked = tc.out_containing("passed on to you by console").await;
    assert!(asked.text.contains("Noodles or rice?"), "{}", asked.text);
    assert_eq!(asked.mentions, ["200"]);
    let audit = tc
        .store
        .transitions_of(question.task_id)
        .await
        .expect("audit");
    assert!(
        audit
            .iter()
            .any(|t| t.event == "delegate" && t.actor == "console"),
        "{audit:?}"
    );
    tc.stop().await;
}

#[tokio::test]
async fn with_a_persons_key_the_console_is_that_persons_own_inbox() {
    let tc = TestControl::start_with(|c| c.control.api_tokens = vec![TOKEN.into()]).await;
    let base = tc.console.clone().expect("the console listens");
    let client = http();
    let mut api = tc.client().await;
    let hers = ask_in_group_as(&tc, operator).await;
    let bobs = api
        .create_task(operator(pb::CreateTaskRequest {
            owner: format!("{PLATFORM}:200"),
            goal: "bob's".into(),
            ..Default::default()
        }))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let key = api
        .create_key(operator(pb::CreateKeyRequest {
            owner: format!("{PLATFORM}:100"),
            name: "browser".into(),
            ..Default::default()
        }))
        .await
        .expect("made")
        .into_inner()
        .secret;

    let session: Value = client
        .get(format!("{base}/api/session"))
        .bearer_auth(&key)
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("json");
    assert_eq!(session["signed_in"], true);
    assert_eq!(session["as"], format!("{PLATFORM}:100"));
    let get = |path: String| client.get(format!("{base}{path}")).bearer_auth(&key).send();
    let listed: Value = get("/api/tasks".into())
        .await
        .expect("tasks")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, [hers.id.as_str()]);
    let other = get(format!("/api/tasks?owner={PLATFORM}:200"))
        .await
        .expect("tasks");
    assert_eq!(other.status(), 403);
    let detail = get(format!("/api/tasks/{}", bobs.id)).await.expect("task");
    assert_eq!(detail.status(), 403);
    let cancel = client
        .post(format!("{base}/api/tasks/{}/cancel", bobs.id))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status(), 403);
    let still = api
        .get_task(operator(pb::GetTaskRequest {
            task_id: bobs.id.clone(),
        }))
        .await
        .expect("read")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(still.state, pb::TaskState::Pending as i32);
    let playground = client
        .post(format!("{base}/api/playground/messages"))
        .bearer_auth(&key)
        .json(&json!({"user": "200", "text": "hello"}))
        .send()
        .await
        .expect("playground");
    assert_eq!(playground.status(), 403);

    // Her inbox holds her question, and she answers it there.
    let inbox: Value = get("/api/questions".into())
        .await
        .expect("questions")
        .json()
        .await
        .expect("json");
    let questions = inbox["questions"].as_array().expect("questions");
    assert_eq!(questions.len(), 1, "{inbox}");
    let id = questions[0]["id"].as_str().expect("id");
    let answered = client
        .post(format!("{base}/api/questions/{id}/answer"))
        .bearer_auth(&key)
        .json(&json!({"answer": "rice"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.expect("json");
    assert_eq!(answered["question"]["answerer"], format!("{PLATFORM}:100"));

    let wrong = client
        .get(format!("{base}/api/tasks"))
        .bearer_auth(format!("hk_{}", "1".repeat(64)))
        .send()
        .await
        .expect("tasks");
    assert_eq!(wrong.status(), 401);
    tc.stop().await;
}

/// `message` as a request with the operator's token.
fn operator<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().expect("header"),
    );
    request
}

#[tokio::test]
async fn the_inbox_comes_in_pages_oldest_first_each_a_range_of_the_open_questions() {
    let tc = TestControl::start().await;
    let base = tc.console.clone().expect("the console listens");
    let mut api = tc.client().await;
    let mut asked = Vec::new();
    for i in 0..5 {
        // A questionnaire waits on its first question from its creation on.
        let task = api
            .create_task(pb::CreateTaskRequest {
                owner: "api:pat".into(),
                questionnaire: vec![pb::FormQuestion {
                    key: "q".into(),
                    text: format!("Question {i}?"),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .expect("created")
            .into_inner()
            .task
            .expect("task");
        assert_eq!(task.state, pb::TaskState::WaitingInput as i32);
        asked.push(format!("Question {i}?"));
    }
    let client = http();
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page: Value = client
            .get(format!(
                "{base}/api/questions?owner=api:pat&page_size=2&page_token={token}"
            ))
            .send()
            .await
            .expect("a page")
            .json()
            .await
            .expect("json");
        let questions = page["questions"].as_array().expect("questions");
        assert!(questions.len() <= 2, "{page}");
        seen.extend(
            questions
                .iter()
                .map(|q| q["text"].as_str().unwrap_or_default().to_owned()),
        );
        pages += 1;
        token = page["next_page_token"]
            .as_str()
            .expect("a token")
            .to_owned();
        if token.is_empty() {
            break;
        }
        assert!(pages < 5, "the pages end");
    }
    assert_eq!(seen, asked, "every question once, oldest first");
    assert_eq!(pages, 3);
    tc.stop().await;
}
