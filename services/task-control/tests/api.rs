//! The gRPC API of task-control against the real Postgres and NATS.

mod common;

use std::time::Duration;

use common::{HeldStatistics, control::TestControl};
use futures_util::StreamExt;
use hark_core::{bus::ControlOp, codec};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use tonic::{Code, Request};

fn create(owner: &str, goal: &str) -> pb::CreateTaskRequest {
    pb::CreateTaskRequest {
        owner: owner.into(),
        goal: goal.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_task_without_a_chat_is_watched_and_answered_over_grpc() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = api
        .create_task(create("api:alice", "pick a colour"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(task.state, pb::TaskState::Pending as i32);
    assert!(task.chat.is_none());

    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.next().await.expect("an event").expect("ok");
    assert_eq!(first.state, pb::TaskState::Pending as i32);

    // A worker claims it and asks; with no chat the question is open for the API.
    let (lease, handle) = tc.claim_and_ask("Red or blue?", 0).await;
    let questions = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:alice".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .questions;
    assert_eq!(questions.len(), 1);
    assert_eq!(questions[0].handle, handle);
    assert_eq!(questions[0].outcome, pb::QuestionOutcome::Open as i32);

    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: questions[0].id.clone(),
            answer: "blue".into(),
            answerer: "api:alice".into(),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answered.question.expect("q").answer, "blue");
    drop(lease);

    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    assert_eq!(claimed.resume.expect("resume").text, "blue");
    let done: pb::ControlAck = tc
        .request(
            ControlOp::Complete,
            codec::encode(pb::CompleteRequest {
                lease: claimed.lease,
                result: "Blue it is.".into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(done.refusal.is_none());

    // The watch saw every change and closes after the terminal one.
    let mut states = vec![first.state];
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch ends in time")
    {
        states.push(event.expect("ok").state);
    }
    use pb::TaskState as S;
    assert_eq!(
        states,
        [
            S::Pending,
            S::Running,
            S::WaitingInput,
            S::Pending,
            S::Running,
            S::Completed
        ]
        .map(|s| s as i32)
    );
    let got = api
        .get_task(pb::GetTaskRequest {
            task_id: task.id[..8].into(),
        })
        .await
        .expect("get by prefix")
        .into_inner();
    assert_eq!(got.task.expect("task").result, "Blue it is.");
    assert_eq!(got.questions.len(), 1);
    tc.stop().await;
}

#[tokio::test]
async fn errors_carry_the_right_code_and_name_what_was_wrong() {
    let tc =
        TestControl::start_with(|c| c.permission.default_role = hark_core::domain::Role::Guest)
            .await;
    let mut api = tc.client().await;

    let err = api
        .get_task(pb::GetTaskRequest {
            task_id: "zz".into(),
        })
        .await
        .expect_err("bad id");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("task_id"), "{}", err.message());

    let err = api
        .get_task(pb::GetTaskRequest {
            task_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound);

    let err = api
        .create_task(create("qq:5", "x"))
        .await
        .expect_err("guest");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = api
        .create_task(create("nobody", "x"))
        .await
        .expect_err("bad owner");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("owner"));
    let err = api
        .create_task(create("qq:1", "  "))
        .await
        .expect_err("empty goal");
    assert!(err.message().contains("goal"));
    let err = api
        .create_task(create("qq:1", "a goal\0with a NUL"))
        .await
        .expect_err("NUL in the goal");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("goal") && err.message().contains("NUL"),
        "{}",
        err.message()
    );
    let mut bad_chat = create("qq:1", "g");
    bad_chat.chat = Some(pb::ChatRoute {
        platform: "qq".into(),
        bot_id: "4.2".into(),
        stream: "group:1".into(),
        origin_message_id: String::new(),
    });
    let err = api.create_task(bad_chat).await.expect_err("bad bot id");
    assert!(err.message().contains("chat.bot_id"), "{}", err.message());

    // qq:1 is an admin in the test config.
    let task = api
        .create_task(create("qq:1", "g"))
        .await
        .expect("admin creates")
        .into_inner()
        .task
        .expect("t");
    let (_, _) = tc.claim_and_ask("Sure?", 0).await;
    let open = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "qq:1".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .questions;
    let err = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: open[0].id.clone(),
            answer: "yes".into(),
            answerer: "qq:2".into(),
            ..Default::default()
        })
        .await
        .expect_err("not the owner");
    assert_eq!(err.code(), Code::PermissionDenied);

    api.cancel_task(pb::CancelTaskRequest {
        task_id: task.id.clone(),
        reason: String::new(),
    })
    .await
    .expect("cancelled");
    let err = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "yes".into(),
            ..Default::default()
        })
        .await
        .expect_err("no open question");
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: open[0].id.clone(),
            answer: "yes".into(),
            ..Default::default()
        })
        .await
        .expect_err("closed question");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("closed"), "{}", err.message());
    let err = api
        .tell_task(pb::TellTaskRequest {
            task_id: task.id.clone(),
            instruction: "hurry".into(),
            author: String::new(),
        })
        .await
        .expect_err("ended");
    assert_eq!(err.code(), Code::FailedPrecondition);
    tc.stop().await;
}

