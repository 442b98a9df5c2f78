//! The lifecycle as one pure function: [`decide`] takes a task as the store read it, a command,
//! the time and the policy, and returns the next state with the effects the move implies, or a
//! refusal. It does no I/O, so every pair of state and command, expiry and reminders included, is
//! tested without a database or a clock.
//!
//! The store applies a [`Decision`] as one compare-and-set on `(state, generation)`; the effects
//! become chat text, protobuf and subjects in task-control's `effects` module.

use std::{fmt, time::Duration};

use hark_proto::v1 as pb;
use time::OffsetDateTime;

use super::{DeadlinePolicy, Event, Owner, QuestionOutcome, TaskState, TimeoutPolicy, transition};

/// The limits a decision follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Runs a task may lose to expired leases before it fails (`task.max_attempts`).
    pub max_attempts: i32,
}

/// A question that is open, as far as the lifecycle cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenQuestion {
    pub handle: String,
    pub text: String,
    pub asked_at: OffsetDateTime,
    pub deadline: Option<OffsetDateTime>,
}

/// Where a task stands, with what each state carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Queued for a worker.
    Pending,
    /// Held by a worker; `pause_requested` once someone asked it to pause at its next round
    /// boundary.
    Running {
        pause_requested: bool,
    },
    /// Waiting on its open question.
    WaitingInput {
        question: OpenQuestion,
    },
    /// Held still since `since`: no worker holds it and its deadlines do not run. `question` is
    /// the open question it goes back to waiting on when resumed; without one it is queued.
    Paused {
        since: OffsetDateTime,
        question: Option<OpenQuestion>,
    },
    Completed,
    Failed,
    Cancelled,
}

impl State {
    pub fn name(&self) -> TaskState {
        match self {
            State::Pending => TaskState::Pending,
            State::Running { .. } => TaskState::Running,
            State::WaitingInput { .. } => TaskState::WaitingInput,
            State::Paused { .. } => TaskState::Paused,
            State::Completed => TaskState::Completed,
            State::Failed => TaskState::Failed,
            State::Cancelled => TaskState::Cancelled,
        }
    }
}

/// What the lifecycle knows of a task when it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub state: State,
    pub on_timeout: TimeoutPolicy,
    /// 1 for the first run, +1 for each run lost to an expired lease.
    pub attempt: i32,
}

/// Something asked of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// A worker takes the task, held for `lease` unless it renews it.
    Claim {
        lease: Duration,
    },
    /// The agent asks the owner; the question is asked whether or not a pause waits, and waits
    /// for its answer as `wait` says.
    Ask {
        wait: Wait,
    },
    /// The owner answered the open question.
    Answer,
    /// The timer found the open question's deadline passed.
    Expire,
    /// The timer reminds the owner when the deadline is less than `before` away.
    Remind {
        before: Duration,
    },
    /// Someone asks for the owner to be reminded now (the console's "remind"), deadline or not.
    Nudge,
    /// The agent gave its final answer.
    Finish {
        result: &'a str,
    },
    /// The run failed for good.
    Fail {
        error: &'a str,
    },
    /// The timer found the task ran longer than its bound (`task.max_runtime`): it fails, and
    /// the worker still running it is told to stop.
    Overran {
        error: &'a str,
    },
    /// The worker's lease ran out.
    LeaseExpired,
    /// The worker holding the task stops and hands it back at a round boundary.
    Release,
    Cancel {
        reason: &'a str,
    },
    Pause,
    Resume,
    /// Someone passes the open question on to another person; the task does not move.
    Delegate,
    /// The timer found the open question unanswered at its escalation time: it is asked of the
    /// next person too, and the first valid answer of either wins; the task does not move.
    /// `askees` says who is named and who is asked already; the decision picks whom to ask.
    Escalate {
        askees: Askees<'a>,
    },
    /// One answer to a question put to several people came in while more are needed: it is
    /// kept, and the task waits on for the others.
    Collect,
    /// The timer found the task's own deadline passed before it ended; `policy` decides whether
    /// it fails or is cancelled, and `why` says so.
    Overdue {
        policy: DeadlinePolicy,
        why: &'a str,
    },
}

impl Command<'_> {
    /// The event a move by this command records, given the task's expiry policy.
    pub fn event(&self, on_timeout: TimeoutPolicy) -> Event {
        match self {
            Command::Claim { .. } => Event::Claim,
            Command::Ask { .. } => Event::Ask,
            Command::Answer => Event::Answer,
            Command::Expire => Event::Expire(on_timeout),
            Command::Remind { .. } | Command::Nudge => Event::Remind,
            Command::Finish { .. } => Event::Finish,
            Command::Fail { .. } | Command::Overran { .. } => Event::Fail,
            Command::LeaseExpired => Event::LeaseExpired,
            Command::Release => Event::Release,
            Command::Cancel { .. } => Event::Cancel,
            Command::Pause => Event::Pause,
            Command::Resume => Event::Resume,
            Command::Delegate => Event::Delegate,
            Command::Escalate { .. } => Event::Escalate,
            Command::Collect => Event::Collect,
            Command::Overdue { policy, .. } => Event::Overdue(*policy),
        }
    }
}

/// What a chat is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Say {
    /// The task finished with this output.
    Completed {
        result: String,
    },
    Failed {
        error: String,
    },
    Cancelled {
        reason: String,
    },
    /// The question `handle` got no answer within `waited`; the task goes on (`resumed`) or
    /// failed.
    Expired {
        handle: String,
        waited: Duration,
        resumed: bool,
    },
    /// The question `handle`, asking `question`, closes in `left` (never, when `None`).
    Reminder {
        handle: String,
        question: String,
        left: Option<Duration>,
    },
}

/// Something a decision makes happen besides the move itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Queue a run of the task at its new generation.
    QueueRun(pb::RunReason),
    /// Tell the task's chat.
    Say(Say),
    /// Close the task's open question with this outcome.
    CloseQuestion(QuestionOutcome),
    /// Tell the worker holding the task to stop now.
    HintStop,
    /// Record why the task ended.
    RecordError(String),
    /// Count one more attempt.
    CountAttempt,
    /// Move the open question's deadline and its escalation, whichever it has, later by this
    /// much: the time the task stood paused.
    ShiftDeadline(Duration),
    /// Open the question asked, to expire this long after it is asked (never, when `None`).
    OpenQuestion { expires_after: Option<Duration> },
    /// Hold the task for the worker that claimed it this long from now, unless it renews it.
    GrantLease(Duration),
    /// Close the other open questions of the same ask, put to others, with this outcome.
    CloseOthers(QuestionOutcome),
    /// Apply the move only while this holds.
    Guard(Guard),
    /// Ask these people the open question too, each in their own question of the same ask, and
    /// keep `later` to be asked at the next escalation (nobody more, when empty).
    AskNext { ask: Vec<Owner>, later: Vec<String> },
}

