//! The commands given to a task from outside its run — cancel, pause, resume and the task's own
//! deadline — and those its worker gives under its lease — fail and hand back. Each reads the
//! task as it is now, decides with [`decide`], and applies the decision as one compare-and-set;
//! a command that lost a race is decided again on what the winner left.

use hark_core::domain::{
    TaskId, TaskState, TimeoutPolicy,
    decide::{self, Command},
};
use time::OffsetDateTime;

use crate::store::{Error, Lease, Store, TaskRow};

/// How many times a command from outside the run is decided again after losing a race before
/// it is refused as busy.
const RETRIES: usize = 16;

/// Decides `command` on the task as it is now and applies it, deciding again when another
/// writer moved the task first: a cancel, a pause, a resume or a deadline must win eventually.
pub async fn command(
    store: &Store,
    task: TaskId,
    command: Command<'_>,
    actor: &str,
    detail: &str,
) -> Result<TaskRow, Error> {
    for _ in 0..RETRIES {
        let (row, lifecycle) = store.task_now(task).await?;
        let decision = decide::decide(
            &lifecycle,
            &command,
            OffsetDateTime::now_utc(),
            store.policy(),
        )
        .map_err(|r| Error::refused(task, r))?;
        if let Some(row) = store.apply(&row, decision, actor, detail, None).await? {
            return Ok(row);
        }
    }
    Err(Error::Busy(format!(
        "task {task}: `{}` kept losing races",
        command.event(TimeoutPolicy::Resume)
    )))
}

/// Cancels a task that has not ended; its open question is closed as cancelled and the chat is
/// told, in one statement.
pub async fn cancel(
    store: &Store,
    task: TaskId,
    actor: &str,
    reason: &str,
) -> Result<TaskRow, Error> {
    let cancelled = command(store, task, Command::Cancel { reason }, actor, reason).await?;
    tracing::info!(task = %task, by = actor, "task cancelled");
    Ok(cancelled)
}

/// Pauses a task: a pending or waiting one at once, a running one at its next round boundary.
/// A paused task holds no worker, and its question's deadline stands still.
pub async fn pause(store: &Store, task: TaskId, actor: &str) -> Result<TaskRow, Error> {
    command(store, task, Command::Pause, actor, "").await
}

/// Resumes a paused task: it waits on its open question again, its deadline moved on by the
/// time it stood still, or, with none open, it is queued to run.
pub async fn resume(store: &Store, task: TaskId, actor: &str) -> Result<TaskRow, Error> {
    command(store, task, Command::Resume, actor, "").await
}

/// Ends the tasks whose own deadline passed before they ended, at most `limit`, each as its
/// `on_deadline` says: failed or cancelled, an open question closed with it, a worker that runs
/// it told to stop, its chat told. A task another replica ended first is left be. Returns the
/// tasks it ended.
pub async fn end_overdue(store: &Store, limit: i64) -> Result<Vec<TaskId>, Error> {
    let mut ended = Vec::new();
    for due in store.overdue(limit).await? {
        let why = format!(
            "the task passed its deadline ({})",
            due.deadline
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        );
        let overdue = Command::Overdue {
            policy: due.policy,
            why: &why,
        };
        match command(store, due.task, overdue, "deadline", &why).await {
            Ok(_) => {
                hark_core::failpoint::hit("overdue.after_commit");
                tracing::info!(task = %due.task, policy = %due.policy, "task ended at its deadline");
                ended.push(due.task);
            }
            // Ended meanwhile, by its run, its owner or another replica's sweep.
            Err(Error::WrongState { .. } | Error::Already { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ended)
}

/// Decides a `command` of the worker holding `lease` and applies it while the lease holds.
async fn leased(
    store: &Store,
    lease: &Lease,
    command: Command<'_>,
    detail: &str,
) -> Result<TaskRow, Error> {
    loop {
        let row = store.get_task(lease.task).await?;
        if row.state != TaskState::Running
            || row.generation != lease.generation
            || row.worker_id.as_deref() != Some(lease.worker_id.as_str())
        {
            return Err(store.refusal(lease).await);
        }
        let lifecycle = row
            .lifecycle(None)
            .ok_or_else(|| Error::Internal(format!("task {} has no lifecycle", lease.task)))?;
        let decision = decide::decide(
            &lifecycle,
            &command,
            OffsetDateTime::now_utc(),
            store.policy(),
        )
        .map_err(|r| Error::refused(lease.task, r))?;
        let worker = Some(lease.worker_id.as_str());
        if let Some(row) = store
            .apply(&row, decision, &lease.worker_id, detail, worker)
            .await?
        {
            return Ok(row);
        }
        // A pause requested meanwhile changes what a hand-back does: decide again while the
        // lease holds.
        if !matches!(command, Command::Release) {
            return Err(store.refusal(lease).await);
        }
    }
}

/// Ends a running task as failed, telling its chat why.
pub async fn fail(store: &Store, lease: &Lease, error: &str) -> Result<TaskRow, Error> {
    let failed = leased(store, lease, Command::Fail { error }, error).await?;
    tracing::info!(task = %lease.task, error = crate::render::clip(error, 80), "task failed");
    Ok(failed)
}

/// Hands a running task back from a worker that stops at a round boundary: it is queued again
/// at once to continue from its last checkpoint, and its attempts are not counted up; or, when
/// a pause was asked of it, it pauses.
pub async fn release(store: &Store, lease: &Lease, reason: &str) -> Result<TaskRow, Error> {
    leased(store, lease, Command::Release, reason).await
}
