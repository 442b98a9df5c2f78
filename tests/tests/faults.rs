//! hark under faults, from outside: two task-control, two gateways and three workers on a
//! private Postgres and nats-server; tasks created by chat and over gRPC, each asking its owner
//! one to three questions, answered by a scripted bot (plain, quoted and `#handle` replies,
//! some sent twice, some preceded by a stranger's reply, some after the task was cancelled);
//! meanwhile random `kill -9` of every role, nats-server killed and started again, and Postgres
//! stopped with `pg_ctl -m immediate stop` and started again.
//!
//! At the end every task that was not cancelled completed with exactly its own answers, in
//! order; no cancelled task came back; every question was answered once; every result reached
//! its chat; and no process died unless it was killed.
//!
//! It runs about a minute of faults with 24 tasks; `HARK_FAULTS_SECONDS`, `HARK_FAULTS_TASKS`
//! and `HARK_FAULTS_SEED` make it longer, larger or repeatable.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use futures_util::{SinkExt, StreamExt};
use hark_e2e::{
    Env, Process,
    servers::{PrivateNats, PrivatePostgres},
};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

/// How long everything must settle once the faults stop.
const SETTLE: Duration = Duration::from_secs(180);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

use hark_testkit::Rng;

/// What the faults draw at random.
trait Draw {
    fn chance(&mut self, percent: u64) -> bool;
    fn millis(&mut self, from: u64, to: u64) -> Duration;
}

impl Draw for Rng {
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// One role of the installation, started again after each kill.
struct Role {
    name: String,
    args: Vec<String>,
    extra: Vec<(String, String)>,
    process: Option<Process>,
    kills: u32,
    /// When a killed role is started again.
    back_at: Option<Instant>,
}

impl Role {
    fn start(&mut self, env: &Env) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let extra: Vec<(&str, &str)> = self
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.process = Some(env.spawn_named(&self.name, &args, &extra));
    }

    /// Once started with `var` on port 0: the address it bound for `key`, kept in `var` so that
    /// it binds the same port each time it is started again.
    async fn pin(&mut self, key: &str, var: &str) -> u16 {
        let process = self.process.as_ref().expect("started");
        let port = process.addr(key).await.port();
        for (k, v) in &mut self.extra {
            if k == var {
                *v = format!("127.0.0.1:{port}");
            }
        }
        port
    }

    fn kind(&self) -> &str {
        self.name.split('-').next().unwrap_or_default()
    }
}

/// A message the bot posted in its group for hark.
#[derive(Debug, Clone)]
struct Posted {
    message_id: i64,
    text: String,
}

/// A OneBot bot that keeps dialling its gateway, so that it comes back after every kill, and
/// answers hark's send actions and `get_msg` as a real bot does.
struct ChaosBot {
    self_id: i64,
    group: i64,
    /// Frames to the gateway; each says whether it was written to a live connection.
    outgoing: mpsc::Sender<(String, tokio::sync::oneshot::Sender<bool>)>,
    next_id: i64,
}

