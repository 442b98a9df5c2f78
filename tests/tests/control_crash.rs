//! task-control killed at the worst instant: after an answer committed, before its run job was
//! published (started again, it publishes the job exactly once); after a questionnaire was
//! created waiting on its first question, and after a questionnaire's answer and next step
//! committed together (nothing is lost or taken twice); and after a schedule's run created its
//! task, before the schedule moved on (the run starts one task).

use std::time::Duration;

use hark_e2e::{Env, claim, fetch};
use hark_proto::v1 as pb;

#[tokio::test]
async fn killing_task_control_between_an_answers_commit_and_its_publish_loses_nothing_and_duplicates_nothing()
 {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "answer.after_commit")]);
    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:carol", "choose a date").await;

    // Play the worker: claim the task and ask.
    let jobs = env.jobs().await;
    let start: Vec<pb::RunJob> = fetch(&jobs, 1, Duration::from_secs(10)).await;
    assert_eq!(start.len(), 1);
    let claimed = claim(&env, &start[0], "w1").await;
    let asked = hark_e2e::ask(&env, claimed.lease).await;
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

#[tokio::test]
async fn a_questionnaire_is_created_asking_in_one_commit_so_a_crash_right_after_loses_and_repeats_nothing()
 {
    let env = Env::new().await;
    let mut control = env.spawn(
        &["control"],
        &[("HARK_FAILPOINT", "form_create.after_commit")],
    );
    let mut api = env.client().await;
    let request = pb::CreateTaskRequest {
        owner: "api:carol".into(),
        request_id: "form-1".into(),
        questionnaire: vec![pb::FormQuestion {
            key: "day".into(),
            text: "Which day?".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    // The task, its first question and its audit commit together, and task-control dies before
    // it replies or publishes anything.
    let created = api.create_task(request.clone()).await;
    assert!(created.is_err(), "the process must die before it replies");
    assert!(
        !control
            .exited_within(Duration::from_secs(10))
            .await
            .expect("control died")
            .success()
    );

    // Started again: the client's retry with its request id finds the task, waiting on its
    // first question, asked once; no run job was ever queued, and no worker is needed.
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let task = api
        .create_task(request)
        .await
        .expect("the retry gets the task created")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(task.state, pb::TaskState::WaitingInput as i32);
    let question = hark_e2e::open_question_besides(&api, &task.id, None).await;
    assert_eq!(question.text, "Which day?");
    let jobs = env.jobs().await;
    let queued: Vec<pb::RunJob> = fetch(&jobs, 10, Duration::from_millis(500)).await;
    assert!(queued.is_empty(), "no run job: {queued:?}");
    let counts = env
        .sql(&format!(
            "SELECT (SELECT count(*) FROM tasks WHERE owner = 'api:carol') || ',' ||
                    (SELECT count(*) FROM questions WHERE task_id = '{0}') || ',' ||
                    (SELECT string_agg(event || ':' || actor, ',' ORDER BY id) FROM transitions
                      WHERE task_id = '{0}')",
            task.id
        ))
        .await;
    assert_eq!(
        counts,
        "1,1,create:api:carol,claim:task-control,ask:task-control"
    );

    // The answer completes it, with no worker running.
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
    assert_eq!(
        replied.event.expect("the end").result,
        r#"{"day":"Friday"}"#
    );
    control.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_questionnaire_answer_commits_with_its_next_step_so_a_crash_right_after_loses_and_repeats_nothing()
 {
    use hark_worker::scripted::{Script, ScriptedLlm, Step};
    let llm = ScriptedLlm::with_default(Script::new(vec![Step::say("the model was called")]))
        .await
        .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    let mut control = env.spawn(
        &["control"],
        &[("HARK_FAILPOINT", "form_answer.after_commit")],
    );
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut api = env.client().await;
    let task = hark_e2e::new_questionnaire(
        &mut api,
        "api:carol",
        &[("day", "Which day?"), ("time", "What time?")],
        Default::default(),
    )
    .await;
    let first = hark_e2e::open_question_besides(&api, &task.id, None).await;
    assert_eq!(first.text, "Which day?");

    // The answer and the next question commit together, and task-control dies before it
    // replies or publishes anything.
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "Friday".into(),
            ..Default::default()
        })
        .await;
    assert!(answered.is_err(), "the process must die before it replies");
    assert!(
        !control
            .exited_within(Duration::from_secs(10))
            .await
            .expect("control died")
            .success()
    );

    // Started again: the second question was asked by the same statement.
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let second = hark_e2e::open_question_besides(&api, &task.id, Some(&first.id)).await;
    assert_eq!(second.text, "What time?");
    let replied = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "noon".into(),
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    let end = replied.event.expect("the end");
    assert_eq!(end.result, r#"{"day":"Friday","time":"noon"}"#);

    // Each move was taken once: two asks, one claim after each answer, one finish.
    let events = env
        .sql(&format!(
            "SELECT string_agg(event, ',' ORDER BY id) FROM transitions WHERE task_id = '{}'",
            task.id
        ))
        .await;
    assert_eq!(
        events,
        "create,claim,ask,answer,claim,ask,answer,claim,finish"
    );
    let claimers = env
        .sql(&format!(
            "SELECT string_agg(actor, ',' ORDER BY id) FROM transitions WHERE task_id = '{}' AND event = 'claim'",
            task.id
        ))
        .await;
    assert_eq!(
        claimers, "task-control,task-control,task-control",
        "the creation, and after each answer its own statement, took the step"
    );
    assert!(llm.requests().is_empty(), "no model was called");
    worker.stop().await;
    control.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn killing_task_control_after_a_scheduled_run_started_its_task_starts_it_once() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "schedule.after_task")]);
    let mut api = env.client().await;
    // Soon, but not so soon that a loaded machine delivers the request after it (a start in
    // the past is refused).
    let soon = std::time::SystemTime::now() + Duration::from_secs(3);
    let at = soon
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let made = api
        .create_task(pb::CreateTaskRequest {
            owner: "api:dora".into(),
            goal: "the reminder to water the plants".into(),
            start_at: Some(prost_types::Timestamp {
                seconds: at.as_secs() as i64,
                nanos: at.subsec_nanos() as i32,
            }),
            ..Default::default()
        })
        .await
        .expect("scheduled")
        .into_inner()
        .schedule
        .expect("a schedule");

    // The run creates its task, and task-control dies before the schedule records the run.
    assert!(
        !control
            .exited_within(Duration::from_secs(30))
            .await
            .expect("control died at the failpoint")
            .success()
    );
    let count = format!(
        "SELECT count(*) FROM tasks WHERE schedule_id = '{}'",
        made.id
    );
    assert_eq!(env.sql(&count).await, "1", "the run's task was created");
    assert_eq!(
        env.sql(&format!(
            "SELECT state || ',' || runs FROM schedules WHERE id = '{}'",
            made.id
        ))
        .await,
        "active,0",
        "the schedule had not moved on"
    );

    // Started again, the timer takes the same run and finds the task it started.
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let listed = api
                .list_schedules(pb::ListSchedulesRequest {
                    owner: "api:dora".into(),
                    include_ended: true,
                })
                .await
                .map(|r| r.into_inner().schedules);
            if let Ok(schedules) = listed
                && let Some(s) = schedules
                    .into_iter()
                    .find(|s| s.id == made.id && s.state == "done")
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the schedule's one run is recorded");
    assert_eq!(done.runs, 1);
    assert_eq!(env.sql(&count).await, "1", "no second task was started");
    let task = env
        .sql(&format!(
            "SELECT id FROM tasks WHERE schedule_id = '{}'",
            made.id
        ))
        .await;
    assert_eq!(done.last_task_id, task);
    control.stop().await;
    env.cleanup().await;
}
