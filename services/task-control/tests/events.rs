//! What clients that wait on people see over the API: events that carry what changed, an answer
//! that waits for the next question or the end, and one stream of many tasks' events that a
//! resume token continues.

mod common;

use std::time::Duration;

use common::control::TestControl;
use futures_util::StreamExt;
use hark_core::{bus::ControlOp, codec};
use hark_proto::v1 as pb;
use tonic::{Code, Streaming};

const WAIT: Duration = Duration::from_secs(20);

async fn create(tc: &TestControl, owner: &str, goal: &str) -> pb::Task {
    tc.client()
        .await
        .create_task(pb::CreateTaskRequest {
            owner: owner.into(),
            goal: goal.into(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task")
}

async fn next_event(watch: &mut Streaming<pb::TaskEvent>) -> pb::TaskEvent {
    tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("ok")
}

async fn next_of_many(watch: &mut Streaming<pb::WatchTasksResponse>) -> pb::WatchTasksResponse {
    tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("ok")
}

fn answer(
    task: &str,
    text: &str,
    wait: pb::AnswerWait,
    timeout_ms: u32,
) -> pb::AnswerQuestionRequest {
    pb::AnswerQuestionRequest {
        task_id: task.into(),
        answer: text.into(),
        wait: wait as i32,
        wait_timeout_ms: timeout_ms,
        ..Default::default()
    }
}

#[tokio::test]
async fn events_carry_the_question_the_output_and_the_error() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = create(&tc, "api:alice", "pick a colour").await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = next_event(&mut watch).await;
    assert_eq!(first.owner, "api:alice");
    assert_eq!(first.state, pb::TaskState::Pending as i32);

    let (lease, handle) = tc.claim_and_ask("Red or blue?", 600).await;
    assert_eq!(
        next_event(&mut watch).await.state,
        pb::TaskState::Running as i32
    );
    let waiting = next_event(&mut watch).await;
    assert_eq!(waiting.state, pb::TaskState::WaitingInput as i32);
    assert_eq!(waiting.cause, "ask");
    let question = waiting.question.expect("the event carries its question");
    assert_eq!(question.text, "Red or blue?");
    assert_eq!(question.handle, handle);
    assert_eq!(question.task_id, task.id);
    assert!(question.deadline.is_some(), "it has a deadline");
    // The question is the one the API knows.
    let got = api
        .get_task(pb::GetTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        got.task.expect("task").open_question.expect("open").id,
        question.id
    );
    drop(lease);

    // A watch opened while the task waits starts with the question too.
    let mut late = api
        .watch_task(pb::WatchTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let now = next_event(&mut late).await;
    assert_eq!(now.cause, "current");
    assert_eq!(now.question.expect("question").id, question.id);
    drop(late);

    api.answer_question(answer(&task.id, "blue", pb::AnswerWait::None, 0))
        .await
        .expect("answered");
    let lease = tc.claim_next(&task.id).await;
    tc.complete(lease, "Blue it is.").await;
    let mut last = next_event(&mut watch).await;
    while last.state != pb::TaskState::Completed as i32 {
        assert!(last.question.is_none() && last.result.is_empty());
        last = next_event(&mut watch).await;
    }
    assert_eq!(last.result, "Blue it is.");
    assert!(!last.result_truncated);
    assert!(last.error.is_empty());

    // A failure carries its error; a cancel its reason.
    let failing = create(&tc, "api:alice", "fail").await;
    let lease = tc.claim_next(&failing.id).await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: failing.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(
        next_event(&mut watch).await.state,
        pb::TaskState::Running as i32
    );
    let failed: pb::ControlAck = tc
        .request(
            ControlOp::Fail,
            codec::encode(pb::FailRequest {
                lease: Some(lease),
                error: "the model gave up".into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(failed.refusal.is_none());
    let failed = next_event(&mut watch).await;
    assert_eq!(failed.state, pb::TaskState::Failed as i32);
    assert!(
        failed.error.contains("the model gave up"),
        "{}",
        failed.error
    );
    assert!(failed.result.is_empty());

    let cancelled = create(&tc, "api:alice", "cancel me").await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: cancelled.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    next_event(&mut watch).await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: cancelled.id.clone(),
        reason: "not needed".into(),
    })
    .await
    .expect("cancelled");
    let event = next_event(&mut watch).await;
    assert_eq!(event.state, pb::TaskState::Cancelled as i32);
    assert!(event.error.contains("not needed"), "{}", event.error);
    tc.stop().await;
}

#[tokio::test]
async fn an_answer_can_wait_for_the_next_question_or_the_end() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = create(&tc, "api:bob", "two questions").await;
    let (_lease, _) = tc.claim_and_ask("First?", 600).await;

    // The answer waits while a worker picks the task up again and asks the next question.
    let waiting = {
        let mut api = api.clone();
        let id = task.id.clone();
        tokio::spawn(async move {
            api.answer_question(answer(
                &id,
                "one",
                pb::AnswerWait::NextQuestionOrEnd,
                60_000,
            ))
            .await
        })
    };
    let lease = tc.claim_next(&task.id).await;
    assert!(
        !waiting.is_finished(),
        "the answer waits for the next question"
    );
    let asked = tc.ask(&lease, 2, "call-2", "Second?", 600).await;
    assert!(asked.refusal.is_none());
    let replied = waiting
        .await
        .expect("joined")
        .expect("answered")
        .into_inner();
    assert_eq!(replied.question.expect("answered").answer, "one");
    assert!(!replied.wait_timed_out);
    let next = replied.event.expect("the event it waited for");
    assert_eq!(next.state, pb::TaskState::WaitingInput as i32);
    let question = next.question.expect("the next question");
    assert_eq!(question.text, "Second?");
    assert_eq!(question.id, asked.question_id);

    // By question id, the answer waits for the end and brings the output.
    let waiting = {
        let mut api = api.clone();
        let id = asked.question_id.clone();
        tokio::spawn(async move {
            api.answer_question(pb::AnswerQuestionRequest {
                question_id: id,
                answer: "two".into(),
                wait: pb::AnswerWait::NextQuestionOrEnd as i32,
                ..Default::default()
            })
            .await
        })
    };
    let lease = tc.claim_next(&task.id).await;
    tc.complete(lease, "one and two").await;
    let replied = waiting
        .await
        .expect("joined")
        .expect("answered")
        .into_inner();
    let end = replied.event.expect("the end");
    assert_eq!(end.state, pb::TaskState::Completed as i32);
    assert_eq!(end.result, "one and two");

    // A wait that runs out still applied its answer.
    let slow = create(&tc, "api:bob", "slow").await;
    let (_lease, _) = tc.claim_and_ask("Now?", 600).await;
    let replied = api
        .answer_question(answer(
            &slow.id,
            "yes",
            pb::AnswerWait::NextQuestionOrEnd,
            300,
        ))
        .await
        .expect("answered")
        .into_inner();
    assert!(replied.wait_timed_out);
    assert!(replied.event.is_none());
    assert_eq!(
        replied.task.expect("task").state,
        pb::TaskState::Pending as i32
    );
    assert_eq!(replied.question.expect("question").answer, "yes");

    // A wait hark does not know is refused, naming the field.
    let err = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: slow.id.clone(),
            answer: "x".into(),
            wait: 7,
            ..Default::default()
        })
        .await
        .expect_err("an unknown wait");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("wait"), "{}", err.message());
    tc.stop().await;
}