/// Who an open question's ask is put to, as far as whom to ask next goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Askees<'a> {
    /// The people named to be asked next, in order (`escalate_to`, or the others of an ask put
    /// to several), each as `platform:user_id`.
    pub named: &'a [String],
    /// The people the ask is put to already.
    pub asked: &'a [String],
    /// The platform the question is on: only people on it can be asked there. `None` for a
    /// question asked outside chat, which nobody else can be asked.
    pub platform: Option<&'a str>,
    /// All of them at once (an ask put to several), rather than the next one (an escalation).
    pub at_once: bool,
}

impl Askees<'_> {
    /// The people to ask now, and the rest of `named` to keep for later. A name that is not an
    /// owner, is on another platform, or is asked already is passed over; nobody is asked twice.
    pub fn next(&self) -> Effect {
        let mut named = self.named.iter();
        let mut ask: Vec<Owner> = Vec::new();
        for person in named.by_ref() {
            let Ok(owner) = person.parse::<Owner>() else {
                continue;
            };
            if self.platform == Some(owner.platform())
                && !self.asked.iter().any(|a| a == owner.as_str())
                && !ask.contains(&owner)
            {
                ask.push(owner);
                if !self.at_once {
                    break;
                }
            }
        }
        Effect::AskNext {
            ask,
            later: named.cloned().collect(),
        }
    }
}

/// A condition the statement that applies a decision checks besides the task's state and
/// generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The inbound message behind the move was not applied before: a redelivered one changes
    /// nothing.
    Once,
    /// No pending task of a higher priority waits: that one goes first.
    Priority,
}

/// A move the lifecycle allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub event: Event,
    pub from: TaskState,
    pub to: TaskState,
    /// Whether the task is to pause at its next round boundary after the move. The worker
    /// holding it learns so from the answer to its next checkpoint, which is that boundary.
    pub pause_requested: bool,
    pub effects: Vec<Effect>,
}

impl Decision {
    /// Whether the move changes the state (and so the generation); a decision that does not
    /// only records something of the task, such as a requested pause or a reminder.
    pub fn moves(&self) -> bool {
        self.from != self.to
    }

    /// The chat messages the decision sends.
    pub fn said(&self) -> impl Iterator<Item = &Say> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Say(say) => Some(say),
            _ => None,
        })
    }

    /// The run the decision queues, if any.
    pub fn run(&self) -> Option<pb::RunReason> {
        self.effects.iter().find_map(|e| match e {
            Effect::QueueRun(reason) => Some(*reason),
            _ => None,
        })
    }

    /// The outcome the decision closes the open question with, if any.
    pub fn closes(&self) -> Option<QuestionOutcome> {
        self.effects.iter().find_map(|e| match e {
            Effect::CloseQuestion(outcome) => Some(*outcome),
            _ => None,
        })
    }

    /// The error the decision records, if any.
    pub fn error(&self) -> Option<&str> {
        self.effects.iter().find_map(|e| match e {
            Effect::RecordError(error) => Some(error.as_str()),
            _ => None,
        })
    }

    pub fn counts_attempt(&self) -> bool {
        self.effects.contains(&Effect::CountAttempt)
    }

    /// How long after it is asked the question the decision opens expires; `None` when it
    /// opens none, or one that never expires.
    pub fn question_expires_after(&self) -> Option<Duration> {
        self.effects.iter().find_map(|e| match e {
            Effect::OpenQuestion { expires_after } => *expires_after,
            _ => None,
        })
    }

    /// How long the worker the decision hands the task to holds it, if it hands it to one.
    pub fn lease(&self) -> Option<Duration> {
        self.effects.iter().find_map(|e| match e {
            Effect::GrantLease(lease) => Some(*lease),
            _ => None,
        })
    }

    /// The outcome the decision closes the other open questions of the same ask with, if any.
    pub fn closes_others(&self) -> Option<QuestionOutcome> {
        self.effects.iter().find_map(|e| match e {
            Effect::CloseOthers(outcome) => Some(*outcome),
            _ => None,
        })
    }

    /// Whether the move is applied only while `guard` holds.
    pub fn guarded(&self, guard: Guard) -> bool {
        self.effects.contains(&Effect::Guard(guard))
    }

    /// The people the decision asks the open question too, and those it keeps for later; both
    /// empty when it asks nobody.
    pub fn asks_next(&self) -> (&[Owner], &[String]) {
        self.effects
            .iter()
            .find_map(|e| match e {
                Effect::AskNext { ask, later } => Some((ask.as_slice(), later.as_slice())),
                _ => None,
            })
            .unwrap_or((&[], &[]))
    }

    pub fn hints(&self) -> Option<Effect> {
        self.effects
            .iter()
            .find(|e| matches!(e, Effect::HintStop))
            .cloned()
    }
}

