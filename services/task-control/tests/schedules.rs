//! Scheduled and recurring tasks against the real Postgres: each run starts one task of its own,
//! however often it is taken; a run skips while the last one's task has not ended; a cancelled
//! schedule starts nothing.

mod common;

use std::time::Duration;

use common::{Cases as _, TestDb, tasks::owner};
use hark_control::store::{NewSchedule, Overlap, ScheduleRow, Store};
use hark_core::domain::{TaskState, TimeoutPolicy, schedule::Cron};
use time::OffsetDateTime;

fn every_morning(first_run: OffsetDateTime) -> NewSchedule {
    NewSchedule {
        owner: owner(),
        goal: "the morning report".into(),
        chat: None,
        ask_timeout: Duration::from_secs(600),
        on_timeout: TimeoutPolicy::Resume,
        cron: Some("0 9 * * *".parse::<Cron>().expect("cron")),
        timezone: "Asia/Shanghai".into(),
        first_run,
        overlap: Overlap::Skip,
        request_id: None,
        priority: 0,
    }
}

async fn schedule(store: &Store, id: uuid::Uuid) -> ScheduleRow {
    store
        .list_schedules(None, true, 100)
        .await
        .expect("schedules")
        .into_iter()
        .find(|s| s.id == id)
        .expect("the schedule")
}

async fn tasks_of(store: &Store, id: uuid::Uuid) -> Vec<uuid::Uuid> {
    sqlx::query_scalar("SELECT id FROM tasks WHERE schedule_id = $1 ORDER BY created_at")
        .bind(id)
        .fetch_all(store.pool())
        .await
        .expect("tasks")
}

/// Makes the schedule's next run due, as if the time until it had passed: the run moves two days
/// back, into the past.
async fn due_now(store: &Store, id: uuid::Uuid) {
    sqlx::query("UPDATE schedules SET next_run = next_run - interval '2 days' WHERE id = $1")
        .bind(id)
        .execute(store.pool())
        .await
        .expect("due");
}

#[tokio::test]
async fn a_recurring_schedule_starts_one_task_per_run_and_moves_to_its_next_time() {
    let db = TestDb::new().await;
    let store = &db.store;
    let made = store
        .create_schedule(&every_morning(
            OffsetDateTime::now_utc() - Duration::from_secs(1),
        ))
        .await
        .expect("schedule");
    let started = store.start_due_schedules(100, 0).await.expect("sweep");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].schedule_id, Some(made.id));
    assert_eq!(started[0].goal, "the morning report");
    assert_eq!(started[0].state, TaskState::Pending);
    let after = schedule(store, made.id).await;
    assert_eq!(after.runs, 1);
    let next = after.next_run.expect("a recurring schedule stays active");
    assert!(next > OffsetDateTime::now_utc());
    assert_eq!(
        hark_core::domain::schedule::shown_in(next, "Asia/Shanghai")
            .split(' ')
            .nth(1),
        Some("09:00"),
        "the next run is at 09:00 in the schedule's zone"
    );
    // Not due: nothing more starts.
    assert!(
        store
            .start_due_schedules(100, 0)
            .await
            .expect("sweep")
            .is_empty()
    );
    db.drop().await;
}

