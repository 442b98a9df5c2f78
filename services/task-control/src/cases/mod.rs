//! What can be asked of hark, each written once: authorise, validate, decide, apply. Every door
//! calls these — chat commands, the gRPC API (and the console through it) and the workers'
//! control requests — and turns their typed errors into its own words: a status, a chat text,
//! a refusal. The store below only speaks SQL.

use std::time::Duration;

use hark_core::{
    domain::{
        DeadlinePolicy, Owner, QuestionId, Role, TaskId, TaskRef, TimeoutPolicy,
        decide::{self, Command, Decision},
        duration,
        form::FormQuestion,
        schedule::{Cron, Overlap},
        text,
    },
    error::{Classified, Kind},
};
use time::OffsetDateTime;

pub mod answer;
pub mod claim;
pub mod clock;
pub mod command;
mod delegate;
pub mod external;
pub mod handoff;
pub mod keys;
pub mod reach;
pub mod run;

pub use delegate::delegate;

use crate::{
    shared::Shared,
    store::{
        self, ChatRoute, NewSchedule, NewTask, QuestionRow, ScheduleRow, TaskRow, TellDelivery,
    },
};

/// What `command` does to `task` waiting on `question` (or paused with it open), at `now`.
fn decide_asked(
    task: &TaskRow,
    question: &QuestionRow,
    command: &Command<'_>,
    now: OffsetDateTime,
    policy: decide::Policy,
) -> Result<Decision, store::Error> {
    let lifecycle = task
        .lifecycle(question.open())
        .ok_or_else(|| store::Error::Internal(format!("task {} has no open question", task.id)))?;
    decide::decide(&lifecycle, command, now, policy).map_err(|r| store::Error::refused(task.id, r))
}

/// The reminder `command` decides for the task waiting on `question`, at `now`; `None` when the
/// question is not one a reminder is for.
fn reminder(
    question: &QuestionRow,
    command: &Command<'_>,
    now: OffsetDateTime,
    policy: decide::Policy,
) -> Option<Decision> {
    let question = question.open()?;
    let state = decide::State::WaitingInput { question };
    decide::decide_on_state(state, command, now, policy).ok()
}

/// Why a use case refused, or the store's error when it could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("owner {owner} has the role {role} and cannot have tasks; add it to permission.users")]
    CannotHaveTasks { owner: Owner, role: Role },
    #[error("{0}")]
    Goal(text::TextError),
    #[error("{0}")]
    Instruction(text::TextError),
    #[error("must be between -100 and 100")]
    Priority,
    #[error("{0}")]
    AskTimeout(String),
    #[error("{0}")]
    Deadline(String),
    /// The request key was used before for another task: a retry must repeat its request.
    #[error("the request key was used before for another task ({task})")]
    Reused { task: TaskId },
    /// Only the person asked, the task's owner or an admin passes a question on.
    #[error("only the person asked, or the task's owner, can pass question #{handle} on")]
    NotYours { handle: String },
    #[error("question #{handle} is already asked of {askee}")]
    AlreadyAsked { handle: String, askee: Owner },
    #[error("{to} is not on {platform}, where the question is asked; name a {platform}: person")]
    OtherPlatform { to: Owner, platform: String },
    /// A person creates tasks only for themselves.
    #[error("owner: {by} creates tasks only for {by}, not for {owner}")]
    ForAnother { by: Owner, owner: Owner },
    /// A person's key makes keys only for its own owner.
    #[error("a person's key cannot make a key for {owner}; only an operator token can")]
    KeyOfAnother { owner: Owner },
    #[error("a key's name must be 1 to 64 characters, without control characters")]
    KeyName,
    #[error("{owner} has the role {most}, so their key cannot have the role {role}")]
    KeyRole {
        owner: Owner,
        role: Role,
        most: Role,
    },
    /// hark has no chat of theirs to reach them in.
    #[error("hark has never seen {owner} in a chat: they must send the bot a message first")]
    NeverSeen { owner: Owner },
    /// A chat the person was never seen in: the bot does not post there for them.
    #[error(
        "{owner} was never seen in {chat}: name a chat they speak in, or none for their private chat"
    )]
    NotTheirChat { owner: Owner, chat: String },
    /// An argument of a request that does not hold.
    #[error("{field}: {why}")]
    Argument { field: &'static str, why: String },
    /// An operator's token asks on nobody's behalf: it names the person.
    #[error("owner: an operator's token must name the person to ask (platform:user_id)")]
    OwnerNeeded,
    #[error(
        "task {task} was made for the question, but nothing asked it yet: ask again with the same request id"
    )]
    NotAsked { task: TaskId },
    #[error(
        "the key {key} has {limit} questions open (mcp.max_open_per_key): wait for answers, or cancel some"
    )]
    TooManyOpen { key: String, limit: u32 },
    #[error(
        "the key {key} asked {limit} questions in the last minute (mcp.max_per_minute_per_key): ask again in a minute"
    )]
    TooFast { key: String, limit: u32 },
    /// Another person's task, named by its whole id.
    #[error("task {task} is not a task of {owner}")]
    NotYourTask { task: TaskId, owner: Owner },
    /// Another person's question: a key sees only its owner's.
    #[error("question {id} was not asked of this key's owner")]
    NotYourQuestion { id: QuestionId },
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl Classified for Error {
    fn kind(&self) -> Kind {
        match self {
            Error::CannotHaveTasks { .. } => Kind::Forbidden,
            Error::Goal(_)
            | Error::Instruction(_)
            | Error::Priority
            | Error::AskTimeout(_)
            | Error::Deadline(_) => Kind::Invalid,
            Error::Reused { .. } | Error::AlreadyAsked { .. } => Kind::Conflict,
            Error::NotYours { .. } => Kind::Forbidden,
            Error::OtherPlatform { .. } => Kind::Invalid,
            Error::KeyOfAnother { .. } | Error::KeyRole { .. } | Error::ForAnother { .. } => {
                Kind::Forbidden
            }
            Error::KeyName => Kind::Invalid,
            Error::NeverSeen { .. } => Kind::Conflict,
            Error::NotTheirChat { .. } => Kind::Forbidden,
            Error::OwnerNeeded | Error::Argument { .. } => Kind::Invalid,
            Error::NotAsked { .. } => Kind::Unavailable,
            Error::TooManyOpen { .. } | Error::TooFast { .. } => Kind::Exhausted,
            Error::NotYourQuestion { .. } | Error::NotYourTask { .. } => Kind::Forbidden,
            Error::Store(e) => e.kind(),
        }
    }
}

