//! The chat frameworks people already run, in front of a real hark (control, gateway and a
//! worker in processes): each one's hark plugin, loaded as the framework loads plugins, with the
//! framework's own connection to the chat played by a OneBot v11 bot over WebSocket, or for
//! MaiBot, by a platform adapter over maim_message's WebSocket.

use std::{path::PathBuf, time::Duration};

use hark_e2e::{Env, bot::Bot, bot::Sent, chat::handle_of, maim};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};

const WAIT: Duration = Duration::from_secs(60);
const SELF_ID: i64 = 4242;
const GROUP: i64 = 777;
const OWNER: i64 = 100;
const STRANGER: i64 = 200;
const HTTP_TOKEN: &str = "plugin-secret";

/// A framework, and how hark knows its chats.
#[derive(Debug, Clone, Copy)]
#[expect(
    clippy::enum_variant_names,
    reason = "the frameworks' own names all end in Bot"
)]
enum Framework {
    NoneBot,
    AstrBot,
    MaiBot,
}

impl Framework {
    /// Where the framework's test bot finds the LLM it runs.
    fn llm_url_variable(self) -> &'static str {
        match self {
            Framework::NoneBot => "NONEBOT_LLM_URL",
            Framework::AstrBot => "ASTRBOT_LLM_URL",
            Framework::MaiBot => "MAIBOT_LLM_URL",
        }
    }

    /// The platform id hark knows the framework's chats by.
    fn platform(self) -> &'static str {
        match self {
            Framework::NoneBot => "nonebot-onebot",
            Framework::AstrBot => "astrbot-aiocqhttp",
            Framework::MaiBot => "maibot-qq",
        }
    }

    /// The bot id: NoneBot's and MaiBot's bot is its QQ account, AstrBot's its platform
    /// instance.
    fn bot_id(self) -> String {
        match self {
            Framework::NoneBot | Framework::MaiBot => SELF_ID.to_string(),
            Framework::AstrBot => "qq".into(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Framework::NoneBot => "nonebot",
            Framework::AstrBot => "astrbot",
            Framework::MaiBot => "maibot",
        }
    }

    /// Where `.ci/run` installs the framework, pinned by tests/frameworks/<name>/requirements.txt.
    fn python(self) -> PathBuf {
        let var = format!("HARK_TEST_{}_PYTHON", self.name().to_uppercase());
        let path = std::env::var_os(&var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/opt/hark-ci/{}/bin/python", self.name())));
        assert!(
            path.exists(),
            "{} is missing: make a venv with `pip install -r tests/frameworks/{}/requirements.txt` \
             (as .ci/run does) and point {var} at its python",
            path.display(),
            self.name()
        );
        path
    }

    /// The script that runs the framework with the plugin and an echo handler of its own.
    fn script(self) -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("frameworks");
        match self {
            Framework::NoneBot => dir.join("nonebot/bot.py"),
            Framework::AstrBot => dir.join("astrbot/run.py"),
            Framework::MaiBot => dir.join("maibot/run.py"),
        }
    }

    /// Where the framework serves the OneBot v11 reverse WebSocket.
    fn path(self) -> &'static str {
        match self {
            Framework::NoneBot => "/onebot/v11/ws",
            Framework::AstrBot | Framework::MaiBot => "/ws",
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The framework's process, with hark's plugin and an echo handler of the bot's own.
struct Peer {
    framework: Framework,
    child: tokio::process::Child,
    port: u16,
}

impl Peer {
    fn start(framework: Framework, env: &Env, gateway_port: u16, port: u16) -> Self {
        Self::start_with(framework, env, gateway_port, port, &[])
    }

    /// With `extra` in the framework's environment.
    fn start_with(
        framework: Framework,
        env: &Env,
        gateway_port: u16,
        port: u16,
        extra: &[(&str, String)],
    ) -> Self {
        let dir = std::env::temp_dir()
            .join("hark-e2e")
            .join(&env.namespace)
            .join(framework.name());
        std::fs::create_dir_all(&dir).expect("the framework's directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("framework.log"))
            .expect("log file");
        let mut command = tokio::process::Command::new(framework.python());
        // MaiBot runs as a tree (a supervisor, its worker and plugin runners): a group of its
        // own, killed together.
        command.process_group(0);
        let child = command
            .arg(framework.script())
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            // The framework reads its files from where it runs: none of the developer's.
            .current_dir(&dir)
            .env("ASTRBOT_ROOT", &dir)
            .env("MAIBOT_ROOT", &dir)
            .env("MAIBOT_ACCOUNT", SELF_ID.to_string())
            .env("PORT", port.to_string())
            .env("HARK_URL", format!("http://127.0.0.1:{gateway_port}"))
            .env("HARK_TOKEN", HTTP_TOKEN)
            .env("HARK_PLATFORM", framework.platform())
            .env("HARK_WAIT_MS", "10000")
            .env("HARK_PULL_MS", "5000")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("the framework starts");
        Self {
            framework,
            child,
            port,
        }
    }

    /// The chat's bot, connected to the framework: on its OneBot v11 reverse WebSocket, or for
    /// MaiBot, as its platform adapter.
    async fn connect(&self) -> Bot {
        match self.framework {
            Framework::MaiBot => maim::connect(self.port, "qq", SELF_ID).await,
            _ => Bot::connect_at(self.port, self.framework.path(), SELF_ID, "").await,
        }
    }

    /// kill -9, of the framework's whole process group.
    async fn kill(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-9", "--", &format!("-{pid}")])
                .status()
                .await;
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// Everything the bot posted, in order, as the chat shows it.
struct Chat {
    bot: Bot,
    seen: Vec<Sent>,
}

impl Chat {
    /// Waits for a posted message matching `matches`, keeping every one posted meanwhile.
    async fn expect(&mut self, what: &str, matches: impl Fn(&Sent) -> bool) -> Sent {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(sent) = self.bot.next_sent(left).await else {
                panic!(
                    "the bot posted no {what} within {WAIT:?}; it posted {:?}",
                    texts(self)
                );
            };
            self.seen.push(sent.clone());
            if matches(&sent) {
                return sent;
            }
        }
    }

    fn count(&self, text: &str) -> usize {
        self.seen.iter().filter(|s| s.text.contains(text)).count()
    }
}

/// hark's processes with the HTTP adapter speaking for the framework's platform.
async fn hark(framework: Framework) -> (Env, ScriptedLlm, Vec<hark_e2e::Process>) {
    hark_with(framework, &[]).await
}

/// [`hark`], with `extra` in hark's environment.
async fn hark_with(
    framework: Framework,
    extra: &[(&str, &str)],
) -> (Env, ScriptedLlm, Vec<hark_e2e::Process>) {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::ask("Which colour?"),
        Step::say("Painted {answer}."),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", framework.platform());
    env.set(
        "HARK_GATEWAY__HTTP__BOTS",
        &format!("{}:{}", framework.platform(), framework.bot_id()),
    );
    env.set("HARK_GATEWAY__HTTP__TOKEN", HTTP_TOKEN);
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "unused");
    // A pulled message the plugin never acknowledged comes back soon.
    env.set("HARK_GATEWAY__SEND_TIMEOUT", "2s");
    for (key, value) in extra {
        env.set(key, value);
    }
    let control = env.spawn(&["control"], &[]);
    env.client().await;
    let gateway = env.spawn(&["gateway"], &[]);
    let worker = env.spawn(&["worker", "--id", "w1"], &[]);
    (env, llm, vec![control, gateway, worker])
}

/// The short id a "created" reply names.
fn created_id(sent: &Sent) -> String {
    sent.text
        .split_whitespace()
        .nth(1)
        .expect("the reply names the task")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonebot_bot_with_the_plugin_lets_hark_take_its_answers_and_leaves_the_rest_to_the_bot() {
    hark_in_front_of(Framework::NoneBot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_astrbot_bot_with_the_plugin_lets_hark_take_its_answers_and_leaves_the_rest_to_the_bot()
{
    hark_in_front_of(Framework::AstrBot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maibot_bot_with_the_plugin_lets_hark_take_its_answers_and_leaves_the_rest_to_the_bot() {
    hark_in_front_of(Framework::MaiBot).await;
}

/// The reason the first message set aside as a dead letter was, once there is one.
async fn set_aside(env: &Env) -> String {
    let letter = hark_e2e::eventually("a message is set aside", WAIT, || async {
        let mut dead = env
            .js
            .get_stream(env.names.dead_letter_stream())
            .await
            .ok()?;
        if dead.info().await.ok()?.state.messages == 0 {
            return None;
        }
        dead.get_raw_message(1).await.ok()
    })
    .await;
    letter
        .headers
        .get(hark_core::consume::REASON_HEADER)
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default()
}

/// Why the question of `task` never reached its chat, once task-control knows.
async fn undelivered(env: &Env, task: &str) -> String {
    let client = env.client().await;
    hark_e2e::eventually("the question says it was never delivered", WAIT, || {
        let mut client = client.clone();
        async move {
            let questions = client
                .get_task(pb::GetTaskRequest {
                    task_id: task.to_owned(),
                })
                .await
                .expect("get task")
                .into_inner()
                .questions;
            questions
                .into_iter()
                .find(|q| !q.undelivered.is_empty())
                .map(|q| q.undelivered)
        }
    })
    .await
}

/// A task started from the framework's chat asks there; the owner's plain reply and a quote are
/// hark's and no other handler's; a stranger's reply and a message when nothing is asked reach
/// the framework's handler untouched; a kill -9 of the framework loses none of hark's messages
/// and repeats none.
async fn hark_in_front_of(framework: Framework) {
    let (env, llm, mut processes) = hark(framework).await;
    let gateway_port = env.gateway_port().await;
    let port = free_port();
    let mut peer = Peer::start(framework, &env, gateway_port, port);
    let mut chat = Chat {
        bot: peer.connect().await,
        seen: Vec::new(),
    };

    // A task started in the framework's chat: the command is hark's, its reply and its
    // question come through the framework's own send API.
    chat.bot
        .group_message(GROUP, OWNER, "/task new paint the fence")
        .await;
    let fence = created_id(
        &chat
            .expect("'created'", |s| s.text.contains("created"))
            .await,
    );
    let q_fence = chat
        .expect("the fence's question", |s| {
            s.text.contains("Which colour?") && s.text.contains(&fence)
        })
        .await;
    assert_eq!(q_fence.stream, format!("group:{GROUP}"));
    chat.bot
        .group_message(GROUP, OWNER, "/task new paint the door")
        .await;
    let door = created_id(
        &chat
            .expect("'created'", |s| s.text.contains("created"))
            .await,
    );
    let q_door = chat
        .expect("the door's question", |s| {
            s.text.contains("Which colour?") && s.text.contains(&door)
        })
        .await;
    assert_ne!(handle_of(&q_fence.text), handle_of(&q_door.text));

    // A stranger's reply is not an answer: it reaches the bot's own handler, untouched.
    chat.bot.group_message(GROUP, STRANGER, "blue").await;
    chat.expect("the echo of the stranger", |s| s.text == "echo: blue")
        .await;

    // A quote of the door's question answers the door, though the fence's is older.
    chat.bot
        .group_message_quoting(GROUP, OWNER, "green", Some(q_door.message_id))
        .await;
    chat.expect("the door painted", |s| s.text.contains("Painted green."))
        .await;
    // A plain reply answers the oldest open question: the fence's.
    chat.bot.group_message(GROUP, OWNER, "red").await;
    chat.expect("the fence painted", |s| s.text.contains("Painted red."))
        .await;
    // Nothing open: the owner's message is the bot's.
    chat.bot.group_message(GROUP, OWNER, "hello bot").await;
    chat.expect("the echo of the owner", |s| s.text == "echo: hello bot")
        .await;

    // A question to a chat the bot does not have: the plugin says it can never send it, and
    // hark sets it aside at once, with the plugin's reason, which the question then shows. The
    // bot's other messages go on.
    let shed = env
        .client()
        .await
        .create_task(pb::CreateTaskRequest {
            owner: format!("{}:{OWNER}", framework.platform()),
            goal: "paint the shed".into(),
            chat: Some(pb::ChatRoute {
                platform: framework.platform().into(),
                bot_id: framework.bot_id(),
                stream: "channel:nowhere".into(),
                origin_message_id: String::new(),
            }),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let reason = set_aside(&env).await;
    assert!(
        reason.contains(&format!(
            "{}:{} could not send it (attempt 1)",
            framework.platform(),
            framework.bot_id()
        )) && reason.contains("channel:nowhere"),
        "{reason}"
    );
    let shown = undelivered(&env, &shed.id).await;
    assert_eq!(shown, reason);
    chat.bot.group_message(GROUP, STRANGER, "still here").await;
    chat.expect("the echo after it", |s| s.text == "echo: still here")
        .await;

    // The plugin dies; meanwhile hark asks in its chat.
    peer.kill().await;
    let task = env
        .client()
        .await
        .create_task(pb::CreateTaskRequest {
            owner: format!("{}:{OWNER}", framework.platform()),
            goal: "paint the gate".into(),
            chat: Some(pb::ChatRoute {
                platform: framework.platform().into(),
                bot_id: framework.bot_id(),
                stream: format!("group:{GROUP}"),
                origin_message_id: String::new(),
            }),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let mut client = env.client().await;
    // The question is asked (and waits for the framework) before the framework is back.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let state = client
            .get_task(pb::GetTaskRequest {
                task_id: task.id.clone(),
            })
            .await
            .expect("get task")
            .into_inner()
            .task
            .expect("task")
            .state();
        if state == pb::TaskState::WaitingInput {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gate's task did not ask within {WAIT:?}: it is {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Back: the question is delivered once, and nothing delivered before comes again. MaiBot
    // first checks that its port is free with a bind that the killed MaiBot's connections, in
    // TIME_WAIT for a minute, may still refuse; it comes back on another.
    let port = match framework {
        Framework::MaiBot => free_port(),
        _ => port,
    };
    let mut peer = Peer::start(framework, &env, gateway_port, port);
    chat.bot = peer.connect().await.numbering_from(1000);
    let gate = &task.id[..8];
    chat.expect("the gate's question", |s| {
        s.text.contains("Which colour?") && s.text.contains(gate)
    })
    .await;
    chat.bot.group_message(GROUP, OWNER, "yellow").await;
    chat.expect("the gate painted", |s| s.text.contains("Painted yellow."))
        .await;
    // A last message the bot echoes: everything hark said before it has arrived.
    chat.bot.group_message(GROUP, STRANGER, "bye").await;
    chat.expect("the last echo", |s| s.text == "echo: bye")
        .await;
    let rest = chat.bot.drain(Duration::from_millis(0)).await;
    chat.seen.extend(rest);

    assert_eq!(
        chat.seen
            .iter()
            .filter(|s| s.text.contains("Which colour?") && s.text.contains(gate))
            .count(),
        1,
        "the gate's question posted once: {:?}",
        texts(&chat)
    );
    for text in [
        "Painted green.",
        "Painted red.",
        "Painted yellow.",
        "echo: blue",
        "echo: hello bot",
    ] {
        assert_eq!(
            chat.count(text),
            1,
            "{text} posted once: {:?}",
            texts(&chat)
        );
    }
    let echoes: Vec<&str> = chat
        .seen
        .iter()
        .map(|s| s.text.as_str())
        .filter(|t| t.starts_with("echo:"))
        .collect();
    assert_eq!(
        echoes,
        [
            "echo: blue",
            "echo: hello bot",
            "echo: still here",
            "echo: bye"
        ],
        "the bot's handler saw only what hark did not take"
    );

    peer.kill().await;
    for p in &mut processes {
        p.stop().await;
    }
    drop(llm);
    env.cleanup().await;
}

/// An operator's token for hark's MCP server, which the plugins' tools use.
const MCP_TOKEN: &str = "astrbot-operator-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn astrbots_own_llm_asks_through_the_plugins_ask_user_tool_and_gets_the_owners_answer() {
    the_bots_llm_asks_through_the_plugin(Framework::AstrBot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonebot_bots_llm_asks_through_the_plugins_tools_and_gets_the_owners_answer() {
    the_bots_llm_asks_through_the_plugin(Framework::NoneBot).await;
}

/// What [`asked_by_the_bots_llm`] leaves running.
struct Asked {
    env: Env,
    llm: ScriptedLlm,
    processes: Vec<hark_e2e::Process>,
    peer: Peer,
    chat: Chat,
}

/// hark with its MCP server open to the plugin, and the framework with its LLM at `llm` (the
/// framework's variables and their URLs): the owner's private message wakes the bot's LLM, which
/// asks them "Which room?" through the plugin's `ask_user`; the question has come to the owner's
/// private chat through the framework, as the owner's.
async fn asked_by_the_bots_llm(framework: Framework, llm: &[(&str, String)]) -> Asked {
    let (env, hark_llm, processes) = hark_with(
        framework,
        &[
            ("HARK_CONTROL__API_TOKENS", MCP_TOKEN),
            ("HARK_MCP__HOLD", "30s"),
        ],
    )
    .await;
    let mcp = format!(
        "http://{}/mcp",
        processes[0].addr("control.http_listen").await
    );
    let gateway_port = env.gateway_port().await;
    let mut extra = llm.to_vec();
    extra.push(("HARK_MCP_URL", mcp));
    extra.push(("HARK_MCP_TOKEN", MCP_TOKEN.to_owned()));
    let peer = Peer::start_with(framework, &env, gateway_port, free_port(), &extra);
    let mut chat = Chat {
        bot: peer.connect().await,
        seen: Vec::new(),
    };

    chat.bot.private_message(OWNER, "book a room for me").await;
    let question = chat
        .expect("the question", |s| s.text.contains("Which room?"))
        .await;
    assert_eq!(question.stream, format!("private:{OWNER}"));
    assert!(
        question.text.contains("1) Blue") && question.text.contains("2) Green"),
        "{}",
        question.text
    );
    assert_eq!(
        env.sql("SELECT owner FROM tasks").await,
        format!("{}:{OWNER}", framework.platform()),
        "the question is the owner's"
    );
    Asked {
        env,
        llm: hark_llm,
        processes,
        peer,
        chat,
    }
}

/// The bot's LLM (an OpenAI-compatible server of the test's; AstrBot's own, or for NoneBot, which
/// has none, a plugin of the bot's that runs one with the plugin's `TOOLS`) calls `ask_user`,
/// which asks through hark's MCP server: the question comes to the owner's private chat through
/// the framework, the owner's plain reply there is hark's and never reaches the LLM (which
/// answers every private message), and the LLM gets that answer back and says so in the chat.
async fn the_bots_llm_asks_through_the_plugin(framework: Framework) {
    let bots_llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            serde_json::json!({"question": "Which room?", "choices": ["Blue", "Green"]}),
        ),
        Step::say("Booked {answer}."),
        Step::say("You are welcome."),
    ]))
    .await
    .expect("the bot's scripted LLM");
    let Asked {
        env,
        llm,
        mut processes,
        mut peer,
        mut chat,
    } = asked_by_the_bots_llm(
        framework,
        &[(framework.llm_url_variable(), bots_llm.base_url())],
    )
    .await;
    let private = format!("private:{OWNER}");

    // The owner's plain reply answers; the LLM reads the answer and goes on.
    chat.bot.private_message(OWNER, "2").await;
    let booked = chat
        .expect("the LLM's answer", |s| s.text.contains("Booked"))
        .await;
    assert_eq!(booked.stream, private);
    assert!(
        booked.text.contains("Green") && !booked.text.contains("Blue"),
        "{}",
        booked.text
    );
    assert_eq!(
        env.sql("SELECT state FROM tasks").await,
        "completed",
        "the question was answered"
    );
    // The owner's next message is the LLM's again; by its reply, every request it caused has
    // been made, and none of them carried the answer hark took.
    chat.bot.private_message(OWNER, "thanks").await;
    chat.expect("the LLM's reply to thanks", |s| s.text.contains("welcome"))
        .await;
    // What the owner said to the LLM: the first text of each request's last user message.
    let said: Vec<String> = bots_llm
        .requests()
        .iter()
        .filter_map(|r| {
            let user = r.body["messages"]
                .as_array()?
                .iter()
                .rev()
                .find(|m| m["role"] == "user")?;
            match &user["content"] {
                serde_json::Value::String(text) => Some(text.clone()),
                parts => parts[0]["text"].as_str().map(str::to_owned),
            }
        })
        .collect();
    assert_eq!(
        said,
        ["book a room for me", "book a room for me", "thanks"],
        "the bot's LLM heard the owner's messages but not the answer hark took"
    );

    peer.kill().await;
    for p in &mut processes {
        p.stop().await;
    }
    drop(bots_llm);
    drop(llm);
    env.cleanup().await;
}

/// MaiBot's own LLM (its planner, an OpenAI-compatible server of the test's; its replyer, which
/// writes what MaiBot says, another) calls the plugin's `ask_user`, which asks through hark's MCP
/// server: the question comes to the owner's private chat through MaiBot, the owner's plain reply
/// there is hark's and never reaches MaiBot's chat loop, and the planner gets that answer back as
/// the tool's result and goes on to reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maibots_own_llm_asks_through_the_plugins_ask_user_tool_and_gets_the_owners_answer() {
    // The planner's turns: ask, then reply to the owner's first message (the adapter's message
    // 1), then stop. The replyer says what MaiBot replies.
    let planner = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            serde_json::json!({"question": "Which room?", "choices": ["Blue", "Green"]}),
        ),
        Step::call(
            "reply",
            serde_json::json!({"msg_id": "1", "reply_reference": "the room the owner picked is booked"}),
        ),
        Step::call("stop", serde_json::json!({})),
    ]))
    .await
    .expect("MaiBot's scripted planner");
    let replyer = ScriptedLlm::with_default(Script::new(vec![Step::say("Booked it.")]))
        .await
        .expect("MaiBot's scripted replyer");
    let Asked {
        env,
        llm,
        mut processes,
        mut peer,
        mut chat,
    } = asked_by_the_bots_llm(
        Framework::MaiBot,
        &[
            (Framework::MaiBot.llm_url_variable(), planner.base_url()),
            ("MAIBOT_REPLYER_URL", replyer.base_url()),
        ],
    )
    .await;
    let private = format!("private:{OWNER}");

    // The owner's plain reply answers; the planner reads the answer and replies.
    let answer = chat.bot.private_message(OWNER, "2").await;
    let booked = chat
        .expect("MaiBot's reply", |s| s.text.contains("Booked it."))
        .await;
    assert_eq!(booked.stream, private);
    assert_eq!(
        env.sql("SELECT state FROM tasks").await,
        "completed",
        "the question was answered"
    );
    let result = planner
        .requests()
        .iter()
        .find_map(|r| hark_worker::scripted::last_tool_result(&r.body))
        .expect("the planner was given the tool's result");
    assert!(
        result.contains("Green") && !result.contains("Blue"),
        "the tool's result is the owner's answer: {result}"
    );
    // The owner's next message is MaiBot's again; once its planner has seen it, every request
    // MaiBot made has been made, and none of them carried the answer hark took.
    chat.bot.private_message(OWNER, "thanks").await;
    planner
        .wait_for(WAIT, |body| body.to_string().contains("thanks"))
        .await
        .expect("MaiBot's planner saw the owner's next message");
    let answer_tag = format!("msg_id=\\\"{answer}\\\"");
    for (who, requests) in [
        ("planner", planner.requests()),
        ("replyer", replyer.requests()),
    ] {
        for request in requests {
            assert!(
                !request.body.to_string().contains(&answer_tag),
                "MaiBot's {who} heard the answer hark took: {}",
                request.body
            );
        }
    }

    peer.kill().await;
    for p in &mut processes {
        p.stop().await;
    }
    drop(planner);
    drop(replyer);
    drop(llm);
    env.cleanup().await;
}

fn texts(chat: &Chat) -> Vec<&str> {
    chat.seen.iter().map(|s| s.text.as_str()).collect()
}

/// LangBot's bot as hark knows it.
const LANGBOT_BOT: &str = "3f6b2c1e-langbot-bot";

/// A webhook event exactly as LangBot's `WebhookPusher` builds it (`message_chain.model_dump()`
/// with its `Source` first).
fn langbot_event(user: i64, text: &str, id: i64, quote: Option<&str>) -> serde_json::Value {
    let mut chain =
        vec![serde_json::json!({"type": "Source", "id": id, "time": "2026-12-05T10:00:00"})];
    if let Some(quoted) = quote {
        chain.push(
            serde_json::json!({"type": "Quote", "id": null, "group_id": GROUP,
            "sender_id": 42, "target_id": GROUP, "origin": [{"type": "Plain", "text": quoted}]}),
        );
    }
    chain.push(serde_json::json!({"type": "Plain", "text": text}));
    serde_json::json!({
        "uuid": uuid::Uuid::new_v4().to_string(),
        "event_type": "bot.group_message",
        "data": {
            "bot_uuid": LANGBOT_BOT,
            "adapter_name": "aiocqhttp",
            "group": {"id": GROUP.to_string(), "name": "the group"},
            "sender": {"id": user.to_string(), "name": format!("member {user}")},
            "message": chain,
            "timestamp": 1_764_928_800,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langbot_s_webhook_skips_its_pipeline_for_what_hark_took_and_hark_replies_through_its_api()
{
    use axum::{Json, extract::Path, http::HeaderMap, routing::post};
    hark_core::install_crypto();
    // LangBot's HTTP API, as its bots router serves send_message.
    let (sent_tx, mut sent) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let api = axum::Router::new().route(
        "/api/v1/platform/bots/{bot}/send_message",
        post(
            move |Path(bot): Path<String>,
                  headers: HeaderMap,
                  Json(body): Json<serde_json::Value>| {
                let sent_tx = sent_tx.clone();
                async move {
                    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some("lb-key")
                        || bot != LANGBOT_BOT
                    {
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            Json(serde_json::json!({"code": -1, "msg": "no"})),
                        );
                    }
                    let _ = sent_tx.send(body);
                    (
                        axum::http::StatusCode::OK,
                        Json(serde_json::json!({"code": 0, "msg": "ok", "data": {"sent": true}})),
                    )
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api_url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, api).await });

    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::ask("Which colour?"),
        Step::say("Painted {answer}."),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__LANGBOT__URL", &api_url);
    env.set("HARK_GATEWAY__LANGBOT__API_KEY", "lb-key");
    env.set(
        "HARK_GATEWAY__LANGBOT__BOTS",
        &format!("langbot-qq:{LANGBOT_BOT}"),
    );
    env.set("HARK_GATEWAY__LANGBOT__TOKEN", "lb-webhook-token");
    env.set("HARK_GATEWAY__LANGBOT__WAIT", "10s");
    let mut processes = vec![env.spawn(&["control"], &[])];
    env.client().await;
    processes.push(env.spawn(&["gateway"], &[]));
    processes.push(env.spawn(&["worker", "--id", "w1"], &[]));
    let webhook = format!(
        "http://127.0.0.1:{}/api/v1/langbot/webhook?token=lb-webhook-token",
        env.gateway_port().await
    );
    let http = reqwest::Client::new();
    let push = |event: serde_json::Value| {
        let (http, webhook) = (http.clone(), webhook.clone());
        async move {
            let response = http
                .post(&webhook)
                .json(&event)
                .send()
                .await
                .expect("the webhook answers");
            assert_eq!(response.status(), 200);
            let body: serde_json::Value = response.json().await.expect("JSON");
            assert_eq!(body["status"], "ok", "{body}");
            body["skip_pipeline"].as_bool().expect("skip_pipeline")
        }
    };
    let mut seen: Vec<String> = Vec::new();
    let mut expect = async |what: &str, matches: &dyn Fn(&str) -> bool| -> String {
        loop {
            let body = tokio::time::timeout(WAIT, sent.recv())
                .await
                .unwrap_or_else(|_| panic!("LangBot was asked to send no {what}; it sent {seen:?}"))
                .expect("LangBot's API runs");
            assert_eq!(body["target_type"], "group", "{body}");
            assert_eq!(body["target_id"], GROUP.to_string(), "{body}");
            let text = body["message_chain"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            seen.push(text.clone());
            if matches(&text) {
                return text;
            }
        }
    };

    assert!(push(langbot_event(OWNER, "/task new paint the fence", 1, None)).await);
    let created = expect("'created'", &|t| t.contains("created")).await;
    let fence = created.split_whitespace().nth(1).expect("id").to_owned();
    let q_fence = expect("the fence's question", &|t| t.contains("Which colour?")).await;
    assert!(q_fence.contains(&fence), "{q_fence}");
    assert!(push(langbot_event(OWNER, "/task new paint the gate", 2, None)).await);
    let created = expect("'created'", &|t| t.contains("created")).await;
    let gate = created.split_whitespace().nth(1).expect("id").to_owned();
    let q_gate = expect("the gate's question", &|t| {
        t.contains("Which colour?") && t.contains(&gate)
    })
    .await;

    // A stranger's reply goes on to LangBot's pipeline.
    assert!(!push(langbot_event(STRANGER, "blue", 3, None)).await);
    // A quote of the gate's question answers the gate, though the fence's is older.
    assert!(push(langbot_event(OWNER, "green", 4, Some(&q_gate))).await);
    expect("the gate painted", &|t| t.contains("Painted green.")).await;
    assert!(push(langbot_event(OWNER, "red", 5, None)).await);
    expect("the fence painted", &|t| t.contains("Painted red.")).await;
    // Nothing open: the owner's message is LangBot's.
    assert!(!push(langbot_event(OWNER, "hello bot", 6, None)).await);
    let gate_done = seen.iter().position(|t| t.contains("Painted green."));
    let fence_done = seen.iter().position(|t| t.contains("Painted red."));
    assert!(gate_done < fence_done, "{seen:?}");
    assert!(
        seen.iter()
            .any(|t| t.contains(&format!("task {gate} continues"))),
        "the quote answered the gate: {seen:?}"
    );

    // Without the token, or for a bot hark does not serve, nothing is taken.
    let response = http
        .post(webhook.replace("lb-webhook-token", "guess"))
        .json(&langbot_event(OWNER, "/task list", 7, None))
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 401);
    let mut other = langbot_event(OWNER, "/task list", 8, None);
    other["data"]["bot_uuid"] = serde_json::json!("another-bot");
    let response = http
        .post(&webhook)
        .json(&other)
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 403);

    for p in &mut processes {
        p.stop().await;
    }
    drop(llm);
    env.cleanup().await;
}
