//! Inbound chat messages: commands, and answers to open questions.
//!
//! A message that starts with the command word is a command and never an answer. Any other
//! message is a candidate answer, routed by [`route`] from what the store loads: (a) it quotes a
//! chat message that carried a question; (b) it starts with the `#handle` of one of the sender's
//! open questions in that stream; (c) the sender's oldest open question in that stream. Only the
//! task's owner may answer; nobody else's message ever does.

pub mod command;
pub mod route;

use hark_core::{
    bus::Names,
    domain::{Handle, Owner, Role, StreamId, TaskRef, TaskState, schedule, text},
};
use hark_proto::v1 as pb;

use crate::{
    cases,
    shared::Shared,
    store::{
        self, Answer, AnswerOutcome, AnswerTarget, ChatRoute, QuestionRow, TaskFilter, TaskRow,
        TellDelivery,
    },
    texts::Texts,
};
use command::Command;

/// Rows `/task list` shows at most.
const LIST_ROWS: i64 = 20;

/// A chat message after its fields were checked.
#[derive(Debug, Clone)]
struct Inbound {
    platform: String,
    bot_id: String,
    stream: StreamId,
    user_id: String,
    text: String,
    quoted: String,
    quoted_text: String,
    quoted_sender: String,
    message_id: String,
    /// The user ids the message mentions (not the bot).
    mentions: Vec<String>,
    /// When the gateway read it.
    received_at: Option<time::OffsetDateTime>,
}

impl Inbound {
    fn parse(msg: pb::ChatMessage) -> Result<Self, String> {
        let stream: StreamId = msg
            .stream
            .parse()
            .map_err(|e: hark_core::domain::IdError| e.to_string())?;
        let user_id = msg.sender.map(|s| s.user_id).unwrap_or_default();
        if user_id.is_empty() {
            return Err("the message has no sender".into());
        }
        Ok(Self {
            platform: msg.platform,
            bot_id: msg.bot_id,
            stream,
            user_id,
            // Postgres stores no NUL character in a text; in a chat message it carries nothing.
            text: msg.text.replace('\0', ""),
            quoted: msg.quoted_message_id,
            quoted_text: msg.quoted_text,
            quoted_sender: msg.quoted_sender,
            message_id: msg.message_id,
            mentions: msg.mentions,
            received_at: msg.received_at.and_then(|t| {
                time::OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos),
                )
                .ok()
            }),
        })
    }

    /// The sender as an owner; `None` when the platform is unknown.
    fn owner(&self) -> Option<Owner> {
        Owner::new(&self.platform, &self.user_id).ok()
    }

    /// The key that makes applying this message idempotent.
    fn key(&self) -> Option<String> {
        (!self.message_id.is_empty()).then(|| {
            Names::chat_in_msg_id(
                &self.platform,
                &self.bot_id,
                self.stream.as_str(),
                &self.message_id,
            )
        })
    }

    fn route(&self) -> ChatRoute {
        ChatRoute {
            platform: self.platform.clone(),
            bot_id: self.bot_id.clone(),
            stream: self.stream.to_string(),
            origin_message_id: (!self.message_id.is_empty()).then(|| self.message_id.clone()),
        }
    }
}

/// What hark made of a chat message, as a framework in front of the chat is told: whether hark
/// took it (so that the framework's own handlers leave it alone), and as what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// An answer to an open question (applied, counted, or a duplicate of one).
    Answer,
    /// A hark command, answered or refused.
    Command,
    /// Not an answer, but about hark's questions: hark replied with a hint (the answer did not
    /// fit, the question is closed, which question is meant, too late).
    Hint,
    /// Not for hark: left to whoever else reads the chat.
    Left,
}

impl Verdict {
    pub fn taken(self) -> bool {
        self != Verdict::Left
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Answer => "answer",
            Verdict::Command => "command",
            Verdict::Hint => "hint",
            Verdict::Left => "left",
        }
    }
}

