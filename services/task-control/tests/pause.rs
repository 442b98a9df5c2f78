//! Pausing and resuming tasks, against the real Postgres: every state a pause can meet, what an
//! answer, a deadline and a lost lease do to a paused task, and that a paused task holds no
//! worker.

mod common;

use std::time::Duration;

use common::{
    Cases as _, TestDb,
    tasks::{LEASE, answer, ask_input, group_chat, new_task, run_jobs, waiting_task},
};
use hark_control::store::{Error, Store, TaskRow};
use hark_core::domain::{QuestionOutcome, TaskState};
use hark_proto::v1 as pb;
use serde_json::json;

/// The run jobs in the outbox for `task`, as (generation, reason).
async fn jobs_of(store: &Store, task: &TaskRow) -> Vec<(u64, i32)> {
    run_jobs(store)
        .await
        .into_iter()
        .filter(|(id, _, _)| *id == task.id.to_string())
        .map(|(_, generation, reason)| (generation, reason))
        .collect()
}

/// Resumes the paused `task` as if it had stood paused for an hour, back into waiting.
async fn resume_after_an_hour(store: &Store, task: &TaskRow) {
    sqlx::query("UPDATE tasks SET paused_at = paused_at - interval '1 hour' WHERE id = $1")
        .bind(task.id.as_uuid())
        .execute(store.pool())
        .await
        .expect("paused an hour ago");
    let resumed = store.resume(task.id, "api").await.expect("resume");
    assert_eq!(resumed.state, TaskState::WaitingInput);
}

/// `what` moved on by `by`: the hour the task stood paused, and the moments the resume took.
fn moved_by_the_hour_paused(what: &str, by: time::Duration) {
    assert!(
        by >= time::Duration::hours(1)
            && by < time::Duration::hours(1) + time::Duration::minutes(1),
        "{what} moved on by the hour paused, not {by}"
    );
}

/// A task in a group chat, claimed by `w1`.
async fn running(store: &Store) -> (TaskRow, hark_control::store::Claimed) {
    let task = new_task(store, Some(group_chat())).await;
    let claimed = store
        .claim(task.id, task.generation, "w1", LEASE)
        .await
        .expect("claim wins");
    (task, claimed)
}

/// A task claimed by `w1` that asked "Which city?".
async fn waiting(store: &Store) -> TaskRow {
    waiting_task(store).await.0
}

#[tokio::test]
async fn a_paused_question_keeps_its_answer_and_the_task_runs_only_once_resumed() {
    let db = TestDb::new().await;
    let store = &db.store;
    let task = waiting(store).await;
    let paused = store.pause(task.id, "qq:10001").await.expect("pause");
    assert_eq!(paused.state, TaskState::Paused);
    assert!(paused.paused_at.is_some());
    assert!(paused.worker_id.is_none(), "a paused task holds no worker");
    let jobs_before = jobs_of(store, &task).await;

    // The owner answers while it is paused: the answer is recorded, and nothing runs.
    let question = store
        .open_question_of(task.id)
        .await
        .expect("read")
        .expect("the question stays open while paused");
    store
        .answer(question.id, &answer("Paris", "qq:42:group:777:m-7"))
        .await
        .expect("an answer to a paused task is recorded");
    let after = store.get_task(task.id).await.expect("task");
    assert_eq!(after.state, TaskState::Paused);
    let q = store.get_question(question.id).await.expect("question");
    assert_eq!(q.outcome, QuestionOutcome::Answered);
    assert_eq!(q.answer.as_deref(), Some("Paris"));
    assert_eq!(
        jobs_of(store, &task).await,
        jobs_before,
        "no run is queued while paused"
    );

    // Resumed, it runs with the answer.
    let resumed = store.resume(task.id, "qq:10001").await.expect("resume");
    assert_eq!(resumed.state, TaskState::Pending);
    assert!(resumed.paused_at.is_none());
    let jobs = jobs_of(store, &task).await;
    assert!(
        jobs.contains(&(resumed.generation as u64, pb::RunReason::Unpause as i32)),
        "{jobs:?}"
    );
    let claimed = store
        .claim(task.id, resumed.generation, "w2", LEASE)
        .await
        .expect("the resumed task is claimed");
    let resume = claimed.resume.expect("the claim carries the answer");
    assert_eq!(resume.text, "Paris");
    assert!(!resume.expired);

    let events: Vec<String> = store
        .transitions_of(task.id)
        .await
        .expect("audit")
        .into_iter()
        .map(|t| t.event)
        .collect();
    assert_eq!(
        events,
        [
            "create", "claim", "ask", "pause", "answer", "resume", "claim"
        ]
    );
    db.drop().await;
}