#[tokio::test]
async fn with_api_tokens_set_only_a_caller_with_one_gets_in() {
    let tc = TestControl::start_with(|c| c.control.api_tokens = vec!["s3cret".into()]).await;
    let mut api = tc.client().await;
    let err = api
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(err.code(), Code::Unauthenticated);

    let mut wrong = Request::new(pb::ListTasksRequest::default());
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().expect("header"));
    assert_eq!(
        api.list_tasks(wrong).await.expect_err("wrong").code(),
        Code::Unauthenticated
    );

    let mut right = Request::new(pb::ListTasksRequest::default());
    right
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("header"));
    api.list_tasks(right)
        .await
        .expect("the right token is let in");

    // Guessing at speed: after the allowed failures, the address is refused, even with the
    // right token, until its window is over.
    for _ in 0..hark_core::secret::Failures::ALLOWED {
        let _ = api.list_tasks(pb::ListTasksRequest::default()).await;
    }
    let mut right = Request::new(pb::ListTasksRequest::default());
    right
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("header"));
    let err = api.list_tasks(right).await.expect_err("throttled");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("too many failed sign-ins"), "{err}");
    tc.stop().await;
}

#[tokio::test]
async fn health_reports_serving_and_tasks_page_newest_first() {
    let tc = TestControl::start().await;
    let channel = tonic::transport::Channel::from_shared(tc.grpc.clone())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "hark.v1.TaskService".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let mut api = TaskServiceClient::new(channel);
    let mut ids = Vec::new();
    for i in 0..5 {
        let task = api
            .create_task(create("api:bob", &format!("t{i}")))
            .await
            .expect("create");
        ids.push(task.into_inner().task.expect("t").id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = api
            .list_tasks(pb::ListTasksRequest {
                owner: "api:bob".into(),
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("page")
            .into_inner();
        seen.extend(page.tasks.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    ids.reverse();
    assert_eq!(seen, ids);
    tc.stop().await;
}

#[tokio::test]
async fn trace_context_follows_a_task_from_the_grpc_call_through_the_bus() {
    use hark_core::trace::{self, TraceContext};
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    // The caller's trace: its CreateTask call names it in the traceparent metadata.
    let caller = TraceContext::new_root();
    let mut request = Request::new(pb::CreateTaskRequest {
        owner: "qq:1".into(),
        goal: "count sheep".into(),
        chat: Some(pb::ChatRoute {
            platform: "qq".into(),
            bot_id: "42".into(),
            stream: "group:777".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    request.metadata_mut().insert(
        trace::HEADER,
        caller.to_string().parse().expect("metadata value"),
    );
    api.create_task(request).await.expect("created");
    let (job, context) = tc.next_job_traced().await;
    assert_eq!(
        context.map(|c| c.trace_id()),
        Some(caller.trace_id()),
        "the run job continues the caller's trace"
    );

    // The worker's steps continue the trace its job came in: the question it asks goes to the
    // chat in that trace.
    let worker = context.expect("traced").child();
    let handle = trace::scope(Some(worker), async {
        let claimed = tc.claim(&job, "w1").await;
        let lease = claimed.lease.expect("lease");
        tc.ask(&lease, 1, "call-1", "How many?", 0).await.handle
    })
    .await;
    let (question, context) = tc.next_out_traced().await;
    assert!(question.text.contains(&format!("#{handle}")));
    assert_eq!(context.map(|c| c.trace_id()), Some(caller.trace_id()));

    // An answer from the chat starts a trace of its own, which the resume job carries.
    let answerer = TraceContext::new_root();
    trace::scope(Some(answerer), tc.say("group:777", "1", "forty-two")).await;
    let (resume, context) = tc.next_job_traced().await;
    assert_eq!(resume.reason, pb::RunReason::ResumeReply as i32);
    assert_eq!(context.map(|c| c.trace_id()), Some(answerer.trace_id()));
    tc.stop().await;
}

/// Every string field of every request, with a value no field may take, is refused as an
/// invalid argument naming the field — never as an outage.
#[tokio::test]
async fn every_bad_string_field_is_an_invalid_argument_naming_its_field() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = api
        .create_task(create("api:alice", "hold on"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let id = task.id.clone();
    let nul = "bad\0value".to_owned();
    let huge = "x".repeat(2 * 1024 * 1024 - 64 * 1024);
    let mut checked = 0;
    for bad in [nul, huge] {
        let chat = |f: &dyn Fn(&mut pb::ChatRoute)| {
            let mut route = pb::ChatRoute {
                platform: "qq".into(),
                bot_id: "42".into(),
                stream: "group:1".into(),
                origin_message_id: "m1".into(),
            };
            f(&mut route);
            Some(route)
        };
        let calls: Vec<(&str, tonic::Status)> = vec![
            (
                "owner",
                api.create_task(create(&bad, "g")).await.unwrap_err(),
            ),
            (
                "goal",
                api.create_task(create("api:alice", &bad))
                    .await
                    .unwrap_err(),
            ),
            (
                "chat.platform",
                api.create_task(pb::CreateTaskRequest {
                    chat: chat(&|r| r.platform = bad.clone()),
                    ..create("api:alice", "g")
                })
                .await
                .unwrap_err(),
            ),
            (
                "chat.bot_id",
                api.create_task(pb::CreateTaskRequest {
                    chat: chat(&|r| r.bot_id = bad.clone()),
                    ..create("api:alice", "g")
                })
                .await
                .unwrap_err(),
            ),
            (
                "chat.stream",
                api.create_task(pb::CreateTaskRequest {
                    chat: chat(&|r| r.stream = bad.clone()),
                    ..create("api:alice", "g")
                })
                .await
                .unwrap_err(),
            ),
            (
                "chat.origin_message_id",
                api.create_task(pb::CreateTaskRequest {
                    chat: chat(&|r| r.origin_message_id = bad.clone()),
                    ..create("api:alice", "g")
                })
                .await
                .unwrap_err(),
            ),
            (
                "request_id",
                api.create_task(pb::CreateTaskRequest {
                    request_id: bad.clone(),
                    ..create("api:alice", "g")
                })
                .await
                .unwrap_err(),
            ),
            (
                "task_id",
                api.get_task(pb::GetTaskRequest {
                    task_id: bad.clone(),
                })
                .await
                .unwrap_err(),
            ),
            (
                "owner",
                api.list_tasks(pb::ListTasksRequest {
                    owner: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "platform",
                api.list_tasks(pb::ListTasksRequest {
                    platform: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "stream",
                api.list_tasks(pb::ListTasksRequest {
                    stream: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "page_token",
                api.list_tasks(pb::ListTasksRequest {
                    page_token: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "reason",
                api.cancel_task(pb::CancelTaskRequest {
                    task_id: id.clone(),
                    reason: bad.clone(),
                })
                .await
                .unwrap_err(),
            ),
            (
                "answer",
                api.answer_question(pb::AnswerQuestionRequest {
                    task_id: id.clone(),
                    answer: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "request_id",
                api.answer_question(pb::AnswerQuestionRequest {
                    task_id: id.clone(),
                    answer: "fine".into(),
                    request_id: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "answerer",
                api.answer_question(pb::AnswerQuestionRequest {
                    task_id: id.clone(),
                    answer: "fine".into(),
                    answerer: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "question_id",
                api.answer_question(pb::AnswerQuestionRequest {
                    question_id: bad.clone(),
                    answer: "fine".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "instruction",
                api.tell_task(pb::TellTaskRequest {
                    task_id: id.clone(),
                    instruction: bad.clone(),
                    author: String::new(),
                })
                .await
                .unwrap_err(),
            ),
            (
                "author",
                api.tell_task(pb::TellTaskRequest {
                    task_id: id.clone(),
                    instruction: "fine".into(),
                    author: bad.clone(),
                })
                .await
                .unwrap_err(),
            ),
            (
                "task_id",
                api.watch_task(pb::WatchTaskRequest {
                    task_id: bad.clone(),
                })
                .await
                .map(|_| ())
                .unwrap_err(),
            ),
            (
                "owner",
                api.list_questions(pb::ListQuestionsRequest {
                    owner: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "stream",
                api.list_questions(pb::ListQuestionsRequest {
                    stream: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
            (
                "platform",
                api.list_questions(pb::ListQuestionsRequest {
                    platform: bad.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
            ),
        ];
        for (field, status) in calls {
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{field}: {}",
                status.message()
            );
            assert!(
                status.message().starts_with(field),
                "the error names {field}: {}",
                status.message()
            );
            assert!(
                status.message().len() < 400,
                "the error does not echo the value: {} bytes",
                status.message().len()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 46);
    // The task is untouched by all of it.
    let now = api
        .get_task(pb::GetTaskRequest { task_id: id })
        .await
        .expect("get")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(now.state, pb::TaskState::Pending as i32);
    tc.stop().await;
}

/// `CreateTaskRequest` as a client could send it with its owner (field 1) as raw bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawCreateTask {
    #[prost(bytes = "vec", tag = "1")]
    owner: Vec<u8>,
}

#[tokio::test]
async fn a_request_that_is_not_valid_protobuf_is_an_invalid_argument() {
    let tc = TestControl::start().await;
    let channel = tonic::transport::Endpoint::from_shared(tc.grpc.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    // A string field whose bytes are not UTF-8.
    let status = grpc
        .unary::<_, pb::CreateTaskResponse, _>(
            Request::new(RawCreateTask {
                owner: vec![0xff, 0xfe],
            }),
            "/hark.v1.TaskService/CreateTask".parse().expect("path"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    tc.stop().await;
}

#[tokio::test]
async fn one_connection_and_one_token_hold_only_so_many_watchers() {
    let tc = TestControl::start_with(|c| {
        c.control.api_tokens = vec!["first-token".into(), "second-token".into()];
        c.control.max_watchers_per_connection = 2;
        c.control.max_watchers_per_token = 3;
    })
    .await;
    let mut created = Request::new(create("api:wendy", "stay pending"));
    created.metadata_mut().insert(
        "authorization",
        "Bearer first-token".parse().expect("header"),
    );
    let task = tc
        .client()
        .await
        .create_task(created)
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let watch = |token: &'static str| {
        let (tc_grpc, id) = (tc.grpc.clone(), task.id.clone());
        async move {
            let channel = tonic::transport::Channel::from_shared(tc_grpc)
                .expect("uri")
                .connect()
                .await
                .expect("connect");
            let mut api = TaskServiceClient::new(channel);
            let mut held = Vec::new();
            let mut refused = None;
            for _ in 0..3 {
                let mut request = Request::new(pb::WatchTaskRequest {
                    task_id: id.clone(),
                });
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {token}").parse().expect("header"),
                );
                match api.watch_task(request).await {
                    Ok(stream) => held.push(stream.into_inner()),
                    Err(status) => {
                        refused = Some(status);
                        break;
                    }
                }
            }
            (held, refused)
        }
    };
    // One connection: two, then refused, naming the key.
    let (first, refused) = watch("first-token").await;
    assert_eq!(first.len(), 2);
    let refused = refused.expect("the third on one connection");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("control.max_watchers_per_connection"),
        "{}",
        refused.message()
    );
    // Another connection of the same token: one more, then the token is full.
    let (second, refused) = watch("first-token").await;
    assert_eq!(second.len(), 1);
    assert!(
        refused
            .expect("the token is full")
            .message()
            .contains("control.max_watchers_per_token")
    );
    // Another token is not held back.
    let (other, _) = watch("second-token").await;
    assert_eq!(other.len(), 2);
    tc.stop().await;
}

#[tokio::test]
async fn a_watch_ends_when_its_client_leaves_and_watchers_are_capped() {
    let tc = TestControl::start_with(|c| c.control.max_watchers = 2).await;
    let mut api = tc.client().await;
    let task = api
        .create_task(create("api:wendy", "stay pending"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let watch = |api: &mut TaskServiceClient<tonic::transport::Channel>| {
        let mut api = api.clone();
        let id = task.id.clone();
        async move { api.watch_task(pb::WatchTaskRequest { task_id: id }).await }
    };
    let mut first = watch(&mut api).await.expect("first watch").into_inner();
    let second = watch(&mut api).await.expect("second watch").into_inner();
    assert_eq!(
        first.next().await.expect("current").expect("ok").state,
        pb::TaskState::Pending as i32
    );
    let refused = watch(&mut api).await.expect_err("over the cap");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("control.max_watchers"));

    // The client drops its stream; the task stays pending, with no event to notice it by, and
    // the watch still ends.
    drop(second);
    tc.eventually("the dropped watch is gone", || async {
        tc.watchers.count() == 1
    })
    .await;
    let mut third = watch(&mut api).await.expect("room again").into_inner();
    assert!(third.next().await.expect("current").is_ok());
    drop(first);
    drop(third);
    tc.eventually("every watch is gone", || async { tc.watchers.count() == 0 })
        .await;
    tc.stop().await;
}

#[tokio::test]
async fn a_retried_answer_gets_its_first_outcome_however_the_question_was_named() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = api
        .create_task(create("api:rita", "ask twice"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let (_, _) = tc.claim_and_ask("First?", 0).await;
    let by_task = |request_id: &str, answer: &str| pb::AnswerQuestionRequest {
        task_id: task.id.clone(),
        answer: answer.into(),
        request_id: request_id.into(),
        ..Default::default()
    };
    let first = api
        .answer_question(by_task("r-1", "yes"))
        .await
        .expect("answered")
        .into_inner();
    let first_question = first.question.expect("question");
    assert_eq!(first_question.answer, "yes");

    // The task moves on and asks again before the client's retry arrives.
    let job = tc.next_job().await;
    let claimed = tc.claim(&job, "w2").await;
    let asked = tc
        .ask(&claimed.lease.expect("lease"), 2, "call-2", "Second?", 0)
        .await;
    assert!(asked.refusal.is_none());

    // The retry, by task id with the same request id, gets the first outcome back and answers
    // nothing new.
    let retried = api
        .answer_question(by_task("r-1", "yes"))
        .await
        .expect("the retry succeeds")
        .into_inner();
    let again = retried.question.expect("question");
    assert_eq!(again.id, first_question.id);
    assert_eq!(again.answer, "yes");
    let open = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:rita".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .questions;
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].text, "Second?", "the second question is still open");

    // By question id the same holds.
    let retried = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: first_question.id.clone(),
            answer: "yes".into(),
            request_id: "r-1".into(),
            ..Default::default()
        })
        .await
        .expect("the retry by question id succeeds")
        .into_inner();
    assert_eq!(retried.question.expect("question").id, first_question.id);
    tc.stop().await;
}

#[tokio::test]
async fn a_schedule_is_made_listed_and_cancelled_over_grpc() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let made = api
        .create_task(pb::CreateTaskRequest {
            cron: "30 8 * * 1-5".into(),
            timezone: "Europe/Berlin".into(),
            ..create("api:alice", "the weekly digest")
        })
        .await
        .expect("scheduled")
        .into_inner();
    assert!(made.task.is_none(), "no task is created before its run");
    let schedule = made.schedule.expect("the schedule");
    assert_eq!(
        (
            schedule.cron.as_str(),
            schedule.timezone.as_str(),
            schedule.state.as_str()
        ),
        ("30 8 * * 1-5", "Europe/Berlin", "active")
    );
    let next = schedule.next_run_at.expect("its next run");
    assert!(next.seconds > time::OffsetDateTime::now_utc().unix_timestamp());

    for (request, field) in [
        (
            pb::CreateTaskRequest {
                cron: "0 9 * *".into(),
                ..create("api:alice", "x")
            },
            "cron",
        ),
        (
            pb::CreateTaskRequest {
                cron: "0 9 * * *".into(),
                timezone: "Mars/Olympus".into(),
                ..create("api:alice", "x")
            },
            "timezone",
        ),
        (
            pb::CreateTaskRequest {
                start_at: Some(prost_types::Timestamp {
                    seconds: 1_000_000_000,
                    nanos: 0,
                }),
                ..create("api:alice", "x")
            },
            "start_at",
        ),
    ] {
        let err = api.create_task(request).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{}", err.message());
    }

    let listed = api
        .list_schedules(pb::ListSchedulesRequest {
            owner: "api:alice".into(),
            include_ended: false,
        })
        .await
        .expect("listed")
        .into_inner()
        .schedules;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, schedule.id);

    let cancelled = api
        .cancel_schedule(pb::CancelScheduleRequest {
            schedule_id: schedule.id[..8].into(),
        })
        .await
        .expect("cancelled")
        .into_inner()
        .schedule
        .expect("schedule");
    assert_eq!(cancelled.state, "cancelled");
    assert!(cancelled.next_run_at.is_none());
    let again = api
        .cancel_schedule(pb::CancelScheduleRequest {
            schedule_id: schedule.id.clone(),
        })
        .await
        .expect_err("an ended schedule");
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    tc.stop().await;
}

#[tokio::test]
async fn a_request_id_belongs_to_its_owner_and_a_reuse_with_other_parameters_is_refused() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let with_key = |owner: &str, goal: &str| pb::CreateTaskRequest {
        request_id: "k-1".into(),
        ..create(owner, goal)
    };
    let alice = api
        .create_task(with_key("api:alice", "alice's plan"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    // Another owner's same key is another request: it never returns alice's task.
    let bob = api
        .create_task(with_key("api:bob", "bob's plan"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    assert_ne!(bob.id, alice.id);
    assert_eq!(bob.goal, "bob's plan");
    // A retry gets the same task back; the same key for another goal is refused, naming it.
    let retried = api
        .create_task(with_key("api:alice", "alice's plan"))
        .await
        .expect("a retry")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(retried.id, alice.id);
    let refused = api
        .create_task(with_key("api:alice", "something else"))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert!(refused.message().contains("k-1"), "{}", refused.message());

    // Answers: alice's key does not answer for bob, nor hand bob alice's answer.
    tc.claim_and_ask("Alice's question?", 0).await;
    tc.claim_and_ask("Bob's question?", 0).await;
    let answer = |task: &str, answerer: &str, text: &str| pb::AnswerQuestionRequest {
        task_id: task.into(),
        answer: text.into(),
        answerer: answerer.into(),
        request_id: "a-1".into(),
        ..Default::default()
    };
    let first = api
        .answer_question(answer(&alice.id, "api:alice", "for alice"))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(first.question.expect("question").answer, "for alice");
    let second = api
        .answer_question(answer(&bob.id, "api:bob", "for bob"))
        .await
        .expect("bob's own answer is applied")
        .into_inner();
    let bobs = second.question.expect("question");
    assert_eq!(bobs.answer, "for bob");
    assert_eq!(second.task.expect("task").id, bob.id);
    // Alice's key again, for another answer: refused, not silently dropped.
    let refused = api
        .answer_question(answer(&alice.id, "api:alice", "changed my mind"))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    tc.stop().await;
}

#[tokio::test]
async fn reflection_serves_the_public_api_and_not_the_workers_schema() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let tc = TestControl::start().await;
    let channel = tonic::transport::Endpoint::from_shared(tc.grpc.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut reflection = ServerReflectionClient::new(channel);
    let ask = |symbol: &str| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
    };
    let mut found = Vec::new();
    for symbol in [
        "hark.v1.TaskService",
        "hark.v1.Lease",
        "hark.v1.ClaimRequest",
    ] {
        let mut answers = reflection
            .server_reflection_info(tokio_stream::iter(vec![ask(symbol)]))
            .await
            .expect("reflection answers")
            .into_inner();
        let described = match answers.next().await {
            Some(Ok(answer)) => matches!(
                answer.message_response,
                Some(MessageResponse::FileDescriptorResponse(_))
            ),
            Some(Err(status)) => {
                assert_eq!(status.code(), Code::NotFound, "{symbol}: {status:?}");
                false
            }
            None => false,
        };
        found.push(described);
    }
    assert_eq!(
        found,
        vec![true, false, false],
        "only the public API is described"
    );
    tc.stop().await;
}

#[tokio::test]
async fn a_question_passed_on_over_grpc_is_answered_by_its_new_askee_only() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let task = api
        .create_task(create("api:alice", "pick a colour"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    tc.claim_and_ask("Red or blue?", 0).await;
    let question = tc
        .store
        .open_question_of(task.id.parse().expect("id"))
        .await
        .expect("read")
        .expect("open");
    let delegate = |to: &str, request_id: &str| pb::DelegateQuestionRequest {
        question_id: question.id.to_string(),
        to: to.into(),
        request_id: request_id.into(),
    };

    // No person, or the one already asked, is refused.
    let nobody = api
        .delegate_question(delegate("bob", ""))
        .await
        .expect_err("no platform");
    assert_eq!(nobody.code(), Code::InvalidArgument, "{nobody:?}");
    assert!(nobody.message().starts_with("to:"), "{}", nobody.message());
    let same = api
        .delegate_question(delegate("api:alice", ""))
        .await
        .expect_err("already asked");
    assert_eq!(same.code(), Code::FailedPrecondition, "{same:?}");

    let moved = api
        .delegate_question(delegate("api:bob", "pass-1"))
        .await
        .expect("passed on")
        .into_inner()
        .question
        .expect("question");
    assert_eq!(moved.owner, "api:bob");
    // The same request again: the same answer, nothing moved twice.
    let again = api
        .delegate_question(delegate("api:bob", "pass-1"))
        .await
        .expect("retried")
        .into_inner()
        .question
        .expect("question");
    assert_eq!(again.owner, "api:bob");
    let audit = tc
        .store
        .transitions_of(question.task_id)
        .await
        .expect("audit");
    assert_eq!(audit.iter().filter(|t| t.event == "delegate").count(), 1);

    // The one passed over cannot answer it, by question or by task; the new askee can.
    for (question_id, task_id) in [
        (question.id.to_string(), String::new()),
        (String::new(), task.id.clone()),
    ] {
        let refused = api
            .answer_question(pb::AnswerQuestionRequest {
                question_id,
                task_id,
                answer: "red".into(),
                answerer: "api:alice".into(),
                ..Default::default()
            })
            .await
            .expect_err("passed over");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "blue".into(),
            answerer: "api:bob".into(),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answered.question.expect("q").answerer, "api:bob");

    // A closed question is not passed on.
    let closed = api
        .delegate_question(delegate("api:carol", ""))
        .await
        .expect_err("closed");
    assert_eq!(closed.code(), Code::FailedPrecondition, "{closed:?}");
    assert!(closed.message().contains("closed"), "{}", closed.message());
    tc.stop().await;
}

#[tokio::test]
async fn a_task_created_with_a_deadline_ends_by_its_own_policy_and_a_bad_deadline_is_refused() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    for (deadline, why) in [
        (
            prost_types::Duration {
                seconds: 0,
                nanos: 0,
            },
            "more than 0s",
        ),
        (
            prost_types::Duration {
                seconds: -5,
                nanos: 0,
            },
            "positive",
        ),
        (
            prost_types::Duration {
                seconds: 400 * 86_400,
                nanos: 0,
            },
            "longer than the limit",
        ),
    ] {
        let refused = api
            .create_task(pb::CreateTaskRequest {
                deadline: Some(deadline),
                ..create("api:alice", "too soon")
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("deadline") && refused.message().contains(why),
            "{refused:?}"
        );
    }

    let task = api
        .create_task(pb::CreateTaskRequest {
            deadline: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            on_deadline: pb::DeadlinePolicy::Cancel as i32,
            ..create("api:alice", "pick a colour")
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let (_lease, _handle) = tc.claim_and_ask("Red or blue?", 0).await;
    // An hour on, as far as the task knows.
    let moved = sqlx::query(
        "UPDATE tasks SET deadline_at = deadline_at - interval '1 hour' WHERE id = $1::uuid",
    )
    .bind(&task.id)
    .execute(tc.store.pool())
    .await
    .expect("deadline moved");
    assert_eq!(moved.rows_affected(), 1);
    tc.eventually("the task is cancelled at its deadline", || {
        let mut api = api.clone();
        let id = task.id.clone();
        async move {
            let got = api
                .get_task(pb::GetTaskRequest { task_id: id })
                .await
                .expect("task")
                .into_inner()
                .task
                .expect("task");
            got.state == pb::TaskState::Cancelled as i32
        }
    })
    .await;
    let questions = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:alice".into(),
            include_closed: true,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .questions;
    assert_eq!(questions.len(), 1);
    assert_eq!(questions[0].outcome, pb::QuestionOutcome::Cancelled as i32);
    tc.stop().await;
}

#[tokio::test]
async fn an_owner_the_statistics_have_not_seen_gets_a_page_by_reading_one_page() {
    let tc = TestControl::start_with(|c| c.task.max_active_per_owner = 5_000).await;
    let api = tc.client().await;
    let create_all = |owners: Vec<String>, n: usize| questionnaires(&api, owners, n);
    // Statistics taken while 200 owners had 10 questions each waiting: an owner they have not
    // seen is estimated at a row or two.
    create_all((0..200).map(|i| format!("api:o{i}")).collect(), 10).await;
    let pool = tc.store.pool();
    // Neither Postgres nor task-control's upkeep may take them again during the test.
    let _held = HeldStatistics::of(pool, "questions").await;
    sqlx::query("ANALYZE questions")
        .execute(pool)
        .await
        .expect("analyzed");
    // Then one owner has more waiting than everyone else together.
    const WAITING: usize = 3_000;
    create_all(vec!["api:late".into()], WAITING).await;

    let mut conn = pool.acquire().await.expect("connection");
    let flush = "SELECT pg_stat_force_next_flush()";
    let read = "SELECT idx_tup_read FROM pg_stat_user_indexes
                WHERE indexrelname = 'questions_open_by_owner_id'";
    sqlx::query(flush).execute(&mut *conn).await.expect("flush");
    let before: i64 = sqlx::query_scalar(read)
        .fetch_one(&mut *conn)
        .await
        .expect("index stats");
    let page: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM open_questions_page('api:late', NULL, NULL, NULL, 50)")
            .fetch_all(&mut *conn)
            .await
            .expect("a page");
    sqlx::query(flush).execute(&mut *conn).await.expect("flush");
    let after: i64 = sqlx::query_scalar(read)
        .fetch_one(&mut *conn)
        .await
        .expect("index stats");
    assert_eq!(page.len(), 50);
    assert!(
        page.windows(2).all(|w| w[0] < w[1]),
        "the page is in id order"
    );
    assert!(
        after - before <= 51,
        "a page of 50 read {} index entries of the {WAITING} the owner has waiting",
        after - before
    );

    // The same page through the API, and the next one from its token.
    let mut api = tc.client().await;
    let first = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:late".into(),
            page_size: 50,
            ..Default::default()
        })
        .await
        .expect("first page")
        .into_inner();
    let ids: Vec<String> = first.questions.iter().map(|q| q.id.clone()).collect();
    let want: Vec<String> = page.iter().map(|id| id.to_string()).collect();
    assert_eq!(ids, want);
    let second = api
        .list_questions(pb::ListQuestionsRequest {
            owner: "api:late".into(),
            page_size: 50,
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .expect("second page")
        .into_inner();
    assert_eq!(second.questions.len(), 50);
    assert!(second.questions[0].id > ids[49]);
    tc.stop().await;
}

/// Statistics taken while no question was open make every index of open questions look empty.
/// A burst of asks into a table far larger than the burst is analyzed again by task-control's
/// upkeep, so that the planner sizes those indexes from what they hold.
#[tokio::test]
async fn a_burst_of_asks_after_the_statistics_saw_none_open_is_analyzed_and_answers_stay_cheap() {
    let tc = TestControl::start_with(|c| c.task.max_active_per_owner = 5_000).await;
    let api = tc.client().await;
    let owner = "api:busy";
    let create_all = |n: usize| questionnaires(&api, vec![owner.to_owned()], n);
    let list = |n: usize| {
        let mut api = api.clone();
        async move {
            let open = api
                .list_questions(pb::ListQuestionsRequest {
                    owner: owner.into(),
                    page_size: n as u32,
                    ..Default::default()
                })
                .await
                .expect("open questions")
                .into_inner()
                .questions;
            assert_eq!(open.len(), n);
            open
        }
    };
    let answer = |open: Vec<pb::Question>| {
        let api = api.clone();
        async move {
            futures_util::stream::iter(open)
                .map(|q| {
                    let mut api = api.clone();
                    async move {
                        api.answer_question(pb::AnswerQuestionRequest {
                            question_id: q.id,
                            answer: "done".into(),
                            answerer: owner.into(),
                            ..Default::default()
                        })
                        .await
                        .expect("answered")
                    }
                })
                .buffer_unordered(32)
                .count()
                .await
        }
    };
    let pool = tc.store.pool();
    // Only task-control's upkeep analyzes the table during the test, and only when let.
    let held = HeldStatistics::of(pool, "questions").await;
    // Every question asked so far is answered when the statistics are taken.
    const CLOSED: usize = 2_000;
    create_all(CLOSED).await;
    for _ in 0..CLOSED / 200 {
        // A page holds at most 200.
        answer(list(200).await).await;
    }
    // Vacuumed too, so that only what the asks change makes the upkeep act.
    sqlx::query("VACUUM (ANALYZE) questions")
        .execute(pool)
        .await
        .expect("vacuum and analyze");
    // The planner's estimate of the open questions: it sizes every index of them from it.
    let estimated = || async {
        let plan: serde_json::Value = sqlx::query_scalar(
            "EXPLAIN (FORMAT JSON) SELECT id FROM questions WHERE outcome = 'open'",
        )
        .fetch_one(pool)
        .await
        .expect("a plan");
        let rows = plan[0]["Plan"]["Plan Rows"].as_f64().unwrap_or_default();
        (rows, plan)
    };
    // Then fewer than a third as many wait as were answered, and the statistics say none does.
    const WAITING: usize = 600;
    create_all(WAITING).await;
    let (before, plan) = estimated().await;
    assert!(before < (WAITING / 2) as f64, "{plan}");
    held.release().await;
    // Once task-control's upkeep analyzed the table again, the planner sees them. (Autovacuum
    // stays off for the table.)
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (rows, plan) = estimated().await;
        if rows >= (WAITING / 2) as f64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a minute after {WAITING} asks, the planner still estimates {rows} open questions: \
             task-control's upkeep did not analyze questions again ({plan})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And an answer still works on the plans made from them.
    answer(list(20).await).await;
    tc.stop().await;
}

/// Creates `n` questionnaires of one question for each of `owners`, 32 at a time.
async fn questionnaires(
    api: &TaskServiceClient<tonic::transport::Channel>,
    owners: Vec<String>,
    n: usize,
) -> usize {
    futures_util::stream::iter(
        owners
            .into_iter()
            .flat_map(move |o| (0..n).map(move |i| (o.clone(), i))),
    )
    .map(|(owner, i)| {
        let mut api = api.clone();
        async move {
            api.create_task(pb::CreateTaskRequest {
                owner,
                questionnaire: vec![pb::FormQuestion {
                    key: "q".into(),
                    text: format!("Question {i}?"),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .expect("created")
        }
    })
    .buffer_unordered(32)
    .count()
    .await
}