/// Handles one inbound chat message. An `Err` is worth retrying (the database was unreachable);
/// everything the sender got wrong is answered in the chat instead.
pub async fn handle(shared: &Shared, msg: pb::ChatMessage) -> Result<Verdict, store::Error> {
    let inbound = match Inbound::parse(msg) {
        Ok(inbound) => inbound,
        Err(reason) => {
            tracing::debug!(reason, "ignoring a chat message");
            return Ok(Verdict::Left);
        }
    };
    let handled = handle_inbound(shared, &inbound).await;
    if let Ok(verdict) = handled {
        tell_verdict(shared, &inbound, verdict).await;
    }
    // Where the sender speaks, so that hark may reach them there when asked to: noted after the
    // message is handled, so that an answer does not wait for it, and best effort (the sender's
    // next message notes it again).
    if handled.is_ok()
        && let Some(sender) = inbound.owner()
    {
        let chat = inbound.stream.as_str();
        let saw = shared
            .store
            .saw(&sender, &inbound.platform, &inbound.bot_id, chat);
        if let Err(e) = saw.await {
            tracing::warn!(error = %e, "cannot note the chat a person spoke in");
        }
    }
    handled
}

/// Tells whoever waits for this message's verdict (the HTTP adapter, for a framework in front of
/// the chat) what hark made of it. Best effort, on core NATS: after hark's reply is on its way,
/// and again when a redelivered message is handled again; nobody may be listening.
async fn tell_verdict(shared: &Shared, inbound: &Inbound, verdict: Verdict) {
    let Some(key) = inbound.key() else { return };
    let told = hark_core::bus::ChatVerdict {
        taken: verdict.taken(),
        kind: verdict.as_str().to_owned(),
    };
    let Ok(body) = serde_json::to_vec(&told) else {
        return;
    };
    let subject = shared.names.chat_verdict(&key);
    if let Err(e) = shared.nats.publish(subject, body.into()).await {
        tracing::debug!(error = %e, "cannot tell a chat message's verdict");
    }
}

async fn handle_inbound(shared: &Shared, inbound: &Inbound) -> Result<Verdict, store::Error> {
    let chat = &shared.config.chat;
    let words: Vec<String> = std::iter::once(chat.command.clone())
        .chain(chat.command_aliases.iter().cloned())
        .collect();
    let command = command::strip_command(&inbound.text, &words)
        .map(str::to_owned)
        .or_else(|| command::strip_delegate(&inbound.text).map(|rest| format!("delegate {rest}")))
        .or_else(|| {
            command::strip_command(&inbound.text, &command::KEY_WORDS)
                .map(|rest| format!("key {rest}"))
        });
    if let Some(args) = command.as_deref() {
        if let Some(sender) = inbound.owner() {
            match shared.commands.check(&sender, std::time::Instant::now()) {
                crate::limit::Verdict::Allow => {}
                crate::limit::Verdict::RefuseAndTell => {
                    tracing::info!(%sender, "refusing commands over chat.commands_per_minute");
                    let text = shared
                        .texts(&inbound.platform)
                        .too_many_commands(chat.commands_per_minute, shared.commands.wait_hint());
                    say(shared, inbound, &text).await;
                    return Ok(Verdict::Command);
                }
                crate::limit::Verdict::RefuseQuietly => return Ok(Verdict::Command),
            }
        }
        let reply = match command::parse(args, &chat.command, shared.texts(&inbound.platform)) {
            Ok(cmd) => run_command(shared, inbound, cmd).await?,
            Err(usage) => Some(usage),
        };
        if let Some(text) = reply {
            say(shared, inbound, &text).await;
        }
        return Ok(Verdict::Command);
    }
    route_answer(shared, inbound).await
}

async fn say(shared: &Shared, inbound: &Inbound, text: &str) {
    shared
        .reply(
            &inbound.platform,
            &inbound.bot_id,
            inbound.stream.as_str(),
            text,
            &inbound.message_id,
        )
        .await;
}

