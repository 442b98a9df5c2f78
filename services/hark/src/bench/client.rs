//! What a client sees, measured over the public gRPC API only, from a separate process: no
//! NATS subscription, no look at the scripted LLM's requests. Both task kinds side by side: a
//! questionnaire (hark's own mechanics, no model) and an agent that calls the scripted model
//! (which answers at once). Two clients drive the same workloads: this process, through hark's
//! Rust client, and `bench/python/client.py`, through Python's official `grpcio`.
//!
//! - **W1**: a task waits on its question (seen through `WatchTask`); the client thinks (100 ms
//!   by default, as a person or a program takes time to answer), answers with `AnswerQuestion`
//!   waiting for the next question or the end, and times until that reply, carrying the
//!   completed task's output, is in its hands.
//! - **W2**: N tasks created with a bounded number of calls in flight and each seen waiting on
//!   one `WatchTasks` stream; then all N answered the same way, each no sooner than the think
//!   time after it was seen, each answer's reply carrying its task's output.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures_util::StreamExt;
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    sync::Semaphore,
    task::JoinSet,
};

use super::{Bench, Report, limits::Limits, mib, summary, w2};

const WAIT: Duration = Duration::from_secs(30);

/// Who drives a workload.
#[derive(Debug, Clone)]
pub enum Driver {
    /// This process, through hark's Rust client (tonic).
    Rust,
    /// `bench/python/client.py`, run by this Python interpreter, through `grpcio`.
    Python(PathBuf),
}

impl Driver {
    fn name(&self) -> &'static str {
        match self {
            Driver::Rust => "client",
            Driver::Python(_) => "python",
        }
    }

    fn client(&self) -> &'static str {
        match self {
            Driver::Rust => "hark's Rust client",
            Driver::Python(_) => "Python grpcio",
        }
    }
}

/// How a workload is driven: by whom, and how long its client thinks before each answer.
#[derive(Debug, Clone)]
pub struct Drive {
    pub driver: Driver,
    pub think: Duration,
}

/// The kind of task measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Questionnaire,
    Agent,
}

impl Kind {
    pub const BOTH: [Kind; 2] = [Kind::Questionnaire, Kind::Agent];

    /// The kind called `name`, as `--kinds` spells it.
    pub fn named(name: &str) -> Option<Kind> {
        Kind::BOTH.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Questionnaire => "questionnaire",
            Kind::Agent => "agent",
        }
    }

    /// A task of this kind that asks one question, then ends with the answer in its output.
    fn task(self, owner: &str, script: &str, label: &str) -> pb::CreateTaskRequest {
        match self {
            Kind::Questionnaire => pb::CreateTaskRequest {
                owner: owner.into(),
                goal: label.into(),
                questionnaire: vec![pb::FormQuestion {
                    key: "go".into(),
                    text: "Go on?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            Kind::Agent => pb::CreateTaskRequest {
                owner: owner.into(),
                goal: format!("[script:{script}] {label}"),
                ..Default::default()
            },
        }
    }
}

/// An answer that waits for the task's end; the completed event it brings back.
async fn answer_until_end(
    api: &mut hark_proto::v1::task_service_client::TaskServiceClient<tonic::transport::Channel>,
    task: &str,
    answer: &str,
) -> anyhow::Result<pb::TaskEvent> {
    let replied = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.into(),
            answer: answer.into(),
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            wait_timeout_ms: WAIT.as_millis() as u32,
            ..Default::default()
        })
        .await
        .context("AnswerQuestion failed")?
        .into_inner();
    let event = replied
        .event
        .with_context(|| format!("task {task} did not end within {WAIT:?} of its answer"))?;
    anyhow::ensure!(
        event.state == pb::TaskState::Completed as i32,
        "task {task} ended {:?}: {}",
        pb::TaskState::try_from(event.state),
        event.error
    );
    anyhow::ensure!(
        event.result.contains(answer),
        "task {task}'s output `{}` lacks its answer `{answer}`",
        event.result
    );
    Ok(event)
}

