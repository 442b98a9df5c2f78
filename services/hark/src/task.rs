//! `hark task …`: a client of the gRPC API, with readable output or `--json`.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use hark_core::{
    config::Config,
    domain::{DeadlinePolicy, HumanDuration, TaskState, TimeoutPolicy},
};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use serde_json::{Value, json};
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, Endpoint},
};

/// How a client of the gRPC API reaches it, and how it prints.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The gRPC API to talk to [default: http://<control.grpc_listen>]
    #[arg(long, env = "HARK_API", global = true, value_name = "URL")]
    pub api: Option<String>,
    /// A bearer token: one of the server's control.api_tokens, or a person's own key.
    #[arg(long, env = "HARK_API_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON (one object per line) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    #[command(flatten)]
    args: ApiArgs,
    #[command(subcommand)]
    command: TaskCommand,
}

/// What `hark task new` takes.
#[derive(Debug, Args)]
struct NewArgs {
    /// Who the task works for, as platform:user_id [default: cli:local; with a person's key
    /// as --token, its owner]
    #[arg(long)]
    owner: Option<String>,
    /// Default question deadline, e.g. 90s, 30m, 2h [default: task.ask_timeout]
    #[arg(long)]
    timeout: Option<HumanDuration>,
    /// On a question's expiry: resume, fail or never [default: task.on_timeout]
    #[arg(long)]
    on_timeout: Option<String>,
    /// How long the task may take in all, e.g. 2h [default: task.deadline]
    #[arg(long, conflicts_with_all = ["start_in", "cron"])]
    deadline: Option<HumanDuration>,
    /// When the deadline passes: fail or cancel [default: task.on_deadline]
    #[arg(long, requires = "deadline")]
    on_deadline: Option<String>,
    /// Ask and report in this chat: platform, bot and stream (e.g. qq 10001 group:123456).
    #[arg(long, num_args = 3, value_names = ["PLATFORM", "BOT", "STREAM"])]
    chat: Option<Vec<String>>,
    /// Idempotency key: the same key creates the task once.
    #[arg(long)]
    request_id: Option<String>,
    /// Make it a questionnaire, which asks these questions in turn without an agent; each
    /// is its text, then any choices after `|` (e.g. --ask "Which size?|S|M|L").
    #[arg(long = "ask", value_name = "QUESTION")]
    questionnaire: Vec<String>,
    /// Each question still unanswered is also asked of this person, then the next (a user
    /// id on the platform of --chat, or platform:user_id); the first answer counts.
    #[arg(long = "escalate-to", value_name = "PERSON", requires_all = ["questionnaire", "chat"])]
    escalate_to: Vec<String>,
    /// How long each question waits before it goes to the next of --escalate-to, e.g. 30m
    /// [default: at its first reminder, task.remind_before ahead of its deadline]
    #[arg(long, value_name = "DURATION", requires = "escalate_to")]
    escalate_after: Option<HumanDuration>,
    /// Put each question to these people at once instead of the owner (named as for
    /// --escalate-to); in a group chat each is asked there, with a mention.
    #[arg(long = "ask-to", value_name = "PERSON", requires_all = ["questionnaire", "chat"],
          conflicts_with = "escalate_to")]
    ask_to: Vec<String>,
    /// With --ask-to: how many must answer each question: any, all or a number [default: any]
    #[arg(long, requires = "ask_to")]
    need: Option<String>,
    /// Start it later: after this long (e.g. 30m).
    #[arg(long = "in", value_name = "DURATION", conflicts_with = "cron")]
    start_in: Option<HumanDuration>,
    /// Start it again at every time this cron expression names (e.g. "0 9 * * 1-5").
    #[arg(long)]
    cron: Option<String>,
    /// The time zone of --cron [default: the server's task.timezone].
    #[arg(long)]
    timezone: Option<String>,
    /// -100..100: when workers are scarce, higher priorities are claimed first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Then follow the task until it ends: each question is shown and answered with a line
    /// read from stdin (or in its chat); exits 1 when it fails or is cancelled.
    #[arg(long, conflicts_with_all = ["start_in", "cron"])]
    wait: bool,
    /// What the task should achieve (for a questionnaire, an optional title).
    #[arg(trailing_var_arg = true)]
    goal: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum TaskCommand {
    /// Create a task.
    New(Box<NewArgs>),
    /// List tasks, newest first.
    List {
        #[arg(long)]
        owner: Option<String>,
        /// Only these states (pending, running, waiting_input, completed, failed, cancelled).
        #[arg(long = "state")]
        states: Vec<String>,
        #[arg(long)]
        stream: Option<String>,
        #[arg(long)]
        platform: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Continue after a previous page.
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Show a task and its questions. The id may be a unique prefix.
    Get { id: String },
    /// Cancel a task.
    Cancel {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Pause a task: at once when it waits or is queued, at the end of its round when it runs.
    Pause { id: String },
    /// Resume a paused task.
    Resume { id: String },
    /// Answer a task's open question (or, with --question, a question by its id).
    Answer {
        /// A task id (or prefix), a `#handle` as `hark task questions` prints it, or with
        /// --question a question id.
        id: String,
        #[arg(required = true, trailing_var_arg = true)]
        text: Vec<String>,
        /// The id is a question id.
        #[arg(long)]
        question: bool,
        /// The answer is JSON: a choice's text, a list of them, true/false, or a form's object.
        #[arg(long)]
        json: bool,
        /// Answer as this owner (platform:user_id); must be the task's owner.
        #[arg(long = "as")]
        answerer: Option<String>,
        /// Idempotency key: the same key applies the answer once.
        #[arg(long)]
        request_id: Option<String>,
        /// Then wait until the task asks its next question or ends, and show that.
        #[arg(long)]
        wait: bool,
        /// The longest wait, in seconds (at most 300).
        #[arg(long, default_value_t = 30)]
        wait_timeout: u32,
    },
    /// Pass an open question on to another person: it is asked of them from now on, and only
    /// they answer it.
    Delegate {
        /// A question id, or a `#handle` as `hark task questions` prints it.
        question: String,
        /// The person to ask instead, as platform:user_id.
        to: String,
        /// Idempotency key: the same key passes it on once.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Tell a task something: a running task sees it at its next round, a waiting one on resume.
    Tell {
        id: String,
        #[arg(required = true, trailing_var_arg = true)]
        text: Vec<String>,
        #[arg(long, default_value = "cli")]
        author: String,
    },
    /// Follow a task's state changes until it ends; without an id, follow every task's (or the
    /// ones --owner and --state pick), each event with a token --resume goes on after.
    Watch {
        id: Option<String>,
        #[arg(long, conflicts_with = "id")]
        owner: Option<String>,
        /// Only events into these states.
        #[arg(long = "state", conflicts_with = "id")]
        states: Vec<String>,
        /// Go on after the event this token came with.
        #[arg(long, conflicts_with = "id")]
        resume: Option<String>,
    },
    /// List questions: open ones, or all with --all.
    Questions {
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        stream: Option<String>,
        #[arg(long)]
        platform: Option<String>,
        /// Include answered, expired, cancelled and superseded questions.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// Adds the bearer token to every call.
#[derive(Debug, Clone)]
pub(crate) struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

pub(crate) type Client = TaskServiceClient<InterceptedService<Channel, Bearer>>;

/// A client of the gRPC API as `args` say (or at `control.grpc_listen`).
pub(crate) async fn client(config: &Config, args: &ApiArgs) -> anyhow::Result<Client> {
    let token = args.token.as_deref();
    let api = match args.api.as_deref() {
        // `127.0.0.1:50051` means what `http://127.0.0.1:50051` says.
        Some(api) if !api.contains("://") => format!("http://{api}"),
        Some(api) => api.to_owned(),
        None => format!(
            "http://{}",
            hark_core::config::dial(config.control.grpc_listen)
        ),
    };
    let channel = Endpoint::from_shared(api.clone())
        .with_context(|| {
            crate::said!(
                zh: "`{api}` 不是 --api（HARK_API）可用的地址：请给出 http://主机:端口",
                en: "`{api}` is not an address for --api (HARK_API): give http://host:port"
            )
        })?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| {
            crate::said!(
                zh: "连不上 {api} 上的 hark gRPC API：task-control 在运行吗（hark dev 或 hark control）？",
                en: "cannot reach hark's gRPC API at {api}: is task-control running (hark dev or hark control)?"
            )
        })?;
    let token = match token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .context("the token cannot be sent as a header")?,
        ),
        None => None,
    };
    Ok(TaskServiceClient::with_interceptor(channel, Bearer(token)))
}

/// Turns a gRPC error into a message a person can act on.
pub(crate) fn explain(status: Status) -> anyhow::Error {
    let hint = match status.code() {
        tonic::Code::Unauthenticated => crate::said!(
            zh: "（用 --token 或 HARK_API_TOKEN 给出令牌）",
            en: " (pass --token or set HARK_API_TOKEN)"
        ),
        tonic::Code::Unavailable => crate::said!(
            zh: "（task-control 在运行吗？）",
            en: " (is task-control running?)"
        ),
        tonic::Code::InvalidArgument | tonic::Code::NotFound
            if status.message().contains("task id") || status.message().starts_with("no task") =>
        {
            crate::said!(
                zh: "（`hark task list` 列出任务）",
                en: " (`hark task list` shows them)"
            )
        }
        _ => String::new(),
    };
    anyhow::anyhow!("{}{hint}", status.message())
}

/// The id of the open question whose handle is `handle` (without its `#`).
async fn open_question_by_handle(api: &mut Client, handle: &str) -> anyhow::Result<String> {
    let mut found = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = api
            .list_questions(pb::ListQuestionsRequest {
                page_size: 500,
                page_token,
                ..Default::default()
            })
            .await
            .map_err(explain)?
            .into_inner();
        found.extend(
            page.questions
                .into_iter()
                .filter(|q| q.handle.eq_ignore_ascii_case(handle)),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    match found.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => {
            anyhow::bail!(crate::said!(
                zh: "没有待回答的问题 #{handle}（`hark task questions` 列出待回答的问题）",
                en: "no open question #{handle} (`hark task questions` lists the open ones)"
            ))
        }
        many => anyhow::bail!(crate::said!(
            zh: "有 {} 个待回答的问题都是 #{handle}，属于任务 {}：请改用任务编号",
            en: "{} open questions are #{handle}, of the tasks {}: give the task's id instead",
            many.len(),
            many.iter()
                .map(|q| q.task_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Prints `task` as JSON with `--json`, else the line `said` makes of it.
fn report(json_out: bool, task: &pb::Task, said: impl FnOnce(&pb::Task) -> String) {
    if json_out {
        crate::out!("{}", task_json(task));
    } else {
        crate::out!("{}", said(task));
    }
}

fn state_name(state: i32) -> &'static str {
    pb::TaskState::try_from(state)
        .ok()
        .and_then(TaskState::from_proto)
        .map_or("unknown", TaskState::as_str)
}

fn outcome_name(outcome: i32) -> &'static str {
    match pb::QuestionOutcome::try_from(outcome) {
        Ok(pb::QuestionOutcome::Open) => "open",
        Ok(pb::QuestionOutcome::Answered) => "answered",
        Ok(pb::QuestionOutcome::Expired) => "expired",
        Ok(pb::QuestionOutcome::Cancelled) => "cancelled",
        Ok(pb::QuestionOutcome::Superseded) => "superseded",
        _ => "unknown",
    }
}

pub(crate) fn time_of(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn chat_json(chat: &Option<pb::ChatRoute>) -> Value {
    chat.as_ref().map_or(
        Value::Null,
        |c| json!({"platform": c.platform, "bot_id": c.bot_id, "stream": c.stream}),
    )
}

fn question_json(q: &pb::Question) -> Value {
    json!({
        "id": q.id, "task_id": q.task_id, "handle": q.handle, "text": q.text, "context": q.context,
        "owner": q.owner, "chat": chat_json(&q.chat), "outcome": outcome_name(q.outcome),
        "asked_at": time_of(&q.asked_at), "deadline": time_of(&q.deadline), "closed_at": time_of(&q.closed_at),
        "answerer": q.answerer, "answer": q.answer, "choices": q.choices,
        "undelivered": q.undelivered,
    })
}

fn task_json(t: &pb::Task) -> Value {
    json!({
        "id": t.id, "owner": t.owner, "chat": chat_json(&t.chat), "goal": t.goal, "state": state_name(t.state),
        "generation": t.generation, "attempt": t.attempt, "rounds": t.rounds, "result": t.result, "error": t.error,
        "created_at": time_of(&t.created_at), "updated_at": time_of(&t.updated_at), "finished_at": time_of(&t.finished_at),
        "open_question": t.open_question.as_ref().map_or(Value::Null, question_json),
        "questionnaire": t.questionnaire.iter().map(|q| json!({
            "key": q.key, "text": q.text, "choices": q.choices,
            "escalate_to": q.escalate_to, "escalate_after_s": q.escalate_after_s,
            "ask_to": q.ask_to, "need": q.need,
        })).collect::<Vec<_>>(),
        "deadline": time_of(&t.deadline), "on_deadline": deadline_policy(t),
    })
}

/// What the task's deadline does: `fail` or `cancel`.
fn deadline_policy(t: &pb::Task) -> &'static str {
    match pb::DeadlinePolicy::try_from(t.on_deadline) {
        Ok(pb::DeadlinePolicy::Cancel) => "cancel",
        _ => "fail",
    }
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn clip(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        line
    } else {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    }
}

fn print_task(t: &pb::Task) {
    crate::out!(
        "{}",
        crate::said!(zh: "任务     {}", en: "task     {}", t.id)
    );
    crate::out!(
        "{}",
        crate::said!(
            zh: "状态     {}（第 {} 代，第 {} 次尝试，{} 轮）",
            en: "state    {} (generation {}, attempt {}, {} rounds)",
            state_name(t.state),
            t.generation,
            t.attempt,
            t.rounds
        )
    );
    crate::out!(
        "{}",
        crate::said!(zh: "所有者   {}", en: "owner    {}", t.owner)
    );
    if let Some(c) = &t.chat {
        crate::out!(
            "{}",
            crate::said!(
                zh: "会话     {} 机器人 {} {}",
                en: "chat     {} bot {} {}",
                c.platform,
                c.bot_id,
                c.stream
            )
        );
    }
    crate::out!(
        "{}",
        crate::said!(zh: "目标     {}", en: "goal     {}", t.goal)
    );
    crate::out!(
        "{}",
        crate::said!(zh: "创建于   {}", en: "created  {}", time_of(&t.created_at))
    );
    if t.deadline.is_some() && t.finished_at.is_none() {
        let time = time_of(&t.deadline);
        crate::out!(
            "{}",
            if deadline_policy(t) == "cancel" {
                crate::said!(zh: "截止     {}（届时取消）", en: "deadline {} (then cancelled)", time)
            } else {
                crate::said!(zh: "截止     {}（届时失败）", en: "deadline {} (then it fails)", time)
            }
        );
    }
    if t.finished_at.is_some() {
        crate::out!(
            "{}",
            crate::said!(zh: "结束于   {}", en: "finished {}", time_of(&t.finished_at))
        );
    }
    if !t.result.is_empty() {
        crate::out!(
            "{}",
            crate::said!(zh: "结果     {}", en: "result   {}", t.result)
        );
    }
    if !t.error.is_empty() {
        crate::out!(
            "{}",
            crate::said!(zh: "错误     {}", en: "error    {}", t.error)
        );
    }
}

fn print_question(q: &pb::Question) {
    let mut line = format!(
        "#{} [{}] task {} · {}",
        q.handle,
        outcome_name(q.outcome),
        short(&q.task_id),
        clip(&q.text, 80)
    );
    if !q.choices.is_empty() {
        line.push_str(&format!(" [{}]", q.choices.join(" | ")));
    }
    if !q.answer.is_empty() {
        line.push_str(&format!(" → {}", clip(&q.answer, 60)));
    } else if q.deadline.is_some() && q.outcome == pb::QuestionOutcome::Open as i32 {
        line.push_str(&format!(" (deadline {})", time_of(&q.deadline)));
    }
    crate::out!("{line}   id {}", q.id);
    print_undelivered(q);
}

/// Why the question's chat message never reached its chat, when it did not.
fn print_undelivered(q: &pb::Question) {
    if !q.undelivered.is_empty() {
        crate::out!(
            "{}",
            crate::said!(
                zh: "  没能发到会话：{}",
                en: "  never reached the chat: {}",
                q.undelivered
            )
        );
    }
}

fn joined(words: &[String]) -> String {
    words.join(" ")
}

pub async fn run(config: &Config, TaskArgs { args, command }: TaskArgs) -> anyhow::Result<()> {
    let mut api = client(config, &args).await?;
    let json_out = args.json;
    match command {
        TaskCommand::New(new) => {
            let NewArgs {
                owner,
                timeout,
                on_timeout,
                deadline,
                on_deadline,
                chat,
                request_id,
                questionnaire,
                escalate_to,
                escalate_after,
                ask_to,
                need,
                start_in,
                cron,
                timezone,
                priority,
                wait,
                goal,
            } = *new;
            if goal.is_empty() && questionnaire.is_empty() {
                anyhow::bail!(crate::said!(
                    zh: "请说明任务要达成什么，或用 --ask 给出它的问题",
                    en: "say what the task should achieve, or give its questions with --ask"
                ));
            }
            let questionnaire = questionnaire
                .iter()
                .map(|q| {
                    let mut parts = q.split('|').map(str::trim);
                    pb::FormQuestion {
                        key: String::new(),
                        text: parts.next().unwrap_or_default().to_owned(),
                        choices: parts.map(str::to_owned).collect(),
                        escalate_to: escalate_to.clone(),
                        escalate_after_s: escalate_after
                            .map(|d| u32::try_from(d.0.as_secs()).unwrap_or(u32::MAX))
                            .unwrap_or(0),
                        ask_to: ask_to.clone(),
                        need: need.clone().unwrap_or_default(),
                        ..Default::default()
                    }
                })
                .collect();
            let on_timeout = match on_timeout {
                None => pb::TimeoutPolicy::Unspecified,
                Some(p) => p.parse::<TimeoutPolicy>()?.to_proto(),
            };
            let on_deadline = match on_deadline {
                None => pb::DeadlinePolicy::Unspecified,
                Some(p) => p.parse::<DeadlinePolicy>()?.to_proto(),
            };
            let deadline = deadline.map(|d| prost_types::Duration {
                seconds: i64::try_from(d.0.as_secs()).unwrap_or(i64::MAX),
                nanos: 0,
            });
            let chat = chat.map(|c| pb::ChatRoute {
                platform: c[0].clone(),
                bot_id: c[1].clone(),
                stream: c[2].clone(),
                origin_message_id: String::new(),
            });
            let ask_timeout_s = timeout
                .map(|t| u32::try_from(t.0.as_secs()).unwrap_or(u32::MAX))
                .unwrap_or(0);
            let start_at = start_in.map(|after| {
                let at = std::time::SystemTime::now() + after.0;
                let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                prost_types::Timestamp {
                    seconds: since.as_secs() as i64,
                    nanos: since.subsec_nanos() as i32,
                }
            });
            // A person's key names its owner itself.
            let keyed = args
                .token
                .as_deref()
                .is_some_and(|t| t.starts_with(hark_control::cases::keys::KEY_PREFIX));
            let owner = owner.unwrap_or_else(|| if keyed { "" } else { "cli:local" }.to_owned());
            let created = api
                .create_task(pb::CreateTaskRequest {
                    owner,
                    goal: joined(&goal),
                    chat,
                    ask_timeout_s,
                    on_timeout: on_timeout as i32,
                    request_id: request_id.unwrap_or_default(),
                    questionnaire,
                    start_at,
                    cron: cron.unwrap_or_default(),
                    timezone: timezone.unwrap_or_default(),
                    priority,
                    deadline,
                    on_deadline: on_deadline as i32,
                })
                .await
                .map_err(explain)?
                .into_inner();
            if let Some(schedule) = created.schedule {
                let next = time_of(&schedule.next_run_at);
                if json_out {
                    crate::out!(
                        "{}",
                        serde_json::json!({"schedule": schedule.id, "cron": schedule.cron,
                            "timezone": schedule.timezone, "next_run_at": next})
                    );
                } else {
                    crate::out!(
                        "scheduled {} ({}{}), next run at {next}: {}",
                        schedule.id,
                        schedule.timezone,
                        if schedule.cron.is_empty() {
                            String::new()
                        } else {
                            format!(", `{}`", schedule.cron)
                        },
                        clip(&schedule.goal, 80)
                    );
                }
                return Ok(());
            }
            let task = created.task.context("the server returned no task")?;
            if json_out {
                crate::out!("{}", task_json(&task));
            } else {
                crate::out!(
                    "{}",
                    crate::said!(
                        zh: "已创建 {}（{}）：{}",
                        en: "created {} ({}): {}",
                        task.id,
                        state_name(task.state),
                        clip(&task.goal, 80)
                    )
                );
            }
            if wait {
                follow(&mut api, &task.id, json_out).await?;
            }
        }
        TaskCommand::List {
            owner,
            states,
            stream,
            platform,
            limit,
            page_token,
        } => {
            let states = states_of(&states)?;
            let page = api
                .list_tasks(pb::ListTasksRequest {
                    owner: owner.unwrap_or_default(),
                    states,
                    stream: stream.unwrap_or_default(),
                    platform: platform.unwrap_or_default(),
                    page_size: limit,
                    page_token: page_token.unwrap_or_default(),
                })
                .await
                .map_err(explain)?
                .into_inner();
            if json_out {
                for t in &page.tasks {
                    crate::out!("{}", task_json(t));
                }
            } else if page.tasks.is_empty() {
                crate::out!("{}", crate::said!(zh: "没有任务", en: "no tasks"));
            } else {
                crate::out!(
                    "{:<8}  {:<13}  {:<20}  {:<20}  GOAL",
                    "ID",
                    "STATE",
                    "OWNER",
                    "CREATED"
                );
                for t in &page.tasks {
                    crate::out!(
                        "{:<8}  {:<13}  {:<20}  {:<20}  {}",
                        short(&t.id),
                        state_name(t.state),
                        clip(&t.owner, 20),
                        time_of(&t.created_at),
                        clip(&t.goal, 50)
                    );
                }
            }
            if !page.next_page_token.is_empty() && !json_out {
                crate::out!(
                    "{}",
                    crate::said!(
                        zh: "更多：--page-token {}",
                        en: "more: --page-token {}",
                        page.next_page_token
                    )
                );
            }
        }
        TaskCommand::Get { id } => {
            let got = api
                .get_task(pb::GetTaskRequest { task_id: id })
                .await
                .map_err(explain)?
                .into_inner();
            let task = got.task.context("the server returned no task")?;
            if json_out {
                let mut value = task_json(&task);
                value["questions"] = got.questions.iter().map(question_json).collect();
                crate::out!("{value}");
            } else {
                print_task(&task);
                if !got.questions.is_empty() {
                    crate::out!("{}", crate::said!(zh: "问题", en: "questions"));
                    for q in &got.questions {
                        print!("  ");
                        print_question(q);
                    }
                }
            }
        }
        TaskCommand::Cancel { id, reason } => {
            let task = api
                .cancel_task(pb::CancelTaskRequest {
                    task_id: id,
                    reason,
                })
                .await
                .map_err(explain)?
                .into_inner()
                .task
                .context("the server returned no task")?;
            report(
                json_out,
                &task,
                |t| crate::said!(zh: "已取消 {}", en: "cancelled {}", t.id),
            );
        }
        TaskCommand::Pause { id } => {
            let task = api
                .pause_task(pb::PauseTaskRequest { task_id: id })
                .await
                .map_err(explain)?
                .into_inner()
                .task
                .context("the server returned no task")?;
            report(json_out, &task, |t| {
                if t.pause_requested {
                    crate::said!(
                        zh: "{} 在本轮结束时暂停",
                        en: "{} pauses at the end of its round",
                        t.id
                    )
                } else {
                    crate::said!(zh: "已暂停 {}", en: "paused {}", t.id)
                }
            });
        }
        TaskCommand::Resume { id } => {
            let task = api
                .resume_task(pb::ResumeTaskRequest { task_id: id })
                .await
                .map_err(explain)?
                .into_inner()
                .task
                .context("the server returned no task")?;
            report(
                json_out,
                &task,
                |t| crate::said!(zh: "已恢复 {}", en: "resumed {}", t.id),
            );
        }
        TaskCommand::Answer {
            id,
            text,
            question,
            json,
            answerer,
            request_id,
            wait,
            wait_timeout,
        } => {
            let (question_id, task_id) = if question {
                (id, String::new())
            } else if let Some(handle) = id.strip_prefix('#') {
                // A `#handle`, as `hark task questions` prints it.
                (
                    open_question_by_handle(&mut api, handle).await?,
                    String::new(),
                )
            } else {
                (String::new(), id)
            };
            let answered = api
                .answer_question(pb::AnswerQuestionRequest {
                    question_id,
                    task_id,
                    answer: if json { String::new() } else { joined(&text) },
                    answer_json: if json { joined(&text) } else { String::new() },
                    answerer: answerer.unwrap_or_default(),
                    request_id: request_id.unwrap_or_default(),
                    wait: if wait {
                        pb::AnswerWait::NextQuestionOrEnd as i32
                    } else {
                        pb::AnswerWait::None as i32
                    },
                    wait_timeout_ms: wait_timeout.saturating_mul(1000),
                })
                .await
                .map_err(explain)?
                .into_inner();
            let task = answered.task.context("the server returned no task")?;
            if json_out {
                let mut value = task_json(&task);
                if let Some(event) = &answered.event {
                    value["next"] = event_json(event);
                }
                if answered.wait_timed_out {
                    value["wait_timed_out"] = json!(true);
                }
                crate::out!("{value}");
            } else {
                crate::out!(
                    "{}",
                    crate::said!(
                        zh: "已回答；任务 {} 现在{}",
                        en: "answered; task {} is {}",
                        task.id,
                        state_name(task.state)
                    )
                );
                match &answered.event {
                    Some(event) => print_event(event),
                    None if answered.wait_timed_out => {
                        crate::out!(
                            "{}",
                            crate::said!(
                                zh: "任务在 {wait_timeout} 秒内既没有再提问，也没有结束",
                                en: "the task neither asked again nor ended within {wait_timeout} s"
                            )
                        )
                    }
                    None => {}
                }
            }
        }
        TaskCommand::Delegate {
            question,
            to,
            request_id,
        } => {
            let question_id = match question.strip_prefix('#') {
                Some(handle) => open_question_by_handle(&mut api, handle).await?,
                None => question,
            };
            let moved = api
                .delegate_question(pb::DelegateQuestionRequest {
                    question_id,
                    to,
                    request_id: request_id.unwrap_or_default(),
                })
                .await
                .map_err(explain)?
                .into_inner()
                .question
                .unwrap_or_default();
            if json_out {
                crate::out!(
                    "{}",
                    json!({"question_id": moved.id, "handle": moved.handle, "asked_of": moved.owner})
                );
            } else {
                crate::out!(
                    "{}",
                    crate::said!(zh: "已把 #{} 转交给 {}", en: "passed #{} on to {}", moved.handle, moved.owner)
                );
            }
        }
        TaskCommand::Tell { id, text, author } => {
            let told = api
                .tell_task(pb::TellTaskRequest {
                    task_id: id,
                    instruction: joined(&text),
                    author,
                })
                .await
                .map_err(explain)?
                .into_inner();
            let when = match pb::tell_task_response::Delivery::try_from(told.delivery) {
                Ok(pb::tell_task_response::Delivery::NextRound) => "at its next round",
                _ => "when it resumes",
            };
            if json_out {
                crate::out!(
                    "{}",
                    json!({"instruction_id": told.instruction_id, "delivery": when})
                );
            } else {
                crate::out!(
                    "{}",
                    crate::said!(zh: "已告知；任务将{when}看到", en: "told; the task sees it {when}")
                );
            }
        }
        TaskCommand::Watch {
            id: None,
            owner,
            states,
            resume,
        } => {
            let states = states_of(&states)?;
            let mut events = api
                .watch_tasks(pb::WatchTasksRequest {
                    owner: owner.unwrap_or_default(),
                    states,
                    task_ids: Vec::new(),
                    resume_token: resume.unwrap_or_default(),
                })
                .await
                .map_err(explain)?
                .into_inner();
            while let Some(next) = events.message().await.map_err(explain)? {
                let Some(event) = next.event else { continue };
                if json_out {
                    let mut value = event_json(&event);
                    value["resume_token"] = json!(next.resume_token);
                    crate::out!("{value}");
                } else {
                    print!("{}  ", short(&event.task_id));
                    print_event(&event);
                    crate::out!(
                        "{}",
                        crate::said!(zh: "  续看：{}", en: "  resume: {}", next.resume_token)
                    );
                }
            }
        }
        TaskCommand::Watch { id: Some(id), .. } => {
            let mut events = api
                .watch_task(pb::WatchTaskRequest { task_id: id })
                .await
                .map_err(explain)?
                .into_inner();
            while let Some(event) = events.message().await.map_err(explain)? {
                if json_out {
                    crate::out!("{}", event_json(&event));
                } else {
                    print_event(&event);
                }
            }
        }
        TaskCommand::Questions {
            owner,
            stream,
            platform,
            all,
            limit,
        } => {
            let listed = api
                .list_questions(pb::ListQuestionsRequest {
                    owner: owner.unwrap_or_default(),
                    stream: stream.unwrap_or_default(),
                    platform: platform.unwrap_or_default(),
                    include_closed: all,
                    page_size: limit,
                    page_token: String::new(),
                })
                .await
                .map_err(explain)?
                .into_inner();
            if json_out {
                for q in &listed.questions {
                    crate::out!("{}", question_json(q));
                }
            } else if listed.questions.is_empty() {
                crate::out!("{}", crate::said!(zh: "没有问题", en: "no questions"));
            } else {
                for q in &listed.questions {
                    print_question(q);
                }
            }
        }
    }
    Ok(())
}

/// Follows task `id` until it ends, answering each question it asks with a line of stdin (until
/// stdin ends; then it only watches, and the answer may come from the chat or another client).
async fn follow(api: &mut Client, id: &str, json_out: bool) -> anyhow::Result<()> {
    let mut events = api
        .watch_task(pb::WatchTaskRequest {
            task_id: id.to_owned(),
        })
        .await
        .map_err(explain)?
        .into_inner();
    // Lines of stdin, read on a thread of their own; `None` once it ends.
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            if tx.send(line.ok()).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    let mut stdin_open = true;
    let mut open: Option<pb::Question> = None;
    let mut last: Option<pb::TaskEvent> = None;
    loop {
        tokio::select! {
            event = events.message() => {
                let Some(event) = event.map_err(explain)? else { break };
                if json_out {
                    crate::out!("{}", event_json(&event));
                } else {
                    print_event(&event);
                }
                open = event.question.clone();
                if let (Some(q), false) = (&open, json_out) {
                    if !q.choices.is_empty() {
                        for (n, choice) in q.choices.iter().enumerate() {
                            crate::out!("    {}. {choice}", n + 1);
                        }
                    }
                    if stdin_open {
                        crate::out!(
                            "{}",
                            crate::said!(
                                zh: "  你的回答（一行；按 Ctrl-D 改在别处回答）：",
                                en: "  your answer (a line; Ctrl-D to answer elsewhere):"
                            )
                        );
                    }
                }
                last = Some(event);
            }
            line = lines.recv(), if stdin_open && open.is_some() => {
                match line.flatten() {
                    None => stdin_open = false,
                    Some(line) if line.trim().is_empty() => {}
                    Some(line) => {
                        let question = open.take().map(|q| q.id).unwrap_or_default();
                        let answered = api
                            .answer_question(pb::AnswerQuestionRequest {
                                question_id: question,
                                answer: line.trim().to_owned(),
                                ..Default::default()
                            })
                            .await;
                        if let Err(status) = answered {
                            // A misfit or a question closed meanwhile: say so and go on.
                            eprintln!("hark: {}", status.message());
                        }
                    }
                }
            }
        }
    }
    match last.as_ref().map(|e| e.state) {
        Some(s) if s == pb::TaskState::Completed as i32 => Ok(()),
        Some(s) => anyhow::bail!(crate::said!(
            zh: "任务 {} 以{}结束",
            en: "task {} ended {}",
            short(id),
            state_name(s)
        )),
        None => anyhow::bail!(crate::said!(
            zh: "任务 {} 没有发来事件",
            en: "task {} sent no event",
            short(id)
        )),
    }
}

fn event_json(event: &pb::TaskEvent) -> serde_json::Value {
    let mut value = json!({"task_id": event.task_id, "state": state_name(event.state),
        "generation": event.generation, "cause": event.cause, "at": time_of(&event.at)});
    if !event.result.is_empty() {
        value["result"] = json!(event.result);
    }
    if !event.error.is_empty() {
        value["error"] = json!(event.error);
    }
    if let Some(q) = &event.question {
        value["question"] = question_json(q);
    }
    value
}

fn print_event(event: &pb::TaskEvent) {
    crate::out!(
        "{}  {:<13}  generation {:<3}  ({})",
        time_of(&event.at),
        state_name(event.state),
        event.generation,
        event.cause
    );
    if let Some(q) = &event.question {
        crate::out!(
            "{}",
            crate::said!(zh: "  提问 #{}：{}", en: "  asks #{}: {}", q.handle, q.text)
        );
        print_undelivered(q);
    }
    if !event.result.is_empty() {
        crate::out!(
            "{}",
            crate::said!(zh: "  结果：{}", en: "  result: {}", event.result)
        );
    }
    if !event.error.is_empty() {
        crate::out!(
            "{}",
            crate::said!(zh: "  错误：{}", en: "  error: {}", event.error)
        );
    }
}

/// States given on the command line, as the API takes them.
fn states_of(states: &[String]) -> anyhow::Result<Vec<i32>> {
    Ok(states
        .iter()
        .map(|s| s.parse::<TaskState>().map(|s| s.to_proto() as i32))
        .collect::<Result<Vec<_>, _>>()?)
}
