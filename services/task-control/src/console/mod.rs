//! The web console on `control.http_listen`: an inbox of open questions answered in place,
//! the tasks with their timelines and actions, and a playground that talks to hark as a chat
//! user does, through the gateway's HTTP adapter.
//!
//! The page is three files built into the binary ([`assets`]); it reads and acts through the
//! JSON routes here, which go through the same [`Api`] as gRPC, and stays current from one
//! stream of task events (server-sent events over `fetch`, so that it can carry the token).
//!
//! Who may use it: anyone holding one of `control.api_tokens`, sent as
//! `Authorization: Bearer`; with no tokens (allowed on loopback only, unless
//! `control.allow_unauthenticated`), anyone who reaches it under a loopback host name, so that
//! another site cannot reach it through DNS rebinding. Writes take JSON bodies only, which a
//! page of another origin cannot send without a preflight this server never grants.

mod assets;
pub mod json;
mod playground;

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use futures_util::{Stream, StreamExt as _};
use hark_core::{
    domain::{QuestionId, TaskId, TaskState},
    error::Kind,
    secret::Secret,
};
use hark_proto::v1::{self as pb, task_service_server::TaskService as _};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::{
    api::{Api, PresentedKey},
    shared::Shared,
};

/// The console's state: the API it acts through and who may use it.
#[derive(Debug, Clone)]
struct Console {
    shared: Shared,
    api: Api,
    tokens: Arc<Vec<Secret>>,
    playground: Arc<playground::Playground>,
}

/// Binds `control.http_listen`, when set, so that a port in use is said at start-up.
pub fn bind(config: &hark_core::config::Config) -> Result<Option<std::net::TcpListener>, String> {
    let Some(addr) = config.console_listen().map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        format!(
            "cannot serve the web console on control.http_listen = {addr}: {e}; pick a free port, \
             or leave control.http_listen empty for no console"
        )
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("control.http_listen = {addr}: {e}"))?;
    if let Ok(bound) = listener.local_addr() {
        hark_core::listen::bound("control.http_listen", bound);
    }
    Ok(Some(listener))
}

/// Serves the console on `listener` until `shutdown`.
pub async fn serve(shared: Shared, listener: std::net::TcpListener, shutdown: CancellationToken) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(error = %e, "the web console cannot listen (control.http_listen)");
            return;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "web console listening");
    }
    let served = axum::serve(
        listener,
        router(shared).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "the web console stopped");
    }
}

fn router(shared: Shared) -> Router {
    let console = Console {
        api: Api::new(shared.clone()),
        tokens: Arc::new(
            shared
                .config
                .control
                .api_tokens
                .iter()
                .filter(|t| !t.is_empty())
                .cloned()
                .collect(),
        ),
        playground: Arc::new(playground::Playground::new(&shared.config)),
        shared,
    };
    let api = Router::new()
        .route("/questions", get(questions))
        .route("/questions/{id}/answer", post(answer))
        .route("/questions/{id}/remind", post(remind))
        .route("/questions/{id}/delegate", post(delegate))
        .route("/tasks", get(tasks).post(create))
        .route("/tasks/{id}", get(task))
        .route("/tasks/{id}/{action}", post(act))
        .route("/events", get(events))
        .route("/playground/messages", post(playground::say))
        .route("/playground/stream", get(playground::stream))
        .route("/playground/ack", post(playground::ack))
        .route_layer(middleware::from_fn_with_state(console.clone(), signed_in))
        .route("/session", get(session));
    let mut router = Router::new();
    if console.shared.config.mcp.enabled {
        let mcp = crate::mcp::service(
            console.shared.clone(),
            &console.tokens,
            console.shared.watchers.stopping(),
        );
        router = router.merge(Router::new().route_service("/mcp", mcp).route_layer(
            middleware::from_fn_with_state(
                (console.shared.clone(), console.tokens.clone()),
                crate::mcp::signed_in,
            ),
        ));
    }
    router
        .route("/", get(assets::index))
        .route("/assets/{name}", get(assets::file))
        .nest("/api", api)
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .layer(middleware::from_fn_with_state(
            hark_core::secret::Failures::default(),
            hark_core::secret::throttle,
        ))
        .with_state(console)
}

