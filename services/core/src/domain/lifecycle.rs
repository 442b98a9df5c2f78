//! The task lifecycle of DESIGN.md as one transition function.
//!
//! ```text
//! pending ──claim──▶ running ──ask──▶ waiting_input ──answer / expiry(resume)──▶ pending
//! running ──finish──▶ completed      running ──fail──▶ failed
//! running ──lease expired──▶ pending (attempt + 1, resumes from the last checkpoint)
//! running ──released by a stopping worker──▶ pending (same attempt, from the last checkpoint)
//! any non-terminal ──cancel──▶ cancelled          waiting_input ──expiry(fail)──▶ failed
//! pending, waiting_input ──pause──▶ paused ──resume──▶ waiting_input (question open) or pending
//! running ──pause──▶ running, then paused at its next round boundary (ask, hand-back, lost lease)
//! ```
//!
//! Pauses depend on what a state carries (a requested pause, an open question), so they are
//! decided by [`super::decide`], which uses this table for every other move.
//!
//! Storage persists a transition as a compare-and-set on `(state, generation)`; this module only
//! decides whether a move is allowed and where it leads.

use std::{fmt, str::FromStr};

use hark_proto::v1 as pb;
use serde::{Deserialize, Serialize};

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Queued for a worker.
    Pending,
    /// Held by one worker under a lease.
    Running,
    /// A question is open; no worker holds the task.
    WaitingInput,
    /// Held still by its owner: no worker holds it and its deadlines do not run.
    Paused,
    Completed,
    Failed,
    Cancelled,
}

impl TaskState {
    pub const ALL: [TaskState; 7] = [
        TaskState::Pending,
        TaskState::Running,
        TaskState::WaitingInput,
        TaskState::Paused,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// The name stored in Postgres and shown to people.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::WaitingInput => "waiting_input",
            TaskState::Paused => "paused",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }

    pub fn to_proto(self) -> pb::TaskState {
        match self {
            TaskState::Pending => pb::TaskState::Pending,
            TaskState::Running => pb::TaskState::Running,
            TaskState::WaitingInput => pb::TaskState::WaitingInput,
            TaskState::Paused => pb::TaskState::Paused,
            TaskState::Completed => pb::TaskState::Completed,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Cancelled => pb::TaskState::Cancelled,
        }
    }

