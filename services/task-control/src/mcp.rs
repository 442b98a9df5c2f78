//! hark's MCP server, at `/mcp` on `control.http_listen`: any MCP client — Claude Code, Cursor, a
//! bot framework's LLM — asks a person through hark, and the answer comes from chat. Each
//! question is an ordinary hark question (see [`cases::external`]): it outlives the call that
//! asked it, and any replica answers for it, since everything lives in Postgres. The server is
//! stateless (no MCP session is kept), so every call may land on any replica.
//!
//! Who may call: a person's key (`Authorization: Bearer hk_…`), which asks only its owner; or one
//! of `control.api_tokens`, which names the owner. With no tokens, anyone who reaches it under
//! a loopback host name, as an operator.
//!
//! A tool call holds for at most `mcp.hold`; a question still open then is returned as
//! `waiting`, and `get_answer` waits for it again. A client that declares the Tasks extension
//! gets a task instead, answered by `tasks/get` from Postgres on any replica.

use std::{borrow::Cow, sync::Arc, time::Duration};

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use hark_core::{
    config::Language,
    domain::{Owner, QuestionId, QuestionOutcome, form::progress, shape::Shape},
    error::{Classified, Kind},
    secret::Secret,
};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
        CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, Implementation,
        InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
        Task, TaskPayload, TaskStatus, Tool,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    api::PresentedKey,
    cases::{
        self, Caller,
        external::{self, Ask, Asked, Asker},
    },
    shared::Shared,
};

/// The `_meta` key a client may put its own request id under, instead of the `request_id`
/// argument.
const REQUEST_ID_META: &str = "hark/request-id";

/// How long a `tasks/get` caller is told to wait between polls.
const POLL_MS: u64 = 2_000;

/// The MCP service for `/mcp`.
pub type Service = StreamableHttpService<Hark, LocalSessionManager>;

/// The MCP service over `shared`; hosts other than loopback names are refused unless
/// `control.api_tokens` are set, as on the console.
pub fn service(
    shared: Shared,
    tokens: &[Secret],
    cancel: tokio_util::sync::CancellationToken,
) -> Service {
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = false;
    config.cancellation_token = cancel;
    if !tokens.is_empty() {
        config = config.disable_allowed_hosts();
    }
    let hark = Hark { shared };
    StreamableHttpService::new(
        move || Ok(hark.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// Signs an MCP request in: a person's key acts as its owner; an operator's token (or, with
/// none set, a loopback request) as an operator that names the owner.
pub async fn signed_in(
    State((shared, tokens)): State<(Shared, Arc<Vec<Secret>>)>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = hark_core::secret::bearer(request.headers()).map(str::to_owned);
    let asker = match given.as_deref() {
        Some(token) => match PresentedKey::of(token, &tokens) {
            Some(PresentedKey(key)) => match cases::keys::holder(&shared, key.expose()).await {
                Ok(Some((key, caller))) => Some(Asker {
                    caller,
                    key: Some(key),
                }),
                Ok(None) => None,
                Err(e) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot check the key now: {e}"),
                    )
                        .into_response();
                }
            },
            None if tokens.iter().any(|t| t.matches(token)) => Some(operator()),
            None => None,
        },
        None if tokens.is_empty() => Some(operator()),
        None => None,
    };
    match asker {
        Some(asker) => {
            request.extensions_mut().insert(asker);
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "sign in with a person's key (Authorization: Bearer hk_…): send the bot `/key new \
             <name>` in a private chat, or ask an operator for `hark key create`; a key that was \
             revoked or expired no longer works",
        )
            .into_response(),
    }
}

fn operator() -> Asker {
    Asker {
        caller: Caller::Operator("mcp"),
        key: None,
    }
}

/// The MCP handler: each call reads who signed in from its HTTP request.
#[derive(Debug, Clone)]
pub struct Hark {
    shared: Shared,
}

/// What a call needs of its HTTP request: who signed in and the client's MCP session, if any.
struct Call {
    asker: Asker,
    session: String,
    tasks: bool,
}

impl Call {
    fn of(context: &RequestContext<RoleServer>) -> Result<Self, McpError> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let asker = parts
            .and_then(|p| p.extensions.get::<Asker>())
            .cloned()
            .ok_or_else(|| McpError::internal_error("the request was not signed in", None))?;
        let session = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let tasks = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        Ok(Self {
            asker,
            session,
            tasks,
        })
    }
}

