//! `hark.v1.TaskService` over gRPC. Every error's kind maps onto one `tonic::Code` in
//! [`status`]; invalid arguments name the field.

use std::{pin::Pin, time::Duration};

use futures_util::Stream;
use hark_core::{
    bus,
    domain::{
        DeadlinePolicy, Owner, QuestionId, StreamId, TaskId, TaskRef, TaskState, TimeoutPolicy,
        form, schedule, shape::Shape, text,
    },
    error::{Classified as _, Kind},
    secret::Secret,
};
use hark_proto::v1::{self as pb, task_service_server::TaskService};
use tonic::{Request, Response, Status};

use crate::{
    cases, convert,
    shared::Shared,
    store::{self, Answer, AnswerOutcome, ChatRoute, QuestionFilter, TaskFilter, TellDelivery},
};

#[derive(Debug, Clone)]
pub struct Api {
    shared: Shared,
    /// Failed sign-ins per address, shared with the token check ([`Auth::failures`]): a
    /// person's key that is no key counts as a wrong token does.
    failures: hark_core::secret::Failures,
}

impl Api {
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            failures: Default::default(),
        }
    }

    /// The API counting failed sign-ins in `failures`.
    pub fn counting(self, failures: hark_core::secret::Failures) -> Self {
        Self { failures, ..self }
    }

    /// `DelegateQuestion`, recorded in the audit as passed on by `caller`.
    #[tracing::instrument(skip_all)]
    pub async fn delegate(
        &self,
        request: Request<pb::DelegateQuestionRequest>,
        caller: &cases::Caller,
    ) -> Result<Response<pb::DelegateQuestionResponse>, Status> {
        let request = request.into_inner();
        let id = request
            .question_id
            .parse::<QuestionId>()
            .map_err(|e| invalid("question_id", e))?;
        let to = owner_field("to", &request.to)?.ok_or_else(|| invalid("to", "is empty"))?;
        let request_id = key_field("request_id", &request.request_id)?;
        let store = &self.shared.store;
        let question = store.get_question(id).await.map_err(status_of)?;
        let key = request_id.map(|id| format!("{}:delegate:{id}", caller.actor()));
        let delegated = cases::delegate(&self.shared, caller, &question, &to, key.as_deref())
            .await
            .map_err(|e| case_status(e, None))?;
        let question = match delegated {
            store::Delegated::Moved { question, .. } => *question,
            // Passed on by this request before: the question as it is now.
            store::Delegated::Duplicate => store.get_question(id).await.map_err(status_of)?,
        };
        tracing::info!(question = %question.id, to = %to, "question passed on");
        Ok(Response::new(pb::DelegateQuestionResponse {
            question: Some(convert::question(&question)),
        }))
    }

    /// `AnswerQuestion`, recorded as answered by `caller` when the request names no answerer.
    /// A person answers only as themselves, and only what is asked of them.
    #[tracing::instrument(skip_all)]
    pub async fn answer(
        &self,
        request: Request<pb::AnswerQuestionRequest>,
        caller: &cases::Caller,
    ) -> Result<Response<pb::AnswerQuestionResponse>, Status> {
        let holder = holder(&request);
        let request = request.into_inner();
        let json = match request.answer_json.trim() {
            "" => None,
            raw => {
                text::bounded(raw, text::MAX_TEXT_BYTES).map_err(|e| invalid("answer_json", e))?;
                Some(
                    serde_json::from_str::<serde_json::Value>(raw)
                        .map_err(|e| invalid("answer_json", format!("is not JSON: {e}")))?,
                )
            }
        };
        let text = match &json {
            Some(value) => match (request.answer.is_empty(), value) {
                (false, _) => {
                    return Err(invalid(
                        "answer_json",
                        "give answer or answer_json, not both",
                    ));
                }
                (true, serde_json::Value::String(s)) => s.clone(),
                (true, value) => value.to_string(),
            },
            None => text_field("answer", &request.answer)?,
        };
        let request_id = key_field("request_id", &request.request_id)?;
        let store = &self.shared.store;
        // Either a question by id, or whichever question the task has open. Neither is read
        // here: the answer's own read finds it (an extra read only checks a named answerer).
        let target = match (request.question_id.as_str(), request.task_id.as_str()) {
            ("", "") => return Err(invalid("question_id", "give question_id or task_id")),
            (id, "") => Target::Question(
                id.parse::<QuestionId>()
                    .map_err(|e| invalid("question_id", e))?,
            ),
            ("", task) => Target::OpenOf(match (task_ref("task_id", task)?, caller.owner()) {
                (TaskRef::Full(id), None) => id,
                (prefix, None) => {
                    store
                        .resolve_task(&prefix, None)
                        .await
                        .map_err(status_of)?
                        .id
                }
                // A person names by prefix only among what they see, as everywhere.
                (reference, Some(_)) => {
                    cases::find(&self.shared, caller, &reference)
                        .await
                        .map_err(|e| case_status(e, None))?
                        .id
                }
            }),
            _ => {
                return Err(invalid(
                    "question_id",
                    "give question_id or task_id, not both",
                ));
            }
        };
        let named = owner_field("answerer", &request.answerer)?;
        let answerer = match (caller.owner(), named) {
            (Some(me), Some(named)) if named != *me => {
                return Err(Status::permission_denied(format!(
                    "a key of {me} answers only as {me}, not as {named}"
                )));
            }
            (Some(me), _) => Some(me.clone()),
            (None, named) => named,
        };
        let answerer = match answerer {
            None => caller.actor().to_owned(),
            Some(answerer) => {
                let owner = match target {
                    Target::Question(q) => store.get_question(q).await.map_err(status_of)?.owner,
                    // The person its open question is asked of (it may have been passed on).
                    Target::OpenOf(t) => {
                        match store.open_question_of(t).await.map_err(status_of)? {
                            Some(question) => question.owner,
                            None => store.get_task(t).await.map_err(status_of)?.owner,
                        }
                    }
                };
                if answerer != owner {
                    return Err(Status::permission_denied(format!(
                        "{answerer} cannot answer a question of {owner}'s task"
                    )));
                }
                answerer.to_string()
            }
        };
        let wait = match pb::AnswerWait::try_from(request.wait) {
            Ok(pb::AnswerWait::None) => None,
            Ok(pb::AnswerWait::NextQuestionOrEnd) => Some(match request.wait_timeout_ms {
                0 => DEFAULT_ANSWER_WAIT,
                ms => Duration::from_millis(ms.into()).min(MAX_ANSWER_WAIT),
            }),
            Err(_) => return Err(invalid("wait", format!("{} is not a wait", request.wait))),
        };
        // Watched before the answer is applied when the task is known, so that nothing it does
        // next can come before the watch; a question named by id is watched once its task is
        // known, and its row is looked at then.
        let early_watch = match (wait, target) {
            (Some(_), Target::OpenOf(task)) => {
                Some(self.shared.watchers.watch(task, holder).map_err(too_many)?)
            }
            _ => None,
        };
        // A request id is the answerer's own: another person's same id is another request.
        let inbound_key = request_id.as_ref().map(|id| format!("api:{answerer}:{id}"));
        let answer = Answer {
            answerer,
            text,
            json,
            inbound_key,
        };
        let answers = cases::answer::Answers::of(&self.shared);
        let applied = match target {
            Target::Question(q) => answers.answer(q, &answer).await,
            Target::OpenOf(t) => answers.answer_task(t, &answer).await,
        };
        let (task, question, asked) = match applied {
            Ok(AnswerOutcome::Applied {
                task,
                question,
                asked,
            }) => {
                tracing::info!(task = %task.id, question = %question.id, "answer applied");
                (*task, *question, asked)
            }
            // Kept: the ask waits for more of the people it was put to.
            Ok(AnswerOutcome::Counted { task, question, .. }) => (*task, *question, None),
            // The same request id applied before: what it did then, if it asked the same.
            Ok(AnswerOutcome::Duplicate { question }) => {
                let same_target = match target {
                    Target::Question(q) => question.id == q,
                    Target::OpenOf(t) => question.task_id == t,
                };
                let same_text = answer.json.is_some()
                    || question.answer.as_deref() == Some(answer.text.as_str());
                if !(same_target && same_text) {
                    return Err(reused(
                        request_id.as_deref().unwrap_or_default(),
                        "another answer",
                    ));
                }
                (
                    store.get_task(question.task_id).await.map_err(status_of)?,
                    *question,
                    None,
                )
            }
            Err(store::Error::NoOpenQuestion { task }) => {
                let id: TaskId = task.parse().map_err(|e| invalid("task_id", e))?;
                let task = store.get_task(id).await.map_err(status_of)?;
                return Err(Status::failed_precondition(format!(
                    "task {} has no open question (it is {})",
                    task.id, task.state
                )));
            }
            Err(e) => return Err(status_of(e)),
        };
        let mut response = pb::AnswerQuestionResponse {
            task: Some(convert::task(&task, None)),
            question: Some(convert::question(&question)),
            ..Default::default()
        };
        if let Some(timeout) = wait {
            // The answer's own statement may have asked the next question or ended the task (a
            // questionnaire): then there is nothing to wait for, and nothing to read.
            if let Some(asked) = asked {
                response.event = Some(convert::event(&task, "ask", Some(*asked)));
                return Ok(Response::new(response));
            }
            if task.state.is_terminal() || task.state == TaskState::Paused {
                response.event = Some(convert::event(&task, "current", None));
                return Ok(Response::new(response));
            }
            // A watch that began after the answer was applied starts from the row as it is now,
            // so that nothing the task did in between is missed.
            let (watch, after) = match early_watch {
                Some(watch) => (watch, task.clone()),
                None => {
                    let watch = self
                        .shared
                        .watchers
                        .watch(task.id, holder)
                        .map_err(too_many)?;
                    (watch, store.get_task(task.id).await.map_err(status_of)?)
                }
            };
            let event =
                crate::events::next_question_or_end(store, watch, &after, question.id, timeout)
                    .await
                    .map_err(status_of)?;
            response.wait_timed_out = event.is_none();
            response.event = event;
        }
        Ok(Response::new(response))
    }

    /// The task a request names in `field`, by full id or unique prefix, among those `caller`
    /// sees.
    async fn resolve(
        &self,
        caller: &cases::Caller,
        field: &str,
        value: &str,
    ) -> Result<cases::Found, Status> {
        let reference = task_ref(field, value)?;
        cases::find(&self.shared, caller, &reference)
            .await
            .map_err(|e| case_status(e, None))
    }

    /// Who `request` comes from: the person whose key it carries, or else an operator, through
    /// `door`. A key that is unknown, revoked or expired gets nobody in.
    pub async fn caller<T>(
        &self,
        request: &Request<T>,
        door: &'static str,
    ) -> Result<cases::Caller, Status> {
        let Some(PresentedKey(key)) = request.extensions().get::<PresentedKey>() else {
            return Ok(cases::Caller::Operator(door));
        };
        match cases::keys::signed_in(&self.shared, key.expose())
            .await
            .map_err(|e| case_status(e, None))?
        {
            Some(caller) => Ok(caller),
            None => {
                if let Some(peer) = request.remote_addr() {
                    self.failures.failed(peer.ip());
                }
                Err(Status::unauthenticated(
                    "the key is unknown, revoked or expired: make a new one with `/key new <name>` \
                     in a private chat with the bot, or `hark key create`",
                ))
            }
        }
    }
}

