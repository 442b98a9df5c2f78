//! A scripted LLM: a real HTTP server speaking the OpenAI chat-completions API, answering from a
//! script instead of a model. Tests and `hark dev`'s demo model use it, so every LLM call goes
//! through the real client over HTTP.
//!
//! The server keeps no conversation state: the step it answers with is the number of assistant
//! messages already in the request, so any worker, after any restart, gets the same next step.
//! A goal containing `[script:NAME]` selects the script `NAME`; otherwise `default` is used.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Json, Router, extract::State, http::StatusCode, response::IntoResponse, routing::post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the model does at one step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call `ask_user`.
    Ask {
        question: String,
        context: String,
        timeout_s: Option<u64>,
    },
    /// Call any tool with these arguments.
    Call { name: String, arguments: Value },
    /// Give the final answer. `{answer}` is replaced by the content of the last tool result in
    /// the conversation, `{answers}` by every tool result in order, joined by `|`, and `{goal}`
    /// by the goal.
    Say(String),
}

/// One step: an action, optionally after a delay, optionally preceded by failed attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub action: Action,
    /// How long the server takes before answering.
    pub delay: Duration,
    /// HTTP statuses returned to the first attempts at this step, before the action.
    pub failures: Vec<u16>,
}

impl Step {
    pub fn ask(question: &str) -> Self {
        Self::new(Action::Ask {
            question: question.into(),
            context: String::new(),
            timeout_s: None,
        })
    }

    pub fn ask_with(question: &str, context: &str, timeout_s: Option<u64>) -> Self {
        Self::new(Action::Ask {
            question: question.into(),
            context: context.into(),
            timeout_s,
        })
    }

    pub fn call(name: &str, arguments: Value) -> Self {
        Self::new(Action::Call {
            name: name.into(),
            arguments,
        })
    }

    pub fn say(text: &str) -> Self {
        Self::new(Action::Say(text.into()))
    }

    pub fn new(action: Action) -> Self {
        Self {
            action,
            delay: Duration::ZERO,
            failures: Vec::new(),
        }
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn failing_first(mut self, statuses: &[u16]) -> Self {
        self.failures = statuses.to_vec();
        self
    }
}

/// Ways real providers deviate from the OpenAI format, to reproduce on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quirks {
    /// Give tool-call arguments as a JSON object instead of a string (Ollama does).
    pub arguments_as_object: bool,
    /// Leave out tool-call ids.
    pub omit_call_ids: bool,
    /// Add a `reasoning_content` field, as DeepSeek's thinking mode does.
    pub reasoning_content: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Script {
    pub steps: Vec<Step>,
    pub quirks: Quirks,
}

impl Script {
    pub fn new(steps: Vec<Step>) -> Self {
        Self {
            steps,
            quirks: Quirks::default(),
        }
    }

    /// The demo of `hark dev` in Chinese, for tasks whose chat is Chinese.
    pub fn demo_zh() -> Self {
        Self::new(vec![
            Step::ask_with(
                "你好！我是 hark 的演示模型。该怎么称呼你？",
                "直接在这个聊天里回复即可，不需要命令。",
                None,
            ),
            Step::say(
                "很高兴认识你，{answer}！任务完成了。（这是 hark 内置的演示模型；设置 llm.base_url 即可使用真正的模型。）",
            ),
        ])
    }

