//! task-control end to end within one process: the real App on the real Postgres and NATS, with
//! the tests playing the gateway (chat messages in, outbound messages read) and a worker
//! (control requests).

mod common;

use std::time::Duration;

use common::Cases as _;
use common::control::{GROUP, OTHER_GROUP, TestControl};
use hark_core::{
    bus::ControlOp,
    codec,
    domain::{QuestionOutcome, TaskId, TaskState},
};
use hark_proto::v1 as pb;

fn task_id(id: &str) -> TaskId {
    id.parse().expect("task id")
}

#[tokio::test]
async fn a_reply_from_another_member_does_not_wake_the_task_but_the_owners_does() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "find a restaurant").await;
    let (_, handle) = tc.claim_and_ask("Which city?", 0).await;
    let shown = tc.out_containing("Which city?").await;
    assert!(
        shown.text.contains(&format!("#{handle}")),
        "the question shows its handle"
    );
    assert!(!shown.question_id.is_empty());

    tc.say(GROUP, "200", "Berlin!").await;
    let meanwhile = tc.settle(GROUP, "200").await;
    assert!(meanwhile.is_empty(), "{meanwhile:?}");
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(
        task.state,
        TaskState::WaitingInput,
        "another member's message must not answer"
    );

    tc.say(GROUP, "100", "Paris").await;
    let ack = tc.out_containing("continues").await;
    assert!(ack.text.contains(&task_id(&id).short()));
    let job = tc.next_job().await;
    assert_eq!(job.reason, pb::RunReason::ResumeReply as i32);
    let claimed = tc.claim(&job, "w2").await;
    let resume = claimed
        .resume
        .expect("the answer is handed to the next worker");
    assert_eq!(resume.text, "Paris");
    assert_eq!(resume.tool_call_id, "call-1");
    tc.stop().await;
}

#[tokio::test]
async fn a_command_from_the_owner_is_not_taken_as_an_answer() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "write a haiku").await;
    tc.claim_and_ask("About what?", 0).await;
    tc.out_containing("About what?").await;

    tc.say(GROUP, "100", "/task list").await;
    let listing = tc.out_containing(&task_id(&id).short()).await;
    assert!(listing.text.contains("waiting_input"));
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(
        task.state,
        TaskState::WaitingInput,
        "a command must not answer"
    );
    let question = tc
        .store
        .open_question_of(task.id)
        .await
        .expect("query")
        .expect("still open");
    assert_eq!(question.outcome, QuestionOutcome::Open);
    tc.stop().await;
}

#[tokio::test]
async fn answers_route_by_quote_then_by_handle_then_oldest_first() {
    let tc = TestControl::start().await;
    let mut tasks = Vec::new();
    let mut handles = Vec::new();
    let mut carriers = Vec::new();
    for (i, q) in ["First?", "Second?", "Third?"].iter().enumerate() {
        let id = tc
            .new_task_in_chat(GROUP, "100", &format!("task {i}"))
            .await;
        let (_, handle) = tc.claim_and_ask(q, 0).await;
        let shown = tc.out_containing(q).await;
        // The gateway reports the platform message id of the question it delivered.
        let platform_id = format!("bot-msg-{i}");
        let receipt = pb::DeliveryReceipt {
            outbound_id: shown.id.clone(),
            question_id: shown.question_id.clone(),
            platform_message_id: platform_id.clone(),
            ..Default::default()
        };
        hark_core::publish::publish(
            &tc.js,
            hark_core::publish::Outgoing {
                subject: tc.names.chat_receipt(),
                msg_id: &shown.id,
                payload: codec::encode(receipt),
                trace: None,
            },
        )
        .await
        .expect("receipt published");
        tasks.push(task_id(&id));
        handles.push(handle);
        carriers.push(platform_id);
    }
    let questions: Vec<_> = {
        let mut out = Vec::new();
        for t in &tasks {
            out.push(
                tc.store
                    .open_question_of(*t)
                    .await
                    .expect("q")
                    .expect("open"),
            );
        }
        out
    };
    tc.eventually("receipts are recorded", || async {
        tc.store
            .get_question(questions[2].id)
            .await
            .expect("q")
            .chat_message_id
            .is_some()
    })
    .await;

    // (a) Quoting the third question answers it, though it is the newest.
    tc.say_quoting(GROUP, "100", "answer three", &carriers[2])
        .await;
    let ack = tc.out_containing("continues").await;
    assert!(ack.text.contains(&tasks[2].short()));
    assert!(ack.text.contains("2 more questions"), "{}", ack.text);
    let q3 = tc.store.get_question(questions[2].id).await.expect("q");
    assert_eq!(q3.answer.as_deref(), Some("answer three"));

    // (b) A #handle picks the second, and the handle is stripped from the answer.
    tc.say(GROUP, "100", &format!("#{} answer two", handles[1]))
        .await;
    let ack = tc.out_containing("continues").await;
    assert!(ack.text.contains(&tasks[1].short()));
    assert!(ack.text.contains("1 more question"), "{}", ack.text);
    let q2 = tc.store.get_question(questions[1].id).await.expect("q");
    assert_eq!(q2.answer.as_deref(), Some("answer two"));

    // (c) Anything else goes to the oldest open question.
    tc.say(GROUP, "100", "answer one").await;
    let ack = tc.out_containing("continues").await;
    assert!(ack.text.contains(&tasks[0].short()));
    let q1 = tc.store.get_question(questions[0].id).await.expect("q");
    assert_eq!(q1.answer.as_deref(), Some("answer one"));

    // Quoting a question that is closed gets a polite reply, not silence.
    tc.say_quoting(GROUP, "100", "again", &carriers[2]).await;
    let late = tc.out_containing("closed").await;
    assert!(late.text.contains(&format!("#{}", handles[2])));
    tc.stop().await;
}

#[tokio::test]
async fn a_duplicate_inbound_message_is_applied_once() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "count sheep").await;
    tc.claim_and_ask("How many?", 0).await;
    tc.out_containing("How many?").await;
    // The same platform message arrives twice, past the stream's own deduplication.
    let msg = tc.message_id();
    tc.publish_chat(GROUP, "100", "seven", "", &msg, "dup-1")
        .await;
    tc.publish_chat(GROUP, "100", "seven", "", &msg, "dup-2")
        .await;
    tc.out_containing("continues").await;
    let meanwhile = tc.settle(GROUP, "100").await;
    assert!(
        meanwhile.iter().all(|m| !m.text.contains("continues")),
        "the duplicate was not applied again: {meanwhile:?}"
    );
    let job = tc.next_job().await;
    assert_eq!(job.reason, pb::RunReason::ResumeReply as i32);
    assert!(
        tc.try_next_job(Duration::from_millis(500)).await.is_none(),
        "one resume job only"
    );
    let audit = tc.store.transitions_of(task_id(&id)).await.expect("audit");
    assert_eq!(audit.iter().filter(|t| t.event == "answer").count(), 1);
    tc.stop().await;
}

