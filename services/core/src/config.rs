//! hark's configuration: one TOML file, every key overridable by an environment variable.
//!
//! The file is named by `--config PATH` or `HARK_CONFIG`; without one, the defaults below run
//! hark against NATS on 127.0.0.1:4222 and Postgres on 127.0.0.1:5432. Any key can be set with
//! `HARK_<SECTION>__<KEY>` (`HARK_TASK__MAX_ROUNDS=50`, `HARK_GATEWAY__ONEBOT__ACCESS_TOKEN=…`);
//! lists take comma-separated values. `HARK_` variables without a `__` are not configuration. Unknown keys and bad values stop start-up with a message
//! naming the key and what was expected.

use std::{collections::BTreeMap, net::SocketAddr, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    bus::Namespace,
    domain::{DeadlinePolicy, HumanDuration, Owner, Role, TimeoutPolicy},
    secret::{Secret, redact_url},
};

/// The prefix of every environment override.
pub const ENV_PREFIX: &str = "HARK_";
/// The environment variable naming the config file.
pub const ENV_CONFIG_FILE: &str = "HARK_CONFIG";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("config key `{key}`: {message}")]
    Key { key: String, message: String },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub database: DatabaseConfig,
    pub llm: LlmConfig,
    pub gateway: GatewayConfig,
    pub control: ControlConfig,
    pub mcp: McpConfig,
    pub worker: WorkerConfig,
    pub tools: ToolsConfig,
    pub task: TaskConfig,
    pub permission: PermissionConfig,
    pub chat: ChatConfig,
    pub log: LogConfig,
    pub metrics: MetricsConfig,
    pub telemetry: TelemetryConfig,
}

/// Traces over OTLP/gRPC. Each key mirrors the standard OpenTelemetry environment variable,
/// which wins when set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. `http://127.0.0.1:4317`; empty: no traces exported.
    pub endpoint: String,
    /// `OTEL_SERVICE_NAME`; empty: `hark-control`, `hark-gateway`, `hark-worker` or `hark-dev`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs, comma-separated.
    pub resource_attributes: String,
    /// `OTEL_TRACES_SAMPLER`: `parentbased_always_on` when empty.
    pub sampler: String,
    /// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the `traceidratio` samplers.
    pub sampler_arg: String,
}

/// Whether a host name (without port or brackets) names this host: `localhost` or a loopback
/// address.
pub fn loopback_name(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether an HTTP `Host` header (`name`, `name:port`, `[v6]:port`) names this host's loopback.
pub fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    loopback_name(name)
}

/// A listen address that may be left empty (`None`), read from `key`.
fn optional_listen(
    key: &str,
    value: &str,
    example: &str,
    empty: &str,
) -> Result<Option<SocketAddr>, Error> {
    let listen = value.trim();
    if listen.is_empty() {
        return Ok(None);
    }
    listen.parse().map(Some).map_err(|_| Error::Key {
        key: key.into(),
        message: format!(
            "`{listen}` is not a listen address: expected host:port, e.g. {example}, or empty for \
             {empty}"
        ),
    })
}

/// The address a client on this host dials for a listener on `addr`: a listener on every
/// interface (`0.0.0.0`, `[::]`) is reached on 127.0.0.1.
pub fn dial(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip([127, 0, 0, 1].into());
    }
    addr
}

/// Prometheus metrics of the process's roles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where task-control and the worker serve `GET /metrics` (the worker also its `/healthz`),
    /// e.g. `127.0.0.1:9464`; empty: no listener. The gateway serves `/metrics` on
    /// `gateway.listen` in any case.
    pub listen: String,
    /// Required as `Authorization: Bearer` when `metrics.listen` is beyond loopback.
    pub token: Secret,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// One server or several, comma-separated (`nats://a:4222,nats://b:4222`): a client that
    /// loses its server connects to another. A secret: it may carry a user and password
    /// (`nats://user:pass@host:4222`).
    pub url: Secret,
    /// Prefix of every subject, stream and consumer name, so that several hark installations
    /// can share one nats-server without seeing each other's messages.
    pub namespace: String,
    /// Copies of every stream hark keeps, each on a server of its own: 1 on a single
    /// nats-server, 3 on a three-node JetStream cluster (at most 5).
    pub replicas: usize,
    pub placement: PlacementConfig,
    /// Streams `TASK_RUN` is split into by a stable hash of the task id, and `CHAT_IN` by one of
    /// the chat (1 to 64): each has its own consumer and its own leader, so that on a cluster the
    /// leaders spread over the servers. A task's jobs, and one chat's messages, always go to the
    /// same one. Lower it only once both are drained.
    pub partitions: u16,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: Secret::new("nats://127.0.0.1:4222"),
            namespace: "hark".into(),
            replicas: 1,
            placement: PlacementConfig::default(),
            partitions: 1,
        }
    }
}

/// Where in a NATS super-cluster hark's streams are placed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementConfig {
    /// The cluster that holds the streams; empty: the one hark is connected to.
    pub cluster: String,
    /// Server tags (`server_tags` in nats-server's configuration) every replica's server must
    /// have, e.g. `["ssd"]`.
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// The database is created when it does not exist. A secret: it may carry a password.
    pub url: Secret,
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: Secret::new("postgres://postgres@127.0.0.1:5432/hark"),
            max_connections: 16,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// An OpenAI-compatible endpoint, e.g. `https://api.deepseek.com/v1`. Empty runs the built-in
    /// demo model.
    pub base_url: String,
    pub api_key: Secret,
    pub model: String,
    /// Extra fields merged into every chat-completions request body.
    pub extra_body: toml::Table,
    pub request_timeout: HumanDuration,
    pub max_retries: u32,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            api_key: Secret::default(),
            model: String::new(),
            extra_body: toml::Table::new(),
            request_timeout: HumanDuration::from_secs(120),
            max_retries: 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// HTTP and WebSocket listener (OneBot reverse WebSocket, the HTTP adapter).
    #[serde(with = "listen_addr")]
    pub listen: SocketAddr,
    pub max_frame_bytes: u64,
    /// Inbound frames a second one connection may send (bursts of twice that).
    pub rate_limit: u32,
    /// How long a platform has to confirm a sent message.
    pub send_timeout: HumanDuration,
    /// Where chat messages read from bots are kept, synced to disk, until JetStream has them.
    /// Empty: `$XDG_STATE_HOME/hark/spool-<port>` (or under `~/.local/state`). Each gateway needs
    /// a directory of its own that survives a restart (a volume in a container).
    pub spool_dir: String,
    /// The most bytes of messages the spool keeps while NATS is away; beyond it, messages are
    /// refused and the chat is told.
    pub spool_max_bytes: u64,
    /// A bot that has not been connected for this long loses its place on the bus (its durable
    /// consumer, removed by NATS); its waiting messages stay in the stream for it, and a new
    /// place is made when it connects again.
    pub forget_bot_after: HumanDuration,
    pub onebot: OneBotConfig,
    pub http: HttpAdapterConfig,
    pub langbot: LangBotConfig,
    pub satori: SatoriConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_frame_bytes: 1 << 20,
            rate_limit: 50,
            send_timeout: HumanDuration::from_secs(10),
            spool_dir: String::new(),
            spool_max_bytes: 64 << 20,
            forget_bot_after: HumanDuration::from_secs(86_400),
            onebot: OneBotConfig::default(),
            http: HttpAdapterConfig::default(),
            langbot: LangBotConfig::default(),
            satori: SatoriConfig::default(),
        }
    }
}

/// The generic HTTP adapter, for apps that are not OneBot bots. It is off until it is given the
/// platforms it speaks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpAdapterConfig {
    /// The platforms whose messages the adapter accepts, e.g. `["myapp"]`. Empty: the adapter is
    /// off. Never a platform another adapter serves (OneBot's `gateway.onebot.platform`).
    pub platforms: Vec<String>,
    /// When set, HTTP clients must send `Authorization: Bearer <token>`. Required when the
    /// gateway listens beyond loopback.
    pub token: Secret,
    /// The bots this adapter delivers for, as `platform:bot_id`.
    pub bots: Vec<String>,
    /// Outbound messages are POSTed here; without it they are served on `/api/v1/stream` (SSE).
    pub webhook_url: String,
}

/// A Satori server (Koishi with server-satori, satori-python, Chronocat, …), which hark dials as
/// a client: its event stream over WebSocket, its API over HTTP. Each of its logins is a bot;
/// hark knows a login of the Satori platform `p` as the platform `satori-p`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SatoriConfig {
    /// The server, e.g. `http://127.0.0.1:5140` (its API and events under `/v1`). Empty: off.
    pub url: String,
    /// The server's token, sent in IDENTIFY and as `Authorization: Bearer`. Required for a
    /// server beyond loopback.
    pub token: Secret,
    /// Satori platforms whose logins show a question's choices as buttons, e.g.
    /// `["discord", "telegram"]`, besides every login whose `features` list `message.button`.
    /// Servers differ in whether their logins announce buttons, so a platform may be named here.
    /// A press answers like the reply of the choice's number.
    pub buttons: Vec<String>,
}

/// LangBot in front of the chat: its webhook posts every message to
/// `/api/v1/langbot/webhook?token=…`, which answers `skip_pipeline` when hark took it, and hark
/// replies through LangBot's HTTP API. Off until `bots` names a bot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LangBotConfig {
    /// LangBot's HTTP API, e.g. `http://127.0.0.1:5300`.
    pub url: String,
    /// A LangBot API key allowed to send messages (sent as `X-API-Key`).
    pub api_key: Secret,
    /// The LangBot bots hark serves, as `platform:bot_uuid`, e.g. `langbot-qq:4b1c…`. The
    /// platform names the chat the bot is on: its users are owners `platform:user id`.
    pub bots: Vec<String>,
    /// LangBot's webhook sends no header of its own, so its URL carries this as `?token=`.
    /// Required when the gateway listens beyond loopback.
    pub token: Secret,
    /// How long a message waits for hark's verdict before the webhook answers (LangBot waits
    /// 15 s for it).
    pub wait: HumanDuration,
}

impl Default for LangBotConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            api_key: Secret::default(),
            bots: Vec::new(),
            token: Secret::default(),
            wait: HumanDuration::from_secs(5),
        }
    }
}

