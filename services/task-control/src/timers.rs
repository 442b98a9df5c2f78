//! The clock loop: every tick it expires questions, sends reminders, escalates unanswered
//! questions, recovers lost leases,
//! enforces the running-time bound, ends tasks past their own deadline and starts the runs of
//! schedules that are due. Any number of replicas may run it at once; the store takes
//! rows with `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{cases::clock, shared::Shared};

/// How often the loop looks for due work.
pub const TICK: Duration = Duration::from_millis(500);
const BATCH: i64 = 200;

pub async fn run(shared: Shared, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let due = shared.store.timers_due();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = due.notified() => {}
        }
        if let Err(e) = sweep(&shared).await {
            tracing::warn!(error = %e, "timer sweep failed; retrying at the next tick");
        }
    }
}

/// One pass over everything the clock drives.
pub async fn sweep(shared: &Shared) -> Result<(), crate::store::Error> {
    let task = &shared.config.task;
    let store = &shared.store;
    let expired = clock::expire_due(store, BATCH).await?;
    let reminded = clock::remind_due(store, task.remind_before.0, BATCH).await?;
    let escalated = clock::escalate_due(store, BATCH).await?;
    let max_attempts = i32::try_from(task.max_attempts).unwrap_or(i32::MAX);
    let recovered = clock::recover_leases(store, max_attempts, BATCH).await?;
    let overtime = clock::enforce_max_runtime(store, task.max_runtime.0, BATCH).await?;
    let overdue = crate::cases::command::end_overdue(store, BATCH)
        .await?
        .len();
    let scheduled = store
        .start_due_schedules(BATCH, task.max_active_per_owner)
        .await?
        .len();
    let settled =
        crate::cases::answer::settle_subtasks(crate::cases::answer::Answers::of(shared), BATCH)
            .await?;
    if expired + reminded + escalated + recovered + overtime.len() + overdue + scheduled + settled
        > 0
    {
        tracing::info!(
            expired,
            reminded,
            escalated,
            recovered,
            overtime = overtime.len(),
            overdue,
            scheduled,
            settled,
            "timers fired"
        );
    }
    Ok(())
}

/// How often the upkeep loop looks at the tables' statistics.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(2);

/// Keeps hark's tables analyzed as they grow, and vacuumed too while the server's autovacuum is
/// off (see [`crate::store::Upkeep`]).
pub async fn upkeep(shared: Shared, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(UPKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pass = async {
            let autovacuum = shared.store.autovacuum_on().await?;
            shared
                .store
                .upkeep_with(!autovacuum)
                .await
                .map(|done| (autovacuum, done))
        };
        match pass.await {
            Ok((true, done)) => {
                if !done.analyzed.is_empty() {
                    tracing::debug!(analyzed = ?done.analyzed, "table statistics refreshed");
                }
            }
            Ok((false, done)) => {
                if !told {
                    tracing::debug!(
                        "the database's autovacuum is off: task-control analyzes and vacuums its own tables"
                    );
                    told = true;
                }
                if !done.analyzed.is_empty() || !done.vacuumed.is_empty() {
                    tracing::debug!(analyzed = ?done.analyzed, vacuumed = ?done.vacuumed, "table upkeep");
                }
            }
            Err(e) => tracing::warn!(error = %e, "table upkeep failed; retrying later"),
        }
    }
}

/// How often finished tasks past their retention are looked for (and once at start).
pub const RETENTION_EVERY: Duration = Duration::from_secs(600);
const PURGE_BATCH: i64 = 1000;

/// Deletes finished tasks once `task.retention` passed since they ended (see
/// [`crate::store::Store::purge_finished`]); does nothing when it is `0s`.
pub async fn retention(shared: Shared, shutdown: CancellationToken) {
    let keep = shared.config.task.retention.0;
    if keep.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(RETENTION_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Batch after batch until caught up, so that no statement holds many rows at once.
        let (mut tasks, mut applied) = (0, 0);
        loop {
            match shared.store.purge_finished(keep, PURGE_BATCH).await {
                Ok(purged) => {
                    tasks += purged.tasks;
                    applied += purged.applied_inbound;
                    if purged
                        .tasks
                        .max(purged.applied_inbound)
                        .max(purged.schedules)
                        .max(purged.grants)
                        < PURGE_BATCH as u64
                    {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot delete finished tasks past their retention; retrying later");
                    break;
                }
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
        if tasks + applied > 0 {
            tracing::info!(
                tasks,
                applied_inbound = applied,
                retention = %shared.config.task.retention,
                "deleted finished tasks past their retention (task.retention)"
            );
        }
    }
}