#[tokio::test]
async fn an_expired_question_resumes_the_task_with_a_notice_for_the_model() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "book a table").await;
    tc.claim_and_ask("What time?", 1).await;
    tc.out_containing("What time?").await;
    let note = tc.out_containing("no answer within").await;
    assert!(note.text.contains("goes on"));
    let job = tc.next_job().await;
    assert_eq!(job.reason, pb::RunReason::ResumeTimeout as i32);
    let claimed = tc.claim(&job, "w2").await;
    let resume = claimed.resume.expect("the expiry is handed over");
    assert!(resume.expired);
    assert!(
        resume.text.contains("No answer came within 1s"),
        "{}",
        resume.text
    );
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    assert_eq!(questions[0].outcome, QuestionOutcome::Expired);

    // An answer after the expiry gets a short reply saying the question is closed.
    tc.say(GROUP, "100", &format!("#{} 8pm", questions[0].handle))
        .await;
    let late = tc.out_containing("closed").await;
    assert!(late.text.contains("expired"));
    tc.stop().await;
}

#[tokio::test]
async fn an_expired_question_fails_the_task_under_the_fail_policy() {
    let tc = TestControl::start().await;
    tc.say(
        GROUP,
        "100",
        "/task new --timeout 1s --on-timeout fail call the plumber",
    )
    .await;
    let created = tc.out_containing("created").await;
    let short = created
        .text
        .split_whitespace()
        .nth(1)
        .expect("id")
        .to_owned();
    tc.claim_and_ask("Which plumber?", 0).await;
    tc.out_containing("Which plumber?").await;
    tc.out_containing("failed").await;
    let task = tc
        .store
        .resolve_task(&short.parse().expect("ref"), None)
        .await
        .expect("task");
    assert_eq!(task.state, TaskState::Failed);
    assert!(
        task.error
            .as_deref()
            .unwrap_or("")
            .contains("no answer within 1s")
    );
    assert!(
        tc.try_next_job(Duration::from_millis(500)).await.is_none(),
        "a failed task is not resumed"
    );
    tc.stop().await;
}

#[tokio::test]
async fn a_question_under_the_never_policy_has_no_deadline_and_stays_open() {
    let tc = TestControl::start().await;
    tc.say(GROUP, "100", "/task new --on-timeout never wait for me")
        .await;
    let created = tc.out_containing("created").await;
    let short = created
        .text
        .split_whitespace()
        .nth(1)
        .expect("id")
        .to_owned();
    // The model asks to wait 1 s; the task's policy says never.
    tc.claim_and_ask("Ready?", 1).await;
    let task = tc
        .store
        .resolve_task(&short.parse().expect("ref"), None)
        .await
        .expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);
    let q = tc
        .store
        .open_question_of(task.id)
        .await
        .expect("q")
        .expect("still open");
    assert!(q.deadline.is_none());
    // A sweep of the timers finds nothing to expire, however late it runs.
    assert_eq!(tc.store.expire_due(100).await.expect("sweep"), 0);
    assert!(
        tc.store
            .open_question_of(task.id)
            .await
            .expect("q")
            .is_some()
    );
    tc.stop().await;
}

#[tokio::test]
async fn a_lost_lease_resumes_from_the_checkpoint_and_the_stale_worker_is_refused() {
    let tc = TestControl::start_with(|c| {
        c.task.lease = "1s".parse().expect("duration");
        c.task.max_attempts = 2;
    })
    .await;
    let id = tc.new_task_in_chat(GROUP, "100", "long job").await;
    let job = tc.next_job().await;
    let first = tc.claim(&job, "w1").await;
    let lease = first.lease.expect("lease");
    assert!(tc.checkpoint(&lease, 1).await.refusal.is_none());
    // w1 goes silent: no heartbeat. The lease expires and the task is queued again.
    let job = tc.next_job().await;
    assert_eq!(job.reason, pb::RunReason::Recover as i32);
    let second = tc.claim(&job, "w2").await;
    assert!(second.refusal.is_none());
    assert_eq!(second.rounds.len(), 1, "the checkpoint survives");
    assert_eq!(second.task.expect("spec").attempt, 2);

    let stale = tc.checkpoint(&lease, 2).await;
    let refusal = stale.refusal.expect("the stale worker is refused");
    assert_eq!(refusal.reason, pb::RefusalReason::LeaseLost as i32);
    let hb = tc.heartbeat(&lease).await;
    assert_eq!(
        hb.refusal.expect("refused").reason,
        pb::RefusalReason::LeaseLost as i32
    );

    // w2 goes silent too: with max_attempts = 2 the task fails.
    tc.eventually("the task fails after its last attempt", || async {
        tc.store.get_task(task_id(&id)).await.expect("task").state == TaskState::Failed
    })
    .await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert!(task.error.as_deref().unwrap_or("").contains("max_attempts"));
    tc.stop().await;
}

#[tokio::test]
async fn heartbeats_keep_the_lease_and_hand_over_told_instructions() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "slow research").await;
    let job = tc.next_job().await;
    let lease = tc.claim(&job, "w1").await.lease.expect("lease");
    tc.say(
        GROUP,
        "100",
        &format!("/task tell {} use metric units", task_id(&id).short()),
    )
    .await;
    let told = tc.out_containing("Told task").await;
    assert!(told.text.contains("next round"), "{}", told.text);
    // Each heartbeat moves the lease's end on, and hands over what was told.
    let lease_until = || async {
        tc.store
            .get_task(task_id(&id))
            .await
            .expect("task")
            .lease_until
            .expect("a running task has a lease")
    };
    let mut until = lease_until().await;
    let mut handed = Vec::new();
    for _ in 0..3 {
        let hb = tc.heartbeat(&lease).await;
        assert!(
            hb.refusal.is_none(),
            "heartbeats keep the lease: {:?}",
            hb.refusal
        );
        let renewed = lease_until().await;
        assert!(renewed > until, "the lease was renewed");
        until = renewed;
        handed = hb.instructions;
    }
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].text, "use metric units");
    assert_eq!(
        tc.store.get_task(task_id(&id)).await.expect("task").state,
        TaskState::Running
    );
    tc.stop().await;
}

#[tokio::test]
async fn cancelling_a_waiting_task_closes_its_question_and_tells_the_chat() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "plan a party").await;
    let (lease, _) = tc.claim_and_ask("How many guests?", 0).await;
    tc.out_containing("How many guests?").await;

    // Another member cannot cancel it.
    tc.say(
        GROUP,
        "200",
        &format!("/task cancel {}", task_id(&id).short()),
    )
    .await;
    tc.out_containing("You have no task").await;

    tc.say(
        GROUP,
        "100",
        &format!("/task cancel {}", task_id(&id).short()),
    )
    .await;
    tc.out_containing("cancelled").await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::Cancelled);
    let questions = tc.store.questions_of(task.id).await.expect("questions");
    assert_eq!(questions[0].outcome, QuestionOutcome::Cancelled);

    // A late answer is told the question is closed; the old lease is refused as cancelled.
    tc.say(GROUP, "100", &format!("#{} twelve", questions[0].handle))
        .await;
    tc.out_containing("closed").await;
    let refused = tc.checkpoint(&lease, 2).await.refusal.expect("refused");
    assert_eq!(refused.reason, pb::RefusalReason::Cancelled as i32);
    tc.stop().await;
}

