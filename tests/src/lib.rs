//! The cross-service end-to-end suite: it starts the real `hark` binary as separate processes
//! against the real Postgres and nats-server, and talks to them the way users and bots do.
//!
//! This library holds the harness: [`Env`] gives each test a database and a NATS namespace of
//! its own, and [`Process`] runs one `hark` role and kills it (SIGKILL) on demand or on drop.

pub mod bot;
pub mod chat;
pub mod group;
pub mod maim;
pub mod servers;

use std::{
    collections::BTreeMap,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use hark_core::{
    bus::{ControlOp, Names},
    codec,
};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use prost::Message;
use tokio::process::{Child, Command};

pub use hark_testkit::{eventually, nats_url, postgres_url};

/// The `hark` binary beside this test's executable, built first (once per test process) so
/// that the suite does not depend on what else was built before it.
pub fn hark_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test executable path");
            // target/<profile>/deps/<test> → target/<profile>/hark
            let dir = exe
                .parent()
                .and_then(|d| d.parent())
                .expect("target directory");
            let profile = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("debug")
                .to_owned();
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace root");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = std::process::Command::new(cargo);
            build
                .current_dir(workspace)
                .args(["build", "--quiet", "-p", "hark", "--bin", "hark"]);
            // What cargo sets for this test's own package is not the build's: a build script
            // that watches one (ring's watches CARGO_MANIFEST_DIR) would otherwise be rerun,
            // and everything above it rebuilt, here and again by the next `cargo test`.
            for (name, _) in std::env::vars_os() {
                let name = name.to_string_lossy();
                if name.starts_with("CARGO_PKG_")
                    || name.starts_with("CARGO_BIN_")
                    || [
                        "CARGO_MANIFEST_DIR",
                        "CARGO_MANIFEST_PATH",
                        "CARGO_CRATE_NAME",
                        "CARGO_PRIMARY_PACKAGE",
                        "CARGO_TARGET_TMPDIR",
                        "CARGO_RUSTC_CURRENT_DIR",
                    ]
                    .contains(&name.as_ref())
                {
                    build.env_remove(name.as_ref());
                }
            }
            if profile == "release" {
                build.arg("--release");
            }
            let status = build.status().expect("cargo runs");
            assert!(status.success(), "cargo build -p hark failed");
            let bin = dir.join("hark");
            assert!(
                bin.exists(),
                "{} does not exist after building it",
                bin.display()
            );
            bin
        })
        .clone()
}

/// A port with nothing listening on it, for a test that checks what is said when a server does
/// not answer: one the kernel just gave and took back.
pub fn closed_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("a port of 127.0.0.1")
        .port()
}

/// A free TCP port on 127.0.0.1 for a Postgres or nats-server a test starts (and starts again
/// on the same port), handed to no other test of this machine in the last hour. hark's own
/// processes bind port 0 instead and say what they bound (see [`Process::addr`]); Postgres
/// cannot.
pub fn server_port() -> u16 {
    // Below the kernel's ephemeral range (32768–60999 on Linux), from which every outgoing
    // connection of every test takes its local port: a port from there, free when picked, can
    // be some connection's by the time a process binds it. Each port handed out is marked with
    // a file only one test process can create, so that two tests running at once never pick
    // the same one; a mark older than an hour is stale.
    let marks = std::env::temp_dir().join("hark-e2e-ports");
    let _ = std::fs::create_dir_all(&marks);
    loop {
        let [a, b, ..] = *uuid::Uuid::new_v4().as_bytes();
        let port = 20_000 + u16::from_le_bytes([a, b]) % 12_000;
        let mark = marks.join(port.to_string());
        let stale = std::fs::metadata(&mark)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600));
        if stale {
            let _ = std::fs::remove_file(&mark);
        }
        let taken = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&mark)
            .is_err();
        if !taken && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The listeners of an installation that its processes share, by config key: the gRPC API
/// and the gateway.
const SHARED_LISTENERS: [(&str, &str); 2] = [
    (GRPC_LISTEN, "HARK_CONTROL__GRPC_LISTEN"),
    (GATEWAY_LISTEN, "HARK_GATEWAY__LISTEN"),
];
const GRPC_LISTEN: &str = "control.grpc_listen";
const GATEWAY_LISTEN: &str = "gateway.listen";

/// Where one shared listener of an installation is: unknown until the first process that binds
/// it (on port 0) reports its port; from then on every process of the installation binds that
/// port, so that clients find a restarted role where they left it.
#[derive(Debug, Default)]
struct Listener {
    port: Option<u16>,
    /// The address files of the processes started while the port was unknown; whichever binds
    /// the listener writes it there.
    reported_to: Vec<PathBuf>,
}

