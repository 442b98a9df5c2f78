//! What a stranger on the network can do to hark set up as the README says, and what hark
//! prints about its secrets, tried with the real binary.

use std::time::Duration;

use hark_e2e::{Env, bot::Bot, closed_port};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};

const WAIT: Duration = Duration::from_secs(30);

/// Secrets given to every process of a test, each a string that must never be printed.
const SECRETS: [(&str, &str); 5] = [
    ("HARK_LLM__API_KEY", "sk-LlmKeyNeverShown"),
    (
        "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
        "OneBotTokenNeverShown",
    ),
    ("HARK_GATEWAY__HTTP__TOKEN", "HttpTokenNeverShown"),
    ("HARK_CONTROL__API_TOKENS", "ApiTokenNeverShown"),
    (
        "HARK_NATS__URL",
        "nats://hark:NatsPassNeverShown@127.0.0.1:4222",
    ),
];
const DB_PASSWORD: &str = "DbPasswordNeverShown";

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS
        .iter()
        .map(|(_, v)| *v)
        .chain([DB_PASSWORD, "NatsPassNeverShown"])
    {
        let secret = secret.trim_start_matches("nats://hark:");
        let secret = secret.split('@').next().unwrap_or(secret);
        assert!(!text.contains(secret), "{what} printed {secret}:\n{text}");
    }
}

/// The environment with every secret set and a password in database.url (the server trusts
/// local connections, so any password is accepted).
fn secret_env(env: &mut Env) {
    for (key, value) in SECRETS {
        env.set(key, value);
    }
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", "myapp");
    let url = env.process_env()["HARK_DATABASE__URL"].replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{DB_PASSWORD}@"),
        1,
    );
    env.set("HARK_DATABASE__URL", &url);
}

#[tokio::test]
async fn hark_config_redacts_every_secret_unless_asked_to_show_them() {
    let mut env = Env::new().await;
    secret_env(&mut env);
    let mut config = env.spawn(&["config"], &[]);
    config.exited_within(WAIT).await.expect("hark config exits");
    let shown = config.output();
    assert_no_secret("hark config", &shown);
    assert!(shown.contains("[redacted]"), "{shown}");
    assert!(shown.contains("postgres:***@"), "{shown}");

    let mut revealed = env.spawn(&["config", "--show-secrets"], &[]);
    revealed.exited_within(WAIT).await.expect("exits");
    let all = revealed.output();
    for (_, secret) in &SECRETS[..4] {
        assert!(all.contains(secret), "--show-secrets shows {secret}");
    }
    assert!(all.contains(DB_PASSWORD));
    env.cleanup().await;
}