async fn route_answer(shared: &Shared, inbound: &Inbound) -> Result<Verdict, store::Error> {
    let store = &shared.store;
    let t = shared.texts(&inbound.platform);
    // Read with their tasks, so that the answer starts from them without reading again.
    let targets = store
        .open_questions_for_sender(
            &inbound.platform,
            inbound.stream.as_str(),
            &inbound.user_id,
            inbound.key().as_deref(),
        )
        .await?;
    let open: Vec<QuestionRow> = targets.iter().map(|t| t.question.clone()).collect();
    let quoted = match inbound.quoted.as_str() {
        "" => None,
        id => {
            store
                .question_by_chat_message(&inbound.platform, inbound.stream.as_str(), id)
                .await?
        }
    };
    let by_handle = match Handle::strip_prefix(&inbound.text) {
        Some((handle, _))
            if inbound.quoted.is_empty() && !open.iter().any(|q| q.handle == handle.as_str()) =>
        {
            store
                .question_by_handle(&inbound.platform, inbound.stream.as_str(), handle.as_str())
                .await?
        }
        _ => None,
    };
    let message = route::Message {
        platform: &inbound.platform,
        stream: inbound.stream.as_str(),
        user_id: &inbound.user_id,
        bot_id: &inbound.bot_id,
        text: &inbound.text,
        quoted: &inbound.quoted,
        quoted_text: &inbound.quoted_text,
        quoted_sender: &inbound.quoted_sender,
        received_at: inbound.received_at,
    };
    let found = route::Found {
        open: &open,
        quoted: quoted.as_ref(),
        by_handle: by_handle.as_ref(),
    };
    match route::route(&message, &found) {
        route::Route::Answer { question, text } => {
            let question = open
                .iter()
                .chain(quoted.as_ref())
                .find(|q| q.id == question)
                .cloned()
                .ok_or_else(|| store::Error::Internal("routed to a question not loaded".into()))?;
            apply(shared, inbound, &question, &text, &targets).await
        }
        route::Route::Closed(id) => {
            match quoted.iter().chain(by_handle.iter()).find(|q| q.id == id) {
                Some(question) => {
                    say(shared, inbound, &closed_text(t, question)).await;
                    Ok(Verdict::Hint)
                }
                None => Ok(Verdict::Left),
            }
        }
        route::Route::QuotedClosed(handle) => {
            let text = match store
                .question_by_handle(&inbound.platform, inbound.stream.as_str(), &handle)
                .await?
            {
                Some(question)
                    if question
                        .owner
                        .is_sender(&inbound.platform, &inbound.user_id) =>
                {
                    closed_text(t, &question)
                }
                _ => return Ok(Verdict::Left),
            };
            say(shared, inbound, &text).await;
            Ok(Verdict::Hint)
        }
        route::Route::TooLate => {
            let handles: Vec<String> = open.iter().map(|q| format!("#{}", q.handle)).collect();
            let text = t.too_late(&handles);
            say(shared, inbound, &text).await;
            Ok(Verdict::Hint)
        }
        route::Route::AskWhich => {
            let open: Vec<(String, String)> = open
                .iter()
                .map(|q| (q.handle.clone(), q.text.clone()))
                .collect();
            let text = t.ask_which(&open);
            say(shared, inbound, &text).await;
            Ok(Verdict::Hint)
        }
        route::Route::Ignore => Ok(Verdict::Left),
    }
}

fn closed_text(t: Texts, question: &QuestionRow) -> String {
    t.closed(question.task_id, &question.handle, question.outcome)
}