#[tokio::test]
async fn cancelling_a_running_task_tells_its_worker_to_stop_and_refuses_its_next_write() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "count the stars").await;
    let job = tc.next_job().await;
    let lease = tc.claim(&job, "w1").await.lease.expect("lease");
    let mut hints = tc
        .nats
        .subscribe(tc.names.task_cancel(task_id(&id)))
        .await
        .expect("subscribe");
    tc.say(
        GROUP,
        "100",
        &format!("/task cancel {}", task_id(&id).short()),
    )
    .await;
    tc.out_containing("cancelled").await;
    let hint = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::StreamExt::next(&mut hints),
    )
    .await;
    assert!(matches!(hint, Ok(Some(_))), "the worker is told to stop");
    assert_eq!(
        tc.store.get_task(task_id(&id)).await.expect("task").state,
        TaskState::Cancelled
    );
    let refused = tc.checkpoint(&lease, 1).await.refusal.expect("refused");
    assert_eq!(refused.reason, pb::RefusalReason::Cancelled as i32);
    tc.stop().await;
}

#[tokio::test]
async fn a_waiting_task_is_paused_and_resumed_from_the_chat_by_its_owner_only() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "plan a party").await;
    tc.claim_and_ask("How many guests?", 0).await;
    tc.out_containing("How many guests?").await;
    let short = task_id(&id).short();

    tc.say(GROUP, "200", &format!("/task pause {short}")).await;
    tc.out_containing("You have no task").await;
    tc.say(GROUP, "100", &format!("/task pause {short}")).await;
    tc.out_containing("Paused task").await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::Paused);

    // The answer is kept while paused; the task goes on only once resumed.
    tc.say(GROUP, "100", "twelve").await;
    tc.out_containing("goes on with your answer once resumed")
        .await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::Paused);
    let questions = tc.store.questions_of(task.id).await.expect("questions");
    assert_eq!(questions[0].outcome, QuestionOutcome::Answered);
    assert_eq!(questions[0].answer.as_deref(), Some("twelve"));

    tc.say(GROUP, "100", &format!("/task resume {short}")).await;
    tc.out_containing("Resumed task").await;
    assert_eq!(
        tc.store.get_task(task_id(&id)).await.expect("task").state,
        TaskState::Pending
    );
    tc.say(GROUP, "100", &format!("/task resume {short}")).await;
    tc.out_containing("is not paused").await;
    tc.stop().await;
}

#[tokio::test]
async fn a_qq_chat_is_answered_in_chinese_and_takes_chinese_commands() {
    // chat.language = "auto": Chinese on qq, the default command word and its Chinese alias.
    let tc = TestControl::start_with(|c| c.chat.language = Default::default()).await;
    tc.say(GROUP, "100", "/任务 新建 写一首关于秋天的诗").await;
    let created = tc.out_containing("已创建任务").await;
    let short = created
        .text
        .trim_start_matches("已创建任务 ")
        .split('：')
        .next()
        .expect("the reply names the task")
        .to_owned();
    assert!(
        created.text.ends_with("：写一首关于秋天的诗"),
        "{}",
        created.text
    );

    let (_, handle) = tc.claim_and_ask("要押韵吗？", 600).await;
    let question = tc.out_containing("要押韵吗？").await;
    assert!(
        question
            .text
            .starts_with(&format!("[任务 {short} · #{handle}] 要押韵吗？")),
        "{}",
        question.text
    );
    tc.say(GROUP, "100", "要").await;
    tc.out_containing(&format!("收到——任务 {short} 继续进行。"))
        .await;

    tc.say(GROUP, "100", &format!("/task 状态 {short}")).await;
    let status = tc.out_containing("目标：写一首关于秋天的诗").await;
    assert!(status.text.contains("排队中"), "{}", status.text);
    tc.say(GROUP, "100", "/任务 飞").await;
    tc.out_containing("没有 `飞` 这个命令").await;
    tc.say(GROUP, "100", "/任务 帮助").await;
    tc.out_containing("回答问题：直接在这里回复").await;
    tc.stop().await;
}

#[tokio::test]
async fn one_message_id_in_two_chats_is_two_messages() {
    // Platforms such as Telegram number messages per chat: the same id in two groups is two
    // different messages, and each answers the question of its own group.
    let tc = TestControl::start().await;
    let first = tc.new_task_in_chat(GROUP, "100", "plan a party").await;
    tc.claim_and_ask("How many guests?", 0).await;
    tc.out_containing("How many guests?").await;
    let second = tc
        .new_task_in_chat(OTHER_GROUP, "100", "plan a picnic")
        .await;
    tc.claim_and_ask("Which park?", 0).await;
    tc.out_containing("Which park?").await;

    tc.say_as(GROUP, "100", "twelve", "7").await;
    tc.out_containing("continues").await;
    tc.say_as(OTHER_GROUP, "100", "the big one", "7").await;
    tc.out_containing("continues").await;
    for (id, answer) in [(&first, "twelve"), (&second, "the big one")] {
        let task = tc.store.get_task(task_id(id)).await.expect("task");
        assert_eq!(task.state, TaskState::Pending, "{answer}");
        let questions = tc.store.questions_of(task.id).await.expect("questions");
        assert_eq!(questions[0].answer.as_deref(), Some(answer));
    }
    tc.stop().await;
}