    /// The demo of `hark dev`: ask one question, then finish using the answer.
    pub fn demo() -> Self {
        Self::new(vec![
            Step::ask_with(
                "Hi! I am hark's demo model. What should I call you?",
                "Reply in this chat; no command needed.",
                None,
            ),
            Step::say(
                "Nice to meet you, {answer}! The task is done. (This was hark's built-in demo model; set llm.base_url to use a real one.)",
            ),
        ])
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub body: Value,
    /// The W3C trace context the request came with.
    pub traceparent: Option<String>,
}

/// The most requests kept for [`ScriptedLlm::requests`]; older ones are forgotten.
pub const KEPT_REQUESTS: usize = 1000;

#[derive(Debug, Default)]
struct Inner {
    scripts: BTreeMap<String, Script>,
    /// The latest requests, at most [`KEPT_REQUESTS`], when keeping is on.
    requests: std::collections::VecDeque<Recorded>,
    /// Attempts seen per (conversation, step), for scripted failures.
    attempts: HashMap<(String, usize), usize>,
    /// Scripts whose answers wait until released, so that a test acts while a call is in
    /// flight, whatever the machine's pace.
    /// By script, and by step (`None`: every step).
    held: std::collections::HashSet<(String, Option<usize>)>,
}

#[derive(Debug, Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    arrived: Arc<tokio::sync::Notify>,
    /// Woken when a held script is released.
    released: Arc<tokio::sync::Notify>,
    /// Every request as it arrives, for benchmarks that time arrivals.
    feed: tokio::sync::broadcast::Sender<Recorded>,
    /// Whether to keep requests for [`ScriptedLlm::requests`]: on for tests, off for the demo
    /// model and benchmarks, which serve many.
    keep: Arc<std::sync::atomic::AtomicBool>,
}

/// A running scripted LLM server. Stops when dropped.
#[derive(Debug)]
pub struct ScriptedLlm {
    addr: SocketAddr,
    shared: Shared,
    stop: CancellationToken,
}

impl Drop for ScriptedLlm {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ScriptedLlm {
    /// Starts a server on `addr` (port 0 picks a free one) with `scripts`; `default` is the
    /// script for goals that name none.
    pub async fn start(
        addr: SocketAddr,
        scripts: BTreeMap<String, Script>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner {
                scripts,
                ..Default::default()
            })),
            arrived: Default::default(),
            released: Default::default(),
            feed: tokio::sync::broadcast::channel(16_384).0,
            keep: Arc::new(true.into()),
        };
        // Real providers take conversations of many megabytes; so does this one.
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/chat/completions", post(complete))
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "scripted LLM server stopped");
            }
        });
        Ok(Self { addr, shared, stop })
    }

    /// The demo model of `hark dev` and `hark worker` without an LLM: the demo script, keeping
    /// no requests, so that it serves any number of tasks in constant memory.
    pub async fn demo() -> std::io::Result<Self> {
        let demo = Self::with_default(Script::demo()).await?;
        demo.set_script(CHINESE_DEFAULT, Script::demo_zh());
        demo.keep_requests(false);
        Ok(demo)
    }

    /// Starts a server with one script as `default`.
    pub async fn with_default(script: Script) -> std::io::Result<Self> {
        Self::start(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            BTreeMap::from([("default".to_owned(), script)]),
        )
        .await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to configure as `llm.base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request from now on, as it arrives.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Recorded> {
        self.shared.feed.subscribe()
    }

    /// Whether to keep requests in memory for [`ScriptedLlm::requests`] (default true; at most
    /// [`KEPT_REQUESTS`] of them).
    pub fn keep_requests(&self, keep: bool) {
        self.shared
            .keep
            .store(keep, std::sync::atomic::Ordering::Relaxed);
    }

    /// Holds the answers to calls of script `name` (`default` for goals that name none): they
    /// are received and recorded, and answered once [`ScriptedLlm::release`] is called.
    pub fn hold(&self, name: &str) {
        self.lock().held.insert((name.to_owned(), None));
    }

    /// Holds the answers to calls of script `name` at step `step` (the number of assistant
    /// messages the conversation has) only.
    pub fn hold_step(&self, name: &str, step: usize) {
        self.lock().held.insert((name.to_owned(), Some(step)));
    }

    /// Answers the held calls of script `name`, and those that come later at once.
    pub fn release(&self, name: &str) {
        self.lock().held.retain(|(held, _)| held != name);
        self.shared.released.notify_waiters();
    }

    pub fn set_script(&self, name: &str, script: Script) {
        self.lock().scripts.insert(name.to_owned(), script);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The requests received so far (the latest [`KEPT_REQUESTS`]).
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.iter().cloned().collect()
    }

    /// Waits until a received request satisfies `matches`; returns it.
    pub async fn wait_for(
        &self,
        wait: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Option<Recorded> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.shared.arrived.notified();
            if let Some(found) = self.requests().into_iter().find(|r| matches(&r.body)) {
                return Some(found);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// The content of the last tool result in the conversation, if any.
pub fn last_tool_result(body: &Value) -> Option<String> {
    body["messages"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str().map(str::to_owned))
}

fn goal_of(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The script used instead of `default` for a task whose system prompt asks for Chinese.
const CHINESE_DEFAULT: &str = "default.zh";

/// Whether the request's system prompt asks for Chinese (the worker's language line).
fn asks_for_chinese(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "system"))
        .and_then(|m| m["content"].as_str())
        .is_some_and(|c| c.contains("简体中文"))
}

fn script_name(goal: &str) -> String {
    goal.split("[script:")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map_or_else(|| "default".to_owned(), |name| name.trim().to_owned())
}

async fn complete(
    State(shared): State<Shared>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    let goal = goal_of(&body);
    let step_index = body["messages"].as_array().map_or(0, |ms| {
        ms.iter().filter(|m| m["role"] == "assistant").count()
    });
    let mut name = script_name(&goal);
    let (step, quirks, failure) = {
        let recorded = Recorded {
            at: Instant::now(),
            body: body.clone(),
            traceparent: headers
                .get(hark_core::trace::HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        };
        let _ = shared.feed.send(recorded.clone());
        let mut inner = shared.inner.lock().unwrap_or_else(|p| p.into_inner());
        if name == "default"
            && inner.scripts.contains_key(CHINESE_DEFAULT)
            && asks_for_chinese(&body)
        {
            name = CHINESE_DEFAULT.to_owned();
        }
        if shared.keep.load(std::sync::atomic::Ordering::Relaxed) {
            if inner.requests.len() == KEPT_REQUESTS {
                inner.requests.pop_front();
            }
            inner.requests.push_back(recorded);
        }
        let script = inner
            .scripts
            .get(&name)
            .or_else(|| inner.scripts.get("default"))
            .cloned()
            .unwrap_or_default();
        let step = script
            .steps
            .get(step_index)
            .cloned()
            .unwrap_or_else(|| Step::say("(the script has no more steps)"));
        let failure = if step.failures.is_empty() {
            None
        } else {
            // Only scripted failures are counted; a long run of them still stays bounded.
            if inner.attempts.len() >= 10 * KEPT_REQUESTS {
                inner.attempts.clear();
            }
            let attempts = inner
                .attempts
                .entry((goal.clone(), step_index))
                .or_insert(0);
            *attempts += 1;
            step.failures.get(*attempts - 1).copied()
        };
        (step, script.quirks, failure)
    };
    shared.arrived.notify_waiters();
    loop {
        let released = shared.released.notified();
        let held = {
            let inner = shared.inner.lock().unwrap_or_else(|p| p.into_inner());
            let script = if inner.scripts.contains_key(&name) {
                name.clone()
            } else {
                "default".to_owned()
            };
            inner.held.contains(&(script.clone(), None))
                || inner.held.contains(&(script, Some(step_index)))
        };
        if !held {
            break;
        }
        released.await;
    }
    if !step.delay.is_zero() {
        tokio::time::sleep(step.delay).await;
    }
    if let Some(status) = failure {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            Json(json!({"error": {"message": "scripted failure"}})),
        )
            .into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("0"));
        }
        return response;
    }
    let call = |name: &str, arguments: Value| {
        let arguments = if quirks.arguments_as_object {
            arguments
        } else {
            json!(arguments.to_string())
        };
        let mut call =
            json!({"type": "function", "function": {"name": name, "arguments": arguments}});
        if !quirks.omit_call_ids {
            call["id"] = json!(format!(
                "call_{step_index}_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ));
        }
        call
    };
    let mut message = match step.action {
        Action::Ask {
            question,
            context,
            timeout_s,
        } => {
            let mut arguments = json!({"question": question});
            if !context.is_empty() {
                arguments["context"] = json!(context);
            }
            if let Some(t) = timeout_s {
                arguments["timeout_s"] = json!(t);
            }
            json!({"role": "assistant", "content": null, "tool_calls": [call("ask_user", arguments)]})
        }
        Action::Call { name, arguments } => {
            json!({"role": "assistant", "content": null, "tool_calls": [call(&name, arguments)]})
        }
        Action::Say(text) => {
            let answer = last_tool_result(&body).unwrap_or_default();
            let answers: Vec<&str> = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["content"].as_str())
                .collect();
            let text = text
                .replace("{answers}", &answers.join("|"))
                .replace("{answer}", &answer)
                .replace("{goal}", &goal);
            json!({"role": "assistant", "content": text})
        }
    };
    if quirks.reasoning_content {
        message["reasoning_content"] = json!(format!("step {step_index}: following the script"));
    }
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    Json(json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        "object": "chat.completion",
        "created": time::OffsetDateTime::now_utc().unix_timestamp(),
        "model": body["model"].as_str().unwrap_or("scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_demo_model_keeps_no_requests_and_a_test_server_keeps_the_latest() {
        let demo = ScriptedLlm::demo().await.expect("demo");
        let kept = ScriptedLlm::with_default(Script::default())
            .await
            .expect("server");
        hark_core::install_crypto();
        let client = reqwest::Client::new();
        for n in 0..(KEPT_REQUESTS + 5) {
            for server in [&demo, &kept] {
                let body = json!({"messages": [{"role": "user", "content": format!("goal {n}")}]});
                let status = client
                    .post(format!("{}/chat/completions", server.base_url()))
                    .json(&body)
                    .send()
                    .await
                    .expect("answers")
                    .status();
                assert!(status.is_success());
            }
        }
        assert!(demo.requests().is_empty());
        let requests = kept.requests();
        assert_eq!(requests.len(), KEPT_REQUESTS);
        assert_eq!(
            requests.last().expect("latest").body["messages"][0]["content"],
            format!("goal {}", KEPT_REQUESTS + 4)
        );
    }

    #[tokio::test]
    async fn the_demo_model_speaks_the_language_the_system_prompt_asks_for() {
        let demo = ScriptedLlm::demo().await.expect("demo");
        hark_core::install_crypto();
        let client = reqwest::Client::new();
        let mut asked = Vec::new();
        for language in [
            hark_core::config::Language::Zh,
            hark_core::config::Language::En,
        ] {
            let body = json!({"messages": [
                {"role": "system", "content": crate::agent::language_line(language)},
                {"role": "user", "content": "say hello"},
            ]});
            let reply: Value = client
                .post(format!("{}/chat/completions", demo.base_url()))
                .json(&body)
                .send()
                .await
                .expect("answers")
                .json()
                .await
                .expect("json");
            let arguments =
                reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .expect("an ask_user call")
                    .to_owned();
            asked.push(arguments);
        }
        assert!(asked[0].contains("该怎么称呼你"), "{}", asked[0]);
        assert!(asked[1].contains("What should I call you"), "{}", asked[1]);
    }

    #[test]
    fn the_goal_names_its_script() {
        assert_eq!(script_name("do it [script:slow] please"), "slow");
        assert_eq!(script_name("do it"), "default");
    }
}
