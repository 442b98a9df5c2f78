//! task-control killed at the worst instant: after an answer committed, before its run job was
//! published. Started again, it publishes the job exactly once.

use std::time::Duration;

use hark_core::{bus::ControlOp, codec};
use hark_e2e::{Env, claim, fetch};
use hark_proto::v1 as pb;

#[tokio::test]
async fn killing_task_control_between_an_answers_commit_and_its_publish_loses_nothing_and_duplicates_nothing()
 {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "answer.after_commit")]);
    let mut api = env.client().await;
    let task = api
        .create_task(pb::CreateTaskRequest {
            owner: "api:carol".into(),
            goal: "choose a date".into(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");

    // Play the worker: claim the task and ask.
    let jobs = env.jobs().await;
    let start: Vec<pb::RunJob> = fetch(&jobs, 1, Duration::from_secs(10)).await;
    assert_eq!(start.len(), 1);
    let claimed = claim(&env, &start[0], "w1").await;
    let messages = serde_json::json!([{"role": "assistant", "content": null, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "ask_user", "arguments": "{}"}}]}]);
    let asked: pb::AskResponse = env
        .request(
            ControlOp::Ask,
            codec::encode(pb::AskRequest {
                lease: claimed.lease,
                round: Some(pb::Round {
                    number: 1,
                    messages_json: serde_json::to_vec(&messages).expect("json"),
                    ..Default::default()
                }),
                tool_call_id: "call-1".into(),
                question: "Which day?".into(),
                ..Default::default()
            }),
        )
        .await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);

    // The answer commits, then the process dies before the relay publishes the run job.
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: asked.question_id.clone(),
            answer: "Friday".into(),
            request_id: "answer-1".into(),
            ..Default::default()
        })
        .await;
    assert!(answered.is_err(), "the process must die before it replies");
    let status = control
        .exited_within(Duration::from_secs(10))
        .await
        .expect("control died");
    assert!(!status.success());
    let before: Vec<pb::RunJob> = fetch(&jobs, 10, Duration::from_millis(500)).await;
    assert!(
        before.is_empty(),
        "no run job may have been published before the crash"
    );

    // Started again, task-control relays what the dead one committed.
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let resumed: Vec<pb::RunJob> = fetch(&jobs, 10, Duration::from_secs(10)).await;
    assert_eq!(resumed.len(), 1, "exactly one resume job");
    assert_eq!(resumed[0].reason, pb::RunReason::ResumeReply as i32);
    let later: Vec<pb::RunJob> = fetch(&jobs, 10, Duration::from_secs(2)).await;
    assert!(later.is_empty(), "no second resume job: {later:?}");

    // The answer survived, and the retried request changes nothing.
    let retried = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: asked.question_id.clone(),
            answer: "Friday".into(),
            request_id: "answer-1".into(),
            ..Default::default()
        })
        .await
        .expect("the retry is accepted as already applied")
        .into_inner();
    assert_eq!(retried.question.expect("q").answer, "Friday");
    let claimed = claim(&env, &resumed[0], "w2").await;
    assert_eq!(claimed.resume.expect("resume").text, "Friday");
    let got = api
        .get_task(pb::GetTaskRequest {
            task_id: task.id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.task.expect("task").state, pb::TaskState::Running as i32);

    control.stop().await;
    env.cleanup().await;
}