#[tokio::test]
async fn one_stream_watches_many_tasks_filtered_and_resumes_where_it_left_off() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let watch_all = |owner: &str, states: Vec<pb::TaskState>, ids: Vec<String>, token: &str| {
        pb::WatchTasksRequest {
            owner: owner.into(),
            states: states.into_iter().map(|s| s as i32).collect(),
            task_ids: ids,
            resume_token: token.into(),
        }
    };
    let mut everything = api
        .watch_tasks(watch_all("", vec![], vec![], ""))
        .await
        .expect("watch")
        .into_inner();
    let mut carol = api
        .watch_tasks(watch_all("api:carol", vec![], vec![], ""))
        .await
        .expect("watch")
        .into_inner();
    let mut waiting = api
        .watch_tasks(watch_all("", vec![pb::TaskState::WaitingInput], vec![], ""))
        .await
        .expect("watch")
        .into_inner();

    let a = create(&tc, "api:carol", "a").await;
    let first = next_of_many(&mut everything).await;
    let b = create(&tc, "api:dave", "b").await;
    assert_eq!(first.event.as_ref().expect("event").task_id, a.id);
    let second = next_of_many(&mut everything).await;
    assert_eq!(second.event.as_ref().expect("event").task_id, b.id);
    // Opened once b's creation is in the stream: it sees only what b does next.
    let mut by_ids = api
        .watch_tasks(watch_all("", vec![], vec![b.id.clone()], ""))
        .await
        .expect("watch")
        .into_inner();

    let from_carol = next_of_many(&mut carol).await;
    assert_eq!(from_carol.event.expect("event").task_id, a.id);

    // a asks: the waiting stream sees only that; b's stream sees only b.
    let lease = tc.claim_next(&a.id).await;
    let asked = tc.ask(&lease, 1, "c1", "a?", 600).await;
    assert!(asked.refusal.is_none());
    let seen = next_of_many(&mut waiting).await.event.expect("event");
    assert_eq!(seen.task_id, a.id);
    assert_eq!(seen.question.expect("question").text, "a?");
    let lease_b = tc.claim_next(&b.id).await;
    tc.complete(lease_b, "b done").await;
    let b_events: Vec<i32> = vec![
        next_of_many(&mut by_ids).await.event.expect("event").state,
        next_of_many(&mut by_ids).await.event.expect("event").state,
    ];
    assert_eq!(
        b_events,
        [
            pb::TaskState::Running as i32,
            pb::TaskState::Completed as i32
        ]
    );

    // Every event after `second`, read straight on and read again from its token, are the same.
    let mut straight = Vec::new();
    for _ in 0..4 {
        let next = next_of_many(&mut everything).await;
        let event = next.event.expect("event");
        // Read your writes: the task read after its event is at least there.
        let row = api
            .get_task(pb::GetTaskRequest {
                task_id: event.task_id.clone(),
            })
            .await
            .expect("get")
            .into_inner()
            .task
            .expect("task");
        assert!(row.generation >= event.generation);
        straight.push((event.task_id, event.generation));
    }
    drop(everything);
    let mut resumed = api
        .watch_tasks(watch_all("", vec![], vec![], &second.resume_token))
        .await
        .expect("resume")
        .into_inner();
    let mut again = Vec::new();
    for _ in 0..4 {
        let event = next_of_many(&mut resumed).await.event.expect("event");
        again.push((event.task_id, event.generation));
    }
    assert_eq!(
        again, straight,
        "a resumed stream misses and repeats nothing"
    );

    // Tokens hark did not give, or whose events are gone, are refused with what to do.
    let err = api
        .watch_tasks(watch_all("", vec![], vec![], "not-a-token"))
        .await
        .expect_err("bad token");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("resume_token"), "{}", err.message());
    let err = api
        .watch_tasks(watch_all("", vec![], vec![], "1.10.3"))
        .await
        .expect_err("another stream's token");
    assert_eq!(err.code(), Code::OutOfRange);
    assert!(
        err.message().contains("list the tasks again"),
        "{}",
        err.message()
    );
    let err = api
        .watch_tasks(watch_all("", vec![], vec!["nope".into()], ""))
        .await
        .expect_err("bad id");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("task_ids"), "{}", err.message());

    // A stream whose client left gives its place back.
    drop((carol, waiting, by_ids, resumed));
    tc.eventually("the streams are forgotten", || async {
        tc.watchers.count() == 0
    })
    .await;
    tc.stop().await;
}