/// Why a command was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The lifecycle has no such move from this state.
    WrongState { from: TaskState, event: Event },
    /// The command is early: the deadline (or the reminder's moment) has not come.
    NotDue,
    /// The task is already where the command would take it (a second pause, say).
    Already(TaskState),
    /// The command reads more of the task than its state (an expiry its policy, a lost lease
    /// its attempts), so it is not decided by [`decide_on_state`].
    NeedsTask(Event),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::WrongState { from, event } => {
                write!(f, "a task that is {from} cannot take `{event}`")
            }
            Refusal::NotDue => f.write_str("it is not due yet"),
            Refusal::Already(state) => write!(f, "the task is already {state}"),
            Refusal::NeedsTask(event) => {
                write!(
                    f,
                    "`{event}` is decided from the task's row, not its state alone"
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

impl Command<'_> {
    /// Whether the decision reads the task beyond its state: an expiry reads its
    /// `on_timeout`, a lost lease its `attempt`.
    pub fn reads_task(&self) -> bool {
        matches!(self, Command::Expire | Command::LeaseExpired)
    }
}

/// Decides what `command` does to a task in `state` at `now`, for a statement that checks the
/// state itself and reads nothing else of the task: the claim of a pending task, an ask or a
/// finish of a running one, a reminder of a waiting one. A command that [reads the
/// task](Command::reads_task) is refused, so nothing is decided from a guessed policy or attempt.
pub fn decide_on_state(
    state: State,
    command: &Command<'_>,
    now: OffsetDateTime,
    policy: Policy,
) -> Result<Decision, Refusal> {
    if command.reads_task() {
        return Err(Refusal::NeedsTask(command.event(TimeoutPolicy::default())));
    }
    // Neither field is read by a command that does not read the task (tested below).
    let task = Task {
        state,
        on_timeout: TimeoutPolicy::default(),
        attempt: 1,
    };
    decide(&task, command, now, policy)
}

/// Decides what `command` does to `task` at `now`.
pub fn decide(
    task: &Task,
    command: &Command<'_>,
    now: OffsetDateTime,
    policy: Policy,
) -> Result<Decision, Refusal> {
    use Command as C;
    use State as S;
    let from = task.state.name();
    let event = command.event(task.on_timeout);
    let refuse = || Refusal::WrongState { from, event };
    let to = |state: TaskState, effects: Vec<Effect>| Decision {
        event,
        from,
        to: state,
        pause_requested: false,
        effects,
    };
    let table = |event: Event| transition(from, event).map_err(|_| refuse());
    Ok(match (&task.state, command) {
        // A pause asked while running takes hold at the round boundary: the ask, or the hand-back.
        // The question asked supersedes any the task still has open.
        (S::Running { pause_requested }, C::Ask { wait }) => to(
            pause_or(*pause_requested, table(event)?),
            vec![
                Effect::CloseQuestion(QuestionOutcome::Superseded),
                Effect::OpenQuestion {
                    expires_after: wait.expires_after(),
                },
            ],
        ),
        (S::Running { pause_requested }, C::Release) => {
            if *pause_requested {
                to(TaskState::Paused, vec![])
            } else {
                to(
                    table(event)?,
                    vec![Effect::QueueRun(pb::RunReason::Handover)],
                )
            }
        }
        (S::Running { pause_requested }, C::LeaseExpired) => {
            if task.attempt >= policy.max_attempts {
                let error = format!(
                    "the task lost its worker {} times (task.max_attempts = {})",
                    task.attempt, policy.max_attempts
                );
                return decide(task, &C::Fail { error: &error }, now, policy).map(|mut d| {
                    d.event = Event::Fail;
                    d
                });
            }
            let mut effects = vec![Effect::CountAttempt];
            let to_state = if *pause_requested {
                TaskState::Paused
            } else {
                effects.push(Effect::QueueRun(pb::RunReason::Recover));
                table(event)?
            };
            to(to_state, effects)
        }
        (S::Pending, C::Claim { lease }) => to(
            table(event)?,
            vec![Effect::GrantLease(*lease), Effect::Guard(Guard::Priority)],
        ),
        (S::Running { .. }, C::Finish { .. })
        | (S::Running { .. }, C::Fail { .. } | C::Overran { .. }) => {
            let effects = match command {
                C::Finish { result } => vec![Effect::Say(Say::Completed {
                    result: (*result).to_owned(),
                })],
                C::Fail { error } => vec![
                    Effect::RecordError((*error).to_owned()),
                    Effect::Say(Say::Failed {
                        error: (*error).to_owned(),
                    }),
                ],
                C::Overran { error } => vec![
                    Effect::RecordError((*error).to_owned()),
                    Effect::Say(Say::Failed {
                        error: (*error).to_owned(),
                    }),
                    Effect::HintStop,
                ],
                _ => vec![],
            };
            to(table(event)?, effects)
        }
        // The first answer wins: the same ask put to others closes for them. An answer is
        // applied once, however often its message comes in.
        (S::WaitingInput { .. }, C::Answer) => {
            let mut effects = answered(true);
            effects.push(Effect::QueueRun(pb::RunReason::ResumeReply));
            to(table(event)?, effects)
        }
        // A paused task still records its answer, and runs once resumed.
        (
            S::Paused {
                question: Some(_), ..
            },
            C::Answer,
        ) => to(TaskState::Paused, answered(true)),
        (S::WaitingInput { question }, C::Expire) => {
            let Some(deadline) = question.deadline else {
                return Err(refuse());
            };
            if now < deadline {
                return Err(Refusal::NotDue);
            }
            let waited = (deadline - question.asked_at).unsigned_abs();
            let waited = Duration::from_secs(waited.as_secs());
            let resumed = task.on_timeout == TimeoutPolicy::Resume;
            let mut effects = vec![
                Effect::CloseQuestion(QuestionOutcome::Expired),
                Effect::Say(Say::Expired {
                    handle: question.handle.clone(),
                    waited,
                    resumed,
                }),
            ];
            if resumed {
                effects.push(Effect::QueueRun(pb::RunReason::ResumeTimeout));
            } else {
                effects.push(Effect::RecordError(format!(
                    "no answer within {}",
                    super::HumanDuration(waited)
                )));
            }
            to(table(event)?, effects)
        }
        (S::WaitingInput { question }, C::Remind { before }) => {
            let Some(deadline) = question.deadline else {
                return Err(Refusal::NotDue);
            };
            if before.is_zero() || now >= deadline || deadline - *before > now {
                return Err(Refusal::NotDue);
            }
            let left = (deadline - now).unsigned_abs();
            to(
                from,
                vec![Effect::Say(Say::Reminder {
                    handle: question.handle.clone(),
                    question: question.text.clone(),
                    left: Some(Duration::from_secs(left.as_secs())),
                })],
            )
        }
        (
            S::WaitingInput { .. }
            | S::Paused {
                question: Some(_), ..
            },
            C::Delegate,
        ) => to(from, Vec::new()),
        // Only a task that waits escalates: a paused one's clock stands still.
        (S::WaitingInput { .. }, C::Escalate { askees }) => to(from, vec![askees.next()]),
        // A paused task keeps the answers that come in too, as it keeps a whole one.
        (
            S::WaitingInput { .. }
            | S::Paused {
                question: Some(_), ..
            },
            C::Collect,
        ) => to(from, answered(false)),
        (S::WaitingInput { question }, C::Nudge) => {
            let left = match question.deadline {
                Some(deadline) if now >= deadline => return Err(Refusal::NotDue),
                Some(deadline) => Some(Duration::from_secs(
                    (deadline - now).unsigned_abs().as_secs(),
                )),
                None => None,
            };
            to(
                from,
                vec![Effect::Say(Say::Reminder {
                    handle: question.handle.clone(),
                    question: question.text.clone(),
                    left,
                })],
            )
        }
        (
            S::Pending | S::Running { .. } | S::WaitingInput { .. } | S::Paused { .. },
            C::Cancel { reason },
        ) => {
            let mut effects = vec![
                Effect::RecordError(if reason.trim().is_empty() {
                    "cancelled".to_owned()
                } else {
                    (*reason).to_owned()
                }),
                Effect::Say(Say::Cancelled {
                    reason: (*reason).to_owned(),
                }),
            ];
            if matches!(
                task.state,
                S::WaitingInput { .. }
                    | S::Paused {
                        question: Some(_),
                        ..
                    }
            ) {
                effects.insert(0, Effect::CloseQuestion(QuestionOutcome::Cancelled));
            }
            if matches!(task.state, S::Running { .. }) {
                effects.push(Effect::HintStop);
            }
            to(TaskState::Cancelled, effects)
        }
        (
            S::Pending | S::Running { .. } | S::WaitingInput { .. } | S::Paused { .. },
            C::Overdue { policy, why },
        ) => {
            let (outcome, say) = match policy {
                DeadlinePolicy::Fail => (
                    QuestionOutcome::Expired,
                    Say::Failed {
                        error: (*why).to_owned(),
                    },
                ),
                DeadlinePolicy::Cancel => (
                    QuestionOutcome::Cancelled,
                    Say::Cancelled {
                        reason: (*why).to_owned(),
                    },
                ),
            };
            let mut effects = vec![Effect::RecordError((*why).to_owned()), Effect::Say(say)];
            if matches!(
                task.state,
                S::WaitingInput { .. }
                    | S::Paused {
                        question: Some(_),
                        ..
                    }
            ) {
                effects.insert(0, Effect::CloseQuestion(outcome));
            }
            if matches!(task.state, S::Running { .. }) {
                effects.push(Effect::HintStop);
            }
            to(table(event)?, effects)
        }
        (S::Pending | S::WaitingInput { .. }, C::Pause) => to(TaskState::Paused, vec![]),
        (
            S::Running {
                pause_requested: false,
            },
            C::Pause,
        ) => Decision {
            pause_requested: true,
            ..to(TaskState::Running, vec![])
        },
        (
            S::Running {
                pause_requested: true,
            }
            | S::Paused { .. },
            C::Pause,
        ) => {
            return Err(Refusal::Already(TaskState::Paused));
        }
        (S::Paused { since, question }, C::Resume) => {
            let paused = (now - *since).unsigned_abs();
            match question {
                Some(_) => {
                    // Its clock stood still: the deadline, and when it is passed on to the
                    // next person, which a question without a deadline may have too.
                    let mut effects = vec![];
                    if !paused.is_zero() {
                        effects.push(Effect::ShiftDeadline(paused));
                    }
                    to(TaskState::WaitingInput, effects)
                }
                None => to(
                    TaskState::Pending,
                    vec![Effect::QueueRun(pb::RunReason::Unpause)],
                ),
            }
        }
        // A resume of a task whose pause has not taken hold yet withdraws the pause.
        (
            S::Running {
                pause_requested: true,
            },
            C::Resume,
        ) => to(TaskState::Running, vec![]),
        (
            S::Running {
                pause_requested: false,
            }
            | S::Pending
            | S::WaitingInput { .. },
            C::Resume,
        ) => {
            return Err(Refusal::Already(from));
        }
        _ => return Err(refuse()),
    })
}

/// What decides how long a question waits for its answer: its task's policy and default wait
/// (both fixed when the task is created) and the ask's own timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wait {
    pub on_timeout: TimeoutPolicy,
    /// The task's `ask_timeout`; zero: none.
    pub ask_timeout: Duration,
    /// The timeout the ask set, if it set one.
    pub own: Option<Duration>,
}