#[tokio::test]
async fn tasks_are_scheduled_from_the_chat_listed_with_their_next_run_and_cancelled() {
    let tc = TestControl::start().await;
    // Once, a second from now: the timers start it.
    tc.say(GROUP, "100", "/task new --in 1s water the plants")
        .await;
    let scheduled = tc.out_containing("Scheduled").await;
    assert!(
        scheduled.text.contains("water the plants"),
        "{}",
        scheduled.text
    );
    let job = tc.next_job().await;
    let task = tc
        .store
        .get_task(task_id(&job.task_id))
        .await
        .expect("the run's task");
    assert_eq!(task.goal, "water the plants");
    assert!(
        task.schedule_id.is_some(),
        "the task is linked to its schedule"
    );
    assert_eq!(
        task.platform.as_deref(),
        Some("qq"),
        "it runs in the chat it was made in"
    );

    // Every weekday morning, in the owner's time zone (Asia/Shanghai on qq).
    tc.say(
        GROUP,
        "100",
        "/task new --cron \"0 9 * * 1-5\" the stand-up notes",
    )
    .await;
    let recurring = tc.out_containing("repeats `0 9 * * 1-5`").await;
    assert!(
        recurring.text.contains("09:00 (Asia/Shanghai)"),
        "{}",
        recurring.text
    );
    let short = recurring
        .text
        .trim_start_matches("Scheduled ")
        .split(':')
        .next()
        .expect("the schedule's id")
        .to_owned();
    tc.say(GROUP, "100", "/task list").await;
    let listed = tc.out_containing(&short).await;
    assert!(
        listed.text.contains("(`0 9 * * 1-5`) the stand-up notes"),
        "{}",
        listed.text
    );

    tc.say(GROUP, "100", "/task new --cron \"0 25 * * *\" never")
        .await;
    tc.out_containing("hour `25`: 25 is outside 0-23").await;
    tc.say(GROUP, "100", "/task new --at 2020-01-01T09:00 too late")
        .await;
    tc.out_containing("is in the past").await;

    tc.say(GROUP, "200", &format!("/task cancel {short}")).await;
    tc.out_containing("You have no task").await;
    tc.say(GROUP, "100", &format!("/task cancel {short}")).await;
    tc.out_containing(&format!("Cancelled schedule {short}"))
        .await;
    tc.say(GROUP, "100", &format!("/task cancel {short}")).await;
    tc.out_containing("has already ended").await;
    tc.stop().await;
}

#[tokio::test]
async fn chat_commands_answer_plainly_and_respect_roles() {
    let tc = TestControl::start_with(|c| {
        c.permission.default_role = hark_core::domain::Role::Guest;
        c.permission.users = vec!["qq:100".parse().expect("owner")];
    })
    .await;
    tc.say(GROUP, "300", "/task new do something").await;
    let refused = tc.out_containing("cannot create tasks").await;
    assert!(refused.text.contains("guest"));

    tc.say(GROUP, "100", "/task help").await;
    tc.out_containing("/task new").await;
    tc.say(GROUP, "100", "/task frobnicate").await;
    tc.out_containing("unknown command").await;

    let id = tc
        .new_task_in_chat(GROUP, "100", "summarise the news")
        .await;
    let short = task_id(&id).short();
    tc.say(GROUP, "100", &format!("/task status {}", &short[..6]))
        .await;
    let status = tc.out_containing("summarise the news").await;
    assert!(status.text.contains("pending"));

    let (lease, _) = tc.claim_and_ask("Which topics?", 0).await;
    let _ = lease;
    tc.say(GROUP, "100", &format!("/task history {short}"))
        .await;
    let history = tc.out_containing("round 1").await;
    assert!(history.text.contains("ask_user"), "{}", history.text);
    assert!(history.text.contains("Which topics?"));

    // Admin (qq:1) lists everyone's tasks; a user may not.
    tc.say(GROUP, "100", "/task list all").await;
    tc.out_containing("Only admins").await;
    tc.say(GROUP, "1", "/task list all").await;
    let all = tc.out_containing(&short).await;
    assert!(all.text.contains("qq:100"));
    tc.stop().await;
}

#[tokio::test]
async fn a_malformed_control_request_is_refused_without_harm() {
    let tc = TestControl::start().await;
    let reply: pb::ControlAck = tc
        .request(
            ControlOp::Checkpoint,
            bytes::Bytes::from_static(&[0xff, 0x00, 0x13]),
        )
        .await;
    assert_eq!(
        reply.refusal.expect("refused").reason,
        pb::RefusalReason::Invalid as i32
    );
    let claim: pb::ClaimResponse = tc
        .request(
            ControlOp::Claim,
            codec::encode(pb::ClaimRequest {
                task_id: "not-a-uuid".into(),
                generation: 1,
                worker_id: "w".into(),
                ..Default::default()
            }),
        )
        .await;
    let refusal = claim.refusal.expect("refused");
    assert_eq!(refusal.reason, pb::RefusalReason::Invalid as i32);
    assert!(refusal.message.contains("not-a-uuid"));
    // The service still works afterwards.
    tc.new_task_in_chat(GROUP, "100", "still alive").await;
    tc.stop().await;
}

#[tokio::test]
async fn the_owner_is_reminded_before_the_deadline_once() {
    let tc =
        TestControl::start_with(|c| c.task.remind_before = "2s".parse().expect("duration")).await;
    tc.say(
        GROUP,
        "100",
        "/task new --timeout 3s --on-timeout fail remind me",
    )
    .await;
    tc.out_containing("created").await;
    tc.claim_and_ask("Still there?", 0).await;
    let question = tc.out_containing("Still there?").await;
    let reminder = tc.out_containing("still waiting for your answer").await;
    assert!(reminder.text.contains("Still there?"), "{}", reminder.text);
    assert!(!question.question_id.is_empty());
    // One reminder only, then the expiry.
    let next = tc.next_out().await;
    assert!(next.text.contains("no answer within 3s"), "{}", next.text);
    tc.stop().await;
}

#[tokio::test]
async fn a_task_running_past_max_runtime_fails_and_its_worker_is_told_to_stop() {
    let tc =
        TestControl::start_with(|c| c.task.max_runtime = "1s".parse().expect("duration")).await;
    let id = tc.new_task_in_chat(GROUP, "100", "run forever").await;
    let job = tc.next_job().await;
    let lease = tc.claim(&job, "w1").await.lease.expect("lease");
    let mut hints = tc
        .nats
        .subscribe(tc.names.task_cancel(task_id(&id)))
        .await
        .expect("subscribe");
    // The worker keeps its lease alive; the running time bound ends the task anyway.
    tc.eventually("the task fails on its running time", || async {
        let _ = tc.heartbeat(&lease).await;
        tc.store.get_task(task_id(&id)).await.expect("task").state == TaskState::Failed
    })
    .await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert!(
        task.error.as_deref().unwrap_or("").contains("max_runtime"),
        "{:?}",
        task.error
    );
    let hint = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::StreamExt::next(&mut hints),
    )
    .await;
    assert!(matches!(hint, Ok(Some(_))), "the worker is told to stop");
    let refused = tc.heartbeat(&lease).await.refusal.expect("refused");
    assert_eq!(refused.reason, pb::RefusalReason::LeaseLost as i32);
    tc.out_containing("failed").await;
    tc.stop().await;
}

#[tokio::test]
async fn nul_characters_from_a_model_or_a_chat_are_dropped_not_refused() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "count sheep").await;
    // The model's question carries a NUL character.
    tc.claim_and_ask("How\0 many?", 0).await;
    tc.out_containing("How many?").await;
    // So does the owner's answer.
    tc.say(GROUP, "100", "sev\0en").await;
    tc.out_containing("continues").await;
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    assert_eq!(questions.len(), 1);
    assert_eq!(questions[0].text, "How many?");
    assert_eq!(questions[0].answer.as_deref(), Some("seven"));
    tc.stop().await;
}