#[tokio::test]
async fn many_streams_of_many_tasks_share_one_consumer_and_give_nats_its_memory_back() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let consumers = |tc: &TestControl| {
        let (js, name) = (tc.js.clone(), tc.names.task_events_stream());
        async move {
            js.get_stream(name)
                .await
                .expect("the event stream")
                .info()
                .await
                .expect("info")
                .state
                .consumer_count
        }
    };
    let mut streams = Vec::new();
    for _ in 0..200 {
        streams.push(
            api.watch_tasks(pb::WatchTasksRequest::default())
                .await
                .expect("watch")
                .into_inner(),
        );
    }
    // The process's one feed, however many streams there are.
    assert_eq!(consumers(&tc).await, 1);
    let task = create(&tc, "api:erin", "for everyone").await;
    for stream in &mut streams {
        let seen = next_of_many(stream).await.event.expect("event");
        assert_eq!(seen.task_id, task.id);
    }
    // A stream that resumes reads what it missed with a consumer of its own, then joins the
    // feed; the consumer is gone once it caught up.
    let token = {
        let mut first = api
            .watch_tasks(pb::WatchTasksRequest::default())
            .await
            .expect("watch")
            .into_inner();
        let other = create(&tc, "api:erin", "missed").await;
        let seen = next_of_many(&mut first).await;
        assert_eq!(seen.event.expect("event").task_id, other.id);
        seen.resume_token
    };
    let later = create(&tc, "api:erin", "after the token").await;
    let mut resumed = api
        .watch_tasks(pb::WatchTasksRequest {
            resume_token: token,
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    assert_eq!(
        next_of_many(&mut resumed)
            .await
            .event
            .expect("event")
            .task_id,
        later.id
    );
    let live = create(&tc, "api:erin", "live").await;
    assert_eq!(
        next_of_many(&mut resumed)
            .await
            .event
            .expect("event")
            .task_id,
        live.id
    );
    drop(streams);
    drop(resumed);
    tc.eventually("nats forgets the catching-up consumer", || async {
        consumers(&tc).await == 1
    })
    .await;
    tc.stop().await;
}

/// The next event of `watch` with `cause`, passing over the others.
async fn next_with_cause(
    watch: &mut Streaming<pb::WatchTasksResponse>,
    cause: &str,
) -> pb::TaskEvent {
    loop {
        let event = next_of_many(watch).await.event.expect("event");
        if event.cause == cause {
            return event;
        }
    }
}

/// A question whose chat message was never delivered: the task's watchers are told why, though
/// the task did not move; one stream is told once.
#[tokio::test]
async fn watchers_learn_that_a_question_never_reached_its_chat() {
    let tc = TestControl::start().await;
    let id = tc
        .new_task_in_chat(common::control::GROUP, "100", "book a table")
        .await;
    tc.claim_and_ask("Which evening?", 0).await;
    let shown = tc.out_containing("Which evening?").await;
    let mut api = tc.client().await;
    let mut many = api
        .watch_tasks(pb::WatchTasksRequest {
            task_ids: vec![id.clone()],
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut one = api
        .watch_task(pb::WatchTaskRequest {
            task_id: id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let current = next_event(&mut one).await;
    assert_eq!(current.state, pb::TaskState::WaitingInput as i32);
    assert!(current.question.expect("question").undelivered.is_empty());

    let reason = "myapp:main could not send it (attempt 1): the group is gone";
    tc.undelivered(&shown, reason).await;
    let told = next_with_cause(&mut many, "undelivered").await;
    assert_eq!(told.task_id, id);
    assert_eq!(told.state, pb::TaskState::WaitingInput as i32);
    assert_eq!(told.generation, current.generation, "not a move");
    assert_eq!(told.question.expect("question").undelivered, reason);
    let told_one = next_event(&mut one).await;
    assert_eq!(told_one.cause, "undelivered");
    assert_eq!(told_one.question.expect("question").undelivered, reason);

    // The same report again, as a redelivered receipt would be: told no second time.
    tc.undelivered(&shown, reason).await;
    tc.eventually("the question still says why", || async {
        let questions = tc
            .client()
            .await
            .get_task(pb::GetTaskRequest {
                task_id: id.clone(),
            })
            .await
            .expect("get task")
            .into_inner()
            .questions;
        questions.first().is_some_and(|q| q.undelivered == reason)
    })
    .await;
    // Then the task moves: that is the next thing each stream says.
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: id.clone(),
            answer: "Friday".into(),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    assert!(answered.task.is_some());
    let next = next_of_many(&mut many).await.event.expect("event");
    assert_eq!(next.cause, "answer", "{next:?}");
    assert!(next.generation > current.generation);
    let next_one = next_event(&mut one).await;
    assert!(next_one.generation > current.generation, "{next_one:?}");
    tc.stop().await;
}
