//! An OpenAI-compatible chat-completions client.
//!
//! Works with OpenAI, DeepSeek, Qwen (DashScope compatible mode), SiliconFlow, Ollama and vLLM.
//! The assistant message is kept exactly as the provider returned it, extras included (DeepSeek's
//! thinking mode rejects a tool round whose `reasoning_content` is not sent back), with one
//! repair: a tool call without an `id` gets one, since the tool result must name it. Arguments
//! given as an object instead of a JSON string, and `content: null`, are accepted.

use std::time::Duration;

use hark_core::secret::redact_url;
use serde_json::{Map, Value, json, value::RawValue};

/// Why a completion failed after its retries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the LLM endpoint {url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("cannot reach the LLM endpoint {url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("the LLM endpoint {url} returned a response without a message: {body}")]
    Malformed { url: String, body: String },
    #[error("the LLM call was cancelled")]
    Cancelled,
}

impl Error {
    /// How a failed call is counted: its HTTP status, or its kind.
    pub fn metric_label(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Error::Status { status, .. } => status.to_string().into(),
            Error::Transport { source, .. } if source.is_timeout() => "timeout".into(),
            Error::Transport { .. } => "transport".into(),
            Error::Malformed { .. } => "malformed".into(),
            Error::Cancelled => "cancelled".into(),
        }
    }

    fn retryable(&self) -> bool {
        match self {
            Error::Status { status, .. } => *status == 429 || *status >= 500,
            Error::Transport { source, .. } => {
                source.is_timeout() || source.is_connect() || source.is_request()
            }
            Error::Malformed { .. } | Error::Cancelled => false,
        }
    }
}

/// Settings of the client, from the `llm` section of the config.
#[derive(Debug, Clone)]
pub struct Settings {
    pub base_url: String,
    pub api_key: hark_core::secret::Secret,
    pub model: String,
    pub extra_body: Map<String, Value>,
    pub request_timeout: Duration,
    pub max_retries: u32,
}

/// One tool call of an assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model gave them: usually a JSON string, sometimes an object.
    pub arguments: Value,
}

/// The assistant's reply: the raw message to keep, and what it asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub message: Value,
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