/// Every response: no framing, no sniffing, nothing but this origin's own scripts; and with no
/// tokens, only requests made to a loopback host name.
async fn guard(State(console): State<Console>, request: Request, next: Next) -> Response {
    if console.tokens.is_empty() && !loopback_host(request.headers()) {
        return error(
            StatusCode::MISDIRECTED_REQUEST,
            "this console answers without a token only when reached as 127.0.0.1, [::1] or \
             localhost; set control.api_tokens to reach it by another name",
        )
        .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
             connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn loopback_host(headers: &HeaderMap) -> bool {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(hark_core::config::loopback_host)
}

/// Whether `headers` carry one of the tokens (always, when there are none).
fn allowed(console: &Console, headers: &HeaderMap) -> bool {
    console.tokens.is_empty()
        || hark_core::secret::bearer(headers)
            .is_some_and(|given| console.tokens.iter().any(|t| t.matches(given)))
}

async fn signed_in(State(console): State<Console>, mut request: Request, next: Next) -> Response {
    // A person's key: every call checks it, and acts only as its owner.
    if let Some(key) = person_key(&console, request.headers()) {
        request.extensions_mut().insert(key);
        return next.run(request).await;
    }
    if allowed(&console, request.headers()) {
        next.run(request).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "sign in with one of control.api_tokens",
        )
        .into_response()
    }
}

/// The person's key `headers` carry, when they carry one that is not an operator's token.
fn person_key(console: &Console, headers: &HeaderMap) -> Option<PresentedKey> {
    hark_core::secret::bearer(headers).and_then(|given| PresentedKey::of(given, &console.tokens))
}

/// Who a console request comes from: the person whose key signed in, or an operator.
#[derive(Debug, Clone, Default)]
struct Who(Option<PresentedKey>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Who {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Infallible> {
        Ok(Who(parts.extensions.get::<PresentedKey>().cloned()))
    }
}

impl Who {
    /// `message` as an API request from this caller.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(key) = &self.0 {
            request.extensions_mut().insert(key.clone());
        }
        request
    }

    /// The caller the use cases see.
    async fn caller(&self, console: &Console) -> Result<crate::cases::Caller, Failure> {
        console
            .api
            .caller(&self.request(()), "console")
            .await
            .map_err(refused)
    }

    /// Refuses what only an operator may do (the playground speaks as anyone).
    fn operator_only(&self, what: &str) -> Result<(), Failure> {
        match self.0 {
            None => Ok(()),
            Some(_) => Err(error(
                StatusCode::FORBIDDEN,
                format!("{what} is for operators: a person's key cannot use it"),
            )),
        }
    }
}

/// A refusal the page reads: a status and `{"error": "…"}`.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Failure {
    Failure {
        status,
        message: message.into(),
    }
}

/// A refusal of the API as the page reads it: the status a browser knows, and the message.
fn refused(status: Status) -> Failure {
    let code = match status.code() {
        // Not signed in is no error of a task: the browser signs in again.
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        code => Kind::of_grpc(code).http_status(),
    };
    error(code, status.message())
}

type Answered = Result<Json<Value>, Failure>;

/// A JSON request body. Anything but `Content-Type: application/json` is refused (415): a page
/// of another site can send other types without asking first. A body that does not read is a
/// 400 that says what is wrong, in the console's own error shape.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &S) -> Result<Self, Failure> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the body as Content-Type: application/json",
            ));
        }
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|e| {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                )
            })?;
        read_body(&bytes)
            .map(Body)
            .map_err(|why| error(StatusCode::BAD_REQUEST, why))
    }
}

/// Reads a JSON body; the error names the field that is wrong.
pub fn read_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        let field = e.path().to_string();
        let why = e.into_inner();
        if field == "." {
            format!("the body: {why}")
        } else {
            format!("{field}: {why}")
        }
    })
}

/// Reads `bytes` as every JSON body the console takes, as its handlers read them; what each
/// one says is wrong with it. For the fuzz target of the console's bodies.
pub fn read_every_body(bytes: &[u8]) -> Vec<Result<(), String>> {
    vec![
        read_body::<NewTask>(bytes).map(drop),
        read_body::<Act>(bytes).map(drop),
        read_body::<AnswerBody>(bytes).map(drop),
        read_body::<DelegateBody>(bytes).map(drop),
        read_body::<RemindBody>(bytes).map(drop),
        read_body::<playground::Say>(bytes).map(drop),
        read_body::<playground::Acks>(bytes).map(drop),
    ]
}