/// One test's installation: its own database, namespace and ports.
#[derive(Debug)]
pub struct Env {
    pub namespace: String,
    pub database: String,
    /// Its shared listeners, learned from the processes that bound them.
    listeners: std::sync::Mutex<BTreeMap<&'static str, Listener>>,
    /// Extra `HARK_…` variables given to every process.
    pub vars: BTreeMap<String, String>,
    pub names: Names,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    /// The servers this installation uses: the machine's, or a test's own.
    nats_url: String,
    postgres_url: String,
    /// Removed by [`Env::cleanup`], or when this is dropped (a panic too).
    kit_database: hark_testkit::Database,
    kit_namespace: hark_testkit::Namespace,
}

impl Env {
    pub async fn new() -> Self {
        Self::on(nats_url(), postgres_url()).await
    }

    /// An installation on the given nats-server and Postgres server (`postgres://…` without a
    /// database).
    pub async fn on(nats_url: String, postgres_url: String) -> Self {
        let kit_namespace = hark_testkit::Namespace::on(nats_url.clone());
        let kit_database = hark_testkit::Database::on(postgres_url.clone());
        let namespace = kit_namespace.name.clone();
        let nats = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connect(nats_url.split(',').collect::<Vec<_>>())
            .await
            .expect(
                "nats-server with JetStream must answer on HARK_TEST_NATS_URL or 127.0.0.1:4222",
            );
        Self {
            nats_url,
            postgres_url,
            names: Names::new(namespace.parse().expect("namespace")),
            namespace,
            database: kit_database.name.clone(),
            kit_database,
            kit_namespace,
            listeners: Default::default(),
            vars: BTreeMap::new(),
            js: jetstream::new(nats.clone()),
            nats,
        }
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.vars.insert(key.to_owned(), value.to_owned());
    }

    /// The inbound spool of this installation's gateway.
    pub fn spool_dir(&self) -> PathBuf {
        std::env::temp_dir()
            .join("hark-e2e")
            .join(&self.namespace)
            .join("spool")
    }

    /// The port of the gRPC API, once a task-control of this installation bound it.
    pub async fn grpc_port(&self) -> u16 {
        self.port(GRPC_LISTEN).await
    }

    /// The port of the gateway, once a gateway of this installation bound it.
    pub async fn gateway_port(&self) -> u16 {
        self.port(GATEWAY_LISTEN).await
    }