#[tokio::test]
async fn no_role_prints_a_secret_while_it_starts_runs_and_fails() {
    let llm = ScriptedLlm::with_default(Script::new(vec![Step::say("done")]))
        .await
        .expect("scripted LLM");
    let mut env = Env::new().await;
    secret_env(&mut env);
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_LOG__FILTER", "debug");
    let mut control = env.spawn(&["control"], &[]);
    control.wait_for_output("task-control started", WAIT).await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    gateway.wait_for_output("gateway started", WAIT).await;
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    worker.wait_for_output("worker started", WAIT).await;
    // A task runs through all three, so that every role logs what it does.
    let mut api = env.client_with_token("ApiTokenNeverShown").await;
    let task = api
        .create_task(pb::CreateTaskRequest {
            owner: "api:eve".into(),
            goal: "nothing much".into(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    worker.wait_for_output(&task.id, WAIT).await;
    for process in [&mut worker, &mut gateway, &mut control] {
        process.stop().await;
        assert_no_secret(&process.name, &process.output());
    }

    // Failing to reach the database names it without its password.
    let port = closed_port();
    let mut migrate = env.spawn(
        &["migrate"],
        &[(
            "HARK_DATABASE__URL",
            &format!("postgres://postgres:{DB_PASSWORD}@127.0.0.1:{port}/hark"),
        )],
    );
    let status = migrate.exited_within(WAIT).await.expect("migrate exits");
    assert!(!status.success());
    let output = migrate.output();
    assert!(output.contains("database.url"), "{output}");
    assert_no_secret("hark migrate", &output);

    // The dev banner names the database without its password.
    let mut dev = env.spawn(&["dev", "--workers", "1"], &[]);
    let banner = dev.wait_for_output("hark dev is up", WAIT).await;
    dev.stop().await;
    assert!(banner.contains("postgres:***@"), "{banner}");
    assert_no_secret("hark dev", &dev.output());
    drop(llm);
    env.cleanup().await;
}

#[tokio::test]
async fn a_role_reachable_from_other_hosts_without_its_token_does_not_start() {
    let env = Env::new().await;
    let everywhere = "0.0.0.0:0".to_owned();
    let mut gateway = env.spawn(&["gateway"], &[("HARK_GATEWAY__LISTEN", &everywhere)]);
    let status = gateway.exited_within(WAIT).await.expect("refused at start");
    assert!(!status.success());
    let output = gateway.output();
    assert!(
        output.contains("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN"),
        "{output}"
    );

    let mut control = env.spawn(&["control"], &[("HARK_CONTROL__GRPC_LISTEN", &everywhere)]);
    let status = control.exited_within(WAIT).await.expect("refused at start");
    assert!(!status.success());
    let output = control.output();
    assert!(output.contains("control.api_tokens"), "{output}");
    assert!(output.contains("control.allow_unauthenticated"), "{output}");

    // The web console, beyond loopback without a token, is refused the same way.
    let mut console = env.spawn(&["control"], &[("HARK_CONTROL__HTTP_LISTEN", &everywhere)]);
    let status = console.exited_within(WAIT).await.expect("refused at start");
    assert!(!status.success());
    let output = console.output();
    assert!(
        output.contains("control.http_listen") && output.contains("control.api_tokens"),
        "{output}"
    );

    // Opting out on purpose is possible, and then it serves.
    let mut open = env.spawn(
        &["control"],
        &[
            ("HARK_CONTROL__GRPC_LISTEN", &everywhere),
            ("HARK_CONTROL__ALLOW_UNAUTHENTICATED", "true"),
        ],
    );
    open.wait_for_output("task-control started", WAIT).await;
    open.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_spoofed_qq_answer_of_the_review_is_refused_and_wakes_nothing() {
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    // The README's QQ setup: every interface, the OneBot token set, nothing else.
    env.set("HARK_GATEWAY__LISTEN", "0.0.0.0:0");
    env.set(
        "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
        "3f9c2a7be41d08c6a5f3e9d27b1c40aa",
    );
    env.set("HARK_PERMISSION__ADMINS", "qq:20001");
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(
        env.gateway_port().await,
        3_889_001,
        "3f9c2a7be41d08c6a5f3e9d27b1c40aa",
    )
    .await;
    bot.group_message(5001, 100, "/task new book a room").await;
    bot.expect("the question", WAIT, |s| s.text.contains("Which day?"))
        .await;

    // The review's curl, as the owner and as an admin.
    hark_core::install_crypto();
    let url = format!(
        "http://127.0.0.1:{}/api/v1/messages",
        env.gateway_port().await
    );
    for (user, text) in [("100", "spoofed answer"), ("20001", "/task list all")] {
        let body = serde_json::json!({"platform": "qq", "bot_id": "3889001",
            "stream": "group:5001", "sender": {"user_id": user}, "text": text,
            "message_id": format!("x-{user}")});
        let status = reqwest::Client::new()
            .post(&url)
            .json(&body)
            .send()
            .await
            .expect("the gateway answers")
            .status();
        assert_eq!(
            status.as_u16(),
            404,
            "the HTTP adapter is off in this setup"
        );
    }
    let listed = api
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, pb::TaskState::WaitingInput as i32);
    // The real owner's answer still works, and nothing the spoofer sent was posted meanwhile.
    bot.group_message(5001, 100, "Friday").await;
    let mut posted = Vec::new();
    let result = loop {
        let sent = bot.expect("a message", WAIT, |_| true).await;
        if sent.text.contains("Booked for") {
            break sent;
        }
        posted.push(sent.text);
    };
    assert!(
        result.text.contains("Booked for Friday."),
        "{}",
        result.text
    );
    assert_eq!(
        posted.iter().filter(|t| t.contains("continues")).count(),
        1,
        "only the owner's answer was taken: {posted:?}"
    );
    assert!(
        posted.iter().all(|t| !t.contains("waiting_input")),
        "no task list was posted: {posted:?}"
    );
    for process in [&mut worker, &mut gateway, &mut control] {
        process.stop().await;
    }
    drop(llm);
    env.cleanup().await;
}

/// Runs `program args…` as the unprivileged user 65534, as a stdio MCP server of a worker running
/// as that user would run.
async fn as_nobody(program: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
        .args(args)
        .output()
        .await
        .expect("setpriv runs")
}

#[tokio::test]
async fn another_process_of_the_workers_user_cannot_read_its_secrets() {
    let env = Env::new().await;
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    // The check can fail: a process of that user that did nothing is read by another one.
    let plain = tokio::process::Command::new("setpriv")
        .args(&nobody[1..])
        .args(["sleep", "30"])
        .env("HARK_LLM__API_KEY", "sk-LlmKeyNeverShown")
        .kill_on_drop(true)
        .spawn()
        .expect("sleep starts");
    let plain_pid = plain.id().expect("pid");
    // Until setpriv has changed its user and run `sleep`, the process is root's, or not
    // dumpable between the two; only the `sleep` it becomes is the plain case.
    hark_e2e::eventually("setpriv to become sleep", WAIT, || async {
        let comm = tokio::fs::read_to_string(format!("/proc/{plain_pid}/comm")).await;
        (comm.ok()?.trim() == "sleep").then_some(())
    })
    .await;
    let read = as_nobody("cat", &[&format!("/proc/{plain_pid}/environ")]).await;
    assert!(
        String::from_utf8_lossy(&read.stdout).contains("sk-LlmKeyNeverShown"),
        "the same user reads a dumpable process's environment"
    );
    drop(plain);

    let mut worker = env.spawn_through("worker", &nobody, &["worker", "--id", "w1"], &SECRETS);
    worker.wait_for_output("worker started", WAIT).await;
    let pid = worker.id().expect("the worker runs");
    for file in ["environ", "mem", "cmdline"] {
        let read = as_nobody("cat", &[&format!("/proc/{pid}/{file}")]).await;
        assert_no_secret(file, &String::from_utf8_lossy(&read.stdout));
        if file == "environ" {
            assert!(!read.status.success(), "the worker's environ was readable");
            assert!(
                String::from_utf8_lossy(&read.stderr).contains("Permission denied"),
                "{}",
                String::from_utf8_lossy(&read.stderr)
            );
        }
    }
    worker.stop().await;
    env.cleanup().await;
}