async fn apply(
    shared: &Shared,
    inbound: &Inbound,
    question: &QuestionRow,
    text: &str,
    open: &[AnswerTarget],
) -> Result<Verdict, store::Error> {
    let t = shared.texts(&inbound.platform);
    // An answer too long to keep is refused, and the question stays open for a shorter one.
    if let Err(e) = text::optional_text(text, text::MAX_TEXT_BYTES) {
        let reply = t.answer_refused(&question.handle, &e.to_string());
        say(shared, inbound, &reply).await;
        return Ok(Verdict::Hint);
    }
    let answer = Answer {
        answerer: inbound
            .owner()
            .map_or_else(|| inbound.user_id.clone(), |o| o.to_string()),
        text: text.to_owned(),
        json: None,
        inbound_key: inbound.key(),
    };
    // An open question comes with its task as read; any other is looked up.
    let answers = cases::answer::Answers::of(shared);
    let applied = match open.iter().find(|t| t.question.id == question.id) {
        Some(target) => answers.target(target.clone(), &answer).await,
        None => answers.answer(question.id, &answer).await,
    };
    match applied {
        Ok(AnswerOutcome::Applied { task, .. }) => {
            tracing::info!(task = %task.id, question = %question.id, "answer applied");
            let others: Vec<String> = open
                .iter()
                .map(|t| &t.question)
                .filter(|q| q.id != question.id)
                .map(|q| q.handle.clone())
                .collect();
            let ack = t.got_it(task.id, task.state == TaskState::Paused, &others);
            say(shared, inbound, &ack).await;
            Ok(Verdict::Answer)
        }
        Ok(AnswerOutcome::Duplicate { .. }) => Ok(Verdict::Answer),
        Ok(AnswerOutcome::Counted { have, need, .. }) => {
            say(
                shared,
                inbound,
                &t.answer_counted(&question.handle, have, need),
            )
            .await;
            Ok(Verdict::Answer)
        }
        Err(store::Error::Misfit {
            handle,
            shape,
            misfit,
            ..
        }) => {
            let reply = t.misfit(&handle, &shape, &misfit);
            say(shared, inbound, &reply).await;
            Ok(Verdict::Hint)
        }
        Err(store::Error::QuestionClosed { .. }) => {
            let now = shared.store.get_question(question.id).await?;
            say(shared, inbound, &closed_text(t, &now)).await;
            Ok(Verdict::Hint)
        }
        // Passed on to someone else just before this answer would have counted.
        Err(store::Error::Moved { handle, askee }) => {
            say(shared, inbound, &t.passed_meanwhile(&handle, &askee)).await;
            Ok(Verdict::Hint)
        }
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "cannot apply an answer");
            Ok(Verdict::Left)
        }
    }
}

