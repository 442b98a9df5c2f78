//! Satori as a gateway platform, against a real Satori server (satori-python's, pinned in
//! tests/frameworks/satori/requirements.txt) whose platform the test drives, and a real hark in
//! processes.

use std::{path::PathBuf, process::Stdio, time::Duration};

use hark_e2e::{Env, Process};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "satori-server-token";

fn python() -> PathBuf {
    let path = std::env::var_os("HARK_TEST_SATORI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/hark-ci/satori/bin/python"));
    assert!(
        path.exists(),
        "{} is missing: make a venv with `pip install -r tests/frameworks/satori/requirements.txt` \
         (as .ci/run does) and point HARK_TEST_SATORI_PYTHON at its python",
        path.display()
    );
    path
}

/// The Satori server: commands in on its stdin, what it was asked to send out on its stdout.
struct Server {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::sync::mpsc::UnboundedReceiver<Value>,
    port: u16,
    /// Every message hark sent, in order: (channel, content, the id the server gave it).
    sent: Vec<(String, String, String)>,
}

impl Server {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("frameworks/satori/server.py");
        let mut child = tokio::process::Command::new(python())
            .arg(script)
            .env("PORT", port.to_string())
            .env("TOKEN", TOKEN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the Satori server starts");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let (tx, mut out) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(value);
                }
            }
        });
        let ready = tokio::time::timeout(WAIT, out.recv())
            .await
            .expect("the Satori server listens within a minute")
            .expect("the Satori server runs");
        assert_eq!(ready["ready"], true, "{ready}");
        let mut server = Self {
            child,
            stdin,
            out,
            port,
            sent: Vec::new(),
        };
        server
            .command(json!({"logins": [{"platform": "qq", "self_id": "42", "name": "hark bot"}]}))
            .await;
        server
    }

    async fn command(&mut self, command: Value) {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("the server reads");
        self.stdin.flush().await.expect("flush");
    }

    /// A member's message, as the platform posts it.
    async fn message(&mut self, user: &str, channel: (&str, u8), id: &str, content: &str) {
        self.command(json!({"event": {
            "type": "message-created",
            "login": {"platform": "qq", "user": {"id": "42"}, "status": 1, "sn": 0},
            "channel": {"id": channel.0, "type": channel.1},
            "user": {"id": user, "name": format!("member {user}")},
            "message": {"id": id, "content": content},
        }}))
        .await;
    }

    /// A press of the button `id` in `channel`, as the platform posts it.
    async fn press(&mut self, user: &str, channel: (&str, u8), id: &str) {
        self.command(json!({"event": {
            "type": "interaction/button",
            "login": {"platform": "qq", "user": {"id": "42"}, "status": 1, "sn": 0},
            "channel": {"id": channel.0, "type": channel.1},
            "user": {"id": user, "name": format!("member {user}")},
            "button": {"id": id},
        }}))
        .await;
    }

    /// Waits for a message hark sends whose content matches; returns (channel, content, id).
    async fn expect(
        &mut self,
        what: &str,
        matches: impl Fn(&str) -> bool,
    ) -> (String, String, String) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let record = tokio::time::timeout_at(deadline, self.out.recv())
                .await
                .unwrap_or_else(|_| panic!("hark sent no {what}; it sent {:?}", self.sent))
                .expect("the server runs");
            let Some(sent) = record.get("sent") else {
                continue;
            };
            assert_eq!(
                (sent["platform"].as_str(), sent["self_id"].as_str()),
                (Some("qq"), Some("42")),
                "sent as the login: {sent}"
            );
            let entry = (
                sent["channel_id"].as_str().unwrap_or_default().to_owned(),
                sent["content"].as_str().unwrap_or_default().to_owned(),
                sent["id"].as_str().unwrap_or_default().to_owned(),
            );
            self.sent.push(entry.clone());
            if matches(&entry.1) {
                return entry;
            }
        }
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The short task id a "created" reply names (after the quote of the command).
fn task_of(created: &str) -> String {
    created
        .split("Task ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the reply names the task")
        .to_owned()
}

