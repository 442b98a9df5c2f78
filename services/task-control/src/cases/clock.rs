//! What the clock decides: a question's deadline passing, a worker's lease lapsing, and a run
//! outgrowing its bound. The store finds the due tasks and holds them locked while each is
//! decided here; one commit applies the whole sweep, so any number of replicas may sweep at
//! once without doing anything twice.

use std::time::Duration;

use hark_core::domain::{
    TaskId,
    decide::{self, Askees, Command, Policy},
};

use crate::{
    render,
    store::{Due, Error, QuestionRow, Store, Sweep, TaskRow},
};

/// Decides `command` on each task of `sweep` and applies what is decided, then commits; the
/// tasks whose move won. A refusal leaves its task be, and says so in the log as `refused`.
async fn sweep(
    store: &Store,
    (mut sweep, due): (Sweep, Vec<Due>),
    command: &Command<'_>,
    policy: Policy,
    refused: &str,
) -> Result<Vec<TaskId>, Error> {
    let mut moved = Vec::new();
    for due in due {
        match decide::decide(&due.lifecycle, command, due.now, policy) {
            Ok(decision) => {
                if store.apply_due(&mut sweep, &due, decision).await? {
                    moved.push(due.task);
                }
            }
            Err(refusal) => tracing::warn!(task = %due.task, %refusal, "{refused}"),
        }
    }
    store.commit_sweep(sweep).await?;
    Ok(moved)
}

/// Closes open questions whose deadline passed and applies each task's policy: `resume` queues
/// the task with the expiry notice for the model, `fail` ends it. Returns how many questions
/// expired.
pub async fn expire_due(store: &Store, limit: i64) -> Result<usize, Error> {
    let due = store.questions_past_deadline(limit).await?;
    let refused = "an open question past its deadline stays open";
    let expired = sweep(store, due, &Command::Expire, store.policy(), refused).await?;
    Ok(expired.len())
}

/// Returns running tasks whose lease ran out to `pending`, to continue from their last
/// checkpoint on another worker, or fails them once `max_attempts` runs were lost. Returns how
/// many tasks were recovered or failed.
pub async fn recover_leases(store: &Store, max_attempts: i32, limit: i64) -> Result<usize, Error> {
    let due = store.leases_lapsed(limit).await?;
    let policy = Policy { max_attempts };
    let refused = "a lapsed lease stays";
    let moved = sweep(store, due, &Command::LeaseExpired, policy, refused).await?;
    Ok(moved.len())
}

/// Fails running tasks whose total running time passed `max` (`task.max_runtime`), and tells
/// their workers to stop. Returns their ids.
pub async fn enforce_max_runtime(
    store: &Store,
    max: Duration,
    limit: i64,
) -> Result<Vec<TaskId>, Error> {
    if max.is_zero() {
        return Ok(Vec::new());
    }
    let due = store.over_runtime(max, limit).await?;
    let error = format!(
        "the task ran longer than task.max_runtime = {}",
        render::human(max)
    );
    let overran = Command::Overran { error: &error };
    let refused = "a task past its running time runs on";
    sweep(store, due, &overran, store.policy(), refused).await
}

/// Reminds the people asked of open questions whose deadline is less than `before` away
/// (`task.remind_before`), once per question. Returns how many reminders were queued.
pub async fn remind_due(store: &Store, before: Duration, limit: i64) -> Result<usize, Error> {
    let policy = store.policy();
    let remind = Command::Remind { before };
    let decide = |question: &QuestionRow, now| super::reminder(question, &remind, now, policy);
    store.remind_questions(before, limit, decide).await
}

/// Asks the next person of each open question whose escalation is due (or, for a question put
/// to several people at once, the others). Returns how many were asked.
pub async fn escalate_due(store: &Store, limit: i64) -> Result<usize, Error> {
    let policy = store.policy();
    let decide = |task: &TaskRow, question: &QuestionRow, askees: Askees<'_>, now| {
        super::decide_asked(task, question, &Command::Escalate { askees }, now, policy)
    };
    store.escalate_questions(limit, decide).await
}
