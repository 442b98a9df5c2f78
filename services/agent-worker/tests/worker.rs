//! The agent loop end to end: real task-control, real workers, the scripted LLM over HTTP.

mod common;

use std::time::Duration;

use common::{Bed, tool_results};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Quirks, Script, ScriptedLlm, Step};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

async fn llm(steps: Vec<Step>) -> ScriptedLlm {
    ScriptedLlm::with_default(Script::new(steps))
        .await
        .expect("scripted LLM starts")
}

#[tokio::test]
async fn a_question_suspends_the_task_and_the_answer_resumes_it_to_the_end() {
    let llm = llm(vec![
        Step::ask("Which city?"),
        Step::say("Booked in {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "book a hotel", |_| {}).await;
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let question = waiting
        .task
        .expect("task")
        .open_question
        .expect("open question");
    assert_eq!(question.text, "Which city?");

    bed.answer(&id, "Lisbon").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Booked in Lisbon.");
    // The answer reached the model as the result of the ask_user call.
    let requests = bed.llm.requests();
    let last = &requests.last().expect("requests").body;
    assert_eq!(tool_results(last), ["Lisbon"]);
    let offered: Vec<&str> = last["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"ask_user"));
    bed.stop().await;
}

#[tokio::test]
async fn the_model_is_told_the_deadline_of_a_task_that_has_one() {
    let llm = llm(vec![Step::say("Done in time.")]).await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let timed = bed
        .create("api:alice", "book a hotel", |r| {
            r.deadline = Some(prost_types::Duration {
                seconds: 7200,
                nanos: 0,
            });
            r.on_deadline = pb::DeadlinePolicy::Cancel as i32;
        })
        .await;
    bed.wait_state(&timed, pb::TaskState::Completed, WAIT).await;
    let untimed = bed.create("api:alice", "book a flight", |_| {}).await;
    bed.wait_state(&untimed, pb::TaskState::Completed, WAIT)
        .await;
    let systems: Vec<String> = bed
        .llm
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(systems.len(), 2, "{systems:?}");
    // The first request is the timed task's: both ran on one worker, one after the other.
    assert!(
        systems[0].contains("This task has a deadline")
            && systems[0].contains("from now")
            && systems[0].contains("the task is cancelled"),
        "{}",
        systems[0]
    );
    assert!(!systems[1].contains("deadline"), "{}", systems[1]);
    bed.stop().await;
}

#[tokio::test]
async fn an_idle_worker_is_handed_the_answered_task_without_the_run_queue() {
    let llm = llm(vec![
        Step::ask("Which city?"),
        Step::say("Booked in {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    bed.polling(1, WAIT).await;
    let id = bed.create("api:alice", "book a hotel", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    // The run that asked has ended and its slot polls again.
    bed.polling(1, WAIT).await;
    let before = bed.run_queue_last_sequence().await;

    bed.answer(&id, "Lisbon").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Booked in Lisbon.");
    assert_eq!(
        bed.run_queue_last_sequence().await,
        before,
        "the resume did not go through the run queue"
    );
    bed.stop().await;
}

#[tokio::test]
async fn with_polling_off_every_run_job_goes_through_the_run_queue() {
    let llm = llm(vec![
        Step::ask("Which city?"),
        Step::say("Booked in {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |c| c.worker.poll = false).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "book a hotel", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let before = bed.run_queue_last_sequence().await;
    assert!(bed.parked.is_empty(), "nothing polls");

    bed.answer(&id, "Lisbon").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Booked in Lisbon.");
    assert_eq!(
        bed.run_queue_last_sequence().await,
        before + 1,
        "the resume was one job of the run queue"
    );
    bed.stop().await;
}

#[tokio::test]
async fn two_questions_in_a_row_are_each_answered() {
    let llm = llm(vec![
        Step::ask("First name?"),
        Step::ask("Last name?"),
        Step::say("Hello {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "greet me", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    bed.answer(&id, "Ada").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = loop {
        let t = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
        let q = t.task.expect("task").open_question.expect("question");
        if q.text == "Last name?" {
            break q;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(second.text, "Last name?");
    bed.answer(&id, "Lovelace").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Hello Lovelace.");
    assert_eq!(done.questions.len(), 2);
    let last = bed.llm.requests().last().expect("requests").body.clone();
    assert_eq!(tool_results(&last), ["Ada", "Lovelace"]);
    bed.stop().await;
}

#[tokio::test]
async fn the_expiry_notice_reaches_the_model_as_the_tool_result() {
    let llm = llm(vec![
        Step::ask("Anyone there?"),
        Step::say("Went on alone: {answer}"),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed
        .create("api:alice", "wait briefly", |r| r.ask_timeout_s = 1)
        .await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(
        result.starts_with("Went on alone: No answer came within 1s"),
        "{result}"
    );
    assert_eq!(
        done.questions[0].outcome,
        pb::QuestionOutcome::Expired as i32
    );
    bed.stop().await;
}

#[tokio::test]
async fn an_invalid_tool_call_becomes_an_error_result_and_the_task_goes_on() {
    let llm = llm(vec![
        Step::call("ask_user", json!({"qestion": "typo"})),
        Step::call("no_such_tool", json!({})),
        Step::call("worker_info", json!({})),
        Step::say("recovered"),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "be clumsy", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "recovered");
    let last = bed.llm.requests().last().expect("requests").body.clone();
    let results = tool_results(&last);
    assert_eq!(results.len(), 3);
    assert!(
        results[0].contains("`question` is required"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("no tool `no_such_tool`"),
        "{}",
        results[1]
    );
    assert!(
        results[2].contains("needs the role admin"),
        "a tool never runs above the owner's role: {}",
        results[2]
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_told_instruction_reaches_a_running_task_at_its_next_round() {
    let llm = llm(vec![
        Step::call("current_time", json!({})),
        Step::say("done"),
    ])
    .await;
    // The first round's answer waits until the instruction has reached the worker.
    llm.hold("default");
    let mut bed = Bed::start(llm, |c| c.task.lease = "3s".parse().expect("duration")).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "research slowly", |_| {}).await;
    bed.llm
        .wait_for(WAIT, |_| true)
        .await
        .expect("round 1 is in flight");
    let told = bed
        .client()
        .await
        .tell_task(pb::TellTaskRequest {
            task_id: id.clone(),
            instruction: "use metric units".into(),
            author: "api:alice".into(),
        })
        .await
        .expect("told")
        .into_inner();
    assert_eq!(
        told.delivery,
        pb::tell_task_response::Delivery::NextRound as i32
    );
    // Heartbeats hand instructions over; one after another renews the lease, and the second
    // of two renewals after the tell is sent only once the first one's instructions were taken.
    let lease_of = || async {
        sqlx::query_scalar::<_, Option<time::OffsetDateTime>>(
            "SELECT lease_until FROM tasks WHERE id = $1::uuid",
        )
        .bind(&id)
        .fetch_one(bed.store.pool())
        .await
        .expect("lease")
    };
    let mut seen = lease_of().await;
    for _ in 0..2 {
        loop {
            let now = lease_of().await;
            if now > seen {
                seen = now;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    bed.llm.release("default");
    bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let last = bed.llm.requests().last().expect("requests").body.clone();
    let said = last["messages"].to_string();
    assert!(
        said.contains("[instruction from api:alice] use metric units"),
        "{said}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn cancelling_during_an_llm_call_stops_the_worker_at_once_and_writes_nothing_more() {
    let llm = llm(vec![Step::say("too late")]).await;
    // The slow task's call never returns.
    llm.hold("default");
    let mut bed = Bed::start(llm, |c| c.worker.concurrency = 1).await;
    bed.add_worker("w1").await;
    let slow = bed.create("api:alice", "think forever", |_| {}).await;
    bed.llm
        .wait_for(WAIT, |_| true)
        .await
        .expect("the LLM call started");
    bed.client()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: slow.clone(),
            reason: "no longer needed".into(),
        })
        .await
        .expect("cancelled");
    let audit_len = bed
        .store
        .transitions_of(slow.parse().expect("id"))
        .await
        .expect("audit")
        .len();

    // The only slot is free again though the slow call never returned: a new task runs.
    bed.llm
        .set_script("quick", Script::new(vec![Step::say("quick")]));
    let quick = bed
        .create("api:alice", "[script:quick] be quick", |_| {})
        .await;
    bed.wait_state(&quick, pb::TaskState::Completed, WAIT).await;
    let after = bed
        .store
        .transitions_of(slow.parse().expect("id"))
        .await
        .expect("audit");
    assert_eq!(
        after.len(),
        audit_len,
        "nothing more was written for the cancelled task"
    );
    assert_eq!(after.last().expect("audit").to_state, "cancelled");
    bed.stop().await;
}

#[tokio::test]
async fn a_worker_killed_mid_round_leaves_the_task_to_another_worker_from_its_checkpoint() {
    let llm = llm(vec![
        Step::call("current_time", json!({})),
        Step::say("finished by someone"),
    ])
    .await;
    llm.hold_step("default", 1);
    let mut bed = Bed::start(llm, |c| {
        c.task.lease = "1s".parse().expect("duration");
        c.worker.concurrency = 1;
    })
    .await;
    let first = bed.add_worker("w1").await;
    let id = bed.create("api:alice", "survive a crash", |_| {}).await;
    // Round 1 is checkpointed; round 2's LLM call is in flight, held, when w1 dies.
    bed.llm
        .wait_for(WAIT, |b| {
            b["messages"].as_array().is_some_and(|m| m.len() > 3)
        })
        .await
        .expect("round 2 started");
    bed.kill_worker(first).await;
    bed.llm.release("default");
    bed.add_worker("w2").await;
    let done = bed
        .wait_state(&id, pb::TaskState::Completed, Duration::from_secs(30))
        .await;
    let task = done.task.expect("task");
    assert_eq!(task.result, "finished by someone");
    assert_eq!(task.attempt, 2, "the second run is the second attempt");
    let audit = bed
        .store
        .transitions_of(id.parse().expect("id"))
        .await
        .expect("audit");
    let claims: Vec<&str> = audit
        .iter()
        .filter(|t| t.event == "claim")
        .map(|t| t.actor.as_str())
        .collect();
    assert_eq!(claims, ["w1", "w2"]);
    let rounds = bed
        .store
        .rounds_of(id.parse().expect("id"))
        .await
        .expect("rounds");
    assert_eq!(
        rounds.iter().map(|r| r.round).collect::<Vec<_>>(),
        [1, 2],
        "round 1 was not redone"
    );
    bed.stop().await;
}

#[tokio::test]
async fn retries_ride_out_429_and_5xx_and_provider_quirks_are_tolerated() {
    let mut script = Script::new(vec![
        Step::ask("Proceed?").failing_first(&[429, 503]),
        Step::call("send_message", json!({"text": "working on it"})),
        Step::say("ok: {answer}"),
    ]);
    script.quirks = Quirks {
        arguments_as_object: true,
        omit_call_ids: true,
        reasoning_content: true,
    };
    let llm = ScriptedLlm::with_default(script).await.expect("llm");
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "tolerate quirks", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    bed.answer(&id, "yes").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "ok: sent");
    let requests = bed.llm.requests();
    assert_eq!(requests.len(), 5, "two failed attempts, then three steps");
    let last = &requests.last().expect("requests").body;
    let assistants: Vec<&serde_json::Value> = last["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert!(
        assistants
            .iter()
            .all(|m| m["reasoning_content"].is_string()),
        "provider extras are sent back as they came"
    );
    assert!(
        assistants[0]["tool_calls"][0]["id"].is_string(),
        "a missing call id is filled in"
    );
    bed.stop().await;
}

#[tokio::test]
async fn an_llm_error_that_survives_the_retries_fails_the_task_with_its_text() {
    let llm = llm(vec![
        Step::say("never").failing_first(&[500, 500, 500, 500, 500]),
    ])
    .await;
    let mut bed = Bed::start(llm, |c| c.llm.max_retries = 2).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "meet a broken model", |_| {}).await;
    let failed = bed.wait_state(&id, pb::TaskState::Failed, WAIT).await;
    let error = failed.task.expect("task").error;
    assert!(error.contains("500"), "{error}");
    assert_eq!(bed.llm.requests().len(), 3, "one call and two retries");
    bed.stop().await;
}

#[tokio::test]
async fn hitting_the_round_limit_completes_the_task_with_a_clear_note() {
    let llm = llm((0..10)
        .map(|_| Step::call("current_time", json!({})))
        .collect())
    .await;
    let mut bed = Bed::start(llm, |c| c.task.max_rounds = 3).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "loop forever", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(result.contains("after 3 rounds"), "{result}");
    assert_eq!(bed.llm.requests().len(), 3);
    bed.stop().await;
}

#[tokio::test]
async fn the_model_is_called_in_the_trace_of_what_started_or_resumed_the_task() {
    use hark_core::trace::{self, TraceContext};
    let llm = llm(vec![
        Step::ask("Which city?"),
        Step::say("Off to {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let mut api = bed.client().await;
    let creator = TraceContext::new_root();
    let mut create = tonic::Request::new(pb::CreateTaskRequest {
        owner: "api:alice".into(),
        goal: "plan a trip".into(),
        ..Default::default()
    });
    create.metadata_mut().insert(
        trace::HEADER,
        creator.to_string().parse().expect("metadata value"),
    );
    let id = api
        .create_task(create)
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task")
        .id;
    bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let answerer = TraceContext::new_root();
    let mut answer = tonic::Request::new(pb::AnswerQuestionRequest {
        task_id: id.clone(),
        answer: "Porto".into(),
        ..Default::default()
    });
    answer.metadata_mut().insert(
        trace::HEADER,
        answerer.to_string().parse().expect("metadata value"),
    );
    api.answer_question(answer).await.expect("answered");
    bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;

    let traces: Vec<Option<String>> = bed
        .llm
        .requests()
        .iter()
        .map(|r| {
            r.traceparent
                .as_deref()
                .and_then(TraceContext::parse)
                .map(|c| c.trace_id())
        })
        .collect();
    assert_eq!(
        traces,
        [Some(creator.trace_id()), Some(answerer.trace_id())],
        "the first call runs in the creator's trace, the resumed one in the answerer's"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_guest_owned_task_is_told_nobody_can_answer_and_finishes_without_waiting() {
    let llm = llm(vec![
        Step::ask("Which city?"),
        Step::say("Went ahead without asking: {answer}"),
    ])
    .await;
    let mut bed = Bed::start(llm, |c| {
        c.permission.default_role = hark_core::domain::Role::Guest;
    })
    .await;
    bed.add_worker("w1").await;
    // Guests cannot create tasks; a task keeps running when its owner is demoted after creating
    // it, which is what this stands for: a task whose owner is a guest by now.
    let id = bed
        .store
        .create_task(&hark_control::store::NewTask {
            owner: "api:visitor".parse().expect("owner"),
            goal: "plan a trip".into(),
            chat: None,
            ask_timeout: Duration::from_secs(600),
            on_timeout: hark_core::domain::TimeoutPolicy::Resume,
            request_id: None,
            active_limit: 0,
            questionnaire: None,
            schedule: None,
            priority: 0,
            deadline: None,
            on_deadline: hark_core::domain::DeadlinePolicy::Fail,
            asked_by: None,
            key_id: None,
        })
        .await
        .expect("created")
        .id
        .to_string();
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let task = done.task.expect("task");
    assert!(task.open_question.is_none(), "a question was opened");
    let requests = bed.llm.requests();
    assert_eq!(
        requests.len(),
        2,
        "the model was called once more, not resumed"
    );
    let system = requests[0].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(system.contains("Nobody can answer"), "{system}");
    let results = tool_results(&requests[1].body);
    assert_eq!(results.len(), 1);
    assert!(results[0].starts_with("error:"), "{results:?}");
    assert!(
        task.result.starts_with("Went ahead without asking: error:"),
        "{}",
        task.result
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_task_whose_history_passes_five_megabytes_still_resumes_and_completes() {
    // Each round keeps a 60 KB tool call (its arguments are refused, the call stays in the
    // history), so 90 rounds make a history of about 5.4 MB — five times what one NATS message
    // may carry.
    let padding = "x".repeat(60_000);
    let mut steps: Vec<Step> = (0..90)
        .map(|_| Step::call("current_time", json!({"padding": padding})))
        .collect();
    steps.push(Step::ask("Still there?"));
    steps.push(Step::say("Yes: {answer}"));
    let llm = llm(steps).await;
    llm.keep_requests(false);
    let mut bed = Bed::start(llm, |c| c.task.max_rounds = 100).await;
    bed.add_worker("w1").await;
    bed.add_worker("w2").await;
    let id = bed.create("api:hilda", "grow a long history", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::WaitingInput, Duration::from_secs(120))
        .await;
    let stored: i64 = sqlx::query_scalar(
        "SELECT sum(octet_length(messages::text))::bigint FROM checkpoints WHERE task_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(bed.store.pool())
    .await
    .expect("checkpoint size");
    assert!(stored > 5_000_000, "the history is {stored} bytes");
    // Resuming hands the whole history to a worker again.
    bed.answer(&id, "still here").await;
    let done = bed
        .wait_state(&id, pb::TaskState::Completed, Duration::from_secs(120))
        .await;
    let task = done.task.expect("task");
    assert_eq!(task.result, "Yes: still here");
    assert_eq!(task.attempt, 1);
    bed.stop().await;
}

#[tokio::test]
async fn ask_user_may_offer_choices_and_the_model_gets_the_choice_picked() {
    let llm = llm(vec![
        Step::call(
            "ask_user",
            json!({"question": "Tea or coffee?", "choices": ["tea", "coffee"]}),
        ),
        Step::say("Making {answer}."),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "make a drink", |_| {}).await;
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let question = waiting.task.expect("task").open_question.expect("question");
    assert_eq!(question.choices, ["tea", "coffee"]);
    bed.answer(&id, "2").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    // The model reads the choice as JSON.
    assert_eq!(
        done.task.expect("task").result,
        r#"Making {"choice":"coffee"}."#
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_running_task_paused_stops_at_its_round_boundary_and_goes_on_from_there_once_resumed() {
    let llm = llm(vec![
        Step::call("current_time", json!({})),
        Step::say("done after the pause"),
    ])
    .await;
    // The first round's answer waits until the pause was asked for.
    llm.hold("default");
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "work in two rounds", |_| {}).await;
    bed.llm
        .wait_for(WAIT, |_| true)
        .await
        .expect("round 1 is in flight");
    let asked = bed
        .client()
        .await
        .pause_task(pb::PauseTaskRequest {
            task_id: id.clone(),
        })
        .await
        .expect("pause")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(
        asked.state,
        pb::TaskState::Running as i32,
        "not stopped mid-round"
    );
    assert!(asked.pause_requested);
    bed.llm.release("default");
    bed.wait_state(&id, pb::TaskState::Paused, WAIT).await;
    assert_eq!(
        bed.llm.requests().len(),
        1,
        "the round after the boundary does not start while paused"
    );
    let task: hark_core::domain::TaskId = id.parse().expect("id");
    let row = bed.store.get_task(task).await.expect("task");
    assert!(row.worker_id.is_none(), "a paused task holds no worker");
    assert_eq!(row.rounds, 1, "round 1 was stored before the pause");

    bed.client()
        .await
        .resume_task(pb::ResumeTaskRequest {
            task_id: id.clone(),
        })
        .await
        .expect("resume");
    bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let requests = bed.llm.requests();
    assert_eq!(requests.len(), 2);
    let results = tool_results(&requests[1].body);
    assert_eq!(
        results.len(),
        1,
        "round 2 goes on with round 1's tool result"
    );
    let events: Vec<String> = bed
        .store
        .transitions_of(task)
        .await
        .expect("audit")
        .into_iter()
        .map(|t| t.event)
        .collect();
    assert_eq!(
        events,
        [
            "create", "claim", "pause", "release", "resume", "claim", "finish"
        ]
    );
    bed.stop().await;
}

#[tokio::test]
async fn with_every_worker_busy_the_task_of_the_higher_priority_runs_first() {
    let llm = llm(vec![Step::say("blocker done")]).await;
    // The only slot is busy until the two tasks below are queued.
    llm.hold("default");
    llm.set_script("low", Script::new(vec![Step::say("low done")]));
    llm.set_script("high", Script::new(vec![Step::say("high done")]));
    let mut bed = Bed::start(llm, |c| c.worker.concurrency = 1).await;
    bed.add_worker("w1").await;
    let blocker = bed.create("api:alice", "hold the only slot", |_| {}).await;
    bed.llm
        .wait_for(WAIT, |_| true)
        .await
        .expect("the blocker's call is in flight");
    let low = bed
        .create("api:alice", "[script:low] routine work", |_| {})
        .await;
    let high = bed
        .create("api:alice", "[script:high] urgent work", |r| {
            r.priority = 10
        })
        .await;
    bed.llm.release("default");
    for id in [&blocker, &low, &high] {
        bed.wait_state(id, pb::TaskState::Completed, WAIT).await;
    }
    // The LLM saw the blocker, then the urgent task, though the routine one was queued first.
    let goals: Vec<String> = bed
        .llm
        .requests()
        .iter()
        .map(|r| r.body["messages"].to_string())
        .collect();
    let position = |goal: &str| {
        goals
            .iter()
            .position(|m| m.contains(goal))
            .unwrap_or_else(|| panic!("no request for {goal}: {goals:?}"))
    };
    assert!(
        position("urgent work") < position("routine work"),
        "{goals:?}"
    );
    bed.stop().await;
}

/// Answers the task's open question over gRPC, with text or JSON; the error when refused.
async fn answer_with(
    bed: &Bed,
    id: &str,
    text: &str,
    json: &str,
) -> Result<pb::AnswerQuestionResponse, tonic::Status> {
    bed.client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            task_id: id.into(),
            answer: text.into(),
            answer_json: json.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn structured_questions_take_only_answers_that_fit_and_the_model_reads_json() {
    let llm = llm(vec![
        Step::call(
            "ask_user",
            json!({"question": "Go ahead?", "kind": "confirm"}),
        ),
        Step::call(
            "ask_user",
            json!({"question": "Which drinks?", "choices": ["tea", "coffee", "juice"], "multiple": true}),
        ),
        Step::call(
            "ask_user",
            json!({"question": "Your details?", "kind": "form", "fields": [
                {"key": "name", "type": "string", "required": true},
                {"key": "cups", "type": "integer"},
                {"key": "size", "type": "string", "choices": ["S", "M"], "title": "尺码"}
            ]}),
        ),
        Step::call("ask_user", json!({"question": "Broken?", "kind": "form"})),
        Step::say("{answers}"),
    ])
    .await;
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    let id = bed.create("api:alice", "take an order", |_| {}).await;

    // A confirm: shown as such, "maybe" refused with what it takes, "是" taken.
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let question = waiting.task.expect("task").open_question.expect("question");
    assert_eq!(question.kind, "confirm");
    let err = answer_with(&bed, &id, "maybe", "")
        .await
        .expect_err("misfit");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("it takes yes or no"),
        "{}",
        err.message()
    );
    assert_eq!(
        bed.task(&id).await.task.expect("task").state,
        pb::TaskState::WaitingInput as i32
    );
    answer_with(&bed, &id, "是", "").await.expect("answered");

    // Several choices: by number and text, or as a JSON list.
    let question = loop {
        let task = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
        let question = task.task.expect("task").open_question.expect("question");
        if question.text == "Which drinks?" {
            break question;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        question.multiple && question.kind == "choice",
        "{question:?}"
    );
    let err = answer_with(&bed, &id, "", r#"["tea", "beer"]"#)
        .await
        .expect_err("misfit");
    assert!(
        err.message().contains("one or more of 1) tea"),
        "{}",
        err.message()
    );
    answer_with(&bed, &id, "1, juice", "")
        .await
        .expect("answered");

    // A form: its fields shown, a missing required field refused, then taken from lines.
    let question = loop {
        let task = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
        let question = task.task.expect("task").open_question.expect("question");
        if question.kind == "form" {
            break question;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let keys: Vec<&str> = question.fields.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(keys, ["name", "cups", "size"]);
    let err = answer_with(&bed, &id, "", r#"{"cups": 2}"#)
        .await
        .expect_err("misfit");
    assert!(
        err.message().contains("field `name` is missing"),
        "{}",
        err.message()
    );
    answer_with(&bed, &id, "name: 小明\ncups: 2\n尺码: 2", "")
        .await
        .expect("answered");

    // A form without fields is the model's mistake: an error result, and the task goes on.
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let results: Vec<String> = done
        .task
        .expect("task")
        .result
        .split('|')
        .map(str::to_owned)
        .collect();
    assert_eq!(results[0], r#"{"confirmed":true}"#);
    assert_eq!(results[1], r#"{"choices":["tea","juice"]}"#);
    let form: serde_json::Value = serde_json::from_str(&results[2]).expect("an object");
    assert_eq!(form, json!({"name": "小明", "cups": 2, "size": "M"}));
    assert!(
        results[3].starts_with("error: a form needs"),
        "{}",
        results[3]
    );
    bed.stop().await;
}
