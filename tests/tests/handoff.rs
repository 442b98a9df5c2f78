//! Run jobs handed to a polling worker, against a real task-control process: the job is claimed
//! for the worker and skips the run queue; an answer claims its task for the worker in its own
//! statement; a worker that does not take it has it queued again; and task-control killed right
//! after either claim commits loses nothing and runs nothing twice.

use std::time::Duration;

use hark_core::{bus::ControlOp, codec};
use hark_e2e::{Env, claim, fetch};
use hark_proto::v1 as pb;
use prost::Message as _;

/// A poll as a worker sends it, waiting in the background for task-control's reply.
fn poll(env: &Env, worker: &str) -> tokio::task::JoinHandle<Option<async_nats::Message>> {
    let (nats, subject) = (env.nats.clone(), env.names.control(ControlOp::Poll));
    let payload = codec::encode(pb::PollRequest {
        worker_id: worker.into(),
        wait_ms: 25_000,
        ..Default::default()
    });
    tokio::spawn(async move {
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(Duration::from_secs(30)));
        nats.send_request(subject, request).await.ok()
    })
}

/// Returns once every poll sent before it is parked: task-control parks each poll before it
/// reads the next request, and answers this one after.
async fn parked(env: &Env) {
    let refused: pb::HeartbeatResponse = env
        .request(
            ControlOp::Heartbeat,
            codec::encode(pb::HeartbeatRequest::default()),
        )
        .await;
    assert!(
        refused.refusal.is_some(),
        "a heartbeat without a lease is refused"
    );
}