/// Runs a command; returns the reply, if any.
async fn run_command(
    shared: &Shared,
    inbound: &Inbound,
    cmd: Command,
) -> Result<Option<String>, store::Error> {
    let t = shared.texts(&inbound.platform);
    let Some(sender) = inbound.owner() else {
        return Ok(Some(t.no_platform()));
    };
    let role = shared.role_of(&sender);
    let word = &shared.config.chat.command;
    let reply = match cmd {
        Command::Help => t.help(word),
        Command::New {
            timeout,
            on_timeout,
            when,
            priority,
            deadline,
            on_deadline,
            goal,
        } => {
            let create = cases::Create {
                by: cases::Caller::Person {
                    owner: sender.clone(),
                    role,
                },
                owner: sender.clone(),
                goal,
                chat: Some(inbound.route()),
                ask_timeout: timeout.map(|t| t.0),
                on_timeout,
                priority: priority.unwrap_or(0),
                request_key: inbound.key(),
                questionnaire: None,
                deadline: deadline.map(|d| d.0),
                on_deadline,
            };
            let created = match when {
                Some(when) => {
                    let timezone = shared.config.task.timezone_for(&inbound.platform);
                    schedule_task(shared, t, create, timezone, when).await
                }
                None => cases::create_task(shared, create)
                    .await
                    .map(|task| t.created(task.id, &task.goal)),
            };
            match created {
                Ok(said) => said,
                Err(e) => refused_creation(t, e, word, shared.config.task.max_active_per_owner)?,
            }
        }
        Command::List { all, state } => {
            if all && role < Role::Admin {
                return Ok(Some(t.admins_only_list()));
            }
            let tasks = shared
                .store
                .list_tasks(&TaskFilter {
                    owner: (!all).then(|| sender.clone()),
                    states: state.into_iter().collect(),
                    limit: LIST_ROWS,
                    ..Default::default()
                })
                .await?;
            let schedules = if state.is_none() {
                shared
                    .store
                    .list_schedules((!all).then_some(&sender), false, LIST_ROWS)
                    .await?
            } else {
                Vec::new()
            };
            let schedule_lines = schedules.iter().map(|s| {
                let next = s
                    .next_run
                    .map(|at| schedule::shown_in(at, &s.timezone))
                    .unwrap_or_default();
                t.schedule_line(&s.short(), &s.goal, &next, s.cron.as_deref())
            });
            if tasks.is_empty() && schedules.is_empty() {
                t.no_tasks()
            } else {
                tasks
                    .iter()
                    .map(|task| {
                        let owner = task.owner.to_string();
                        t.list_line(
                            task.id,
                            task.state,
                            all.then_some(owner.as_str()),
                            &task.goal,
                        )
                    })
                    .chain(schedule_lines)
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
        Command::Status(reference) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(text) => text,
                Ok(task) => status_text(shared, t, &task).await?,
            }
        }
        Command::History(reference) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(text) => text,
                Ok(task) => history_text(shared, t, &task).await?,
            }
        }
        Command::Cancel(reference) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(text) => match cancel_schedule(shared, t, &reference, &sender, role).await? {
                    Some(reply) => reply,
                    None => text,
                },
                Ok(task) if task.state.is_terminal() => t.already_ended(task.id, task.state),
                Ok(task) => {
                    let reason = t.cancelled_by(sender.as_str());
                    match cases::cancel(shared, &task, &reason)
                        .await
                        .map_err(into_store)
                    {
                        Ok(_) => {
                            // The task's own chat is told by the cancellation itself.
                            let same_chat = task.stream.as_deref() == Some(inbound.stream.as_str())
                                && task.platform.as_deref() == Some(inbound.platform.as_str());
                            if same_chat {
                                return Ok(None);
                            }
                            t.cancelled_reply(task.id)
                        }
                        Err(store::Error::WrongState { state, .. }) => {
                            t.already_ended(task.id, state)
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Command::Pause(reference) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(text) => text,
                Ok(task) => match cases::pause(shared, &task).await.map_err(into_store) {
                    Ok(now) if now.state == TaskState::Paused => t.paused(now.id, word),
                    Ok(now) => t.pause_requested(now.id, word),
                    Err(store::Error::Already { state, .. }) => t.already(task.id, state),
                    Err(store::Error::WrongState { state, .. }) => t.cannot_pause(task.id, state),
                    Err(e) => return Err(e),
                },
            }
        }
        Command::Resume(reference) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(text) => text,
                Ok(task) => match cases::resume(shared, &task).await.map_err(into_store) {
                    Ok(now) => t.resumed(now.id, now.state == TaskState::WaitingInput),
                    Err(store::Error::Already { .. } | store::Error::WrongState { .. }) => {
                        t.not_paused(task.id, task.state)
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Command::Delegate { handle, to } => {
            return delegate(shared, inbound, &sender, role, handle, to).await;
        }
        Command::Key(action) => return key(shared, inbound, sender, role, action).await,
        Command::Tell(reference, instruction) => {
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(reply) => reply,
                Ok(task) => {
                    if let Some(key) = inbound.key()
                        && !shared.store.mark_inbound(&key, Some(task.id)).await?
                    {
                        return Ok(None);
                    }
                    match cases::tell(shared, &task, &instruction, None).await {
                        Ok((_, TellDelivery::NextRound)) => t.told(task.id, true),
                        Ok((_, TellDelivery::OnResume)) => t.told(task.id, false),
                        Err(cases::Error::Instruction(e)) => t.instruction_refused(&e.to_string()),
                        Err(cases::Error::Store(store::Error::WrongState { state, .. })) => {
                            t.already_ended(task.id, state)
                        }
                        Err(e) => return Err(into_store(e)),
                    }
                }
            }
        }
    };
    Ok(Some(reply))
}