#[tokio::test]
async fn a_paused_deadline_stands_still_and_moves_on_by_the_time_paused() {
    let db = TestDb::new().await;
    let store = &db.store;
    let task = waiting(store).await;
    store.pause(task.id, "api").await.expect("pause");
    let question = store
        .open_question_of(task.id)
        .await
        .expect("read")
        .expect("open");
    let deadline = question.deadline.expect("the question has a deadline");

    // The deadline passes while paused: nothing expires and no reminder goes out.
    sqlx::query("UPDATE questions SET deadline = now() - interval '1 second' WHERE id = $1")
        .bind(question.id.as_uuid())
        .execute(store.pool())
        .await
        .expect("deadline moved into the past");
    assert_eq!(store.expire_due(100).await.expect("sweep"), 0);
    assert_eq!(
        store
            .remind_due(Duration::from_secs(3600), 100)
            .await
            .expect("sweep"),
        0
    );
    let still = store.get_question(question.id).await.expect("question");
    assert_eq!(still.outcome, QuestionOutcome::Open);

    // Put the deadline back, and let the task have stood still for an hour.
    sqlx::query("UPDATE questions SET deadline = $2 WHERE id = $1")
        .bind(question.id.as_uuid())
        .bind(deadline)
        .execute(store.pool())
        .await
        .expect("deadline restored");
    resume_after_an_hour(store, &task).await;
    let moved = store
        .get_question(question.id)
        .await
        .expect("question")
        .deadline
        .expect("deadline");
    let by = moved - deadline;
    moved_by_the_hour_paused("the deadline", by);
    db.drop().await;
}

#[tokio::test]
async fn a_question_without_a_deadline_is_passed_on_the_time_paused_later() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, claimed) = running(store).await;
    let mut input = ask_input(1, "call-1");
    input.escalation = hark_control::store::Escalation {
        to: vec!["qq:20002".into()],
        after: Some(Duration::from_secs(600)),
    };
    let asked = store.ask(&claimed.lease, &input).await.expect("asked");
    // No deadline: it waits as long as it takes, and only its escalation has a time.
    sqlx::query("UPDATE questions SET deadline = NULL WHERE id = $1")
        .bind(asked.id.as_uuid())
        .execute(store.pool())
        .await
        .expect("deadline removed");
    let before = store.get_question(asked.id).await.expect("question");
    assert!(before.deadline.is_none());
    let escalate_at = before.escalate_at.expect("it escalates at a time");

    store.pause(task.id, "api").await.expect("pause");
    resume_after_an_hour(store, &task).await;
    let after = store.get_question(asked.id).await.expect("question");
    assert!(after.deadline.is_none(), "it still has no deadline");
    let by = after.escalate_at.expect("it still escalates") - escalate_at;
    moved_by_the_hour_paused("the escalation", by);
    // So it is not passed on at once: its time has not come.
    assert_eq!(store.escalate_due(100).await.expect("sweep"), 0);
    db.drop().await;
}

#[tokio::test]
async fn a_running_task_pauses_at_its_round_boundary_and_holds_no_worker() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, claimed) = running(store).await;
    let asked = store.pause(task.id, "api").await.expect("pause");
    assert_eq!(
        asked.state,
        TaskState::Running,
        "it is not stopped mid-round"
    );
    assert!(asked.pause_requested);
    assert_eq!(
        asked.generation, claimed.lease.generation,
        "the worker's lease still holds"
    );
    assert!(matches!(
        store.pause(task.id, "api").await,
        Err(Error::Already { .. })
    ));

    // The round ends: the checkpoint tells the worker to stop, and its hand-back pauses.
    let pause = store
        .checkpoint(
            &claimed.lease,
            1,
            &json!([{"role": "assistant", "content": "step"}]),
            &[],
        )
        .await
        .expect("checkpoint under the lease");
    assert!(pause, "the checkpoint tells the worker to pause");
    let jobs_before = jobs_of(store, &task).await;
    let paused =
        hark_control::cases::command::release(store, &claimed.lease, "paused by its owner")
            .await
            .expect("release");
    assert_eq!(paused.state, TaskState::Paused);
    assert!(!paused.pause_requested);
    assert!(paused.worker_id.is_none() && paused.lease_until.is_none());
    assert_eq!(jobs_of(store, &task).await, jobs_before, "no run queued");

    let resumed = store.resume(task.id, "api").await.expect("resume");
    assert_eq!(resumed.state, TaskState::Pending);
    let claimed = store
        .claim(task.id, resumed.generation, "w2", LEASE)
        .await
        .expect("claimed again");
    assert_eq!(claimed.rounds.len(), 1, "it goes on from its checkpoint");
    db.drop().await;
}