#[tokio::test]
async fn a_quote_hark_cannot_match_asks_which_question_and_any_copy_of_a_question_routes_to_it() {
    let tc = TestControl::start().await;
    let mut shown = Vec::new();
    let mut tasks = Vec::new();
    for (i, q) in [
        "Colour of the fence?",
        "Colour of the door?",
        "Colour of the gate?",
    ]
    .iter()
    .enumerate()
    {
        let id = tc
            .new_task_in_chat(GROUP, "100", &format!("paint {i}"))
            .await;
        tc.claim_and_ask(q, 0).await;
        shown.push(tc.out_containing(q).await);
        tasks.push(task_id(&id));
    }
    let mut questions = Vec::new();
    for task in &tasks {
        questions.push(
            tc.store
                .open_question_of(*task)
                .await
                .expect("q")
                .expect("open"),
        );
    }

    // A quote of a message hark does not know, with nothing else to go by: three questions are
    // open, so hark asks which, and none takes it.
    tc.say_quoting(GROUP, "100", "green", "never-seen-1").await;
    let asked = tc.out_containing("cannot tell which question").await;
    for q in &questions {
        assert!(
            asked.text.contains(&format!("#{}", q.handle)),
            "{}",
            asked.text
        );
    }
    for task in &tasks {
        assert_eq!(
            tc.store.get_task(*task).await.expect("task").state,
            TaskState::WaitingInput,
            "no task took the unmatched quote"
        );
    }

    // The door's question was delivered twice; quoting the first copy answers the door, not
    // the older fence.
    tc.receipt(&shown[1], "copy-1").await;
    tc.receipt(&shown[1], "copy-2").await;
    tc.eventually("both copies are known", || async {
        tc.store
            .question_by_chat_message("qq", GROUP, "copy-2")
            .await
            .expect("lookup")
            .is_some()
    })
    .await;
    tc.say_quoting(GROUP, "100", "white", "copy-1").await;
    tc.out_containing("continues").await;
    let door = tc.store.get_question(questions[1].id).await.expect("q");
    assert_eq!(door.answer.as_deref(), Some("white"));
    assert_eq!(
        door.chat_message_id.as_deref(),
        Some("copy-1"),
        "the first copy is shown"
    );

    // The gate's question was shown but its id never reached hark: the quoted text the bot
    // reports names it, and the gate is answered, not the older fence.
    tc.say_quoting_text(GROUP, "100", "black", "never-seen-2", &shown[2].text)
        .await;
    tc.out_containing("continues").await;
    let gate = tc.store.get_question(questions[2].id).await.expect("q");
    assert_eq!(gate.answer.as_deref(), Some("black"));
    let fence = tc.store.get_question(questions[0].id).await.expect("q");
    assert!(fence.outcome.is_open(), "the fence still waits");
    tc.stop().await;
}

#[tokio::test]
async fn a_question_with_choices_shows_them_and_takes_only_one_of_them() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "order a coffee").await;
    let job = tc.next_job().await;
    let lease = tc.claim(&job, "w1").await.lease.expect("lease");
    let asked = ask_with(&tc, lease, 1, "Which size?", |r| {
        r.choices = vec!["small".into(), "中杯".into()];
    })
    .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    let shown = tc.out_containing("Which size?").await;
    assert!(shown.text.contains("1) small  2) 中杯"), "{}", shown.text);

    // Not a choice: the bot says which are, and the question stays open.
    tc.say(GROUP, "100", "large").await;
    let told = tc.out_containing("does not fit").await;
    assert!(told.text.contains("1) small  2) 中杯"), "{}", told.text);
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);

    // A number picks its choice, and the worker gets the choice as JSON.
    tc.say(GROUP, "100", "2").await;
    tc.out_containing("continues").await;
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    assert_eq!(claimed.resume.expect("resume").text, r#"{"choice":"中杯"}"#);

    // Choices that are not valid are refused to the worker.
    let lease = claimed.lease.expect("lease");
    let refused = ask_with(&tc, lease, 2, "Again?", |r| {
        r.choices = vec!["yes".into(), "YES".into()];
    })
    .await;
    let refusal = refused.refusal.expect("refused");
    assert_eq!(refusal.reason, pb::RefusalReason::Invalid as i32);
    assert!(refusal.message.contains("choices"), "{}", refusal.message);
    tc.stop().await;
}

#[tokio::test]
async fn a_confirm_asked_in_chat_hints_at_a_misfit_and_takes_a_chinese_yes_too() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "send the invoice").await;
    let job = tc.next_job().await;
    let lease = tc.claim(&job, "w1").await.lease.expect("lease");
    let asked = ask_with(&tc, lease, 1, "要发送发票吗？", |r| {
        r.kind = "confirm".into()
    })
    .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    let shown = tc.out_containing("要发送发票吗？").await;
    assert!(shown.text.ends_with("(reply yes or no)"), "{}", shown.text);

    tc.say(GROUP, "100", "再想想").await;
    let told = tc.out_containing("does not fit").await;
    assert!(
        told.text.contains("the question is still open"),
        "{}",
        told.text
    );
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);

    tc.say(GROUP, "100", "好").await;
    tc.out_containing("continues").await;
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    assert_eq!(
        claimed.resume.expect("resume").text,
        r#"{"confirmed":true}"#
    );
    tc.stop().await;
}

/// Asks `question` under `lease` in round `number`, as a worker's ask_user call would;
/// `tweak` sets its shape.
async fn ask_with(
    tc: &TestControl,
    lease: pb::Lease,
    number: u32,
    question: &str,
    tweak: impl FnOnce(&mut pb::AskRequest),
) -> pb::AskResponse {
    let messages = serde_json::json!([{"role": "assistant", "content": null}]);
    let mut request = pb::AskRequest {
        lease: Some(lease),
        round: Some(pb::Round {
            number,
            messages_json: serde_json::to_vec(&messages).expect("json"),
            ..Default::default()
        }),
        tool_call_id: format!("call-{number}"),
        question: question.into(),
        ..Default::default()
    };
    tweak(&mut request);
    tc.request(ControlOp::Ask, codec::encode(request)).await
}

#[tokio::test]
async fn times_too_far_ahead_are_refused_in_the_chat_and_the_next_message_is_served() {
    let tc = TestControl::start().await;
    // Each of these once stopped all chat processing: `now + after` overflowed and panicked.
    for (command, answer) in [
        ("/task new --in 70000000h x", "longer than the limit"),
        ("/task new --in 99999999999999d x", "longer than the limit"),
        (
            "/task new --in 9999999999999999999999d x",
            "is not a duration",
        ),
        ("/task new --timeout 70000000h x", "longer than the limit"),
        ("/task new --at 2999-12-31T23:59 x", "ahead"),
        ("/task new --at 9999-12-31T23:59 x", "not scheduled"),
    ] {
        tc.say(GROUP, "1", command).await;
        let refused = tc.next_out().await;
        assert!(refused.text.contains(answer), "{command}: {}", refused.text);
    }
    tc.say(GROUP, "1", "/task list").await;
    tc.out_containing("No tasks").await;
    tc.stop().await;
}