/// `key`: the sender's own keys, made, listed and revoked in a private chat only, so that no key
/// is ever posted where others read. A redelivered message does nothing again.
async fn key(
    shared: &Shared,
    inbound: &Inbound,
    sender: Owner,
    role: Role,
    action: command::KeyAction,
) -> Result<Option<String>, store::Error> {
    let t = shared.texts(&inbound.platform);
    if inbound.stream.kind() != "private" {
        return Ok(Some(t.keys_private_only()));
    }
    if let Some(key) = inbound.key()
        && !shared.store.mark_inbound(&key, None).await?
    {
        return Ok(None);
    }
    let caller = cases::Caller::Person {
        owner: sender.clone(),
        role,
    };
    let done = match action {
        command::KeyAction::New(name) => {
            // This private chat is where the key's questions go: noted before the key is
            // given, so that its first question finds it.
            shared
                .store
                .saw(
                    &sender,
                    &inbound.platform,
                    &inbound.bot_id,
                    inbound.stream.as_str(),
                )
                .await?;
            let make = cases::keys::Make {
                owner: sender,
                name,
                role: None,
                expires_in: Some(KEY_LIFETIME),
            };
            cases::keys::create(shared, &caller, make)
                .await
                .map(|(key, secret)| t.key_made(&key.short_id(), &key.name, &secret, KEY_LIFETIME))
        }
        command::KeyAction::List => cases::keys::list(shared, &caller)
            .await
            .map(|keys| t.key_list(&keys)),
        command::KeyAction::Revoke(id) => cases::keys::revoke(shared, &caller, &id)
            .await
            .map(|key| t.key_revoked(&key.short_id(), &key.name)),
    };
    match done {
        Ok(said) => Ok(Some(said)),
        Err(cases::Error::Store(
            store::Error::KeyNotFound(id) | store::Error::AmbiguousKey(id),
        )) => Ok(Some(t.no_key(&id))),
        Err(e @ (cases::Error::CannotHaveTasks { .. } | cases::Error::KeyName)) => {
            Ok(Some(t.key_refused(&e.to_string())))
        }
        Err(e) => Err(into_store(e)),
    }
}

/// How long a key made in chat works.
const KEY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

/// `delegate`: passes an open question of this chat on to someone else. The question is the one
/// quoted, the one `handle` names, or the sender's only open one here; the person is the one
/// mentioned, or `to`.
async fn delegate(
    shared: &Shared,
    inbound: &Inbound,
    sender: &Owner,
    role: Role,
    handle: Option<String>,
    to: Option<String>,
) -> Result<Option<String>, store::Error> {
    let t = shared.texts(&inbound.platform);
    let word = &shared.config.chat.command;
    let key = inbound.key();
    // Applied before: the question has moved, so what it named is not found again.
    if let Some(key) = &key
        && shared.store.was_applied(key).await?
    {
        return Ok(None);
    }
    let to = match inbound.mentions.iter().find(|m| m.as_str() != "all") {
        Some(user) => Owner::new(&inbound.platform, user).ok(),
        None => to.as_deref().and_then(|to| person(&inbound.platform, to)),
    };
    let Some(to) = to else {
        return Ok(Some(t.usage(word, command::DELEGATE_USAGE)));
    };
    let store = &shared.store;
    let stream = inbound.stream.as_str();
    let question = if !inbound.quoted.is_empty() {
        store
            .question_by_chat_message(&inbound.platform, stream, &inbound.quoted)
            .await?
    } else if let Some(handle) = &handle {
        store
            .question_by_handle(&inbound.platform, stream, handle)
            .await?
    } else {
        let open = store
            .open_questions_for_sender(&inbound.platform, stream, &inbound.user_id, None)
            .await?;
        match open.as_slice() {
            [] => None,
            [one] => Some(one.question.clone()),
            many => {
                let open: Vec<(String, String)> = many
                    .iter()
                    .map(|o| (o.question.handle.clone(), o.question.text.clone()))
                    .collect();
                return Ok(Some(t.ask_which(&open)));
            }
        }
    };
    let Some(question) = question else {
        return Ok(Some(t.nothing_to_pass_on()));
    };
    let caller = cases::Caller::Person {
        owner: sender.clone(),
        role,
    };
    let reply = match cases::delegate(shared, &caller, &question, &to, key.as_deref()).await {
        Ok(store::Delegated::Moved { question, .. }) => {
            tracing::info!(question = %question.id, to = %to, "question passed on");
            t.passed_on(&question.handle, to.as_str())
        }
        Ok(store::Delegated::Duplicate) => return Ok(None),
        Err(cases::Error::NotYours { handle }) => t.not_yours_to_pass_on(&handle),
        Err(cases::Error::AlreadyAsked { handle, askee }) => {
            t.already_asked(&handle, askee.as_str())
        }
        Err(cases::Error::Store(store::Error::Moved { handle, askee })) => {
            t.passed_meanwhile(&handle, &askee)
        }
        Err(cases::Error::Store(store::Error::QuestionClosed { outcome, .. })) => {
            t.closed(question.task_id, &question.handle, outcome)
        }
        Err(e @ cases::Error::OtherPlatform { .. }) => e.to_string(),
        Err(e) => return Err(into_store(e)),
    };
    Ok(Some(reply))
}