impl LangBotConfig {
    /// The bots, as `(platform, bot uuid)`.
    pub fn bots(&self) -> Vec<(String, String)> {
        self.bots
            .iter()
            .filter_map(|b| b.split_once(':'))
            .map(|(p, b)| (p.to_owned(), b.to_owned()))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OneBotConfig {
    /// When set, bots must present it as `Authorization: Bearer <token>` or `?access_token=`.
    /// Required when the gateway listens beyond loopback.
    pub access_token: Secret,
    /// Bots with a token of their own, by account id (`[gateway.onebot.bots.123456]`,
    /// `HARK_GATEWAY__ONEBOT__BOTS__123456__ACCESS_TOKEN`). Such a bot connects only with its own
    /// token, and no other token connects as it; bots not listed use `access_token`.
    pub bots: BTreeMap<String, OneBotBotConfig>,
    /// The platform name given to messages from OneBot bots.
    pub platform: String,
    /// Forward mode: WebSocket URLs of bots' own servers to connect to (NapCat's
    /// `websocketServers`), e.g. `ws://127.0.0.1:3001`; reconnected with backoff.
    pub forward: Vec<String>,
    /// A connection that sends nothing for this long (not even the answer to a WebSocket ping,
    /// sent every third of it) is closed, so that the bot dials again (reverse) or is dialled
    /// again (forward). `0s`: never.
    pub idle_timeout: HumanDuration,
}

/// One bot's own settings, under `gateway.onebot.bots.<account id>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OneBotBotConfig {
    /// The token this bot, and only this bot, connects with.
    pub access_token: Secret,
}

impl Default for OneBotConfig {
    fn default() -> Self {
        Self {
            access_token: Secret::default(),
            bots: BTreeMap::new(),
            platform: "qq".into(),
            forward: Vec::new(),
            idle_timeout: HumanDuration::from_secs(90),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    #[serde(with = "listen_addr")]
    pub grpc_listen: SocketAddr,
    /// Bearer tokens accepted by the gRPC API. Empty: no authentication, which task-control
    /// allows only on a loopback address unless `allow_unauthenticated` is set.
    pub api_tokens: Vec<Secret>,
    /// Serve the gRPC API without tokens on a non-loopback address, on purpose (behind a proxy
    /// that authenticates, say).
    pub allow_unauthenticated: bool,
    /// Streams of task events (`WatchTask`, `WatchTasks`, an answer's wait, the console's events)
    /// one task-control process serves at once; more are refused with `RESOURCE_EXHAUSTED`.
    pub max_watchers: u32,
    /// Of those, the most one client connection holds.
    pub max_watchers_per_connection: u32,
    /// Of those, the most the callers of one of `control.api_tokens` hold together.
    pub max_watchers_per_token: u32,
    /// Where task-control serves the web console, e.g. `127.0.0.1:8081`; empty: no console.
    /// Beyond loopback it asks for one of `control.api_tokens`, as the gRPC API does.
    pub http_listen: String,
    /// The gateway whose HTTP adapter the console's playground talks through, e.g.
    /// `http://hark-gateway:8080`; empty: `gateway.listen` on this host.
    pub playground_url: String,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            api_tokens: Vec::new(),
            allow_unauthenticated: false,
            max_watchers: 10_000,
            max_watchers_per_connection: 1_000,
            max_watchers_per_token: 5_000,
            http_listen: "127.0.0.1:8081".into(),
            playground_url: String::new(),
        }
    }
}

/// hark's MCP server at `/mcp` on `control.http_listen`: any MCP client asks a person through
/// hark with a person's key (or an operator token naming the owner).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Serve it whenever `control.http_listen` is set.
    pub enabled: bool,
    /// How long a tool call waits for the answer before it returns `waiting` with the question's
    /// id; under the 60 s most clients give a call.
    pub hold: HumanDuration,
    /// Questions one key may have open at once.
    pub max_open_per_key: u32,
    /// Questions one key may ask in a minute.
    pub max_per_minute_per_key: u32,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            hold: HumanDuration::from_secs(45),
            max_open_per_key: 20,
            max_per_minute_per_key: 30,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Tasks one worker process runs at once.
    pub concurrency: u32,
    /// Whether an idle slot also waits at task-control for a run job handed over directly,
    /// which spares a resume the run queue's hop and the claim request. Takes effect with
    /// `concurrency` of 2 or more (one slot polls, the others pull from the run queue).
    pub poll: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll: true,
        }
    }
}

/// The tools an agent may use beyond the built-in ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// MCP servers whose tools are offered, as `[[tools.mcp]]` entries.
    pub mcp: Vec<McpServerConfig>,
    /// How many tools the model is offered by name in each request before the rest are found
    /// through `list_tools` (`ask_user` is always offered).
    pub max_offered: u32,
    /// The `fetch_url` tool: HTTP GET of allowed hosts.
    pub fetch_url: FetchUrlConfig,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            mcp: Vec::new(),
            max_offered: 24,
            fetch_url: FetchUrlConfig::default(),
        }
    }
}

/// The `fetch_url` tool, off unless enabled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchUrlConfig {
    pub enabled: bool,
    /// The hosts it may fetch from: `example.com`, `*.example.com` (its subdomains), or `*`
    /// (any host whose addresses are public: in none of IANA's special-purpose registries).
    pub allow: Vec<String>,
    /// Hosts of `allow` that may resolve to addresses that are not public (loopback, private,
    /// link-local): an intranet service, named on purpose. Nothing else reaches them.
    pub allow_private: Vec<String>,
    /// The HTTP proxy to fetch through, e.g. `http://proxy:3128`; empty: none. The environment's
    /// `HTTP_PROXY` and `HTTPS_PROXY` are never used, and with a proxy hark still checks each
    /// target's addresses itself first, since the proxy would resolve names on its own.
    pub proxy: String,
    /// The most bytes of a response read; the rest is cut with a note.
    pub max_bytes: u64,
    pub timeout: HumanDuration,
    /// The least role of a task owner whose task may fetch.
    pub min_role: Role,
}

impl Default for FetchUrlConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            allow: Vec::new(),
            allow_private: Vec::new(),
            proxy: String::new(),
            max_bytes: 256 * 1024,
            timeout: HumanDuration::from_secs(15),
            min_role: Role::User,
        }
    }
}

/// Tools that need the owner's consent before they run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Approval {
    /// `"all"`, `"none"`, or `"destructive"`: the tools the server annotates `destructiveHint`.
    Every(ApprovalWord),
    /// The tools named.
    Listed(Vec<String>),
}

impl<'de> Deserialize<'de> for Approval {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Word(String),
            Listed(Vec<String>),
        }
        let expected = "expected \"all\", \"none\", \"destructive\", or a list of tool names";
        match Given::deserialize(deserializer).map_err(|_| serde::de::Error::custom(expected))? {
            Given::Listed(names) => Ok(Self::Listed(names)),
            Given::Word(word) => match word.as_str() {
                "all" => Ok(Self::Every(ApprovalWord::All)),
                "none" => Ok(Self::Every(ApprovalWord::None)),
                "destructive" => Ok(Self::Every(ApprovalWord::Destructive)),
                other => Err(serde::de::Error::custom(format!("`{other}`: {expected}"))),
            },
        }
    }
}

