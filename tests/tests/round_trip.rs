//! The whole ask_user round trip across real processes: `hark gateway`, `hark control` and two
//! `hark worker`s, the scripted LLM over HTTP, and a OneBot bot played over WebSocket.

use std::time::Duration;

use hark_e2e::{
    Env,
    chat::{GROUP, Hark, OWNER, WAIT, handle_of},
};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, Step};

#[tokio::test]
async fn a_question_asked_in_a_group_is_answered_there_by_its_owner_only() {
    let mut hark = Hark::start(
        vec![
            Step::ask_with("Which city?", "for the weather report", None),
            Step::say("The weather in {answer} is sunny."),
        ],
        &[],
        &["w1", "w2"],
    )
    .await;
    let short = hark.new_task("check the weather").await;
    let question = hark
        .bot
        .expect("the question", WAIT, |s| s.text.contains("Which city?"))
        .await;
    assert_eq!(question.stream, "group:777");
    assert!(question.text.contains(&short));
    assert!(
        question.text.contains("[context] for the weather report"),
        "{}",
        question.text
    );

    // Another member's message does not answer; the owner's command is not an answer either.
    hark.say(200, "Berlin").await;
    hark.say(OWNER, "/task list").await;
    // Messages are handled in order: whatever "Berlin" caused was posted before the listing.
    let mut meanwhile = Vec::new();
    let listing = loop {
        let posted = hark.bot.expect("the task list", WAIT, |_| true).await;
        if posted.text.contains(&short) && posted.text.contains("waiting_input") {
            break posted;
        }
        meanwhile.push(posted.text);
    };
    assert!(listing.text.contains("waiting_input"), "{}", listing.text);
    assert!(
        meanwhile.iter().all(|t| !t.contains("continues")),
        "{meanwhile:?}"
    );
    assert_eq!(
        hark.task(&short).await.state,
        pb::TaskState::WaitingInput as i32
    );

    hark.say(OWNER, "Paris").await;
    hark.bot
        .expect("the acknowledgement", WAIT, |s| {
            s.text.contains("continues")
        })
        .await;
    let done = hark
        .bot
        .expect("the final answer", WAIT, |s| s.text.contains("sunny"))
        .await;
    assert!(
        done.text.contains("The weather in Paris is sunny."),
        "{}",
        done.text
    );
    assert_eq!(
        hark.task(&short).await.state,
        pb::TaskState::Completed as i32
    );
    hark.stop().await;
}

#[tokio::test]
async fn task_control_killed_while_a_task_waits_still_resumes_it_exactly_once() {
    let mut hark = Hark::start(
        vec![Step::ask("Which colour?"), Step::say("Painted {answer}.")],
        &[],
        &["w1", "w2"],
    )
    .await;
    let short = hark.new_task("paint the fence").await;
    hark.bot
        .expect("the question", WAIT, |s| s.text.contains("Which colour?"))
        .await;

    hark.control.kill().await;
    // The answer arrives while task-control is dead; it waits in the stream.
    hark.say(OWNER, "green").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    hark.control = hark.env.spawn(&["control"], &[]);

    let done = hark
        .bot
        .expect("the final answer", WAIT, |s| s.text.contains("Painted"))
        .await;
    assert!(done.text.contains("Painted green."), "{}", done.text);
    let later = hark.bot.drain(Duration::from_secs(2)).await;
    assert!(
        later.iter().all(|s| !s.text.contains("Painted")),
        "the task finished twice: {later:?}"
    );
    let resumed = hark
        .llm
        .requests()
        .iter()
        .filter(|r| hark_worker::scripted::last_tool_result(&r.body).as_deref() == Some("green"))
        .count();
    assert_eq!(resumed, 1, "exactly one LLM call carried the answer");
    let task = hark.task(&short).await;
    assert_eq!(task.state, pb::TaskState::Completed as i32);
    hark.stop().await;
}

