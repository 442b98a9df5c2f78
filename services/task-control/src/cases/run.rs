//! What the worker running a task asks of it under its lease, beyond the claim: to suspend it on
//! a question, and to end it with its result. Each is decided here and applied by one
//! statement that holds only while the lease does.

use hark_core::domain::decide::{self, Command, State};
use time::OffsetDateTime;

use crate::store::{AskDecided, AskInput, Error, Lease, QuestionRow, Store, TaskRow};

/// What `command` does to the running task held under `lease`, with or without a pause
/// waiting for it. The statement that applies it checks the lease and the state itself.
fn decide_running(
    store: &Store,
    lease: &Lease,
    command: &Command<'_>,
    pause_requested: bool,
) -> Result<decide::Decision, Error> {
    decide::decide_on_state(
        State::Running { pause_requested },
        command,
        OffsetDateTime::now_utc(),
        store.policy(),
    )
    .map_err(|r| Error::refused(lease.task, r))
}

/// Suspends the task on the question `input` asks: it waits on it, or pauses with it open when
/// a pause was requested meanwhile. An ask may name people to ask at once (`ask_to`) or one
/// after another (`escalate_to`), not both.
pub async fn ask(store: &Store, lease: &Lease, input: &AskInput) -> Result<QuestionRow, Error> {
    if !input.escalation.to.is_empty() && !input.ask_to.is_empty() {
        return Err(Error::Invalid(
            "ask_to and escalate_to cannot be combined: ask everyone at once with ask_to, or \
             one after another with escalate_to"
                .into(),
        ));
    }
    // How the question waits follows from what never changes of the task, kept in memory.
    let wait = store.fixed_of(lease.task).await?.wait(input.timeout);
    let ask = Command::Ask { wait };
    let decided = AskDecided {
        waits: decide_running(store, lease, &ask, false)?,
        pauses: decide_running(store, lease, &ask, true)?,
    };
    store.suspend(lease, input, &decided).await
}

/// Ends the running task with its final answer, sent to its chat; with `final_round`, the
/// round that gave it is stored with it.
pub async fn complete(
    store: &Store,
    lease: &Lease,
    final_round: Option<(i32, &serde_json::Value)>,
    result: &str,
) -> Result<TaskRow, Error> {
    let finish = decide_running(store, lease, &Command::Finish { result }, false)?;
    store.finish(lease, final_round, result, &finish).await
}