impl ServerHandler for Hark {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("hark", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "hark asks a person in their chat (QQ and other platforms) and returns the answer. \
             Use ask_user when you need a decision or information only the person has, approve \
             before an action they must allow, and notify to tell them something. A question \
             outlives this call: when a call returns status \"waiting\", call get_answer with its \
             question_id to go on waiting.",
        )
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let call = Call::of(&context)?;
        let meta_id = request
            .meta
            .as_ref()
            .and_then(|m| m.get(REQUEST_ID_META))
            .or_else(|| context.meta.get(REQUEST_ID_META))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let result = match request.name.as_ref() {
            "ask_user" => self.ask_user(&call, arguments, meta_id).await,
            "approve" => self.approve(&call, arguments, meta_id).await,
            "permission_prompt" => self.permission_prompt(&call, arguments, meta_id).await,
            "get_answer" => self.get_answer(&call, arguments).await.map(Into::into),
            "notify" => self.notify(&call, arguments).await.map(Into::into),
            "list_questions" => self.list_questions(&call).await.map(Into::into),
            other => {
                return Err(McpError::invalid_params(
                    format!("hark has no tool `{other}`: see tools/list"),
                    None,
                ));
            }
        };
        Ok(result.unwrap_or_else(|refused| refused.into()))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let call = Call::of(&context)?;
        let id = task_question(&request.task_id)?;
        let asked = external::find(&self.shared, &call.asker, id)
            .await
            .map_err(mcp_error)?;
        Ok(GetTaskResult::new(detailed(&asked)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let call = Call::of(&context)?;
        let id = task_question(&request.task_id)?;
        external::cancel(&self.shared, &call.asker, id)
            .await
            .map_err(mcp_error)?;
        Ok(())
    }
}

/// A tool's refusal, as the model reads it: what was refused and why, in a result marked as an
/// error.
struct Refused(CallToolResult);

impl From<Refused> for CallToolResponse {
    fn from(refused: Refused) -> Self {
        CallToolResponse::Complete(refused.0)
    }
}

impl From<cases::Error> for Refused {
    fn from(error: cases::Error) -> Self {
        let code = code_of(error.kind());
        let mut result =
            CallToolResult::error(vec![ContentBlock::text(format!("{code}: {error}"))]);
        result.structured_content = Some(json!({"error": code, "message": error.to_string()}));
        Refused(result)
    }
}

fn bad_arguments(why: impl std::fmt::Display) -> Refused {
    let mut result =
        CallToolResult::error(vec![ContentBlock::text(format!("INVALID_ARGUMENT: {why}"))]);
    result.structured_content =
        Some(json!({"error": "INVALID_ARGUMENT", "message": why.to_string()}));
    Refused(result)
}

/// The gRPC code of `kind`, as every door names a refusal.
fn code_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Invalid => "INVALID_ARGUMENT",
        Kind::NotFound => "NOT_FOUND",
        Kind::Conflict => "FAILED_PRECONDITION",
        Kind::Gone => "ABORTED",
        Kind::Forbidden => "PERMISSION_DENIED",
        Kind::Exhausted => "RESOURCE_EXHAUSTED",
        Kind::Unavailable => "UNAVAILABLE",
        Kind::Internal => "INTERNAL",
    }
}

fn mcp_error(error: cases::Error) -> McpError {
    let message = format!("{}: {error}", code_of(error.kind()));
    match error.kind() {
        Kind::Invalid => McpError::invalid_params(message, None),
        Kind::NotFound | Kind::Forbidden => McpError::resource_not_found(message, None),
        _ => McpError::internal_error(message, None),
    }
}

