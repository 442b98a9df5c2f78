//! A task's own deadline, through the real binary in a QQ group: the task waits on a question
//! when its deadline passes, and task-control is killed right after it ends the task. Started
//! again, the group is told once, the question is closed with the task, and a late answer
//! resumes nothing.

use std::time::Duration;

use hark_e2e::{Env, bot::Bot};

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "0b9e7d61c2a84f35ad1e6c7f28b94d03";

#[tokio::test]
async fn killing_task_control_right_after_a_deadline_ends_a_task_ends_it_once() {
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "overdue.after_commit")]);
    let _api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_003, TOKEN).await;

    bot.group_message(5002, 100, "/task new --deadline 1h book a room")
        .await;
    let question = bot
        .expect("the question", WAIT, |s| s.text.contains("Which day?"))
        .await;
    // An hour later, as far as the task knows.
    env.sql("UPDATE tasks SET deadline_at = now() - interval '1 second'")
        .await;
    let status = control
        .exited_within(WAIT)
        .await
        .expect("task-control died right after the deadline ended the task");
    assert!(!status.success());
    assert_eq!(
        env.sql("SELECT state || ' ' || (SELECT outcome FROM questions) FROM tasks")
            .await,
        "failed expired",
        "the task and its question ended together, committed"
    );

    // Started again: the group is told, from what the dead process committed.
    let mut control = env.spawn(&["control"], &[]);
    let mut seen = Vec::new();
    let told = loop {
        let sent = bot
            .expect("the group told the task failed", WAIT, |_| true)
            .await;
        if sent.text.contains("deadline") {
            break sent;
        }
        seen.push(sent);
    };
    assert!(told.text.contains("failed"), "{}", told.text);
    // A late answer to the question is told it closed with the task, and resumes nothing.
    bot.group_message_quoting(5002, 100, "Monday", Some(question.message_id))
        .await;
    loop {
        let sent = bot.expect("the late answer told", WAIT, |_| true).await;
        let closed = sent.text.contains("is closed: it expired");
        seen.push(sent);
        if closed {
            break;
        }
    }
    seen.extend(bot.drain(Duration::from_millis(500)).await);
    assert!(
        seen.iter().all(|s| !s.text.contains("deadline")),
        "told twice: {seen:?}"
    );
    assert!(
        seen.iter().all(|s| !s.text.contains("Booked for")),
        "resumed after its deadline: {seen:?}"
    );
    assert_eq!(
        env.sql("SELECT count(*) FROM transitions WHERE event = 'overdue_fail'")
            .await,
        "1"
    );
    assert_eq!(env.sql("SELECT state FROM tasks").await, "failed");

    for role in [&mut worker, &mut gateway, &mut control] {
        role.stop().await;
    }
    env.cleanup().await;
}

/// A questionnaire's next question is asked by the statement that records the answer before
/// it, and waits as its task says: `ask_timeout` from when it is asked, or never under the
/// `never` policy.
#[tokio::test]
async fn a_questionnaires_next_question_waits_as_its_task_says() {
    use hark_proto::v1 as pb;
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    let mut control = env.spawn(&["control"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut api = env.client().await;
    for (policy, expected) in [
        (pb::TimeoutPolicy::Resume, Some(Duration::from_secs(1800))),
        (pb::TimeoutPolicy::Never, None),
    ] {
        let settings = pb::CreateTaskRequest {
            ask_timeout_s: 1800,
            on_timeout: policy as i32,
            ..Default::default()
        };
        let questions = [("day", "Which day?"), ("time", "What time?")];
        let task = hark_e2e::new_questionnaire(&mut api, "api:carol", &questions, settings).await;
        let first = hark_e2e::open_question_besides(&api, &task.id, None).await;
        assert_eq!(first.text, "Which day?");
        let replied = api
            .answer_question(pb::AnswerQuestionRequest {
                task_id: task.id.clone(),
                answer: "Friday".into(),
                wait: pb::AnswerWait::NextQuestionOrEnd as i32,
                ..Default::default()
            })
            .await
            .expect("answered")
            .into_inner();
        let next = replied
            .event
            .and_then(|e| e.question)
            .expect("the next question");
        assert_eq!(next.text, "What time?");
        let asked = next.asked_at.as_ref().expect("asked at");
        let waits = next.deadline.as_ref().map(|deadline| {
            let millis =
                |t: &prost_types::Timestamp| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000;
            Duration::from_millis((millis(deadline) - millis(asked)).unsigned_abs())
        });
        // To the millisecond, as the two times are given.
        let near = |w: Duration| w.abs_diff(Duration::from_secs(1800)) <= Duration::from_millis(1);
        match expected {
            Some(_) => assert!(waits.is_some_and(near), "{policy:?}: {waits:?} {next:?}"),
            None => assert_eq!(waits, None, "{policy:?}"),
        }
    }
    worker.stop().await;
    control.stop().await;
}
