//! Inbound chat messages: commands, and answers to open questions.
//!
//! A message that starts with the command word is a command and never an answer. Any other
//! message is a candidate answer, routed by [`route`] from what the store loads: (a) it quotes a
//! chat message that carried a question; (b) it starts with the `#handle` of one of the sender's
//! open questions in that stream; (c) the sender's oldest open question in that stream. Only the
//! task's owner may answer; nobody else's message ever does.

pub mod command;
pub mod limit;
pub mod route;

use hark_core::{
    bus::Names,
    domain::{Handle, Owner, Role, StreamId, TaskRef, TaskState, schedule, text},
};
use hark_proto::v1 as pb;

use crate::{
    shared::Shared,
    store::{
        self, Answer, AnswerOutcome, AnswerTarget, ChatRoute, NewTask, QuestionRow, TaskFilter,
        TaskRow, TellDelivery,
    },
};
use command::Command;

use crate::{
    store::{NewSchedule, Overlap},
    texts::Texts,
};

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

/// Handles one inbound chat message. An `Err` is worth retrying (the database was unreachable);
/// everything the sender got wrong is answered in the chat instead.
pub async fn handle(shared: &Shared, msg: pb::ChatMessage) -> Result<(), store::Error> {
    let inbound = match Inbound::parse(msg) {
        Ok(inbound) => inbound,
        Err(reason) => {
            tracing::debug!(reason, "ignoring a chat message");
            return Ok(());
        }
    };
    let chat = &shared.config.chat;
    let words: Vec<String> = std::iter::once(chat.command.clone())
        .chain(chat.command_aliases.iter().cloned())
        .collect();
    if let Some(args) = command::strip_command(&inbound.text, &words) {
        if let Some(sender) = inbound.owner() {
            match shared.commands.check(&sender, std::time::Instant::now()) {
                limit::Verdict::Allow => {}
                limit::Verdict::RefuseAndTell => {
                    tracing::info!(%sender, "refusing commands over chat.commands_per_minute");
                    let text = shared
                        .texts(&inbound.platform)
                        .too_many_commands(chat.commands_per_minute, shared.commands.wait_hint());
                    say(shared, &inbound, &text).await;
                    return Ok(());
                }
                limit::Verdict::RefuseQuietly => return Ok(()),
            }
        }
        let reply = match command::parse(args, &chat.command, shared.texts(&inbound.platform)) {
            Ok(cmd) => run_command(shared, &inbound, cmd).await?,
            Err(usage) => Some(usage),
        };
        if let Some(text) = reply {
            say(shared, &inbound, &text).await;
        }
        return Ok(());
    }
    route_answer(shared, &inbound).await
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

async fn route_answer(shared: &Shared, inbound: &Inbound) -> Result<(), store::Error> {
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
            if let Some(question) = quoted.iter().chain(by_handle.iter()).find(|q| q.id == id) {
                say(shared, inbound, &closed_text(t, question)).await;
            }
            Ok(())
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
                _ => return Ok(()),
            };
            say(shared, inbound, &text).await;
            Ok(())
        }
        route::Route::TooLate => {
            let handles: Vec<String> = open.iter().map(|q| format!("#{}", q.handle)).collect();
            let text = t.too_late(&handles);
            say(shared, inbound, &text).await;
            Ok(())
        }
        route::Route::AskWhich => {
            let open: Vec<(String, String)> = open
                .iter()
                .map(|q| (q.handle.clone(), q.text.clone()))
                .collect();
            let text = t.ask_which(&open);
            say(shared, inbound, &text).await;
            Ok(())
        }
        route::Route::Ignore => Ok(()),
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
) -> Result<(), store::Error> {
    let t = shared.texts(&inbound.platform);
    // An answer too long to keep is refused, and the question stays open for a shorter one.
    if let Err(e) = text::optional_text(text, text::MAX_TEXT_BYTES) {
        let reply = t.answer_refused(&question.handle, &e.to_string());
        say(shared, inbound, &reply).await;
        return Ok(());
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
    let applied = match open.iter().find(|t| t.question.id == question.id) {
        Some(target) => shared.store.answer_target(target.clone(), &answer).await,
        None => shared.store.answer(question.id, &answer).await,
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
            Ok(())
        }
        Ok(AnswerOutcome::Duplicate { .. }) => Ok(()),
        Err(store::Error::Misfit {
            handle,
            shape,
            misfit,
            ..
        }) => {
            let reply = t.misfit(&handle, &shape, &misfit);
            say(shared, inbound, &reply).await;
            Ok(())
        }
        Err(store::Error::QuestionClosed { .. }) => {
            let now = shared.store.get_question(question.id).await?;
            say(shared, inbound, &closed_text(t, &now)).await;
            Ok(())
        }
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "cannot apply an answer");
            Ok(())
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
            goal,
        } => {
            if role < Role::User {
                return Ok(Some(t.cannot_create(role, sender.as_str())));
            }
            if let Err(e) = text::text(&goal, text::MAX_TEXT_BYTES) {
                return Ok(Some(t.goal_refused(&e.to_string())));
            }
            if let Some(when) = when {
                let new = NewSchedule {
                    owner: sender.clone(),
                    goal,
                    chat: Some(inbound.route()),
                    ask_timeout: timeout.map_or(shared.config.task.ask_timeout.0, |t| t.0),
                    on_timeout: on_timeout.unwrap_or(shared.config.task.on_timeout),
                    cron: None,
                    timezone: shared
                        .config
                        .task
                        .timezone_for(&inbound.platform)
                        .to_owned(),
                    first_run: time::OffsetDateTime::now_utc(),
                    overlap: Overlap::Skip,
                    request_id: inbound.key(),
                    priority: priority.unwrap_or(0),
                };
                return Ok(Some(schedule_task(shared, t, new, when).await?));
            }
            let limit = shared.config.task.max_active_per_owner;
            let created = shared
                .store
                .create_task(&NewTask {
                    owner: sender.clone(),
                    goal,
                    chat: Some(inbound.route()),
                    ask_timeout: timeout.map_or(shared.config.task.ask_timeout.0, |t| t.0),
                    on_timeout: on_timeout.unwrap_or(shared.config.task.on_timeout),
                    request_id: inbound.key(),
                    active_limit: limit,
                    questionnaire: None,
                    schedule: None,
                    priority: priority.unwrap_or(0),
                })
                .await;
            match created {
                Ok(task) => t.created(task.id, &task.goal),
                Err(store::Error::TooManyActive { active, .. }) => {
                    t.too_many_active(active, limit, word)
                }
                Err(e) => return Err(e),
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
                    match shared.store.cancel(task.id, sender.as_str(), &reason).await {
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
                Ok(task) => match shared.store.pause(task.id, sender.as_str()).await {
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
                Ok(task) => match shared.store.resume(task.id, sender.as_str()).await {
                    Ok(now) => t.resumed(now.id, now.state == TaskState::WaitingInput),
                    Err(store::Error::Already { .. } | store::Error::WrongState { .. }) => {
                        t.not_paused(task.id, task.state)
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Command::Tell(reference, instruction) => {
            if let Err(e) = text::text(&instruction, text::MAX_TEXT_BYTES) {
                return Ok(Some(t.instruction_refused(&e.to_string())));
            }
            match visible_task(shared, t, &reference, &sender, role).await? {
                Err(reply) => reply,
                Ok(task) => {
                    if let Some(key) = inbound.key()
                        && !shared.store.mark_inbound(&key, Some(task.id)).await?
                    {
                        return Ok(None);
                    }
                    match shared
                        .store
                        .tell(task.id, &instruction, sender.as_str())
                        .await
                    {
                        Ok((_, TellDelivery::NextRound)) => t.told(task.id, true),
                        Ok((_, TellDelivery::OnResume)) => t.told(task.id, false),
                        Err(store::Error::WrongState { state, .. }) => {
                            t.already_ended(task.id, state)
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    };
    Ok(Some(reply))
}

/// Finds a task the sender may see and act on: their own, or any for an admin. The `Err` side
/// is the reply explaining why not.
async fn visible_task(
    shared: &Shared,
    t: Texts,
    reference: &TaskRef,
    sender: &Owner,
    role: Role,
) -> Result<Result<TaskRow, String>, store::Error> {
    // A prefix is resolved only among the tasks the sender may see, so that nobody learns of
    // other people's tasks by probing prefixes.
    let visible_to = (role < Role::Admin).then_some(sender);
    match shared.store.resolve_task(reference, visible_to).await {
        Ok(task) if task.owner == *sender || role == Role::Admin => Ok(Ok(task)),
        Ok(_) | Err(store::Error::TaskNotFound(_)) => Ok(Err(t.no_task(&display_ref(reference)))),
        Err(store::Error::AmbiguousTask { prefix, count }) => Ok(Err(t.ambiguous(&prefix, count))),
        Err(e) => Err(e),
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
async fn schedule_task(
    shared: &Shared,
    t: Texts,
    mut new: NewSchedule,
    when: command::When,
) -> Result<String, store::Error> {
    let zone = match schedule::time_zone(&new.timezone) {
        Ok(zone) => zone,
        Err(e) => {
            return Ok(t.schedule_refused(&format!("{e} (task.timezone)")));
        }
    };
    let now = new.first_run;
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
                new.cron = Some(cron);
                next
            }),
    };
    new.first_run = match first {
        Ok(at) => at,
        Err(why) => return Ok(t.schedule_refused(&why)),
    };
    let made = shared.store.create_schedule(&new).await?;
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