/// What an AnswerQuestion request answers.
#[derive(Debug, Clone, Copy)]
enum Target {
    Question(QuestionId),
    /// Whichever question this task has open.
    OpenOf(TaskId),
}

/// The one mapping from an error's kind to a gRPC status code.
pub fn status(kind: Kind, message: String) -> Status {
    match kind {
        Kind::Unavailable => {
            tracing::warn!(
                error = message,
                "a request found the task store unavailable"
            );
            Status::new(
                kind.grpc_code(),
                format!("the task store is unavailable, try again: {message}"),
            )
        }
        Kind::Internal => {
            tracing::error!(error = message, "a request failed inside task-control");
            Status::new(kind.grpc_code(), message)
        }
        _ => Status::new(kind.grpc_code(), message),
    }
}

/// A request id used before for a request with other parameters.
fn reused(id: &str, what: &str) -> Status {
    Status::already_exists(format!(
        "request_id `{}` was used before for {what}; a retry must repeat its request exactly, \
         and a new request needs a new request_id",
        hark_core::domain::ids::shown(id)
    ))
}

/// The door an operator's token comes through, as the audit names it.
const API: &str = "api";

/// The owner a request names in `field`, as `caller` may name it: an operator any owner (or
/// none), a person only themselves, which is also what naming none means for them.
fn owner_for(
    caller: &cases::Caller,
    field: &str,
    named: Option<Owner>,
) -> Result<Option<Owner>, Status> {
    match (caller.sees_only(), named) {
        (Some(me), Some(named)) if named != *me => Err(Status::permission_denied(format!(
            "{field}: a key of {me} acts only for {me}, not for {named}"
        ))),
        (Some(me), _) => Ok(Some(me.clone())),
        (None, named) => Ok(named),
    }
}