impl Default for Approval {
    fn default() -> Self {
        Self::Every(ApprovalWord::Destructive)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalWord {
    All,
    None,
    Destructive,
}

impl Approval {
    /// Whether a call of `tool` waits for the owner's consent; `destructive` is the server's
    /// `destructiveHint` for it.
    pub fn needed(&self, tool: &str, destructive: bool) -> bool {
        match self {
            Self::Every(ApprovalWord::Destructive) => destructive,
            Self::Every(ApprovalWord::All) => true,
            Self::Every(ApprovalWord::None) => false,
            Self::Listed(names) => names.iter().any(|n| n == tool),
        }
    }
}

/// One MCP server: a program run over stdio (`command`), or a streamable HTTP endpoint (`url`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// Its tools are offered as `<name>__<tool>`.
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Variables set for the program; the worker's own environment is not passed on.
    pub env: BTreeMap<String, Secret>,
    /// The working directory of the program (the worker's when empty).
    pub cwd: String,
    pub url: String,
    pub headers: BTreeMap<String, Secret>,
    /// The least role of a task owner whose task may call its tools.
    pub min_role: Role,
    /// When not empty, only these of its tools are offered.
    pub allow: Vec<String>,
    /// These of its tools are never offered.
    pub deny: Vec<String>,
    /// Which calls wait for the owner's consent: a list of tool names, `"all"`, `"none"`, or
    /// (the default) the tools the server annotates `destructiveHint`.
    pub approval: Approval,
    /// Whose consent those calls wait for instead of the task's owner ("platform:user_id"),
    /// each asked in the task's group or in their own chat; empty: the owner's.
    pub approvers: Vec<String>,
    /// How many of `approvers` must approve: "all" (the default), "any" or a number. One
    /// denial ends it.
    pub approvals_needed: String,
    /// How long one call may take before the model is told it timed out.
    pub timeout: HumanDuration,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            command: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: String::new(),
            url: String::new(),
            headers: BTreeMap::new(),
            min_role: Role::User,
            allow: Vec::new(),
            deny: Vec::new(),
            approval: Approval::default(),
            approvers: Vec::new(),
            approvals_needed: "all".into(),
            timeout: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// Default deadline of a question.
    pub ask_timeout: HumanDuration,
    /// Default policy when a question expires.
    pub on_timeout: TimeoutPolicy,
    /// Remind the owner this long before a deadline (0 = no reminders).
    pub remind_before: HumanDuration,
    pub max_rounds: u32,
    /// Claims after lost leases before the task fails.
    pub max_attempts: u32,
    /// Bound on a task's total running time (0 = none).
    pub max_runtime: HumanDuration,
    /// How long a task may take from its creation, across all its questions and runs, unless
    /// its creation says otherwise (0 = no deadline).
    pub deadline: HumanDuration,
    /// What a task's deadline passing does to it when its creation does not say.
    pub on_deadline: DeadlinePolicy,
    /// How long a worker holds a task without a heartbeat.
    pub lease: HumanDuration,
    /// How long a finished task (with its rounds, questions and audit) is kept after it ended;
    /// then it is deleted. `0s`: kept forever.
    pub retention: HumanDuration,
    /// Tasks one owner may have that have not ended; more are refused. `0`: no limit.
    pub max_active_per_owner: u32,
    /// The IANA time zone scheduled tasks are read in (`--at`, `--cron`); empty: Asia/Shanghai on
    /// the `qq` platform, UTC elsewhere.
    pub timezone: String,
}

impl TaskConfig {
    /// The time zone of schedules made on `platform`.
    pub fn timezone_for(&self, platform: &str) -> &str {
        match (self.timezone.as_str(), platform) {
            ("", "qq") => "Asia/Shanghai",
            ("", _) => "UTC",
            (zone, _) => zone,
        }
    }
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            ask_timeout: HumanDuration::from_secs(600),
            on_timeout: TimeoutPolicy::Resume,
            remind_before: HumanDuration::ZERO,
            max_rounds: 30,
            max_attempts: 3,
            max_runtime: HumanDuration::ZERO,
            deadline: HumanDuration::ZERO,
            on_deadline: DeadlinePolicy::Fail,
            lease: HumanDuration::from_secs(30),
            retention: HumanDuration::from_secs(30 * 86_400),
            max_active_per_owner: 10,
            timezone: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PermissionConfig {
    pub admins: Vec<Owner>,
    pub users: Vec<Owner>,
    /// The role of everyone not listed.
    pub default_role: Role,
}

impl Default for PermissionConfig {
    fn default() -> Self {
        Self {
            admins: Vec::new(),
            users: Vec::new(),
            default_role: Role::User,
        }
    }
}

impl PermissionConfig {
    pub fn role_of(&self, owner: &Owner) -> Role {
        if self.admins.contains(owner) {
            Role::Admin
        } else if self.users.contains(owner) {
            Role::User
        } else {
            self.default_role
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatConfig {
    /// The command word; a message starting with it (or an alias) is a command, never an answer.
    pub command: String,
    pub command_aliases: Vec<String>,
    /// The language hark writes in chats: `zh`, `en`, or `auto`: `zh` on the `qq` platform and
    /// `en` elsewhere.
    pub language: ChatLanguage,
    /// Label put before a question's context in the chat; empty: the language's own
    /// (`[上下文]`, `[context]`).
    pub context_label: String,
    /// Commands one sender may give a minute (in bursts of as many); more are refused with one
    /// short notice. `0`: no limit.
    pub commands_per_minute: u32,
}

/// A language hark writes chat messages in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Zh,
    En,
}

/// The `chat.language` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatLanguage {
    /// Chinese on `qq`, English elsewhere.
    #[default]
    Auto,
    Zh,
    En,
}

impl ChatLanguage {
    /// The one language set, if any.
    pub fn fixed(self) -> Option<Language> {
        match self {
            ChatLanguage::Auto => None,
            ChatLanguage::Zh => Some(Language::Zh),
            ChatLanguage::En => Some(Language::En),
        }
    }
}

impl ChatConfig {
    /// The language of chats on `platform`: `chat.language`, or with `auto`, `zh` on `qq` and
    /// `en` elsewhere.
    pub fn language_for(&self, platform: &str) -> Language {
        Language::of(self.language.fixed(), platform)
    }
}

impl Language {
    /// `setting` when set, else `zh` on `qq` and `en` elsewhere.
    pub fn of(setting: Option<Language>, platform: &str) -> Language {
        setting.unwrap_or(if platform == "qq" {
            Language::Zh
        } else {
            Language::En
        })
    }
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            command: "/task".into(),
            command_aliases: vec!["/任务".into()],
            language: ChatLanguage::Auto,
            context_label: String::new(),
            commands_per_minute: 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter, e.g. `info` or `hark_control=debug,info`.
    pub filter: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            filter: "info".into(),
            format: "text".into(),
        }
    }
}

impl Config {
    /// Loads the file (when given) and applies the `HARK_…` overrides of this process's
    /// environment.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        Self::load_from(path, std::env::vars())
    }

    /// Like [`Config::load`], with the environment given explicitly.
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, Error> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let file = match path {
            Some(path) => Some(path.to_owned()),
            None => env
                .get(ENV_CONFIG_FILE)
                .filter(|p| !p.is_empty())
                .map(Into::into),
        };
        let text = match &file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.display().to_string(),
                source,
            })?),
            None => None,
        };
        let name = file.map_or_else(|| "<none>".to_owned(), |p| p.display().to_string());
        Self::from_parts(text.as_deref(), &name, &env)
    }

    /// Builds a config from TOML text (named `name` in errors) and environment overrides.
    pub fn from_parts(
        toml_text: Option<&str>,
        name: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let mut merged = toml::Table::try_from(Config::default()).map_err(|e| Error::Key {
            key: "<defaults>".into(),
            message: e.to_string(),
        })?;
        let defaults = merged.clone();
        if let Some(text) = toml_text {
            let file: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Syntax {
                path: name.to_owned(),
                message: e.to_string(),
            })?;
            merge(&mut merged, file);
        }
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            // Config keys always have a section (`HARK_TASK__MAX_ROUNDS`); other HARK_ variables
            // (HARK_CONFIG, HARK_FAILPOINT, HARK_TEST_…) are not configuration.
            if !rest.contains("__") {
                continue;
            }
            let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            apply_env(&mut merged, &defaults, &path, value).map_err(|message| Error::Env {
                var: var.clone(),
                message,
            })?;
        }
        read_files(&mut merged, Some(&defaults), &mut Vec::new())?;
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
                Error::Key {
                    key: e.path().to_string(),
                    message: e.into_inner().to_string(),
                }
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Every environment variable that sets a config key (`HARK_TASK__MAX_ROUNDS`, …).
    pub fn env_keys() -> Vec<String> {
        fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (key, value) in table {
                let name = format!("{prefix}{}", key.to_ascii_uppercase());
                match value {
                    toml::Value::Table(inner) if !inner.is_empty() => {
                        walk(&format!("{name}__"), inner, out)
                    }
                    _ => out.push(name),
                }
            }
        }
        let mut out = Vec::new();
        if let Ok(table) = toml::Table::try_from(Config::default()) {
            walk(ENV_PREFIX, &table, &mut out);
        }
        out
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |key: &str, message: String| {
            Err(Error::Key {
                key: key.into(),
                message,
            })
        };
        if let Err(e) = self.nats.namespace.parse::<Namespace>() {
            return bad("nats.namespace", e.to_string());
        }
        let nats_url = self.nats.url.expose();
        if !nats_url.contains("://") && !nats_url.contains(':') {
            return bad(
                "nats.url",
                format!(
                    "`{}` is not a NATS URL: expected e.g. nats://127.0.0.1:4222",
                    redact_url(nats_url)
                ),
            );
        }
        if !(1..=5).contains(&self.nats.replicas) {
            return bad(
                "nats.replicas",
                format!(
                    "{} copies of a stream: JetStream keeps 1 to 5; use 1 on a single nats-server, 3 on a three-node cluster",
                    self.nats.replicas
                ),
            );
        }
        if !(1..=64).contains(&self.nats.partitions) {
            return bad(
                "nats.partitions",
                format!(
                    "{} streams for run jobs: use 1 to 64; 1 unless a cluster's leaders should spread over its servers",
                    self.nats.partitions
                ),
            );
        }
        let database_url = self.database.url.expose();
        if !(database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")) {
            return bad(
                "database.url",
                format!(
                    "`{}` is not a Postgres URL: expected e.g. postgres://postgres@127.0.0.1:5432/hark",
                    redact_url(database_url)
                ),
            );
        }
        let idle = self.gateway.onebot.idle_timeout.0;
        if !idle.is_zero() && idle < std::time::Duration::from_secs(3) {
            return bad(
                "gateway.onebot.idle_timeout",
                "must be at least 3s (pings go out every third of it), or 0s for never".into(),
            );
        }
        let hold = self.mcp.hold.0;
        if hold < std::time::Duration::from_secs(1) || hold > std::time::Duration::from_secs(300) {
            return bad(
                "mcp.hold",
                "must be between 1s and 5m: keep it under the time your MCP clients give a call \
                 (60s for most)"
                    .into(),
            );
        }
        let retention = self.task.retention.0;
        if !retention.is_zero() && retention < std::time::Duration::from_secs(3600) {
            return bad(
                "task.retention",
                "must be at least 1h (finished tasks are kept that long), or 0s to keep them forever"
                    .into(),
            );
        }
        if self.database.max_connections == 0 {
            return bad("database.max_connections", "must be at least 1".into());
        }
        self.validate_tools()?;
        let url = &self.llm.base_url;
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return bad(
                "llm.base_url",
                format!(
                    "`{}` is not an HTTP URL: expected e.g. https://api.deepseek.com/v1, or empty for the demo model",
                    self.llm.base_url
                ),
            );
        }
        if self.task.max_rounds == 0 {
            return bad("task.max_rounds", "must be at least 1".into());
        }
        if self.task.max_attempts == 0 {
            return bad("task.max_attempts", "must be at least 1".into());
        }
        if self.task.lease.0.as_millis() < 1000 {
            return bad("task.lease", "must be at least 1s".into());
        }
        if self.task.ask_timeout.is_zero() && self.task.on_timeout != TimeoutPolicy::Never {
            return bad(
                "task.ask_timeout",
                "must be more than 0 (to let questions wait forever, set task.on_timeout = \"never\")".into(),
            );
        }
        if self.worker.concurrency == 0 {
            return bad("worker.concurrency", "must be at least 1".into());
        }
        for url in &self.gateway.onebot.forward {
            if !(url.starts_with("ws://") || url.starts_with("wss://")) {
                return bad(
                    "gateway.onebot.forward",
                    format!("`{url}` is not a WebSocket URL: expected e.g. ws://127.0.0.1:3001"),
                );
            }
        }
        for (id, bot) in &self.gateway.onebot.bots {
            let key = format!(
                "gateway.onebot.bots.{}.access_token",
                crate::domain::ids::shown(id)
            );
            if let Err(e) = crate::domain::ids::bot_id("the bot's account id", id) {
                return bad(
                    &key,
                    format!("{e}: name the bot by its account id (X-Self-ID)"),
                );
            }
            if bot.access_token.is_empty() {
                return bad(
                    &key,
                    "is empty: give the bot a token of its own, or remove its section to use \
                     gateway.onebot.access_token"
                        .into(),
                );
            }
        }
        if self.control.max_watchers_per_connection == 0 || self.control.max_watchers_per_token == 0
        {
            return bad(
                "control.max_watchers_per_connection",
                "must be at least 1 (as must control.max_watchers_per_token)".into(),
            );
        }
        if self.gateway.forget_bot_after.0 < std::time::Duration::from_secs(1) {
            return bad("gateway.forget_bot_after", "must be at least 1s".into());
        }
        if self.gateway.rate_limit == 0 {
            return bad("gateway.rate_limit", "must be at least 1".into());
        }
        if self.gateway.spool_max_bytes < 2 * self.gateway.max_frame_bytes {
            return bad(
                "gateway.spool_max_bytes",
                "must hold at least two of the largest frames (2 × gateway.max_frame_bytes)".into(),
            );
        }
        if self.gateway.max_frame_bytes < 1024 {
            return bad("gateway.max_frame_bytes", "must be at least 1024".into());
        }
        if self.chat.command.trim().is_empty() || self.chat.command.contains(char::is_whitespace) {
            return bad("chat.command", "must be one word, e.g. /task".into());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&self.log.filter) {
            return bad(
                "log.filter",
                format!(
                    "`{}` is not a log filter ({e}): expected e.g. info, or hark_control=debug,info",
                    crate::domain::ids::shown(&self.log.filter)
                ),
            );
        }
        self.validate_http_adapter()?;
        self.validate_langbot()?;
        self.validate_satori()?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad(
                "log.format",
                format!("`{}`: expected text or json", self.log.format),
            );
        }
        Ok(())
    }
}

