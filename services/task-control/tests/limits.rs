//! What one person can make hark do: how many tasks, how many commands, how much of their input
//! comes back, and what they can learn of other people's tasks.

mod common;

use common::Cases as _;
use common::control::{GROUP, TestControl};
use hark_core::domain::TaskState;
use hark_proto::v1 as pb;
use tonic::Code;

/// Reads outbound messages until one contains `needle`; returns those before it.
async fn until(tc: &TestControl, needle: &str) -> Vec<pb::OutboundMessage> {
    let mut before = Vec::new();
    for _ in 0..500 {
        let out = tc.next_out().await;
        if out.text.contains(needle) {
            return before;
        }
        before.push(out);
    }
    panic!("no outbound message contained {needle:?}");
}

#[tokio::test]
async fn an_owner_at_the_active_limit_is_refused_in_chat_and_over_grpc_until_one_ends() {
    let tc = TestControl::start_with(|c| c.task.max_active_per_owner = 2).await;
    let first = tc.new_task_in_chat(GROUP, "100", "one").await;
    tc.new_task_in_chat(GROUP, "100", "two").await;

    tc.say(GROUP, "100", "/task new three").await;
    let refused = tc.out_containing("No new task").await;
    assert!(
        refused.text.contains("you have 2 tasks"),
        "{}",
        refused.text
    );
    assert!(
        refused.text.contains("task.max_active_per_owner"),
        "{}",
        refused.text
    );
    let owner = "qq:100".parse().expect("owner");
    assert_eq!(tc.store.active_tasks_of(&owner).await.expect("count"), 2);

    // The same limit holds for the same owner over gRPC, with its own status code.
    let mut api = tc.client().await;
    let err = api
        .create_task(pb::CreateTaskRequest {
            owner: "qq:100".into(),
            goal: "four".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(err.message().contains("task.max_active_per_owner"));
    // Someone else is not limited by it.
    api.create_task(pb::CreateTaskRequest {
        owner: "qq:200".into(),
        goal: "mine".into(),
        ..Default::default()
    })
    .await
    .expect("another owner creates");

    // Once one of the two ends, there is room again.
    tc.store
        .cancel(first.parse().expect("id"), "qq:100", "done with it")
        .await
        .expect("cancelled");
    tc.say(GROUP, "100", "/task new three again").await;
    tc.out_containing("created: three again").await;
    assert_eq!(tc.store.active_tasks_of(&owner).await.expect("count"), 2);
    tc.stop().await;
}

#[tokio::test]
async fn tasks_created_together_count_against_the_limit_each() {
    let tc = TestControl::start_with(|c| c.task.max_active_per_owner = 3).await;
    let mut api = tc.client().await;
    let mut calls = Vec::new();
    for n in 0..20 {
        let mut api = api.clone();
        calls.push(tokio::spawn(async move {
            api.create_task(pb::CreateTaskRequest {
                owner: "api:runaway".into(),
                goal: format!("task {n}"),
                ..Default::default()
            })
            .await
        }));
    }
    let mut created = 0;
    for call in calls {
        match call.await.expect("joined") {
            Ok(_) => created += 1,
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted),
        }
    }
    assert_eq!(created, 3);
    let listed = api
        .list_tasks(pb::ListTasksRequest {
            owner: "api:runaway".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 3);
    tc.stop().await;
}

#[tokio::test]
async fn a_flood_of_commands_gets_the_allowed_replies_and_one_short_notice() {
    let tc = TestControl::start_with(|c| c.chat.commands_per_minute = 5).await;
    for _ in 0..40 {
        tc.say(GROUP, "100", "/task list").await;
    }
    // Messages are handled in order, so another sender's command answered afterwards marks the
    // end of the flood's replies.
    tc.say(GROUP, "300", "/task help").await;
    let before = until(&tc, "just reply here").await;
    let lists = before.iter().filter(|m| m.text == "No tasks.").count();
    let notices: Vec<&pb::OutboundMessage> = before
        .iter()
        .filter(|m| m.text.contains("chat.commands_per_minute"))
        .collect();
    assert_eq!(lists, 5, "{before:?}");
    assert_eq!(notices.len(), 1, "{before:?}");
    assert!(notices[0].text.chars().count() < 200);
    assert_eq!(before.len(), 6, "nothing else was sent");
    tc.stop().await;
}

#[tokio::test]
async fn a_prefix_is_resolved_only_among_the_tasks_the_sender_may_see() {
    let tc = TestControl::start().await;
    // Two tasks of one owner whose ids share a prefix, and one of someone else's.
    for (id, owner) in [
        ("abcd0000-0000-4000-8000-000000000001", "qq:100"),
        ("abcd0000-0000-4000-8000-000000000002", "qq:100"),
        ("abce0000-0000-4000-8000-000000000003", "qq:100"),
    ] {
        sqlx::query(
            "INSERT INTO tasks (id, owner, goal, state, on_timeout, ask_timeout_s)
             VALUES ($1::uuid, $2, 'private plans', 'pending', 'resume', 600)",
        )
        .bind(id)
        .bind(owner)
        .execute(tc.store.pool())
        .await
        .expect("inserted");
    }
    // A stranger learns nothing: neither that two tasks match nor that one does.
    tc.say(GROUP, "666", "/task status abcd").await;
    let reply = tc.next_out().await;
    assert_eq!(reply.text, "You have no task abcd.");
    tc.say(GROUP, "666", "/task status abce").await;
    assert_eq!(tc.next_out().await.text, "You have no task abce.");
    // The owner is told the prefix is ambiguous among their own tasks, and a longer one works.
    tc.say(GROUP, "100", "/task status abcd").await;
    let reply = tc.next_out().await;
    assert!(reply.text.contains("matches 2"), "{}", reply.text);
    tc.say(GROUP, "100", "/task status abce").await;
    let reply = tc.next_out().await;
    assert!(reply.text.contains("private plans"), "{}", reply.text);
    // An admin sees every task.
    tc.say(GROUP, "1", "/task status abce").await;
    assert!(tc.next_out().await.text.contains("private plans"));
    tc.stop().await;
}

#[tokio::test]
async fn echoes_of_input_are_clipped_and_oversized_input_is_refused_plainly() {
    let tc = TestControl::start().await;
    let flood: String = (0..15_000).map(|i| format!("@{i}")).collect();
    tc.say(GROUP, "100", &format!("/task help{flood}")).await;
    tc.say(GROUP, "100", &format!("/task {flood}")).await;
    let reply = tc.out_containing("unknown command").await;
    assert!(
        reply.text.chars().count() < 200,
        "{} characters",
        reply.text.chars().count()
    );
    tc.say(GROUP, "100", &format!("/task status {flood}")).await;
    let reply = tc.next_out().await;
    assert!(reply.text.chars().count() < 200, "{}", reply.text);

    // A goal past 64 KiB is refused, as over gRPC.
    let huge = "x".repeat(70 * 1024);
    tc.say(GROUP, "100", &format!("/task new {huge}")).await;
    let reply = tc.out_containing("no task was created").await;
    assert!(reply.text.contains("longer than"), "{}", reply.text);
    let owner = "qq:100".parse().expect("owner");
    assert_eq!(tc.store.active_tasks_of(&owner).await.expect("count"), 0);

    // An answer past 64 KiB is refused, and the question stays open for a shorter one.
    let id = tc.new_task_in_chat(GROUP, "100", "ask me").await;
    tc.claim_and_ask("Which one?", 0).await;
    tc.out_containing("Which one?").await;
    tc.say(GROUP, "100", &huge).await;
    let reply = tc.out_containing("not passed on").await;
    assert!(reply.text.contains("still open"), "{}", reply.text);
    let task = tc
        .store
        .get_task(id.parse().expect("id"))
        .await
        .expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);
    tc.say(GROUP, "100", "the short one").await;
    tc.out_containing("continues").await;
    tc.stop().await;
}