#[tokio::test]
async fn a_worker_killed_mid_round_leaves_the_task_to_the_other_worker() {
    let mut hark = Hark::start(
        vec![
            Step::call("current_time", serde_json::json!({})),
            Step::say("done despite the crash"),
        ],
        &[("HARK_TASK__LEASE", "2s")],
        &["w1"],
    )
    .await;
    // Round 2's answer waits until the first worker is dead.
    hark.llm.set_script(
        "crash",
        Script::new(vec![
            Step::call("current_time", serde_json::json!({})),
            Step::say("done despite the crash"),
        ]),
    );
    hark.llm.hold_step("crash", 1);
    let short = hark.new_task("survive [script:crash]").await;
    hark.llm
        .wait_for(WAIT, |b| {
            b["messages"].as_array().is_some_and(|m| m.len() > 3)
        })
        .await
        .expect("round 2 is in flight");
    hark.workers[0].kill().await;
    hark.llm.release("crash");
    hark.workers
        .push(hark.env.spawn(&["worker", "--id", "w2"], &[]));
    let done = hark
        .bot
        .expect("the final answer", WAIT, |s| {
            s.text.contains("done despite")
        })
        .await;
    assert!(done.text.contains(&short));
    let task = hark.task(&short).await;
    assert_eq!(task.state, pb::TaskState::Completed as i32);
    assert_eq!(task.attempt, 2, "the second worker ran the second attempt");
    hark.stop().await;
}

#[tokio::test]
async fn cancelling_a_waiting_task_ends_it_and_a_late_answer_is_told_so() {
    let mut hark = Hark::start(
        vec![Step::ask("Proceed?"), Step::say("went ahead")],
        &[],
        &["w1", "w2"],
    )
    .await;
    let short = hark.new_task("risky thing").await;
    let question = hark
        .bot
        .expect("the question", WAIT, |s| s.text.contains("Proceed?"))
        .await;
    hark.say(OWNER, &format!("/task cancel {short}")).await;
    hark.bot
        .expect("the cancellation", WAIT, |s| s.text.contains("cancelled"))
        .await;
    assert_eq!(
        hark.task(&short).await.state,
        pb::TaskState::Cancelled as i32
    );
    hark.say(OWNER, &format!("#{} yes", handle_of(&question.text)))
        .await;
    let late = hark
        .bot
        .expect("the reply to a late answer", WAIT, |s| {
            s.text.contains("closed")
        })
        .await;
    assert!(late.text.contains("cancelled"), "{}", late.text);
    let posted = hark.bot.drain(Duration::from_secs(2)).await;
    assert!(
        posted.iter().all(|s| !s.text.contains("went ahead")),
        "{posted:?}"
    );
    hark.stop().await;
}

#[tokio::test]
async fn an_unanswered_question_expires_and_the_task_goes_on_by_default() {
    let mut hark = Hark::start(
        vec![Step::ask("Anyone?"), Step::say("Went on: {answer}")],
        &[("HARK_TASK__ASK_TIMEOUT", "2s")],
        &["w1", "w2"],
    )
    .await;
    hark.new_task("wait a little").await;
    hark.bot
        .expect("the question", WAIT, |s| s.text.contains("Anyone?"))
        .await;
    hark.bot
        .expect("the expiry note", WAIT, |s| {
            s.text.contains("no answer within 2s")
        })
        .await;
    let done = hark
        .bot
        .expect("the final answer", WAIT, |s| s.text.contains("Went on:"))
        .await;
    assert!(
        done.text.contains("No answer came within 2s"),
        "{}",
        done.text
    );
    hark.stop().await;
}