fn task_question(task_id: &str) -> Result<QuestionId, McpError> {
    task_id.parse::<QuestionId>().map_err(|e| {
        McpError::invalid_params(format!("task id {task_id:?} is not hark's: {e}"), None)
    })
}

fn arguments<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Refused> {
    serde_json::from_value(value).map_err(bad_arguments)
}

fn owner_of(owner: Option<String>) -> Result<Option<Owner>, Refused> {
    owner
        .filter(|o| !o.trim().is_empty())
        .map(|o| {
            o.trim()
                .parse::<Owner>()
                .map_err(|e| bad_arguments(format!("owner: {e}")))
        })
        .transpose()
}

/// A question asked by a call: handed over as a task, or as it is after the hold.
enum Held {
    Task(CallToolResponse),
    Question(Box<Asked>),
}

/// The person's answer as a tool result.
enum Reading {
    /// `ask_user`, `get_answer`: the answer in its shape.
    Answer,
    /// `approve`: approved or not, with the reason.
    Approval,
    /// `permission_prompt` for `input`: Claude Code's permission result.
    Permission { input: Value },
}

#[derive(Deserialize)]
struct AskArgs {
    question: String,
    #[serde(default)]
    choices: Vec<String>,
    #[serde(default)]
    multiple: bool,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    fields: Vec<FieldArg>,
    #[serde(default)]
    context: String,
    timeout_s: Option<f64>,
    chat: Option<String>,
    owner: Option<String>,
    request_id: Option<String>,
}

#[derive(Deserialize)]
struct FieldArg {
    key: String,
    #[serde(default)]
    title: String,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    choices: Vec<String>,
    #[serde(default)]
    required: bool,
}

#[derive(Deserialize)]
struct ApproveArgs {
    action: String,
    #[serde(default)]
    details: String,
    timeout_s: Option<f64>,
    chat: Option<String>,
    owner: Option<String>,
    request_id: Option<String>,
}

#[derive(Deserialize)]
struct PermissionArgs {
    tool_name: String,
    #[serde(default)]
    input: Value,
    tool_use_id: Option<String>,
    owner: Option<String>,
    session: Option<String>,
}

#[derive(Deserialize)]
struct GetArgs {
    question_id: String,
    wait_s: Option<f64>,
}

#[derive(Deserialize)]
struct NotifyArgs {
    text: String,
    chat: Option<String>,
    owner: Option<String>,
}

fn seconds(s: Option<f64>) -> Option<Duration> {
    s.filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(1e9)))
}

impl Hark {
    fn hold(&self) -> Duration {
        self.shared.config.mcp.hold.0
    }

    /// Asks `ask`: a task at once to a client that declares the Tasks extension, else the
    /// question as it is when answered or after the hold.
    async fn ask_and_hold(&self, call: &Call, ask: Ask) -> Result<Held, Refused> {
        let asked = external::ask(&self.shared, &call.asker, ask).await?;
        if call.tasks {
            return Ok(Held::Task(CallToolResponse::Task(CreateTaskResult::new(
                task_of(&asked),
            ))));
        }
        let asked =
            external::wait(&self.shared, &call.asker, asked.question.id, self.hold()).await?;
        Ok(Held::Question(Box::new(asked)))
    }

    /// The result of a call that asked `ask`, read as `reading`.
    async fn asked(
        &self,
        call: &Call,
        ask: Ask,
        reading: Reading,
    ) -> Result<CallToolResponse, Refused> {
        Ok(match self.ask_and_hold(call, ask).await? {
            Held::Task(task) => task,
            Held::Question(asked) => {
                CallToolResponse::Complete(result_of(&asked, &reading, self.hold()))
            }
        })
    }