/// The owner a request names, or, when it names none, the person whose key calls: a person's
/// key names its owner by itself.
fn owner_or_callers(caller: &cases::Caller, named: &str) -> Result<Owner, Status> {
    match owner_field("owner", named)? {
        Some(owner) => Ok(owner),
        None => caller
            .owner()
            .cloned()
            .ok_or_else(|| invalid("owner", "must not be empty")),
    }
}

/// A use case's refusal as a gRPC status, naming the request's field where one is at fault.
pub(crate) fn case_status(error: cases::Error, request_id: Option<&str>) -> Status {
    use cases::Error as E;
    match error {
        E::CannotHaveTasks { .. } => Status::permission_denied(error.to_string()),
        E::Goal(e) => invalid("goal", e),
        E::Instruction(e) => invalid("instruction", e),
        E::Priority => invalid("priority", error),
        E::AskTimeout(e) => invalid("ask_timeout_s", e),
        E::Deadline(e) => invalid("deadline", e),
        E::Reused { task } => reused(
            request_id.unwrap_or_default(),
            &format!("another task ({task})"),
        ),
        E::NotYours { .. } => Status::permission_denied(error.to_string()),
        E::AlreadyAsked { .. } => Status::failed_precondition(error.to_string()),
        E::OtherPlatform { .. } => invalid("to", error),
        E::KeyOfAnother { .. } | E::KeyRole { .. } | E::ForAnother { .. } => {
            Status::permission_denied(error.to_string())
        }
        E::KeyName => invalid("name", error),
        E::NeverSeen { .. } => Status::failed_precondition(error.to_string()),
        E::NotTheirChat { .. } | E::NotYourQuestion { .. } | E::NotYourTask { .. } => {
            Status::permission_denied(error.to_string())
        }
        E::OwnerNeeded => invalid("owner", error),
        E::Argument { .. } => Status::invalid_argument(error.to_string()),
        E::NotAsked { .. } => Status::unavailable(error.to_string()),
        E::TooManyOpen { .. } | E::TooFast { .. } => Status::resource_exhausted(error.to_string()),
        E::Store(e) => status_of(e),
    }
}

/// A store error as a gRPC status.
pub fn status_of(error: store::Error) -> Status {
    status(error.kind(), error.to_string())
}