impl Wait {
    /// How long after it is asked the question expires, the one rule every ask follows: never
    /// when its task's policy is `never`; else after the ask's own timeout when it set one, or
    /// else after the task's `ask_timeout` when that is not zero; else never.
    pub fn expires_after(&self) -> Option<Duration> {
        if self.on_timeout == TimeoutPolicy::Never {
            return None;
        }
        match self.own {
            Some(own) => Some(own),
            None if !self.ask_timeout.is_zero() => Some(self.ask_timeout),
            None => None,
        }
    }
}

/// What an answer's own statement does after the answer, when it also takes the task's next
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then<'a> {
    /// A worker waiting for a job claims the task, held for `lease`.
    Claim { lease: Duration },
    /// task-control claims the task and asks its next question (a questionnaire's), which
    /// waits as `wait` says.
    Ask { wait: Wait },
    /// task-control claims the task and finishes it with `result` (a questionnaire's output).
    Finish { result: &'a str },
}

/// The moves of one statement that answers a task's question and takes its next step, in
/// order: the answer, the claim, and for a step task-control takes itself the ask or the
/// finish. The statement moves the task from the first `from` to the last `to`, and the audit
/// keeps each move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub answer: Decision,
    pub claim: Decision,
    /// The ask or the finish; `None` for [`Then::Claim`].
    pub then: Option<Decision>,
}

impl Chain {
    /// The last move: where the statement leaves the task.
    pub fn last(&self) -> &Decision {
        self.then.as_ref().unwrap_or(&self.claim)
    }
}

/// Decides an answer to `task` and the step `then` its statement takes after it, each move as
/// [`decide`] decides it alone from where the move before left the task. `None` when the answer
/// does not leave the task pending (a paused task keeps its answer and runs once resumed), so
/// that the answer alone applies; refused as the answer is refused.
pub fn answer_then(
    task: &Task,
    then: Then<'_>,
    now: OffsetDateTime,
    policy: Policy,
) -> Result<Option<Chain>, Refusal> {
    let answer = decide(task, &Command::Answer, now, policy)?;
    if answer.to != TaskState::Pending {
        return Ok(None);
    }
    // task-control's own step holds the task for no time: it asks or finishes in the same
    // statement.
    let lease = match then {
        Then::Claim { lease } => lease,
        Then::Ask { .. } | Then::Finish { .. } => Duration::ZERO,
    };
    let claim = decide_on_state(State::Pending, &Command::Claim { lease }, now, policy)?;
    let running = || State::Running {
        pause_requested: claim.pause_requested,
    };
    let then = match then {
        Then::Claim { .. } => None,
        Then::Ask { wait } => Some(decide_on_state(
            running(),
            &Command::Ask { wait },
            now,
            policy,
        )?),
        Then::Finish { result } => Some(decide_on_state(
            running(),
            &Command::Finish { result },
            now,
            policy,
        )?),
    };
    Ok(Some(Chain {
        answer,
        claim,
        then,
    }))
}

/// The moves of a task whose first step task-control takes in its creation statement (a
/// questionnaire, whose first question is known): claimed by task-control, holding it for no
/// time, then asking that question, which waits as `wait` says. The creation itself brings the
/// task into `pending`; the statement leaves it where the ask does.
pub fn create_then_ask(
    wait: Wait,
    now: OffsetDateTime,
    policy: Policy,
) -> Result<(Decision, Decision), Refusal> {
    let claim = decide_on_state(
        State::Pending,
        &Command::Claim {
            lease: Duration::ZERO,
        },
        now,
        policy,
    )?;
    let ask = decide_on_state(
        State::Running {
            pause_requested: claim.pause_requested,
        },
        &Command::Ask { wait },
        now,
        policy,
    )?;
    Ok((claim, ask))
}

