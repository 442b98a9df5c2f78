//! The loop of one claimed task: an LLM call per round, the tool calls executed, the round
//! checkpointed, until the model answers without tools (the task completes), asks its owner (the
//! task is handed back to task-control and forgotten), is cancelled, or hits the round limit.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use hark_core::{
    config::{ChatLanguage, Language},
    domain::{
        Role,
        shape::{Field, Shape},
    },
};
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::{
    approval,
    control::{self, ControlClient},
    limits, llm, mcp,
    tools::{Checked, Kind},
};

/// How a run ended, from the worker's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// The task waits for an answer; the worker has nothing more to do with it.
    Suspended,
    Failed,
    /// Cancelled, lease lost, or task-control unreachable: stop and write nothing more.
    Stopped(String),
    /// The worker stopped and handed the task back to be continued elsewhere.
    HandedBack,
    /// The task's owner paused it and its round is stored: hand it back, to pause.
    Pausing,
    /// Handed back to pause.
    Paused,
}

/// Instructions handed over by heartbeats while the loop runs, deduplicated by id.
#[derive(Debug, Default, Clone)]
pub struct Inbox {
    inner: Arc<Mutex<(Vec<pb::Instruction>, HashSet<String>)>>,
}

impl Inbox {
    pub fn push(&self, instructions: Vec<pb::Instruction>) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (queue, seen) = &mut *guard;
        for instruction in instructions {
            if seen.insert(instruction.id.clone()) {
                queue.push(instruction);
            }
        }
    }

    fn take(&self) -> Vec<pb::Instruction> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut guard.0)
    }
}

/// What every run shares.
#[derive(Debug, Clone)]
pub struct Runner {
    pub control: ControlClient,
    pub llm: llm::Client,
    /// The tools: the built-in ones and those of the MCP servers.
    pub tools: Arc<mcp::Hub>,
    pub worker_id: String,
    pub max_rounds: u32,
    /// The language of the texts hark itself writes into a chat (`chat.language`).
    pub language: ChatLanguage,
}

/// What the system prompt says of the owner's language: the language of their chat.
pub fn language_line(language: Language) -> &'static str {
    match language {
        Language::Zh => {
            "Write your questions and your result in Chinese (简体中文), the language of the owner's chat.\n"
        }
        Language::En => {
            "Write your questions and your result in English, the language of the owner's chat.\n"
        }
    }
}

/// What the model is told of the task's own deadline, when it has one: when it passes, how
/// far off that is at `now`, and what happens then.
fn deadline_line(spec: &pb::TaskSpec, now: OffsetDateTime) -> Option<String> {
    let deadline = spec.deadline.as_ref()?;
    let at = OffsetDateTime::from_unix_timestamp(deadline.seconds).ok()?;
    let left = hark_core::domain::HumanDuration::from_secs((at - now).unsigned_abs().as_secs());
    let left = if at > now {
        format!("{left} from now")
    } else {
        "already passed".to_owned()
    };
    let ends = match pb::DeadlinePolicy::try_from(spec.on_deadline) {
        Ok(pb::DeadlinePolicy::Cancel) => "cancelled",
        _ => "failed",
    };
    let at = at
        .format(&time::format_description::well_known::Rfc3339)
        .ok()?;
    Some(format!(
        "This task has a deadline: {at} ({left}). When it passes the task is {ends}, whatever it is \
         doing, so finish before then; a question asked with ask_user waits no longer than that.\n"
    ))
}

fn system_prompt(spec: &pb::TaskSpec, language: Language) -> String {
    let mut prompt = format!(
        "You are hark, an assistant working in the background on a task for {owner}. \
         The task's goal is the next message.\n\
         Work step by step with your tools. When you lack information that only {owner} has, or need \
         their decision, call ask_user with one short, specific question: the task pauses until they \
         answer in their chat, and the answer comes back as the tool result. Do not ask about what you \
         can find out or decide yourself.\n",
        owner = spec.owner
    );
    prompt.push_str(language_line(language));
    if let Some(line) = deadline_line(spec, OffsetDateTime::now_utc()) {
        prompt.push_str(&line);
    }
    if !spec.can_ask {
        prompt.push_str("Nobody can answer questions for this task: do not call ask_user.\n");
    }
    prompt.push_str(
        "When you are done, reply without calling any tool. That reply is sent to the owner as the \
         result: begin by saying plainly whether the task succeeded, then give the result.",
    );
    prompt
}