impl GatewayConfig {
    /// The spool directory: `spool_dir`, or the default under the user's state directory, one
    /// per listening port so that gateways on one host do not share it.
    pub fn spool_path(&self) -> std::path::PathBuf {
        if !self.spool_dir.is_empty() {
            return self.spool_dir.clone().into();
        }
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|home| std::path::PathBuf::from(home).join(".local/state"))
            })
            .unwrap_or_else(|| ".".into());
        state
            .join("hark")
            .join(format!("spool-{}", self.listen.port()))
    }
}

impl Config {
    /// The HTTP adapter speaks only for its own platforms, never for one another adapter serves,
    /// and delivers only for bots of those platforms.
    fn validate_tools(&self) -> Result<(), Error> {
        let bad = |key: String, message: String| Err(Error::Key { key, message });
        let fetch = &self.tools.fetch_url;
        if fetch.enabled && fetch.allow.is_empty() {
            return bad(
                "tools.fetch_url.allow".into(),
                "is empty while tools.fetch_url.enabled is true: list the hosts it may fetch \
                 from (`example.com`, `*.example.com`, or `*` for any public host)"
                    .into(),
            );
        }
        if fetch.max_bytes == 0 {
            return bad(
                "tools.fetch_url.max_bytes".into(),
                "must be at least 1".into(),
            );
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, server) in self.tools.mcp.iter().enumerate() {
            let key = |k: &str| format!("tools.mcp[{i}].{k}");
            let name = server.name.as_str();
            if name.is_empty()
                || name.len() > 24
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                || name.contains("__")
            {
                return bad(
                    key("name"),
                    format!(
                        "`{name}` is not a server name: use 1 to 24 letters, digits, `-` or `_` \
                         (no `__`); its tools are offered as `<name>__<tool>`"
                    ),
                );
            }
            if names.contains(&name) {
                return bad(key("name"), format!("`{name}` names an earlier server too"));
            }
            for approver in &server.approvers {
                if let Err(e) = approver.parse::<crate::domain::Owner>() {
                    return bad(
                        key("approvers"),
                        format!(
                            "`{approver}` is not a person (platform:user_id, e.g. qq:10001): {e}"
                        ),
                    );
                }
            }
            if let Err(e) = server.approvals_needed.parse::<crate::domain::Need>() {
                return bad(key("approvals_needed"), e);
            }
            names.push(name);
            match (
                server.command.trim().is_empty(),
                server.url.trim().is_empty(),
            ) {
                (true, true) => {
                    return bad(
                        key("command"),
                        format!(
                            "server `{name}` has neither `command` (run over stdio) nor `url` \
                             (streamable HTTP): set one"
                        ),
                    );
                }
                (false, false) => {
                    return bad(
                        key("url"),
                        format!("server `{name}` has both `command` and `url`: keep one"),
                    );
                }
                (true, false)
                    if !(server.url.starts_with("http://")
                        || server.url.starts_with("https://")) =>
                {
                    return bad(
                        key("url"),
                        format!(
                            "`{}` is not an HTTP URL: expected e.g. http://127.0.0.1:3001/mcp",
                            redact_url(&server.url)
                        ),
                    );
                }
                _ => {}
            }
            if server.timeout.0 < std::time::Duration::from_secs(1) {
                return bad(key("timeout"), "must be at least 1s".into());
            }
        }
        Ok(())
    }

    fn validate_satori(&self) -> Result<(), Error> {
        let satori = &self.gateway.satori;
        if satori.url.is_empty() {
            return Ok(());
        }
        let bad = |message: String| {
            Err(Error::Key {
                key: "gateway.satori.url".into(),
                message,
            })
        };
        let Some(rest) = satori
            .url
            .strip_prefix("http://")
            .or_else(|| satori.url.strip_prefix("https://"))
        else {
            return bad(format!(
                "`{}`: expected the server's HTTP address, e.g. http://127.0.0.1:5140",
                crate::secret::redact_url(&satori.url)
            ));
        };
        let host = rest.split(['/', '?']).next().unwrap_or_default();
        if !loopback_host(host) && satori.token.is_empty() {
            return Err(Error::Key {
                key: "gateway.satori.token".into(),
                message: format!(
                    "the Satori server at {} is beyond loopback, but gateway.satori.token is empty: \
                     anyone on the way could read and speak for its chats. Set the server's token \
                     (HARK_GATEWAY__SATORI__TOKEN)",
                    crate::secret::redact_url(&satori.url)
                ),
            });
        }
        Ok(())
    }

    fn validate_langbot(&self) -> Result<(), Error> {
        let langbot = &self.gateway.langbot;
        let bad = |key: &str, message: String| {
            Err(Error::Key {
                key: key.into(),
                message,
            })
        };
        for bot in &langbot.bots {
            let Some((platform, id)) = bot
                .split_once(':')
                .filter(|(p, b)| !p.is_empty() && !b.is_empty())
            else {
                return bad(
                    "gateway.langbot.bots",
                    format!("`{bot}`: expected platform:bot_uuid, e.g. langbot-qq:4b1c0f7e"),
                );
            };
            if Owner::new(platform, "x").is_err() {
                return bad(
                    "gateway.langbot.bots",
                    format!(
                        "`{}` is not a platform name: expected a-z, 0-9, _ or -, e.g. langbot-qq",
                        crate::domain::ids::shown(platform)
                    ),
                );
            }
            if *platform == self.gateway.onebot.platform
                || self.gateway.http.platforms.iter().any(|p| p == platform)
            {
                return bad(
                    "gateway.langbot.bots",
                    format!(
                        "`{platform}` is the platform of another door (gateway.onebot.platform or \
                         gateway.http.platforms): LangBot's chats need a platform name of their own"
                    ),
                );
            }
            if crate::bus::token(id).is_err() {
                return bad(
                    "gateway.langbot.bots",
                    format!("`{bot}`: the bot uuid must not hold '.', '*', '>' or spaces"),
                );
            }
        }
        let reachable = langbot.url.starts_with("http://") || langbot.url.starts_with("https://");
        if !langbot.bots.is_empty() && !reachable {
            return bad(
                "gateway.langbot.url",
                "LangBot's webhook is on (gateway.langbot.bots), but hark cannot reply without \
                 LangBot's HTTP API: set gateway.langbot.url, e.g. http://127.0.0.1:5300"
                    .into(),
            );
        }
        Ok(())
    }

    fn validate_http_adapter(&self) -> Result<(), Error> {
        let http = &self.gateway.http;
        let bad = |key: &str, message: String| {
            Err(Error::Key {
                key: key.into(),
                message,
            })
        };
        for platform in &http.platforms {
            if Owner::new(platform, "x").is_err() {
                return bad(
                    "gateway.http.platforms",
                    format!(
                        "`{}` is not a platform name: expected a-z, 0-9, _ or -, e.g. myapp",
                        crate::domain::ids::shown(platform)
                    ),
                );
            }
            if *platform == self.gateway.onebot.platform {
                return bad(
                    "gateway.http.platforms",
                    format!(
                        "`{platform}` is the platform of OneBot bots (gateway.onebot.platform): the HTTP \
                         adapter must not speak for their users; pick another name for your app"
                    ),
                );
            }
        }
        for bot in &http.bots {
            let Some((platform, id)) = bot
                .split_once(':')
                .filter(|(p, b)| !p.is_empty() && !b.is_empty())
            else {
                return bad(
                    "gateway.http.bots",
                    format!("`{bot}`: expected platform:bot_id, e.g. myapp:main"),
                );
            };
            if !http.platforms.iter().any(|p| p == platform) {
                return bad(
                    "gateway.http.bots",
                    format!(
                        "`{platform}:{id}`: the platform `{platform}` is not in gateway.http.platforms, \
                         so the HTTP adapter does not serve it; add it there"
                    ),
                );
            }
        }
        if http.platforms.is_empty() && !http.webhook_url.is_empty() {
            return bad(
                "gateway.http.webhook_url",
                "the HTTP adapter is off (gateway.http.platforms is empty); set its platforms to turn it on"
                    .into(),
            );
        }
        Ok(())
    }

