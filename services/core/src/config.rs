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
    domain::{HumanDuration, Owner, Role, TimeoutPolicy},
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
    pub worker: WorkerConfig,
    pub task: TaskConfig,
    pub permission: PermissionConfig,
    pub chat: ChatConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    pub url: String,
    /// Prefix of every subject, stream and consumer name, so that several hark installations
    /// can share one nats-server without seeing each other's messages.
    pub namespace: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            namespace: "hark".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// The database is created when it does not exist.
    pub url: String,
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/hark".into(),
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
    pub api_key: String,
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
            api_key: String::new(),
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
    pub listen: SocketAddr,
    pub max_frame_bytes: u64,
    /// Inbound frames a second one connection may send (bursts of twice that).
    pub rate_limit: u32,
    /// How long a platform has to confirm a sent message.
    pub send_timeout: HumanDuration,
    pub onebot: OneBotConfig,
    pub http: HttpAdapterConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_frame_bytes: 1 << 20,
            rate_limit: 50,
            send_timeout: HumanDuration::from_secs(10),
            onebot: OneBotConfig::default(),
            http: HttpAdapterConfig::default(),
        }
    }
}

/// The generic HTTP adapter, for apps that are not OneBot bots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpAdapterConfig {
    /// When set, HTTP clients must send `Authorization: Bearer <token>`.
    pub token: String,
    /// The bots this adapter delivers for, as `platform:bot_id`.
    pub bots: Vec<String>,
    /// Outbound messages are POSTed here; without it they are served on `/api/v1/stream` (SSE).
    pub webhook_url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OneBotConfig {
    /// When set, bots must present it as `Authorization: Bearer <token>` or `?access_token=`.
    pub access_token: String,
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

impl Default for OneBotConfig {
    fn default() -> Self {
        Self {
            access_token: String::new(),
            platform: "qq".into(),
            forward: Vec::new(),
            idle_timeout: HumanDuration::from_secs(90),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    pub grpc_listen: SocketAddr,
    /// Bearer tokens accepted by the gRPC API. Empty: no authentication.
    pub api_tokens: Vec<String>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            api_tokens: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Tasks one worker process runs at once.
    pub concurrency: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self { concurrency: 4 }
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
    /// How long a worker holds a task without a heartbeat.
    pub lease: HumanDuration,
    /// How long a finished task (with its rounds, questions and audit) is kept after it ended;
    /// then it is deleted. `0s`: kept forever.
    pub retention: HumanDuration,
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
            lease: HumanDuration::from_secs(30),
            retention: HumanDuration::from_secs(30 * 86_400),
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
    /// Label put before a question's context in the chat.
    pub context_label: String,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            command: "/task".into(),
            command_aliases: Vec::new(),
            context_label: "[上下文]".into(),
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
            apply_env(&mut merged, &path, value).map_err(|message| Error::Env {
                var: var.clone(),
                message,
            })?;
        }
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
        if !self.nats.url.contains("://") && !self.nats.url.contains(':') {
            return bad(
                "nats.url",
                format!(
                    "`{}` is not a NATS URL: expected e.g. nats://127.0.0.1:4222",
                    self.nats.url
                ),
            );
        }
        if !(self.database.url.starts_with("postgres://")
            || self.database.url.starts_with("postgresql://"))
        {
            return bad(
                "database.url",
                format!(
                    "`{}` is not a Postgres URL: expected e.g. postgres://postgres@127.0.0.1:5432/hark",
                    self.database.url
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
        for bot in &self.gateway.http.bots {
            if bot
                .split_once(':')
                .is_none_or(|(p, b)| p.is_empty() || b.is_empty())
            {
                return bad(
                    "gateway.http.bots",
                    format!("`{bot}`: expected platform:bot_id, e.g. myapp:main"),
                );
            }
        }
        if self.gateway.rate_limit == 0 {
            return bad("gateway.rate_limit", "must be at least 1".into());
        }
        if self.gateway.max_frame_bytes < 1024 {
            return bad("gateway.max_frame_bytes", "must be at least 1024".into());
        }
        if self.chat.command.trim().is_empty() || self.chat.command.contains(char::is_whitespace) {
            return bad("chat.command", "must be one word, e.g. /task".into());
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad(
                "log.format",
                format!("`{}`: expected text or json", self.log.format),
            );
        }
        Ok(())
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
fn apply_env(table: &mut toml::Table, path: &[String], value: &str) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty key")?;
    let mut cursor = table;
    let mut walked = Vec::new();
    for part in parents {
        walked.push(part.as_str());
        cursor = match cursor.get_mut(part) {
            Some(toml::Value::Table(t)) => t,
            _ => return Err(format!("there is no config section `{}`", walked.join("."))),
        };
    }
    let key = path.join(".");
    let parsed = match cursor.get(last) {
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
        assert_eq!(config.nats.url, "nats://127.0.0.1:4222");
        assert_eq!(config.nats.namespace, "hark");
        assert_eq!(
            config.database.url,
            "postgres://postgres@127.0.0.1:5432/hark"
        );
        assert_eq!(config.task.ask_timeout, HumanDuration::from_secs(600));
        assert_eq!(config.task.max_rounds, 30);
        assert_eq!(config.task.max_attempts, 3);
        assert_eq!(config.permission.default_role, Role::User);
        assert_eq!(config.gateway.rate_limit, 50);
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
        assert_eq!(config.gateway.onebot.access_token, "12345");
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
    fn a_missing_file_is_named() {
        let err = Config::load_from(Some(Path::new("/nonexistent/hark.toml")), [])
            .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/hark.toml"), "{err}");
    }
}
