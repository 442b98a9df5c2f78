//! A worker under faults of its surroundings: a database blip while it runs a task, and a
//! SIGTERM in the middle of a round.

use std::time::Duration;

use hark_e2e::{Env, nats_url, servers::PrivatePostgres};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step, last_tool_result};

const WAIT: Duration = Duration::from_secs(60);

async fn task_of(env: &Env, id: &str) -> pb::Task {
    env.client()
        .await
        .get_task(pb::GetTaskRequest { task_id: id.into() })
        .await
        .expect("get task")
        .into_inner()
        .task
        .expect("task")
}

async fn until_state(env: &Env, id: &str, state: pb::TaskState) -> pb::Task {
    let what = format!("task {id} is {state:?}");
    hark_e2e::eventually(&what, WAIT, || async {
        let task = task_of(env, id).await;
        (task.state == state as i32).then_some(task)
    })
    .await
}

#[tokio::test]
async fn a_database_blip_while_a_worker_runs_costs_the_task_nothing() {
    let postgres = PrivatePostgres::start();
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call("current_time", serde_json::json!({})),
        // The final answer comes while the database is away.
        Step::say("done in one go"),
    ]))
    .await
    .expect("scripted LLM");
    llm.hold_step("default", 1);
    let mut env = Env::on(
        nats_url(),
        format!("postgres://postgres@127.0.0.1:{}", postgres.port),
    )
    .await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let task = hark_e2e::new_task(&mut api, "api:bob", "ride it out").await;

    // The second LLM call is under way: the database goes away before it answers, and comes
    // back only once task-control has told the worker it cannot decide the completion.
    llm.wait_for(WAIT, |b| {
        b["messages"].as_array().is_some_and(|m| m.len() >= 4)
    })
    .await
    .expect("the second round starts");
    postgres.crash();
    llm.release("default");
    worker
        .wait_for_output("task-control cannot decide this now", WAIT)
        .await;
    postgres.start_again();

    let done = until_state(&env, &task.id, pb::TaskState::Completed).await;
    assert_eq!(done.result, "done in one go");
    assert_eq!(done.attempt, 1, "the blip cost no attempt");
    let finals = llm
        .requests()
        .iter()
        .filter(|r| r.body["messages"].as_array().is_some_and(|m| m.len() >= 4))
        .count();
    assert_eq!(finals, 1, "the model was not asked the same round twice");
    let events = env
        .sql(&format!(
            "SELECT string_agg(event, ',' ORDER BY id) FROM transitions WHERE task_id = '{}'",
            task.id
        ))
        .await;
    assert_eq!(events, "create,claim,finish");
    worker.stop().await;
    control.stop().await;
    drop(llm);
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_stopped_in_a_round_hands_its_task_back_and_no_attempt_is_lost() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call("current_time", serde_json::json!({})),
        Step::say("finished by the other worker {answer}"),
    ]))
    .await
    .expect("scripted LLM");
    // Round 2's answer waits until the first worker was stopped.
    llm.hold_step("default", 1);
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let mut first = env.spawn(&["worker", "--id", "w1"], &[]);
    first.wait_for_output("worker started", WAIT).await;
    let task = hark_e2e::new_task(&mut api, "api:carl", "survive a rolling restart").await;
    // The first worker checkpointed round 1 and waits for the model in round 2: stop it.
    llm.wait_for(WAIT, |b| {
        b["messages"].as_array().is_some_and(|m| m.len() >= 4)
    })
    .await
    .expect("round 2 starts");
    let status = first.stop().await.expect("the worker exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    let output = first.output();
    assert!(output.contains("handed the task back"), "{output}");
    let pending = task_of(&env, &task.id).await;
    assert_ne!(
        pending.state,
        pb::TaskState::Running as i32,
        "the task is not left running under a dead lease"
    );

    llm.release("default");
    let mut second = env.spawn(&["worker", "--id", "w2"], &[]);
    let done = until_state(&env, &task.id, pb::TaskState::Completed).await;
    assert_eq!(done.attempt, 1, "a hand-back is no lost attempt");
    assert!(done.result.starts_with("finished by the other worker"));
    // The second worker continued from round 1's checkpoint: it did not call current_time
    // again.
    let first_round_calls = llm
        .requests()
        .iter()
        .filter(|r| r.body["messages"].as_array().is_some_and(|m| m.len() == 2))
        .count();
    assert_eq!(first_round_calls, 1);
    assert!(
        llm.requests()
            .iter()
            .filter_map(|r| last_tool_result(&r.body))
            .all(|t| !t.is_empty())
    );
    let events = env
        .sql(&format!(
            "SELECT string_agg(event, ',' ORDER BY id) FROM transitions WHERE task_id = '{}'",
            task.id
        ))
        .await;
    assert_eq!(events, "create,claim,release,claim,finish");
    second.stop().await;
    control.stop().await;
    drop(llm);
    env.cleanup().await;
}