fn tool_message(call_id: &str, content: &str) -> Value {
    json!({"role": "tool", "tool_call_id": call_id, "content": content})
}

fn instruction_message(instruction: &pb::Instruction) -> Value {
    json!({"role": "user", "content": format!("[instruction from {}] {}", instruction.author, instruction.text)})
}

fn round(number: u32, messages: &[Value]) -> pb::Round {
    pb::Round {
        number,
        messages_json: serde_json::to_vec(messages).unwrap_or_else(|_| b"[]".to_vec()),
        partial: false,
    }
}

/// A question the model asked in this round, or an approval hark asks for.
#[derive(Debug)]
pub(crate) struct PendingAsk {
    pub(crate) call_id: String,
    pub(crate) question: String,
    pub(crate) context: String,
    pub(crate) timeout_s: u32,
    pub(crate) shape: Shape,
    /// The subtask whose end answers it, instead of a person; empty for a person.
    pub(crate) waits_for: String,
    /// Who else is asked, in order, while nobody answers, and after how long (0: the default).
    pub(crate) escalate_to: Vec<String>,
    pub(crate) escalate_after_s: u32,
    /// The people asked at once instead of the owner, and how many of them must answer.
    pub(crate) ask_to: Vec<String>,
    pub(crate) need: String,
}

/// The `escalate_to` of a call's arguments: one person or a list of them.
fn escalate_to_of(arguments: &serde_json::Map<String, Value>) -> Vec<String> {
    people_of(arguments, "escalate_to")
}