impl Settings {
    /// The settings of the `llm` config section.
    pub fn from_config(config: &hark_core::config::LlmConfig) -> Self {
        let extra_body = match serde_json::to_value(&config.extra_body) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        Self {
            base_url: config.base_url.clone(),
            api_key: config.api_key.clone(),
            model: config.model.clone(),
            extra_body,
            request_timeout: config.request_timeout.0,
            max_retries: config.max_retries,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    settings: Settings,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Client {
    pub fn new(settings: Settings) -> Result<Self, reqwest::Error> {
        hark_core::install_crypto();
        let http = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("hark/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let url = format!(
            "{}/chat/completions",
            settings.base_url.trim_end_matches('/')
        );
        let provider = reqwest::Url::parse(&url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let metrics = crate::metrics::Metrics::global(&settings.model, &provider);
        Ok(Self {
            http,
            url,
            settings,
            metrics,
        })
    }

    pub fn model(&self) -> &str {
        &self.settings.model
    }

    /// The process's worker metrics, which this client's calls are counted in.
    pub fn metrics(&self) -> &std::sync::Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The request body: model, messages, tools, then the configured extra fields, which take
    /// the place of any of the first three they name. The messages are borrowed and the tools
    /// come as JSON already, so nothing of either is copied before it is written.
    pub fn body(&self, messages: &[Value], tools: Option<&RawValue>) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            model: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            messages: Option<&'a [Value]>,
            #[serde(skip_serializing_if = "Option::is_none")]
            tools: Option<&'a RawValue>,
            #[serde(flatten)]
            extra: &'a Map<String, Value>,
        }
        let extra = &self.settings.extra_body;
        let unless_extra = |key: &str| !extra.contains_key(key);
        let body = Body {
            model: Some(self.settings.model.as_str())
                .filter(|m| !m.is_empty() && unless_extra("model")),
            messages: Some(messages).filter(|_| unless_extra("messages")),
            tools: tools.filter(|_| unless_extra("tools")),
            extra,
        };
        serde_json::to_vec(&body).expect("a request body of JSON values serializes")
    }

    /// One completion, retried with backoff on 429, 5xx, timeouts and connection errors,
    /// honouring `Retry-After`. `call_prefix` names generated tool-call ids.
    pub async fn complete(
        &self,
        messages: &[Value],
        tools: Option<&RawValue>,
        call_prefix: &str,
    ) -> Result<Reply, Error> {
        use tracing::Instrument as _;
        // By the GenAI conventions: one client span per completion, retries inside it.
        let span = tracing::info_span!(
            "chat",
            otel.name = format!("chat {}", self.settings.model),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %self.metrics.provider(),
            gen_ai.request.model = %self.settings.model,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let completed = self
            .complete_in_span(messages, tools, call_prefix)
            .instrument(span.clone())
            .await;
        if let Err(e) = &completed {
            span.record("error.type", tracing::field::display(e.metric_label()));
        }
        completed
    }

    async fn complete_in_span(
        &self,
        messages: &[Value],
        tools: Option<&RawValue>,
        call_prefix: &str,
    ) -> Result<Reply, Error> {
        let body = bytes::Bytes::from(self.body(messages, tools));
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            let (result, retry_after) = self.once(body.clone()).await;
            let failed = result.as_ref().err().map(Error::metric_label);
            self.metrics.call(started.elapsed(), failed.as_deref());
            match result {
                Ok(raw) => {
                    let usage = |key: &str| {
                        raw.pointer(&format!("/usage/{key}"))
                            .and_then(Value::as_u64)
                    };
                    self.metrics
                        .tokens(usage("prompt_tokens"), usage("completion_tokens"));
                    let span = tracing::Span::current();
                    if let Some(n) = usage("prompt_tokens") {
                        span.record("gen_ai.usage.input_tokens", n);
                    }
                    if let Some(n) = usage("completion_tokens") {
                        span.record("gen_ai.usage.output_tokens", n);
                    }
                    if let Some(model) = raw["model"].as_str() {
                        span.record("gen_ai.response.model", model);
                    }
                    return parse_reply(&raw, &self.url, call_prefix);
                }
                Err(e) if e.retryable() && attempt < self.settings.max_retries => {
                    let backoff = retry_after.unwrap_or_else(|| backoff(attempt));
                    tracing::warn!(error = %e, attempt, wait_ms = backoff.as_millis() as u64, "LLM call failed; retrying");
                    tokio::time::sleep(backoff).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn once(&self, body: bytes::Bytes) -> (Result<Value, Error>, Option<Duration>) {
        let mut request = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if !self.settings.api_key.is_empty() {
            request = request.bearer_auth(self.settings.api_key.expose());
        }
        // Providers and proxies that trace requests see them in the task's trace.
        if let Some(trace) = hark_core::trace::outgoing() {
            request = request.header(hark_core::trace::HEADER, trace);
        }
        let transport = |source| Error::Transport {
            url: redact_url(&self.url),
            source: reqwest::Error::without_url(source),
        };
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return (Err(transport(e)), None),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|secs| Duration::from_secs_f64(secs.clamp(0.0, 120.0)));
        let text = match response.text().await {
            Ok(t) => t,
            Err(e) => return (Err(transport(e)), retry_after),
        };
        if !status.is_success() {
            let body: String = text.chars().take(500).collect();
            return (
                Err(Error::Status {
                    url: redact_url(&self.url),
                    status: status.as_u16(),
                    body,
                }),
                retry_after,
            );
        }
        match serde_json::from_str(&text) {
            Ok(v) => (Ok(v), None),
            Err(_) => (
                Err(Error::Malformed {
                    url: redact_url(&self.url),
                    body: text.chars().take(500).collect(),
                }),
                None,
            ),
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(500) * 2u32.saturating_pow(attempt.min(5));
    let jitter = Duration::from_millis(u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 2);
    base.min(Duration::from_secs(16)) + jitter
}

/// Takes the first choice's message from a chat-completions response. Its tool calls are named
/// `<call_prefix>_<position>`, whatever ids the model gave them, so that a round run again after
/// a crash names the same calls the same way, and their idempotency keys match.
pub fn parse_reply(raw: &Value, url: &str, call_prefix: &str) -> Result<Reply, Error> {
    let malformed = || Error::Malformed {
        url: url.to_owned(),
        body: raw.to_string().chars().take(500).collect(),
    };
    let mut message = raw
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .cloned()
        .ok_or_else(malformed)?;
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (index, call) in calls.iter_mut().enumerate() {
            if let Some(call) = call.as_object_mut() {
                call.insert("id".into(), json!(format!("{call_prefix}_{index}")));
            }
        }
    }
    parse_message(message, call_prefix).ok_or_else(malformed)
}

/// Reads an assistant message: its text and its tool calls, filling in missing call ids.
/// `None` when it is not a JSON object.
pub fn parse_message(mut message: Value, call_prefix: &str) -> Option<Reply> {
    let object = message.as_object_mut()?;
    object.entry("role").or_insert_with(|| json!("assistant"));
    let content = object
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    if let Some(calls) = object.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (index, call) in calls.iter_mut().enumerate() {
            let Some(call) = call.as_object_mut() else {
                continue;
            };
            let id = match call
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(id) => id.to_owned(),
                None => {
                    let id = format!("{call_prefix}_{index}");
                    call.insert("id".into(), json!(id));
                    id
                }
            };
            call.entry("type").or_insert_with(|| json!("function"));
            let function = call.get("function").cloned().unwrap_or(Value::Null);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let arguments = function.get("arguments").cloned().unwrap_or(Value::Null);
            tool_calls.push(ToolCall {
                id,
                name,
                arguments,
            });
        }
    }
    Some(Reply {
        message,
        content,
        tool_calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extras_are_kept_and_call_ids_are_named_by_round_and_position() {
        let raw = json!({"choices": [{"message": {
            "role": "assistant", "content": null, "reasoning_content": "thinking…",
            "tool_calls": [
                {"type": "function", "function": {"name": "ask_user", "arguments": {"question": "Q?"}}},
                {"id": "call_random", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ]
        }}]});
        let reply = parse_reply(&raw, "u", "r3").expect("parses");
        assert_eq!(reply.message["reasoning_content"], "thinking…");
        assert_eq!(reply.content, None);
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(reply.tool_calls[0].id, "r3_0");
        assert_eq!(reply.tool_calls[1].id, "r3_1");
        assert_eq!(reply.message["tool_calls"][0]["id"], "r3_0");
        assert_eq!(reply.tool_calls[0].arguments, json!({"question": "Q?"}));
    }

    #[test]
    fn the_body_carries_model_messages_and_tools_unless_an_extra_field_takes_their_place() {
        let client = |model: &str, extra: Value| {
            Client::new(Settings {
                base_url: "http://127.0.0.1:9/v1".into(),
                api_key: Default::default(),
                model: model.into(),
                extra_body: extra.as_object().cloned().expect("an object"),
                request_timeout: Duration::from_secs(1),
                max_retries: 0,
            })
            .expect("a client")
        };
        let messages = [json!({"role": "user", "content": "你好"})];
        let tools = serde_json::value::to_raw_value(&json!([{"type": "function"}])).expect("raw");
        let body = |client: &Client, tools: Option<&RawValue>| {
            serde_json::from_slice::<Value>(&client.body(&messages, tools)).expect("JSON")
        };

        let plain = client("m1", json!({"temperature": 0.2}));
        assert_eq!(
            body(&plain, Some(&tools)),
            json!({"model": "m1", "messages": messages, "tools": [{"type": "function"}],
                   "temperature": 0.2})
        );
        assert_eq!(
            body(&client("", json!({})), None),
            json!({"messages": messages}),
            "no model and no tools: neither key"
        );
        let overriding = client("m1", json!({"model": "m2", "tools": [], "messages": []}));
        assert_eq!(
            body(&overriding, Some(&tools)),
            json!({"model": "m2", "messages": [], "tools": []}),
            "each key once, as the extra fields give it"
        );
    }

    #[test]
    fn a_response_without_a_message_is_malformed() {
        assert!(matches!(
            parse_reply(&json!({"error": "x"}), "u", "p"),
            Err(Error::Malformed { .. })
        ));
    }
}