    pub async fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port().await)
    }

    /// The port of the shared listener `key`, waiting for a process to report it.
    async fn port(&self, key: &str) -> u16 {
        eventually(
            &format!("a process of this installation reports the port of {key}"),
            Duration::from_secs(60),
            || async { self.learned(key) },
        )
        .await
    }

    /// The port of `key` when known, learned from the processes' address files if need be.
    fn learned(&self, key: &str) -> Option<u16> {
        let mut listeners = self.listeners.lock().expect("listeners");
        let listener = listeners.get_mut(key)?;
        if listener.port.is_none() {
            listener.port = listener.reported_to.iter().find_map(|file| {
                let text = std::fs::read_to_string(file).ok()?;
                hark_core::listen::last(&text, key).map(|addr| addr.port())
            });
        }
        listener.port
    }

    /// The environment every process of this installation gets.
    pub fn process_env(&self) -> BTreeMap<String, String> {
        let mut vars = BTreeMap::from([
            ("HARK_NATS__URL".to_owned(), self.nats_url.clone()),
            ("HARK_NATS__NAMESPACE".to_owned(), self.namespace.clone()),
            (
                "HARK_DATABASE__URL".to_owned(),
                format!("{}/{}", self.postgres_url, self.database),
            ),
            // No fixed console port: several task-controls of one installation may run.
            (
                "HARK_CONTROL__HTTP_LISTEN".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
            ("HARK_LOG__FILTER".to_owned(), "info".to_owned()),
            // The command line's own texts in English, whatever this machine's locale.
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            // The tests read the English texts (Chinese is the default on qq).
            ("HARK_CHAT__LANGUAGE".to_owned(), "en".to_owned()),
            (
                "HARK_GATEWAY__SPOOL_DIR".to_owned(),
                self.spool_dir().display().to_string(),
            ),
        ]);
        // Port 0 until a process bound it; the kernel hands out ports for bind(0) from the
        // other half of the ephemeral range than for outgoing connections, so a restarted
        // role finds its port free again.
        for (key, var) in SHARED_LISTENERS {
            let port = self.learned(key).unwrap_or(0);
            vars.insert(var.to_owned(), format!("127.0.0.1:{port}"));
        }
        vars.extend(self.vars.clone());
        vars
    }

    /// Starts `hark <args…>` with this installation's environment plus `extra`.
    pub fn spawn(&self, args: &[&str], extra: &[(&str, &str)]) -> Process {
        self.spawn_named(&args.join("-"), args, extra)
    }

    /// Like [`Env::spawn`], logging to `<name>.log` (appended to across restarts).
    pub fn spawn_named(&self, name: &str, args: &[&str], extra: &[(&str, &str)]) -> Process {
        self.spawn_through(name, &[], args, extra)
    }

    /// Like [`Env::spawn_named`], through `wrapper` (`setpriv --reuid=…`, say): `wrapper…
    /// hark args…`.
    pub fn spawn_through(
        &self,
        name: &str,
        wrapper: &[&str],
        args: &[&str],
        extra: &[(&str, &str)],
    ) -> Process {
        self.spawn_with(name, wrapper, args, self.process_env(), extra)
    }

    /// Like [`Env::spawn_through`], with none of this installation's settings: `hark` as a
    /// newcomer runs it, on its defaults (logging to this installation's directory).
    pub fn spawn_as_newcomer(
        &self,
        name: &str,
        wrapper: &[&str],
        args: &[&str],
        extra: &[(&str, &str)],
    ) -> Process {
        let vars = BTreeMap::from([("LANG".to_owned(), "C.UTF-8".to_owned())]);
        self.spawn_with(name, wrapper, args, vars, extra)
    }

    fn spawn_with(
        &self,
        name: &str,
        wrapper: &[&str],
        args: &[&str],
        vars: BTreeMap<String, String>,
        extra: &[(&str, &str)],
    ) -> Process {
        // Each process logs to a file of its own; HARK_E2E_LOGS=inherit shows them inline.
        let log_dir = std::env::temp_dir().join("hark-e2e").join(&self.namespace);
        std::fs::create_dir_all(&log_dir).expect("log directory");
        let log_path = log_dir.join(format!("{name}.log"));
        // Where it writes the addresses it binds; a restart writes anew.
        let addr_path = log_dir.join(format!("{name}.addr"));
        let _ = std::fs::remove_file(&addr_path);
        let (stdout, stderr) = if std::env::var("HARK_E2E_LOGS").as_deref() == Ok("inherit") {
            (Stdio::inherit(), Stdio::inherit())
        } else {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .expect("log file");
            (
                Stdio::from(file.try_clone().expect("log file")),
                Stdio::from(file),
            )
        };
        let mut command = match wrapper.split_first() {
            Some((program, before)) => {
                let mut command = Command::new(program);
                command.args(before).arg(hark_binary());
                command
            }
            None => Command::new(hark_binary()),
        };
        command
            .args(args)
            .env_remove("HARK_CONFIG")
            .env_remove("LC_ALL")
            .env_remove("LC_MESSAGES")
            .env("NO_COLOR", "1")
            .env(hark_core::listen::ENV_ADDR_FILE, &addr_path)
            .envs(&vars)
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        let child = command.spawn().expect("the hark binary starts");
        // A shared listener this process may bind on port 0 is learned from what it reports.
        {
            let mut listeners = self.listeners.lock().expect("listeners");
            for (key, var) in SHARED_LISTENERS {
                let on_port_0 = extra
                    .iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| *v)
                    .or(vars.get(var).map(String::as_str))
                    .is_some_and(|listen| listen.ends_with(":0"));
                let listener = listeners.entry(key).or_default();
                if on_port_0 && listener.port.is_none() {
                    listener.reported_to.push(addr_path.clone());
                }
            }
        }
        eprintln!(
            "started hark {} (log: {})",
            args.join(" "),
            log_path.display()
        );
        Process {
            name: name.to_owned(),
            child,
            log: log_path,
            addrs: addr_path,
        }
    }

    /// A gRPC client, once task-control serves (its health says so; while it starts, it
    /// answers health only).
    pub async fn client(&self) -> TaskServiceClient<tonic::transport::Channel> {
        for _ in 0..600 {
            if let Ok(channel) = tonic::transport::Endpoint::from_shared(self.grpc_url().await)
                .expect("endpoint")
                .connect()
                .await
            {
                let mut health =
                    tonic_health::pb::health_client::HealthClient::new(channel.clone());
                let serving = health
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: "hark.v1.TaskService".into(),
                    })
                    .await
                    .is_ok_and(|r| {
                        r.into_inner().status
                            == tonic_health::pb::health_check_response::ServingStatus::Serving
                                as i32
                    });
                if serving {
                    return TaskServiceClient::new(channel);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "task-control did not serve on {} within 60s",
            self.grpc_url().await
        );
    }

    /// A gRPC client that sends `token` as its bearer token, once task-control answers.
    pub async fn client_with_token(&self, token: &str) -> AuthorizedClient {
        self.client().await;
        let channel = tonic::transport::Endpoint::from_shared(self.grpc_url().await)
            .expect("endpoint")
            .connect()
            .await
            .expect("task-control answers");
        let value = format!("Bearer {token}").parse().expect("header value");
        TaskServiceClient::with_interceptor(channel, Bearer(value))
    }

    /// The run jobs consumer, as workers use it.
    pub async fn jobs(&self) -> PullConsumer {
        for _ in 0..300 {
            if let Ok(c) = self
                .js
                .get_consumer_from_stream(Names::WORKER_CONSUMER, self.names.task_run_stream())
                .await
            {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the run job stream was not created within 30s");
    }

    /// Sends a worker control request and decodes the response.
    pub async fn request<Resp: Message + Default>(
        &self,
        op: ControlOp,
        payload: bytes::Bytes,
    ) -> Resp {
        let reply = self
            .nats
            .request(self.names.control(op), payload)
            .await
            .expect("task-control answers control requests");
        Resp::decode(reply.payload).expect("response decodes")
    }

    /// Runs one SQL query on this installation's database with psql; returns its rows, one a
    /// line, columns separated by `|`.
    pub async fn sql(&self, query: &str) -> String {
        let output = Command::new("psql")
            .args([
                &format!("{}/{}", self.postgres_url, self.database),
                "-AtXc",
                query,
            ])
            .output()
            .await
            .expect("psql runs");
        assert!(
            output.status.success(),
            "psql failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Deletes the streams and the database. Processes must be stopped first.
    pub async fn cleanup(self) {
        self.kit_namespace.remove().await;
        self.kit_database.remove().await;
    }
}

/// Adds a bearer token to every call.
#[derive(Debug, Clone)]
pub struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A gRPC client with a bearer token.
pub type AuthorizedClient = TaskServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// Fetches up to `max` messages, waiting at most `wait`; each is acked.
pub async fn fetch<M: codec::Versioned>(
    consumer: &PullConsumer,
    max: usize,
    wait: Duration,
) -> Vec<M> {
    let mut batch = consumer
        .fetch()
        .max_messages(max)
        .expires(wait)
        .messages()
        .await
        .expect("fetch");
    let mut out = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.expect("message");
        message.ack().await.expect("ack");
        out.push(codec::decode(&message.payload).expect("decodes"));
    }
    out
}

/// A running `hark` process.
#[derive(Debug)]
pub struct Process {
    pub name: String,
    child: Child,
    /// Where its output goes (empty with `HARK_E2E_LOGS=inherit`).
    log: PathBuf,
    /// Where it writes the addresses it bound (`HARK_ADDR_FILE`).
    addrs: PathBuf,
}

impl Process {
    /// Its process id, while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The address it bound for the listener of config key `key` (`control.http_listen`,
    /// `metrics.listen`, …), once it did.
    pub async fn addr(&self, key: &str) -> std::net::SocketAddr {
        eventually(
            &format!("{} reports the address of {key}", self.name),
            Duration::from_secs(60),
            || async {
                let text = std::fs::read_to_string(&self.addrs).ok()?;
                hark_core::listen::last(&text, key)
            },
        )
        .await
    }

    /// What the process wrote to stdout and stderr so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its output contains `needle`; panics after `wait` with the output.
    pub async fn wait_for_output(&self, needle: &str, wait: Duration) -> String {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let output = self.output();
            if output.contains(needle) {
                return output;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{} did not print {needle:?} within {wait:?}:\n{output}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown, no flushing.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit by itself; returns whether it did within `wait`.
    pub async fn exited_within(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(wait, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Whether it is still running (it did not exit by itself or by a kill).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub async fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        self.exited_within(Duration::from_secs(20)).await
    }
}

/// A scripted LLM for which every task asks "Which day?" and then says "Booked for {answer}.".
pub async fn booking_llm() -> hark_worker::scripted::ScriptedLlm {
    use hark_worker::scripted::{Script, ScriptedLlm, Step};
    ScriptedLlm::with_default(Script::new(vec![
        Step::ask("Which day?"),
        Step::say("Booked for {answer}."),
    ]))
    .await
    .expect("scripted LLM")
}

/// With [`booking_llm`]: `user` books a room in `group` through `bot`, the question and the
/// result seen in the chat.
pub async fn book_a_room(bot: &mut bot::Bot, group: i64, user: i64) {
    let wait = Duration::from_secs(30);
    bot.group_message(group, user, "/task new book a room")
        .await;
    bot.expect("the question", wait, |s| s.text.contains("Which day?"))
        .await;
    bot.group_message(group, user, "Friday").await;
    bot.expect("the result", wait, |s| {
        s.text.contains("Booked for Friday.")
    })
    .await;
}

/// Creates a task of `owner` with `goal` over the API, as a client would.
pub async fn new_task(
    api: &mut TaskServiceClient<tonic::transport::Channel>,
    owner: &str,
    goal: &str,
) -> pb::Task {
    api.create_task(pb::CreateTaskRequest {
        owner: owner.into(),
        goal: goal.into(),
        ..Default::default()
    })
    .await
    .expect("created")
    .into_inner()
    .task
    .expect("task")
}

/// A questionnaire of `questions` (key, text) asked of `owner`, created with `request`'s other
/// fields.
pub async fn new_questionnaire(
    api: &mut TaskServiceClient<tonic::transport::Channel>,
    owner: &str,
    questions: &[(&str, &str)],
    request: pb::CreateTaskRequest,
) -> pb::Task {
    let questionnaire = questions
        .iter()
        .map(|(key, text)| pb::FormQuestion {
            key: (*key).into(),
            text: (*text).into(),
            ..Default::default()
        })
        .collect();
    api.create_task(pb::CreateTaskRequest {
        owner: owner.into(),
        questionnaire,
        ..request
    })
    .await
    .expect("created")
    .into_inner()
    .task
    .expect("task")
}

/// The open question of `task` other than `not`, once it has one: a question asked after the
/// one answered.
pub async fn open_question_besides(
    api: &TaskServiceClient<tonic::transport::Channel>,
    task: &str,
    not: Option<&str>,
) -> pb::Question {
    let mut api = api.clone();
    let asked = async {
        loop {
            let got = api
                .get_task(pb::GetTaskRequest {
                    task_id: task.into(),
                })
                .await
                .map(|r| r.into_inner().task.expect("task"));
            if let Ok(task) = got
                && let Some(q) = task.open_question
                && Some(q.id.as_str()) != not
            {
                return q;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), asked)
        .await
        .expect("a question is asked")
}

/// Claims the task of `job` as `worker`.
pub async fn claim(env: &Env, job: &pb::RunJob, worker: &str) -> pb::ClaimResponse {
    env.request(
        ControlOp::Claim,
        codec::encode(pb::ClaimRequest {
            task_id: job.task_id.clone(),
            generation: job.generation,
            worker_id: worker.into(),
            ..Default::default()
        }),
    )
    .await
}

/// Asks the task held under `lease` "Which day?" as a worker would, with round 1 ending in the
/// ask_user call `call-1`.
pub async fn ask(env: &Env, lease: Option<pb::Lease>) -> pb::AskResponse {
    let messages = serde_json::json!([{"role": "assistant", "content": null, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "ask_user", "arguments": "{}"}}]}]);
    env.request(
        ControlOp::Ask,
        codec::encode(pb::AskRequest {
            lease,
            round: Some(pb::Round {
                number: 1,
                messages_json: serde_json::to_vec(&messages).expect("json"),
                ..Default::default()
            }),
            tool_call_id: "call-1".into(),
            question: "Which day?".into(),
            ..Default::default()
        }),
    )
    .await
}

/// Renews `lease` as its worker would.
pub async fn heartbeat(env: &Env, lease: &pb::Lease) -> pb::HeartbeatResponse {
    env.request(
        ControlOp::Heartbeat,
        codec::encode(pb::HeartbeatRequest {
            lease: Some(lease.clone()),
            ..Default::default()
        }),
    )
    .await
}

/// Completes the task held under `lease` with `result`, as its worker would.
pub async fn complete(env: &Env, lease: Option<pb::Lease>, result: &str) -> pb::ControlAck {
    env.request(
        ControlOp::Complete,
        codec::encode(pb::CompleteRequest {
            lease,
            result: result.into(),
            ..Default::default()
        }),
    )
    .await
}