fn invalid(field: &str, why: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// A required text (a goal, an answer, an instruction): trimmed, bounded, without NUL.
fn text_field(field: &str, value: &str) -> Result<String, Status> {
    text::text(value, text::MAX_TEXT_BYTES)
        .map(str::to_owned)
        .map_err(|e| invalid(field, e))
}

/// An optional short note (a reason, an author): trimmed, bounded, without NUL; `None` when
/// empty.
fn note_field(field: &str, value: &str) -> Result<Option<String>, Status> {
    let note = text::optional_text(value, text::MAX_NOTE_BYTES).map_err(|e| invalid(field, e))?;
    Ok((!note.is_empty()).then(|| note.to_owned()))
}

/// An optional identifier the caller chose (a request id, a message id); `None` when empty.
fn key_field(field: &str, value: &str) -> Result<Option<String>, Status> {
    let key = text::key(value).map_err(|e| invalid(field, e))?;
    Ok((!key.is_empty()).then(|| key.to_owned()))
}

/// An optional platform name (a filter); `None` when empty.
fn platform_field(field: &str, value: &str) -> Result<Option<String>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    bus::token(value)
        .map(|p| Some(p.to_owned()))
        .map_err(|e| invalid(field, e))
}

/// An optional chat stream (a filter); `None` when empty.
fn stream_field(field: &str, value: &str) -> Result<Option<String>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    value
        .parse::<StreamId>()
        .map(|s| Some(s.to_string()))
        .map_err(|e| invalid(field, e))
}

fn task_ref(field: &str, value: &str) -> Result<TaskRef, Status> {
    value.parse().map_err(|e| invalid(field, e))
}

/// Task states given as their protobuf numbers (a filter).
fn states_field(field: &str, states: &[i32]) -> Result<Vec<TaskState>, Status> {
    states
        .iter()
        .map(|s| {
            pb::TaskState::try_from(*s)
                .ok()
                .and_then(TaskState::from_proto)
                .ok_or_else(|| invalid(field, format!("{s} is not a task state")))
        })
        .collect()
}

fn owner_field(field: &str, value: &str) -> Result<Option<Owner>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|e| invalid(field, e))
}

/// The cursor of a paged listing: the id of the last item of the previous page.
fn page_token<T: std::str::FromStr>(token: &str) -> Result<Option<T>, Status>
where
    T::Err: std::fmt::Display,
{
    match token {
        "" => Ok(None),
        token => token
            .parse()
            .map(Some)
            .map_err(|e| invalid("page_token", e)),
    }
}

/// The token of the next page: the last item's id when the page was full.
fn next_page<T>(items: &[T], limit: i64, id: impl Fn(&T) -> String) -> String {
    match items.last() {
        Some(last) if items.len() as i64 == limit => id(last),
        _ => String::new(),
    }
}