/// A task to create, as a door read it.
#[derive(Debug, Clone)]
pub struct Create {
    /// Who asks for it: a person creates tasks only for themselves, with their role; an
    /// operator for anyone, with that owner's role.
    pub by: Caller,
    pub owner: Owner,
    /// As given: checked here. A questionnaire's may be empty, and is then its size.
    pub goal: String,
    pub chat: Option<ChatRoute>,
    /// `None`: `task.ask_timeout`.
    pub ask_timeout: Option<Duration>,
    /// `None`: `task.on_timeout`.
    pub on_timeout: Option<TimeoutPolicy>,
    pub priority: i16,
    /// Creating twice with one key gives the first task; the door makes the key its own
    /// (`api:<owner>:<id>`, a chat message's inbound key, `subtask:<key>`).
    pub request_key: Option<String>,
    /// The questions of a questionnaire, which no agent runs.
    pub questionnaire: Option<Vec<FormQuestion>>,
    /// How long the task may take from its creation; `None`: `task.deadline`.
    pub deadline: Option<Duration>,
    /// `None`: `task.on_deadline`.
    pub on_deadline: Option<DeadlinePolicy>,
}

/// When a scheduled task runs, as a door read it.
#[derive(Debug, Clone)]
pub struct When {
    /// The recurrence; `None` runs once, at `first_run`.
    pub cron: Option<Cron>,
    /// The IANA time zone the cron expression is read in.
    pub timezone: String,
    pub first_run: OffsetDateTime,
}

/// What a creation decided: its goal, and the defaults of what the door left out.
struct Checked {
    goal: String,
    ask_timeout: Duration,
    on_timeout: TimeoutPolicy,
    /// `None`: no deadline.
    deadline: Option<Duration>,
    on_deadline: DeadlinePolicy,
}