    async fn ask_user(
        &self,
        call: &Call,
        args: Value,
        meta_id: Option<String>,
    ) -> Result<CallToolResponse, Refused> {
        let args: AskArgs = arguments(args)?;
        let fields = args
            .fields
            .iter()
            .map(|f| hark_proto::v1::FormField {
                key: f.key.clone(),
                title: f.title.clone(),
                r#type: f.kind.clone(),
                choices: f.choices.clone(),
                required: f.required,
                ..Default::default()
            })
            .collect::<Vec<_>>();
        let shape = Shape::from_proto(&args.kind, &args.choices, args.multiple, &fields)
            .map_err(|e| bad_arguments(format!("the question's shape: {e}")))?;
        let ask = Ask {
            question: args.question,
            context: args.context,
            shape,
            timeout: seconds(args.timeout_s),
            chat: args.chat,
            owner: owner_of(args.owner)?,
            request_id: args.request_id.or(meta_id),
        };
        self.asked(call, ask, Reading::Answer).await
    }

    async fn approve(
        &self,
        call: &Call,
        args: Value,
        meta_id: Option<String>,
    ) -> Result<CallToolResponse, Refused> {
        let args: ApproveArgs = arguments(args)?;
        let owner = owner_of(args.owner)?;
        let ask = Ask {
            question: args.action,
            context: args.details,
            shape: self.approval(&call.asker, owner.as_ref(), Vec::new()),
            timeout: seconds(args.timeout_s),
            chat: args.chat,
            owner,
            request_id: args.request_id.or(meta_id),
        };
        self.asked(call, ask, Reading::Approval).await
    }

    async fn permission_prompt(
        &self,
        call: &Call,
        args: Value,
        meta_id: Option<String>,
    ) -> Result<CallToolResponse, Refused> {
        let args: PermissionArgs = arguments(args)?;
        let owner = owner_of(args.owner)?;
        let session = args.session.unwrap_or_else(|| call.session.clone());
        let tool = args.tool_name.trim().to_owned();
        if tool.is_empty() {
            return Err(bad_arguments("tool_name: must not be empty"));
        }
        if external::granted(&self.shared, &call.asker, &session, &tool).await {
            let allowed = json!({"behavior": "allow", "updatedInput": args.input});
            return Ok(permission_result(&allowed).into());
        }
        let arguments: Vec<String> = args
            .input
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let shown = serde_json::to_string(&args.input).unwrap_or_default();
        let language = self.language(&call.asker, owner.as_ref());
        let question = match language {
            Language::Zh => format!("要允许运行 `{tool}` 吗？"),
            Language::En => format!("Allow `{tool}` to run?"),
        };
        let ask = Ask {
            question,
            context: shown[..hark_core::domain::text::floor_char_boundary(
                &shown,
                external::MAX_QUESTION_BYTES / 2,
            )]
                .to_owned(),
            shape: self.approval(&call.asker, owner.as_ref(), arguments),
            timeout: None,
            chat: None,
            owner,
            request_id: args
                .tool_use_id
                .map(|id| format!("permission:{session}:{id}"))
                .or(meta_id),
        };
        let reading = Reading::Permission { input: args.input };
        let asked = match self.ask_and_hold(call, ask).await? {
            Held::Task(task) => return Ok(task),
            Held::Question(asked) => *asked,
        };
        if let Some("approve_for_task") = decision(&asked).as_deref() {
            external::grant(
                &self.shared,
                &call.asker,
                &session,
                &tool,
                asked.question.answerer.as_deref().unwrap_or_default(),
            )
            .await?;
        }
        Ok(CallToolResponse::Complete(result_of(
            &asked,
            &reading,
            self.hold(),
        )))
    }

    async fn get_answer(&self, call: &Call, args: Value) -> Result<CallToolResult, Refused> {
        let args: GetArgs = arguments(args)?;
        let id = args
            .question_id
            .trim()
            .parse::<QuestionId>()
            .map_err(|e| bad_arguments(format!("question_id: {e}")))?;
        let hold = seconds(args.wait_s).unwrap_or(self.hold()).min(self.hold());
        let asked = external::wait(&self.shared, &call.asker, id, hold).await?;
        let reading = if matches!(asked.question.shape(), Shape::Approval { .. }) {
            Reading::Approval
        } else {
            Reading::Answer
        };
        Ok(result_of(&asked, &reading, self.hold()))
    }