async fn run_queue_last_sequence(env: &Env) -> u64 {
    let mut stream = env
        .js
        .get_stream(env.names.task_run_stream())
        .await
        .expect("the run queue exists");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

fn handed(reply: Option<async_nats::Message>) -> (pb::PollResponse, async_nats::Message) {
    let reply = reply.expect("task-control replied to the poll");
    let response = pb::PollResponse::decode(reply.payload.clone()).expect("decodes");
    (response, reply)
}

#[tokio::test]
async fn a_run_job_goes_to_a_polling_worker_claimed_for_it_and_skips_the_run_queue() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let before = run_queue_last_sequence(&env).await;

    let polling = poll(&env, "w1");
    parked(&env).await;
    let task = hark_e2e::new_task(&mut api, "api:dora", "plan the trip").await;
    let (response, reply) = handed(polling.await.expect("joined"));

    // The reply is the claim a worker's own claim request would get.
    let claim = response.claim.expect("a claim was handed over");
    assert!(claim.refusal.is_none(), "{:?}", claim.refusal);
    let lease = claim.lease.expect("a lease");
    assert_eq!(lease.task_id, task.id);
    assert_eq!(lease.worker_id, "w1");
    assert_eq!(claim.task.expect("the task").goal, "plan the trip");
    let job = response.job.expect("the job");
    assert_eq!(job.task_id, task.id);
    assert_eq!(job.reason, pb::RunReason::Start as i32);
    let ack = reply.reply.expect("the hand-over asks to be acknowledged");
    env.nats
        .publish(ack, Default::default())
        .await
        .expect("acknowledged");

    // The task runs under that lease, and it was never in the run queue.
    let state = env
        .sql(&format!(
            "SELECT state, worker_id FROM tasks WHERE id = '{}'",
            task.id
        ))
        .await;
    assert_eq!(state, "running|w1");
    let renewed = hark_e2e::heartbeat(&env, &lease).await;
    assert!(renewed.refusal.is_none(), "{:?}", renewed.refusal);
    let done = hark_e2e::complete(&env, Some(lease), "booked").await;
    assert!(done.refusal.is_none(), "{:?}", done.refusal);
    assert_eq!(
        run_queue_last_sequence(&env).await,
        before,
        "nothing was published to the run queue"
    );
    // The job's outbox row goes with the relay's next deletions.
    for _ in 0..200 {
        if env.sql("SELECT count(*) FROM outbox").await == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.sql("SELECT count(*) FROM outbox").await, "0");

    control.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_task_handed_to_a_worker_that_does_not_take_it_is_queued_again() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let jobs = env.jobs().await;

    // This worker polls, then is gone before the hand-over arrives: it never answers it.
    let polling = poll(&env, "ghost");
    parked(&env).await;
    let task = hark_e2e::new_task(&mut api, "api:dora", "water the plants").await;
    let (response, _unanswered) = handed(polling.await.expect("joined"));
    let lease = response
        .claim
        .and_then(|c| c.lease)
        .expect("a lease for the ghost");

    // task-control takes the task back and queues it; another worker runs it.
    let queued: Vec<pb::RunJob> = fetch(&jobs, 1, Duration::from_secs(30)).await;
    assert_eq!(queued.len(), 1, "the task is queued again");
    assert_eq!(queued[0].task_id, task.id);
    assert!(
        queued[0].generation > lease.generation,
        "{queued:?} after {lease:?}"
    );
    let taken = claim(&env, &queued[0], "w2").await;
    assert!(taken.refusal.is_none(), "{:?}", taken.refusal);
    let stale = hark_e2e::heartbeat(&env, &lease).await;
    assert_eq!(
        stale.refusal.map(|r| r.reason),
        Some(pb::RefusalReason::LeaseLost as i32),
        "the ghost's lease is gone"
    );
    let released = env
        .sql(&format!(
            "SELECT count(*) FROM transitions WHERE task_id = '{}' AND event = 'release'",
            task.id
        ))
        .await;
    assert_eq!(released, "1");

    control.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn killing_task_control_after_a_handed_over_claim_commits_loses_nothing_and_runs_nothing_twice()
 {
    let mut env = Env::new().await;
    env.set("HARK_TASK__LEASE", "2s");
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "handoff.after_claim")]);
    let mut api = env.client().await;
    let jobs = env.jobs().await;

    // The claim for the polling worker commits, then the process dies before it replies.
    let polling = poll(&env, "w1");
    parked(&env).await;
    let task = hark_e2e::new_task(&mut api, "api:dora", "feed the cat").await;
    let status = control
        .exited_within(Duration::from_secs(10))
        .await
        .expect("control died");
    assert!(!status.success());
    let reply = polling.await.expect("joined");
    assert!(
        reply.is_none_or(|r| pb::PollResponse::decode(r.payload)
            .expect("decodes")
            .claim
            .is_none()),
        "the worker was handed nothing"
    );
    assert_eq!(
        env.sql(&format!(
            "SELECT state, worker_id FROM tasks WHERE id = '{}'",
            task.id
        ))
        .await,
        "running|w1",
        "the claim committed"
    );

    // Started again: the job left in the outbox is published and refused as stale, the lease
    // lapses, and the task is recovered once.
    let mut control = env.spawn(&["control"], &[]);
    let mut recovered = Vec::new();
    for _ in 0..30 {
        for job in fetch::<pb::RunJob>(&jobs, 10, Duration::from_secs(1)).await {
            let claimed = claim(&env, &job, "w2").await;
            recovered.push((job, claimed));
        }
        if recovered.iter().any(|(_, c)| c.refusal.is_none()) {
            break;
        }
    }
    let won: Vec<&pb::ClaimResponse> = recovered
        .iter()
        .map(|(_, c)| c)
        .filter(|c| c.refusal.is_none())
        .collect();
    assert_eq!(won.len(), 1, "one claim wins: {recovered:?}");
    assert!(
        recovered
            .iter()
            .any(|(job, _)| job.reason == pb::RunReason::Recover as i32),
        "the lapsed lease is recovered: {recovered:?}"
    );
    let done = hark_e2e::complete(&env, won[0].lease.clone(), "fed").await;
    assert!(done.refusal.is_none(), "{:?}", done.refusal);
    let later: Vec<pb::RunJob> = fetch(&jobs, 10, Duration::from_secs(1)).await;
    assert!(later.is_empty(), "nothing else is queued: {later:?}");
    let claims = env
        .sql(&format!(
            "SELECT string_agg(actor, ',' ORDER BY id) FROM transitions WHERE task_id = '{}' AND event = 'claim'",
            task.id
        ))
        .await;
    assert_eq!(
        claims, "w1,w2",
        "claimed by the polling worker, then once by recovery"
    );
    let ended = env
        .sql(&format!(
            "SELECT state, result FROM tasks WHERE id = '{}'",
            task.id
        ))
        .await;
    assert_eq!(ended, "completed|fed");

    control.stop().await;
    env.cleanup().await;
}

/// Takes the task handed to `worker`'s poll, acknowledges it, and asks its owner a question
/// under its lease; returns the lease and the question's id.
async fn take_and_ask(
    env: &Env,
    polling: tokio::task::JoinHandle<Option<async_nats::Message>>,
) -> (pb::Lease, String) {
    let (response, reply) = handed(polling.await.expect("joined"));
    env.nats
        .publish(reply.reply.expect("an ack subject"), Default::default())
        .await
        .expect("acknowledged");
    let lease = response
        .claim
        .and_then(|c| c.lease)
        .expect("a handed-over lease");
    let asked = hark_e2e::ask(env, Some(lease.clone())).await;
    assert!(asked.refusal.is_none(), "{:?}", asked.refusal);
    (lease, asked.question_id)
}