/// Authorises and checks a creation, and decides what it left to the configuration.
fn check(shared: &Shared, new: &Create) -> Result<Checked, Error> {
    let role = match &new.by {
        Caller::Operator(_) => shared.role_of(&new.owner),
        Caller::Person { owner, .. } if *owner != new.owner => {
            return Err(Error::ForAnother {
                by: owner.clone(),
                owner: new.owner.clone(),
            });
        }
        Caller::Person { role, .. } => *role,
    };
    if role < Role::User {
        return Err(Error::CannotHaveTasks {
            owner: new.owner.clone(),
            role,
        });
    }
    let goal = match &new.questionnaire {
        // A questionnaire's goal is only its title.
        Some(questions) if new.goal.trim().is_empty() => {
            format!("a questionnaire of {} questions", questions.len())
        }
        _ => text::text(&new.goal, text::MAX_TEXT_BYTES)
            .map_err(Error::Goal)?
            .to_owned(),
    };
    if !(-100..=100).contains(&new.priority) {
        return Err(Error::Priority);
    }
    let config = &shared.config.task;
    let ask_timeout = match new.ask_timeout {
        None => config.ask_timeout.0,
        Some(wait) => {
            duration::at_most(wait, duration::MAX_QUESTION_WAIT).map_err(Error::AskTimeout)?
        }
    };
    let deadline = match new.deadline {
        None => (!config.deadline.0.is_zero()).then_some(config.deadline.0),
        Some(wait) if wait.is_zero() => {
            return Err(Error::Deadline(
                "must be more than 0s; leave it out for task.deadline".into(),
            ));
        }
        Some(wait) => {
            Some(duration::at_most(wait, duration::MAX_QUESTION_WAIT).map_err(Error::Deadline)?)
        }
    };
    Ok(Checked {
        goal,
        ask_timeout,
        on_timeout: new.on_timeout.unwrap_or(config.on_timeout),
        deadline,
        on_deadline: new.on_deadline.unwrap_or(config.on_deadline),
    })
}

/// Creates a task, queued for its first run. A key used before gives the task it made, if that
/// task was made by the same request (same goal and chat).
pub async fn create_task(shared: &Shared, mut new: Create) -> Result<TaskRow, Error> {
    let checked = check(shared, &new)?;
    // The people a questionnaire's questions escalate to or are put to, each on the platform
    // of its chat.
    let platform = new.chat.as_ref().map(|c| c.platform.clone());
    for (i, question) in new.questionnaire.iter_mut().flatten().enumerate() {
        if !question.escalate_to.is_empty() {
            let key = format!("questionnaire: question {}: escalate_to", i + 1);
            question.escalate_to =
                store::people_on(platform.as_deref(), &question.escalate_to, &key)?;
        }
        if !question.ask_to.is_empty() {
            let key = format!("questionnaire: question {}: ask_to", i + 1);
            question.ask_to = store::people_on(platform.as_deref(), &question.ask_to, &key)?;
        }
    }
    let asked = (
        checked.goal.clone(),
        new.chat.as_ref().map(|c| c.stream.clone()),
    );
    let task = shared
        .store
        .create_task(&NewTask {
            owner: new.owner,
            goal: checked.goal,
            chat: new.chat,
            ask_timeout: checked.ask_timeout,
            on_timeout: checked.on_timeout,
            request_id: new.request_key.clone(),
            active_limit: shared.config.task.max_active_per_owner,
            questionnaire: new.questionnaire,
            schedule: None,
            priority: new.priority,
            deadline: checked.deadline,
            on_deadline: checked.on_deadline,
            asked_by: None,
            key_id: None,
        })
        .await?;
    if new.request_key.is_some() && (task.goal != asked.0 || task.stream != asked.1) {
        return Err(Error::Reused { task: task.id });
    }
    Ok(task)
}

/// Creates a schedule that starts the task at each run. A key used before gives the schedule it
/// made.
pub async fn create_schedule(
    shared: &Shared,
    new: Create,
    when: When,
) -> Result<ScheduleRow, Error> {
    if new.deadline.is_some() || new.on_deadline.is_some() {
        return Err(Error::Deadline(
            "a scheduled task cannot have a deadline; give it when the task is created".into(),
        ));
    }
    let checked = check(shared, &new)?;
    Ok(shared
        .store
        .create_schedule(&NewSchedule {
            owner: new.owner,
            goal: checked.goal,
            chat: new.chat,
            ask_timeout: checked.ask_timeout,
            on_timeout: checked.on_timeout,
            cron: when.cron,
            timezone: when.timezone,
            first_run: when.first_run,
            overlap: Overlap::Skip,
            request_id: new.request_key,
            priority: new.priority,
        })
        .await?)
}