    async fn notify(&self, call: &Call, args: Value) -> Result<CallToolResult, Refused> {
        let args: NotifyArgs = arguments(args)?;
        let owner = owner_of(args.owner)?;
        external::notify(
            &self.shared,
            &call.asker,
            owner.as_ref(),
            args.chat.as_deref(),
            &args.text,
        )
        .await?;
        Ok(structured(json!({"status": "sent"}), "Sent.".into()))
    }

    async fn list_questions(&self, call: &Call) -> Result<CallToolResult, Refused> {
        let open = external::open(&self.shared, &call.asker).await?;
        let questions: Vec<Value> = open
            .iter()
            .map(|a| {
                json!({
                    "question_id": a.question.id.to_string(),
                    "handle": format!("#{}", a.question.handle),
                    "question": a.question.text,
                    "owner": a.question.owner.as_str(),
                    "chat": a.question.stream,
                    "asked_at": rfc3339(a.question.asked_at),
                    "deadline": a.question.deadline.map(rfc3339),
                })
            })
            .collect();
        let text = if questions.is_empty() {
            "No question of yours is open.".to_owned()
        } else {
            serde_json::to_string(&questions).unwrap_or_default()
        };
        Ok(structured(json!({"questions": questions}), text))
    }

    fn language(&self, asker: &Asker, owner: Option<&Owner>) -> Language {
        let platform = owner.or(asker.caller.owner()).map_or("", |o| o.platform());
        self.shared.texts(platform).language()
    }

    /// An approval the person answers with approve, deny (with a reason) or "for the rest of
    /// this session"; `arguments` they may change.
    fn approval(&self, asker: &Asker, owner: Option<&Owner>, arguments: Vec<String>) -> Shape {
        let choices = match self.language(asker, owner) {
            Language::Zh => ["批准", "拒绝", "本会话内都批准"],
            Language::En => ["approve", "deny", "approve for the rest of this session"],
        };
        Shape::Approval {
            choices: choices.iter().map(|c| (*c).to_owned()).collect(),
            arguments,
        }
    }
}

/// The tool result for `asked`, read as `reading`.
fn result_of(asked: &Asked, reading: &Reading, hold: Duration) -> CallToolResult {
    let question = &asked.question;
    let id = question.id.to_string();
    let handle = format!("#{}", question.handle);
    if asked.waiting() {
        let retry = hold.as_secs().clamp(1, 60);
        let text = format!(
            "No answer yet: {} has not answered question {handle} in chat. It stays open. Call \
             get_answer with question_id \"{id}\" to wait for the answer; do not ask again.",
            question.owner
        );
        return match reading {
            Reading::Permission { .. } => permission_result(&json!({
                "behavior": "deny",
                "message": format!("{} has not answered yet (question {handle} stays open in chat); call permission_prompt again with the same tool_use_id to wait for the answer", question.owner),
            })),
            _ => structured(
                json!({"status": "waiting", "question_id": id, "handle": handle, "retry_after_s": retry}),
                text,
            ),
        };
    }
    let answered = question.outcome == QuestionOutcome::Answered;
    let status = match question.outcome {
        QuestionOutcome::Answered => "answered",
        QuestionOutcome::Expired => "expired",
        _ => "cancelled",
    };
    let value = question
        .answer
        .as_deref()
        .filter(|_| answered)
        .map(|text| progress::value(text, &question.shape()));
    match reading {
        Reading::Answer => {
            let text = match (&value, question.outcome) {
                (Some(Value::String(s)), _) => s.clone(),
                (Some(v), _) => v.to_string(),
                (None, QuestionOutcome::Expired) => {
                    "No answer came before the question's deadline.".to_owned()
                }
                (None, _) => "The question was cancelled; no answer will come.".to_owned(),
            };
            structured(
                json!({
                    "status": status,
                    "question_id": id,
                    "handle": handle,
                    "answer": value,
                    "answered_by": question.answerer.as_deref().filter(|_| answered),
                }),
                text,
            )
        }
        Reading::Approval => {
            let decided = value.as_ref().and_then(|v| v["decision"].as_str());
            let approved = decided.is_some_and(|d| d.starts_with("approve"));
            let reason = match (decided, value.as_ref()) {
                (Some(_), Some(v)) => v["reason"].as_str().map(str::to_owned),
                _ if question.outcome == QuestionOutcome::Expired => {
                    Some("no answer came in time".to_owned())
                }
                _ => Some("the question was cancelled".to_owned()),
            };
            let out = json!({"approved": approved, "reason": reason});
            structured(out.clone(), out.to_string())
        }
        Reading::Permission { input } => {
            let decided = value.as_ref().and_then(|v| v["decision"].as_str());
            let by = question.answerer.as_deref().unwrap_or("the person");
            let out = match decided {
                Some(d) if d.starts_with("approve") => {
                    let mut updated = input.clone();
                    if let (Some(changed), Some(into)) = (
                        value.as_ref().and_then(|v| v["arguments"].as_object()),
                        updated.as_object_mut(),
                    ) {
                        for (k, v) in changed {
                            into.insert(k.clone(), v.clone());
                        }
                    }
                    json!({"behavior": "allow", "updatedInput": updated})
                }
                Some(_) => {
                    let reason = value
                        .as_ref()
                        .and_then(|v| v["reason"].as_str())
                        .map_or_else(
                            || format!("{by} denied it"),
                            |r| format!("{by} denied it: {r}"),
                        );
                    json!({"behavior": "deny", "message": reason})
                }
                None if question.outcome == QuestionOutcome::Expired => {
                    json!({"behavior": "deny", "message": "no answer came in time"})
                }
                None => json!({"behavior": "deny", "message": "the question was cancelled"}),
            };
            permission_result(&out)
        }
    }
}

