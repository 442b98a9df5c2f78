//! The `hark` command line as a person meets it: completions, `task new --wait` answered on stdin,
//! and errors that name the config key when a server does not answer, each cause said once.

use std::{process::Stdio, time::Duration};

use hark_e2e::{Env, closed_port, hark_binary, server_port};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use tokio::{io::AsyncWriteExt as _, process::Command};

const WAIT: Duration = Duration::from_secs(60);

/// Runs `hark <args>` with `vars`; returns (success, stdout, stderr).
async fn hark(args: &[&str], vars: &[(&str, &str)]) -> (bool, String, String) {
    let output = tokio::time::timeout(
        WAIT,
        Command::new(hark_binary())
            .args(args)
            .env_remove("HARK_CONFIG")
            .env("NO_COLOR", "1")
            // English unless a test asks for another language.
            .env_remove("LC_ALL")
            .env_remove("LC_MESSAGES")
            .env("LANG", "C.UTF-8")
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("hark finishes")
    .expect("hark runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn completions_are_printed_for_each_shell() {
    let (ok, script, _) = hark(&["completions", "bash"], &[]).await;
    assert!(ok);
    for word in ["_hark", "dev", "task", "completions"] {
        assert!(script.contains(word), "{word} in {script}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let (ok, script, _) = hark(&["completions", shell], &[]).await;
        assert!(ok && !script.is_empty(), "{shell}");
    }
    let (ok, _, said) = hark(&["completions", "tcsh"], &[]).await;
    assert!(!ok);
    assert!(said.contains("bash"), "{said}");
}

#[tokio::test]
async fn a_reader_that_went_away_ends_hark_quietly() {
    // A pipe whose reading end is closed before hark starts, as `hark … | head -1` leaves it
    // once head has its line.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = tokio::time::timeout(
        WAIT,
        Command::new(hark_binary())
            .args(["completions", "bash"])
            .env_remove("HARK_CONFIG")
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Not `output()`, which would give it a pipe of its own.
            .spawn()
            .expect("hark runs")
            .wait_with_output(),
    )
    .await
    .expect("hark finishes")
    .expect("its status");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(141), "{said}");
    assert!(said.is_empty(), "{said}");
}

#[tokio::test]
async fn a_server_that_does_not_answer_is_named_by_its_config_key_and_its_cause_said_once() {
    let closed = closed_port();
    let database = format!("postgres://postgres@127.0.0.1:{closed}/hark");
    let (ok, _, said) = hark(&["migrate"], &[("HARK_DATABASE__URL", &database)]).await;
    assert!(!ok);
    assert!(said.contains("database.url"), "{said}");
    assert_eq!(said.matches("Connection refused").count(), 1, "{said}");

    // Postgres's own message, without the line of its source code.
    let stranger = format!("{}/hark", hark_e2e::postgres_url()).replace("postgres@", "nobody@");
    let (ok, _, said) = hark(&["migrate"], &[("HARK_DATABASE__URL", &stranger)]).await;
    assert!(!ok);
    assert!(
        said.contains("database.url") && said.contains("\"nobody\""),
        "{said}"
    );
    assert!(!said.contains(" at line "), "{said}");

    // A database of the test's own gets past Postgres, to the NATS that does not answer.
    let nats = format!("nats://127.0.0.1:{closed}");
    let database = hark_testkit::Database::new();
    let (ok, _, said) = hark(
        &["migrate"],
        &[
            ("HARK_NATS__URL", &nats),
            ("HARK_DATABASE__URL", &database.url()),
        ],
    )
    .await;
    assert!(!ok);
    assert!(said.contains("nats.url"), "{said}");
    assert_eq!(said.matches("Connection refused").count(), 1, "{said}");

    // A nats-server without JetStream: say to start it with -js.
    let port = server_port();
    let mut plain = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server runs");
    let url = format!("nats://127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        up,
        "the nats-server without JetStream did not start on {port}"
    );
    let database = hark_testkit::Database::new();
    let (ok, _, said) = hark(
        &["migrate"],
        &[
            ("HARK_NATS__URL", &url),
            ("HARK_DATABASE__URL", &database.url()),
        ],
    )
    .await;
    let _ = plain.kill().await;
    assert!(!ok);
    assert!(said.contains("-js") && said.contains("nats.url"), "{said}");
}

#[tokio::test]
async fn task_new_wait_follows_the_task_and_answers_from_stdin() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            serde_json::json!({"question": "Tea or coffee?", "choices": ["tea", "coffee"]}),
        ),
        Step::say("Here is your {answer}"),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    let mut control = env.spawn(&["control"], &[]);
    env.client().await;
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);

    // The address without its scheme is taken as http://.
    let api = env.grpc_url().await.replace("http://", "");
    let mut child = Command::new(hark_binary())
        .args([
            "task", "new", "--wait", "--api", &api, "--owner", "cli:ada", "a drink",
        ])
        .env_remove("HARK_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("hark runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"2\n")
        .await
        .expect("the answer is written");
    drop(stdin);
    let output = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("it ends when the task does")
        .expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("created "), "{stdout}");
    assert!(
        stdout.contains("asks #") && stdout.contains("Tea or coffee?"),
        "{stdout}"
    );
    assert!(stdout.contains("2. coffee"), "{stdout}");
    assert!(
        stdout.contains("completed")
            && stdout.contains("Here is your")
            && stdout.contains("coffee"),
        "{stdout}"
    );

    // What `questions` prints, `answer` takes: a `#handle`.
    let (ok, created, said) = hark(
        &[
            "task",
            "new",
            "--api",
            &api,
            "--owner",
            "cli:bo",
            "another drink",
        ],
        &[],
    )
    .await;
    assert!(ok, "{created}{said}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let handle = loop {
        let (ok, listed, said) = hark(&["task", "questions", "--api", &api], &[]).await;
        assert!(ok, "{said}");
        if let Some(handle) = listed
            .lines()
            .find(|l| l.contains("Tea or coffee?"))
            .and_then(|l| l.split_whitespace().next())
        {
            break handle.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no question: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(handle.starts_with('#'), "{handle}");
    let (ok, answered, said) = hark(
        &["task", "answer", "--api", &api, "--wait", &handle, "tea"],
        &[],
    )
    .await;
    assert!(ok, "{answered}{said}");
    assert!(
        answered.contains("completed") && answered.contains("tea"),
        "{answered}"
    );
    let (ok, _, said) = hark(&["task", "answer", "--api", &api, "#zzzz", "tea"], &[]).await;
    assert!(!ok && said.contains("hark task questions"), "{said}");
    // In a Chinese locale the command line speaks Chinese.
    let (ok, _, said) = hark(
        &["task", "answer", "--api", &api, "#zzzz", "tea"],
        &[("LANG", "zh_CN.UTF-8")],
    )
    .await;
    assert!(!ok && said.contains("没有待回答的问题 #zzzz"), "{said}");
    let (ok, shown, said) = hark(
        &["task", "questions", "--api", &api],
        &[("LANG", "zh_CN.UTF-8")],
    )
    .await;
    assert!(ok && shown.contains("没有问题"), "{shown}{said}");
    // A task with a deadline of its own shows it, and its policy.
    let (ok, created, said) = hark(
        &[
            "task",
            "new",
            "--api",
            &api,
            "--json",
            "--deadline",
            "2h",
            "--on-deadline",
            "cancel",
            "a timed drink",
        ],
        &[],
    )
    .await;
    assert!(ok, "{created}{said}");
    let created: serde_json::Value = serde_json::from_str(created.trim()).expect("json");
    assert_eq!(created["on_deadline"], "cancel", "{created}");
    assert!(
        created["deadline"].as_str().is_some_and(|d| !d.is_empty()),
        "{created}"
    );
    let id = created["id"].as_str().expect("id");
    let (ok, shown, said) = hark(&["task", "get", "--api", &api, id], &[]).await;
    assert!(
        ok && shown.contains("deadline") && shown.contains("cancelled"),
        "{shown}{said}"
    );
    let (ok, _, said) = hark(
        &[
            "task",
            "new",
            "--api",
            &api,
            "--deadline",
            "2h",
            "--on-deadline",
            "maybe",
            "x",
        ],
        &[],
    )
    .await;
    assert!(
        !ok && said.contains("maybe") && said.contains("fail or cancel"),
        "{said}"
    );
    // A questionnaire's questions escalate to the people named, each resolved on the chat's
    // platform; someone on another platform is refused, naming the key.
    let questionnaire = |people: &'static [&'static str]| {
        let mut args = vec![
            "task",
            "new",
            "--api",
            &api,
            "--json",
            "--chat",
            "qq",
            "10001",
            "group:42",
            "--ask",
            "Which size?|S|M",
            "--ask",
            "Which colour?",
        ];
        for person in people {
            args.extend(["--escalate-to", person]);
        }
        args.extend(["--escalate-after", "30m", "a shirt"]);
        args
    };
    let (ok, created, said) = hark(&questionnaire(&["222", "qq:333"]), &[]).await;
    assert!(ok, "{created}{said}");
    let created: serde_json::Value = serde_json::from_str(created.trim()).expect("json");
    for question in created["questionnaire"].as_array().expect("questions") {
        assert_eq!(
            question["escalate_to"],
            serde_json::json!(["qq:222", "qq:333"]),
            "{created}"
        );
        assert_eq!(question["escalate_after_s"], 1800, "{created}");
    }
    let (ok, _, said) = hark(&questionnaire(&["tg:9"]), &[]).await;
    assert!(
        !ok && said.contains("escalate_to") && said.contains("tg:9"),
        "{said}"
    );
    // Or put to several people at once, two of whom must answer.
    let (ok, created, said) = hark(
        &[
            "task",
            "new",
            "--api",
            &api,
            "--json",
            "--chat",
            "qq",
            "10001",
            "group:42",
            "--ask",
            "Which size?|S|M",
            "--ask-to",
            "222",
            "--ask-to",
            "333",
            "--need",
            "2",
            "a shirt",
        ],
        &[],
    )
    .await;
    assert!(ok, "{created}{said}");
    let created: serde_json::Value = serde_json::from_str(created.trim()).expect("json");
    assert_eq!(
        created["questionnaire"][0]["ask_to"],
        serde_json::json!(["qq:222", "qq:333"]),
        "{created}"
    );
    assert_eq!(created["questionnaire"][0]["need"], "2", "{created}");
    // Escalation is a questionnaire's, in a chat.
    let (ok, _, said) = hark(
        &[
            "task",
            "new",
            "--api",
            &api,
            "--escalate-to",
            "222",
            "a shirt",
        ],
        &[],
    )
    .await;
    assert!(!ok && said.contains("--ask"), "{said}");

    // The CLI's errors name the CLI's commands, not the chat's.
    let (ok, _, said) = hark(&["task", "get", "--api", &api, "x"], &[]).await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("hark task list") && !said.contains("/task list"),
        "{said}"
    );

    worker.stop().await;
    control.stop().await;
    drop(llm);
    env.cleanup().await;
}

