//! Tasks, questions and answers as the store tests make them.

use std::time::Duration;

use super::Cases as _;

use hark_control::store::{Answer, AskInput, ChatRoute, NewTask, Store, TaskRow};
use hark_core::{
    codec,
    domain::{DeadlinePolicy, Owner, QuestionId, TimeoutPolicy},
};
use hark_proto::v1 as pb;
use serde_json::json;

/// The lease the tests claim under.
pub const LEASE: Duration = Duration::from_secs(30);

pub fn owner() -> Owner {
    "qq:10001".parse().expect("owner")
}

pub fn group_chat() -> ChatRoute {
    ChatRoute {
        platform: "qq".into(),
        bot_id: "42".into(),
        stream: "group:777".into(),
        origin_message_id: Some("m-1".into()),
    }
}

/// The task "plan a trip" of [`owner`] in `chat`, with the defaults.
pub fn new_task_spec(chat: Option<ChatRoute>) -> NewTask {
    NewTask {
        owner: owner(),
        goal: "plan a trip".into(),
        chat,
        ask_timeout: Duration::from_secs(600),
        on_timeout: TimeoutPolicy::Resume,
        request_id: None,
        active_limit: 0,
        questionnaire: None,
        schedule: None,
        priority: 0,
        deadline: None,
        on_deadline: DeadlinePolicy::Fail,
        asked_by: None,
        key_id: None,
    }
}

pub async fn new_task(store: &Store, chat: Option<ChatRoute>) -> TaskRow {
    store
        .create_task(&new_task_spec(chat))
        .await
        .expect("task created")
}

/// Creates a task in [`group_chat`], claims it and makes it ask; returns the task and the
/// question id.
pub async fn waiting_task(store: &Store) -> (TaskRow, QuestionId) {
    waiting_task_in(store, Some(group_chat())).await
}

/// [`waiting_task`] in `chat`, or, with `None`, without a chat (as over the API).
pub async fn waiting_task_in(store: &Store, chat: Option<ChatRoute>) -> (TaskRow, QuestionId) {
    let task = new_task(store, chat).await;
    let claimed = store
        .claim(task.id, task.generation, "w1", LEASE)
        .await
        .expect("claim wins");
    let question = store
        .ask(&claimed.lease, &ask_input(1, "call-1"))
        .await
        .expect("ask succeeds");
    (store.get_task(task.id).await.expect("task"), question.id)
}

pub fn ask_input(round: i32, call: &str) -> AskInput {
    AskInput {
        round,
        messages: json!([{"role": "assistant", "content": null, "tool_calls": [{"id": call, "type": "function",
            "function": {"name": "ask_user", "arguments": "{\"question\":\"Which city?\"}"}}],
            "reasoning_content": "provider extra kept as is"}]),
        consumed_instructions: vec![],
        tool_call_id: call.into(),
        question: "Which city?".into(),
        context: "for the weather".into(),
        timeout: None,
        shape: hark_core::domain::shape::Shape::Text,
        waits_for: None,
        escalation: Default::default(),
        ask_to: Vec::new(),
        need: Default::default(),
    }
}

pub fn answer(text: &str, key: &str) -> Answer {
    Answer {
        answerer: "qq:10001".into(),
        text: text.into(),
        json: None,
        inbound_key: Some(key.into()),
    }
}

/// Every run job in the outbox, as (task id, generation, reason).
pub async fn run_jobs(store: &Store) -> Vec<(String, u64, i32)> {
    store
        .outbox_batch(10_000)
        .await
        .expect("outbox")
        .into_iter()
        .filter(|e| e.subject == store.names().task_run())
        .map(|e| {
            let job: pb::RunJob = codec::decode(&e.payload).expect("run job decodes");
            (job.task_id, job.generation, job.reason)
        })
        .collect()
}