pub async fn w1(
    bench: &mut Bench,
    kind: Kind,
    drive: &Drive,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Report> {
    let name = format!("w1-{}-{}", drive.driver.name(), kind.name());
    let mut samples = match &drive.driver {
        Driver::Rust => w1_rust(bench, kind, drive.think, &name, warmup, rounds).await?,
        Driver::Python(python) => {
            let run = Python::start(
                python,
                bench,
                &[
                    ("--workload", "w1".into()),
                    ("--kind", kind.name().into()),
                    ("--owner", "bench:w1p".into()),
                    ("--script", "w1".into()),
                    ("--rounds", rounds.to_string()),
                    ("--warmup", warmup.to_string()),
                    ("--think-ms", drive.think.as_millis().to_string()),
                ],
            )?;
            run.samples().await?
        }
    };
    let stats = summary(&mut samples);
    let mut json = json!({"workload": name, "kind": kind.name(), "rounds": rounds, "warmup": warmup,
        "think_ms": drive.think.as_millis() as u64});
    if let (Some(obj), Some(s)) = (json.as_object_mut(), stats.as_object()) {
        obj.extend(s.clone());
    }
    let rows = vec![(
        name.clone(),
        format!(
            "{} task, answer sent → reply with the output received, over gRPC from {} after {} ms of thought (p50 / p90 / p99)",
            kind.name(),
            drive.driver.client(),
            drive.think.as_millis()
        ),
        format!(
            "{} / {} / {} ms",
            stats["p50_ms"], stats["p90_ms"], stats["p99_ms"]
        ),
    )];
    Ok(Report { json, rows })
}

async fn w1_rust(
    bench: &mut Bench,
    kind: Kind,
    think: Duration,
    name: &str,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(rounds);
    let mut api = bench.api.clone();
    for round in 0..warmup + rounds {
        let token = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let task = api
            .create_task(kind.task("bench:w1c", "w1", &format!("{name} round {round}")))
            .await
            .context("CreateTask failed")?
            .into_inner()
            .task
            .context("no task")?;
        let mut watch = api
            .watch_task(pb::WatchTaskRequest {
                task_id: task.id.clone(),
            })
            .await
            .context("WatchTask failed")?
            .into_inner();
        loop {
            let event = tokio::time::timeout(WAIT, watch.next())
                .await
                .context("a W1 task did not reach waiting_input within 30s")?
                .context("the watch ended before the task waited")??;
            if event.state == pb::TaskState::WaitingInput as i32 {
                break;
            }
        }
        drop(watch);
        tokio::time::sleep(think).await;
        let answer = format!("yes-{token}");
        let t0 = Instant::now();
        answer_until_end(&mut api, &task.id, &answer).await?;
        if round >= warmup {
            samples.push(t0.elapsed());
        }
    }
    Ok(samples)
}

/// The processes' CPU and memory at the marks of a W2 run, and how long its phases took.
struct Marks {
    /// The Python client's process, whose CPU is read beside the others'.
    client: Option<u32>,
    suspending: Vec<(String, f64)>,
    waited: Vec<(String, f64)>,
    waiting_memory: Vec<(String, u64)>,
    resuming: Vec<(String, f64)>,
    resumed: Vec<(String, f64)>,
    suspend_s: f64,
    resume_s: f64,
    /// The first page of each way to see the waiting tasks, p50 in milliseconds.
    pages: Vec<(&'static str, f64)>,
}

impl Marks {
    fn suspending(bench: &Bench, client: Option<u32>) -> Self {
        Self {
            client,
            suspending: w2::cpu(bench, client),
            waited: Vec::new(),
            waiting_memory: Vec::new(),
            resuming: Vec::new(),
            resumed: Vec::new(),
            suspend_s: 0.0,
            resume_s: 0.0,
            pages: Vec::new(),
        }
    }

    /// Every task waits: the CPU so far, then, once the processes settled, their memory.
    async fn waiting(&mut self, bench: &Bench) {
        self.waited = w2::cpu(bench, self.client);
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.waiting_memory = w2::memory(bench);
        self.resuming = w2::cpu(bench, self.client);
    }

    fn resumed(&mut self, bench: &Bench) {
        self.resumed = w2::cpu(bench, self.client);
    }
}

pub async fn w2(
    bench: &mut Bench,
    kind: Kind,
    drive: &Drive,
    n: usize,
    in_flight: usize,
    limits: Option<&Limits>,
) -> anyhow::Result<Report> {
    let name = format!("w2-{}-{}", drive.driver.name(), kind.name());
    let owner = format!(
        "bench:w2c-{}-{}",
        kind.name(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let idle = w2::memory(bench);
    let marks = match &drive.driver {
        Driver::Rust => w2_rust(bench, kind, &owner, n, in_flight, drive.think).await?,
        Driver::Python(python) => {
            let mut run = Python::start(
                python,
                bench,
                &[
                    ("--workload", "w2".into()),
                    ("--kind", kind.name().into()),
                    ("--owner", owner.clone()),
                    ("--script", "w2".into()),
                    ("--tasks", n.to_string()),
                    ("--in-flight", in_flight.to_string()),
                    ("--think-ms", drive.think.as_millis().to_string()),
                ],
            )?;
            run.until("suspending").await?;
            let mut marks = Marks::suspending(bench, run.child.id());
            run.until("waiting").await?;
            marks.waiting(bench).await;
            run.go().await?;
            run.until("resumed").await?;
            marks.resumed(bench);
            let done = run.until("resume_s").await?;
            run.finish().await?;
            marks.suspend_s = done["suspend_s"].as_f64().unwrap_or_default();
            marks.resume_s = done["resume_s"].as_f64().unwrap_or_default();
            marks
        }
    };
    let (suspend_s, resume_s) = (marks.suspend_s, marks.resume_s);
    let waiting = marks.waiting_memory.clone();
    let cpu_suspend = w2::cpu_per_task(&marks.suspending, &marks.waited, n);
    let cpu_resume = w2::cpu_per_task(&marks.resuming, &marks.resumed, n);

    let suspends_per_s = n as f64 / suspend_s;
    let resumes_per_s = n as f64 / resume_s;
    let hark_total = w2::hark_total(&waiting);
    let mut json = json!({
        "workload": name,
        "kind": kind.name(),
        "tasks": n,
        "in_flight": in_flight,
        "think_ms": drive.think.as_millis() as u64,
        "suspends_per_s": suspends_per_s.round(),
        "resumes_per_s": resumes_per_s.round(),
        "suspend_all_s": (suspend_s * 1000.0).round() / 1000.0,
        "resume_all_s": (resume_s * 1000.0).round() / 1000.0,
        "hark_rss_total_mib_waiting": mib(hark_total),
        "cpu_ms_per_task_suspend": w2::cpu_json(&cpu_suspend),
        "cpu_ms_per_task_resume_to_completion": w2::cpu_json(&cpu_resume),
        "memory_idle_mib": w2::memory_json(&idle),
        "memory_waiting_mib": w2::memory_json(&waiting),
    });
    let mut rows = vec![
        (
            name.clone(),
            format!(
                "suspends/s ({n} {} tasks created and seen waiting over gRPC, {})",
                kind.name(),
                drive.driver.client()
            ),
            format!("{suspends_per_s:.0}"),
        ),
        (
            name.clone(),
            format!("resumes/s ({in_flight} answers in flight, each reply bringing its output)"),
            format!("{resumes_per_s:.0}"),
        ),
        (
            name.clone(),
            "CPU ms per task, create to seen waiting, by process".to_owned(),
            w2::cpu_row(&cpu_suspend),
        ),
        (
            name.clone(),
            "CPU ms per task, answer to output received, by process".to_owned(),
            w2::cpu_row(&cpu_resume),
        ),
    ];
    rows.extend(w2::memory_rows(&name, &idle, &waiting, n));
    for (what, p50) in &marks.pages {
        rows.push((
            name.clone(),
            format!("{what}, with {n} waiting (p50)"),
            format!("{p50:.2} ms"),
        ));
    }
    if let Some(obj) = json.as_object_mut()
        && !marks.pages.is_empty()
    {
        let pages: serde_json::Map<String, Value> = marks
            .pages
            .iter()
            .map(|(what, p50)| ((*what).to_owned(), json!(p50)))
            .collect();
        obj.insert("first_page_p50_ms".into(), Value::Object(pages));
    }
    if let Some(limits) = limits
        && let Some(obj) = json.as_object_mut()
    {
        obj.insert(
            "pg_commits_per_s_limit".into(),
            json!(limits.commits_per_s.round()),
        );
        obj.insert(
            "js_publish_acks_per_s_limit".into(),
            json!(limits.publish_per_s.round()),
        );
    }
    Ok(Report { json, rows })
}

/// W2 through hark's Rust client, in this process.
async fn w2_rust(
    bench: &mut Bench,
    kind: Kind,
    owner: &str,
    n: usize,
    in_flight: usize,
    think: Duration,
) -> anyhow::Result<Marks> {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut watch = bench
        .api
        .clone()
        .watch_tasks(pb::WatchTasksRequest {
            owner: owner.to_owned(),
            states: vec![pb::TaskState::WaitingInput as i32],
            ..Default::default()
        })
        .await
        .context("WatchTasks failed")?
        .into_inner();

    // Suspend: create N tasks, each seen waiting on the stream.
    let mut marks = Marks::suspending(bench, None);
    let t0 = Instant::now();
    let mut creating = JoinSet::new();
    let creator = {
        let api = bench.api.clone();
        let slots = slots.clone();
        let owner = owner.to_owned();
        tokio::spawn(async move {
            for i in 0..n {
                let permit = slots.clone().acquire_owned().await?;
                let mut api = api.clone();
                let request = kind.task(&owner, "w2", &format!("w2 task {i}"));
                creating.spawn(async move {
                    let created = api.create_task(request).await;
                    drop(permit);
                    created.map(|r| r.into_inner().task.map(|t| t.id).unwrap_or_default())
                });
            }
            let mut ids = Vec::with_capacity(n);
            while let Some(created) = creating.join_next().await {
                ids.push(created?.context("CreateTask failed")?);
            }
            anyhow::Ok(ids)
        })
    };
    let mut seen = HashMap::with_capacity(n);
    while seen.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(120), watch.next())
            .await
            .context("W2 tasks stopped reaching waiting_input for 2 minutes")?
            .context("the WatchTasks stream ended")??;
        if let Some(event) = next.event {
            seen.entry(event.task_id).or_insert_with(Instant::now);
        }
    }
    marks.suspend_s = t0.elapsed().as_secs_f64();
    drop(watch);
    let ids = creator.await??;
    marks.waiting(bench).await;
    marks.pages = first_pages(bench, owner).await?;

    // Resume: answer all N, each no sooner than the think time after it was seen, each answer
    // waiting for its task's end.
    let t1 = Instant::now();
    let mut answering = JoinSet::new();
    for (i, id) in ids.into_iter().enumerate() {
        let permit = slots.clone().acquire_owned().await?;
        let mut api = bench.api.clone();
        let due = seen.get(&id).map_or(t1, |at| *at + think);
        answering.spawn(async move {
            tokio::time::sleep_until(due.into()).await;
            let done = answer_until_end(&mut api, &id, &format!("w2-{i}")).await;
            drop(permit);
            done.map(|_| ())
        });
    }
    while let Some(answered) = answering.join_next().await {
        answered??;
    }
    marks.resume_s = t1.elapsed().as_secs_f64();
    marks.resumed(bench);
    Ok(marks)
}

/// How long the first page of the waiting tasks takes, the p50 of 20 tries each, while `owner`
/// has every task of the run waiting: `ListQuestions` (50 a page), opening a `WatchTasks` stream
/// of them (its headers back), and the console's inbox (`GET /api/questions`).
async fn first_pages(bench: &Bench, owner: &str) -> anyhow::Result<Vec<(&'static str, f64)>> {
    const TRIES: usize = 20;
    let mut api = bench.api.clone();
    let mut list = Vec::with_capacity(TRIES);
    let mut watch = Vec::with_capacity(TRIES);
    for _ in 0..TRIES {
        let t = Instant::now();
        let page = api
            .list_questions(pb::ListQuestionsRequest {
                owner: owner.to_owned(),
                page_size: 50,
                ..Default::default()
            })
            .await
            .context("ListQuestions failed")?
            .into_inner();
        list.push(t.elapsed());
        anyhow::ensure!(
            !page.questions.is_empty(),
            "ListQuestions found no question of {owner}"
        );
        let t = Instant::now();
        let stream = api
            .watch_tasks(pb::WatchTasksRequest {
                owner: owner.to_owned(),
                states: vec![pb::TaskState::WaitingInput as i32],
                ..Default::default()
            })
            .await
            .context("WatchTasks failed")?;
        watch.push(t.elapsed());
        drop(stream);
    }
    let p50 = |samples: &mut Vec<Duration>| super::ms(summary_p50(samples));
    let mut pages = vec![
        ("ListQuestions, first page of 50", p50(&mut list)),
        ("WatchTasks opened", p50(&mut watch)),
    ];
    let console = &bench.config.control.http_listen;
    if !console.is_empty() {
        hark_core::install_crypto();
        let http = reqwest::Client::new();
        let url = format!("http://{console}/api/questions?owner={owner}");
        let mut inbox = Vec::with_capacity(TRIES);
        for _ in 0..TRIES {
            let t = Instant::now();
            let got = http.get(&url).send().await.context("the console's inbox")?;
            anyhow::ensure!(
                got.status().is_success(),
                "the console's inbox answered {}",
                got.status()
            );
            got.bytes().await?;
            inbox.push(t.elapsed());
        }
        pages.push(("console inbox, first page", p50(&mut inbox)));
    }
    Ok(pages)
}

fn summary_p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    super::percentile(samples, 50.0)
}

/// `bench/python/client.py`, running one workload against this bench's task-control: the JSON
/// lines it prints, read as they come.
pub(super) struct Python {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Python {
    /// The client script and the protos it generates its stubs from, in this checkout.
    fn files() -> (PathBuf, PathBuf) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        (
            root.join("bench/python/client.py"),
            root.join("proto/proto"),
        )
    }

    fn start(python: &Path, bench: &Bench, args: &[(&str, String)]) -> anyhow::Result<Self> {
        let target = hark_core::config::dial(bench.config.control.grpc_listen).to_string();
        Self::start_at(python, &target, args)
    }

    /// The client against the gRPC server at `target` (host:port).
    pub(super) fn start_at(
        python: &Path,
        target: &str,
        args: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let (script, proto) = Self::files();
        anyhow::ensure!(
            script.is_file() && proto.is_dir(),
            "--python needs hark's checkout: {} and {} are missing",
            script.display(),
            proto.display()
        );
        let mut command = tokio::process::Command::new(python);
        command
            .arg(&script)
            .arg("--target")
            .arg(target)
            .arg("--proto")
            .arg(&proto);
        for (key, value) in args {
            command.arg(key).arg(value);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {} (--python): install bench/python/requirements.txt in a venv and pass its python",
                    python.display()
                )
            })?;
        let stdout = child
            .stdout
            .take()
            .context("no stdout of the Python client")?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Reads the client's lines until one has `key` (a mark's name, or a result's field).
    async fn until(&mut self, key: &str) -> anyhow::Result<Value> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(600), self.lines.next_line())
                .await
                .with_context(|| {
                    format!("the Python client said nothing for 10 minutes while {key} was awaited")
                })??;
            let Some(line) = line else {
                let status = self.child.wait().await?;
                anyhow::bail!(
                    "the Python client ended ({status}) before `{key}`; its stderr is above"
                );
            };
            let Ok(value) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if value.get(key).is_some() || value["mark"] == key {
                return Ok(value);
            }
        }
    }

    /// Tells the client to go on after a mark it waits at.
    async fn go(&mut self) -> anyhow::Result<()> {
        let stdin = self
            .child
            .stdin
            .as_mut()
            .context("no stdin of the Python client")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// The times the client printed as `samples_ms` once it measured them, after it ended.
    pub(super) async fn samples(mut self) -> anyhow::Result<Vec<Duration>> {
        let done = self.until("samples_ms").await?;
        self.finish().await?;
        Ok(done["samples_ms"]
            .as_array()
            .context("the Python client printed no samples")?
            .iter()
            .filter_map(Value::as_f64)
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .collect())
    }

    pub(super) async fn finish(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("the Python client did not end within 60s of its result")??;
        anyhow::ensure!(status.success(), "the Python client failed ({status})");
        Ok(())
    }
}