    /// `None` for `TASK_STATE_UNSPECIFIED`.
    pub fn from_proto(state: pb::TaskState) -> Option<Self> {
        Some(match state {
            pb::TaskState::Unspecified => return None,
            pb::TaskState::Pending => TaskState::Pending,
            pb::TaskState::Running => TaskState::Running,
            pb::TaskState::WaitingInput => TaskState::WaitingInput,
            pb::TaskState::Paused => TaskState::Paused,
            pb::TaskState::Completed => TaskState::Completed,
            pb::TaskState::Failed => TaskState::Failed,
            pb::TaskState::Cancelled => TaskState::Cancelled,
        })
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state name was not one of [`TaskState::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a task state: expected pending, running, waiting_input, paused, completed, failed or cancelled"
)]
pub struct UnknownState(pub String);

impl FromStr for TaskState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        TaskState::ALL
            .into_iter()
            .find(|state| {
                state.as_str() == lower || (lower == "waiting" && *state == TaskState::WaitingInput)
            })
            .ok_or_else(|| UnknownState(super::ids::shown(s)))
    }
}

/// What a question's expiry does to its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutPolicy {
    /// Resume the agent with a tool result saying that no answer came in time.
    #[default]
    Resume,
    /// Fail the task.
    Fail,
    /// Questions have no deadline.
    Never,
}

impl TimeoutPolicy {
    pub const ALL: [TimeoutPolicy; 3] = [
        TimeoutPolicy::Resume,
        TimeoutPolicy::Fail,
        TimeoutPolicy::Never,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutPolicy::Resume => "resume",
            TimeoutPolicy::Fail => "fail",
            TimeoutPolicy::Never => "never",
        }
    }

    pub fn to_proto(self) -> pb::TimeoutPolicy {
        match self {
            TimeoutPolicy::Resume => pb::TimeoutPolicy::Resume,
            TimeoutPolicy::Fail => pb::TimeoutPolicy::Fail,
            TimeoutPolicy::Never => pb::TimeoutPolicy::Never,
        }
    }

    /// `None` for `TIMEOUT_POLICY_UNSPECIFIED`, meaning "the server's default".
    pub fn from_proto(policy: pb::TimeoutPolicy) -> Option<Self> {
        match policy {
            pb::TimeoutPolicy::Unspecified => None,
            pb::TimeoutPolicy::Resume => Some(TimeoutPolicy::Resume),
            pb::TimeoutPolicy::Fail => Some(TimeoutPolicy::Fail),
            pb::TimeoutPolicy::Never => Some(TimeoutPolicy::Never),
        }
    }
}

impl fmt::Display for TimeoutPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the passing of a task's deadline does to a task that has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadlinePolicy {
    /// Fail the task; an open question is closed as expired.
    #[default]
    Fail,
    /// Cancel the task; an open question is closed as cancelled.
    Cancel,
}

impl DeadlinePolicy {
    pub const ALL: [DeadlinePolicy; 2] = [DeadlinePolicy::Fail, DeadlinePolicy::Cancel];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadlinePolicy::Fail => "fail",
            DeadlinePolicy::Cancel => "cancel",
        }
    }

    pub fn to_proto(self) -> pb::DeadlinePolicy {
        match self {
            DeadlinePolicy::Fail => pb::DeadlinePolicy::Fail,
            DeadlinePolicy::Cancel => pb::DeadlinePolicy::Cancel,
        }
    }

    /// `None` for `DEADLINE_POLICY_UNSPECIFIED`, meaning "the server's default".
    pub fn from_proto(policy: pb::DeadlinePolicy) -> Option<Self> {
        match policy {
            pb::DeadlinePolicy::Unspecified => None,
            pb::DeadlinePolicy::Fail => Some(DeadlinePolicy::Fail),
            pb::DeadlinePolicy::Cancel => Some(DeadlinePolicy::Cancel),
        }
    }
}

impl fmt::Display for DeadlinePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The policy name was not `fail` or `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a deadline policy: expected fail or cancel")]
pub struct UnknownDeadlinePolicy(pub String);

impl FromStr for DeadlinePolicy {
    type Err = UnknownDeadlinePolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        DeadlinePolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == lower)
            .ok_or_else(|| UnknownDeadlinePolicy(super::ids::shown(s)))
    }
}

/// The policy name was not `resume`, `fail` or `never`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a timeout policy: expected resume, fail or never")]
pub struct UnknownPolicy(pub String);

impl FromStr for TimeoutPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        TimeoutPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == lower)
            .ok_or_else(|| UnknownPolicy(super::ids::shown(s)))
    }
}

/// Something that happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A worker takes a pending task under a lease.
    Claim,
    /// The agent called `ask_user`.
    Ask,
    /// The owner answered the open question.
    Answer,
    /// The open question's deadline passed; what happens follows the task's policy.
    Expire(TimeoutPolicy),
    /// The agent gave its final answer.
    Finish,
    /// The run failed for good (an error that survived retries, attempts or runtime exhausted).
    Fail,
    /// The worker's lease ran out; another worker continues from the last checkpoint.
    LeaseExpired,
    /// The worker holding the task stopped and handed it back; another continues from the last
    /// checkpoint, and no attempt is counted.
    Release,
    Cancel,
    /// The owner paused the task (or asked a running one to pause at its next round boundary).
    Pause,
    /// The owner resumed a paused task.
    Resume,
    /// The owner was reminded of the open question; the task does not move.
    Remind,
    /// The open question was passed on to another person; the task does not move.
    Delegate,
    /// The open question went unanswered until its escalation time and was asked of the next
    /// person too; the task does not move.
    Escalate,
    /// One of the answers a question put to several people needs came in, and more are
    /// needed; the task does not move.
    Collect,
    /// The task's own deadline passed before it ended; what happens follows its policy.
    Overdue(DeadlinePolicy),
}

impl Event {
    pub const ALL: [Event; 19] = [
        Event::Claim,
        Event::Ask,
        Event::Answer,
        Event::Expire(TimeoutPolicy::Resume),
        Event::Expire(TimeoutPolicy::Fail),
        Event::Expire(TimeoutPolicy::Never),
        Event::Finish,
        Event::Fail,
        Event::LeaseExpired,
        Event::Release,
        Event::Cancel,
        Event::Pause,
        Event::Resume,
        Event::Remind,
        Event::Delegate,
        Event::Escalate,
        Event::Collect,
        Event::Overdue(DeadlinePolicy::Fail),
        Event::Overdue(DeadlinePolicy::Cancel),
    ];