/// Who asks something of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An operator's door (the API's tokens, the console): it may act on every task. The audit
    /// names the door.
    Operator(&'static str),
    /// A person, in chat: their own tasks, or every task for an admin.
    Person { owner: Owner, role: Role },
}

impl Caller {
    /// Who the audit says moved a task.
    pub fn actor(&self) -> &str {
        match self {
            Caller::Operator(door) => door,
            Caller::Person { owner, .. } => owner.as_str(),
        }
    }

    /// The person the caller is, whatever their role; `None` for an operator.
    pub fn owner(&self) -> Option<&Owner> {
        match self {
            Caller::Operator(_) => None,
            Caller::Person { owner, .. } => Some(owner),
        }
    }

    /// The owner whose tasks alone the caller sees; `None` for every task.
    pub fn sees_only(&self) -> Option<&Owner> {
        match self {
            Caller::Person { owner, role } if *role < Role::Admin => Some(owner),
            _ => None,
        }
    }
}

/// A task the caller may act on: only [`find`] makes one, so that no move skips the check.
#[derive(Debug, Clone)]
pub struct Found {
    task: TaskRow,
    caller: Caller,
}

impl std::ops::Deref for Found {
    type Target = TaskRow;

    fn deref(&self) -> &TaskRow {
        &self.task
    }
}

/// The task `reference` names, if the caller may see it. A prefix is resolved only among the
/// tasks the caller sees, so that nobody learns of other people's tasks by probing prefixes (it
/// is not found, as if it did not exist); a whole id of another person's task, which nobody
/// guesses, is refused as not theirs.
pub async fn find(shared: &Shared, caller: &Caller, reference: &TaskRef) -> Result<Found, Error> {
    let only = caller.sees_only();
    let task = match reference {
        TaskRef::Full(_) => shared.store.resolve_task(reference, None).await?,
        TaskRef::Prefix(_) => shared.store.resolve_task(reference, only).await?,
    };
    if let Some(owner) = only.filter(|owner| task.owner != **owner) {
        return Err(Error::NotYourTask {
            task: task.id,
            owner: owner.clone(),
        });
    }
    Ok(Found {
        task,
        caller: caller.clone(),
    })
}

/// Cancels the task: it ends `cancelled`, its open question with it, and its chat is told
/// `reason`.
pub async fn cancel(shared: &Shared, found: &Found, reason: &str) -> Result<TaskRow, Error> {
    Ok(command::cancel(&shared.store, found.id, found.caller.actor(), reason).await?)
}

/// Pauses the task, or asks its worker to pause it at the next round boundary.
pub async fn pause(shared: &Shared, found: &Found) -> Result<TaskRow, Error> {
    Ok(command::pause(&shared.store, found.id, found.caller.actor()).await?)
}

/// Resumes a paused task: waiting on its open question again, or queued.
pub async fn resume(shared: &Shared, found: &Found) -> Result<TaskRow, Error> {
    Ok(command::resume(&shared.store, found.id, found.caller.actor()).await?)
}

/// Reminds the person question `id` is asked of, now, deadline or not (the console's
/// "remind"), at most once a minute. Only a question of a task the caller sees: another
/// person's question is not found, as if it did not exist, and nothing is sent.
pub async fn remind(
    shared: &Shared,
    caller: &Caller,
    id: QuestionId,
) -> Result<QuestionRow, Error> {
    if let Some(owner) = caller.sees_only() {
        let asked = shared.store.get_question(id).await?;
        let task = shared.store.get_task(asked.task_id).await?;
        if task.owner != *owner {
            return Err(store::Error::QuestionNotFound(id.to_string()).into());
        }
    }
    let policy = shared.store.policy();
    let nudge = |question: &QuestionRow, now| reminder(question, &Command::Nudge, now, policy);
    Ok(shared.store.remind_now(id, nudge).await?)
}

/// Gives the task an instruction: its agent reads it before its next round, or when it is
/// resumed. `author` is the caller unless the door names another (the API's `author`).
pub async fn tell(
    shared: &Shared,
    found: &Found,
    instruction: &str,
    author: Option<&str>,
) -> Result<(uuid::Uuid, TellDelivery), Error> {
    let instruction = text::text(instruction, text::MAX_TEXT_BYTES).map_err(Error::Instruction)?;
    let author = author.unwrap_or(found.caller.actor());
    Ok(shared.store.tell(found.id, instruction, author).await?)
}