    /// Refuses a gateway that would let strangers in: on an address beyond loopback, every
    /// adapter it serves needs its token.
    pub fn check_gateway_exposure(&self) -> Result<(), Error> {
        let addr = self.gateway.listen;
        if addr.ip().is_loopback() {
            return Ok(());
        }
        // Bots with tokens of their own are the only ones that connect when there is no shared
        // token.
        if self.gateway.onebot.access_token.is_empty() && self.gateway.onebot.bots.is_empty() {
            return Err(Error::Key {
                key: "gateway.onebot.access_token".into(),
                message: format!(
                    "gateway.listen = {addr} is reachable from other hosts, but no access token is set, \
                     so anyone could connect as a bot and speak for its users. Set \
                     gateway.onebot.access_token (HARK_GATEWAY__ONEBOT__ACCESS_TOKEN) and give the \
                     same token to the bot, or listen on 127.0.0.1"
                ),
            });
        }
        strong(
            "gateway.onebot.access_token",
            &self.gateway.onebot.access_token,
            addr,
        )?;
        for (id, bot) in &self.gateway.onebot.bots {
            strong(
                &format!("gateway.onebot.bots.{id}.access_token"),
                &bot.access_token,
                addr,
            )?;
        }
        strong("gateway.http.token", &self.gateway.http.token, addr)?;
        strong("metrics.token", &self.metrics.token, addr)?;
        strong("gateway.langbot.token", &self.gateway.langbot.token, addr)?;
        if !self.gateway.langbot.bots.is_empty() && self.gateway.langbot.token.is_empty() {
            return Err(Error::Key {
                key: "gateway.langbot.token".into(),
                message: format!(
                    "gateway.listen = {addr} is reachable from other hosts and LangBot's webhook is on \
                     (gateway.langbot.bots), but it has no token, so anyone could post messages as \
                     any user. Set gateway.langbot.token (HARK_GATEWAY__LANGBOT__TOKEN) and end the \
                     webhook's URL in LangBot with ?token=<it>, or listen on 127.0.0.1"
                ),
            });
        }
        if !self.gateway.http.platforms.is_empty() && self.gateway.http.token.is_empty() {
            return Err(Error::Key {
                key: "gateway.http.token".into(),
                message: format!(
                    "gateway.listen = {addr} is reachable from other hosts and the HTTP adapter is on \
                     (gateway.http.platforms), but it has no token, so anyone could post messages as \
                     any user. Set gateway.http.token (HARK_GATEWAY__HTTP__TOKEN), or listen on 127.0.0.1"
                ),
            });
        }
        Ok(())
    }

    /// Refuses a task-control whose API would be open to strangers: on an address beyond
    /// loopback it needs tokens, unless the operator opts out explicitly.
    pub fn check_control_exposure(&self) -> Result<(), Error> {
        let addr = self.control.grpc_listen;
        if !addr.ip().is_loopback() {
            for token in &self.control.api_tokens {
                strong("control.api_tokens", token, addr)?;
            }
        }
        if self.api_guarded(addr) {
            return Ok(());
        }
        Err(Error::Key {
            key: "control.api_tokens".into(),
            message: format!(
                "control.grpc_listen = {addr} is reachable from other hosts, but control.api_tokens is \
                 empty, so anyone could create, answer and cancel tasks. Set control.api_tokens \
                 (HARK_CONTROL__API_TOKENS), listen on 127.0.0.1, or set \
                 control.allow_unauthenticated = true to serve it open on purpose"
            ),
        })
    }

    /// Whether task-control's API may listen on `addr`: on loopback, with `control.api_tokens`,
    /// or with `control.allow_unauthenticated`.
    fn api_guarded(&self, addr: SocketAddr) -> bool {
        addr.ip().is_loopback()
            || self.control.allow_unauthenticated
            || self.control.api_tokens.iter().any(|t| !t.is_empty())
    }

    /// The web console's address, `None` when there is none. Beyond loopback it needs
    /// `control.api_tokens`: `control.allow_unauthenticated` opens the gRPC API behind a proxy
    /// that authenticates, never the console, whose pages a browser would serve to anyone.
    pub fn console_listen(&self) -> Result<Option<SocketAddr>, Error> {
        let Some(addr) = optional_listen(
            "control.http_listen",
            &self.control.http_listen,
            "127.0.0.1:8081",
            "no web console",
        )?
        else {
            return Ok(None);
        };
        if addr.ip().is_loopback() {
            return Ok(Some(addr));
        }
        if self.control.api_tokens.iter().any(|t| !t.is_empty()) {
            for token in &self.control.api_tokens {
                strong("control.api_tokens", token, addr)?;
            }
            return Ok(Some(addr));
        }
        Err(Error::Key {
            key: "control.api_tokens".into(),
            message: format!(
                "control.http_listen = {addr} is reachable from other hosts, but \
                 control.api_tokens is empty, so anyone could answer and cancel tasks in the web \
                 console (control.allow_unauthenticated does not open the console). Set \
                 control.api_tokens (HARK_CONTROL__API_TOKENS), listen on 127.0.0.1, or leave \
                 control.http_listen empty for no console"
            ),
        })
    }

    /// The metrics listener's address, `None` when there is none. Refuses an address beyond
    /// loopback without `metrics.token`.
    pub fn metrics_listen(&self) -> Result<Option<SocketAddr>, Error> {
        let Some(addr) = optional_listen(
            "metrics.listen",
            &self.metrics.listen,
            "127.0.0.1:9464",
            "no metrics listener",
        )?
        else {
            return Ok(None);
        };
        strong("metrics.token", &self.metrics.token, addr)?;
        if !addr.ip().is_loopback() && self.metrics.token.is_empty() {
            return Err(Error::Key {
                key: "metrics.token".into(),
                message: format!(
                    "metrics.listen = {addr} is reachable from other hosts, but metrics.token is \
                     empty. Set metrics.token (HARK_METRICS__TOKEN) and give it to the scraper as \
                     a bearer token, or listen on 127.0.0.1"
                ),
            });
        }
        Ok(Some(addr))
    }

    /// This configuration as it may be shown to people: every secret replaced by `[redacted]`
    /// (empty ones stay empty, so that "not set" shows) and the database password by `***`.
    pub fn redacted(&self) -> Self {
        let mut shown = self.clone();
        shown.database.url = Secret::new(redact_url(self.database.url.expose()));
        shown.nats.url = Secret::new(redact_url(self.nats.url.expose()));
        shown.llm.api_key = self.llm.api_key.redacted();
        shown.gateway.onebot.access_token = self.gateway.onebot.access_token.redacted();
        shown.gateway.http.token = self.gateway.http.token.redacted();
        shown.gateway.http.webhook_url = redact_url(&self.gateway.http.webhook_url);
        for (id, bot) in &mut shown.gateway.onebot.bots {
            bot.access_token = self.gateway.onebot.bots[id].access_token.redacted();
        }
        for url in &mut shown.gateway.onebot.forward {
            *url = redact_url(url);
        }
        shown.llm.base_url = redact_url(&self.llm.base_url);
        shown.telemetry.endpoint = redact_url(&self.telemetry.endpoint);
        shown.metrics.token = self.metrics.token.redacted();
        for server in &mut shown.tools.mcp {
            for value in server.env.values_mut().chain(server.headers.values_mut()) {
                *value = value.redacted();
            }
            server.url = redact_url(&server.url);
        }
        shown.control.api_tokens = self
            .control
            .api_tokens
            .iter()
            .map(Secret::redacted)
            .collect();
        shown
    }
}

/// The fewest characters a token may have where strangers can reach it: 128 bits as base64 (a
/// hex token needs 32).
pub const MIN_TOKEN_CHARS: usize = 22;

/// Refuses a token that guards `addr`, reachable from other hosts, and is too short to hold 128
/// bits. An empty one is left to the caller (some are optional), and loopback takes any.
fn strong(key: &str, token: &Secret, addr: SocketAddr) -> Result<(), Error> {
    let chars = token.expose().chars().count();
    if addr.ip().is_loopback() || token.is_empty() || chars >= MIN_TOKEN_CHARS {
        return Ok(());
    }
    Err(Error::Key {
        key: key.into(),
        message: format!(
            "it guards {addr}, which is reachable from other hosts, but it has {chars} characters, \
             too few to resist guessing: give it at least {MIN_TOKEN_CHARS} random characters \
             (e.g. the output of `openssl rand -hex 16`), or listen on 127.0.0.1"
        ),
    })
}

/// Listen addresses, with an error that shows what one looks like.
mod listen_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(addr: &SocketAddr, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(addr)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.trim().parse().map_err(|_| {
            serde::de::Error::custom(format!(
                "`{}` is not a listen address: expected host:port, e.g. 127.0.0.1:8080 (this host \
                 only) or 0.0.0.0:8080 (every interface)",
                crate::domain::ids::shown(&text)
            ))
        })
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Sets one overridden key, reading `value` as the type the key already has.
/// The suffix of a key that names a file holding the key's value (`metrics.token_file`).
const FILE_SUFFIX: &str = "_file";

/// Replaces every `<key>_file = "<path>"` with `<key>` set to what the file holds (its trailing
/// line break left out; for a list, one value a line), as Kubernetes mounts secrets: a secret
/// read from a file is in no process's environment. `defaults` is the same table in the defaults,
/// `None` below a map.
fn read_files(
    table: &mut toml::Table,
    defaults: Option<&toml::Table>,
    path: &mut Vec<String>,
) -> Result<(), Error> {
    let keys: Vec<String> = table.keys().cloned().collect();
    for key in keys {
        let default = defaults.and_then(|d| d.get(&key));
        if let Some(toml::Value::Table(inner)) = table.get_mut(&key) {
            // `llm.extra_body` is the model's JSON, whatever its keys are called.
            if key == "extra_body" {
                continue;
            }
            path.push(key.clone());
            let inner_defaults = default
                .and_then(toml::Value::as_table)
                .filter(|d| !d.is_empty());
            read_files(inner, inner_defaults, path)?;
            path.pop();
            continue;
        }
        let Some(target) = key.strip_suffix(FILE_SUFFIX) else {
            continue;
        };
        let target_default = defaults.map(|d| d.get(target));
        let is_list = match target_default {
            // A key of a section: only one that takes text or a list of texts.
            Some(Some(toml::Value::String(_))) => false,
            Some(Some(toml::Value::Array(_))) => true,
            Some(_) => continue,
            // Below a map, where keys are the user's.
            None => false,
        };
        let named = [path.as_slice(), std::slice::from_ref(&key)]
            .concat()
            .join(".");
        let Some(toml::Value::String(file)) = table.get(&key).cloned() else {
            return Err(Error::Key {
                key: named,
                message: "expected the path of a file, as text".into(),
            });
        };
        if let Some(given) = table.get(target)
            && target_default.flatten() != Some(given)
        {
            return Err(Error::Key {
                key: named,
                message: format!("`{target}` is set too: set either {target} or {key}, not both"),
            });
        }
        let text = std::fs::read_to_string(&file).map_err(|e| Error::Key {
            key: named.clone(),
            message: format!(
                "cannot read `{file}`: {e}; give the path of a file that holds the value (a \
                 mounted Kubernetes Secret, say)"
            ),
        })?;
        let text = text.trim_end_matches(['\n', '\r']);
        let value = if is_list {
            toml::Value::Array(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| toml::Value::String(l.to_owned()))
                    .collect(),
            )
        } else {
            toml::Value::String(text.to_owned())
        };
        table.remove(&key);
        table.insert(target.to_owned(), value);
    }
    Ok(())
}