#[tokio::test]
async fn a_question_passed_on_is_asked_of_the_person_mentioned_who_alone_answers_it() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "plan the outing").await;
    let (_, handle) = tc.claim_and_ask("Which day?", 0).await;
    tc.out_containing("Which day?").await;

    // Someone else cannot pass it on, even naming it.
    tc.say_mentioning(GROUP, "300", &format!("/delegate #{handle} @Bob"), &["200"])
        .await;
    let refused = tc.out_containing("can pass").await;
    assert!(
        refused.text.contains(&format!("#{handle}")),
        "{}",
        refused.text
    );

    // The person asked passes it on to the one they mention.
    let passing = tc
        .say_mentioning(GROUP, "100", "/task delegate @Bob", &["200"])
        .await;
    let acked = format!("Passed #{handle} on to qq:200");
    let [asked, _] = <[_; 2]>::try_from(
        tc.outs_containing(&["passed on to you by qq:100", &acked])
            .await,
    )
    .expect("two messages");
    assert!(asked.text.contains("Which day?"), "{}", asked.text);
    assert_eq!(
        asked.mentions,
        ["200"],
        "the group sees whom it is asked of"
    );
    assert!(
        !asked.question_id.is_empty(),
        "its receipt routes quotes to it"
    );

    // The same message again passes nothing on twice.
    tc.say_again_mentioning(GROUP, "100", "/task delegate @Bob", &["200"], &passing)
        .await;
    let meanwhile = tc.settle(GROUP, "100").await;
    assert!(meanwhile.is_empty(), "{meanwhile:?}");

    // The one passed over no longer answers it; the one asked does.
    tc.say(GROUP, "100", "Monday").await;
    let meanwhile = tc.settle(GROUP, "100").await;
    assert!(meanwhile.is_empty(), "{meanwhile:?}");
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);

    tc.say(GROUP, "200", "Friday").await;
    let job = tc.next_job().await;
    assert_eq!(job.reason, pb::RunReason::ResumeReply as i32);
    let claimed = tc.claim(&job, "w2").await;
    assert_eq!(claimed.resume.expect("resumed").text, "Friday");
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    assert_eq!(questions[0].answerer.as_deref(), Some("qq:200"));
    let delegations: Vec<_> = tc
        .store
        .transitions_of(task_id(&id))
        .await
        .expect("audit")
        .into_iter()
        .filter(|t| t.event == "delegate")
        .collect();
    assert_eq!(delegations.len(), 1, "{delegations:?}");
    assert_eq!(delegations[0].actor, "qq:100");
    assert_eq!(delegations[0].detail, format!("#{handle} to qq:200"));
    tc.stop().await;
}

#[tokio::test]
async fn a_question_asked_in_private_is_passed_on_to_the_new_askees_own_chat() {
    let tc = TestControl::start().await;
    let id = tc
        .new_task_in_chat("private:100", "100", "book a table")
        .await;
    let (_, handle) = tc.claim_and_ask("For how many?", 0).await;
    tc.out_containing("For how many?").await;

    // A person of another platform cannot be asked in this chat.
    tc.say("private:100", "100", &format!("/转交 #{handle} web:200"))
        .await;
    tc.out_containing("web:200 is not on qq").await;
    tc.say("private:100", "100", &format!("/转交 #{handle} qq:200"))
        .await;
    let acked = format!("Passed #{handle} on to qq:200");
    let outs = tc.outs_containing(&["passed on to you", &acked]).await;
    let route = outs[0].route.clone().expect("route");
    assert_eq!(route.stream, "private:200");
    assert!(outs[0].mentions.is_empty());
    assert_eq!(outs[1].route.as_ref().expect("route").stream, "private:100");

    // The question left the old chat; passing it to whom it is asked of now is refused.
    tc.say(
        "private:100",
        "100",
        &format!("/task delegate #{handle} @200"),
    )
    .await;
    tc.out_containing("no open question here").await;
    tc.say("private:200", "200", "/task delegate qq:200").await;
    tc.out_containing("already asked of qq:200").await;

    tc.say("private:200", "200", "4").await;
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    assert_eq!(claimed.resume.expect("resumed").text, "4");
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::Running);
    tc.stop().await;
}

#[tokio::test]
async fn a_task_past_its_deadline_fails_and_its_open_question_expires_with_it() {
    let tc = TestControl::start_with(|c| c.task.deadline = "1h".parse().expect("duration")).await;
    let id = tc.new_task_in_chat(GROUP, "100", "plan a trip").await;
    // It asks, and nobody answers: the question's own deadline (600s) is far off.
    tc.claim_and_ask("Where to?", 600).await;
    tc.out_containing("Where to?").await;
    // The task's deadline comes from task.deadline; here it is brought to now.
    let moved = sqlx::query(
        "UPDATE tasks SET deadline_at = now() - interval '1 second'
         WHERE id = $1 AND deadline_at > now() + interval '50 minutes'",
    )
    .bind(task_id(&id).as_uuid())
    .execute(tc.store.pool())
    .await
    .expect("deadline moved");
    assert_eq!(
        moved.rows_affected(),
        1,
        "task.deadline gave the task its deadline"
    );
    tc.eventually("the task fails at its deadline", || async {
        tc.store.get_task(task_id(&id)).await.expect("task").state == TaskState::Failed
    })
    .await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert!(
        task.error.as_deref().unwrap_or("").contains("deadline"),
        "{:?}",
        task.error
    );
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    assert_eq!(questions.len(), 1);
    assert_eq!(questions[0].outcome, QuestionOutcome::Expired);
    tc.out_containing("deadline").await;
    tc.stop().await;
}

#[tokio::test]
async fn an_answer_decided_before_its_question_was_passed_on_loses_to_the_delegation() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "plan the outing").await;
    let (_, handle) = tc.claim_and_ask("Which day?", 0).await;
    tc.out_containing("Which day?").await;
    // qq:100's reply is read as an answer to their open question…
    let targets = tc
        .store
        .open_questions_for_sender("qq", GROUP, "100", Some("late-monday"))
        .await
        .expect("targets");
    let [target] = <[_; 1]>::try_from(targets).expect("one open question");
    let before = tc.store.get_task(task_id(&id)).await.expect("task");
    // …and the question is passed on to qq:200 before that answer commits.
    let (from, to) = (
        "qq:100".parse().expect("owner"),
        "qq:200".parse().expect("owner"),
    );
    let asked = hark_control::cases::Caller::Person {
        owner: from,
        role: hark_core::domain::Role::User,
    };
    hark_control::cases::delegate(&tc.shared, &asked, &target.question, &to, None)
        .await
        .expect("passed on");
    let after = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(after.state, TaskState::WaitingInput);
    assert_eq!(after.generation, before.generation + 1);

    let lost = hark_control::cases::answer::Answers::of(&tc.shared)
        .target(
            target,
            &hark_control::store::Answer {
                answerer: "qq:100".into(),
                text: "Monday".into(),
                json: None,
                inbound_key: Some("late-monday".into()),
            },
        )
        .await;
    match lost {
        Err(hark_control::store::Error::Moved { handle: h, askee }) => {
            assert_eq!((h.as_str(), askee.as_str()), (handle.as_str(), "qq:200"));
        }
        other => panic!("the answer was not refused as passed on: {other:?}"),
    }
    let question = &tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions")[0];
    assert_eq!(question.outcome, QuestionOutcome::Open);
    assert_eq!(question.owner.as_str(), "qq:200");
    tc.stop().await;
}