#[tokio::test]
async fn an_ask_while_a_pause_waits_asks_and_pauses() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, claimed) = running(store).await;
    store.pause(task.id, "api").await.expect("pause requested");
    let question = store
        .ask(&claimed.lease, &ask_input(1, "call-1"))
        .await
        .expect("the ask is taken");
    let now = store.get_task(task.id).await.expect("task");
    assert_eq!(now.state, TaskState::Paused);
    assert!(now.paused_at.is_some() && !now.pause_requested);
    assert_eq!(
        store.get_question(question.id).await.expect("q").outcome,
        QuestionOutcome::Open
    );
    let resumed = store.resume(task.id, "api").await.expect("resume");
    assert_eq!(resumed.state, TaskState::WaitingInput);
    db.drop().await;
}

#[tokio::test]
async fn a_resume_before_the_boundary_withdraws_the_pause() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, claimed) = running(store).await;
    store.pause(task.id, "api").await.expect("pause requested");
    let withdrawn = store.resume(task.id, "api").await.expect("resume");
    assert_eq!(withdrawn.state, TaskState::Running);
    assert!(!withdrawn.pause_requested);
    let pause = store
        .checkpoint(&claimed.lease, 1, &json!([]), &[])
        .await
        .expect("checkpoint");
    assert!(!pause, "the run goes on");
    db.drop().await;
}

#[tokio::test]
async fn a_queued_task_pauses_at_once_and_its_old_job_is_refused() {
    let db = TestDb::new().await;
    let store = &db.store;
    let task = new_task(store, Some(group_chat())).await;
    let paused = store.pause(task.id, "api").await.expect("pause");
    assert_eq!(paused.state, TaskState::Paused);
    assert!(
        store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .is_err(),
        "the job queued before the pause is stale"
    );
    assert!(matches!(
        store.resume(task.id, "api").await.map(|t| t.state),
        Ok(TaskState::Pending)
    ));
    assert!(matches!(
        store.resume(task.id, "api").await,
        Err(Error::Already { .. })
    ));
    db.drop().await;
}

#[tokio::test]
async fn a_paused_task_is_cancelled_with_its_question() {
    let db = TestDb::new().await;
    let store = &db.store;
    let task = waiting(store).await;
    store.pause(task.id, "api").await.expect("pause");
    let question = store
        .open_question_of(task.id)
        .await
        .expect("read")
        .expect("open");
    let cancelled = store
        .cancel(task.id, "api", "not needed")
        .await
        .expect("cancel");
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert!(cancelled.paused_at.is_none());
    assert_eq!(
        store.get_question(question.id).await.expect("q").outcome,
        QuestionOutcome::Cancelled
    );
    assert!(matches!(
        store.pause(task.id, "api").await,
        Err(Error::WrongState { .. })
    ));
    db.drop().await;
}

#[tokio::test]
async fn a_lost_lease_with_a_pause_waiting_pauses_instead_of_queueing() {
    let db = TestDb::new().await;
    let store = &db.store;
    let task = new_task(store, Some(group_chat())).await;
    store
        .claim(task.id, task.generation, "w1", LEASE)
        .await
        .expect("claim wins");
    store.pause(task.id, "api").await.expect("pause requested");
    sqlx::query("UPDATE tasks SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(task.id.as_uuid())
        .execute(store.pool())
        .await
        .expect("lease lapsed");
    let jobs_before = jobs_of(store, &task).await;
    assert_eq!(store.recover_leases(3, 100).await.expect("sweep"), 1);
    let now = store.get_task(task.id).await.expect("task");
    assert_eq!(now.state, TaskState::Paused);
    assert_eq!(now.attempt, 2, "the lost run counts");
    assert_eq!(jobs_of(store, &task).await, jobs_before);
    db.drop().await;
}
