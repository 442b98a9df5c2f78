//! Questions an outside agent asks a person through hark (its MCP server): each is the one
//! question of a task of the `external` kind, which no agent runs. The task is a questionnaire of
//! that one question, so everything a question has — routing from chat by quote, handle and then
//! oldest, reminders, deadlines, the ledger, events, the console's inbox — it has too; its
//! answer completes it. task-control claims it and asks the question itself as soon as it is
//! created; when it cannot (it stopped in between), the task's run job has a worker ask it, as
//! for any questionnaire.
//!
//! Everything lives in Postgres: any replica answers for any question.

use std::time::Duration;

use hark_core::domain::{
    DeadlinePolicy, Need, Owner, QuestionId, QuestionOutcome, Role, TaskId, TaskState,
    TimeoutPolicy, form::FormQuestion, form::progress, shape::Shape, text,
};

use super::{Caller, Error};
use crate::{
    shared::Shared,
    store::{self, AskInput, Escalation, KeyRow, NewTask, QuestionRow, TaskRow},
};

/// The key of the one question in the task's questionnaire.
const KEY: &str = "answer";

/// The shortest and longest a question may wait for its answer: models pass `timeout=1`.
pub const MIN_WAIT: Duration = Duration::from_secs(60);
pub const MAX_WAIT: Duration = Duration::from_secs(7 * 86_400);

/// The longest a question's text or context may be, in bytes.
pub const MAX_QUESTION_BYTES: usize = 8 * 1024;

/// How long task-control waits for a worker to ask a question it could not ask itself.
const ASKED_WITHIN: Duration = Duration::from_secs(30);

/// Who asks: a person's key (which asks only its owner), or an operator naming the owner.
#[derive(Debug, Clone)]
pub struct Asker {
    pub caller: Caller,
    /// The key that signed in; `None` for an operator's token.
    pub key: Option<KeyRow>,
}

impl Asker {
    /// The person a question goes to: the key's owner, or the one an operator names.
    fn owner(&self, named: Option<&Owner>) -> Result<Owner, Error> {
        match (&self.caller, named) {
            (Caller::Person { owner, .. }, Some(named)) if named != owner => {
                Err(Error::ForAnother {
                    by: owner.clone(),
                    owner: named.clone(),
                })
            }
            (Caller::Person { owner, .. }, _) => Ok(owner.clone()),
            (Caller::Operator(_), Some(named)) => Ok(named.clone()),
            (Caller::Operator(_), None) => Err(Error::OwnerNeeded),
        }
    }

    /// Who asked, as the person reads it.
    fn name(&self) -> String {
        match &self.key {
            Some(key) => key.name.clone(),
            None => self.caller.actor().to_owned(),
        }
    }

    /// Whether the caller may see `task`'s question: the key's owner (whichever of their keys
    /// asked it), an admin, or an operator.
    fn sees(&self, task: &TaskRow) -> bool {
        self.caller
            .sees_only()
            .is_none_or(|owner| task.owner == *owner)
    }
}

/// A question to ask, as a door read it.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub question: String,
    pub context: String,
    pub shape: Shape,
    /// `None`: `task.ask_timeout`; clamped to [`MIN_WAIT`]..[`MAX_WAIT`].
    pub timeout: Option<Duration>,
    /// A stream the owner is in (`group:456`); `None`: their private chat.
    pub chat: Option<String>,
    /// The person to ask; a person's key asks only its owner.
    pub owner: Option<Owner>,
    /// The caller's own id for this request: asking again with it asks nothing new.
    pub request_id: Option<String>,
}

/// A question asked, with its task.
#[derive(Debug, Clone)]
pub struct Asked {
    pub task: TaskRow,
    pub question: QuestionRow,
}

impl Asked {
    /// Whether the question is still open. Every move that ends a task closes its open question
    /// in the same statement, so the question alone says it.
    pub fn waiting(&self) -> bool {
        self.question.outcome == QuestionOutcome::Open
    }
}