#[tokio::test]
async fn a_run_taken_again_after_a_crash_finds_the_task_it_started() {
    let db = TestDb::new().await;
    let store = &db.store;
    let run_at = OffsetDateTime::now_utc() - Duration::from_secs(5);
    let made = store
        .create_schedule(&NewSchedule {
            overlap: Overlap::Allow,
            ..every_morning(run_at)
        })
        .await
        .expect("schedule");
    store.start_due_schedules(100, 0).await.expect("sweep");
    // As if the process died after the task was created and before the schedule moved on: the
    // schedule is at the same run again.
    sqlx::query("UPDATE schedules SET next_run = $2, runs = 0, last_task = NULL WHERE id = $1")
        .bind(made.id)
        .bind(made.next_run.expect("first run"))
        .execute(store.pool())
        .await
        .expect("rolled back");
    store.start_due_schedules(100, 0).await.expect("sweep");
    assert_eq!(
        tasks_of(store, made.id).await.len(),
        1,
        "the same run started no second task"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_run_is_skipped_while_the_last_task_has_not_ended() {
    let db = TestDb::new().await;
    let store = &db.store;
    let made = store
        .create_schedule(&every_morning(
            OffsetDateTime::now_utc() - Duration::from_secs(1),
        ))
        .await
        .expect("schedule");
    let first = store.start_due_schedules(100, 0).await.expect("sweep");
    due_now(store, made.id).await;
    assert!(
        store
            .start_due_schedules(100, 0)
            .await
            .expect("sweep")
            .is_empty()
    );
    let after = schedule(store, made.id).await;
    assert_eq!((after.runs, after.skipped), (1, 1));
    assert!(after.next_run.expect("still active") > OffsetDateTime::now_utc());

    // Once the last run's task ended, the next run starts.
    store
        .cancel(first[0].id, "api", "done by hand")
        .await
        .expect("cancel");
    due_now(store, made.id).await;
    assert_eq!(
        store
            .start_due_schedules(100, 0)
            .await
            .expect("sweep")
            .len(),
        1
    );
    assert_eq!(tasks_of(store, made.id).await.len(), 2);
    db.drop().await;
}

#[tokio::test]
async fn a_one_off_schedule_runs_once_and_a_cancelled_one_never() {
    let db = TestDb::new().await;
    let store = &db.store;
    let soon = OffsetDateTime::now_utc() - Duration::from_secs(1);
    let once = store
        .create_schedule(&NewSchedule {
            cron: None,
            ..every_morning(soon)
        })
        .await
        .expect("schedule");
    let cancelled = store
        .create_schedule(&NewSchedule {
            cron: None,
            goal: "never mind".into(),
            ..every_morning(soon)
        })
        .await
        .expect("schedule");
    let gone = store.cancel_schedule(cancelled.id).await.expect("cancel");
    assert_eq!(gone.state.as_str(), "cancelled");
    assert!(store.cancel_schedule(cancelled.id).await.is_err());
    let started = store.start_due_schedules(100, 0).await.expect("sweep");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].schedule_id, Some(once.id));
    let done = schedule(store, once.id).await;
    assert_eq!(done.state.as_str(), "done");
    assert!(done.next_run.is_none());
    assert!(tasks_of(store, cancelled.id).await.is_empty());
    db.drop().await;
}

#[tokio::test]
async fn a_run_over_the_owners_limit_is_skipped_not_failed() {
    let db = TestDb::new().await;
    let store = &db.store;
    let made = store
        .create_schedule(&NewSchedule {
            overlap: Overlap::Allow,
            ..every_morning(OffsetDateTime::now_utc() - Duration::from_secs(1))
        })
        .await
        .expect("schedule");
    store.start_due_schedules(100, 1).await.expect("sweep");
    due_now(store, made.id).await;
    assert!(
        store
            .start_due_schedules(100, 1)
            .await
            .expect("sweep")
            .is_empty()
    );
    let after = schedule(store, made.id).await;
    assert_eq!((after.runs, after.skipped), (1, 1));
    db.drop().await;
}

#[tokio::test]
async fn an_ended_schedule_is_deleted_after_the_retention_and_an_active_one_never() {
    let db = TestDb::new().await;
    let store = &db.store;
    let later = OffsetDateTime::now_utc() + Duration::from_secs(3600);
    let active = store
        .create_schedule(&every_morning(later))
        .await
        .expect("schedule");
    let ended = store
        .create_schedule(&every_morning(later))
        .await
        .expect("schedule");
    store.cancel_schedule(ended.id).await.expect("cancel");
    let keep = Duration::from_secs(30 * 86_400);
    assert_eq!(
        store
            .purge_finished(keep, 100)
            .await
            .expect("purge")
            .schedules,
        0
    );
    sqlx::query(
        "UPDATE schedules SET ended_at = ended_at - interval '40 days',
                              created_at = created_at - interval '40 days'",
    )
    .execute(store.pool())
    .await
    .expect("aged");
    assert_eq!(
        store
            .purge_finished(keep, 100)
            .await
            .expect("purge")
            .schedules,
        1
    );
    let left: Vec<uuid::Uuid> = store
        .list_schedules(None, true, 100)
        .await
        .expect("schedules")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(left, [active.id]);
    db.drop().await;
}
