//! The built-in tools that reach beyond hark: `fetch_url` against a real HTTP server.

mod common;

use std::time::Duration;

use axum::{Router, response::Redirect, routing::get};
use common::Bed;
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// A web server with a page, a large page, and a redirect to a host that is not allowed.
async fn site() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app =
        Router::new()
            .route("/page", get(|| async { "hello from the page" }))
            .route("/big", get(|| async { "x".repeat(10_000) }))
            .route(
                "/away",
                get(move || async move {
                    Redirect::temporary(&format!("http://localhost:{port}/page"))
                }),
            )
            .route("/here", get(|| async { Redirect::temporary("/page") }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn fetch_url_reads_allowed_hosts_only_and_cuts_what_is_long() {
    let base = site().await;
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call("fetch_url", json!({"url": format!("{base}/page")})),
        Step::call("fetch_url", json!({"url": format!("{base}/here")})),
        Step::call("fetch_url", json!({"url": format!("{base}/big")})),
        Step::call("fetch_url", json!({"url": format!("{base}/away")})),
        Step::call("fetch_url", json!({"url": "http://10.0.0.1/"})),
        Step::say("{answers}"),
    ]))
    .await
    .expect("scripted LLM");
    let mut bed = Bed::start(llm, |c| {
        c.tools.fetch_url.enabled = true;
        c.tools.fetch_url.allow = vec!["127.0.0.1".into()];
        // The test site is on loopback: named as a private host on purpose.
        c.tools.fetch_url.allow_private = vec!["127.0.0.1".into()];
        c.tools.fetch_url.max_bytes = 1024;
    })
    .await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "read the page", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    let results: Vec<&str> = result.split('|').collect();
    assert_eq!(results.len(), 5, "{result}");
    assert!(
        results[0].starts_with("HTTP 200") && results[0].ends_with("hello from the page"),
        "{}",
        results[0]
    );
    assert!(
        results[1].ends_with("hello from the page"),
        "a redirect on an allowed host: {}",
        results[1]
    );
    assert!(
        results[2].contains(&"x".repeat(1024))
            && !results[2].contains(&"x".repeat(1025))
            && results[2].contains("read only the first 1024 bytes"),
        "{}",
        results[2]
    );
    assert!(
        results[3].starts_with("error: localhost is not allowed (tools.fetch_url.allow)"),
        "a redirect to a host not allowed: {}",
        results[3]
    );
    assert!(
        results[4].starts_with("error: 10.0.0.1 is not allowed"),
        "{}",
        results[4]
    );
    bed.stop().await;
}

#[tokio::test]
async fn fetch_url_is_off_unless_enabled() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call("fetch_url", json!({"url": "http://127.0.0.1/"})),
        Step::say("{answer}"),
    ]))
    .await
    .expect("scripted LLM");
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "read the page", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(result.contains("there is no tool `fetch_url`"), "{result}");
    bed.stop().await;
}

#[tokio::test]
async fn list_my_tasks_lists_the_owner_s_tasks_only() {
    let llm = ScriptedLlm::with_default(Script::new(vec![Step::ask("Anything else?")]))
        .await
        .expect("scripted LLM");
    llm.set_script(
        "list",
        Script::new(vec![
            Step::call("list_my_tasks", json!({})),
            Step::call(
                "list_my_tasks",
                json!({"states": ["waiting_input"], "limit": 5}),
            ),
            Step::say("{answers}"),
        ]),
    );
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let waiting = bed.create("api:alice", "plan the trip", |_| {}).await;
    bed.wait_state(&waiting, pb::TaskState::WaitingInput, WAIT)
        .await;
    let other = bed.create("api:bob", "bob's secret plan", |_| {}).await;
    bed.wait_state(&other, pb::TaskState::WaitingInput, WAIT)
        .await;

    let id = bed
        .create("api:alice", "[script:list] what am I doing?", |_| {})
        .await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    let (all, waiting_only) = result.split_once('|').expect("two results");
    let all: serde_json::Value = serde_json::from_str(all).expect("JSON");
    let goals: Vec<&str> = all["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["goal"].as_str())
        .collect();
    assert_eq!(goals, ["[script:list] what am I doing?", "plan the trip"]);
    let waiting_only: serde_json::Value = serde_json::from_str(waiting_only).expect("JSON");
    let tasks = waiting_only["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["id"], waiting.as_str());
    assert_eq!(tasks[0]["state"], "waiting_input");
    bed.stop().await;
}

#[tokio::test]
async fn a_task_waits_durably_for_its_subtask_and_reads_how_it_ended() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "create_subtask",
            json!({"goal": "[script:child] count the sheep", "wait": true}),
        ),
        Step::say("{answer}"),
    ]))
    .await
    .expect("scripted LLM");
    llm.set_script("child", Script::new(vec![Step::say("42 sheep")]));
    // The subtask does not answer until released.
    llm.hold("child");
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    // The parent has an hour; its subtask gets no more than what is left of it.
    let id = bed
        .create("api:alice", "plan the farm", |r| {
            r.deadline = Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            });
            r.on_deadline = pb::DeadlinePolicy::Cancel as i32;
        })
        .await;
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let parent = waiting.task.clone().expect("task");
    let question = waiting.task.expect("task").open_question.expect("question");
    assert!(
        question.text.starts_with("waiting for subtask "),
        "{}",
        question.text
    );
    let child = question.text["waiting for subtask ".len()..]
        .split(':')
        .next()
        .expect("an id")
        .to_owned();
    let subtask = bed.task(&child).await.task.expect("the subtask");
    assert_eq!(subtask.owner, "api:alice");
    assert_eq!(subtask.goal, "[script:child] count the sheep");
    let (parent_by, child_by) = (
        parent.deadline.expect("the parent's deadline").seconds,
        subtask.deadline.expect("the subtask's deadline").seconds,
    );
    assert!(
        child_by <= parent_by && child_by > parent_by - 600,
        "{child_by} vs {parent_by}"
    );
    assert_eq!(subtask.on_deadline, pb::DeadlinePolicy::Cancel as i32);

    // Nobody but the subtask answers it.
    let refused = bed
        .client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            task_id: id.clone(),
            answer: "done".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert!(
        refused.message().contains("waits for the subtask"),
        "{}",
        refused.message()
    );

    bed.llm.release("child");
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let ended: serde_json::Value =
        serde_json::from_str(&done.task.expect("task").result).expect("JSON");
    assert_eq!(
        ended,
        json!({"task": child, "state": "completed", "result": "42 sheep"})
    );
    let listed = bed
        .client()
        .await
        .list_tasks(pb::ListTasksRequest {
            owner: "api:alice".into(),
            ..Default::default()
        })
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(listed.tasks.len(), 2, "one subtask, created once");
    bed.stop().await;
}