/// Waits until the gateway has said the Satori connection is up `times` times.
async fn connected(gateway: &Process, times: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while gateway.output().matches("Satori connection up").count() < times {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway did not connect to the Satori server:\n{}",
            gateway.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// hark in processes (control, gateway and a worker) speaking through `server`, with a scripted
/// model; the gateway is connected.
struct Hark {
    env: Env,
    llm: ScriptedLlm,
    control: Process,
    gateway: Process,
    worker: Process,
}

impl Hark {
    async fn start(server: &Server, steps: Vec<Step>) -> Self {
        let llm = ScriptedLlm::with_default(Script::new(steps))
            .await
            .expect("scripted LLM");
        let mut env = Env::new().await;
        env.set("HARK_LLM__BASE_URL", &llm.base_url());
        env.set(
            "HARK_GATEWAY__SATORI__URL",
            &format!("http://127.0.0.1:{}", server.port),
        );
        env.set("HARK_GATEWAY__SATORI__TOKEN", TOKEN);
        let control = env.spawn(&["control"], &[]);
        env.client().await;
        let gateway = env.spawn(&["gateway"], &[]);
        let worker = env.spawn(&["worker", "--id", "w1"], &[]);
        connected(&gateway, 1).await;
        Self {
            env,
            llm,
            control,
            gateway,
            worker,
        }
    }

    async fn stop(mut self) {
        self.worker.stop().await;
        self.gateway.stop().await;
        self.control.stop().await;
        drop(self.llm);
        self.env.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hark_speaks_through_a_satori_server_and_gets_what_it_missed_while_away() {
    let mut server = Server::start().await;
    let mut hark = Hark::start(
        &server,
        vec![Step::ask("Which colour?"), Step::say("Painted {answer}.")],
    )
    .await;

    // A task from the group channel 777; its goal's markup is text, and is sent escaped.
    server
        .message(
            "100",
            ("777", 0),
            "m-1",
            "/task new paint the fence &lt;white&gt;",
        )
        .await;
    let (channel, created, _) = server.expect("'created'", |c| c.contains("created")).await;
    assert_eq!(channel, "777");
    assert!(created.contains("&lt;white&gt;"), "{created}");
    let fence = task_of(&created);
    server
        .expect("the fence's question", |c| c.contains("Which colour?"))
        .await;
    server
        .message(
            "100",
            ("777", 0),
            "m-2",
            "<at id=\"42\"/> /task new paint the gate",
        )
        .await;
    let (_, created, _) = server.expect("'created'", |c| c.contains("created")).await;
    let gate = task_of(&created);
    let (_, _, q_gate) = server
        .expect("the gate's question", |c| {
            c.contains("Which colour?") && c.contains(&gate)
        })
        .await;

    // A stranger's reply is inert; a quote of the gate's question answers the gate.
    server.message("200", ("777", 0), "m-3", "blue").await;
    server
        .message(
            "100",
            ("777", 0),
            "m-4",
            &format!("<quote id=\"{q_gate}\"/>green"),
        )
        .await;
    server
        .expect("the gate painted", |c| c.contains("Painted green."))
        .await;
    assert!(
        server
            .sent
            .iter()
            .any(|(_, c, _)| c.contains(&format!("task {gate} continues"))),
        "{:?}",
        server.sent
    );

    // The gateway dies; the owner answers meanwhile; the server replays it when hark is back.
    hark.gateway.kill().await;
    server.message("100", ("777", 0), "m-5", "red").await;
    hark.gateway = hark.env.spawn(&["gateway"], &[]);
    connected(&hark.gateway, 2).await;
    server
        .expect("the fence painted", |c| c.contains("Painted red."))
        .await;
    assert!(
        server
            .sent
            .iter()
            .any(|(_, c, _)| c.contains(&format!("task {fence} continues"))),
        "{:?}",
        server.sent
    );

    // A direct channel is the owner's private chat, answered in that channel.
    server
        .message("100", ("dm-100", 1), "m-6", "/task list")
        .await;
    let (channel, _, _) = server
        .expect("the private reply", |c| {
            c.contains(&fence) || c.contains("task")
        })
        .await;
    assert_eq!(channel, "dm-100");
    for text in ["Painted green.", "Painted red."] {
        assert_eq!(
            server
                .sent
                .iter()
                .filter(|(_, c, _)| c.contains(text))
                .count(),
            1,
            "{text} sent once: {:?}",
            server.sent
        );
    }

    hark.stop().await;
    server.stop().await;
}

/// The ids of the buttons in a message's content, in order.
fn button_ids(content: &str) -> Vec<String> {
    content
        .split("<button ")
        .skip(1)
        .filter_map(|rest| rest.split("id=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(|id| id.replace("&quot;", "\"").replace("&amp;", "&"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_go_out_as_buttons_where_the_login_shows_them_and_the_owners_press_answers() {
    let mut server = Server::start().await;
    server
        .command(
            json!({"logins": [{"platform": "qq", "self_id": "42", "name": "hark bot",
            "features": ["message.button"]}]}),
        )
        .await;
    let hark = Hark::start(
        &server,
        vec![
            Step::call(
                "ask_user",
                json!({"question": "Which room?", "choices": ["Blue", "Green"]}),
            ),
            Step::say("Booked {answer}."),
        ],
    )
    .await;

    server
        .message("100", ("777", 0), "m-1", "/task new book a room")
        .await;
    let (channel, question, _) = server
        .expect("the question", |c| c.contains("Which room?"))
        .await;
    assert_eq!(channel, "777");
    // The text still numbers the choices, for whoever cannot press.
    assert!(
        question.contains("1) Blue") && question.contains("2) Green"),
        "{question}"
    );
    let ids = button_ids(&question);
    assert_eq!(ids.len(), 2, "two buttons: {question}");
    assert!(
        question.contains(">Blue</button>") && question.contains(">Green</button>"),
        "{question}"
    );
    let handle = question
        .split('#')
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("the question names its handle");
    assert_eq!(ids[1], format!("hark:#{handle} 2"));

    // A stranger's press of Blue is inert, and so is a press of a button that is not hark's.
    server.press("200", ("777", 0), &ids[0]).await;
    server.press("100", ("777", 0), "vote:1").await;
    // The owner's press of Green answers, like the reply `#handle 2`.
    server.press("100", ("777", 0), &ids[1]).await;
    let (_, booked, _) = server
        .expect("the room booked", |c| c.contains("Booked"))
        .await;
    assert!(
        booked.contains("Green") && !booked.contains("Blue"),
        "{booked}"
    );
    // No reply of hark's quotes a press, which is no message of the platform.
    assert!(
        server
            .sent
            .iter()
            .all(|(_, c, _)| !c.contains("<quote id=\"press-")),
        "{:?}",
        server.sent
    );
    assert_eq!(
        server
            .sent
            .iter()
            .filter(|(_, c, _)| c.contains("Booked"))
            .count(),
        1,
        "{:?}",
        server.sent
    );

    hark.stop().await;
    server.stop().await;
}