impl ChaosBot {
    fn start(
        port: u16,
        self_id: i64,
        group: i64,
        posted: mpsc::UnboundedSender<(i64, Posted)>,
    ) -> Self {
        let (outgoing, mut frames) =
            mpsc::channel::<(String, tokio::sync::oneshot::Sender<bool>)>(256);
        tokio::spawn(async move {
            let url = format!("ws://127.0.0.1:{port}/onebot/v11/ws");
            let mut next_message_id = 100_000 * self_id;
            let mut sent: HashMap<i64, String> = HashMap::new();
            loop {
                let mut request = url.clone().into_client_request().expect("request");
                request
                    .headers_mut()
                    .insert("x-self-id", self_id.to_string().parse().expect("header"));
                request
                    .headers_mut()
                    .insert("authorization", "Bearer tok".parse().expect("header"));
                let Ok((socket, _)) =
                    tokio_tungstenite::connect_async_with_config(request, None, true).await
                else {
                    // Frames for a gateway that is away are not written: the driver sends again.
                    while let Ok((_, done)) = frames.try_recv() {
                        let _ = done.send(false);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let (mut sink, mut stream) = socket.split();
                loop {
                    tokio::select! {
                        frame = frames.recv() => {
                            let Some((frame, done)) = frame else { return };
                            let ok = sink.send(Message::text(frame)).await.is_ok();
                            let _ = done.send(ok);
                            if !ok { break; }
                        }
                        incoming = stream.next() => {
                            let Some(Ok(Message::Text(text))) = incoming else {
                                if incoming.as_ref().is_some_and(|m| m.is_ok()) { continue; }
                                break;
                            };
                            let Ok(action) = serde_json::from_str::<Value>(&text) else { continue };
                            let Some(name) = action["action"].as_str() else { continue };
                            let response = if name == "get_msg" {
                                let id = action["params"]["message_id"].as_i64().unwrap_or_default();
                                match sent.get(&id) {
                                    Some(text) => json!({"status": "ok", "retcode": 0, "echo": action["echo"],
                                        "data": {"message_id": id, "sender": {"user_id": self_id},
                                                 "message": [{"type": "text", "data": {"text": text}}]}}),
                                    None => json!({"status": "failed", "retcode": 100, "echo": action["echo"]}),
                                }
                            } else {
                                next_message_id += 1;
                                let text: String = action["params"]["message"].as_array().into_iter().flatten()
                                    .filter(|s| s["type"] == "text")
                                    .filter_map(|s| s["data"]["text"].as_str())
                                    .collect();
                                sent.insert(next_message_id, text.clone());
                                let _ = posted.send((self_id, Posted { message_id: next_message_id, text }));
                                json!({"status": "ok", "retcode": 0, "echo": action["echo"],
                                       "data": {"message_id": next_message_id}})
                            };
                            if sink.send(Message::text(response.to_string())).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        Self {
            self_id,
            group,
            outgoing,
            next_id: 1,
        }
    }

    /// A group message event; returns its frame, to send (and maybe send again unchanged).
    fn event(&mut self, user: i64, text: &str, quote: Option<i64>) -> String {
        let id = self.next_id;
        self.next_id += 1;
        let mut segments = Vec::new();
        if let Some(quoted) = quote {
            segments.push(json!({"type": "reply", "data": {"id": quoted.to_string()}}));
        }
        segments.push(json!({"type": "text", "data": {"text": text}}));
        json!({"time": 1_700_000_000 + id, "self_id": self.self_id, "post_type": "message",
            "message_type": "group", "sub_type": "normal", "message_id": id, "group_id": self.group,
            "user_id": user, "message": segments, "raw_message": text, "font": 0,
            "sender": {"user_id": user, "nickname": format!("member {user}"), "card": ""}})
        .to_string()
    }

    /// Sends a frame; whether a live connection took it.
    async fn send(&self, frame: String) -> bool {
        let (done, taken) = tokio::sync::oneshot::channel();
        if self.outgoing.send((frame, done)).await.is_err() {
            return false;
        }
        taken.await.unwrap_or(false)
    }
}

/// How a task is created and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `/task new` in a group, answered there.
    Chat,
    /// `CreateTask` with the group as its chat, answered there.
    GrpcInChat,
    /// `CreateTask` without a chat, answered with `AnswerQuestion`.
    Grpc,
}

/// What the driver knows of one task.
struct Job {
    n: usize,
    via: Via,
    bot: usize,
    owner: i64,
    questions: usize,
    /// A questionnaire, asking its questions without a model.
    form: bool,
    cancel: bool,
    id: Option<String>,
    /// When an answer to question k was last sent.
    answered_at: HashMap<usize, Instant>,
    /// Whether the driver tried to cancel it (the call may have failed, or succeeded without
    /// its reply arriving).
    cancelled: bool,
    /// Results posted in its chat.
    results: Vec<String>,
    /// When it is (next) sent to hark, and for a chat task the frame, sent again unchanged
    /// (so applied once) until its "created" reply shows it arrived.
    create_at: Option<Instant>,
    create_frame: Option<String>,
    /// What the driver sent for it, for the report of a failure.
    sent: Vec<String>,
}

impl Job {
    fn goal(&self) -> String {
        format!("job-{} [script:q{}]", self.n, self.questions)
    }

    fn answer(&self, k: usize) -> String {
        format!("ans-{}-{k}", self.n)
    }

    fn expected(&self) -> String {
        if self.form {
            let fields: Vec<String> = (1..=self.questions)
                .map(|k| format!("\"q{k}\":\"{}\"", self.answer(k)))
                .collect();
            return format!("{{{}}}", fields.join(","));
        }
        let answers: Vec<String> = (1..=self.questions).map(|k| self.answer(k)).collect();
        format!("answers: {}", answers.join("|"))
    }

    /// The questions of a questionnaire job, worded as the scripted model words its own.
    fn questionnaire(&self) -> Vec<pb::FormQuestion> {
        if !self.form {
            return Vec::new();
        }
        (1..=self.questions)
            .map(|k| pb::FormQuestion {
                key: String::new(),
                text: format!("Question {k} of job-{}?", self.n),
                ..Default::default()
            })
            .collect()
    }

    fn short(&self) -> Option<String> {
        self.id
            .as_ref()
            .map(|id| id.replace('-', "")[..8].to_owned())
    }
}

/// `[task 1a2b3c4d · #a3f9] Question 2 of job-7?` → (short, handle, k)
fn parse_question(text: &str) -> Option<(String, String, usize)> {
    let rest = text.strip_prefix("[task ")?;
    let (short, rest) = rest.split_once(" · #")?;
    let (handle, rest) = rest.split_once(']')?;
    let k = rest
        .trim()
        .strip_prefix("Question ")?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    Some((short.to_owned(), handle.to_owned(), k))
}

/// A client of whichever task-control answers.
async fn api(urls: &[String]) -> Option<TaskServiceClient<tonic::transport::Channel>> {
    for url in urls {
        if let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.clone())
            && let Ok(Ok(channel)) =
                tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await
        {
            return Some(TaskServiceClient::new(channel));
        }
    }
    None
}

/// Every task, page by page.
async fn all_tasks(
    client: &mut TaskServiceClient<tonic::transport::Channel>,
) -> Result<Vec<pb::Task>, tonic::Status> {
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_tasks(pb::ListTasksRequest {
                page_size: 200,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        tasks.extend(page.tasks);
        if page.next_page_token.is_empty() {
            return Ok(tasks);
        }
        page_token = page.next_page_token;
    }
}

/// Every open question, page by page.
async fn open_questions(
    client: &mut TaskServiceClient<tonic::transport::Channel>,
) -> Result<Vec<pb::Question>, tonic::Status> {
    let mut questions = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_questions(pb::ListQuestionsRequest {
                page_size: 200,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        questions.extend(page.questions);
        if page.next_page_token.is_empty() {
            return Ok(questions);
        }
        page_token = page.next_page_token;
    }
}

/// The job a task's short id belongs to, asked of task-control when the driver does not know it
/// yet (its "created" reply was not seen).
async fn job_of(jobs: &mut [Job], short: &str, urls: &[String]) -> Option<usize> {
    if let Some(i) = jobs
        .iter()
        .position(|j| j.short().as_deref() == Some(short))
    {
        return Some(i);
    }
    let mut client = api(urls).await?;
    let task = client
        .get_task(pb::GetTaskRequest {
            task_id: short.to_owned(),
        })
        .await
        .ok()?
        .into_inner()
        .task?;
    let n: usize = task
        .goal
        .strip_prefix("job-")?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let job = jobs.get_mut(n)?;
    job.id = Some(task.id);
    Some(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_kills_and_outages_no_task_loses_or_mixes_up_its_answers() {
    let seconds = env_number("HARK_FAULTS_SECONDS", 60);
    let tasks = env_number("HARK_FAULTS_TASKS", 24) as usize;
    let seed = env_number("HARK_FAULTS_SEED", {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 | 1
    });
    eprintln!("faults: {seconds}s of faults, {tasks} tasks, HARK_FAULTS_SEED={seed}");
    let mut rng = Rng(seed);

    let postgres = PrivatePostgres::start();
    let mut nats = PrivateNats::start();
    let mut scripts = BTreeMap::new();
    for questions in 1..=3 {
        let mut steps: Vec<Step> = (1..=questions)
            .map(|k| Step::ask(&format!("Question {k} of {{goal}}?")))
            .collect();
        steps.push(Step::say("answers: {answers}"));
        scripts.insert(format!("q{questions}"), Script::new(steps));
    }
    let llm = ScriptedLlm::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), scripts)
        .await
        .expect("scripted LLM");
    llm.keep_requests(false);
    let mut env = Env::on(
        nats.url(),
        format!("postgres://postgres@127.0.0.1:{}", postgres.port),
    )
    .await;
    for (key, value) in [
        ("HARK_LLM__BASE_URL", llm.base_url()),
        ("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok".into()),
        ("HARK_TASK__LEASE", "3s".into()),
        ("HARK_TASK__MAX_ATTEMPTS", "1000".into()),
        ("HARK_TASK__ASK_TIMEOUT", "2h".into()),
        ("HARK_TASK__MAX_ACTIVE_PER_OWNER", "0".into()),
        ("HARK_CHAT__COMMANDS_PER_MINUTE", "0".into()),
        ("HARK_DATABASE__MAX_CONNECTIONS", "8".into()),
    ] {
        env.set(key, &value);
    }
    // Each task-control and gateway binds port 0 first, and that port after each kill.
    let mut roles: Vec<Role> = Vec::new();
    for i in 0..2 {
        roles.push(Role {
            name: format!("control-{}", i + 1),
            args: vec!["control".into()],
            extra: vec![("HARK_CONTROL__GRPC_LISTEN".into(), "127.0.0.1:0".into())],
            process: None,
            kills: 0,
            back_at: None,
        });
    }
    for i in 0..2 {
        roles.push(Role {
            name: format!("gateway-{}", i + 1),
            args: vec!["gateway".into()],
            extra: vec![
                ("HARK_GATEWAY__LISTEN".into(), "127.0.0.1:0".into()),
                (
                    "HARK_GATEWAY__SPOOL_DIR".into(),
                    env.spool_dir()
                        .join(format!("gateway-{}", i + 1))
                        .display()
                        .to_string(),
                ),
            ],
            process: None,
            kills: 0,
            back_at: None,
        });
    }
    for i in 1..=3 {
        roles.push(Role {
            name: format!("worker-{i}"),
            args: vec!["worker".into(), "--id".into(), format!("w{i}")],
            extra: Vec::new(),
            process: None,
            kills: 0,
            back_at: None,
        });
    }
    for role in &mut roles {
        role.start(&env);
    }
    let (mut grpc, mut gateways) = (Vec::new(), Vec::new());
    for role in &mut roles {
        match role.kind() {
            "control" => grpc.push(
                role.pin("control.grpc_listen", "HARK_CONTROL__GRPC_LISTEN")
                    .await,
            ),
            "gateway" => gateways.push(role.pin("gateway.listen", "HARK_GATEWAY__LISTEN").await),
            _ => {}
        }
    }
    let grpc_urls: Vec<String> = grpc
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    env.client().await;
    let (posted_tx, mut posted) = mpsc::unbounded_channel();
    let mut bots = [
        ChaosBot::start(gateways[0], 42, 1001, posted_tx.clone()),
        ChaosBot::start(gateways[1], 43, 1002, posted_tx),
    ];

    let mut jobs: Vec<Job> = (0..tasks)
        .map(|n| {
            let via = match n % 5 {
                0 | 1 => Via::Chat,
                2 | 3 => Via::GrpcInChat,
                _ => Via::Grpc,
            };
            Job {
                n,
                via,
                bot: n % 2,
                owner: 10_000 + n as i64,
                questions: 1 + n % 3,
                // Every other task created over gRPC is a questionnaire.
                form: via != Via::Chat && n % 2 == 0,
                cancel: n % 7 == 3,
                id: None,
                answered_at: HashMap::new(),
                cancelled: false,
                results: Vec::new(),
                create_at: None,
                create_frame: None,
                sent: Vec::new(),
            }
        })
        .collect();

    let started = Instant::now();
    let faults_end = started + Duration::from_secs(seconds);
    // Tasks are created over the first two thirds of the faults, so that they live through
    // them, and answers come a while after their questions.
    for job in jobs.iter_mut() {
        let at = Duration::from_secs(seconds) * 2 / 3 * job.n as u32 / tasks.max(1) as u32;
        job.create_at = Some(started + at);
    }
    // (due, job, question, its handle, the posted question's message id, bot)
    let mut answers_due: Vec<(Instant, usize, usize, String, i64, usize)> = Vec::new();
    let mut next_fault = started + rng.millis(1500, 4000);
    let mut figures: BTreeMap<&str, u64> = BTreeMap::new();
    let mut outages: Vec<(&str, Instant)> = Vec::new();
    let settled_at;
    let mut last_check = Instant::now();
    let mut seen_questions: HashSet<(i64, String)> = HashSet::new();
    let mut results_seen: HashMap<String, u32> = HashMap::new();
    let mut unexpected_exits: Vec<String> = Vec::new();

    loop {
        let now = Instant::now();
        // Faults.
        if now < faults_end && now >= next_fault {
            match rng.below(10) {
                0 if !outages.iter().any(|(w, _)| *w == "nats") => {
                    tokio::task::block_in_place(|| nats.kill());
                    *figures.entry("nats-server killed").or_default() += 1;
                    outages.push(("nats", now + rng.millis(500, 3000)));
                }
                1 if !outages.iter().any(|(w, _)| *w == "postgres") => {
                    tokio::task::block_in_place(|| postgres.crash());
                    *figures.entry("postgres stopped").or_default() += 1;
                    outages.push(("postgres", now + rng.millis(500, 3000)));
                }
                0 | 1 => {}
                _ => {
                    let i = rng.below(roles.len() as u64) as usize;
                    if let Some(mut process) = roles[i].process.take() {
                        process.kill().await;
                        roles[i].kills += 1;
                        roles[i].back_at = Some(now + rng.millis(200, 2500));
                        let key = match roles[i].kind() {
                            "control" => "control killed",
                            "gateway" => "gateway killed",
                            _ => "worker killed",
                        };
                        *figures.entry(key).or_default() += 1;
                    }
                }
            }
            next_fault = now + rng.millis(1000, 3500);
        }
        // What was stopped comes back.
        let mut still = Vec::new();
        for (what, at) in outages.drain(..) {
            if now >= at || now >= faults_end {
                tokio::task::block_in_place(|| match what {
                    "nats" => nats.start_again(),
                    _ => postgres.start_again(),
                });
            } else {
                still.push((what, at));
            }
        }
        outages = still;
        for role in &mut roles {
            let exited = role.process.as_mut().is_some_and(|p| !p.running());
            match &role.process {
                Some(_) if exited => {
                    unexpected_exits.push(format!("{} exited by itself", role.name));
                    role.process = None;
                }
                None if now >= faults_end || role.back_at.is_some_and(|at| now >= at) => {
                    role.start(&env);
                    role.back_at = None;
                    *figures.entry("restarts").or_default() += 1;
                }
                _ => {}
            }
        }

        // Tasks whose time came, and chat tasks whose creation did not show yet.
        for job in jobs.iter_mut() {
            if job.create_at.is_none_or(|at| now < at) {
                continue;
            }
            match job.via {
                Via::Chat => {
                    if job.id.is_some() {
                        job.create_at = None;
                        continue;
                    }
                    let frame = match &job.create_frame {
                        Some(frame) => frame.clone(),
                        None => {
                            let frame = bots[job.bot].event(
                                job.owner,
                                &format!("/task new {}", job.goal()),
                                None,
                            );
                            job.create_frame = Some(frame.clone());
                            frame
                        }
                    };
                    bots[job.bot].send(frame).await;
                    job.create_at = Some(Instant::now() + Duration::from_secs(5));
                }
                Via::GrpcInChat | Via::Grpc => {
                    let chat = (job.via == Via::GrpcInChat).then(|| pb::ChatRoute {
                        platform: "qq".into(),
                        bot_id: bots[job.bot].self_id.to_string(),
                        stream: format!("group:{}", bots[job.bot].group),
                        origin_message_id: String::new(),
                    });
                    let owner = if job.via == Via::Grpc {
                        format!("api:{}", job.owner)
                    } else {
                        format!("qq:{}", job.owner)
                    };
                    let created = match api(&grpc_urls).await {
                        Some(mut client) => client
                            .create_task(pb::CreateTaskRequest {
                                owner,
                                goal: job.goal(),
                                chat,
                                request_id: format!("job-{}", job.n),
                                questionnaire: job.questionnaire(),
                                ..Default::default()
                            })
                            .await
                            .ok()
                            .and_then(|r| r.into_inner().task),
                        None => None,
                    };
                    match created {
                        Some(task) => {
                            job.id = Some(task.id);
                            job.create_at = None;
                        }
                        // Sent again with the same request id: created once.
                        None => job.create_at = Some(Instant::now() + Duration::from_millis(500)),
                    }
                }
            }
        }
        // Answers whose time came.
        let mut later = Vec::new();
        for (due, n, k, handle, question_message, bot) in answers_due.drain(..) {
            if now < due {
                later.push((due, n, k, handle, question_message, bot));
                continue;
            }
            let job = &mut jobs[n];
            // Answered meanwhile by a reply that named the question: a second, plain reply a
            // moment later would be an answer to whatever is asked next, as it would be from
            // a person.
            if job.answered_at.contains_key(&k) {
                continue;
            }
            // A stranger answers first now and then; it must wake nothing.
            if rng.chance(20) {
                let frame = bots[bot].event(99_999, &job.answer(k), None);
                bots[bot].send(frame).await;
            }
            let text = job.answer(k);
            let frame = match rng.below(3) {
                0 => bots[bot].event(job.owner, &text, None),
                1 => bots[bot].event(job.owner, &text, Some(question_message)),
                _ => bots[bot].event(job.owner, &format!("#{handle} {text}"), None),
            };
            let taken = bots[bot].send(frame.clone()).await;
            job.sent.push(format!(
                "{:?} answer {k}: {frame} taken={taken}",
                started.elapsed()
            ));
            if taken {
                job.answered_at.insert(k, Instant::now());
                // Some frames arrive twice, as a flaky connection delivers them.
                if rng.chance(20) {
                    bots[bot].send(frame).await;
                    *figures.entry("answers sent twice").or_default() += 1;
                }
            } else {
                later.push((
                    now + Duration::from_millis(300),
                    n,
                    k,
                    handle,
                    question_message,
                    bot,
                ));
            }
        }
        answers_due = later;

        // What the bots posted: questions to answer, tasks created, results.
        while let Ok((bot_id, post)) = posted.try_recv() {
            let bot = if bot_id == 42 { 0 } else { 1 };
            if let Some(rest) = post.text.strip_prefix("Task ")
                && let Some((short, goal)) = rest.split_once(" created: ")
                && let Some(n) = goal
                    .strip_prefix("job-")
                    .and_then(|g| g.split(' ').next())
                    .and_then(|n| n.parse::<usize>().ok())
                && let Some(job) = jobs.get_mut(n)
                && job.id.is_none()
            {
                let mut client = api(&grpc_urls).await;
                if let Some(client) = client.as_mut()
                    && let Ok(found) = client
                        .get_task(pb::GetTaskRequest {
                            task_id: short.to_owned(),
                        })
                        .await
                {
                    job.id = found.into_inner().task.map(|t| t.id);
                }
            }
            if post.text.contains(" done]") {
                *results_seen.entry(post.text.clone()).or_default() += 1;
                if let Some(job) = jobs.iter_mut().find(|j| {
                    j.short()
                        .is_some_and(|s| post.text.starts_with(&format!("[task {s} done]")))
                }) {
                    job.results.push(post.text.clone());
                }
            }
            let Some((short, handle, k)) = parse_question(&post.text) else {
                continue;
            };
            if !seen_questions.insert((bot_id, format!("{short}#{handle}"))) {
                *figures.entry("questions delivered again").or_default() += 1;
            }
            let Some(n) = job_of(&mut jobs, &short, &grpc_urls).await else {
                continue;
            };
            let job = &mut jobs[n];
            if job.answered_at.contains_key(&k) {
                continue;
            }
            // Some tasks are cancelled while they wait, and answered anyway.
            if job.cancel && !job.cancelled {
                job.cancelled = true;
                for _ in 0..5 {
                    if let Some(mut client) = api(&grpc_urls).await
                        && client
                            .cancel_task(pb::CancelTaskRequest {
                                task_id: job.id.clone().unwrap_or_default(),
                                reason: "changed plans".into(),
                            })
                            .await
                            .is_ok()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if answers_due.iter().any(|(_, m, q, ..)| *m == n && *q == k) {
                continue;
            }
            answers_due.push((
                Instant::now() + rng.millis(200, 3000),
                n,
                k,
                handle,
                post.message_id,
                bot,
            ));
        }

        // Every couple of seconds: answer what waits too long (its answer was lost before hark
        // read it, or the question was never seen), and see whether everything settled.
        if now.duration_since(last_check) > Duration::from_secs(2) {
            last_check = now;
            let Some(mut client) = api(&grpc_urls).await else {
                continue;
            };
            let Ok(open) = open_questions(&mut client).await else {
                continue;
            };
            for question in open {
                let short = question.task_id.replace('-', "");
                let Some(n) = job_of(&mut jobs, &short[..8], &grpc_urls).await else {
                    continue;
                };
                let job = &mut jobs[n];
                let k = job.answered_at.len() + 1;
                let k = question
                    .text
                    .strip_prefix("Question ")
                    .and_then(|r| r.split(' ').next())
                    .and_then(|k| k.parse().ok())
                    .unwrap_or(k);
                let asked_secs_ago = question.asked_at.as_ref().map_or(0, |t| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() as i64);
                    now - t.seconds
                });
                let stale = match job.answered_at.get(&k) {
                    Some(at) => at.elapsed() > Duration::from_secs(6),
                    // Never seen in the chat (or a gRPC task): answered once it waited a while.
                    None => asked_secs_ago > 4 || job.via == Via::Grpc,
                };
                if !stale {
                    continue;
                }
                if job.via == Via::Grpc {
                    // Retried with the same request id: applied once, whatever came back.
                    let answered = client
                        .answer_question(pb::AnswerQuestionRequest {
                            task_id: question.task_id.clone(),
                            answer: job.answer(k),
                            request_id: format!("{}-{k}", job.n),
                            ..Default::default()
                        })
                        .await;
                    if answered.is_ok() {
                        job.answered_at.insert(k, Instant::now());
                    }
                } else {
                    // By handle: a question that closed meanwhile is told so, never another.
                    let bot = job.bot;
                    let frame = bots[bot].event(
                        job.owner,
                        &format!("#{} {}", question.handle, job.answer(k)),
                        None,
                    );
                    let taken = bots[bot].send(frame.clone()).await;
                    job.sent.push(format!(
                        "{:?} again {k}: {frame} taken={taken}",
                        started.elapsed()
                    ));
                    if taken {
                        job.answered_at.insert(k, Instant::now());
                        *figures.entry("answers sent again").or_default() += 1;
                    }
                }
            }
            if now >= faults_end {
                let Ok(listed) = all_tasks(&mut client).await else {
                    continue;
                };
                let terminal = listed.iter().all(|t| {
                    t.state == pb::TaskState::Completed as i32
                        || t.state == pb::TaskState::Cancelled as i32
                });
                let completed: HashSet<&str> = listed
                    .iter()
                    .filter(|t| t.state == pb::TaskState::Completed as i32)
                    .map(|t| t.id.as_str())
                    .collect();
                let chat_results_in = jobs
                    .iter()
                    .filter(|j| j.via != Via::Grpc)
                    .filter(|j| j.id.as_deref().is_some_and(|id| completed.contains(id)))
                    .all(|j| !j.results.is_empty());
                let all_created = jobs.iter().all(|j| j.id.is_some());
                if all_created && listed.len() == tasks && terminal && chat_results_in {
                    settled_at = Instant::now();
                    break;
                }
            }
        }
        assert!(
            now < faults_end + SETTLE,
            "hark did not settle within {SETTLE:?} after the faults (seed {seed})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The checks.
    let mut client = api(&grpc_urls).await.expect("task-control answers");
    let mut completed = 0;
    let mut cancelled = 0;
    for job in &jobs {
        let id = job.id.clone().expect("every task was created");
        let got = client
            .get_task(pb::GetTaskRequest {
                task_id: id.clone(),
            })
            .await
            .expect("get")
            .into_inner();
        let task = got.task.expect("task");
        if task.state == pb::TaskState::Cancelled as i32 {
            assert!(
                job.cancelled,
                "job-{} was cancelled though nobody cancelled it (seed {seed})",
                job.n
            );
            cancelled += 1;
            continue;
        }
        assert_eq!(
            task.state,
            pb::TaskState::Completed as i32,
            "job-{} did not complete: {task:?} (seed {seed})",
            job.n
        );
        if task.result != job.expected() {
            let ledger = env
                .sql(&format!(
                    "SELECT handle, outcome, answer, answerer, inbound_message_id, asked_at, closed_at \
                     FROM questions WHERE task_id = '{id}' ORDER BY asked_at"
                ))
                .await;
            let audit = env
                .sql(&format!(
                    "SELECT event, generation, actor, at FROM transitions WHERE task_id = '{id}' ORDER BY id"
                ))
                .await;
            panic!(
                "job-{} got answers that are not its own, in order (seed {seed}):\n  got  {}\n  want {}\nquestions:\n{ledger}\naudit:\n{audit}\nsent (since the start {:?} before the faults' end):\n{}",
                job.n,
                task.result,
                job.expected(),
                Duration::from_secs(seconds),
                job.sent.join("\n")
            );
        }
        let answered: Vec<&pb::Question> = got
            .questions
            .iter()
            .filter(|q| q.outcome == pb::QuestionOutcome::Answered as i32)
            .collect();
        assert_eq!(
            answered.len(),
            job.questions,
            "job-{}: every question answered once (seed {seed})",
            job.n
        );
        for (k, q) in answered.iter().enumerate() {
            assert_eq!(
                q.answer.trim(),
                job.answer(k + 1),
                "job-{} question {}",
                job.n,
                k + 1
            );
            assert_ne!(q.answerer, "qq:99999", "job-{}: a stranger answered", job.n);
        }
        if job.via != Via::Grpc {
            assert!(
                !job.results.is_empty() && job.results.iter().all(|r| r.ends_with(&job.expected())),
                "job-{}: its chat got another result: {:?}",
                job.n,
                job.results
            );
        }
        completed += 1;
    }
    // Every resume was applied once: one 'answer' move per answered question in the audit.
    let answers = env
        .sql("SELECT count(*) FROM transitions WHERE event = 'answer'")
        .await;
    let answered = env
        .sql("SELECT count(*) FROM questions WHERE outcome = 'answered'")
        .await;
    assert_eq!(
        answers, answered,
        "each question resumed its task once (seed {seed})"
    );
    // No cancelled task moved again.
    let revived = env
        .sql(
            "SELECT count(*) FROM transitions c JOIN transitions later
               ON later.task_id = c.task_id AND later.id > c.id
             WHERE c.event = 'cancel'",
        )
        .await;
    assert_eq!(revived, "0", "a cancelled task came back (seed {seed})");
    let duplicated_results = results_seen.values().filter(|n| **n > 1).count() as u64;
    for role in &mut roles {
        if let Some(process) = &mut role.process
            && !process.running()
        {
            unexpected_exits.push(format!("{} exited by itself", role.name));
        }
    }
    let mut panics = Vec::new();
    for role in &roles {
        if let Some(process) = &role.process
            && process.output().contains("panicked")
        {
            panics.push(role.name.clone());
        }
    }
    let replays: u64 = roles
        .iter()
        .filter(|r| r.kind() == "gateway")
        .filter_map(|r| r.process.as_ref())
        .map(|p| {
            p.output()
                .lines()
                .filter(|l| l.contains("the spool holds messages a previous run did not send"))
                .filter_map(|l| l.split("messages=").nth(1))
                .filter_map(|n| n.split_whitespace().next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum();

    let recovery = settled_at.saturating_duration_since(faults_end);
    eprintln!("\nfaults, seed {seed}:");
    eprintln!(
        "  {seconds}s of faults; {tasks} tasks: {completed} completed, {cancelled} cancelled"
    );
    for (what, count) in &figures {
        eprintln!("  {what}: {count}");
    }
    for role in &roles {
        eprintln!("  {} killed {} times", role.name, role.kills);
    }
    eprintln!("  messages replayed from gateway spools: {replays}");
    eprintln!("  results delivered twice: {duplicated_results}");
    eprintln!("  time to recover after the last fault: {recovery:?}");
    assert!(
        unexpected_exits.is_empty(),
        "{unexpected_exits:?} (seed {seed})"
    );
    assert!(panics.is_empty(), "panicked: {panics:?} (seed {seed})");

    for role in &mut roles {
        if let Some(mut process) = role.process.take() {
            process.stop().await;
        }
    }
    drop(llm);
    env.cleanup().await;
    drop(nats);
    drop(postgres);
}