    /// A short name for logs and the audit table.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Claim => "claim",
            Event::Ask => "ask",
            Event::Answer => "answer",
            Event::Expire(TimeoutPolicy::Resume) => "expire_resume",
            Event::Expire(TimeoutPolicy::Fail) => "expire_fail",
            Event::Expire(TimeoutPolicy::Never) => "expire_never",
            Event::Finish => "finish",
            Event::Fail => "fail",
            Event::LeaseExpired => "lease_expired",
            Event::Release => "release",
            Event::Cancel => "cancel",
            Event::Pause => "pause",
            Event::Resume => "resume",
            Event::Remind => "remind",
            Event::Delegate => "delegate",
            Event::Escalate => "escalate",
            Event::Collect => "collect",
            Event::Overdue(DeadlinePolicy::Fail) => "overdue_fail",
            Event::Overdue(DeadlinePolicy::Cancel) => "overdue_cancel",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A move the lifecycle forbids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a task that is {from} cannot take `{event}`")]
pub struct TransitionError {
    pub from: TaskState,
    pub event: Event,
}

/// The one place that decides where an event leads.
pub fn transition(from: TaskState, event: Event) -> Result<TaskState, TransitionError> {
    use Event as E;
    use TaskState as S;
    let to = match (from, event) {
        (S::Pending, E::Claim) => S::Running,
        (S::Running, E::Ask) => S::WaitingInput,
        (S::WaitingInput, E::Answer | E::Expire(TimeoutPolicy::Resume)) => S::Pending,
        (S::WaitingInput, E::Expire(TimeoutPolicy::Fail)) => S::Failed,
        (S::Running, E::Finish) => S::Completed,
        (S::Running, E::Fail) => S::Failed,
        (S::Running, E::LeaseExpired | E::Release) => S::Pending,
        (S::Pending | S::Running | S::WaitingInput | S::Paused, E::Cancel) => S::Cancelled,
        (S::Pending | S::Running | S::WaitingInput | S::Paused, E::Overdue(policy)) => match policy
        {
            DeadlinePolicy::Fail => S::Failed,
            DeadlinePolicy::Cancel => S::Cancelled,
        },
        _ => return Err(TransitionError { from, event }),
    };
    Ok(to)
}

/// How a question ended, or that it is still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuestionOutcome {
    Open,
    Answered,
    Expired,
    /// The task was cancelled (or ended otherwise) while the question was open.
    Cancelled,
    /// A newer question of the same task replaced it.
    Superseded,
}

impl QuestionOutcome {
    pub const ALL: [QuestionOutcome; 5] = [
        QuestionOutcome::Open,
        QuestionOutcome::Answered,
        QuestionOutcome::Expired,
        QuestionOutcome::Cancelled,
        QuestionOutcome::Superseded,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            QuestionOutcome::Open => "open",
            QuestionOutcome::Answered => "answered",
            QuestionOutcome::Expired => "expired",
            QuestionOutcome::Cancelled => "cancelled",
            QuestionOutcome::Superseded => "superseded",
        }
    }

    pub fn is_open(self) -> bool {
        self == QuestionOutcome::Open
    }

    /// Closes an open question. A closed question never changes again.
    pub fn close(self, outcome: QuestionOutcome) -> Option<QuestionOutcome> {
        (self.is_open() && !outcome.is_open()).then_some(outcome)
    }

    pub fn to_proto(self) -> pb::QuestionOutcome {
        match self {
            QuestionOutcome::Open => pb::QuestionOutcome::Open,
            QuestionOutcome::Answered => pb::QuestionOutcome::Answered,
            QuestionOutcome::Expired => pb::QuestionOutcome::Expired,
            QuestionOutcome::Cancelled => pb::QuestionOutcome::Cancelled,
            QuestionOutcome::Superseded => pb::QuestionOutcome::Superseded,
        }
    }
}

impl fmt::Display for QuestionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QuestionOutcome {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QuestionOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| UnknownState(super::ids::shown(s)))
    }
}