/// The person `to` names in a chat on `platform`: `@id`, `id`, or `platform:id`.
fn person(platform: &str, to: &str) -> Option<Owner> {
    let to = to.trim_start_matches(['@', '＠']);
    if to.contains(':') {
        to.parse().ok()
    } else {
        Owner::new(platform, to).ok()
    }
}

/// Finds a task the sender may see and act on: their own, or any for an admin. The `Err` side
/// is the reply explaining why not.
async fn visible_task(
    shared: &Shared,
    t: Texts,
    reference: &TaskRef,
    sender: &Owner,
    role: Role,
) -> Result<Result<cases::Found, String>, store::Error> {
    let caller = cases::Caller::Person {
        owner: sender.clone(),
        role,
    };
    match cases::find(shared, &caller, reference).await {
        Ok(task) => Ok(Ok(task)),
        // In chat, where others read, another person's task is not found whichever way it is
        // named.
        Err(
            cases::Error::Store(store::Error::TaskNotFound(_)) | cases::Error::NotYourTask { .. },
        ) => Ok(Err(t.no_task(&display_ref(reference)))),
        Err(cases::Error::Store(store::Error::AmbiguousTask { prefix, count })) => {
            Ok(Err(t.ambiguous(&prefix, count)))
        }
        // Finding refuses nothing of its own: anything else is the store's.
        Err(e) => Err(into_store(e)),
    }
}

fn display_ref(reference: &TaskRef) -> String {
    match reference {
        TaskRef::Full(id) => id.short(),
        TaskRef::Prefix(p) => p.clone(),
    }
}

async fn status_text(shared: &Shared, t: Texts, task: &TaskRow) -> Result<String, store::Error> {
    let mut out = t.status_head(task.id, task.state, task.rounds, task.attempt, &task.goal);
    if matches!(task.state, TaskState::WaitingInput | TaskState::Paused)
        && let Some(q) = shared.store.open_question_of(task.id).await?
    {
        let left = q
            .deadline
            .filter(|_| task.state == TaskState::WaitingInput)
            .map(|deadline| (deadline - time::OffsetDateTime::now_utc()).unsigned_abs());
        out.push_str(&t.status_waiting(&q.handle, &q.text, left));
    }
    if !task.state.is_terminal()
        && let Some(deadline) = task.deadline_at
    {
        let left = (deadline - time::OffsetDateTime::now_utc()).unsigned_abs();
        out.push_str(&t.status_deadline(left, task.on_deadline));
    }
    if let Some(result) = &task.result {
        out.push_str(&t.status_result(result));
    }
    if let Some(error) = &task.error {
        out.push_str(&t.status_error(error));
    }
    Ok(out)
}

async fn history_text(shared: &Shared, t: Texts, task: &TaskRow) -> Result<String, store::Error> {
    let rounds = shared.store.rounds_of(task.id).await?;
    let questions = shared.store.questions_of(task.id).await?;
    let mut lines = vec![t.history_head(task.id, task.state, rounds.len())];
    for round in rounds.iter().rev().take(10).rev() {
        lines.push(t.history_round(round.round, &round.messages.0));
    }
    for q in questions.iter().rev().take(10).rev() {
        lines.push(t.history_question(&q.handle, &q.text, q.outcome, q.answer.as_deref()));
    }
    Ok(lines.join("\n"))
}

/// Makes the schedule `new` says, running `when`; the reply says when it first runs.
/// A move's error as the store's: moving a found task refuses nothing of its own.
fn into_store(error: cases::Error) -> store::Error {
    match error {
        cases::Error::Store(e) => e,
        other => store::Error::Internal(other.to_string()),
    }
}