/// Claude Code's `--permission-prompt-tool` reads the text of the first content block.
fn permission_result(out: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(out.to_string())])
}

fn structured(value: Value, text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

fn decision(asked: &Asked) -> Option<String> {
    let answer = asked.question.answer.as_deref()?;
    let value = progress::value(answer, &asked.question.shape());
    value["decision"].as_str().map(str::to_owned)
}

fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The MCP task of a question: its id is the question's.
fn task_of(asked: &Asked) -> Task {
    let status = if asked.waiting() {
        TaskStatus::Working
    } else if asked.question.outcome == QuestionOutcome::Cancelled {
        TaskStatus::Cancelled
    } else {
        TaskStatus::Completed
    };
    let updated = asked.question.closed_at.unwrap_or(asked.question.asked_at);
    let mut task = Task::new(
        asked.question.id.to_string(),
        status,
        rfc3339(asked.question.asked_at),
        rfc3339(updated),
    )
    .with_poll_interval_ms(POLL_MS);
    if status == TaskStatus::Working {
        task = task.with_status_message(format!(
            "waiting for {} to answer #{} in chat",
            asked.question.owner, asked.question.handle
        ));
    }
    task
}

/// The task of a question with its result once it has one, read as the tool that asked it.
fn detailed(asked: &Asked) -> DetailedTask {
    let task = task_of(asked);
    let payload = match task.status {
        TaskStatus::Working => TaskPayload::Working,
        TaskStatus::Cancelled => TaskPayload::Cancelled,
        _ => {
            let reading = match asked.question.shape() {
                Shape::Approval { arguments, .. } if !arguments.is_empty() => Reading::Permission {
                    input: serde_json::from_str(&context_input(asked)).unwrap_or(Value::Null),
                },
                Shape::Approval { .. } => Reading::Approval,
                _ => Reading::Answer,
            };
            let result = result_of(asked, &reading, Duration::ZERO);
            let result = match serde_json::to_value(result) {
                Ok(Value::Object(o)) => o,
                _ => JsonObject::new(),
            };
            TaskPayload::Completed { result }
        }
    };
    DetailedTask::new(task, payload)
}

/// The tool input a permission prompt showed, as its question's context keeps it.
fn context_input(asked: &Asked) -> String {
    asked
        .question
        .context
        .lines()
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n")
}

/// hark's tools, with their input schemas.
fn tools() -> Vec<Tool> {
    let tool = |name: &'static str, description: &'static str, schema: Value| {
        let schema = match schema {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        };
        Tool::new(
            Cow::Borrowed(name),
            Cow::Borrowed(description),
            Arc::new(schema),
        )
    };
    let owner = json!({"type": "string", "description": "Only with an operator's token: the person to ask, as platform:user_id (e.g. qq:12345). A person's key always asks its owner."});
    let chat = json!({"type": "string", "description": "Where to ask: a chat the person speaks in, e.g. group:456. Default: their private chat."});
    let timeout = json!({"type": "number", "description": "How long the question may wait for its answer, in seconds (at least 60, at most 7 days). Default: the server's."});
    let request_id = json!({"type": "string", "description": "Your own id for this request: calling again with it returns the same question instead of asking again."});
    vec![
        tool(
            "ask_user",
            "Ask the person a question in their chat and wait for the answer. The person may take minutes: when the call returns status \"waiting\", call get_answer with the question_id.",
            json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The question, as the person will read it."},
                    "choices": {"type": "array", "items": {"type": "string"}, "description": "The answers the person picks from."},
                    "multiple": {"type": "boolean", "description": "With choices: the person may pick several."},
                    "kind": {"type": "string", "enum": ["text", "choice", "confirm", "form"], "description": "The answer's shape: free text (default), one of choices, yes or no, or a form of fields."},
                    "fields": {"type": "array", "description": "With kind form: the fields to fill in.", "items": {"type": "object", "properties": {"key": {"type": "string"}, "title": {"type": "string"}, "type": {"type": "string", "enum": ["string", "integer", "number", "boolean"]}, "choices": {"type": "array", "items": {"type": "string"}}, "required": {"type": "boolean"}}, "required": ["key"]}},
                    "context": {"type": "string", "description": "What the person should know to answer."},
                    "timeout_s": timeout,
                    "chat": chat,
                    "owner": owner,
                    "request_id": request_id,
                },
                "required": ["question"],
            }),
        ),
        tool(
            "get_answer",
            "Wait for the answer to a question asked before, by its question_id.",
            json!({
                "type": "object",
                "properties": {
                    "question_id": {"type": "string"},
                    "wait_s": {"type": "number", "description": "How long to wait at most, in seconds (up to the server's hold)."},
                },
                "required": ["question_id"],
            }),
        ),
        tool(
            "approve",
            "Ask the person to approve an action before you take it. Returns {\"approved\": true|false, \"reason\": …}.",
            json!({
                "type": "object",
                "properties": {
                    "action": {"type": "string", "description": "What you are about to do, as the person will read it."},
                    "details": {"type": "string"},
                    "timeout_s": timeout,
                    "chat": chat,
                    "owner": owner,
                    "request_id": request_id,
                },
                "required": ["action"],
            }),
        ),
        tool(
            "permission_prompt",
            "Claude Code's --permission-prompt-tool: asks the person whether a tool may run. Returns {\"behavior\":\"allow\",\"updatedInput\":…} or {\"behavior\":\"deny\",\"message\":…}.",
            json!({
                "type": "object",
                "properties": {
                    "tool_name": {"type": "string"},
                    "input": {"type": "object"},
                    "tool_use_id": {"type": "string"},
                    "session": {"type": "string", "description": "What \"for the rest of this session\" is tied to; default: the MCP session."},
                    "owner": owner,
                },
                "required": ["tool_name", "input"],
            }),
        ),
        tool(
            "notify",
            "Send the person a message in their chat, without waiting for an answer.",
            json!({
                "type": "object",
                "properties": {"text": {"type": "string"}, "chat": chat, "owner": owner},
                "required": ["text"],
            }),
        ),
        tool(
            "list_questions",
            "List the questions this key asked that are still open.",
            json!({"type": "object", "properties": {}}),
        ),
    ]
}
