//! hark's MCP server through MCP clients nobody here wrote: the official Python SDK (`mcp`) and
//! TypeScript SDK (`@modelcontextprotocol/sdk`), and rmcp's client for the Tasks extension. The
//! person answers in a private chat with the bot, through a real `hark gateway`; the questions
//! outlive the calls that asked them, a kill -9 of task-control, and the replica that asked.

use std::{path::PathBuf, time::Duration};

use hark_e2e::chat::{Hark, OWNER, WAIT};
use serde_json::{Value, json};

/// Where `.ci/run` installs the pinned Python SDK (tests/mcp/requirements.txt).
fn python() -> PathBuf {
    let path = std::env::var_os("HARK_TEST_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/hark-ci/mcp-python/bin/python"));
    assert!(
        path.exists(),
        "{} is missing: make a venv with `pip install -r tests/mcp/requirements.txt` (as .ci/run \
         does) and point HARK_TEST_MCP_PYTHON at its python",
        path.display()
    );
    path
}

fn peers() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp")
}

/// One tool call from a separate process, with the SDK of `client` ("python" or "node").
fn call(
    client: &str,
    url: &str,
    key: &str,
    tool: &str,
    arguments: Value,
    request_id: Option<&str>,
) -> tokio::process::Child {
    let mut command = match client {
        "python" => {
            let mut c = tokio::process::Command::new(python());
            c.arg(peers().join("client.py"));
            c
        }
        _ => {
            let sdk = peers().join("node_modules/@modelcontextprotocol/sdk");
            assert!(
                sdk.exists(),
                "{} is missing: run `npm ci --prefix tests/mcp` (as .ci/run does)",
                sdk.display()
            );
            let mut c = tokio::process::Command::new("node");
            c.arg(peers().join("client.mjs"));
            c
        }
    };
    command
        .args([url, key, tool, &arguments.to_string()])
        .args(request_id)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command.spawn().expect("the MCP client starts")
}