/// The people under `key` of a call's arguments: one or a list.
fn people_of(arguments: &serde_json::Map<String, Value>, key: &str) -> Vec<String> {
    match arguments.get(key) {
        Some(Value::String(one)) if !one.trim().is_empty() => vec![one.trim().to_owned()],
        Some(Value::Array(many)) => many
            .iter()
            .filter_map(Value::as_str)
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The `timeout_s` of a call's arguments, in seconds; 0 when not given.
fn timeout_of(arguments: &serde_json::Map<String, Value>) -> u32 {
    arguments
        .get("timeout_s")
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .unwrap_or(0)
}

/// The shape of the answer an ask_user call asks for, checked; the error is for the model.
fn shape_of(arguments: &serde_json::Map<String, Value>) -> Result<Shape, String> {
    let kind = arguments.get("kind").and_then(Value::as_str).unwrap_or("");
    let choices: Vec<String> = arguments
        .get("choices")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let multiple = arguments
        .get("multiple")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let fields: Vec<Field> = match arguments.get("fields") {
        None | Some(Value::Null) => Vec::new(),
        Some(fields) => {
            serde_json::from_value(fields.clone()).map_err(|e| format!("fields: {e}"))?
        }
    };
    Shape::of(kind, &choices, multiple, fields).map_err(|e| e.to_string())
}

impl Runner {
    /// The language hark's own chat texts take for the task's chat.
    fn language_of(&self, spec: &pb::TaskSpec) -> Language {
        let platform = spec.chat.as_ref().map_or("", |c| c.platform.as_str());
        Language::of(self.language.fixed(), platform)
    }

    /// Runs a claimed task until it completes, suspends, fails or must stop. `cancel` stops it
    /// at its next step; `gone` says the task is no longer held (its lease lost, or it was
    /// cancelled), so that requests waiting for task-control give up.
    pub async fn run(
        &self,
        claimed: pb::ClaimResponse,
        cancel: CancellationToken,
        gone: CancellationToken,
        inbox: Inbox,
    ) -> Outcome {
        let (Some(spec), Some(lease)) = (claimed.task.clone(), claimed.lease.clone()) else {
            return Outcome::Stopped("the claim carried no task or lease".into());
        };
        let run = Run {
            runner: self,
            lease: &lease,
            gone: &gone,
        };
        let role: Role = spec.owner_role.parse().unwrap_or(Role::Guest);
        let stored = match run.checkpoint_of(&claimed).await {
            Ok(stored) => stored,
            Err(e) => return run.settle(e).await,
        };
        if !spec.questionnaire.is_empty() {
            return run
                .questionnaire(&spec, &stored, claimed.resume.as_ref())
                .await;
        }
        let mut history: Vec<Value> = Vec::new();
        for (number, bytes) in &stored {
            match serde_json::from_slice::<Vec<Value>>(bytes) {
                Ok(messages) => history.extend(messages),
                Err(e) => {
                    let error = format!("round {number} of the checkpoint is unreadable: {e}");
                    return run.fail(&error).await;
                }
            }
        }
        let mut number = stored.last().map_or(0, |(n, _)| *n);
        let mut pending: Vec<Value> = Vec::new();
        let mut consumed: Vec<String> = Vec::new();
        if history.is_empty() {
            let language = self.language_of(&spec);
            pending.push(json!({"role": "system", "content": system_prompt(&spec, language)}));
            pending.push(json!({"role": "user", "content": spec.goal}));
        }
        let registry = self.tools.registry();
        let mut approved = approval::granted(&history);
        if let Some(resume) = &claimed.resume {
            if approval::asked_by_hark(&resume.tool_call_id) {
                let mut ctx = Resuming {
                    spec: &spec,
                    registry: &registry,
                    history: &history,
                    approved: &mut approved,
                    pending: &mut pending,
                    cancel: &cancel,
                    number,
                };
                match run.resume_call(&mut ctx, resume).await {
                    Ok(None) => {}
                    Ok(Some(ask)) => {
                        return run
                            .ask(&spec, round(number + 1, &pending), Vec::new(), ask)
                            .await;
                    }
                    Err(outcome) => return outcome,
                }
            } else {
                pending.push(tool_message(&resume.tool_call_id, &resume.text));
            }
        }
        inbox.push(claimed.instructions.clone());
        let offered = registry.offered(role);

        loop {
            if cancel.is_cancelled() {
                return Outcome::Stopped("cancelled".into());
            }
            number += 1;
            for instruction in inbox.take() {
                pending.push(instruction_message(&instruction));
                consumed.push(instruction.id);
            }
            if number > self.max_rounds {
                let note = format!(
                    "The task stopped after {} rounds (task.max_rounds) without a final answer.",
                    self.max_rounds
                );
                let last = (!pending.is_empty()).then(|| round(number, &pending));
                return match self.control.complete(&lease, last, &note, &gone).await {
                    Ok(()) => Outcome::Completed,
                    Err(e) => run.settle(e).await,
                };
            }
            let messages: Vec<Value> = history
                .iter()
                .chain(&pending)
                .filter(|m| approval::for_model(m))
                .cloned()
                .collect();
            let call_prefix = format!("r{number}");
            tracing::debug!(task = spec.id, round = number, "calling the LLM");
            let reply = tokio::select! {
                _ = cancel.cancelled() => return Outcome::Stopped("cancelled during an LLM call".into()),
                reply = self.llm.complete(&messages, offered, &call_prefix) => reply,
            };
            let mut reply = match reply {
                Ok(reply) => reply,
                Err(e) => return run.fail(&format!("the LLM call failed: {e}")).await,
            };
            // A model output too large to keep is cut, and what the model reads says so.
            let mut message = reply.message.clone();
            if limits::shrink(&mut message, limits::MAX_MODEL_MESSAGE)
                && let Some(shrunk) = llm::parse_message(message, &call_prefix)
            {
                tracing::warn!(
                    task = spec.id,
                    round = number,
                    "the model's message was cut to fit"
                );
                reply = shrunk;
            }
            pending.push(reply.message.clone());
            if reply.tool_calls.is_empty() {
                let answer = reply.content.clone().unwrap_or_default();
                let answer = if answer.trim().is_empty() {
                    "(the model gave an empty answer)".to_owned()
                } else {
                    answer
                };
                return match self
                    .control
                    .complete(&lease, Some(round(number, &pending)), &answer, &gone)
                    .await
                {
                    Ok(()) => Outcome::Completed,
                    Err(e) => run.settle(e).await,
                };
            }

            let mut ask: Option<PendingAsk> = None;
            for (index, call) in reply.tool_calls.iter().enumerate() {
                if index >= limits::MAX_CALLS_PER_ROUND {
                    let note = format!(
                        "error: at most {} tool calls run in one round; call this one again in the next.",
                        limits::MAX_CALLS_PER_ROUND
                    );
                    pending.push(tool_message(&call.id, &note));
                    continue;
                }
                let key = format!("{}:{number}:{}", spec.id, call.id);
                let started = std::time::Instant::now();
                // Spans the tool's work from here to its result (ask_user ends the run instead).
                let tool_span = tracing::info_span!(
                    "execute_tool",
                    otel.name = format!("execute_tool {}", call.name),
                    otel.kind = "internal",
                    gen_ai.operation.name = "execute_tool",
                    gen_ai.tool.name = %call.name,
                    gen_ai.tool.call.id = %call.id,
                );
                let result = match registry.check(call, role) {
                    Err(error) => error,
                    Ok(checked) => match &checked.tool.kind {
                        Kind::AskUser if !spec.can_ask => {
                            "error: nobody can answer questions for this task. Decide without asking.".to_owned()
                        }
                        Kind::AskUser if ask.is_some() => {
                            "error: ask one question at a time; ask this one after the first is answered.".to_owned()
                        }
                        Kind::AskUser => {
                            let text = |k: &str| {
                                let value = checked.arguments.get(k).and_then(Value::as_str).unwrap_or("");
                                limits::cut(value, limits::MAX_QUESTION)
                            };
                            let shape = match shape_of(&checked.arguments) {
                                Ok(shape) => shape,
                                Err(e) => {
                                    pending.push(tool_message(&call.id, &format!("error: {e}")));
                                    continue;
                                }
                            };
                            ask = Some(PendingAsk {
                                shape,
                                waits_for: String::new(),
                                call_id: call.id.clone(),
                                question: text("question"),
                                context: text("context"),
                                timeout_s: timeout_of(&checked.arguments),
                                escalate_to: escalate_to_of(&checked.arguments),
                                escalate_after_s: checked
                                    .arguments
                                    .get("escalate_after_s")
                                    .and_then(Value::as_u64)
                                    .and_then(|s| u32::try_from(s).ok())
                                    .unwrap_or(0),
                                ask_to: people_of(&checked.arguments, "ask_to"),
                                // A number given as a number is taken as well.
                                need: match checked.arguments.get("need") {
                                    Some(Value::String(need)) => need.clone(),
                                    Some(Value::Number(n)) => n.to_string(),
                                    _ => String::new(),
                                },
                            });
                            continue;
                        }
                        Kind::CreateSubtask => {
                            let goal = checked.arguments.get("goal").and_then(Value::as_str).unwrap_or("");
                            let wait = checked.arguments.get("wait").and_then(Value::as_bool).unwrap_or(false);
                            if wait && ask.is_some() {
                                "error: a question is already waiting; create the subtask after the answer.".to_owned()
                            } else {
                                match self.control.subtask(&lease, goal, &key, &gone).await {
                                    Err(e) if e.is_final() => return Outcome::Stopped(e.to_string()),
                                    Err(e) => format!("error: the subtask was not created: {e}"),
                                    Ok(subtask) if wait => {
                                        ask = Some(PendingAsk {
                                            call_id: call.id.clone(),
                                            question: format!(
                                                "waiting for subtask {subtask}: {}",
                                                limits::cut(goal, 200)
                                            ),
                                            context: String::new(),
                                            timeout_s: timeout_of(&checked.arguments),
                                            shape: Shape::Text,
                                            waits_for: subtask,
                                            escalate_to: Vec::new(),
                                            escalate_after_s: 0,
                                            ask_to: Vec::new(),
                                            need: String::new(),
                                        });
                                        continue;
                                    }
                                    Ok(subtask) => json!({"task": subtask, "state": "pending"}).to_string(),
                                }
                            }
                        }
                        _ if checked.tool.approval && !approved.contains(&checked.tool.name) => {
                            if !spec.can_ask {
                                format!(
                                    "error: `{}` runs only with its owner's approval, and nobody can be asked for this task.",
                                    checked.tool.name
                                )
                            } else if ask.is_some() {
                                format!(
                                    "error: `{}` needs its owner's approval, and a question is already waiting; call it again after the answer.",
                                    checked.tool.name
                                )
                            } else {
                                let language = self.language_of(&spec);
                                ask = Some(approval::ask(language, &checked, &call.id));
                                continue;
                            }
                        }
                        _ => match run.execute(&spec, &checked, &call.id, &key, Vec::new(), &cancel).await {
                            Ok(Step::Result(result)) => result,
                            Ok(Step::Asks(_)) if !spec.can_ask => format!(
                                "error: `{}` asked for input, and nobody can be asked for this task; it did not finish.",
                                checked.tool.name
                            ),
                            Ok(Step::Asks(_)) if ask.is_some() => format!(
                                "error: `{}` asked for input while a question is already waiting; call it again after the answer.",
                                checked.tool.name
                            ),
                            Ok(Step::Asks(asks)) => {
                                ask = Some(asks);
                                continue;
                            }
                            Err(outcome) => return outcome,
                        },
                    },
                };
                let label = registry.get(&call.name).map_or("", |t| t.metric_name());
                self.llm.metrics().tool(label, started.elapsed());
                drop(tool_span);
                pending.push(tool_message(
                    &call.id,
                    &limits::cut(&result, limits::MAX_TOOL_RESULT),
                ));
            }

            let this_round = round(number, &pending);
            if let Some(ask) = ask {
                return run
                    .ask(&spec, this_round, std::mem::take(&mut consumed), ask)
                    .await;
            }
            match self
                .control
                .checkpoint(&lease, this_round, std::mem::take(&mut consumed), &gone)
                .await
            {
                Ok(false) => {}
                // The round just stored is the boundary a pause waits for.
                Ok(true) => return Outcome::Pausing,
                Err(e) => return run.settle(e).await,
            }
            history.append(&mut pending);
        }
    }
}

/// What running a tool came to.
enum Step {
    /// Its result, for the model.
    Result(String),
    /// It needs its owner's input first.
    Asks(PendingAsk),
}

/// What resuming a call hark asked about works on.
struct Resuming<'a> {
    spec: &'a pb::TaskSpec,
    registry: &'a crate::tools::Registry,
    history: &'a [Value],
    approved: &'a mut std::collections::HashSet<String>,
    pending: &'a mut Vec<Value>,
    cancel: &'a CancellationToken,
    /// The last round stored.
    number: u32,
}

/// One claimed run: what its steps need to talk to task-control about it.
struct Run<'a> {
    runner: &'a Runner,
    lease: &'a pb::Lease,
    gone: &'a CancellationToken,
}