#[tokio::test]
async fn an_unanswered_question_is_escalated_and_the_first_answer_of_anyone_asked_wins() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "order lunch").await;
    let lease = tc.claim_next(&id).await;
    // Nobody of another platform, and nobody at all without a name, can be asked.
    let refused = ask_with(&tc, lease.clone(), 1, "Pizza or sushi?", |r| {
        r.escalate_to = vec!["web:200".into()];
    })
    .await;
    let why = refused.refusal.expect("refused").message;
    assert!(why.contains("escalate_to: web:200 is not on qq"), "{why}");
    let asked = ask_with(&tc, lease, 1, "Pizza or sushi?", |r| {
        r.escalate_to = vec!["200".into(), "qq:300".into()];
        r.escalate_after_s = 1;
    })
    .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    let handle = asked.handle;
    let first = tc.out_containing("Pizza or sushi?").await;
    assert_eq!(first.route.as_ref().expect("route").stream, GROUP);

    // A second without an answer: qq:200 is asked too, in their own chat.
    let escalated = tc.out_containing("you are asked too").await;
    assert_eq!(
        escalated.route.as_ref().expect("route").stream,
        "private:200"
    );
    assert!(
        escalated.text.contains("Pizza or sushi?"),
        "{}",
        escalated.text
    );
    assert!(
        escalated.text.contains("qq:100 has not answered"),
        "{}",
        escalated.text
    );
    assert!(!escalated.question_id.is_empty());
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    let open: Vec<_> = questions.iter().filter(|q| q.outcome.is_open()).collect();
    assert_eq!(open.len(), 2, "{questions:?}");
    let first_row = questions
        .iter()
        .find(|q| q.owner.as_str() == "qq:100")
        .expect("the first question");
    assert_eq!(first_row.escalate_to, vec!["qq:300".to_owned()]);
    assert_eq!(first_row.ask_group, Some(first_row.id.as_uuid()));

    // qq:200 answers in private: the task resumes with it, and qq:100 is told.
    tc.say("private:200", "200", "sushi").await;
    let told = tc.out_containing("was answered by qq:200").await;
    assert_eq!(told.route.as_ref().expect("route").stream, GROUP);
    assert!(told.text.contains(&format!("#{handle}")), "{}", told.text);
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    let resume = claimed.resume.expect("resumed");
    assert_eq!(
        (resume.text.as_str(), resume.tool_call_id.as_str()),
        ("sushi", "call-1")
    );

    // The ledger: qq:200 answered, qq:100's question was superseded, qq:300 was never asked.
    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    assert_eq!(questions.len(), 2, "{questions:?}");
    let answered: Vec<_> = questions
        .iter()
        .filter(|q| q.outcome == QuestionOutcome::Answered)
        .collect();
    assert_eq!(answered.len(), 1, "{questions:?}");
    assert_eq!(answered[0].answerer.as_deref(), Some("qq:200"));
    assert_eq!(answered[0].owner.as_str(), "qq:200");
    assert!(
        questions
            .iter()
            .any(|q| q.owner.as_str() == "qq:100" && q.outcome == QuestionOutcome::Superseded),
        "{questions:?}"
    );
    let escalations: Vec<_> = tc
        .store
        .transitions_of(task_id(&id))
        .await
        .expect("audit")
        .into_iter()
        .filter(|t| t.event == "escalate")
        .collect();
    assert_eq!(escalations.len(), 1, "{escalations:?}");
    assert_eq!(escalations[0].detail, format!("#{handle} to qq:200"));

    // qq:100's late answer changes nothing.
    tc.say(GROUP, "100", "pizza").await;
    let late = tc.settle(GROUP, "100").await;
    assert!(
        late.iter().all(|m| !(m.text.contains("continues")
            && m.route.as_ref().is_some_and(|r| r.stream == GROUP))),
        "{late:?}"
    );
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::Running);
    tc.stop().await;
}

#[tokio::test]
async fn a_question_put_to_three_people_resumes_on_two_answers_each_with_its_author() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "pick a date").await;
    let lease = tc.claim_next(&id).await;
    let refused = ask_with(&tc, lease.clone(), 1, "Which day suits you?", |r| {
        r.ask_to = vec!["200".into()];
        r.need = "most".into();
    })
    .await;
    let why = refused.refusal.expect("refused").message;
    assert!(why.contains("need: `most`"), "{why}");
    let asked = ask_with(&tc, lease, 1, "Which day suits you?", |r| {
        r.ask_to = vec!["200".into(), "qq:300".into(), "400".into()];
        r.need = "2".into();
    })
    .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    let handle = asked.handle;
    // Each is asked in the group, with a mention of their own.
    let mut mentioned = Vec::new();
    for _ in 0..3 {
        let shown = tc.out_containing("Which day suits you?").await;
        assert_eq!(shown.route.as_ref().expect("route").stream, GROUP);
        assert!(shown.text.contains(&format!("#{handle}")), "{}", shown.text);
        mentioned.extend(shown.mentions);
    }
    mentioned.sort();
    assert_eq!(mentioned, ["200", "300", "400"]);

    // The owner was not asked: their message answers nothing.
    tc.say(GROUP, "100", "Sunday").await;
    // One answer is kept, and the task waits for another.
    tc.say(GROUP, "200", "Friday").await;
    tc.out_containing("1 of 2 answers are in").await;
    let task = tc.store.get_task(task_id(&id)).await.expect("task");
    assert_eq!(task.state, TaskState::WaitingInput);
    assert!(tc.try_next_job(Duration::from_millis(200)).await.is_none());

    // The second resumes it; the third person is told.
    tc.say(GROUP, "300", "Saturday").await;
    let told = tc.out_containing("was answered by qq:300").await;
    assert_eq!(told.route.as_ref().expect("route").stream, GROUP);
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    let resume = claimed.resume.expect("resumed");
    let read: serde_json::Value = serde_json::from_str(&resume.text).expect("json");
    assert_eq!(
        read,
        serde_json::json!({"answers": [
            {"by": "qq:200", "answer": "Friday"},
            {"by": "qq:300", "answer": "Saturday"},
        ]})
    );

    let questions = tc
        .store
        .questions_of(task_id(&id))
        .await
        .expect("questions");
    let ledger: Vec<(String, QuestionOutcome, Option<String>)> = questions
        .iter()
        .map(|q| (q.owner.to_string(), q.outcome, q.answer.clone()))
        .collect();
    assert_eq!(
        ledger,
        [
            (
                "qq:200".to_owned(),
                QuestionOutcome::Answered,
                Some("Friday".to_owned())
            ),
            (
                "qq:300".to_owned(),
                QuestionOutcome::Answered,
                Some("Saturday".to_owned())
            ),
            ("qq:400".to_owned(), QuestionOutcome::Superseded, None),
        ]
    );
    assert!(questions.iter().all(|q| (q.need, q.askees) == (2, 3)));
    let audit: Vec<(String, String)> = tc
        .store
        .transitions_of(task_id(&id))
        .await
        .expect("audit")
        .into_iter()
        .filter(|t| t.event == "collect" || t.event == "escalate")
        .map(|t| (t.event, t.detail))
        .collect();
    assert_eq!(
        audit,
        [
            (
                "escalate".to_owned(),
                format!("#{handle} to qq:300, qq:400")
            ),
            ("collect".to_owned(), format!("#{handle}: 1 of 2")),
        ]
    );
    tc.stop().await;
}

