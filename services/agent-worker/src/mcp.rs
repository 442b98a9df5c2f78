//! MCP servers as tool providers (`[[tools.mcp]]`), through rmcp.
//!
//! Each configured server has a supervisor: it starts the program (stdio) or connects to the
//! endpoint (streamable HTTP), lists the server's tools, and when the connection ends it
//! connects again, with a growing pause between attempts. Calls go to the current connection;
//! while there is none, a call is an error result for the model, never a failed task.
//!
//! Each call carries, in its `_meta`, the idempotency key `(task, round, call id)` under
//! [`IDEMPOTENCY_KEY`], and a progress token; the progress a server reports reaches whoever made
//! the call.
//!
//! A server may ask for input during a call (`elicitation/create`). A person cannot be waited for
//! while a worker holds the call, so the first time hark answers `cancel`, and the call ends as
//! [`Called::Asks`]: the task asks its owner, durably, with the request's schema as a form. Once
//! answered, the call is made again under the same idempotency key, with the answers so far
//! ([`Elicited`]); the server's requests are answered from them in order.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use hark_core::config::{McpServerConfig, ToolsConfig};
use rmcp::{
    ClientHandler, ErrorData as McpError, ServiceExt,
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
        ClientRequest, ContentBlock, ElicitRequestParams, ElicitResult, ElicitationAction,
        ElicitationCapability, FormElicitationCapability, Implementation,
        ProgressNotificationParam, ProgressToken, RequestMetaObject, ServerResult,
    },
    service::{NotificationContext, Peer, PeerRequestOptions, RequestContext, RoleClient},
};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use hark_core::domain::shape::Shape;

use crate::tools::{Kind, Registry, Tool, Visibility};

/// The `_meta` key of a call's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "hark/idempotency-key";

/// How long connecting and listing the tools may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest pause between two attempts to connect.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// One progress report of a call in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// The owner's answer to one input request of a call: the form's values, or `None` when the
/// owner declined or did not answer in time.
pub type Elicited = Option<Value>;

/// What a call ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Called {
    /// The tool's result, as the model reads it.
    Done(String),
    /// The server asked for input hark has no answer for yet: ask the owner `message`, with
    /// `shape` as the form.
    Asks { message: String, shape: Shape },
}

/// A call in flight.
#[derive(Debug)]
struct InFlight {
    server: usize,
    progress: mpsc::UnboundedSender<Progress>,
    /// The answers to the server's input requests, in order.
    answers: Vec<Elicited>,
    /// How many of them were used.
    used: Mutex<usize>,
    /// An input request beyond them.
    asks: Mutex<Option<(String, Shape)>>,
    /// The progress token rmcp gave the request, once sent.
    token: Mutex<Option<String>>,
}

/// The calls in flight, by progress token.
type Calls = Arc<Mutex<HashMap<String, Arc<InFlight>>>>;

/// What a server may ask of hark while connected.
#[derive(Debug, Clone)]
struct Handler {
    server: usize,
    calls: Calls,
}