/// `GET /api/session`: whether a token is needed and whether the one sent is good, the
/// language, the chat command word and the playground.
/// With a person's key, `as` names the person: the console is their own inbox.
async fn session(State(console): State<Console>, headers: HeaderMap) -> Json<Value> {
    let config = &console.shared.config;
    let person = match person_key(&console, &headers) {
        Some(key) => Some(Who(Some(key)).caller(&console).await.ok()),
        None => None,
    };
    let signed_in = match &person {
        Some(caller) => caller.is_some(),
        None => allowed(&console, &headers),
    };
    let person = person.flatten();
    Json(json!({
        "token_required": !console.tokens.is_empty(),
        "signed_in": signed_in,
        "as": person.as_ref().and_then(|c| c.owner()).map(|o| o.to_string()),
        "language": config.chat.language_for(&config.gateway.onebot.platform),
        "command": config.chat.command,
        "playground": console.playground.describe(),
    }))
}

#[derive(Debug, Deserialize)]
struct QuestionQuery {
    #[serde(default)]
    owner: String,
    #[serde(default)]
    page_token: String,
    /// Questions per page: 100 unless said, at most 200.
    #[serde(default)]
    page_size: u32,
}

/// `GET /api/questions`: one page of the open questions, oldest first, and the token of the
/// next (empty on the last), so that the inbox opens as fast with 100,000 waiting as with ten.
async fn questions(
    State(console): State<Console>,
    who: Who,
    Query(q): Query<QuestionQuery>,
) -> Answered {
    let page = console
        .api
        .list_questions(who.request(pb::ListQuestionsRequest {
            owner: q.owner,
            page_size: match q.page_size {
                0 => 100,
                n => n.min(200),
            },
            page_token: q.page_token,
            ..Default::default()
        }))
        .await
        .map_err(refused)?
        .into_inner();
    let mut questions = page.questions;
    questions.sort_by_key(|q| {
        q.asked_at
            .as_ref()
            .map(|t| (t.seconds, t.nanos))
            .unwrap_or_default()
    });
    Ok(Json(json!({
        "questions": questions.iter().map(json::question).collect::<Vec<_>>(),
        "next_page_token": page.next_page_token,
    })))
}

#[derive(Debug, Deserialize)]
struct TaskQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    owner: String,
    /// `platform:stream`, e.g. `qq:group:777`, or a stream alone.
    #[serde(default)]
    chat: String,
    #[serde(default)]
    page_token: String,
}