/// Asks the owner `ask.question` in their chat, and returns it once committed.
pub async fn ask(shared: &Shared, asker: &Asker, ask: Ask) -> Result<Asked, Error> {
    let owner = asker.owner(ask.owner.as_ref())?;
    let role = match &asker.caller {
        Caller::Person { role, .. } => *role,
        Caller::Operator(_) => shared.role_of(&owner),
    };
    if role < Role::User {
        return Err(Error::CannotHaveTasks { owner, role });
    }
    let question = required("question", &ask.question)?;
    let context = text::optional_text(&ask.context, MAX_QUESTION_BYTES)
        .map_err(|e| argument("context", e))?;
    let context = shared
        .texts(owner.platform())
        .asked_through(&asker.name(), context);
    let wait = ask
        .timeout
        .unwrap_or(shared.config.task.ask_timeout.0)
        .clamp(MIN_WAIT, MAX_WAIT);
    let request_key = match &ask.request_id {
        None => None,
        Some(id) => Some(format!(
            "mcp:{}:{}",
            asker
                .key
                .as_ref()
                .map_or("operator".into(), |k| k.id.to_string()),
            text::text(id, 200).map_err(|e| argument("request_id", e))?
        )),
    };
    // A request asked before is that question, whatever the limits say now.
    if let Some(key) = &request_key
        && let Some(task) = shared.store.task_of_request(key).await?
    {
        if !asker.sees(&task) || task.goal != question {
            return Err(Error::Reused { task: task.id });
        }
        return asked_by_then(shared, task).await;
    }
    if let Some(key) = &asker.key {
        limit(shared, key).await?;
    }
    let route = super::reach::route_for(shared, &owner, ask.chat.as_deref()).await?;
    // One choice is kept as its choices, as a questionnaire keeps it; any other shape whole.
    let (choices, shape) = match &ask.shape {
        Shape::Text => (Vec::new(), None),
        Shape::Choice {
            choices,
            multiple: false,
        } => (choices.clone(), None),
        shape => (shape.choices().to_vec(), Some(shape.clone())),
    };
    let form = FormQuestion {
        key: KEY.into(),
        text: question.clone(),
        choices,
        shape,
        escalate_to: Vec::new(),
        escalate_after_s: 0,
        ask_to: Vec::new(),
        need: String::new(),
        context: context.clone(),
    };
    let task = shared
        .store
        .create_task(&NewTask {
            owner,
            goal: question.clone(),
            chat: Some(route),
            ask_timeout: wait,
            on_timeout: TimeoutPolicy::Resume,
            request_id: request_key.clone(),
            active_limit: 0,
            questionnaire: Some(vec![form]),
            schedule: None,
            priority: 0,
            deadline: None,
            on_deadline: DeadlinePolicy::Fail,
            asked_by: Some(asker.name()),
            key_id: asker.key.as_ref().map(|k| k.id),
        })
        .await?;
    if task.goal != question {
        return Err(Error::Reused { task: task.id });
    }
    if task.state == TaskState::Pending && task.generation == 1 {
        match ask_now(shared, &task, &question, &context, wait, ask.shape).await {
            Ok(asked) => return Ok(asked),
            // A worker took its run job first: it asks the question.
            Err(e) => tracing::debug!(task = %task.id, error = %e, "a worker asks the question"),
        }
    }
    asked_by_then(shared, task).await
}

fn argument(field: &'static str, why: impl std::fmt::Display) -> Error {
    Error::Argument {
        field,
        why: why.to_string(),
    }
}

/// A text that must be given: trimmed, bounded, without NUL.
fn required(field: &'static str, value: &str) -> Result<String, Error> {
    let value = text::text(value, MAX_QUESTION_BYTES)
        .map_err(|e| argument(field, e))?
        .trim();
    if value.is_empty() {
        return Err(argument(field, text::TextError::Empty));
    }
    Ok(value.to_owned())
}

/// Claims the new task and asks its question, as a worker would.
async fn ask_now(
    shared: &Shared,
    task: &TaskRow,
    question: &str,
    context: &str,
    wait: Duration,
    shape: Shape,
) -> Result<Asked, store::Error> {
    let lease = shared.config.task.lease.0;
    let claimed = super::claim::claim(
        &shared.store,
        task.id,
        task.generation,
        "task-control",
        lease,
    )
    .await?;
    let input = AskInput {
        round: 1,
        messages: serde_json::Value::Array(progress::step(&serde_json::Map::new(), Some(KEY))),
        consumed_instructions: Vec::new(),
        tool_call_id: progress::call_id(KEY),
        question: question.to_owned(),
        context: context.to_owned(),
        timeout: Some(wait),
        shape,
        waits_for: None,
        escalation: Escalation::default(),
        ask_to: Vec::new(),
        need: Need::default(),
    };
    let question = super::run::ask(&shared.store, &claimed.lease, &input).await?;
    Ok(Asked {
        task: claimed.task,
        question,
    })
}

/// The question of `task`, once it is asked (by this replica before it stopped, or a worker).
async fn asked_by_then(shared: &Shared, task: TaskRow) -> Result<Asked, Error> {
    let mut watch = shared
        .watchers
        .watch(task.id, crate::watchers::Holder::default())
        .ok();
    let until = tokio::time::Instant::now() + ASKED_WITHIN;
    loop {
        let task = shared.store.get_task(task.id).await?;
        if let Some(question) = shared.store.questions_of(task.id).await?.into_iter().last() {
            return Ok(Asked { task, question });
        }
        if task.state.is_terminal() || tokio::time::Instant::now() >= until {
            return Err(Error::NotAsked { task: task.id });
        }
        if !woken(watch.as_mut(), until, Duration::from_secs(1)).await {
            return Err(Error::NotAsked { task: task.id });
        }
    }
}