#[tokio::test]
async fn two_open_questions_are_answered_by_quote_and_by_handle() {
    let mut hark = Hark::start(
        vec![Step::ask("Your pick?"), Step::say("Got {answer}.")],
        &[],
        &["w1", "w2"],
    )
    .await;
    let first = hark.new_task("first errand").await;
    let q1 = hark
        .bot
        .expect("the first question", WAIT, |s| {
            s.text.contains("Your pick?") && s.text.contains(&first)
        })
        .await;
    let second = hark.new_task("second errand").await;
    let q2 = hark
        .bot
        .expect("the second question", WAIT, |s| {
            s.text.contains("Your pick?") && s.text.contains(&second)
        })
        .await;
    // A quote finds a question once the gateway's delivery receipt named its message.
    let mut api = hark.env.client().await;
    for attempt in 0.. {
        let questions = api
            .list_questions(pb::ListQuestionsRequest {
                owner: format!("qq:{OWNER}"),
                ..Default::default()
            })
            .await
            .expect("questions")
            .into_inner()
            .questions;
        if questions
            .iter()
            .any(|q| q.chat_message_id == q2.message_id.to_string())
        {
            break;
        }
        assert!(
            attempt < 200,
            "the delivery receipt of the second question never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    hark.bot
        .group_message_quoting(GROUP, OWNER, "B", Some(q2.message_id))
        .await;
    let ack = hark
        .bot
        .expect("the first acknowledgement", WAIT, |s| {
            s.text.contains("continues")
        })
        .await;
    assert!(
        ack.text.contains(&second),
        "the quote picked the second task: {}",
        ack.text
    );
    assert!(ack.text.contains("1 more question"), "{}", ack.text);
    hark.bot
        .expect("the second task's result", WAIT, |s| {
            s.text.contains("Got B.") && s.text.contains(&second)
        })
        .await;

    hark.say(OWNER, &format!("#{} A", handle_of(&q1.text)))
        .await;
    let ack = hark
        .bot
        .expect("the second acknowledgement", WAIT, |s| {
            s.text.contains("continues")
        })
        .await;
    assert!(ack.text.contains(&first), "{}", ack.text);
    hark.bot
        .expect("the first task's result", WAIT, |s| {
            s.text.contains("Got A.") && s.text.contains(&first)
        })
        .await;
    hark.stop().await;
}

#[tokio::test]
async fn a_task_created_over_grpc_without_a_chat_is_watched_and_answered_over_grpc() {
    let hark = Hark::start(
        vec![
            Step::ask("Tea or coffee?"),
            Step::say("One {answer}, coming up."),
        ],
        &[],
        &["w1", "w2"],
    )
    .await;
    let mut api = hark.env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:dana", "make a drink").await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut states = Vec::new();
    loop {
        let event = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("an event in time")
            .expect("stream ok")
            .expect("the stream goes on until the task ends");
        states.push(event.state);
        if event.state == pb::TaskState::WaitingInput as i32 {
            break;
        }
    }
    let questions = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:dana".into(),
            ..Default::default()
        })
        .await
        .expect("questions")
        .into_inner()
        .questions;
    assert_eq!(questions.len(), 1);
    assert_eq!(questions[0].text, "Tea or coffee?");
    api.answer_question(pb::AnswerQuestionRequest {
        question_id: questions[0].id.clone(),
        answer: "tea".into(),
        ..Default::default()
    })
    .await
    .expect("answered");
    while let Some(event) = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("in time")
        .expect("ok")
    {
        states.push(event.state);
    }
    assert_eq!(
        states.last(),
        Some(&(pb::TaskState::Completed as i32)),
        "{states:?}"
    );
    let done = api
        .get_task(pb::GetTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("get")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(done.result, "One tea, coming up.");
    hark.stop().await;
}

#[tokio::test]
async fn open_watches_end_with_a_word_to_watch_again_and_never_hold_a_stop_up() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:frank", "never picked up").await;
    let mut one = api
        .watch_task(pb::WatchTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    one.message().await.expect("ok").expect("the current state");
    let mut many = api
        .watch_tasks(pb::WatchTasksRequest::default())
        .await
        .expect("watch")
        .into_inner();

    // Both streams are open on a task nobody runs; SIGTERM still stops task-control.
    let status = control
        .stop()
        .await
        .expect("task-control stops with streams open");
    assert!(status.success(), "{status:?}");
    for result in [one.message().await, many.message().await.map(|_| None)] {
        let err = result.expect_err("the stream ends with a status");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        assert!(err.message().contains("watch again"), "{err}");
    }
    env.cleanup().await;
}