/// At most one progress message per call this often reaches the chat.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Run<'_> {
    /// Runs a checked call of a tool that neither asks nor waits for approval; the text is the
    /// model's. `Err` when the run must end.
    async fn execute(
        &self,
        spec: &pb::TaskSpec,
        checked: &Checked<'_>,
        call_id: &str,
        key: &str,
        answers: Vec<mcp::Elicited>,
        cancel: &CancellationToken,
    ) -> Result<Step, Outcome> {
        let runner = self.runner;
        let role: Role = spec.owner_role.parse().unwrap_or(Role::Guest);
        Ok(Step::Result(match &checked.tool.kind {
            Kind::AskUser => "error: ask_user cannot run here.".to_owned(),
            Kind::SendMessage => {
                let text = checked
                    .arguments
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                match runner.control.send(self.lease, text, key, self.gone).await {
                    Ok(()) => "sent".to_owned(),
                    Err(e) if e.is_final() => return Err(Outcome::Stopped(e.to_string())),
                    Err(e) => format!("error: the message could not be sent: {e}"),
                }
            }
            Kind::ListTools => {
                let registry = runner.tools.registry();
                let list: Vec<Value> = registry
                    .discoverable(role)
                    .into_iter()
                    .map(|t| json!({"name": t.name, "description": t.description}))
                    .collect();
                json!({"tools": list, "hint": "call get_tool_schema with a name, then call the tool"})
                    .to_string()
            }
            Kind::GetToolSchema => {
                let name = checked
                    .arguments
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                match runner.tools.registry().get(name) {
                    Some(tool) if tool.min_role <= role => tool.declaration().to_string(),
                    _ => format!(
                        "error: there is no tool `{}` you can use.",
                        limits::cut(name, 64)
                    ),
                }
            }
            Kind::CurrentTime => time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            Kind::WorkerInfo => json!({"worker_id": runner.worker_id}).to_string(),
            Kind::CreateSubtask => "error: create_subtask cannot run here.".to_owned(),
            Kind::ListMyTasks => {
                let states: Vec<String> = checked
                    .arguments
                    .get("states")
                    .and_then(Value::as_array)
                    .map(|s| {
                        s.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                let limit = checked
                    .arguments
                    .get("limit")
                    .and_then(Value::as_u64)
                    .map_or(0, |l| l.min(50) as u32);
                match runner
                    .control
                    .tasks(self.lease, states, limit, self.gone)
                    .await
                {
                    Ok(tasks) => {
                        let tasks: Vec<Value> = tasks
                            .into_iter()
                            .map(|t| {
                                let mut task = json!({"id": t.id, "goal": t.goal, "state": t.state,
                                    "created_at": t.created_at});
                                if !t.result.is_empty() {
                                    task["result"] = json!(t.result);
                                }
                                if !t.error.is_empty() {
                                    task["error"] = json!(t.error);
                                }
                                task
                            })
                            .collect();
                        json!({"tasks": tasks}).to_string()
                    }
                    Err(e) if e.is_final() => return Err(Outcome::Stopped(e.to_string())),
                    Err(e) => format!("error: the tasks could not be listed: {e}"),
                }
            }
            Kind::FetchUrl => {
                let url = checked
                    .arguments
                    .get("url")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                tokio::select! {
                    _ = cancel.cancelled() => {
                        return Err(Outcome::Stopped("cancelled during a tool call".into()));
                    }
                    text = runner.tools.fetch(url) => text,
                }
            }
            Kind::Mcp { server, tool } => {
                let (progress, mut reports) = tokio::sync::mpsc::unbounded_channel();
                let call = runner.tools.call(
                    *server,
                    tool,
                    checked.arguments.clone(),
                    key,
                    progress,
                    answers,
                );
                tokio::pin!(call);
                let mut last: Option<std::time::Instant> = None;
                let mut sent = 0u32;
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => {
                            return Err(Outcome::Stopped("cancelled during a tool call".into()));
                        }
                        result = &mut call => break match result {
                            Ok(mcp::Called::Done(text)) => text,
                            Ok(mcp::Called::Asks { message, shape }) => {
                                return Ok(Step::Asks(approval::elicitation(
                                    &checked.tool.name,
                                    call_id,
                                    &message,
                                    shape,
                                )));
                            }
                            Err(e) => e.to_string(),
                        },
                        Some(report) = reports.recv() => {
                            if last.is_some_and(|at| at.elapsed() < PROGRESS_EVERY) {
                                continue;
                            }
                            last = Some(std::time::Instant::now());
                            sent += 1;
                            let text = approval::progress_text(&checked.tool.name, &report);
                            let key = format!("{key}:progress:{sent}");
                            // Progress is best effort: a note that cannot be sent is dropped.
                            if let Err(e) = runner.control.send(self.lease, &text, &key, self.gone).await {
                                tracing::debug!(task = spec.id, error = %e, "a progress note was not sent");
                            }
                        }
                    }
                }
            }
        }))
    }

    /// Asks the owner `ask`, storing `round` with it; the task waits, and this run ends.
    async fn ask(
        &self,
        spec: &pb::TaskSpec,
        round: pb::Round,
        consumed: Vec<String>,
        ask: PendingAsk,
    ) -> Outcome {
        let (kind, choices, multiple, fields) = ask.shape.to_proto();
        let request = pb::AskRequest {
            lease: Some(self.lease.clone()),
            round: Some(round),
            consumed_instruction_ids: consumed,
            tool_call_id: ask.call_id,
            question: ask.question,
            context: ask.context,
            timeout_s: ask.timeout_s,
            kind,
            choices,
            multiple,
            fields,
            waits_for_task: ask.waits_for,
            escalate_to: ask.escalate_to,
            escalate_after_s: ask.escalate_after_s,
            ask_to: ask.ask_to,
            need: ask.need,
            ..Default::default()
        };
        match self.runner.control.ask(request, self.gone).await {
            Ok(asked) => {
                tracing::debug!(
                    task = spec.id,
                    handle = asked.handle,
                    "task suspended on a question"
                );
                Outcome::Suspended
            }
            Err(e) => self.settle(e).await,
        }
    }

    /// The answer to a question hark asked on a call's behalf (its approval, or its server's
    /// input request): the call runs now and its result is added, or it did not run and the
    /// model reads why; `Some` when the call asks again.
    async fn resume_call(
        &self,
        ctx: &mut Resuming<'_>,
        resume: &pb::Resume,
    ) -> Result<Option<PendingAsk>, Outcome> {
        let role: Role = ctx.spec.owner_role.parse().unwrap_or(Role::Guest);
        let (call_id, answers) = match resume.tool_call_id.strip_prefix(approval::ELICIT_PREFIX) {
            Some(call_id) => {
                let mut answers = approval::elicited(ctx.history, call_id);
                let answer = (!resume.expired)
                    .then(|| serde_json::from_str::<Value>(&resume.text).ok())
                    .flatten();
                ctx.pending
                    .push(approval::elicited_record(call_id, answer.as_ref()));
                answers.push(answer);
                (call_id, Some(answers))
            }
            None => (
                resume
                    .tool_call_id
                    .strip_prefix(approval::CALL_PREFIX)
                    .unwrap_or(&resume.tool_call_id),
                None,
            ),
        };
        let Some(call) = approval::call_in(ctx.history, call_id) else {
            let error = format!("error: the call {call_id} is not in the conversation.");
            ctx.pending.push(tool_message(call_id, &error));
            return Ok(None);
        };
        let decision = match answers {
            Some(_) => approval::Decision::Approve {
                for_task: false,
                arguments: None,
            },
            None => approval::Decision::of(resume),
        };
        let result = match decision {
            approval::Decision::Expired => format!(
                "the owner did not answer the request to approve `{}` in time; it did not run.",
                call.name
            ),
            approval::Decision::Deny { reason: None } => {
                format!("the owner declined; `{}` did not run.", call.name)
            }
            approval::Decision::Deny {
                reason: Some(reason),
            } => format!(
                "the owner declined; `{}` did not run. Their reason: {}",
                call.name,
                limits::cut(&reason, limits::MAX_QUESTION)
            ),
            approval::Decision::Approve {
                for_task,
                arguments,
            } => match ctx
                .registry
                .check(&approval::with_arguments(&call, arguments.clone()), role)
            {
                Err(error) => error,
                Ok(checked) => {
                    if for_task {
                        ctx.pending.push(approval::record(&checked.tool.name));
                        ctx.approved.insert(checked.tool.name.clone());
                    }
                    let key = approval::call_key(&ctx.spec.id, call_id, ctx.number);
                    let answers = answers.unwrap_or_default();
                    match self
                        .execute(ctx.spec, &checked, call_id, &key, answers, ctx.cancel)
                        .await?
                    {
                        // The model's own call shows its arguments: it reads which the owner
                        // changed before the result.
                        Step::Result(result) => match &arguments {
                            Some(changed) => format!(
                                "the owner approved it with changed arguments {}; it ran:\n{result}",
                                Value::Object(changed.clone())
                            ),
                            None => result,
                        },
                        Step::Asks(ask) => return Ok(Some(ask)),
                    }
                }
            },
        };
        ctx.pending.push(tool_message(
            call_id,
            &limits::cut(&result, limits::MAX_TOOL_RESULT),
        ));
        Ok(None)
    }

    /// The whole checkpoint, as (round, its messages' JSON): the rounds the claim carried, and
    /// the rest fetched piece by piece when it did not carry them all.
    async fn checkpoint_of(
        &self,
        claimed: &pb::ClaimResponse,
    ) -> Result<Vec<(u32, Vec<u8>)>, control::Error> {
        let mut whole: Vec<(u32, Vec<u8>)> = Vec::new();
        // The bytes of a round received so far, when the last piece was part of one.
        let mut partial: Vec<u8> = Vec::new();
        let take =
            |rounds: Vec<pb::Round>, whole: &mut Vec<(u32, Vec<u8>)>, partial: &mut Vec<u8>| {
                for piece in rounds {
                    partial.extend(piece.messages_json);
                    if !piece.partial {
                        whole.push((piece.number, std::mem::take(partial)));
                    }
                }
            };
        take(claimed.rounds.clone(), &mut whole, &mut partial);
        let mut more = claimed.more_rounds;
        while more {
            let after = whole.last().map_or(0, |(n, _)| *n);
            let piece = self
                .runner
                .control
                .history(self.lease, after, partial.len() as u64, self.gone)
                .await?;
            more = piece.more;
            if piece.rounds.is_empty() && more {
                return Err(control::Error::Refused {
                    reason: pb::RefusalReason::Unspecified,
                    message: "task-control sent an empty piece of the checkpoint".into(),
                });
            }
            take(piece.rounds, &mut whole, &mut partial);
        }
        Ok(whole)
    }

    /// A questionnaire's step: the answer it resumed with is recorded, then the next question
    /// unanswered is asked, or, with none left, the task completes with every answer. Each
    /// round of its checkpoint holds the answers so far.
    async fn questionnaire(
        &self,
        spec: &pb::TaskSpec,
        stored: &[(u32, Vec<u8>)],
        resume: Option<&pb::Resume>,
    ) -> Outcome {
        use hark_core::domain::form::progress;
        let number = stored.last().map_or(0, |(n, _)| *n) + 1;
        let mut answers = match stored.last() {
            None => serde_json::Map::new(),
            Some((n, bytes)) => match progress::answers_of(bytes) {
                Ok(answers) => answers,
                Err(e) => {
                    return self
                        .fail(&format!(
                            "round {n} of the questionnaire is unreadable: {e}"
                        ))
                        .await;
                }
            },
        };
        let shape_of = |q: &pb::FormQuestion| {
            Shape::from_proto(&q.kind, &q.choices, q.multiple, &q.fields).unwrap_or_default()
        };
        if let Some(resume) = resume {
            let asked = spec
                .questionnaire
                .iter()
                .find(|q| resume.tool_call_id == progress::call_id(&q.key));
            // A question put to several people resumes with every answer and its author.
            let all = asked
                .filter(|q| q.ask_to.len() > 1 && !resume.expired)
                .and_then(|_| serde_json::from_str::<Value>(&resume.text).ok())
                .and_then(|mut v| v.get_mut("answers").map(Value::take));
            match all {
                Some(all) => progress::record_value(&mut answers, &resume.tool_call_id, all),
                None => progress::record(
                    &mut answers,
                    &resume.tool_call_id,
                    resume.expired,
                    &resume.text,
                    &asked.map(shape_of).unwrap_or_default(),
                ),
            }
        }
        let keys = spec.questionnaire.iter().map(|q| q.key.as_str());
        let control = &self.runner.control;
        match progress::next(keys.clone(), &answers)
            .and_then(|key| spec.questionnaire.iter().find(|q| q.key == key))
        {
            Some(question) => {
                let request = pb::AskRequest {
                    lease: Some(self.lease.clone()),
                    round: Some(round(
                        number,
                        &progress::step(&answers, Some(&question.key)),
                    )),
                    tool_call_id: progress::call_id(&question.key),
                    question: question.text.clone(),
                    kind: question.kind.clone(),
                    choices: question.choices.clone(),
                    multiple: question.multiple,
                    fields: question.fields.clone(),
                    escalate_to: question.escalate_to.clone(),
                    escalate_after_s: question.escalate_after_s,
                    ask_to: question.ask_to.clone(),
                    need: question.need.clone(),
                    context: question.context.clone(),
                    ..Default::default()
                };
                match control.ask(request, self.gone).await {
                    Ok(_) => Outcome::Suspended,
                    Err(e) => self.settle(e).await,
                }
            }
            None => {
                let result = progress::output(keys, &answers);
                let last = round(number, &progress::step(&answers, None));
                match control
                    .complete(self.lease, Some(last), &result, self.gone)
                    .await
                {
                    Ok(()) => Outcome::Completed,
                    Err(e) => self.settle(e).await,
                }
            }
        }
    }

    /// What a failed request means for the run: a refusal that will never pass (the request is
    /// invalid) fails the task with its reason; anything else means the task is not ours any
    /// more.
    async fn settle(&self, error: control::Error) -> Outcome {
        use hark_core::error::Classified as _;
        match error.kind() {
            hark_core::error::Kind::Invalid | hark_core::error::Kind::Internal => {
                self.fail(&format!("task-control refused the run's step: {error}"))
                    .await
            }
            _ => Outcome::Stopped(error.to_string()),
        }
    }

    async fn fail(&self, error: &str) -> Outcome {
        tracing::warn!(task = self.lease.task_id, error, "task failed");
        match self.runner.control.fail(self.lease, error, self.gone).await {
            Ok(()) => Outcome::Failed,
            Err(e) => Outcome::Stopped(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_told_the_tasks_deadline_and_what_it_does() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("time");
        let mut spec = pb::TaskSpec::default();
        assert_eq!(deadline_line(&spec, now), None);
        spec.deadline = Some(prost_types::Timestamp {
            seconds: 1_800_000_000 + 5400,
            nanos: 0,
        });
        let line = deadline_line(&spec, now).expect("a line");
        assert!(
            line.contains("2027-01-15T09:30:00Z") && line.contains("1h30m from now"),
            "{line}"
        );
        assert!(line.contains("the task is failed"), "{line}");
        spec.on_deadline = pb::DeadlinePolicy::Cancel as i32;
        let late = now + time::Duration::hours(2);
        let line = deadline_line(&spec, late).expect("a line");
        assert!(
            line.contains("already passed") && line.contains("the task is cancelled"),
            "{line}"
        );
    }

    #[test]
    fn escalate_to_takes_one_person_or_a_list() {
        let args = |v: Value| v.as_object().cloned().expect("object");
        assert_eq!(
            escalate_to_of(&args(json!({"escalate_to": " qq:200 "}))),
            ["qq:200"]
        );
        assert_eq!(
            escalate_to_of(&args(json!({"escalate_to": ["200", "", 7, "qq:300"]}))),
            ["200", "qq:300"]
        );
        assert!(escalate_to_of(&args(json!({"question": "q"}))).is_empty());
    }
}