#[tokio::test]
async fn health_migrate_and_config_errors_speak_chinese_in_a_chinese_locale() {
    let zh = ("LANG", "zh_CN.UTF-8");
    let closed = closed_port();
    let listen = format!("127.0.0.1:{closed}");

    let (ok, _, said) = hark(
        &["health", "control"],
        &[zh, ("HARK_CONTROL__GRPC_LISTEN", &listen)],
    )
    .await;
    assert!(!ok);
    assert!(said.contains("没有应答"), "{said}");
    let (ok, _, said) = hark(
        &["health", "gateway"],
        &[zh, ("HARK_GATEWAY__LISTEN", &listen)],
    )
    .await;
    assert!(!ok);
    assert!(said.contains("网关") && said.contains("没有应答"), "{said}");

    let database = format!("postgres://postgres@127.0.0.1:{closed}/hark");
    let (ok, _, said) = hark(&["migrate"], &[zh, ("HARK_DATABASE__URL", &database)]).await;
    assert!(!ok);
    assert!(
        said.contains("连不上") && said.contains("database.url"),
        "{said}"
    );

    let (ok, _, said) = hark(&["config"], &[zh, ("HARK_TASK__ON_TIMEOUT", "maybe")]).await;
    assert!(!ok);
    assert!(said.contains("配置项 `task.on_timeout`"), "{said}");

    // The dead-letter listing, on an installation that has none yet.
    let env = Env::new().await;
    let vars: Vec<(String, String)> = env.process_env().into_iter().collect();
    let mut with: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    with.push(zh);
    let (ok, listed, said) = hark(&["health", "--dead-letters"], &with).await;
    assert!(ok, "{said}");
    assert!(listed.starts_with("没有死信"), "{listed}");
    env.cleanup().await;
}