/// What the chat says when a creation is refused; a store error that is no refusal is
/// returned, to be retried or logged.
fn refused_creation(
    t: Texts,
    error: cases::Error,
    word: &str,
    limit: u32,
) -> Result<String, store::Error> {
    use cases::Error as E;
    Ok(match error {
        E::CannotHaveTasks { owner, role } => t.cannot_create(role, owner.as_str()),
        E::Goal(e) => t.goal_refused(&e.to_string()),
        E::Store(store::Error::TooManyActive { active, .. }) => {
            t.too_many_active(active, limit, word)
        }
        E::Store(e) => return Err(e),
        e @ (E::Priority
        | E::AskTimeout(_)
        | E::Deadline(_)
        | E::Reused { .. }
        | E::Instruction(_)
        | E::NotYours { .. }
        | E::AlreadyAsked { .. }
        | E::OtherPlatform { .. }
        | E::KeyOfAnother { .. }
        | E::KeyName
        | E::KeyRole { .. }
        | E::ForAnother { .. }
        | E::NeverSeen { .. }
        | E::NotTheirChat { .. }
        | E::OwnerNeeded
        | E::Argument { .. }
        | E::NotAsked { .. }
        | E::TooManyOpen { .. }
        | E::TooFast { .. }
        | E::NotYourQuestion { .. }
        | E::NotYourTask { .. }) => t.not_created(&e.to_string()),
    })
}

async fn schedule_task(
    shared: &Shared,
    t: Texts,
    create: cases::Create,
    timezone: &str,
    when: command::When,
) -> Result<String, cases::Error> {
    let zone = match schedule::time_zone(timezone) {
        Ok(zone) => zone,
        Err(e) => {
            return Ok(t.schedule_refused(&format!("{e} (task.timezone)")));
        }
    };
    let now = time::OffsetDateTime::now_utc();
    let mut recurring = None;
    let first = match when {
        command::When::In(after) => now
            .checked_add(after.0.try_into().unwrap_or(time::Duration::MAX))
            .ok_or_else(|| format!("{after} is too far ahead"))
            .and_then(|at| schedule::within_reach(at, now, &zone)),
        command::When::At(text) => schedule::at(&text, &zone)
            .map_err(|e| e.to_string())
            .and_then(|at| {
                if at <= now {
                    Err(format!("{} is in the past", schedule::shown(at, &zone)))
                } else {
                    schedule::within_reach(at, now, &zone)
                }
            }),
        command::When::Cron(text) => text
            .parse::<schedule::Cron>()
            .map_err(|e| e.to_string())
            .and_then(|cron| {
                let next = cron
                    .next_after(now, &zone)
                    .ok_or_else(|| format!("`{cron}` never runs"));
                recurring = Some(cron);
                next
            }),
    };
    let first_run = match first {
        Ok(at) => at,
        Err(why) => return Ok(t.schedule_refused(&why)),
    };
    let when = cases::When {
        cron: recurring,
        timezone: timezone.to_owned(),
        first_run,
    };
    let made = cases::create_schedule(shared, create, when).await?;
    let next = made
        .next_run
        .map(|at| schedule::shown(at, &zone))
        .unwrap_or_default();
    Ok(t.scheduled(
        &made.short(),
        &made.goal,
        &next,
        &made.timezone,
        made.cron.as_deref(),
    ))
}

/// Cancels the schedule `reference` names, if the sender may; `None` when it names none.
async fn cancel_schedule(
    shared: &Shared,
    t: Texts,
    reference: &TaskRef,
    sender: &Owner,
    role: Role,
) -> Result<Option<String>, store::Error> {
    let visible_to = (role < Role::Admin).then_some(sender);
    let found = match shared.store.resolve_schedule(reference, visible_to).await {
        Ok(found) => found,
        Err(store::Error::ScheduleNotFound(_)) => return Ok(None),
        Err(store::Error::AmbiguousTask { prefix, count }) => {
            return Ok(Some(t.ambiguous(&prefix, count)));
        }
        Err(e) => return Err(e),
    };
    match shared.store.cancel_schedule(found.id).await {
        Ok(_) => Ok(Some(t.schedule_cancelled(&found.short()))),
        Err(store::Error::ScheduleEnded(_)) => Ok(Some(t.schedule_ended(&found.short()))),
        Err(e) => Err(e),
    }
}