#[tokio::test]
async fn an_approval_put_to_three_people_ends_at_the_first_denial() {
    let tc = TestControl::start().await;
    let id = tc
        .new_task_in_chat("private:100", "100", "clean the disk")
        .await;
    let lease = tc.claim_next(&id).await;
    let asked = ask_with(&tc, lease, 1, "Run rm -rf /tmp/cache?", |r| {
        r.kind = "approval".into();
        r.choices = vec![
            "approve".into(),
            "deny".into(),
            "approve for the rest of this task".into(),
        ];
        r.ask_to = vec!["200".into(), "300".into(), "400".into()];
        r.need = "all".into();
    })
    .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    // In a private chat's task, each is asked in their own.
    let mut streams = Vec::new();
    for _ in 0..3 {
        let shown = tc.out_containing("rm -rf").await;
        assert!(shown.mentions.is_empty());
        streams.push(shown.route.expect("route").stream);
    }
    streams.sort();
    assert_eq!(streams, ["private:200", "private:300", "private:400"]);

    tc.say("private:200", "200", "1").await;
    tc.out_containing("1 of 3 answers are in").await;
    tc.say("private:300", "300", "2 the cache is still in use")
        .await;
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    let read: serde_json::Value =
        serde_json::from_str(&claimed.resume.expect("resumed").text).expect("json");
    assert_eq!(read["decision"], "deny", "{read}");
    assert_eq!(read["reason"], "the cache is still in use", "{read}");
    assert_eq!(read["answers"][0]["by"], "qq:200", "{read}");
    assert_eq!(
        read["answers"][0]["answer"]["decision"], "approve",
        "{read}"
    );
    assert_eq!(read["answers"][1]["by"], "qq:300", "{read}");
    let told = tc.out_containing("was answered by qq:300").await;
    assert_eq!(told.route.expect("route").stream, "private:400");
    tc.stop().await;
}

/// Says `text` as `user` in `stream` and returns the verdict task-control tells of it.
async fn verdict_of(
    tc: &TestControl,
    stream: &str,
    user: &str,
    text: &str,
    quoted: &str,
) -> String {
    use futures_util::StreamExt as _;
    let id = tc.message_id();
    let key = hark_core::bus::Names::chat_in_msg_id(
        common::control::PLATFORM,
        common::control::BOT,
        stream,
        &id,
    );
    let mut verdicts = tc
        .nats
        .subscribe(tc.names.chat_verdict(&key))
        .await
        .expect("subscribe");
    tc.publish_chat(stream, user, text, quoted, &id, &key).await;
    let told = tokio::time::timeout(Duration::from_secs(30), verdicts.next())
        .await
        .expect("a verdict within 30s")
        .expect("a verdict");
    let told: serde_json::Value = serde_json::from_slice(&told.payload).expect("JSON");
    assert_eq!(
        told["taken"].as_bool(),
        Some(told["as"] != "left"),
        "{told}"
    );
    told["as"].as_str().expect("as").to_owned()
}

#[tokio::test]
async fn every_chat_message_tells_whether_hark_took_it_and_as_what() {
    let tc = TestControl::start().await;
    assert_eq!(
        verdict_of(&tc, GROUP, "100", "/task new pick a colour", "").await,
        "command"
    );
    tc.out_containing("created").await;
    let (_, _) = tc.claim_and_ask("Which colour?", 0).await;
    let shown = tc.out_containing("Which colour?").await;
    tc.receipt(&shown, "q-msg").await;
    tc.eventually("the question's message is known", || async {
        tc.store
            .question_by_chat_message("qq", GROUP, "q-msg")
            .await
            .expect("lookup")
            .is_some()
    })
    .await;
    // A stranger's reply is not hark's: the framework in front of the chat keeps it.
    assert_eq!(verdict_of(&tc, GROUP, "200", "blue", "").await, "left");
    assert_eq!(verdict_of(&tc, GROUP, "100", "blue", "").await, "answer");
    tc.out_containing("continues").await;
    // Quoting the answered question: hark says it is closed.
    assert_eq!(verdict_of(&tc, GROUP, "100", "red", "q-msg").await, "hint");
    // Nothing open: a plain message goes to whoever else reads the chat.
    assert_eq!(verdict_of(&tc, GROUP, "100", "hello all", "").await, "left");
    tc.stop().await;
}

#[tokio::test]
async fn a_question_whose_message_was_set_aside_says_why_until_a_copy_reaches_the_chat() {
    let tc = TestControl::start().await;
    let id = tc.new_task_in_chat(GROUP, "100", "book a table").await;
    tc.claim_and_ask("Which evening?", 0).await;
    let shown = tc.out_containing("Which evening?").await;
    let shown_undelivered = || async {
        tc.client()
            .await
            .get_task(pb::GetTaskRequest {
                task_id: id.clone(),
            })
            .await
            .expect("get task")
            .into_inner()
            .questions[0]
            .undelivered
            .clone()
    };
    tc.undelivered(
        &shown,
        "myapp:main could not send it (attempt 8): the group is gone\nfor good",
    )
    .await;
    tc.eventually(
        "the question says why it never reached the chat",
        || async { !shown_undelivered().await.is_empty() },
    )
    .await;
    assert_eq!(
        shown_undelivered().await,
        "myapp:main could not send it (attempt 8): the group is gone for good"
    );
    // A copy that reached the chat after all (a reminder, say): it was seen.
    tc.receipt(&shown, "bot-msg-1").await;
    tc.eventually("a delivered copy clears it", || async {
        shown_undelivered().await.is_empty()
    })
    .await;
    let question = tc
        .store
        .open_question_of(task_id(&id))
        .await
        .expect("q")
        .expect("open");
    assert_eq!(question.chat_message_id.as_deref(), Some("bot-msg-1"));
}