macro_rules! try_from_string {
    ($($ty:ty => $err:ty),* $(,)?) => {$(
        impl TryFrom<String> for $ty {
            type Error = $err;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }
    )*};
}

try_from_string!(
    TaskState => UnknownState,
    TimeoutPolicy => UnknownPolicy,
    DeadlinePolicy => UnknownDeadlinePolicy,
    QuestionOutcome => UnknownState,
);

#[cfg(test)]
mod tests {
    use super::*;
    use Event as E;
    use TaskState as S;

    /// Every allowed move, written down from the diagram in DESIGN.md. Every (state, event) pair
    /// not listed here must be refused.
    const ALLOWED: &[(TaskState, Event, TaskState)] = &[
        (S::Pending, E::Claim, S::Running),
        (S::Pending, E::Cancel, S::Cancelled),
        (S::Running, E::Ask, S::WaitingInput),
        (S::Running, E::Finish, S::Completed),
        (S::Running, E::Fail, S::Failed),
        (S::Running, E::LeaseExpired, S::Pending),
        (S::Running, E::Release, S::Pending),
        (S::Running, E::Cancel, S::Cancelled),
        (S::WaitingInput, E::Answer, S::Pending),
        (
            S::WaitingInput,
            E::Expire(TimeoutPolicy::Resume),
            S::Pending,
        ),
        (S::WaitingInput, E::Expire(TimeoutPolicy::Fail), S::Failed),
        (S::WaitingInput, E::Cancel, S::Cancelled),
        (S::Paused, E::Cancel, S::Cancelled),
        (S::Pending, E::Overdue(DeadlinePolicy::Fail), S::Failed),
        (S::Running, E::Overdue(DeadlinePolicy::Fail), S::Failed),
        (S::WaitingInput, E::Overdue(DeadlinePolicy::Fail), S::Failed),
        (S::Paused, E::Overdue(DeadlinePolicy::Fail), S::Failed),
        (S::Pending, E::Overdue(DeadlinePolicy::Cancel), S::Cancelled),
        (S::Running, E::Overdue(DeadlinePolicy::Cancel), S::Cancelled),
        (
            S::WaitingInput,
            E::Overdue(DeadlinePolicy::Cancel),
            S::Cancelled,
        ),
        (S::Paused, E::Overdue(DeadlinePolicy::Cancel), S::Cancelled),
    ];

    #[test]
    fn every_state_and_event_pair_follows_the_lifecycle_table() {
        let mut checked = 0;
        for from in TaskState::ALL {
            for event in Event::ALL {
                let expected = ALLOWED
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (transition(from, event), expected) {
                    (Ok(to), Some(want)) => assert_eq!(to, want, "{from} --{event}-->"),
                    (Err(err), None) => {
                        assert_eq!(err, TransitionError { from, event });
                        assert!(err.to_string().contains(from.as_str()));
                    }
                    (got, want) => panic!("{from} --{event}--> gave {got:?}, expected {want:?}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, TaskState::ALL.len() * Event::ALL.len());
    }

    #[test]
    fn terminal_states_accept_no_event() {
        for from in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for event in Event::ALL {
                assert!(transition(from, event).is_err(), "{from} took {event}");
            }
        }
    }

    #[test]
    fn a_question_without_deadline_never_expires() {
        assert!(transition(S::WaitingInput, E::Expire(TimeoutPolicy::Never)).is_err());
    }

    #[test]
    fn a_closed_question_stays_closed() {
        for from in QuestionOutcome::ALL {
            for to in QuestionOutcome::ALL {
                let closed = from.close(to);
                if from.is_open() && !to.is_open() {
                    assert_eq!(closed, Some(to));
                } else {
                    assert_eq!(closed, None, "{from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
            assert_eq!(TaskState::from_proto(state.to_proto()), Some(state));
        }
        for policy in TimeoutPolicy::ALL {
            assert_eq!(policy.as_str().parse::<TimeoutPolicy>(), Ok(policy));
            assert_eq!(TimeoutPolicy::from_proto(policy.to_proto()), Some(policy));
        }
        for outcome in QuestionOutcome::ALL {
            assert_eq!(outcome.as_str().parse::<QuestionOutcome>(), Ok(outcome));
        }
        assert!("sleeping".parse::<TaskState>().is_err());
    }
}