fn apply_env(
    table: &mut toml::Table,
    defaults: &toml::Table,
    path: &[String],
    value: &str,
) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty key")?;
    let mut cursor = table;
    let mut walked = Vec::new();
    // Below a map (a table empty by default, such as `gateway.onebot.bots`), sections and keys
    // are named by the user; the keys they hold are then checked when the config is read.
    let mut default = Some(defaults);
    let mut in_map = false;
    for part in parents {
        walked.push(part.as_str());
        if in_map && !cursor.contains_key(part) {
            cursor.insert(part.clone(), toml::Value::Table(toml::Table::new()));
        }
        default = default
            .and_then(|d| d.get(part))
            .and_then(toml::Value::as_table);
        in_map = in_map || default.is_some_and(toml::Table::is_empty);
        cursor = match cursor.get_mut(part) {
            Some(toml::Value::Table(t)) => t,
            _ => return Err(format!("there is no config section `{}`", walked.join("."))),
        };
    }
    let key = path.join(".");
    let parsed = match cursor.get(last) {
        None if in_map => toml::Value::String(value.to_owned()),
        // `<key>_file`: read in `read_files`.
        None if last
            .strip_suffix(FILE_SUFFIX)
            .is_some_and(|key| cursor.contains_key(key)) =>
        {
            toml::Value::String(value.to_owned())
        }
        None => return Err(format!("there is no config key `{key}`")),
        Some(toml::Value::String(_)) => toml::Value::String(value.to_owned()),
        Some(toml::Value::Integer(_)) => value
            .trim()
            .parse()
            .map(toml::Value::Integer)
            .map_err(|_| format!("`{value}` is not a whole number (for `{key}`)"))?,
        Some(toml::Value::Float(_)) => value
            .trim()
            .parse()
            .map(toml::Value::Float)
            .map_err(|_| format!("`{value}` is not a number (for `{key}`)"))?,
        Some(toml::Value::Boolean(_)) => match value.trim() {
            "true" | "1" | "yes" => toml::Value::Boolean(true),
            "false" | "0" | "no" => toml::Value::Boolean(false),
            _ => return Err(format!("`{value}` is not true or false (for `{key}`)")),
        },
        Some(toml::Value::Array(_)) => toml::Value::Array(
            value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        ),
        Some(toml::Value::Table(_)) => {
            let wrapped = format!("v = {value}");
            let parsed: toml::Table = wrapped.parse().map_err(|_| {
                format!("`{key}` is a table: give it as an inline TOML table, e.g. {{ a = 1 }}")
            })?;
            parsed.get("v").cloned().ok_or("empty value")?
        }
        Some(toml::Value::Datetime(_)) => {
            return Err(format!("`{key}` cannot be set from the environment"));
        }
    };
    cursor.insert(last.clone(), parsed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_a_local_machine() {
        let config = Config::from_parts(None, "<none>", &BTreeMap::new()).expect("defaults load");
        assert_eq!(config.nats.url.expose(), "nats://127.0.0.1:4222");
        assert_eq!(config.nats.namespace, "hark");
        assert_eq!(
            config.database.url.expose(),
            "postgres://postgres@127.0.0.1:5432/hark"
        );
        assert_eq!(config.task.ask_timeout, HumanDuration::from_secs(600));
        assert_eq!(config.task.max_rounds, 30);
        assert_eq!(config.task.max_attempts, 3);
        assert_eq!(config.permission.default_role, Role::User);
        assert_eq!(config.gateway.rate_limit, 50);
    }

    #[test]
    fn mcp_servers_load_with_their_approval_and_are_checked() {
        let text = r#"
            [[tools.mcp]]
            name = "files"
            command = "npx"
            args = ["-y", "some-server"]
            env = { API_KEY = "TopSecret" }
            approval = ["delete"]
            min_role = "admin"

            [[tools.mcp]]
            name = "web"
            url = "http://127.0.0.1:3001/mcp"
            headers = { Authorization = "Bearer TopSecret" }
            approval = "all"
            timeout = "10s"
        "#;
        let config = Config::from_parts(Some(text), "f", &BTreeMap::new()).expect("loads");
        let [files, web] = &config.tools.mcp[..] else {
            panic!("two servers: {:?}", config.tools.mcp)
        };
        assert_eq!(files.min_role, Role::Admin);
        assert!(files.approval.needed("delete", false));
        assert!(!files.approval.needed("read", true));
        assert!(web.approval.needed("anything", false));
        assert_eq!(web.timeout, HumanDuration::from_secs(10));
        assert_eq!(web.min_role, Role::User);
        let default = McpServerConfig::default().approval;
        assert!(default.needed("x", true) && !default.needed("x", false));
        let shown = toml::to_string(&config.redacted()).expect("toml");
        assert!(!shown.contains("TopSecret"), "{shown}");

        for (text, key, says) in [
            (
                "[[tools.mcp]]\nname = \"a__b\"\ncommand = \"x\"",
                "tools.mcp[0].name",
                "no `__`",
            ),
            (
                "[[tools.mcp]]\nname = \"a\"",
                "tools.mcp[0].command",
                "neither",
            ),
            (
                "[[tools.mcp]]\nname = \"a\"\ncommand = \"x\"\nurl = \"http://h/\"",
                "tools.mcp[0].url",
                "both",
            ),
            (
                "[[tools.mcp]]\nname = \"a\"\nurl = \"ftp://h/\"",
                "tools.mcp[0].url",
                "not an HTTP URL",
            ),
            (
                "[[tools.mcp]]\nname = \"a\"\ncommand = \"x\"\n[[tools.mcp]]\nname = \"a\"\ncommand = \"y\"",
                "tools.mcp[1].name",
                "earlier server",
            ),
            (
                "[[tools.mcp]]\nname = \"a\"\ncommand = \"x\"\napproval = \"some\"",
                "tools.mcp[0].approval",
                "`some`: expected \"all\", \"none\", \"destructive\", or a list of tool names",
            ),
        ] {
            let err = Config::from_parts(Some(text), "f", &BTreeMap::new()).unwrap_err();
            let shown = err.to_string();
            assert!(
                shown.contains(key) && shown.contains(says),
                "{text}: {shown}"
            );
        }
    }

    #[test]
    fn a_bot_gets_a_token_of_its_own_from_the_file_or_the_environment_and_it_is_never_shown() {
        let text = "[gateway.onebot.bots.111]\naccess_token = \"from-file\"";
        let config = Config::from_parts(
            Some(text),
            "hark.toml",
            &env(&[("HARK_GATEWAY__ONEBOT__BOTS__222__ACCESS_TOKEN", "from-env")]),
        )
        .expect("config loads");
        let bots = &config.gateway.onebot.bots;
        assert_eq!(bots["111"].access_token.expose(), "from-file");
        assert_eq!(bots["222"].access_token.expose(), "from-env");
        let shown = toml::to_string(&config.redacted()).expect("toml");
        assert!(
            !shown.contains("from-file") && !shown.contains("from-env"),
            "{shown}"
        );
        // A misspelt key below a bot is still refused, naming it; so is a bot without a token.
        let err = Config::from_parts(
            None,
            "f",
            &env(&[("HARK_GATEWAY__ONEBOT__BOTS__222__ACESS_TOKEN", "x")]),
        )
        .expect_err("unknown key")
        .to_string();
        assert!(err.contains("acess_token"), "{err}");
        let err = Config::from_parts(Some("[gateway.onebot.bots.333]"), "f", &env(&[]))
            .expect_err("no token")
            .to_string();
        assert!(
            err.contains("gateway.onebot.bots.333.access_token"),
            "{err}"
        );
    }

    #[test]
    fn a_secret_is_read_from_the_file_its_key_file_names() {
        let dir = std::env::temp_dir().join(format!("hark-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            path.display().to_string()
        };
        let token = write("token", "from-a-file\n");
        let tokens = write("tokens", "first\nsecond\n");
        let bot = write("bot", "bot-own");
        let text = format!(
            "[metrics]\ntoken_file = \"{token}\"\n[gateway.onebot.bots.42]\naccess_token_file = \"{bot}\"\n"
        );
        let config = Config::from_parts(
            Some(&text),
            "hark.toml",
            &env(&[
                ("HARK_CONTROL__API_TOKENS_FILE", &tokens),
                ("HARK_LLM__API_KEY_FILE", &token),
            ]),
        )
        .expect("config loads");
        assert_eq!(config.metrics.token.expose(), "from-a-file");
        assert_eq!(config.llm.api_key.expose(), "from-a-file");
        assert_eq!(
            config
                .control
                .api_tokens
                .iter()
                .map(Secret::expose)
                .collect::<Vec<_>>(),
            ["first", "second"]
        );
        assert_eq!(
            config.gateway.onebot.bots["42"].access_token.expose(),
            "bot-own"
        );
        // A file that cannot be read names its key and what to do; both forms at once are refused.
        let err = Config::from_parts(
            None,
            "f",
            &env(&[("HARK_METRICS__TOKEN_FILE", "/nonexistent/hark-token")]),
        )
        .expect_err("no such file")
        .to_string();
        assert!(
            err.contains("metrics.token_file") && err.contains("/nonexistent/hark-token"),
            "{err}"
        );
        let err = Config::from_parts(
            None,
            "f",
            &env(&[
                ("HARK_METRICS__TOKEN_FILE", &token),
                ("HARK_METRICS__TOKEN", "x"),
            ]),
        )
        .expect_err("both")
        .to_string();
        assert!(err.contains("not both"), "{err}");
        // A key that takes no text has no file form.
        assert!(
            Config::from_parts(None, "f", &env(&[("HARK_TASK__MAX_ROUNDS_FILE", &token)])).is_err()
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn every_url_that_carries_a_credential_is_redacted_when_the_config_is_shown() {
        let config = Config::from_parts(
            None,
            "f",
            &env(&[
                ("HARK_NATS__URL", "nats://s3cr3t@127.0.0.1:4222"),
                ("HARK_GATEWAY__HTTP__PLATFORMS", "myapp"),
                ("HARK_GATEWAY__HTTP__BOTS", "myapp:1"),
                (
                    "HARK_GATEWAY__HTTP__WEBHOOK_URL",
                    "https://h/in?token=s3cr3t",
                ),
                (
                    "HARK_GATEWAY__ONEBOT__FORWARD",
                    "ws://n:3001/?access_token=s3cr3t",
                ),
                ("HARK_LLM__BASE_URL", "https://u:s3cr3t@llm/v1"),
                ("HARK_TELEMETRY__ENDPOINT", "http://u:s3cr3t@otel:4317"),
                ("HARK_DATABASE__URL", "postgres://u:s3/cr?3t@db/hark"),
            ]),
        )
        .expect("config loads");
        let shown = toml::to_string(&config.redacted()).expect("toml");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("cr?3t"),
            "{shown}"
        );
        assert!(shown.contains("nats://***@127.0.0.1:4222"), "{shown}");
    }

    #[test]
    fn the_file_then_the_environment_override_defaults() {
        let text = r#"
            [task]
            max_rounds = 12
            ask_timeout = "2m"
            [permission]
            admins = ["qq:10001"]
            [gateway.onebot]
            access_token = "from-file"
        "#;
        let config = Config::from_parts(
            Some(text),
            "hark.toml",
            &env(&[
                ("HARK_TASK__MAX_ROUNDS", "50"),
                ("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "12345"),
                ("HARK_PERMISSION__USERS", "qq:1, qq:2"),
                (
                    "HARK_LLM__EXTRA_BODY",
                    "{ thinking = { type = \"enabled\" } }",
                ),
                ("PATH", "/usr/bin"),
            ]),
        )
        .expect("config loads");
        assert_eq!(config.task.max_rounds, 50);
        assert_eq!(config.task.ask_timeout, HumanDuration::from_secs(120));
        assert_eq!(config.gateway.onebot.access_token.expose(), "12345");
        assert_eq!(config.permission.users.len(), 2);
        assert_eq!(
            config
                .permission
                .role_of(&"qq:10001".parse().expect("owner")),
            Role::Admin
        );
        assert_eq!(
            config.permission.role_of(&"qq:2".parse().expect("owner")),
            Role::User
        );
        assert!(config.llm.extra_body.contains_key("thinking"));
    }

    #[test]
    fn a_bad_value_names_its_key_and_what_was_expected() {
        let err = Config::from_parts(Some("[task]\nmax_rounds = \"many\""), "f", &BTreeMap::new())
            .expect_err("must fail");
        let text = err.to_string();
        assert!(text.contains("task.max_rounds"), "{text}");
        assert!(text.contains("u32") || text.contains("integer"), "{text}");

        let err = Config::from_parts(
            Some("[task]\nask_timeout = \"soon\""),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("must fail");
        assert!(err.to_string().contains("task.ask_timeout"), "{err}");
        assert!(err.to_string().contains("90s"), "{err}");

        let err = Config::from_parts(None, "f", &env(&[("HARK_TASK__MAX_ROUNDS", "lots")]))
            .expect_err("must fail");
        assert!(err.to_string().contains("HARK_TASK__MAX_ROUNDS"), "{err}");

        let err = Config::from_parts(
            Some("[permission]\ndefault_role = \"root\""),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("must fail");
        assert!(err.to_string().contains("permission.default_role"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = Config::from_parts(Some("[task]\nmax_roundz = 3"), "f", &BTreeMap::new())
            .expect_err("must fail");
        assert!(err.to_string().contains("max_roundz"), "{err}");
        let err =
            Config::from_parts(None, "f", &env(&[("HARK_NOPE__X", "1")])).expect_err("must fail");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn stream_copies_and_placement_are_read_and_checked() {
        let config = Config::from_parts(
            Some("[nats]\nurl = \"nats://a:4222,nats://b:4222\"\nreplicas = 3\n[nats.placement]\ncluster = \"east\"\ntags = [\"ssd\"]"),
            "f",
            &BTreeMap::new(),
        )
        .expect("valid");
        assert_eq!(config.nats.replicas, 3);
        assert_eq!(config.nats.placement.cluster, "east");
        assert_eq!(config.nats.placement.tags, ["ssd"]);
        let config = Config::from_parts(
            None,
            "f",
            &env(&[
                ("HARK_NATS__REPLICAS", "3"),
                ("HARK_NATS__PLACEMENT__TAGS", "ssd,eu"),
            ]),
        )
        .expect("valid");
        assert_eq!(config.nats.replicas, 3);
        assert_eq!(config.nats.placement.tags, ["ssd", "eu"]);
        for replicas in ["0", "6"] {
            let err = Config::from_parts(None, "f", &env(&[("HARK_NATS__REPLICAS", replicas)]))
                .expect_err("outside 1-5");
            assert!(err.to_string().contains("nats.replicas"), "{err}");
        }
        assert_eq!(Config::default().nats.replicas, 1);
        assert_eq!(Config::default().nats.partitions, 1);
        let config =
            Config::from_parts(None, "f", &env(&[("HARK_NATS__PARTITIONS", "4")])).expect("valid");
        assert_eq!(config.nats.partitions, 4);
        for partitions in ["0", "65"] {
            let err = Config::from_parts(None, "f", &env(&[("HARK_NATS__PARTITIONS", partitions)]))
                .expect_err("outside 1-64");
            assert!(err.to_string().contains("nats.partitions"), "{err}");
        }
    }

    #[test]
    fn semantic_checks_name_the_key() {
        let err = Config::from_parts(Some("[nats]\nnamespace = \"a.b\""), "f", &BTreeMap::new())
            .expect_err("must fail");
        assert!(err.to_string().contains("nats.namespace"), "{err}");
        let err = Config::from_parts(
            Some("[database]\nurl = \"mysql://x\""),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("must fail");
        assert!(err.to_string().contains("database.url"), "{err}");
        let err = Config::from_parts(Some("[task]\nmax_attempts = 0"), "f", &BTreeMap::new())
            .expect_err("must fail");
        assert!(err.to_string().contains("task.max_attempts"), "{err}");
        let err = Config::from_parts(
            Some("[gateway.onebot]\nidle_timeout = \"1s\""),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("must fail");
        assert!(
            err.to_string().contains("gateway.onebot.idle_timeout"),
            "{err}"
        );
        let err = Config::from_parts(Some("[task]\nretention = \"10m\""), "f", &BTreeMap::new())
            .expect_err("must fail");
        assert!(err.to_string().contains("task.retention"), "{err}");
        for fine in ["0s", "3s", "2m"] {
            let config = Config::from_parts(
                Some(&format!("[gateway.onebot]\nidle_timeout = \"{fine}\"")),
                "f",
                &BTreeMap::new(),
            )
            .expect("accepted");
            assert_eq!(
                config.gateway.onebot.idle_timeout.0,
                fine.parse::<HumanDuration>().expect("duration").0
            );
        }
    }

    #[test]
    fn env_keys_name_every_key() {
        let keys = Config::env_keys();
        for key in [
            "HARK_NATS__URL",
            "HARK_TASK__ASK_TIMEOUT",
            "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
            "HARK_LLM__EXTRA_BODY",
        ] {
            assert!(
                keys.contains(&key.to_owned()),
                "{key} missing from {keys:?}"
            );
        }
        for key in &keys {
            let env = env(&[(key.as_str(), "")]);
            // Every listed key is accepted as a key (its value may still be refused).
            if let Err(Error::Env { message, .. }) = Config::from_parts(None, "f", &env) {
                assert!(!message.contains("there is no config"), "{key}: {message}");
            }
        }
    }

    #[test]
    fn langbot_bots_name_a_platform_of_their_own_and_need_langbot_s_api_and_a_token_beyond_loopback()
     {
        let parse = |pairs: &[(&str, &str)]| Config::from_parts(None, "f", &env(pairs));
        let fine = parse(&[
            ("HARK_GATEWAY__LANGBOT__BOTS", "langbot-qq:4b1c"),
            ("HARK_GATEWAY__LANGBOT__URL", "http://127.0.0.1:5300"),
        ])
        .expect("loads");
        assert_eq!(
            fine.gateway.langbot.bots(),
            [("langbot-qq".to_owned(), "4b1c".to_owned())]
        );
        assert!(fine.check_gateway_exposure().is_ok());
        for (pairs, key) in [
            (
                vec![("HARK_GATEWAY__LANGBOT__BOTS", "langbot-qq:4b1c")],
                "gateway.langbot.url",
            ),
            (
                vec![
                    ("HARK_GATEWAY__LANGBOT__BOTS", "qq:4b1c"),
                    ("HARK_GATEWAY__LANGBOT__URL", "http://x"),
                ],
                "gateway.langbot.bots",
            ),
            (
                vec![
                    ("HARK_GATEWAY__LANGBOT__BOTS", "4b1c"),
                    ("HARK_GATEWAY__LANGBOT__URL", "http://x"),
                ],
                "gateway.langbot.bots",
            ),
        ] {
            let err = parse(&pairs).expect_err("refused").to_string();
            assert!(err.contains(key), "{pairs:?}: {err}");
        }
        let open = parse(&[
            ("HARK_GATEWAY__LANGBOT__BOTS", "langbot-qq:4b1c"),
            ("HARK_GATEWAY__LANGBOT__URL", "http://127.0.0.1:5300"),
            ("HARK_GATEWAY__LISTEN", "0.0.0.0:8080"),
            (
                "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
                "0123456789abcdef0123456789abcdef",
            ),
        ])
        .expect("loads");
        let err = open
            .check_gateway_exposure()
            .expect_err("refused")
            .to_string();
        assert!(err.contains("gateway.langbot.token"), "{err}");
    }

    #[test]
    fn listeners_beyond_loopback_need_their_tokens() {
        let load = |pairs: &[(&str, &str)]| {
            Config::from_parts(None, "f", &env(pairs)).expect("the config itself loads")
        };
        // Loopback: no token needed anywhere.
        let local = load(&[("HARK_GATEWAY__HTTP__PLATFORMS", "myapp")]);
        assert!(local.check_gateway_exposure().is_ok());
        assert!(local.check_control_exposure().is_ok());

        // The README's QQ setup without a token: refused, naming the key to set.
        let open = load(&[("HARK_GATEWAY__LISTEN", "0.0.0.0:8080")]);
        let err = open
            .check_gateway_exposure()
            .expect_err("refused")
            .to_string();
        assert!(err.contains("gateway.onebot.access_token"), "{err}");
        assert!(err.contains("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN"), "{err}");

        // OneBot has its token, but the HTTP adapter is on without one.
        let http = load(&[
            ("HARK_GATEWAY__LISTEN", "0.0.0.0:8080"),
            (
                "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
                "0123456789abcdef0123456789abcdef",
            ),
            ("HARK_GATEWAY__HTTP__PLATFORMS", "myapp"),
        ]);
        let err = http
            .check_gateway_exposure()
            .expect_err("refused")
            .to_string();
        assert!(err.contains("gateway.http.token"), "{err}");
        let closed = load(&[
            ("HARK_GATEWAY__LISTEN", "0.0.0.0:8080"),
            (
                "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
                "0123456789abcdef0123456789abcdef",
            ),
        ]);
        assert!(
            closed.check_gateway_exposure().is_ok(),
            "the adapter is off"
        );

        let api = load(&[("HARK_CONTROL__GRPC_LISTEN", "0.0.0.0:50051")]);
        let err = api
            .check_control_exposure()
            .expect_err("refused")
            .to_string();
        assert!(err.contains("control.api_tokens"), "{err}");
        assert!(err.contains("control.allow_unauthenticated"), "{err}");
        for fine in [
            load(&[
                ("HARK_CONTROL__GRPC_LISTEN", "0.0.0.0:50051"),
                (
                    "HARK_CONTROL__API_TOKENS",
                    "0123456789abcdef0123456789abcdef,fedcba9876543210fedcba9876543210",
                ),
            ]),
            load(&[
                ("HARK_CONTROL__GRPC_LISTEN", "[::]:50051"),
                ("HARK_CONTROL__ALLOW_UNAUTHENTICATED", "true"),
            ]),
            load(&[("HARK_CONTROL__GRPC_LISTEN", "[::1]:50051")]),
        ] {
            assert!(fine.check_control_exposure().is_ok());
        }
        // allow_unauthenticated opens the gRPC API behind a proxy, never the console.
        let open = load(&[
            ("HARK_CONTROL__HTTP_LISTEN", "0.0.0.0:8081"),
            ("HARK_CONTROL__ALLOW_UNAUTHENTICATED", "true"),
        ]);
        let err = open.console_listen().expect_err("refused").to_string();
        assert!(err.contains("control.api_tokens"), "{err}");
        let signed = load(&[
            ("HARK_CONTROL__HTTP_LISTEN", "0.0.0.0:8081"),
            (
                "HARK_CONTROL__API_TOKENS",
                "0123456789abcdef0123456789abcdef",
            ),
        ]);
        assert!(signed.console_listen().is_ok());
        assert!(
            loopback_host("127.0.0.1:8080")
                && loopback_host("[::1]:1")
                && loopback_host("localhost")
        );
        assert!(!loopback_host("attacker.example:8080") && !loopback_host("127.0.0.1.nip.io"));
    }

    #[test]
    fn the_http_adapter_speaks_only_for_its_own_platforms() {
        let err = Config::from_parts(
            Some("[gateway.http]\nplatforms = [\"qq\"]"),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("OneBot's platform is refused");
        assert!(err.to_string().contains("gateway.onebot.platform"), "{err}");
        let err = Config::from_parts(
            Some("[gateway.http]\nplatforms = [\"myapp\"]\nbots = [\"other:main\"]"),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("a bot of another platform is refused");
        assert!(err.to_string().contains("gateway.http.platforms"), "{err}");
        let err = Config::from_parts(
            Some("[gateway.http]\nwebhook_url = \"http://x\""),
            "f",
            &BTreeMap::new(),
        )
        .expect_err("a webhook for an adapter that is off is refused");
        assert!(err.to_string().contains("gateway.http.platforms"), "{err}");
        let config = Config::from_parts(
            Some("[gateway.http]\nplatforms = [\"myapp\"]\nbots = [\"myapp:main\"]"),
            "f",
            &BTreeMap::new(),
        )
        .expect("a consistent adapter loads");
        assert_eq!(config.gateway.http.platforms, ["myapp"]);
    }

    #[test]
    fn a_bad_listen_address_or_log_filter_says_what_one_looks_like() {
        let err = Config::from_parts(None, "f", &env(&[("HARK_GATEWAY__LISTEN", "8080")]))
            .expect_err("a port alone is refused")
            .to_string();
        assert!(err.contains("gateway.listen"), "{err}");
        assert!(err.contains("127.0.0.1:8080"), "{err}");
        let err = Config::from_parts(Some("[log]\nfilter = '[[['"), "f", &BTreeMap::new())
            .expect_err("a broken filter is refused")
            .to_string();
        assert!(err.contains("log.filter"), "{err}");
        for fine in ["info", "hark_control=debug,info", "warn,hark_gateway=trace"] {
            Config::from_parts(
                Some(&format!("[log]\nfilter = '{fine}'")),
                "f",
                &BTreeMap::new(),
            )
            .expect("a filter loads");
        }
    }

    #[test]
    fn a_metrics_listener_beyond_loopback_needs_its_token() {
        let load =
            |vars: &[(&str, &str)]| Config::from_parts(None, "f", &env(vars)).expect("loads");
        assert_eq!(load(&[]).metrics_listen().expect("fine"), None);
        let local = load(&[("HARK_METRICS__LISTEN", "127.0.0.1:9464")]);
        assert_eq!(
            local.metrics_listen().expect("fine"),
            Some("127.0.0.1:9464".parse().expect("addr"))
        );
        let open = load(&[("HARK_METRICS__LISTEN", "0.0.0.0:9464")]);
        let err = open.metrics_listen().expect_err("refused").to_string();
        assert!(err.contains("metrics.token"), "{err}");
        let guarded = load(&[
            ("HARK_METRICS__LISTEN", "0.0.0.0:9464"),
            ("HARK_METRICS__TOKEN", "0123456789abcdef0123456789abcdef"),
        ]);
        assert!(guarded.metrics_listen().expect("fine").is_some());
        // Beyond loopback, a token too short to resist guessing is refused, naming its key; on
        // loopback any token goes.
        for (key, var, check) in [
            (
                "gateway.onebot.access_token",
                "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
                ("HARK_GATEWAY__LISTEN", "0.0.0.0:8080"),
            ),
            (
                "control.api_tokens",
                "HARK_CONTROL__API_TOKENS",
                ("HARK_CONTROL__GRPC_LISTEN", "0.0.0.0:50051"),
            ),
            (
                "metrics.token",
                "HARK_METRICS__TOKEN",
                ("HARK_METRICS__LISTEN", "0.0.0.0:9464"),
            ),
        ] {
            let short = load(&[check, (var, "guessable")]);
            let refused = [
                short.check_gateway_exposure().err(),
                short.check_control_exposure().err(),
                short.metrics_listen().err(),
            ];
            let err = refused
                .iter()
                .flatten()
                .map(ToString::to_string)
                .next()
                .unwrap_or_else(|| panic!("a 9-character {key} beyond loopback was taken"));
            assert!(err.contains(key) && err.contains("at least 22"), "{err}");
            let local = load(&[(var, "guessable")]);
            assert!(
                local.check_gateway_exposure().is_ok() && local.check_control_exposure().is_ok()
            );
        }
        let err = load(&[("HARK_METRICS__LISTEN", "9464")])
            .metrics_listen()
            .expect_err("a port alone")
            .to_string();
        assert!(
            err.contains("metrics.listen") && err.contains("127.0.0.1:9464"),
            "{err}"
        );
    }

    #[test]
    fn redacted_shows_no_secret_and_which_are_unset() {
        let config = Config::from_parts(
            None,
            "f",
            &env(&[
                (
                    "HARK_DATABASE__URL",
                    "postgres://postgres:TopSecret@db:5432/hark",
                ),
                ("HARK_LLM__API_KEY", "sk-LlmSecret"),
                ("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "OneBotSecret"),
                ("HARK_GATEWAY__HTTP__TOKEN", "HttpSecret"),
                ("HARK_CONTROL__API_TOKENS", "ApiSecret1,ApiSecret2"),
            ]),
        )
        .expect("loads");
        let shown = toml::to_string(&config.redacted()).expect("toml");
        let debug = format!("{config:?}");
        for secret in [
            "TopSecret",
            "LlmSecret",
            "OneBotSecret",
            "HttpSecret",
            "ApiSecret1",
            "ApiSecret2",
        ] {
            assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
            assert!(!debug.contains(secret), "{secret} in Debug: {debug}");
        }
        assert!(
            shown.contains("postgres://postgres:***@db:5432/hark"),
            "{shown}"
        );
        assert!(shown.contains(crate::secret::REDACTED), "{shown}");
        let unset = toml::to_string(&Config::default().redacted()).expect("toml");
        assert!(unset.contains("api_key = \"\""), "{unset}");
        // An invalid database URL is named without its password.
        let err = Config::from_parts(
            None,
            "f",
            &env(&[("HARK_DATABASE__URL", "mysql://root:TopSecret@db/hark")]),
        )
        .expect_err("refused")
        .to_string();
        assert!(!err.contains("TopSecret"), "{err}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = Config::load_from(Some(Path::new("/nonexistent/hark.toml")), [])
            .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/hark.toml"), "{err}");
    }
}
