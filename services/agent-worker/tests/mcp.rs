//! MCP tools against a real MCP server nobody here wrote: `@modelcontextprotocol/server-everything`
//! from npm (pinned by `tests/mcp/package-lock.json`; `.ci/run` installs it with `npm ci`), over
//! stdio and over streamable HTTP, driven by the scripted LLM through real task-control and
//! workers.

mod common;

use std::{path::PathBuf, time::Duration};

use common::{Bed, tool_results};
use hark_core::config::{Approval, ApprovalWord, McpServerConfig};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The server's entry point; the tests fail, saying how to install it, when it is missing.
fn everything() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        path.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp` (as .ci/run does)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// The server over stdio, under the name `everything`.
fn stdio(tweak: impl FnOnce(&mut McpServerConfig)) -> McpServerConfig {
    let mut server = McpServerConfig {
        name: "everything".into(),
        command: hark_testkit::node().to_string_lossy().into_owned(),
        args: vec![everything(), "stdio".into()],
        ..Default::default()
    };
    tweak(&mut server);
    server
}

async fn bed(steps: Vec<Step>, servers: Vec<McpServerConfig>) -> Bed {
    bed_with(steps, servers, |_| {}).await
}

async fn bed_with(
    steps: Vec<Step>,
    servers: Vec<McpServerConfig>,
    tweak: impl FnOnce(&mut hark_core::config::Config),
) -> Bed {
    let llm = ScriptedLlm::with_default(Script::new(steps))
        .await
        .expect("scripted LLM starts");
    let mut bed = Bed::start(llm, |c| {
        c.tools.mcp = servers;
        tweak(c);
    })
    .await;
    bed.add_worker("w1").await;
    bed.tools[0]
        .connected(WAIT)
        .await
        .expect("the MCP servers connect");
    bed
}

fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

async fn open_question(bed: &Bed, id: &str) -> pb::Question {
    bed.wait_state(id, pb::TaskState::WaitingInput, WAIT)
        .await
        .task
        .expect("task")
        .open_question
        .expect("open question")
}

#[tokio::test]
async fn a_server_s_tools_are_offered_and_their_results_reach_the_model() {
    let bed = bed(
        vec![
            Step::call("everything__echo", json!({"message": "hi from hark"})),
            Step::call("everything__get-sum", json!({"a": 2, "b": 3})),
            Step::call("everything__get-tiny-image", json!({})),
            Step::call(
                "everything__get-structured-content",
                json!({"location": "New York"}),
            ),
            Step::call("everything__echo", json!({"wrong": 1})),
            Step::say("{answers}"),
        ],
        vec![stdio(|_| {})],
    )
    .await;
    let id = bed.create("api:alice", "use the tools", |_| {}).await;
    bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;

    let requests = bed.llm.requests();
    let names = offered(&requests[0].body);
    for name in ["ask_user", "everything__echo", "everything__get-sum"] {
        assert!(names.contains(&name.to_owned()), "{name} in {names:?}");
    }
    let results = tool_results(&requests.last().expect("requests").body);
    assert_eq!(results.len(), 5, "{results:?}");
    assert_eq!(results[0], "Echo: hi from hark");
    assert!(results[1].contains("is 5"), "{}", results[1]);
    assert!(
        results[2].contains("an image (image/png") && results[2].contains("cannot see"),
        "{}",
        results[2]
    );
    assert!(results[3].contains("temperature"), "{}", results[3]);
    assert!(
        results[4].starts_with("error:") && results[4].contains("everything__echo"),
        "{}",
        results[4]
    );
    bed.stop().await;
}

#[tokio::test]
async fn tools_over_streamable_http_reach_the_model() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("addr").port()
    };
    let mut server = tokio::process::Command::new(hark_testkit::node())
        .args([everything(), "streamableHttp".into()])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "the server listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = McpServerConfig {
        name: "web".into(),
        url: format!("http://127.0.0.1:{port}/mcp"),
        ..Default::default()
    };
    let bed = bed(
        vec![
            Step::call("web__echo", json!({"message": "over http"})),
            Step::say("{answer}"),
        ],
        vec![http],
    )
    .await;
    let id = bed.create("api:alice", "echo", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Echo: over http");
    bed.stop().await;
    let _ = server.kill().await;
}

#[tokio::test]
async fn a_tool_above_the_owner_s_role_is_neither_offered_nor_run() {
    let bed = bed(
        vec![
            Step::call("everything__echo", json!({"message": "x"})),
            Step::say("{answer}"),
        ],
        vec![stdio(|s| s.min_role = hark_core::domain::Role::Admin)],
    )
    .await;
    let id = bed.create("api:alice", "echo", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(result.contains("needs the role admin"), "{result}");
    let requests = bed.llm.requests();
    assert!(
        !offered(&requests[0].body).contains(&"everything__echo".to_owned()),
        "not offered to a user"
    );
    bed.stop().await;
}

/// A task whose model calls `everything__echo`, which needs approval, then says what it got;
/// returned once it waits for the approval, with the question.
async fn waiting_for_approval(
    tweak: impl FnOnce(&mut hark_core::config::Config),
) -> (Bed, String, pb::Question) {
    let bed = bed_with(
        vec![
            Step::call("everything__echo", json!({"message": "delete it"})),
            Step::say("{answer}"),
        ],
        vec![stdio(|s| {
            s.approval = Approval::Listed(vec!["echo".into()])
        })],
        tweak,
    )
    .await;
    let id = bed.create("api:alice", "echo", |_| {}).await;
    let question = open_question(&bed, &id).await;
    (bed, id, question)
}

async fn result_after(bed: &Bed, id: &str) -> String {
    let done = bed.wait_state(id, pb::TaskState::Completed, WAIT).await;
    done.task.expect("task").result
}

#[tokio::test]
async fn an_approved_call_runs_after_the_owner_says_so_in_a_durable_question() {
    let (bed, id, question) = waiting_for_approval(|_| {}).await;
    assert_eq!(
        question.text,
        "Run `everything__echo` with message=delete it?"
    );
    assert_eq!(
        question.choices,
        ["approve", "deny", "approve for the rest of this task"]
    );
    assert_eq!(question.kind, "approval");
    assert_eq!(
        question
            .fields
            .iter()
            .map(|f| f.key.as_str())
            .collect::<Vec<_>>(),
        ["message"],
        "the arguments the owner may change"
    );
    // Nothing ran: the server was not called, and the task waits like any question, held by
    // no worker.
    assert_eq!(bed.tools[0].in_flight(), 0);

    bed.answer(&id, "1").await;
    assert_eq!(result_after(&bed, &id).await, "Echo: delete it");
    bed.stop().await;
}

#[tokio::test]
async fn a_denied_call_does_not_run_and_the_model_reads_that_the_owner_declined() {
    let (bed, id, _) = waiting_for_approval(|_| {}).await;
    bed.answer(&id, "deny").await;
    assert_eq!(
        result_after(&bed, &id).await,
        "the owner declined; `everything__echo` did not run."
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_denial_with_a_reason_gives_the_model_the_reason() {
    let (bed, id, _) = waiting_for_approval(|_| {}).await;
    bed.answer(&id, "deny: not before the backup").await;
    assert_eq!(
        result_after(&bed, &id).await,
        "the owner declined; `everything__echo` did not run. Their reason: not before the backup"
    );
    bed.stop().await;
}

#[tokio::test]
async fn changed_arguments_approve_the_call_which_runs_with_them() {
    let (bed, id, _) = waiting_for_approval(|_| {}).await;
    // An argument the tool does not have is refused, and the question stays open.
    let refused = bed
        .try_answer(&id, "mode: fast")
        .await
        .expect_err("no such argument");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("mode"), "{}", refused.message());
    bed.answer(&id, "message: keep it").await;
    let result = result_after(&bed, &id).await;
    assert_eq!(
        result,
        "the owner approved it with changed arguments {\"message\":\"keep it\"}; it ran:\nEcho: keep it"
    );
    bed.stop().await;
}

#[tokio::test]
async fn an_approval_nobody_answers_expires_and_the_call_does_not_run() {
    let (bed, id, _) =
        waiting_for_approval(|c| c.task.ask_timeout = "1s".parse().expect("duration")).await;
    let result = result_after(&bed, &id).await;
    assert!(
        result.contains("did not answer") && result.contains("did not run"),
        "{result}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn approval_for_the_rest_of_the_task_is_asked_once_and_kept_from_the_model() {
    let bed = bed(
        vec![
            Step::call("everything__echo", json!({"message": "one"})),
            Step::call("everything__echo", json!({"message": "two"})),
            Step::say("{answers}"),
        ],
        vec![stdio(|s| s.approval = Approval::Every(ApprovalWord::All))],
    )
    .await;
    let id = bed.create("api:alice", "echo twice", |_| {}).await;
    open_question(&bed, &id).await;
    bed.answer(&id, "3").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Echo: one|Echo: two");
    let detail = bed.task(&id).await;
    assert_eq!(
        detail.questions.len(),
        1,
        "asked once: {:?}",
        detail.questions
    );
    for request in bed.llm.requests() {
        let roles: Vec<&str> = request.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert!(
            roles
                .iter()
                .all(|r| ["system", "user", "assistant", "tool"].contains(r)),
            "{roles:?}"
        );
    }
    bed.stop().await;
}

#[tokio::test]
async fn a_server_killed_mid_call_is_an_error_result_and_is_started_again() {
    let bed = bed(
        vec![
            Step::call(
                "everything__trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
            ),
            Step::say("{answer}"),
        ],
        vec![stdio(|_| {})],
    )
    .await;
    let hub = bed.tools[0].clone();
    let first = hub.pid("everything").expect("the server runs");
    let id = bed.create("api:alice", "take long", |_| {}).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while hub.in_flight() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the call starts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed = std::process::Command::new("kill")
        .args(["-9", &first.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());

    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(
        result.starts_with("error: the MCP server `everything` stopped during the call"),
        "{result}"
    );
    // Started again: a new process, whose tools answer.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(pid) = hub.pid("everything")
            && pid != first
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server restarts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bed.llm.set_script(
        "again",
        Script::new(vec![
            Step::call("everything__echo", json!({"message": "back"})),
            Step::say("{answer}"),
        ]),
    );
    let id = bed.create("api:alice", "[script:again] echo", |_| {}).await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert_eq!(done.task.expect("task").result, "Echo: back");
    bed.stop().await;
}

#[tokio::test]
async fn a_replayed_round_calls_the_tool_with_the_same_idempotency_key() {
    // The server's input is copied to a log, to see each call as the server received it.
    let log = std::env::temp_dir().join(format!("hark-mcp-{}.log", uuid::Uuid::new_v4()));
    let script = format!(
        "tee -a '{}' | exec node '{}' stdio",
        log.display(),
        everything()
    );
    let mut bed = bed_with(
        vec![
            Step::call(
                "everything__trigger-long-running-operation",
                json!({"duration": 2, "steps": 2}),
            ),
            Step::say("{answer}"),
        ],
        vec![stdio(|s| {
            s.command = "sh".into();
            s.args = vec!["-c".into(), script];
        })],
        |c| c.task.lease = "2s".parse().expect("duration"),
    )
    .await;
    let id = bed.create("api:alice", "take long", |_| {}).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while bed.tools[0].in_flight() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the call starts");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The worker dies mid-call, before its round is stored; another replays the round.
    bed.kill_worker(0).await;
    bed.add_worker("w2").await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert!(
        done.task.expect("task").result.contains("completed"),
        "the replayed call finished"
    );

    let text = std::fs::read_to_string(&log).expect("the server's input");
    let keys: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["method"] == "tools/call")
        .map(|m| {
            m["params"]["_meta"][hark_worker::mcp::IDEMPOTENCY_KEY]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(keys.len(), 2, "called twice: {keys:?}");
    assert_eq!(keys[0], keys[1]);
    assert!(keys[0].starts_with(&format!("{id}:1:")), "{keys:?}");
    let _ = std::fs::remove_file(&log);
    bed.stop().await;
}

#[tokio::test]
async fn a_server_s_input_request_becomes_a_form_question_and_the_answer_reaches_the_server() {
    let bed = bed(
        vec![
            Step::call("everything__trigger-elicitation-request", json!({})),
            Step::say("{answer}"),
        ],
        vec![stdio(|_| {})],
    )
    .await;
    let id = bed.create("api:alice", "fill in the form", |_| {}).await;
    let question = open_question(&bed, &id).await;
    assert!(
        question
            .text
            .starts_with("`everything__trigger-elicitation-request`: Please provide inputs"),
        "{}",
        question.text
    );
    assert_eq!(question.kind, "form");
    let name = question
        .fields
        .iter()
        .find(|f| f.key == "name")
        .expect("a name field");
    assert!(name.required);
    // Nothing waits at the server meanwhile: the task waits like for any question.
    assert_eq!(bed.tools[0].in_flight(), 0);

    // Answered as in a chat, by field key or title, choices by label; the rest take defaults.
    bed.answer(
        &id,
        "name: Ada Lovelace\ncheck: 是\nTitled Single Select Enum: Wonder Woman\nuntitledMultipleSelectEnum: Piano, 4",
    )
    .await;
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let result = done.task.expect("task").result;
    assert!(
        result.contains("User provided the requested information")
            && result.contains("- Name: Ada Lovelace")
            && result.contains("- Agreed to terms: true")
            && result.contains("hero-3")
            && result.contains("\"Piano\"")
            && result.contains("\"Drums\""),
        "{result}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_long_tool_s_progress_reaches_the_task_s_chat() {
    let bed = bed(
        vec![
            Step::call(
                "everything__trigger-long-running-operation",
                json!({"duration": 2, "steps": 4}),
            ),
            Step::say("{answer}"),
        ],
        vec![stdio(|_| {})],
    )
    .await;
    let mut outbound = bed
        .nats
        .subscribe(bed.names.chat_out_all())
        .await
        .expect("subscribed");
    let id = bed
        .create("qq:10001", "take long", |r| {
            r.chat = Some(pb::ChatRoute {
                platform: "qq".into(),
                bot_id: "42".into(),
                stream: "group:777".into(),
                ..Default::default()
            });
        })
        .await;
    let progress = tokio::time::timeout(WAIT, async {
        loop {
            let message = futures_util::StreamExt::next(&mut outbound)
                .await
                .expect("a message");
            let out: pb::OutboundMessage =
                hark_core::codec::decode(&message.payload).expect("decodes");
            if out.text.starts_with("⏳") {
                return out;
            }
        }
    })
    .await
    .expect("a progress note within the wait");
    assert!(
        progress
            .text
            .starts_with("⏳ everything__trigger-long-running-operation 1/4"),
        "{}",
        progress.text
    );
    assert_eq!(progress.route.expect("route").stream, "group:777");
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    assert!(
        done.task.expect("task").result.contains("completed"),
        "the call finished"
    );
    bed.stop().await;
}