impl Handler {
    /// The one call in flight at this server; `None` when there is none, or several (an input
    /// request cannot be told apart then).
    fn only_call(&self) -> Option<Arc<InFlight>> {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut here = calls.values().filter(|c| c.server == self.server);
        match (here.next(), here.next()) {
            (Some(call), None) => Some(call.clone()),
            _ => None,
        }
    }
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = token_text(&params.progress_token);
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let call = calls.values().find(|c| {
            c.token.lock().unwrap_or_else(|p| p.into_inner()).as_deref() == Some(token.as_str())
        });
        if let Some(call) = call {
            let _ = call.progress.send(Progress {
                progress: params.progress,
                total: params.total,
                message: params.message.clone(),
            });
        }
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let answer = |action, content| {
            let mut result = ElicitResult::new(action);
            result.content = content;
            Ok(result)
        };
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            return answer(ElicitationAction::Decline, None);
        };
        let shape = serde_json::to_value(&requested_schema)
            .ok()
            .and_then(|schema| Shape::from_schema(&schema));
        let (Some(shape), Some(call)) = (shape, self.only_call()) else {
            return answer(ElicitationAction::Decline, None);
        };
        let index = {
            let mut used = call.used.lock().unwrap_or_else(|p| p.into_inner());
            *used += 1;
            *used - 1
        };
        match call.answers.get(index) {
            Some(Some(values)) => answer(ElicitationAction::Accept, Some(values.clone())),
            Some(None) => answer(ElicitationAction::Decline, None),
            None => {
                *call.asks.lock().unwrap_or_else(|p| p.into_inner()) = Some((message, shape));
                answer(ElicitationAction::Cancel, None)
            }
        }
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        let mut elicitation = ElicitationCapability::new();
        elicitation.form = Some(FormElicitationCapability::new());
        capabilities.elicitation = Some(elicitation);
        ClientConfig::new(
            capabilities,
            Implementation::new("hark", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// A tool as a server lists it.
#[derive(Debug, Clone)]
struct Listed {
    name: String,
    description: String,
    schema: Value,
    destructive: bool,
}

/// One configured server and its connection, when it has one.
#[derive(Debug)]
struct Server {
    index: usize,
    config: McpServerConfig,
    peer: RwLock<Option<Peer<RoleClient>>>,
    tools: RwLock<Vec<Listed>>,
    /// The process id of the program, while it runs.
    pid: std::sync::atomic::AtomicU32,
}

impl Server {
    /// `tools.mcp[i]`, for messages that name the config.
    fn key(&self) -> String {
        format!("tools.mcp[{}]", self.index)
    }

    fn offered(&self, tool: &str) -> bool {
        (self.config.allow.is_empty() || self.config.allow.iter().any(|t| t == tool))
            && !self.config.deny.iter().any(|t| t == tool)
    }
}

/// The MCP servers of a worker, and the tools offered with theirs.
#[derive(Debug)]
pub struct Hub {
    servers: Vec<Arc<Server>>,
    /// `fetch_url`, when enabled.
    fetch: Option<crate::fetch::Fetcher>,
    calls: Calls,
    max_offered: usize,
    registry: RwLock<Arc<Registry>>,
}

/// Why a call did not return a result; the text is what the model reads.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error(
        "error: the MCP server `{server}` is not connected; hark keeps trying to start it. Try again later or do without it."
    )]
    NotConnected { server: String },
    #[error(
        "error: `{tool}` did not answer within {seconds}s ({key}.timeout); it may or may not have acted."
    )]
    Timeout {
        tool: String,
        seconds: u64,
        key: String,
    },
    #[error(
        "error: the MCP server `{server}` stopped during the call ({why}); it is being restarted. The call may or may not have acted."
    )]
    Lost { server: String, why: String },
    #[error("error: `{tool}` failed: {message}")]
    Failed { tool: String, message: String },
}

impl Hub {
    /// The servers of `config`, not yet connected: [`Hub::start`] connects them.
    pub fn new(config: &ToolsConfig) -> Arc<Self> {
        let servers = config
            .mcp
            .iter()
            .enumerate()
            .map(|(index, config)| {
                Arc::new(Server {
                    index,
                    config: config.clone(),
                    peer: RwLock::new(None),
                    tools: RwLock::new(Vec::new()),
                    pid: Default::default(),
                })
            })
            .collect();
        let fetch = crate::fetch::Fetcher::new(&config.fetch_url);
        let hub = Self {
            servers,
            fetch,
            calls: Default::default(),
            max_offered: config.max_offered as usize,
            registry: RwLock::new(Arc::new(Registry::builtin())),
        };
        hub.rebuild();
        Arc::new(hub)
    }