#[tokio::test]
async fn an_answer_claims_its_task_for_a_polling_worker_in_its_own_statement() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let before = run_queue_last_sequence(&env).await;
    let polling = poll(&env, "w1");
    parked(&env).await;
    let task = hark_e2e::new_task(&mut api, "api:erin", "pick a day").await;
    let (_, question) = take_and_ask(&env, polling).await;

    // The worker polls again; the answer's statement claims the task for it.
    let polling = poll(&env, "w1");
    parked(&env).await;
    api.answer_question(pb::AnswerQuestionRequest {
        question_id: question.clone(),
        answer: "Friday".into(),
        request_id: "answer-1".into(),
        ..Default::default()
    })
    .await
    .expect("answered");
    let (response, _) = handed(polling.await.expect("joined"));
    let claim = response.claim.expect("a claim");
    let resume = claim.resume.expect("the answer comes with the claim");
    assert_eq!(resume.text, "Friday");
    assert_eq!(resume.tool_call_id, "call-1");
    assert!(!resume.expired);
    assert_eq!(claim.rounds.len(), 1, "the checkpoint comes with it");
    assert_eq!(
        response.job.expect("the job").reason,
        pb::RunReason::ResumeReply as i32
    );

    // Both moves are in the audit, one commit after the ask, and no run job was written.
    let moves = env
        .sql(&format!(
            "SELECT string_agg(event || ':' || from_state || '>' || to_state || '@' || generation, ',' ORDER BY id)
             FROM transitions WHERE task_id = '{}' AND event IN ('answer', 'claim')",
            task.id
        ))
        .await;
    assert_eq!(
        moves,
        "claim:pending>running@2,answer:waiting_input>pending@4,claim:pending>running@5"
    );
    let last_claim = env
        .sql(&format!(
            "SELECT actor FROM transitions WHERE task_id = '{}' ORDER BY id DESC LIMIT 1",
            task.id
        ))
        .await;
    assert_eq!(last_claim, "w1");
    assert_eq!(run_queue_last_sequence(&env).await, before);
    assert_eq!(
        env.sql(&format!(
            "SELECT state, worker_id FROM tasks WHERE id = '{}'",
            task.id
        ))
        .await,
        "running|w1"
    );

    control.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn killing_task_control_after_an_answer_claimed_for_a_polling_worker_loses_nothing() {
    let mut env = Env::new().await;
    env.set("HARK_TASK__LEASE", "2s");
    let mut control = env.spawn(
        &["control"],
        &[("HARK_FAILPOINT", "answer_claim.after_commit")],
    );
    let mut api = env.client().await;
    let jobs = env.jobs().await;
    let polling = poll(&env, "w1");
    parked(&env).await;
    let task = hark_e2e::new_task(&mut api, "api:erin", "pick a day").await;
    let (_, question) = take_and_ask(&env, polling).await;

    // The answer and the claim commit together, then the process dies before handing it over.
    let _polling = poll(&env, "w1");
    parked(&env).await;
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: question.clone(),
            answer: "Friday".into(),
            request_id: "answer-1".into(),
            ..Default::default()
        })
        .await;
    assert!(answered.is_err(), "the process dies before it replies");
    let status = control
        .exited_within(Duration::from_secs(10))
        .await
        .expect("control died");
    assert!(!status.success());

    // Started again: the lease lapses, the task is recovered with the answer, once.
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let mut won = None;
    for _ in 0..30 {
        for job in fetch::<pb::RunJob>(&jobs, 10, Duration::from_secs(1)).await {
            let claimed = claim(&env, &job, "w2").await;
            if claimed.refusal.is_none() {
                assert!(won.is_none(), "a second claim won: {claimed:?}");
                assert_eq!(job.reason, pb::RunReason::Recover as i32);
                won = Some(claimed);
            }
        }
        if won.is_some() {
            break;
        }
    }
    let won = won.expect("the task is recovered");
    let resume = won.resume.clone().expect("with the answer");
    assert_eq!(resume.text, "Friday");
    // The answer survived, and sending it again changes nothing.
    let again = api
        .answer_question(pb::AnswerQuestionRequest {
            question_id: question,
            answer: "Friday".into(),
            request_id: "answer-1".into(),
            ..Default::default()
        })
        .await;
    assert!(again.is_ok(), "{again:?}");
    let done = hark_e2e::complete(&env, won.lease, "Friday it is").await;
    assert!(done.refusal.is_none(), "{:?}", done.refusal);
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM transitions WHERE task_id = '{}' AND event = 'answer'",
            task.id
        ))
        .await,
        "1"
    );
    assert_eq!(
        env.sql(&format!("SELECT state FROM tasks WHERE id = '{}'", task.id))
            .await,
        "completed"
    );

    control.stop().await;
    env.cleanup().await;
}