/// What an answer does to its question: it closes as answered, applied once per inbound
/// message; the answer that `ends` the ask closes the ask's questions put to others.
fn answered(ends: bool) -> Vec<Effect> {
    let mut effects = vec![
        Effect::CloseQuestion(QuestionOutcome::Answered),
        Effect::Guard(Guard::Once),
    ];
    if ends {
        effects.push(Effect::CloseOthers(QuestionOutcome::Superseded));
    }
    effects
}

/// `Paused` when a pause waits, else `to`.
fn pause_or(pause_requested: bool, to: TaskState) -> TaskState {
    if pause_requested {
        TaskState::Paused
    } else {
        to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy { max_attempts: 3 };
    const LEASE: Duration = Duration::from_secs(30);
    const WAIT: Wait = Wait {
        on_timeout: TimeoutPolicy::Resume,
        ask_timeout: Duration::from_secs(600),
        own: None,
    };
    const ASKEES: Askees<'static> = Askees {
        named: &[],
        asked: &[],
        platform: Some("qq"),
        at_once: false,
    };

    #[test]
    fn a_task_created_asking_is_claimed_then_waits_on_its_question_as_its_wait_says() {
        let (claim, ask) = create_then_ask(WAIT, at(0), POLICY).expect("decided");
        assert_eq!(
            (claim.from, claim.to, claim.event),
            (TaskState::Pending, TaskState::Running, Event::Claim)
        );
        assert_eq!(
            (ask.from, ask.to, ask.event),
            (TaskState::Running, TaskState::WaitingInput, Event::Ask)
        );
        assert_eq!(ask.question_expires_after(), Some(Duration::from_secs(600)));
        let never = Wait {
            on_timeout: TimeoutPolicy::Never,
            ..WAIT
        };
        let (_, ask) = create_then_ask(never, at(0), POLICY).expect("decided");
        assert_eq!(ask.question_expires_after(), None);
    }

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    fn question(deadline: Option<i64>) -> OpenQuestion {
        OpenQuestion {
            handle: "a3f9".into(),
            text: "Which city?".into(),
            asked_at: at(0),
            deadline: deadline.map(at),
        }
    }

    fn task(state: State) -> Task {
        Task {
            state,
            on_timeout: TimeoutPolicy::Resume,
            attempt: 1,
        }
    }

    /// One task in every state, and in the variants of a state that decide differently.
    fn every_state() -> Vec<State> {
        vec![
            State::Pending,
            State::Running {
                pause_requested: false,
            },
            State::Running {
                pause_requested: true,
            },
            State::WaitingInput {
                question: question(Some(600)),
            },
            State::Paused {
                since: at(10),
                question: Some(question(Some(600))),
            },
            State::Paused {
                since: at(10),
                question: None,
            },
            State::Completed,
            State::Failed,
            State::Cancelled,
        ]
    }

    fn every_command() -> Vec<Command<'static>> {
        vec![
            Command::Claim { lease: LEASE },
            Command::Ask { wait: WAIT },
            Command::Answer,
            Command::Expire,
            Command::Remind {
                before: Duration::from_secs(60),
            },
            Command::Nudge,
            Command::Finish { result: "done" },
            Command::Fail { error: "broke" },
            Command::Overran { error: "too long" },
            Command::LeaseExpired,
            Command::Release,
            Command::Cancel { reason: "" },
            Command::Pause,
            Command::Resume,
            Command::Delegate,
            Command::Escalate { askees: ASKEES },
            Command::Collect,
            Command::Overdue {
                policy: DeadlinePolicy::Fail,
                why: "late",
            },
            Command::Overdue {
                policy: DeadlinePolicy::Cancel,
                why: "late",
            },
        ]
    }

    /// What each pair leads to, written down by hand: the state after, or `None` when refused.
    /// Timed commands are decided at a moment when they are due (`now` is after the deadline for
    /// an expiry, inside the reminder window for a reminder).
    fn expected(state: &State, command: &Command<'_>) -> Option<TaskState> {
        use Command as C;
        use TaskState as T;
        let running = |pause: bool| State::Running {
            pause_requested: pause,
        };
        Some(match (state, command) {
            (State::Pending, C::Claim { .. }) => T::Running,
            (State::Pending, C::Cancel { .. }) => T::Cancelled,
            (State::Pending, C::Pause) => T::Paused,
            (s, C::Ask { .. }) if *s == running(false) => T::WaitingInput,
            (s, C::Ask { .. }) if *s == running(true) => T::Paused,
            (State::Running { .. }, C::Finish { .. }) => T::Completed,
            (State::Running { .. }, C::Fail { .. } | C::Overran { .. }) => T::Failed,
            (s, C::LeaseExpired | C::Release) if *s == running(false) => T::Pending,
            (s, C::LeaseExpired | C::Release) if *s == running(true) => T::Paused,
            (State::Running { .. }, C::Cancel { .. }) => T::Cancelled,
            (s, C::Pause) if *s == running(false) => T::Running,
            (s, C::Resume) if *s == running(true) => T::Running,
            (State::WaitingInput { .. }, C::Answer | C::Expire) => T::Pending,
            (
                State::WaitingInput { .. },
                C::Remind { .. } | C::Nudge | C::Delegate | C::Escalate { .. } | C::Collect,
            ) => T::WaitingInput,
            (
                State::Paused {
                    question: Some(_), ..
                },
                C::Delegate | C::Collect,
            ) => T::Paused,
            (State::WaitingInput { .. }, C::Cancel { .. }) => T::Cancelled,
            (State::WaitingInput { .. }, C::Pause) => T::Paused,
            (
                State::Paused {
                    question: Some(_), ..
                },
                C::Answer,
            ) => T::Paused,
            (
                State::Paused {
                    question: Some(_), ..
                },
                C::Resume,
            ) => T::WaitingInput,
            (State::Paused { question: None, .. }, C::Resume) => T::Pending,
            (State::Paused { .. }, C::Cancel { .. }) => T::Cancelled,
            (
                State::Pending
                | State::Running { .. }
                | State::WaitingInput { .. }
                | State::Paused { .. },
                C::Overdue { policy, .. },
            ) => match policy {
                DeadlinePolicy::Fail => T::Failed,
                DeadlinePolicy::Cancel => T::Cancelled,
            },
            _ => return None,
        })
    }

    fn due_moment(command: &Command<'_>) -> OffsetDateTime {
        match command {
            Command::Expire => at(600),
            Command::Remind { .. } => at(570),
            _ => at(100),
        }
    }

    #[test]
    fn a_decision_on_the_state_alone_is_the_decision_on_any_task_in_that_state() {
        for state in every_state() {
            for command in every_command() {
                let on_state = decide_on_state(state.clone(), &command, at(700), POLICY);
                if command.reads_task() {
                    assert!(
                        matches!(on_state, Err(Refusal::NeedsTask(_))),
                        "{command:?} from {state:?} was decided without the task's row"
                    );
                    continue;
                }
                for on_timeout in TimeoutPolicy::ALL {
                    for attempt in 1..=POLICY.max_attempts + 1 {
                        let task = Task {
                            state: state.clone(),
                            on_timeout,
                            attempt,
                        };
                        assert_eq!(
                            decide(&task, &command, at(700), POLICY),
                            on_state,
                            "{command:?} on {task:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_answer_and_the_step_its_statement_takes_are_each_decided_as_alone() {
        let thens = [
            Then::Claim { lease: LEASE },
            Then::Ask { wait: WAIT },
            Then::Finish { result: "done" },
        ];
        for state in every_state() {
            let task = task(state.clone());
            let alone = decide(&task, &Command::Answer, at(20), POLICY);
            for then in thens {
                let chain = answer_then(&task, then, at(20), POLICY);
                let chain = match (&alone, chain) {
                    (Err(refused), Err(chained)) => {
                        assert_eq!(refused, &chained, "{state:?}");
                        continue;
                    }
                    (Ok(answer), Ok(None)) => {
                        assert_ne!(answer.to, TaskState::Pending, "{state:?}");
                        continue;
                    }
                    (Ok(answer), Ok(Some(chain))) => {
                        assert_eq!(&chain.answer, answer, "{state:?}");
                        chain
                    }
                    (alone, chained) => panic!("{state:?} {then:?}: {alone:?} vs {chained:?}"),
                };
                // Each move starts where the one before left the task.
                assert_eq!(chain.claim.from, chain.answer.to);
                let lease = match then {
                    Then::Claim { lease } => lease,
                    _ => Duration::ZERO,
                };
                assert_eq!(
                    chain.claim,
                    decide(
                        &self::task(State::Pending),
                        &Command::Claim { lease },
                        at(20),
                        POLICY
                    )
                    .expect("a pending task is claimed")
                );
                assert_eq!(chain.claim.lease(), Some(lease));
                let running = self::task(State::Running {
                    pause_requested: false,
                });
                let expected = match then {
                    Then::Claim { .. } => None,
                    Then::Ask { wait } => {
                        Some(decide(&running, &Command::Ask { wait }, at(20), POLICY))
                    }
                    Then::Finish { result } => Some(decide(
                        &running,
                        &Command::Finish { result },
                        at(20),
                        POLICY,
                    )),
                };
                assert_eq!(chain.then.clone().map(Ok), expected, "{state:?} {then:?}");
                if let Some(last) = &chain.then {
                    assert_eq!(last.from, chain.claim.to);
                }
                assert_eq!(
                    chain.last().to,
                    match then {
                        Then::Claim { .. } => TaskState::Running,
                        Then::Ask { .. } => TaskState::WaitingInput,
                        Then::Finish { .. } => TaskState::Completed,
                    }
                );
            }
        }
        // Only a waiting task chains; a paused one keeps the answer alone.
        let paused = task(State::Paused {
            since: at(10),
            question: Some(question(Some(600))),
        });
        let claim = Then::Claim { lease: LEASE };
        assert_eq!(answer_then(&paused, claim, at(20), POLICY), Ok(None));
    }

    #[test]
    fn every_state_and_command_pair_follows_the_table() {
        let mut checked = 0;
        for state in every_state() {
            for command in every_command() {
                let got = decide(&task(state.clone()), &command, due_moment(&command), POLICY);
                match (got, expected(&state, &command)) {
                    (Ok(d), Some(want)) => {
                        assert_eq!(d.to, want, "{state:?} + {command:?}");
                        assert_eq!(d.from, state.name());
                    }
                    (Err(_), None) => {}
                    (got, want) => {
                        panic!("{state:?} + {command:?} gave {got:?}, expected {want:?}")
                    }
                }
                checked += 1;
            }
        }
        assert_eq!(checked, every_state().len() * every_command().len());
    }

    #[test]
    fn moves_agree_with_the_transition_table() {
        for state in every_state() {
            for command in every_command() {
                let Ok(d) = decide(&task(state.clone()), &command, due_moment(&command), POLICY)
                else {
                    continue;
                };
                // Pauses are decided here only; every other move is one of the table's.
                let pausing = d.to == TaskState::Paused
                    || d.from == TaskState::Paused
                    || d.event == Event::Pause
                    || d.event == Event::Resume;
                if d.moves() && !pausing {
                    assert_eq!(
                        transition(d.from, d.event),
                        Ok(d.to),
                        "{state:?} + {command:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn runs_are_queued_exactly_when_a_task_becomes_runnable() {
        for state in every_state() {
            for command in every_command() {
                let Ok(d) = decide(&task(state.clone()), &command, due_moment(&command), POLICY)
                else {
                    continue;
                };
                let queued = d.run().is_some();
                assert_eq!(
                    queued,
                    d.to == TaskState::Pending,
                    "{state:?} + {command:?}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn a_task_past_its_deadline_ends_by_its_policy_and_its_question_with_it() {
        let waiting = task(State::WaitingInput {
            question: question(Some(600)),
        });
        let failed = decide(
            &waiting,
            &Command::Overdue {
                policy: DeadlinePolicy::Fail,
                why: "late",
            },
            at(1),
            POLICY,
        )
        .unwrap();
        assert_eq!(failed.to, TaskState::Failed);
        assert_eq!(failed.event, Event::Overdue(DeadlinePolicy::Fail));
        assert_eq!(
            failed.effects,
            vec![
                Effect::CloseQuestion(QuestionOutcome::Expired),
                Effect::RecordError("late".into()),
                Effect::Say(Say::Failed {
                    error: "late".into()
                }),
            ]
        );
        let running = task(State::Running {
            pause_requested: false,
        });
        let cancelled = decide(
            &running,
            &Command::Overdue {
                policy: DeadlinePolicy::Cancel,
                why: "late",
            },
            at(1),
            POLICY,
        )
        .unwrap();
        assert_eq!(cancelled.to, TaskState::Cancelled);
        assert_eq!(
            cancelled.effects,
            vec![
                Effect::RecordError("late".into()),
                Effect::Say(Say::Cancelled {
                    reason: "late".into()
                }),
                Effect::HintStop,
            ]
        );
    }

    #[test]
    fn a_question_waits_as_its_ask_says_then_as_its_task_says_unless_it_never_expires() {
        let hour = Duration::from_secs(3600);
        let minute = Duration::from_secs(60);
        for on_timeout in [
            TimeoutPolicy::Resume,
            TimeoutPolicy::Fail,
            TimeoutPolicy::Never,
        ] {
            for own in [None, Some(minute)] {
                for ask_timeout in [Duration::ZERO, hour] {
                    let wait = Wait {
                        on_timeout,
                        ask_timeout,
                        own,
                    };
                    let expected = match (on_timeout, own) {
                        (TimeoutPolicy::Never, _) => None,
                        (_, Some(own)) => Some(own),
                        (_, None) => (!ask_timeout.is_zero()).then_some(ask_timeout),
                    };
                    assert_eq!(wait.expires_after(), expected, "{wait:?}");
                    // The ask opens its question with that wait.
                    let running = task(State::Running {
                        pause_requested: false,
                    });
                    let asked = decide(&running, &Command::Ask { wait }, at(1), POLICY).unwrap();
                    assert_eq!(
                        asked.effects,
                        vec![
                            Effect::CloseQuestion(QuestionOutcome::Superseded),
                            Effect::OpenQuestion {
                                expires_after: expected
                            }
                        ]
                    );
                    assert_eq!(asked.question_expires_after(), expected);
                }
            }
        }
    }

    #[test]
    fn a_run_past_its_bound_fails_and_its_worker_is_told_to_stop() {
        let running = task(State::Running {
            pause_requested: false,
        });
        let overran = decide(
            &running,
            &Command::Overran { error: "too long" },
            at(1),
            POLICY,
        )
        .unwrap();
        assert_eq!(
            (overran.to, overran.event),
            (TaskState::Failed, Event::Fail)
        );
        assert!(overran.effects.contains(&Effect::HintStop));
        assert_eq!(overran.error(), Some("too long"));
        // A worker that fails its own task has nothing to be told.
        let failed = decide(&running, &Command::Fail { error: "broke" }, at(1), POLICY).unwrap();
        assert!(!failed.effects.contains(&Effect::HintStop));
    }

    #[test]
    fn an_open_question_is_closed_when_its_task_ends_or_goes_on() {
        let waiting = task(State::WaitingInput {
            question: question(Some(600)),
        });
        let cancel = decide(&waiting, &Command::Cancel { reason: "" }, at(1), POLICY).unwrap();
        assert_eq!(cancel.closes(), Some(QuestionOutcome::Cancelled));
        assert_eq!(cancel.error(), Some("cancelled"));
        let expire = decide(&waiting, &Command::Expire, at(600), POLICY).unwrap();
        assert_eq!(expire.closes(), Some(QuestionOutcome::Expired));
        // The answer closes its question, and the same ask put to others, once per message.
        let answer = decide(&waiting, &Command::Answer, at(1), POLICY).unwrap();
        assert_eq!(answer.closes(), Some(QuestionOutcome::Answered));
        assert_eq!(answer.closes_others(), Some(QuestionOutcome::Superseded));
        assert!(answer.guarded(Guard::Once));
        // An answer that leaves the ask needing more closes only its own question.
        let collect = decide(&waiting, &Command::Collect, at(1), POLICY).unwrap();
        assert_eq!(collect.closes(), Some(QuestionOutcome::Answered));
        assert_eq!(collect.closes_others(), None);
        assert!(collect.guarded(Guard::Once));
        // A claim yields to a pending task of a higher priority.
        let claim = decide(
            &task(State::Pending),
            &Command::Claim { lease: LEASE },
            at(1),
            POLICY,
        )
        .unwrap();
        assert!(claim.guarded(Guard::Priority));
        assert!(!claim.guarded(Guard::Once));
        let pending = decide(
            &task(State::Pending),
            &Command::Cancel { reason: "x" },
            at(1),
            POLICY,
        )
        .unwrap();
        assert_eq!(pending.closes(), None);
        assert_eq!(pending.error(), Some("x"));
    }

    #[test]
    fn expiry_waits_for_the_deadline_and_follows_the_policy() {
        let mut waiting = task(State::WaitingInput {
            question: question(Some(600)),
        });
        assert_eq!(
            decide(&waiting, &Command::Expire, at(599), POLICY),
            Err(Refusal::NotDue)
        );
        let resumed = decide(&waiting, &Command::Expire, at(600), POLICY).unwrap();
        assert_eq!(resumed.to, TaskState::Pending);
        assert_eq!(resumed.event, Event::Expire(TimeoutPolicy::Resume));
        assert_eq!(resumed.run(), Some(pb::RunReason::ResumeTimeout));
        assert!(resumed.said().any(|s| *s
            == Say::Expired {
                handle: "a3f9".into(),
                waited: Duration::from_secs(600),
                resumed: true
            }));
        waiting.on_timeout = TimeoutPolicy::Fail;
        let failed = decide(&waiting, &Command::Expire, at(9_000), POLICY).unwrap();
        assert_eq!(failed.to, TaskState::Failed);
        assert_eq!(failed.error(), Some("no answer within 10m"));
        assert_eq!(failed.run(), None);
        let no_deadline = task(State::WaitingInput {
            question: question(None),
        });
        assert!(decide(&no_deadline, &Command::Expire, at(1_000_000), POLICY).is_err());
    }

    #[test]
    fn a_reminder_comes_only_inside_its_window() {
        let waiting = task(State::WaitingInput {
            question: question(Some(600)),
        });
        let before = Duration::from_secs(60);
        let remind = |now| decide(&waiting, &Command::Remind { before }, at(now), POLICY);
        assert_eq!(remind(539), Err(Refusal::NotDue));
        assert_eq!(remind(600), Err(Refusal::NotDue));
        let d = remind(570).unwrap();
        assert!(!d.moves());
        assert_eq!(
            d.said().collect::<Vec<_>>(),
            vec![&Say::Reminder {
                handle: "a3f9".into(),
                question: "Which city?".into(),
                left: Some(Duration::from_secs(30))
            }]
        );
        // A nudge comes at any moment before the deadline, and without one.
        let nudge = decide(&waiting, &Command::Nudge, at(100), POLICY).unwrap();
        assert!(!nudge.moves());
        assert!(matches!(
            nudge.said().next(),
            Some(Say::Reminder { left: Some(left), .. }) if *left == Duration::from_secs(500)
        ));
        assert_eq!(
            decide(&waiting, &Command::Nudge, at(600), POLICY),
            Err(Refusal::NotDue)
        );
        let open_ended = task(State::WaitingInput {
            question: question(None),
        });
        assert!(matches!(
            decide(&open_ended, &Command::Nudge, at(100), POLICY)
                .unwrap()
                .said()
                .next(),
            Some(Say::Reminder { left: None, .. })
        ));
        assert_eq!(
            decide(
                &waiting,
                &Command::Remind {
                    before: Duration::ZERO
                },
                at(570),
                POLICY
            ),
            Err(Refusal::NotDue)
        );
    }

    #[test]
    fn a_lost_lease_is_retried_until_the_attempts_run_out() {
        let mut running = task(State::Running {
            pause_requested: false,
        });
        let retried = decide(&running, &Command::LeaseExpired, at(1), POLICY).unwrap();
        assert_eq!(retried.to, TaskState::Pending);
        assert!(retried.counts_attempt());
        assert_eq!(retried.run(), Some(pb::RunReason::Recover));
        running.attempt = 3;
        let failed = decide(&running, &Command::LeaseExpired, at(1), POLICY).unwrap();
        assert_eq!(failed.to, TaskState::Failed);
        assert_eq!(failed.event, Event::Fail);
        assert_eq!(
            failed.error(),
            Some("the task lost its worker 3 times (task.max_attempts = 3)")
        );
    }

    #[test]
    fn a_running_task_pauses_at_its_round_boundary_and_holds_no_worker() {
        let running = task(State::Running {
            pause_requested: false,
        });
        let asked = decide(&running, &Command::Pause, at(1), POLICY).unwrap();
        assert!(!asked.moves());
        assert!(asked.pause_requested);
        assert_eq!(asked.hints(), None);
        let waiting_pause = task(State::Running {
            pause_requested: true,
        });
        assert_eq!(
            decide(&waiting_pause, &Command::Pause, at(1), POLICY),
            Err(Refusal::Already(TaskState::Paused))
        );
        let released = decide(&waiting_pause, &Command::Release, at(2), POLICY).unwrap();
        assert_eq!(released.to, TaskState::Paused);
        assert_eq!(released.run(), None);
        let ask = Command::Ask { wait: WAIT };
        let asked_then = decide(&waiting_pause, &ask, at(2), POLICY).unwrap();
        assert_eq!(asked_then.to, TaskState::Paused);
        // Paused with its question open: the question still waits as the ask said.
        assert_eq!(asked_then.question_expires_after(), Some(WAIT.ask_timeout));
        // A resume before the boundary withdraws the pause.
        let withdrawn = decide(&waiting_pause, &Command::Resume, at(2), POLICY).unwrap();
        assert!(!withdrawn.moves());
        assert!(!withdrawn.pause_requested);
    }

    #[test]
    fn a_paused_question_keeps_its_answer_and_its_deadline_stands_still() {
        let paused = task(State::Paused {
            since: at(100),
            question: Some(question(Some(600))),
        });
        assert_eq!(
            decide(&paused, &Command::Expire, at(700), POLICY),
            Err(Refusal::WrongState {
                from: TaskState::Paused,
                event: Event::Expire(TimeoutPolicy::Resume)
            })
        );
        let answered = decide(&paused, &Command::Answer, at(200), POLICY).unwrap();
        assert_eq!(answered.to, TaskState::Paused);
        assert_eq!(answered.run(), None);
        let resumed = decide(&paused, &Command::Resume, at(400), POLICY).unwrap();
        assert_eq!(resumed.to, TaskState::WaitingInput);
        assert_eq!(
            resumed.effects,
            vec![Effect::ShiftDeadline(Duration::from_secs(300))]
        );
        // A question without a deadline may still be passed on to someone at a time, which
        // stood still as well.
        let open_ended = task(State::Paused {
            since: at(100),
            question: Some(question(None)),
        });
        assert_eq!(
            decide(&open_ended, &Command::Resume, at(400), POLICY)
                .unwrap()
                .effects,
            vec![Effect::ShiftDeadline(Duration::from_secs(300))]
        );
        let answered_while_paused = task(State::Paused {
            since: at(100),
            question: None,
        });
        let resumed = decide(&answered_while_paused, &Command::Resume, at(400), POLICY).unwrap();
        assert_eq!(resumed.to, TaskState::Pending);
        assert_eq!(resumed.run(), Some(pb::RunReason::Unpause));
    }

    fn names(people: &[&str]) -> Vec<String> {
        people.iter().map(|p| p.to_string()).collect()
    }

    fn escalated(askees: Askees<'_>) -> (Vec<String>, Vec<String>) {
        let waiting = Task {
            state: State::WaitingInput {
                question: question(None),
            },
            on_timeout: TimeoutPolicy::Resume,
            attempt: 1,
        };
        let decision = decide(&waiting, &Command::Escalate { askees }, at(60), POLICY).unwrap();
        assert_eq!(decision.to, TaskState::WaitingInput);
        assert!(decision.run().is_none() && decision.closes().is_none());
        let (ask, later) = decision.asks_next();
        (ask.iter().map(|o| o.to_string()).collect(), later.to_vec())
    }

    #[test]
    fn an_escalation_asks_the_next_person_named_on_the_questions_platform_once() {
        let named = names(&["qq:1", "not an owner", "tg:2", "qq:3", "qq:4"]);
        // One after another: the first who can be asked, the rest kept in order.
        let askees = Askees {
            named: &named,
            ..ASKEES
        };
        assert_eq!(
            escalated(askees),
            (
                names(&["qq:1"]),
                names(&["not an owner", "tg:2", "qq:3", "qq:4"])
            )
        );
        // Names that cannot be asked are passed over, and dropped from what is kept.
        let asked = names(&["qq:1"]);
        let askees = Askees {
            named: &named,
            asked: &asked,
            ..ASKEES
        };
        assert_eq!(escalated(askees), (names(&["qq:3"]), names(&["qq:4"])));
        // At once: everyone who can be asked, each once, and nobody kept.
        let twice = names(&["qq:1", "qq:3", "qq:1", "qq:4"]);
        let asked = names(&["qq:4"]);
        let askees = Askees {
            named: &twice,
            asked: &asked,
            at_once: true,
            ..ASKEES
        };
        assert_eq!(escalated(askees), (names(&["qq:1", "qq:3"]), Vec::new()));
        // Outside chat, or with nobody left, nobody is asked.
        let askees = Askees {
            named: &named,
            platform: None,
            ..ASKEES
        };
        assert_eq!(escalated(askees), (Vec::new(), Vec::new()));
        assert_eq!(escalated(ASKEES), (Vec::new(), Vec::new()));
    }

    #[test]
    fn only_a_running_task_is_told_to_stop() {
        for state in every_state() {
            let Ok(d) = decide(
                &task(state.clone()),
                &Command::Cancel { reason: "" },
                at(1),
                POLICY,
            ) else {
                continue;
            };
            assert_eq!(
                d.hints().is_some(),
                matches!(state, State::Running { .. }),
                "{state:?}"
            );
        }
    }
}