/// Refuses a key that has too many questions open, or asked too many this minute.
async fn limit(shared: &Shared, key: &KeyRow) -> Result<(), Error> {
    let config = &shared.config.mcp;
    let (open, minute) = shared.store.asked_with(key.id).await?;
    if config.max_open_per_key > 0 && open >= i64::from(config.max_open_per_key) {
        return Err(Error::TooManyOpen {
            key: key.name.clone(),
            limit: config.max_open_per_key,
        });
    }
    if config.max_per_minute_per_key > 0 && minute >= i64::from(config.max_per_minute_per_key) {
        return Err(Error::TooFast {
            key: key.name.clone(),
            limit: config.max_per_minute_per_key,
        });
    }
    Ok(())
}

/// Question `id` with its task, if the caller may see it; another person's question is refused.
pub async fn find(shared: &Shared, asker: &Asker, id: QuestionId) -> Result<Asked, Error> {
    let question = shared.store.get_question(id).await?;
    let asked = current(shared, id, question.task_id).await?;
    if !asker.sees(&asked.task) {
        return Err(Error::NotYourQuestion { id });
    }
    Ok(asked)
}

/// Question `id` once it is closed, or as it is after `hold`.
pub async fn wait(
    shared: &Shared,
    asker: &Asker,
    id: QuestionId,
    hold: Duration,
) -> Result<Asked, Error> {
    let first = find(shared, asker, id).await?;
    if !first.waiting() || hold.is_zero() {
        return Ok(first);
    }
    // Watched before it is read again, so that no answer comes between.
    let mut watch = shared
        .watchers
        .watch(first.task.id, crate::watchers::Holder::default())
        .ok();
    let until = tokio::time::Instant::now() + hold;
    let mut now = first;
    loop {
        now.question = shared.store.get_question(id).await?;
        // When task-control stops, the call returns what it has, and its client asks again.
        if !now.waiting()
            || tokio::time::Instant::now() >= until
            || !woken(watch.as_mut(), until, crate::events::RECHECK).await
        {
            return Ok(now);
        }
    }
}

/// Waits for the next event of the watched task, or `every` (events are published best effort),
/// but not past `until`; `false` once task-control stops, which no wait may hold up.
async fn woken(
    watch: Option<&mut crate::watchers::Watch>,
    until: tokio::time::Instant,
    every: Duration,
) -> bool {
    let recheck = tokio::time::sleep_until(until.min(tokio::time::Instant::now() + every));
    match watch {
        Some(w) => {
            let stopping = w.stopping();
            tokio::select! {
                event = w.next() => event.is_some(),
                _ = stopping.cancelled() => false,
                _ = recheck => true,
            }
        }
        None => {
            recheck.await;
            true
        }
    }
}

/// Question `id` and its task `task` as they are now.
async fn current(shared: &Shared, id: QuestionId, task: TaskId) -> Result<Asked, Error> {
    let task = shared.store.get_task(task).await?;
    let question = shared.store.get_question(id).await?;
    Ok(Asked { task, question })
}

/// Cancels question `id`: its task ends `cancelled` and the chat is told.
pub async fn cancel(shared: &Shared, asker: &Asker, id: QuestionId) -> Result<Asked, Error> {
    let asked = find(shared, asker, id).await?;
    if !asked.task.state.is_terminal() {
        let reason = format!("{} no longer needs the answer", asker.name());
        super::command::cancel(&shared.store, asked.task.id, asker.caller.actor(), &reason).await?;
    }
    current(shared, id, asked.task.id).await
}

/// The open questions the caller's key asked (an operator's: every open external question).
pub async fn open(shared: &Shared, asker: &Asker) -> Result<Vec<Asked>, Error> {
    let key = asker.key.as_ref().map(|k| k.id);
    let tasks = shared.store.open_external(key, 100).await?;
    let mut asked = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Some(question) = shared.store.open_question_of(task.id).await? {
            asked.push(Asked { task, question });
        }
    }
    Ok(asked)
}

/// Sends `text` to the owner's chat (or `chat`, one they are in), without waiting.
pub async fn notify(
    shared: &Shared,
    asker: &Asker,
    owner: Option<&Owner>,
    chat: Option<&str>,
    message: &str,
) -> Result<(), Error> {
    let owner = asker.owner(owner)?;
    let message = required("text", message)?;
    let route = super::reach::route_for(shared, &owner, chat).await?;
    let texts = shared.texts(&route.platform);
    let shown = texts.notified(&asker.name(), &message);
    shared
        .reply(&route.platform, &route.bot_id, &route.stream, &shown, "")
        .await;
    Ok(())
}

/// Whether the caller's key was granted `tool` for the rest of `session`.
pub async fn granted(shared: &Shared, asker: &Asker, session: &str, tool: &str) -> bool {
    let Some(key) = &asker.key else {
        return false;
    };
    shared
        .store
        .granted(key.id, session, tool)
        .await
        .unwrap_or(false)
}

/// Grants `tool` to the caller's key for the rest of `session` (at most a day).
pub async fn grant(
    shared: &Shared,
    asker: &Asker,
    session: &str,
    tool: &str,
    by: &str,
) -> Result<(), Error> {
    if let Some(key) = &asker.key {
        shared
            .store
            .grant(key.id, session, tool, by, Duration::from_secs(86_400))
            .await?;
    }
    Ok(())
}