/// What a call printed, once it ended.
async fn result(child: tokio::process::Child) -> Value {
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the MCP client ends")
        .expect("the MCP client ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|_| {
        panic!(
            "the MCP client printed no result ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

async fn called(
    client: &str,
    url: &str,
    key: &str,
    tool: &str,
    arguments: Value,
    request_id: Option<&str>,
) -> Value {
    result(call(client, url, key, tool, arguments, request_id)).await
}

/// What the bot posts that `pred` accepts, while `asking` waits for the answer; the call's
/// output, should it end first.
async fn asked_while(
    hark: &mut Hark,
    asking: &mut tokio::process::Child,
    what: &str,
    pred: impl Fn(&hark_e2e::bot::Sent) -> bool,
) -> hark_e2e::bot::Sent {
    tokio::select! {
        sent = hark.bot.expect(what, WAIT, pred) => sent,
        ended = asking.wait() => {
            let mut out = String::new();
            if let Some(mut stdout) = asking.stdout.take() {
                use tokio::io::AsyncReadExt as _;
                let _ = stdout.read_to_string(&mut out).await;
            }
            if let Some(mut stderr) = asking.stderr.take() {
                use tokio::io::AsyncReadExt as _;
                let _ = stderr.read_to_string(&mut out).await;
            }
            panic!("the call ended ({ended:?}) before the bot posted {what}: {out}");
        }
    }
}

/// A key `user` made for themselves with `/key new` in their private chat with the bot.
async fn key_of(hark: &mut Hark, user: i64, name: &str) -> String {
    hark.bot
        .private_message(user, &format!("/key new {name}"))
        .await;
    let stream = format!("private:{user}");
    let made = hark
        .bot
        .expect("the new key", WAIT, |s| {
            s.stream == stream && s.text.contains("hk_")
        })
        .await;
    made.text
        .split_whitespace()
        .find(|w| w.starts_with("hk_"))
        .expect("the key")
        .to_owned()
}

async fn mcp_url(process: &hark_e2e::Process) -> String {
    format!("http://{}/mcp", process.addr("control.http_listen").await)
}

/// How many questions hark has asked in all.
async fn questions(hark: &Hark) -> String {
    hark.env.sql("SELECT count(*) FROM questions").await
}

#[tokio::test]
async fn any_mcp_client_asks_a_person_in_chat_within_the_hold_after_it_and_on_another_replica() {
    let mut hark = Hark::start(Vec::new(), &[("HARK_MCP__HOLD", "60s")], &["w1"]).await;
    let url = mcp_url(&hark.control).await;
    // A second replica that holds a call for one second only.
    let mut other = hark.env.spawn_named(
        "control-b",
        &["control"],
        &[
            ("HARK_CONTROL__GRPC_LISTEN", "127.0.0.1:0"),
            ("HARK_MCP__HOLD", "1s"),
        ],
    );
    let other_url = mcp_url(&other).await;
    let key = key_of(&mut hark, OWNER, "laptop").await;

    // Both SDKs see hark's tools.
    for client in ["python", "node"] {
        let listed = called(client, &url, &key, "tools/list", json!({}), None).await;
        for tool in [
            "ask_user",
            "get_answer",
            "approve",
            "permission_prompt",
            "notify",
            "list_questions",
        ] {
            assert!(
                listed["tools"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|n| n == tool)),
                "{client}: {listed}"
            );
        }
    }

    // Answered within the hold: the question is asked in the owner's private chat, saying who
    // asks, and the call returns the choice.
    let mut asking = call(
        "python",
        &url,
        &key,
        "ask_user",
        json!({"question": "Which room?", "choices": ["Blue", "Green"]}),
        None,
    );
    let asked = asked_while(&mut hark, &mut asking, "the question", |s| {
        s.text.contains("Which room?")
    })
    .await;
    assert_eq!(asked.stream, format!("private:{OWNER}"));
    assert!(
        asked.text.contains("asked by laptop through MCP") && asked.text.contains("Green"),
        "{}",
        asked.text
    );
    hark.bot.private_message(OWNER, "2").await;
    let answered = result(asking).await;
    assert_eq!(answered["structured"]["status"], "answered", "{answered}");
    assert_eq!(answered["structured"]["answer"], "Green", "{answered}");
    assert_eq!(
        answered["structured"]["answered_by"], "qq:100",
        "{answered}"
    );
    assert_eq!(answered["text"], "Green", "{answered}");

    // Past the hold on the other replica: "waiting", with the question's id; the answer is
    // given while no call waits, and get_answer on the first replica (from the TypeScript SDK)
    // returns it.
    let waiting = called(
        "python",
        &other_url,
        &key,
        "ask_user",
        json!({"question": "Ship the release?", "kind": "confirm"}),
        Some("release-1"),
    )
    .await;
    assert_eq!(waiting["structured"]["status"], "waiting", "{waiting}");
    assert!(
        waiting["text"]
            .as_str()
            .is_some_and(|t| t.contains("get_answer")),
        "{waiting}"
    );
    let id = waiting["structured"]["question_id"]
        .as_str()
        .expect("question_id")
        .to_owned();
    let handle = waiting["structured"]["handle"]
        .as_str()
        .expect("handle")
        .to_owned();
    let shown = hark
        .bot
        .expect("the second question", WAIT, |s| {
            s.text.contains("Ship the release?")
        })
        .await;
    assert!(shown.text.contains(&handle), "{} {handle}", shown.text);
    hark.bot.private_message(OWNER, "yes").await;
    let got = called(
        "node",
        &url,
        &key,
        "get_answer",
        json!({"question_id": id, "wait_s": 60}),
        None,
    )
    .await;
    assert_eq!(got["structured"]["status"], "answered", "{got}");
    assert_eq!(got["structured"]["answer"], true, "{got}");

    // The same request id asks nothing new: it is the same question, answered.
    let before = questions(&hark).await;
    let again = called(
        "python",
        &other_url,
        &key,
        "ask_user",
        json!({"question": "Ship the release?", "kind": "confirm"}),
        Some("release-1"),
    )
    .await;
    assert_eq!(again["structured"]["question_id"], id.as_str(), "{again}");
    assert_eq!(again["structured"]["answer"], true, "{again}");
    assert_eq!(questions(&hark).await, before);

    // Another person's key cannot read the question, nor ask the owner; the refusals name
    // what was refused, and nothing is asked.
    hark.bot.private_message(200, "hello").await;
    let stranger = key_of(&mut hark, 200, "theirs").await;
    let refused = called(
        "node",
        &url,
        &stranger,
        "get_answer",
        json!({"question_id": id}),
        None,
    )
    .await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(
        refused["structured"]["error"], "PERMISSION_DENIED",
        "{refused}"
    );
    let refused = called(
        "python",
        &url,
        &stranger,
        "ask_user",
        json!({"question": "Give me your password", "owner": "qq:100"}),
        None,
    )
    .await;
    assert_eq!(
        refused["structured"]["error"], "PERMISSION_DENIED",
        "{refused}"
    );
    assert!(
        refused["text"]
            .as_str()
            .is_some_and(|t| t.contains("qq:200") && t.contains("qq:100")),
        "{refused}"
    );
    assert_eq!(questions(&hark).await, before);

    // notify reaches the chat without a question; list_questions shows what is open.
    let sent = called(
        "node",
        &url,
        &key,
        "notify",
        json!({"text": "Build 42 is green"}),
        None,
    )
    .await;
    assert_eq!(sent["structured"]["status"], "sent", "{sent}");
    let told = hark
        .bot
        .expect("the notice", WAIT, |s| s.text.contains("Build 42 is green"))
        .await;
    assert_eq!(told.stream, format!("private:{OWNER}"));
    let open = called("python", &url, &key, "list_questions", json!({}), None).await;
    assert_eq!(open["structured"]["questions"], json!([]), "{open}");

    // A key that is not one: 401, and the refusal says how to get one.
    hark_core::install_crypto();
    let anonymous = reqwest::Client::new()
        .post(&url)
        .bearer_auth("hk_0123456789abcdef")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("reached");
    assert_eq!(anonymous.status(), 401);
    assert!(
        anonymous
            .text()
            .await
            .unwrap_or_default()
            .contains("/key new"),
    );

    other.stop().await;
    hark.stop().await;
}

/// Claude Code's permission result, as the text of a `permission_prompt` call.
fn permission(printed: &Value) -> Value {
    serde_json::from_str(printed["text"].as_str().expect("text"))
        .expect("the text is Claude Code's JSON")
}

/// A `permission_prompt` from `client` for `Bash` running `command`, in `session`: what the
/// chat was shown, and what the call returned once the person replied `reply`.
async fn prompted(
    hark: &mut Hark,
    client: &str,
    (url, key): (&str, &str),
    (id, session, command): (&str, &str, &str),
    reply: &str,
) -> (String, Value) {
    let arguments = json!({"tool_name": "Bash", "input": {"command": command}, "tool_use_id": id, "session": session});
    let mut asking = call(client, url, key, "permission_prompt", arguments, None);
    let needle = format!("\"command\":{}", json!(command));
    let asked = asked_while(hark, &mut asking, "the prompt", |s| {
        s.text.contains("Allow `Bash` to run?") && s.text.contains(&needle)
    })
    .await;
    hark.bot.private_message(OWNER, reply).await;
    (asked.text, permission(&result(asking).await))
}

#[tokio::test]
async fn permission_prompt_is_approved_denied_with_a_reason_and_approved_for_the_session() {
    let mut hark = Hark::start(Vec::new(), &[("HARK_MCP__HOLD", "60s")], &["w1"]).await;
    let url = mcp_url(&hark.control).await;
    let key = key_of(&mut hark, OWNER, "claude").await;
    let at = (url.as_str(), key.as_str());

    // Approved: the input goes back as it was.
    let (shown, allowed) = prompted(&mut hark, "node", at, ("t1", "s1", "ls"), "1").await;
    assert!(shown.contains("deny"), "{shown}");
    assert_eq!(
        allowed,
        json!({"behavior": "allow", "updatedInput": {"command": "ls"}})
    );

    // Denied with a reason: the reason reaches the model.
    let (_, denied) = prompted(
        &mut hark,
        "python",
        at,
        ("t2", "s1", "rm -rf /"),
        "deny too risky",
    )
    .await;
    assert_eq!(denied["behavior"], "deny", "{denied}");
    assert!(
        denied["message"]
            .as_str()
            .is_some_and(|m| m.contains("too risky")),
        "{denied}"
    );

    // Approved for the rest of the session: the next prompt for the tool asks nobody.
    let (_, allowed) = prompted(&mut hark, "node", at, ("t3", "s1", "pwd"), "3").await;
    assert_eq!(allowed["behavior"], "allow", "{allowed}");
    let before = questions(&hark).await;
    let again = called(
        "python",
        &url,
        &key,
        "permission_prompt",
        json!({"tool_name": "Bash", "input": {"command": "whoami"}, "tool_use_id": "t4", "session": "s1"}),
        None,
    )
    .await;
    assert_eq!(
        permission(&again),
        json!({"behavior": "allow", "updatedInput": {"command": "whoami"}})
    );
    assert_eq!(questions(&hark).await, before, "nobody was asked");
    // Another session is asked again.
    let (_, allowed) = prompted(&mut hark, "python", at, ("t5", "s2", "id"), "1").await;
    assert_eq!(allowed["behavior"], "allow", "{allowed}");
    assert_ne!(questions(&hark).await, before);

    hark.stop().await;
}

#[tokio::test]
async fn a_question_outlives_a_kill_of_task_control_and_is_answered_while_no_call_waits() {
    let mut hark = Hark::start(Vec::new(), &[("HARK_MCP__HOLD", "60s")], &["w1"]).await;
    let url = mcp_url(&hark.control).await;
    let key = key_of(&mut hark, OWNER, "laptop").await;
    let mut asking = call(
        "python",
        &url,
        &key,
        "ask_user",
        json!({"question": "Deploy to production?", "choices": ["yes", "no"]}),
        Some("deploy-7"),
    );
    let asked = asked_while(&mut hark, &mut asking, "the question", |s| {
        s.text.contains("Deploy to production?")
    })
    .await;
    // task-control dies while the call holds; the client's call fails with it.
    hark.control.kill().await;
    let failed = tokio::time::timeout(WAIT, asking.wait_with_output())
        .await
        .expect("the call ends with its server")
        .expect("ran");
    assert!(
        !failed.status.success(),
        "the call cannot succeed without its server: {}",
        String::from_utf8_lossy(&failed.stdout)
    );
    // The person answers while no task-control runs; the gateway keeps the message.
    hark.bot.private_message(OWNER, "1").await;
    hark.control = hark.env.spawn(&["control"], &[]);
    let url = mcp_url(&hark.control).await;
    // The agent asks again with the same request id: the same question, answered once the
    // new task-control took the answer the gateway kept.
    let answered = called(
        "python",
        &url,
        &key,
        "ask_user",
        json!({"question": "Deploy to production?", "choices": ["yes", "no"]}),
        Some("deploy-7"),
    )
    .await;
    assert_eq!(answered["structured"]["status"], "answered", "{answered}");
    assert_eq!(answered["structured"]["answer"], "yes", "{answered}");
    assert!(
        asked
            .text
            .contains(answered["structured"]["handle"].as_str().expect("handle"))
    );
    hark.stop().await;
}

/// An MCP client (rmcp's) that declares the Tasks extension, on `url` with `key`.
async fn tasks_client(
    url: &str,
    key: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::InitializeRequestParams> {
    use rmcp::{
        model::{ClientCapabilities, Implementation, InitializeRequestParams, ProtocolVersion},
        service::{ClientLifecycleMode, ClientServiceExt as _},
        transport::{
            StreamableHttpClientTransport,
            streamable_http_client::StreamableHttpClientTransportConfig,
        },
    };
    hark_core::install_crypto();
    let transport = StreamableHttpClientTransport::with_client(
        reqwest::Client::new(),
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(key.to_owned()),
    );
    InitializeRequestParams::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("hark-test", "1.0.0"),
    )
    // The Tasks extension comes with the stateless revision, found with `server/discover`.
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("the client connects")
}

#[tokio::test]
async fn a_client_with_the_tasks_extension_gets_a_task_answered_from_any_replica() {
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, TaskPayload,
        TaskStatus,
    };
    let mut hark = Hark::start(Vec::new(), &[("HARK_MCP__HOLD", "60s")], &["w1"]).await;
    let url = mcp_url(&hark.control).await;
    let mut other = hark.env.spawn_named(
        "control-b",
        &["control"],
        &[("HARK_CONTROL__GRPC_LISTEN", "127.0.0.1:0")],
    );
    let other_url = mcp_url(&other).await;
    let key = key_of(&mut hark, OWNER, "agent").await;
    let client = tasks_client(&url, &key).await;
    let elsewhere = tasks_client(&other_url, &key).await;

    // The call returns a task at once, once the question is committed.
    let args = |question: &str| {
        json!({"question": question})
            .as_object()
            .cloned()
            .expect("an object")
    };
    let created = client
        .peer()
        .call_tool_once(CallToolRequestParams::new("ask_user").with_arguments(args("Lunch?")))
        .await
        .expect("called");
    let CallToolResponse::Task(created) = created else {
        panic!("a task was expected: {created:?}");
    };
    assert_eq!(created.task.status, TaskStatus::Working);
    let task_id = created.task.task_id.clone();
    hark.bot
        .expect("the question", WAIT, |s| s.text.contains("Lunch?"))
        .await;
    hark.bot.private_message(OWNER, "noodles").await;

    // tasks/get on the other replica, from Postgres, until it completed.
    let done = hark_e2e::eventually("the task completes", WAIT, || async {
        let got = elsewhere
            .peer()
            .get_task(GetTaskParams::new(task_id.clone()))
            .await
            .ok()?;
        (got.task.task.status == TaskStatus::Completed).then_some(got)
    })
    .await;
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("a completed task carries its result: {done:?}");
    };
    assert_eq!(
        result["structuredContent"]["answer"], "noodles",
        "{result:?}"
    );

    // tasks/cancel closes the question as cancelled and tells the chat.
    let created = client
        .peer()
        .call_tool_once(CallToolRequestParams::new("ask_user").with_arguments(args("Dinner?")))
        .await
        .expect("called");
    let CallToolResponse::Task(created) = created else {
        panic!("a task was expected: {created:?}");
    };
    hark.bot
        .expect("the second question", WAIT, |s| s.text.contains("Dinner?"))
        .await;
    elsewhere
        .peer()
        .cancel_task(CancelTaskParams::new(created.task.task_id.clone()))
        .await
        .expect("cancelled");
    hark.bot
        .expect("the cancellation", WAIT, |s| {
            s.text.contains("cancelled") && s.text.contains("no longer needs the answer")
        })
        .await;
    let got = client
        .peer()
        .get_task(GetTaskParams::new(created.task.task_id.clone()))
        .await
        .expect("got");
    assert_eq!(got.task.task.status, TaskStatus::Cancelled);

    // Another person's key does not see the task.
    hark.bot.private_message(200, "hello").await;
    let stranger = key_of(&mut hark, 200, "theirs").await;
    let theirs = tasks_client(&url, &stranger).await;
    assert!(
        theirs
            .peer()
            .get_task(GetTaskParams::new(task_id))
            .await
            .is_err()
    );

    drop((client, elsewhere, theirs));
    other.stop().await;
    hark.stop().await;
}