#[tokio::test]
async fn hark_key_makes_a_persons_key_that_acts_only_as_them_until_revoked() {
    let env = Env::new().await;
    let mut control = env.spawn(&["control"], &[]);
    env.client().await;
    let api = env.grpc_url().await;
    // `--api` right after `key` or `task`, before a goal's words.
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.splice(1..1, ["--api", api.as_str()]);
        let all: Vec<String> = all.into_iter().map(str::to_owned).collect();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            hark(&all, &[]).await
        }
    };
    let (ok, key, said) = run(&["key", "create", "--owner", "qq:10001", "--name", "laptop"]).await;
    assert!(ok, "{said}");
    let key = key.trim().to_owned();
    assert!(key.starts_with("hk_"), "stdout holds the key alone: {key}");
    assert!(said.contains("shown only this once"), "{said}");
    let (ok, _, said) = run(&["task", "new", "--owner", "qq:20002", "theirs"]).await;
    assert!(ok, "{said}");

    // With the key: its owner's task by default, nobody else's.
    let (ok, created, said) = run(&["task", "new", "--token", &key, "mine"]).await;
    assert!(ok, "{said}");
    assert!(created.contains("mine"), "{created}");
    let (ok, listed, said) = run(&["task", "list", "--token", &key]).await;
    assert!(ok, "{said}");
    assert!(
        listed.contains("qq:10001") && !listed.contains("qq:20002"),
        "{listed}"
    );
    let (ok, _, said) = run(&["task", "new", "--token", &key, "--owner", "qq:20002", "x"]).await;
    assert!(!ok && said.contains("qq:10001"), "{said}");

    let (ok, keys, said) = run(&["key", "list", "--json"]).await;
    assert!(ok, "{said}");
    let id = serde_json::from_str::<serde_json::Value>(keys.lines().next().expect("a key"))
        .expect("json")["id"]
        .as_str()
        .expect("id")[..8]
        .to_owned();
    let (ok, revoked, said) = run(&["key", "revoke", &id]).await;
    assert!(ok && revoked.contains(&id), "{revoked}{said}");
    let (ok, _, said) = run(&["task", "list", "--token", &key]).await;
    assert!(!ok && said.contains("revoked"), "{said}");

    control.stop().await;
    env.cleanup().await;
}