/// `GET /api/tasks`: the newest tasks, filtered by state (a comma-separated list), owner and
/// chat.
async fn tasks(State(console): State<Console>, who: Who, Query(q): Query<TaskQuery>) -> Answered {
    let mut states = Vec::new();
    for word in q.state.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let state = word
            .parse::<TaskState>()
            .map_err(|e| error(StatusCode::BAD_REQUEST, format!("state: {e}")))?;
        states.push(state.to_proto() as i32);
    }
    let chat = q.chat.trim();
    let (platform, stream) = match chat.split_once(':') {
        Some((platform, stream)) if stream.contains(':') => (platform, stream),
        _ => ("", chat),
    };
    let page = console
        .api
        .list_tasks(who.request(pb::ListTasksRequest {
            owner: q.owner.trim().to_owned(),
            states,
            stream: stream.to_owned(),
            platform: platform.to_owned(),
            page_size: 100,
            page_token: q.page_token,
        }))
        .await
        .map_err(refused)?
        .into_inner();
    Ok(Json(json!({
        "tasks": page.tasks.iter().map(json::task).collect::<Vec<_>>(),
        "next_page_token": page.next_page_token,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTask {
    owner: String,
    goal: String,
}

/// `POST /api/tasks`: a task without a chat; its questions are answered here or over the API.
async fn create(State(console): State<Console>, who: Who, Body(new): Body<NewTask>) -> Answered {
    let created = console
        .api
        .create_task(who.request(pb::CreateTaskRequest {
            owner: new.owner,
            goal: new.goal,
            ..Default::default()
        }))
        .await
        .map_err(refused)?
        .into_inner();
    Ok(Json(json!({
        "task": created.task.as_ref().map_or(Value::Null, json::task)
    })))
}

#[derive(Debug, Deserialize)]
struct DetailQuery {
    /// Only the rounds after this one: a page that has the others asks for what is new (a
    /// round never changes once stored).
    #[serde(default)]
    after_round: String,
}

/// `GET /api/tasks/{id}`: the task and its timeline: rounds, questions, transitions and the
/// instructions not yet read.
async fn task(
    State(console): State<Console>,
    who: Who,
    Path(id): Path<String>,
    Query(q): Query<DetailQuery>,
) -> Answered {
    let after = match q.after_round.trim() {
        "" => None,
        n => Some(n.parse::<i32>().map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                format!("after_round: {n:?} is not a round number; give the last round you have"),
            )
        })?),
    };
    let got = console
        .api
        .get_task(who.request(pb::GetTaskRequest {
            task_id: id.clone(),
        }))
        .await
        .map_err(refused)?
        .into_inner();
    let task = got.task.unwrap_or_default();
    let id: TaskId = task
        .id
        .parse()
        .map_err(|_| error(StatusCode::NOT_FOUND, format!("no task {id}")))?;
    let store = &console.shared.store;
    let failed = |e: crate::store::Error| refused(crate::api::status_of(e));
    let rounds = store.rounds_at(id, after).await.map_err(failed)?;
    let transitions = store.transitions_of(id).await.map_err(failed)?;
    let instructions = store.instructions_of(id).await.map_err(failed)?;
    let at = |t: time::OffsetDateTime| json!(t.unix_timestamp_nanos() / 1_000_000);
    Ok(Json(json!({
        "task": json::task(&task),
        "questions": got.questions.iter().map(json::question).collect::<Vec<_>>(),
        "rounds": rounds.iter().map(|(r, created)| json!({
            "round": r.round,
            "messages": r.messages.0,
            "at": at(*created),
        })).collect::<Vec<_>>(),
        "transitions": transitions.iter().map(|t| json!({
            "from": t.from_state,
            "to": t.to_state,
            "event": t.event,
            "generation": t.generation,
            "actor": t.actor,
            "detail": t.detail,
            "at": at(t.at),
        })).collect::<Vec<_>>(),
        "instructions": instructions.iter().map(|i| json!({
            "text": i.text,
            "author": i.author,
        })).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Act {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    text: String,
}

/// `POST /api/tasks/{id}/{cancel|pause|resume|tell}`.
async fn act(
    State(console): State<Console>,
    who: Who,
    Path((id, action)): Path<(String, String)>,
    Body(act): Body<Act>,
) -> Answered {
    let api = &console.api;
    let task = match action.as_str() {
        "cancel" => {
            api.cancel_task(who.request(pb::CancelTaskRequest {
                task_id: id,
                reason: act.reason,
            }))
            .await
            .map_err(refused)?
            .into_inner()
            .task
        }
        "pause" => {
            api.pause_task(who.request(pb::PauseTaskRequest { task_id: id }))
                .await
                .map_err(refused)?
                .into_inner()
                .task
        }
        "resume" => {
            api.resume_task(who.request(pb::ResumeTaskRequest { task_id: id }))
                .await
                .map_err(refused)?
                .into_inner()
                .task
        }
        "tell" => {
            let told = api
                .tell_task(who.request(pb::TellTaskRequest {
                    task_id: id,
                    instruction: act.text,
                    author: "console".into(),
                }))
                .await
                .map_err(refused)?
                .into_inner();
            return Ok(Json(json!({"instruction_id": told.instruction_id})));
        }
        other => {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("no action `{other}`: cancel, pause, resume or tell"),
            ));
        }
    };
    Ok(Json(json!({
        "task": task.as_ref().map_or(Value::Null, json::task)
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    /// Read as a chat answer is (`2`, `是`, `key: value` lines).
    #[serde(default)]
    answer: String,
    /// A structured answer: a choice, a list of them, true or false, or a form's object.
    #[serde(default)]
    value: Option<Value>,
}

/// `POST /api/questions/{id}/answer`.
async fn answer(
    State(console): State<Console>,
    who: Who,
    Path(id): Path<String>,
    Body(body): Body<AnswerBody>,
) -> Answered {
    let answered = console
        .api
        .answer(
            who.request(pb::AnswerQuestionRequest {
                question_id: id,
                answer: body.answer,
                answer_json: body.value.map(|v| v.to_string()).unwrap_or_default(),
                ..Default::default()
            }),
            &who.caller(&console).await?,
        )
        .await
        .map_err(refused)?
        .into_inner();
    Ok(Json(json!({
        "task": answered.task.as_ref().map_or(Value::Null, json::task),
        "question": answered.question.as_ref().map_or(Value::Null, json::question),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DelegateBody {
    /// `platform:user_id` of the person to ask instead.
    to: String,
}

/// `POST /api/questions/{id}/delegate` with `{"to": "qq:10002"}`: the question is asked of that
/// person from now on (see `DelegateQuestion`).
async fn delegate(
    State(console): State<Console>,
    who: Who,
    Path(id): Path<String>,
    Body(body): Body<DelegateBody>,
) -> Answered {
    let moved = console
        .api
        .delegate(
            who.request(pb::DelegateQuestionRequest {
                question_id: id,
                to: body.to,
                request_id: String::new(),
            }),
            &who.caller(&console).await?,
        )
        .await
        .map_err(refused)?
        .into_inner();
    Ok(Json(json!({
        "question": moved.question.as_ref().map_or(Value::Null, json::question),
    })))
}

/// The body of `remind`: nothing but `{}`, so that it too is JSON only.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemindBody {}

/// `POST /api/questions/{id}/remind` with `{}`: the owner is reminded in the chat now, at most
/// once a minute.
async fn remind(
    State(console): State<Console>,
    who: Who,
    Path(id): Path<String>,
    Body(RemindBody {}): Body<RemindBody>,
) -> Answered {
    let id: QuestionId = id
        .parse()
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("question id: {e}")))?;
    let caller = who.caller(&console).await?;
    let question = crate::cases::remind(&console.shared, &caller, id)
        .await
        .map_err(|e| refused(crate::api::case_status(e, None)))?;
    Ok(Json(json!({
        "question": json::question(&crate::convert::question(&question))
    })))
}

/// `GET /api/events`: task events as server-sent events, each with the token that goes on after
/// it as its id; a client that reconnects with `Last-Event-ID` misses nothing, and one whose
/// token is too old is told `410 Gone` (it lists again and watches from now).
async fn events(
    State(console): State<Console>,
    who: Who,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Failure> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let holder = crate::watchers::Holder {
        connection: extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0),
        token: hark_core::secret::bearer(&headers)
            .and_then(|given| console.tokens.iter().position(|t| t.matches(given))),
    };
    let slot = console
        .shared
        .watchers
        .slot(holder)
        .map_err(|e| error(StatusCode::TOO_MANY_REQUESTS, e.to_string()))?;
    // A person's own tasks only.
    let filter = crate::events::Filter {
        owner: who.caller(&console).await?.sees_only().cloned(),
        ..Default::default()
    };
    let events = crate::events::watch_many(&console.shared, filter, resume, slot)
        .await
        .map_err(|e| match e {
            crate::events::WatchError::Gone => error(StatusCode::GONE, e.to_string()),
            crate::events::WatchError::BadToken => error(StatusCode::BAD_REQUEST, e.to_string()),
            crate::events::WatchError::Unavailable(_) => {
                error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        })?;
    let stream = events.map(|item| {
        Ok(match item {
            Ok(response) => Event::default()
                .event("task")
                .id(response.resume_token)
                .data(
                    response
                        .event
                        .as_ref()
                        .map_or(Value::Null, json::event)
                        .to_string(),
                ),
            Err(status) => Event::default()
                .event("lost")
                .data(json!({"error": status.message()}).to_string()),
        })
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The address the console is served on, for banners: `None` without one.
pub fn url(addr: Option<SocketAddr>) -> Option<String> {
    addr.map(|addr| format!("http://{}/", hark_core::config::dial(addr)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_count_as_loopback_hosts() {
        let host = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(h).expect("header"));
            loopback_host(&headers)
        };
        for good in [
            "127.0.0.1:8081",
            "localhost:8081",
            "LOCALHOST",
            "[::1]:8081",
            "127.0.0.2",
        ] {
            assert!(host(good), "{good}");
        }
        for bad in [
            "evil.example:8081",
            "10.0.0.1:8081",
            "localhost.evil.example",
            "[::2]:1",
        ] {
            assert!(!host(bad), "{bad}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }
}