    /// Starts a supervisor per server, which connects it and connects again whenever the
    /// connection ends, until `shutdown`.
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) {
        for server in &self.servers {
            let hub = self.clone();
            let server = server.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { hub.supervise(server, shutdown).await });
        }
    }

    /// Waits until every server is connected, or `within` passes; says which are not.
    pub async fn connected(&self, within: Duration) -> Result<(), Vec<String>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let missing: Vec<String> = self
                .servers
                .iter()
                .filter(|s| s.peer.read().unwrap_or_else(|p| p.into_inner()).is_none())
                .map(|s| s.config.name.clone())
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(missing);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id of the program of the stdio server `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        let server = self.servers.iter().find(|s| s.config.name == name)?;
        let connected = server
            .peer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let pid = server.pid.load(std::sync::atomic::Ordering::Relaxed);
        (connected && pid != 0).then_some(pid)
    }

    /// How many calls are in flight.
    pub fn in_flight(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The tools as they are now: the built-in ones and those of each connected server.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Fetches `url` with `fetch_url`; the text is the model's.
    pub async fn fetch(&self, url: &str) -> String {
        match &self.fetch {
            Some(fetcher) => fetcher.fetch(url).await,
            None => "error: fetch_url is off (tools.fetch_url.enabled).".to_owned(),
        }
    }

    fn rebuild(&self) {
        let mut tools: Vec<Tool> = self
            .fetch
            .iter()
            .map(|f| Tool::fetch_url(f.min_role()))
            .collect();
        for server in &self.servers {
            let listed = server.tools.read().unwrap_or_else(|p| p.into_inner());
            for tool in listed.iter().filter(|t| server.offered(&t.name)) {
                tools.push(Tool {
                    name: format!("{}__{}", server.config.name, tool.name),
                    description: tool.description.clone(),
                    parameters: tool.schema.clone(),
                    min_role: server.config.min_role,
                    visibility: Visibility::Offered,
                    kind: Kind::Mcp {
                        server: server.index,
                        tool: tool.name.clone(),
                    },
                    approval: server.config.approval.needed(&tool.name, tool.destructive),
                    approvers: server.config.approvers.clone(),
                    approvals_needed: server.config.approvals_needed.clone(),
                });
            }
        }
        let registry = Arc::new(Registry::builtin().with(tools, self.max_offered));
        *self.registry.write().unwrap_or_else(|p| p.into_inner()) = registry;
    }

    async fn supervise(&self, server: Arc<Server>, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let connected = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(&server)) => c,
            };
            let service = match connected {
                Ok(Ok(service)) => service,
                Ok(Err(e)) => {
                    tracing::warn!(
                        server = server.config.name,
                        error = %e,
                        "cannot start the MCP server ({}); trying again in {}ms",
                        server.key(),
                        backoff.as_millis()
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
                Err(_) => {
                    tracing::warn!(
                        server = server.config.name,
                        "the MCP server did not start within {}s ({}); trying again",
                        CONNECT_TIMEOUT.as_secs(),
                        server.key()
                    );
                    continue;
                }
            };
            backoff = Duration::from_millis(250);
            let stop = service.cancellation_token();
            *server.peer.write().unwrap_or_else(|p| p.into_inner()) = Some(service.peer().clone());
            self.rebuild();
            tracing::info!(
                server = server.config.name,
                tools = server.tools.read().unwrap_or_else(|p| p.into_inner()).len(),
                "MCP server connected"
            );
            let ended = tokio::select! {
                _ = shutdown.cancelled() => {
                    stop.cancel();
                    None
                }
                reason = service.waiting() => Some(reason),
            };
            *server.peer.write().unwrap_or_else(|p| p.into_inner()) = None;
            match ended {
                None => return,
                Some(reason) => tracing::warn!(
                    server = server.config.name,
                    reason = ?reason,
                    "the MCP server's connection ended; starting it again"
                ),
            }
        }
    }

    /// Starts or connects to the server and lists its tools.
    async fn connect(
        &self,
        server: &Server,
    ) -> Result<rmcp::service::RunningService<RoleClient, Handler>, String> {
        let handler = Handler {
            server: server.index,
            calls: self.calls.clone(),
        };
        let config = &server.config;
        let service = if !config.command.trim().is_empty() {
            let mut command = tokio::process::Command::new(&config.command);
            command.args(&config.args).env_clear();
            // What a program needs to be found and run, and nothing the worker holds.
            for var in ["PATH", "HOME", "LANG", "TMPDIR"] {
                if let Ok(value) = std::env::var(var) {
                    command.env(var, value);
                }
            }
            for (name, value) in &config.env {
                command.env(name, value.expose());
            }
            if !config.cwd.is_empty() {
                command.current_dir(&config.cwd);
            }
            let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(command)
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run `{}`: {e}", config.command))?;
            server.pid.store(
                transport.id().unwrap_or(0),
                std::sync::atomic::Ordering::Relaxed,
            );
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("it did not initialize: {e}"))?
        } else {
            use rmcp::transport::{
                StreamableHttpClientTransport,
                streamable_http_client::StreamableHttpClientTransportConfig,
            };
            let mut headers = HashMap::new();
            for (name, value) in &config.headers {
                let name = reqwest::header::HeaderName::try_from(name.as_str())
                    .map_err(|e| format!("header `{name}`: {e}"))?;
                let value = reqwest::header::HeaderValue::try_from(value.expose())
                    .map_err(|_| format!("header `{name}` has a value that is not allowed"))?;
                headers.insert(name, value);
            }
            hark_core::install_crypto();
            let transport = StreamableHttpClientTransport::with_client(
                reqwest::Client::new(),
                StreamableHttpClientTransportConfig::with_uri(config.url.as_str())
                    .custom_headers(headers),
            );
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("it did not initialize: {e}"))?
        };
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("cannot list its tools: {e}"))?;
        let listed = tools
            .into_iter()
            .map(|t| Listed {
                name: t.name.to_string(),
                description: t
                    .description
                    .as_deref()
                    .or(t.title.as_deref())
                    .unwrap_or_default()
                    .to_owned(),
                schema: Value::Object((*t.input_schema).clone()),
                destructive: t
                    .annotations
                    .as_ref()
                    .and_then(|a| a.destructive_hint)
                    .unwrap_or(false),
            })
            .collect();
        *server.tools.write().unwrap_or_else(|p| p.into_inner()) = listed;
        Ok(service)
    }

    /// Calls `tool` of server `server` with `arguments`, under the idempotency key `key`;
    /// `progress` receives what the server reports while it works, and `answers` answer its
    /// input requests in order.
    pub async fn call(
        &self,
        server: usize,
        tool: &str,
        arguments: Map<String, Value>,
        key: &str,
        progress: mpsc::UnboundedSender<Progress>,
        answers: Vec<Elicited>,
    ) -> Result<Called, CallError> {
        let Some(server) = self.servers.get(server) else {
            return Err(CallError::Failed {
                tool: tool.to_owned(),
                message: "no such server".into(),
            });
        };
        let name = &server.config.name;
        let peer = server
            .peer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| CallError::NotConnected {
                server: name.clone(),
            })?;
        let mut meta = Map::new();
        meta.insert(IDEMPOTENCY_KEY.into(), json!(key));
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject::from(meta));
        let call = Arc::new(InFlight {
            server: server.index,
            progress,
            answers,
            used: Mutex::new(0),
            asks: Mutex::new(None),
            token: Mutex::new(None),
        });
        // Registered before it is sent: the server may ask for input at once.
        let watch = Watch::new(&self.calls, key, call.clone());
        let timeout = server.config.timeout.0;
        let result = tokio::time::timeout(timeout, async {
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = peer
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await?;
            // rmcp sets the request's progress token itself.
            *call.token.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(token_text(&handle.progress_token));
            match handle.await_response().await? {
                ServerResult::CallToolResult(result) => Ok(result),
                _ => Err(rmcp::ServiceError::UnexpectedResponse),
            }
        })
        .await;
        drop(watch);
        if let Some((message, shape)) = call.asks.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Ok(Called::Asks { message, shape });
        }
        match result {
            Err(_) => Err(CallError::Timeout {
                tool: format!("{name}__{tool}"),
                seconds: timeout.as_secs(),
                key: server.key(),
            }),
            Ok(Ok(result)) => Ok(Called::Done(render(&result))),
            Ok(Err(rmcp::ServiceError::McpError(e))) => Err(CallError::Failed {
                tool: format!("{name}__{tool}"),
                message: e.message.to_string(),
            }),
            Ok(Err(e)) => Err(CallError::Lost {
                server: name.clone(),
                why: e.to_string(),
            }),
        }
    }
}

fn token_text(token: &ProgressToken) -> String {
    match &token.0 {
        rmcp::model::NumberOrString::String(s) => s.to_string(),
        rmcp::model::NumberOrString::Number(n) => n.to_string(),
    }
}

/// A call registered, by its idempotency key, while it is in flight.
struct Watch<'a> {
    calls: &'a Calls,
    token: String,
}

impl<'a> Watch<'a> {
    fn new(calls: &'a Calls, token: &str, call: Arc<InFlight>) -> Self {
        calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_owned(), call);
        Self {
            calls,
            token: token.to_owned(),
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

/// A tool's result as the model reads it: its text, its structured content as JSON, and a note
/// for each image, sound or resource it cannot show. A result the server marks as an error
/// starts with `error:`.
pub fn render(result: &CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        parts.push(match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!(
                "[an image ({}, {} bytes) the model cannot see]",
                image.mime_type,
                image.data.len() * 3 / 4
            ),
            ContentBlock::Audio(audio) => format!(
                "[a sound ({}, {} bytes) the model cannot hear]",
                audio.mime_type,
                audio.data.len() * 3 / 4
            ),
            ContentBlock::Resource(resource) => match &resource.resource {
                rmcp::model::ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource {uri}]\n{text}")
                }
                rmcp::model::ResourceContents::BlobResourceContents { uri, .. } => {
                    format!("[a binary resource at {uri}]")
                }
                _ => "[a resource the model cannot read]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[a link to the resource {}]", link.uri),
            _ => "[content of a kind hark does not show]".to_owned(),
        });
    }
    if let Some(structured) = &result.structured_content {
        let text = structured.to_string();
        if !parts.iter().any(|p| p.trim() == text) {
            parts.push(text);
        }
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        format!("error: {text}")
    } else if text.is_empty() {
        "(the tool returned nothing)".to_owned()
    } else {
        text
    }
}
