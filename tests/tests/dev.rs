//! `hark dev` on a machine where nothing answers at `database.url` or `nats.url`: it starts a
//! private Postgres (the distribution's `initdb`/`pg_ctl`) and `nats-server` under its data
//! directory, stops them when it exits, and finds its tasks there again the next time.

use std::time::Duration;

use hark_e2e::{Env, server_port};
use hark_proto::v1 as pb;

/// initdb and a first start of Postgres take a while on a loaded machine.
const START: Duration = Duration::from_secs(180);

async fn answers(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// Waits until nothing answers on `port` any more.
async fn closed(port: u16) -> bool {
    for _ in 0..200 {
        if !answers(port).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn hark_dev_starts_private_servers_where_none_answer_and_keeps_their_data() {
    let pg_port = server_port();
    let nats_port = server_port();
    let data = std::env::temp_dir().join(format!("hark-dev-{}", uuid::Uuid::new_v4().simple()));
    let env = Env::new().await;
    let database = format!("postgres://postgres@127.0.0.1:{pg_port}/hark");
    let nats = format!("nats://127.0.0.1:{nats_port}");
    let data_dir = data.display().to_string();
    let vars = [
        ("HARK_DATABASE__URL", database.as_str()),
        ("HARK_NATS__URL", nats.as_str()),
        // The built-in demo model: no llm.base_url.
        ("HARK_LLM__BASE_URL", ""),
    ];
    let args = ["dev", "--workers", "1", "--data-dir", &data_dir];

    let mut dev = env.spawn_named("dev-1", &args, &vars);
    let banner = dev.wait_for_output("hark dev is up", START).await;
    assert!(
        banner.contains(&format!(
            "started:                  Postgres on 127.0.0.1:{pg_port}"
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!(
            "started:                  nats-server with JetStream on 127.0.0.1:{nats_port}"
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("data:                     {data_dir}")),
        "{banner}"
    );
    assert!(banner.contains("web console:"), "{banner}");
    assert!(data.join("postgres/PG_VERSION").exists());

    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:me", "say hello").await;
    let asking = tokio::time::Instant::now() + START;
    let question = loop {
        assert!(
            tokio::time::Instant::now() < asking,
            "the demo model asked nothing:\n{}",
            dev.output()
        );
        let got = api
            .get_task(pb::GetTaskRequest {
                task_id: task.id.clone(),
            })
            .await
            .expect("get task")
            .into_inner();
        if let Some(q) = got.task.and_then(|t| t.open_question) {
            break q;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        question.text.contains("What should I call you?"),
        "{}",
        question.text
    );

    // It stops its servers when it stops.
    let status = dev.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", dev.output());
    // Quiet: short lines, none of the NATS client's chatter, and a silent clean stop.
    let output = dev.output();
    let after_banner = output.split("Stop with Ctrl-C").nth(1).expect("the banner");
    for line in after_banner.lines() {
        assert!(line.chars().count() <= 240, "a long line: {line}");
        assert!(
            !line.contains("async_nats") && !line.contains("IO error"),
            "noise: {line}"
        );
    }
    assert!(
        after_banner
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
            <= 8,
        "{after_banner}"
    );
    assert!(closed(pg_port).await, "the private Postgres stopped");
    assert!(closed(nats_port).await, "the private nats-server stopped");

    // The next time, the task is still there, waiting; answered, it completes.
    let mut again = env.spawn_named("dev-2", &args, &vars);
    again.wait_for_output("hark dev is up", START).await;
    let mut api = env.client().await;
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "Ada".into(),
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            wait_timeout_ms: 60_000,
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    let event = answered.event.expect("the task ended in time");
    assert_eq!(event.state, pb::TaskState::Completed as i32, "{event:?}");
    assert!(event.result.contains("Ada"), "{}", event.result);
    let status = again.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", again.output());
    assert!(closed(pg_port).await && closed(nats_port).await);

    let _ = std::fs::remove_dir_all(&data);
    env.cleanup().await;
}

/// A Postgres of the distribution's kind that asks for a password, on `port`; stopped when
/// dropped.
struct PasswordPostgres {
    bin: std::path::PathBuf,
    data: std::path::PathBuf,
}

impl PasswordPostgres {
    fn start(port: u16) -> Self {
        Self::start_through(&[], port)
    }

    /// Started through `wrapper` (`nsenter -t <pid> -n`, say).
    fn start_through(wrapper: &[&str], port: u16) -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("Debian's Postgres is installed")
            .flatten()
            .map(|e| e.path().join("bin"))
            .max()
            .expect("a Postgres version");
        let root = std::env::temp_dir().join(format!("hark-pw-{}", uuid::Uuid::new_v4().simple()));
        let data = root.join("data");
        std::fs::create_dir_all(&root).expect("dir");
        let password = root.join("password");
        std::fs::write(&password, "a-password-hark-does-not-know\n").expect("password file");
        let as_postgres = |program: &str| {
            let mut command = std::process::Command::new(wrapper.first().unwrap_or(&"runuser"));
            if !wrapper.is_empty() {
                command.args(&wrapper[1..]).arg("runuser");
            }
            command
                .args(["-u", "postgres", "--"])
                .arg(bin.join(program));
            command
        };
        let chown = std::process::Command::new("chown")
            .args(["-R", "postgres:"])
            .arg(&root)
            .status()
            .expect("chown");
        assert!(chown.success());
        let init = as_postgres("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "scram-sha-256", "--pwfile"])
            .arg(&password)
            .output()
            .expect("initdb");
        assert!(
            init.status.success(),
            "{}",
            String::from_utf8_lossy(&init.stderr)
        );
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {}",
            root.display()
        );
        let started = as_postgres("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(root.join("log"))
            .args(["-w", "-o", &options, "start"])
            .output()
            .expect("pg_ctl");
        assert!(
            started.status.success(),
            "{}",
            String::from_utf8_lossy(&started.stderr)
        );
        Self { bin, data }
    }
}

impl Drop for PasswordPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        if let Some(root) = self.data.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

#[tokio::test]
async fn the_distributions_servers_are_told_apart_from_down_ones_and_never_waited_on() {
    let (pg_port, nats_port) = (server_port(), server_port());
    let _postgres = PasswordPostgres::start(pg_port);
    // Debian's nats-server as its package starts it: without JetStream.
    let _nats = tokio::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &nats_port.to_string()])
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server starts");
    for port in [pg_port, nats_port] {
        let deadline = tokio::time::Instant::now() + START;
        while !answers(port).await {
            assert!(tokio::time::Instant::now() < deadline, "nothing on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let env = Env::new().await;
    let database = format!("postgres://postgres@127.0.0.1:{pg_port}/hark");
    let nats = format!("nats://127.0.0.1:{nats_port}");
    let not_postgres = format!("postgres://postgres@127.0.0.1:{nats_port}/hark");

    // A role stops at once, with one line naming the key and what to do.
    let quick = Duration::from_secs(20);
    for (case, (vars, says)) in [
        (
            vec![("HARK_DATABASE__URL", database.as_str())],
            "refuses to let hark in",
        ),
        (
            vec![("HARK_DATABASE__URL", not_postgres.as_str())],
            "is not Postgres",
        ),
        (vec![("HARK_NATS__URL", nats.as_str())], "JetStream is off"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut control = env.spawn_named(&format!("control-{case}"), &["control"], &vars);
        let status = control
            .exited_within(quick)
            .await
            .unwrap_or_else(|| panic!("task-control waited on {vars:?}:\n{}", control.output()));
        assert!(!status.success());
        let output = control.output();
        let last = output.lines().last().unwrap_or_default();
        assert!(last.contains(says), "{vars:?}: {output}");
        assert!(
            last.contains("database.url") || last.contains("nats.url"),
            "{last}"
        );
    }

    // hark dev leaves them alone and starts its own, saying so.
    let data = std::env::temp_dir().join(format!("hark-dev-{}", uuid::Uuid::new_v4().simple()));
    let data_dir = data.display().to_string();
    let vars = [
        ("HARK_DATABASE__URL", database.as_str()),
        ("HARK_NATS__URL", nats.as_str()),
        ("HARK_LLM__BASE_URL", ""),
    ];
    let mut dev = env.spawn_named(
        "dev-own",
        &["dev", "--workers", "1", "--data-dir", &data_dir],
        &vars,
    );
    let banner = dev.wait_for_output("hark dev is up", START).await;
    assert!(
        banner.contains(&format!(
            "the Postgres on 127.0.0.1:{pg_port} cannot serve hark"
        )) && banner.contains("password authentication failed")
            && banner.contains("ALTER USER postgres PASSWORD"),
        "{banner}"
    );
    assert!(
        banner.contains(&format!(
            "the NATS on 127.0.0.1:{nats_port} cannot serve hark"
        )) && banner.contains("JetStream is off there"),
        "{banner}"
    );
    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:me", "say hello").await;
    assert!(!task.id.is_empty());
    let status = dev.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", dev.output());
    let _ = std::fs::remove_dir_all(&data);
    env.cleanup().await;
}

#[tokio::test]
async fn hark_dev_speaks_chinese_in_a_chinese_locale() {
    let env = Env::new().await;
    let data = std::env::temp_dir().join(format!("hark-dev-{}", uuid::Uuid::new_v4().simple()));
    let data_dir = data.display().to_string();
    let mut dev = env.spawn_named(
        "dev-zh",
        &["dev", "--workers", "1", "--data-dir", &data_dir],
        &[("LANG", "zh_CN.UTF-8"), ("HARK_LLM__BASE_URL", "")],
    );
    let banner = dev.wait_for_output("hark dev 已启动", START).await;
    for label in [
        "网页控制台：",
        "数据库：",
        "内置的演示模型",
        "按 Ctrl-C 停止",
    ] {
        assert!(banner.contains(label), "{label}: {banner}");
    }
    assert!(!banner.contains("web console:"), "{banner}");
    let status = dev.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", dev.output());
    let _ = std::fs::remove_dir_all(&data);
    env.cleanup().await;
}

/// A network of its own, with only a loopback interface: a test can hold the default ports there
/// (5432, 4222, 50051, …) while the machine's own servers hold them outside. Ended when dropped.
struct Netns {
    holder: tokio::process::Child,
    /// `nsenter -t <pid> -n`: runs a program in it.
    enter: Vec<String>,
}

impl Netns {
    async fn new() -> Self {
        let holder = tokio::process::Command::new("unshare")
            .args([
                "-n",
                "sh",
                "-c",
                "ip link set lo up && echo up && exec sleep 3600",
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("unshare -n runs (root, util-linux)");
        let mut holder = holder;
        let mut up = String::new();
        use tokio::io::AsyncReadExt as _;
        let mut out = holder.stdout.take().expect("stdout");
        while !up.contains("up") {
            let mut buf = [0u8; 16];
            let n = out.read(&mut buf).await.expect("read");
            assert!(n > 0, "the network namespace did not come up");
            up.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let pid = holder.id().expect("pid").to_string();
        let enter = vec!["nsenter".into(), "-t".into(), pid, "-n".into()];
        Self { holder, enter }
    }

    fn enter(&self) -> Vec<&str> {
        self.enter.iter().map(String::as_str).collect()
    }

    /// `program args…` run to its end in the namespace.
    async fn run(&self, program: &str, args: &[&str]) -> std::process::Output {
        tokio::process::Command::new("nsenter")
            .args(&self.enter[1..])
            .arg(program)
            .args(args)
            .env("LANG", "C.UTF-8")
            .env_remove("LC_ALL")
            .env_remove("HARK_CONFIG")
            .output()
            .await
            .expect("nsenter runs")
    }

    /// Waits until nothing answers on `port` there any more.
    async fn closed(&self, port: u16) -> bool {
        for _ in 0..200 {
            if !self.answers(port).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Whether something answers on `port` there.
    async fn answers(&self, port: u16) -> bool {
        let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
        self.run("bash", &["-c", &probe]).await.status.success()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.start_kill();
    }
}

#[tokio::test]
async fn on_the_default_ports_the_distributions_servers_leave_hark_dev_to_start_its_own() {
    let netns = Netns::new().await;
    let enter = netns.enter();
    // What `sudo apt install postgresql nats-server` leaves on the default ports: a Postgres
    // that asks for a password over TCP, a nats-server without JetStream.
    let _postgres = PasswordPostgres::start_through(&enter, 5432);
    let mut nats_command = tokio::process::Command::new("nsenter");
    nats_command
        .args(&enter[1..])
        .args(["nats-server", "-a", "127.0.0.1", "-p", "4222"])
        .kill_on_drop(true);
    let _nats = nats_command.spawn().expect("nats-server starts");
    for port in [5432, 4222] {
        let deadline = tokio::time::Instant::now() + START;
        while !netns.answers(port).await {
            assert!(tokio::time::Instant::now() < deadline, "nothing on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // A newcomer runs `hark dev` with no configuration at all.
    let env = Env::new().await;
    let home = std::env::temp_dir().join(format!("hark-home-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&home).expect("home");
    let home_dir = home.display().to_string();
    let mut dev = env.spawn_as_newcomer(
        "dev-newcomer",
        &enter,
        &["dev", "--workers", "1"],
        &[("HOME", home_dir.as_str()), ("XDG_DATA_HOME", "")],
    );
    let banner = dev.wait_for_output("hark dev is up", START).await;
    assert!(
        banner.contains("the Postgres on 127.0.0.1:5432 cannot serve hark")
            && banner.contains("password authentication failed")
            && banner.contains("ALTER USER postgres PASSWORD"),
        "{banner}"
    );
    assert!(
        banner.contains("the NATS on 127.0.0.1:4222 cannot serve hark")
            && banner.contains("JetStream is off there"),
        "{banner}"
    );
    let started = |what: &str| {
        banner
            .lines()
            .find(|l| l.contains("started:") && l.contains(what))
            .and_then(|l| l.split("127.0.0.1:").nth(1))
            .and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u16>().ok()
            })
            .unwrap_or_else(|| panic!("no {what} started: {banner}"))
    };
    let (pg, nats) = (started("Postgres on"), started("nats-server"));
    assert!(pg != 5432 && nats != 4222, "{banner}");
    let data = home.join(".local/share/hark");
    assert!(
        banner.contains(&format!("data:                     {}", data.display())),
        "{banner}"
    );

    // The round trip works on the defaults: the CLI reaches gRPC at 127.0.0.1:50051.
    let hark = hark_e2e::hark_binary().display().to_string();
    let created = netns
        .run(&hark, &["task", "new", "--owner", "api:me", "say hello"])
        .await;
    assert!(
        created.status.success(),
        "{}{}",
        String::from_utf8_lossy(&created.stdout),
        String::from_utf8_lossy(&created.stderr)
    );
    let asked = tokio::time::Instant::now() + START;
    loop {
        let questions = netns.run(&hark, &["task", "questions"]).await;
        let listed = String::from_utf8_lossy(&questions.stdout).into_owned();
        if listed.contains("What should I call you?") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < asked,
            "the demo model asked nothing: {listed}\n{}",
            dev.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let status = dev.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", dev.output());
    assert!(netns.closed(pg).await && netns.closed(nats).await);
    let _ = std::fs::remove_dir_all(&home);
    env.cleanup().await;
}