fn page_size(size: u32) -> i64 {
    match size {
        0 => 50,
        n => i64::from(n.min(200)),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::TaskEvent, Status>> + Send + 'static>>;

/// The longest an answer waits for what the task does next, and the wait when none is given.
const MAX_ANSWER_WAIT: Duration = Duration::from_secs(300);
const DEFAULT_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// The most tasks one `WatchTasks` names.
const MAX_WATCHED_IDS: usize = 1000;

/// Who a request's watchers belong to: its connection, and the token it signed in with.
fn holder<T>(request: &Request<T>) -> crate::watchers::Holder {
    crate::watchers::Holder {
        connection: request.remote_addr(),
        token: request.extensions().get::<SignedIn>().map(|s| s.0),
    }
}

/// Which of `control.api_tokens` a request signed in with, by position.
#[derive(Debug, Clone, Copy)]
pub struct SignedIn(pub usize);

fn too_many(e: crate::watchers::TooMany) -> Status {
    status(Kind::Exhausted, e.to_string())
}

#[tonic::async_trait]
impl TaskService for Api {
    #[tracing::instrument(skip_all)]
    async fn create_task(
        &self,
        request: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::CreateTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let owner = owner_or_callers(&caller, &request.owner)?;
        let questionnaire = match request.questionnaire.is_empty() {
            true => None,
            false => Some(
                form::questionnaire(
                    request
                        .questionnaire
                        .into_iter()
                        .enumerate()
                        .map(|(i, q)| {
                            let shaped = !q.kind.is_empty() || q.multiple || !q.fields.is_empty();
                            let shape = shaped
                                .then(|| {
                                    Shape::from_proto(&q.kind, &q.choices, q.multiple, &q.fields)
                                        .map_err(|e| {
                                            invalid(
                                                "questionnaire",
                                                format!("question {}: {e}", i + 1),
                                            )
                                        })
                                })
                                .transpose()?;
                            let context = text::optional_text(&q.context, text::MAX_TEXT_BYTES)
                                .map_err(|e| {
                                    invalid(
                                        "questionnaire",
                                        format!("question {}: context: {e}", i + 1),
                                    )
                                })?
                                .to_owned();
                            Ok(form::FormQuestion {
                                context,
                                key: q.key,
                                text: q.text,
                                choices: q.choices,
                                shape,
                                escalate_to: q.escalate_to,
                                escalate_after_s: q.escalate_after_s,
                                ask_to: q.ask_to,
                                need: q.need,
                            })
                        })
                        .collect::<Result<Vec<_>, Status>>()?,
                )
                .map_err(|e| invalid("questionnaire", e))?,
            ),
        };
        let goal = request.goal;
        let chat = match request.chat {
            None => None,
            Some(chat) => {
                bus::token(&chat.platform).map_err(|e| invalid("chat.platform", e))?;
                bus::token(&chat.bot_id).map_err(|e| invalid("chat.bot_id", e))?;
                let stream: StreamId =
                    chat.stream.parse().map_err(|e| invalid("chat.stream", e))?;
                Some(ChatRoute {
                    origin_message_id: key_field(
                        "chat.origin_message_id",
                        &chat.origin_message_id,
                    )?,
                    platform: chat.platform,
                    bot_id: chat.bot_id,
                    stream: stream.to_string(),
                })
            }
        };
        let on_timeout = pb::TimeoutPolicy::try_from(request.on_timeout)
            .ok()
            .map(TimeoutPolicy::from_proto)
            .ok_or_else(|| invalid("on_timeout", "unknown policy"))?;
        let ask_timeout =
            (request.ask_timeout_s != 0).then(|| Duration::from_secs(request.ask_timeout_s.into()));
        let deadline = match request.deadline {
            None => None,
            Some(d) => Some(
                Duration::try_from(d)
                    .map_err(|_| invalid("deadline", "must be a positive duration"))?,
            ),
        };
        let on_deadline = pb::DeadlinePolicy::try_from(request.on_deadline)
            .ok()
            .map(DeadlinePolicy::from_proto)
            .ok_or_else(|| invalid("on_deadline", "unknown policy"))?;
        let priority = i16::try_from(request.priority)
            .map_err(|_| invalid("priority", cases::Error::Priority))?;
        // A request id is its owner's own: another owner's same id is another request.
        let request_id = key_field("request_id", &request.request_id)?;
        let request_key = request_id.as_ref().map(|id| format!("api:{owner}:{id}"));
        let create = cases::Create {
            by: caller,
            owner,
            goal,
            chat,
            ask_timeout,
            on_timeout,
            priority,
            request_key,
            questionnaire,
            deadline,
            on_deadline,
        };
        let refused = |e| case_status(e, request_id.as_deref());
        if request.start_at.is_some() || !request.cron.is_empty() {
            if create.questionnaire.is_some() {
                return Err(invalid(
                    "start_at",
                    "a questionnaire cannot be scheduled; create it when it is due",
                ));
            }
            let platform = create.chat.as_ref().map_or("", |c| c.platform.as_str());
            let timezone = match key_field("timezone", &request.timezone)? {
                Some(zone) => zone,
                None => self.shared.config.task.timezone_for(platform).to_owned(),
            };
            let zone = schedule::time_zone(&timezone).map_err(|e| invalid("timezone", e))?;
            let now = time::OffsetDateTime::now_utc();
            let cron = match key_field("cron", &request.cron)? {
                None => None,
                Some(text) => Some(
                    text.parse::<schedule::Cron>()
                        .map_err(|e| invalid("cron", e))?,
                ),
            };
            let start = request
                .start_at
                .map(|t| {
                    time::OffsetDateTime::from_unix_timestamp(t.seconds)
                        .map_err(|e| invalid("start_at", e))
                })
                .transpose()?;
            let first_run = match (&cron, start) {
                (Some(cron), start) => cron
                    .next_after(start.unwrap_or(now).max(now), &zone)
                    .ok_or_else(|| invalid("cron", "it never runs"))?,
                (None, Some(at)) if at > now => at,
                (None, _) => return Err(invalid("start_at", "it is in the past")),
            };
            let first_run = schedule::within_reach(first_run, now, &zone)
                .map_err(|e| invalid("start_at", format!("its first run, {e}")))?;
            let when = cases::When {
                cron,
                timezone,
                first_run,
            };
            let made = cases::create_schedule(&self.shared, create, when)
                .await
                .map_err(refused)?;
            return Ok(Response::new(pb::CreateTaskResponse {
                task: None,
                schedule: Some(convert::schedule(&made)),
            }));
        }
        let task = cases::create_task(&self.shared, create)
            .await
            .map_err(refused)?;
        Ok(Response::new(pb::CreateTaskResponse {
            task: Some(convert::task(&task, None)),
            schedule: None,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let task = self
            .resolve(&caller, "task_id", &request.get_ref().task_id)
            .await?;
        let questions = self
            .shared
            .store
            .questions_of(task.id)
            .await
            .map_err(status_of)?;
        let open = questions.iter().rev().find(|q| q.outcome.is_open());
        Ok(Response::new(pb::GetTaskResponse {
            task: Some(convert::task(&task, open)),
            questions: questions.iter().map(convert::question).collect(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let states = states_field("states", &request.states)?;
        let before = page_token::<TaskId>(&request.page_token)?;
        let limit = page_size(request.page_size);
        let tasks = self
            .shared
            .store
            .list_tasks(&TaskFilter {
                owner: owner_for(&caller, "owner", owner_field("owner", &request.owner)?)?,
                states,
                platform: platform_field("platform", &request.platform)?,
                stream: stream_field("stream", &request.stream)?,
                before,
                limit,
            })
            .await
            .map_err(status_of)?;
        let next_page_token = next_page(&tasks, limit, |t| t.id.to_string());
        Ok(Response::new(pb::ListTasksResponse {
            tasks: tasks.iter().map(|t| convert::task(t, None)).collect(),
            next_page_token,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let reason = note_field("reason", &request.reason)?
            .unwrap_or_else(|| "cancelled over the API".to_owned());
        let task = self.resolve(&caller, "task_id", &request.task_id).await?;
        let cancelled = cases::cancel(&self.shared, &task, &reason)
            .await
            .map_err(|e| case_status(e, None))?;
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(convert::task(&cancelled, None)),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let owner = owner_for(&caller, "owner", owner_field("owner", &request.owner)?)?;
        let rows = self
            .shared
            .store
            .list_schedules(owner.as_ref(), request.include_ended, 1000)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ListSchedulesResponse {
            schedules: rows.iter().map(convert::schedule).collect(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn cancel_schedule(
        &self,
        request: Request<pb::CancelScheduleRequest>,
    ) -> Result<Response<pb::CancelScheduleResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let reference = task_ref("schedule_id", &request.into_inner().schedule_id)?;
        let store = &self.shared.store;
        let found = store
            .resolve_schedule(&reference, caller.sees_only())
            .await
            .map_err(status_of)?;
        let cancelled = store.cancel_schedule(found.id).await.map_err(status_of)?;
        Ok(Response::new(pb::CancelScheduleResponse {
            schedule: Some(convert::schedule(&cancelled)),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn pause_task(
        &self,
        request: Request<pb::PauseTaskRequest>,
    ) -> Result<Response<pb::PauseTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let task = self
            .resolve(&caller, "task_id", &request.into_inner().task_id)
            .await?;
        let paused = cases::pause(&self.shared, &task)
            .await
            .map_err(|e| case_status(e, None))?;
        Ok(Response::new(pb::PauseTaskResponse {
            task: Some(convert::task(&paused, None)),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn resume_task(
        &self,
        request: Request<pb::ResumeTaskRequest>,
    ) -> Result<Response<pb::ResumeTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let task = self
            .resolve(&caller, "task_id", &request.into_inner().task_id)
            .await?;
        let resumed = cases::resume(&self.shared, &task)
            .await
            .map_err(|e| case_status(e, None))?;
        Ok(Response::new(pb::ResumeTaskResponse {
            task: Some(convert::task(&resumed, None)),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn answer_question(
        &self,
        request: Request<pb::AnswerQuestionRequest>,
    ) -> Result<Response<pb::AnswerQuestionResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        self.answer(request, &caller).await
    }

    #[tracing::instrument(skip_all)]
    async fn delegate_question(
        &self,
        request: Request<pb::DelegateQuestionRequest>,
    ) -> Result<Response<pb::DelegateQuestionResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        self.delegate(request, &caller).await
    }

    async fn tell_task(
        &self,
        request: Request<pb::TellTaskRequest>,
    ) -> Result<Response<pb::TellTaskResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let author = note_field("author", &request.author)?;
        let task = self.resolve(&caller, "task_id", &request.task_id).await?;
        let (id, delivery) =
            cases::tell(&self.shared, &task, &request.instruction, author.as_deref())
                .await
                .map_err(|e| match e {
                    cases::Error::Store(store::Error::WrongState { state, .. }) => {
                        Status::failed_precondition(format!(
                            "task {} already ended ({state})",
                            task.id
                        ))
                    }
                    other => case_status(other, None),
                })?;
        let delivery = match delivery {
            TellDelivery::NextRound => pb::tell_task_response::Delivery::NextRound,
            TellDelivery::OnResume => pb::tell_task_response::Delivery::OnResume,
        };
        Ok(Response::new(pb::TellTaskResponse {
            delivery: delivery as i32,
            instruction_id: id.to_string(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let owner = owner_or_callers(&caller, &request.owner)?;
        let role = match request.role.trim() {
            "" => None,
            role => Some(
                role.parse::<hark_core::domain::Role>()
                    .map_err(|e| invalid("role", e))?,
            ),
        };
        let expires_in = request
            .expires_in
            .map(|d| match Duration::try_from(d) {
                Ok(d) if !d.is_zero() => Ok(d),
                _ => Err(invalid("expires_in", "must be a positive duration")),
            })
            .transpose()?;
        let make = cases::keys::Make {
            owner,
            name: request.name,
            role,
            expires_in,
        };
        let (key, secret) = cases::keys::create(&self.shared, &caller, make)
            .await
            .map_err(|e| case_status(e, None))?;
        tracing::info!(key = %key.short_id(), owner = %key.owner, by = caller.actor(), "key made");
        Ok(Response::new(pb::CreateKeyResponse {
            key: Some(convert::person_key(&key)),
            secret,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let keys = cases::keys::list(&self.shared, &caller)
            .await
            .map_err(|e| case_status(e, None))?;
        Ok(Response::new(pb::ListKeysResponse {
            keys: keys.iter().map(convert::person_key).collect(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn revoke_key(
        &self,
        request: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let id = request.into_inner().key_id;
        let key = cases::keys::revoke(&self.shared, &caller, &id)
            .await
            .map_err(|e| case_status(e, None))?;
        tracing::info!(key = %key.short_id(), owner = %key.owner, by = caller.actor(), "key revoked");
        Ok(Response::new(pb::RevokeKeyResponse {
            key: Some(convert::person_key(&key)),
        }))
    }

    type WatchTaskStream = EventStream;

    #[tracing::instrument(skip_all)]
    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let caller = self.caller(&request, API).await?;
        let reference = task_ref("task_id", &request.get_ref().task_id)?;
        let holder = holder(&request);
        let watchers = &self.shared.watchers;
        let store = self.shared.store.clone();
        // A person watches only what they see: found first, as every other call finds it.
        let reference = match caller.sees_only() {
            None => reference,
            Some(_) => TaskRef::Full(
                cases::find(&self.shared, &caller, &reference)
                    .await
                    .map_err(|e| case_status(e, None))?
                    .id,
            ),
        };
        // One read of the task. A full id is watched before that read, so that no change falls
        // between the two; a prefix must be read to be known, and a change in the moment before
        // its watch starts is caught by the periodic look at the row.
        let (mut watch, current) = match reference {
            TaskRef::Full(id) => {
                let watch = watchers.watch(id, holder).map_err(too_many)?;
                (watch, store.get_task(id).await.map_err(status_of)?)
            }
            prefix => {
                let row = store.resolve_task(&prefix, None).await.map_err(status_of)?;
                (watchers.watch(row.id, holder).map_err(too_many)?, row)
            }
        };
        let first = crate::events::current(&store, &current)
            .await
            .map_err(status_of)?;
        let (tx, rx) = crate::events::channel(16);
        let stopping = watchers.stopping();
        tokio::spawn(async move {
            let mut last = current.generation as u64;
            if tx.send(Ok(first)).await.is_err() || current.state.is_terminal() {
                return;
            }
            loop {
                // Events are published best effort; a look at the row now and then covers one
                // that was lost.
                let event = tokio::select! {
                    // The client went away: stop at once.
                    _ = tx.closed() => return,
                    _ = stopping.cancelled() => {
                        let _ = tx.send(Err(crate::events::stopping())).await;
                        return;
                    }
                    event = watch.next() => match event {
                        Some(event) => event,
                        None => return,
                    },
                    _ = tokio::time::sleep(crate::events::RECHECK) => match store.get_task(current.id).await {
                        Ok(row) if row.generation as u64 > last => {
                            match crate::events::current(&store, &row).await {
                                Ok(event) => event,
                                Err(_) => continue,
                            }
                        }
                        _ => continue,
                    },
                };
                if event.generation <= last && !crate::events::news_of_same_move(&event, last) {
                    continue;
                }
                last = event.generation;
                let terminal = pb::TaskState::try_from(event.state)
                    .ok()
                    .and_then(TaskState::from_proto)
                    .is_some_and(TaskState::is_terminal);
                if tx.send(Ok(event)).await.is_err() || terminal {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(rx)))
    }

    type WatchTasksStream =
        Pin<Box<dyn Stream<Item = Result<pb::WatchTasksResponse, Status>> + Send + 'static>>;

    #[tracing::instrument(skip_all)]
    async fn watch_tasks(
        &self,
        request: Request<pb::WatchTasksRequest>,
    ) -> Result<Response<Self::WatchTasksStream>, Status> {
        let caller = self.caller(&request, API).await?;
        let holder = holder(&request);
        let request = request.into_inner();
        if request.task_ids.len() > MAX_WATCHED_IDS {
            return Err(invalid(
                "task_ids",
                format!(
                    "{} ids, more than the {MAX_WATCHED_IDS} one stream may watch",
                    request.task_ids.len()
                ),
            ));
        }
        let filter = crate::events::Filter {
            owner: owner_for(&caller, "owner", owner_field("owner", &request.owner)?)?,
            states: states_field("states", &request.states)?,
            tasks: request
                .task_ids
                .iter()
                .map(|id| id.parse::<TaskId>().map_err(|e| invalid("task_ids", e)))
                .collect::<Result<_, _>>()?,
        };
        let resume = key_field("resume_token", &request.resume_token)?;
        let slot = self.shared.watchers.slot(holder).map_err(too_many)?;
        let events = crate::events::watch_many(&self.shared, filter, resume.as_deref(), slot)
            .await
            .map_err(|e| match e {
                crate::events::WatchError::BadToken => Status::invalid_argument(e.to_string()),
                crate::events::WatchError::Gone => Status::out_of_range(e.to_string()),
                crate::events::WatchError::Unavailable(_) => Status::unavailable(e.to_string()),
            })?;
        Ok(Response::new(Box::pin(events)))
    }

    #[tracing::instrument(skip_all)]
    async fn list_questions(
        &self,
        request: Request<pb::ListQuestionsRequest>,
    ) -> Result<Response<pb::ListQuestionsResponse>, Status> {
        let caller = self.caller(&request, API).await?;
        let request = request.into_inner();
        let stream = stream_field("stream", &request.stream)?;
        let platform = platform_field("platform", &request.platform)?;
        let after = page_token::<QuestionId>(&request.page_token)?;
        let limit = page_size(request.page_size);
        let questions = self
            .shared
            .store
            .list_questions(&QuestionFilter {
                owner: owner_for(&caller, "owner", owner_field("owner", &request.owner)?)?,
                platform,
                stream,
                include_closed: request.include_closed,
                after,
                limit,
            })
            .await
            .map_err(status_of)?;
        let next_page_token = next_page(&questions, limit, |q| q.id.to_string());
        Ok(Response::new(pb::ListQuestionsResponse {
            questions: questions.iter().map(convert::question).collect(),
            next_page_token,
        }))
    }
}

/// Checks `authorization: Bearer <token>` against `control.api_tokens`; with no tokens
/// configured (allowed on loopback only, or with `control.allow_unauthenticated`), every caller
/// is let in.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: std::sync::Arc<Vec<Secret>>,
    /// Failed calls per address: one that keeps failing is refused for a while.
    failures: hark_core::secret::Failures,
}

impl Auth {
    /// The failed sign-ins this check counts, for [`Api::counting`].
    pub fn failures(&self) -> hark_core::secret::Failures {
        self.failures.clone()
    }

    pub fn new(tokens: Vec<Secret>) -> Self {
        Self {
            tokens: std::sync::Arc::new(tokens.into_iter().filter(|t| !t.is_empty()).collect()),
            failures: Default::default(),
        }
    }
}

/// A person's key a request carries: [`Api::caller`] looks it up in Postgres.
#[derive(Debug, Clone)]
pub struct PresentedKey(pub Secret);

impl PresentedKey {
    /// `token` as a person's key: one that looks like a key and is none of the operators'
    /// `tokens`.
    pub fn of(token: &str, tokens: &[Secret]) -> Option<Self> {
        (token.starts_with(cases::keys::KEY_PREFIX) && !tokens.iter().any(|t| t.matches(token)))
            .then(|| PresentedKey(Secret::from(token)))
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        // A person's key is let through to the call, which looks it up; it acts as its owner
        // even where operators need no token.
        let key = bearer(&request)
            .ok()
            .and_then(|token| PresentedKey::of(token, &self.tokens));
        if self.tokens.is_empty() && key.is_none() {
            return Ok(request);
        }
        let peer = request.remote_addr().map(|a| a.ip());
        if let Some(seconds) = peer.and_then(|p| self.failures.refused(p)) {
            return Err(Status::resource_exhausted(
                hark_core::secret::Failures::message(seconds),
            ));
        }
        if let Some(key) = key {
            request.extensions_mut().insert(key);
            return Ok(request);
        }
        match self.check(&request) {
            Ok(index) => {
                let mut request = request;
                request.extensions_mut().insert(SignedIn(index));
                Ok(request)
            }
            Err(status) => {
                if let Some(peer) = peer {
                    self.failures.failed(peer);
                }
                Err(status)
            }
        }
    }
}

impl Auth {
    /// The position of the token `request` carries among the tokens.
    fn check(&self, request: &Request<()>) -> Result<usize, Status> {
        let token = bearer(request)?;
        if let Some(index) = self.tokens.iter().position(|t| t.matches(token)) {
            Ok(index)
        } else {
            Err(Status::unauthenticated(
                "the token is not one of control.api_tokens",
            ))
        }
    }
}

/// The token of `authorization: Bearer <token>`.
fn bearer(request: &Request<()>) -> Result<&str, Status> {
    let header = request.metadata().get("authorization").ok_or_else(|| {
        Status::unauthenticated("missing `authorization: Bearer <token>` metadata")
    })?;
    header
        .to_str()
        .ok()
        .and_then(|h| h.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or_else(|| {
            Status::unauthenticated("the authorization metadata must be `Bearer <token>`")
        })
}

/// The API while task-control starts: every call is `UNAVAILABLE`, to be tried again.
#[derive(Debug, Clone, Copy)]
pub struct Starting;

fn starting() -> Status {
    Status::unavailable(
        "task-control is starting and waits for Postgres or NATS; try again in a moment",
    )
}

#[tonic::async_trait]
impl TaskService for Starting {
    async fn create_task(
        &self,
        _: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::CreateTaskResponse>, Status> {
        Err(starting())
    }

    async fn get_task(
        &self,
        _: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        Err(starting())
    }

    async fn list_tasks(
        &self,
        _: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        Err(starting())
    }

    async fn cancel_task(
        &self,
        _: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        Err(starting())
    }

    async fn list_schedules(
        &self,
        _: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        Err(starting())
    }

    async fn cancel_schedule(
        &self,
        _: Request<pb::CancelScheduleRequest>,
    ) -> Result<Response<pb::CancelScheduleResponse>, Status> {
        Err(starting())
    }

    async fn pause_task(
        &self,
        _: Request<pb::PauseTaskRequest>,
    ) -> Result<Response<pb::PauseTaskResponse>, Status> {
        Err(starting())
    }

    async fn resume_task(
        &self,
        _: Request<pb::ResumeTaskRequest>,
    ) -> Result<Response<pb::ResumeTaskResponse>, Status> {
        Err(starting())
    }

    async fn answer_question(
        &self,
        _: Request<pb::AnswerQuestionRequest>,
    ) -> Result<Response<pb::AnswerQuestionResponse>, Status> {
        Err(starting())
    }

    async fn tell_task(
        &self,
        _: Request<pb::TellTaskRequest>,
    ) -> Result<Response<pb::TellTaskResponse>, Status> {
        Err(starting())
    }

    async fn delegate_question(
        &self,
        _: Request<pb::DelegateQuestionRequest>,
    ) -> Result<Response<pb::DelegateQuestionResponse>, Status> {
        Err(starting())
    }

    type WatchTaskStream = EventStream;

    async fn watch_task(
        &self,
        _: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        Err(starting())
    }

    async fn list_questions(
        &self,
        _: Request<pb::ListQuestionsRequest>,
    ) -> Result<Response<pb::ListQuestionsResponse>, Status> {
        Err(starting())
    }

    type WatchTasksStream =
        Pin<Box<dyn Stream<Item = Result<pb::WatchTasksResponse, Status>> + Send + 'static>>;

    async fn create_key(
        &self,
        _: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        Err(starting())
    }

    async fn list_keys(
        &self,
        _: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        Err(starting())
    }

    async fn revoke_key(
        &self,
        _: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        Err(starting())
    }

    async fn watch_tasks(
        &self,
        _: Request<pb::WatchTasksRequest>,
    ) -> Result<Response<Self::WatchTasksStream>, Status> {
        Err(starting())
    }
}
