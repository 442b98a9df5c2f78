//! MCP tools met in a QQ group, across real processes: an approval and a server's input request
//! (`@modelcontextprotocol/server-everything` over stdio) asked and answered in the chat.

use std::path::PathBuf;

use hark_e2e::chat::{Hark, OWNER, WAIT};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, Step};

/// A config file with the server, whose `echo` needs approval.
fn config_with_everything() -> PathBuf {
    let server = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        server.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp` (as .ci/run does)",
        server.display()
    );
    let path = std::env::temp_dir().join(format!("hark-mcp-{}.toml", uuid::Uuid::new_v4()));
    let toml = format!(
        "[[tools.mcp]]\nname = \"everything\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\napproval = [\"echo\"]\n",
        server.display().to_string()
    );
    std::fs::write(&path, toml).expect("config written");
    path
}

#[tokio::test]
async fn an_approval_and_a_server_s_form_are_answered_in_the_group() {
    let config = config_with_everything();
    let mut hark = Hark::start(
        vec![
            Step::call(
                "everything__echo",
                serde_json::json!({"message": "ship it"}),
            ),
            Step::say("{answer}"),
        ],
        &[("HARK_CONFIG", &config.display().to_string())],
        &["w1"],
    )
    .await;
    hark.llm.set_script(
        "form",
        Script::new(vec![
            Step::call(
                "everything__trigger-elicitation-request",
                serde_json::json!({}),
            ),
            Step::say("{answer}"),
        ]),
    );

    // The approval: asked in the group with numbered choices, approved with "1".
    let short = hark.new_task("echo something").await;
    let asked = hark
        .bot
        .expect("the approval", WAIT, |s| {
            s.text.contains("Run `everything__echo`")
        })
        .await;
    assert!(
        asked.text.contains("message=ship it")
            && asked
                .text
                .contains("1) approve  2) deny  3) approve for the rest of this task"),
        "{}",
        asked.text
    );
    hark.say(OWNER, "1").await;
    let done = hark
        .bot
        .expect("the result", WAIT, |s| s.text.contains("Echo: ship it"))
        .await;
    assert!(done.text.contains("Echo: ship it"), "{}", done.text);
    assert_eq!(
        hark.task(&short).await.state,
        pb::TaskState::Completed as i32
    );

    // The server's input request: a form in the group, a misfit hinted at, then answered.
    let short = hark.new_task("[script:form] fill it in").await;
    let form = hark
        .bot
        .expect("the form", WAIT, |s| {
            s.text
                .contains("`everything__trigger-elicitation-request`: Please provide inputs")
        })
        .await;
    assert!(
        form.text.contains("name (String): <text>")
            && form.text.contains("(reply one `field: value` per line)"),
        "{}",
        form.text
    );
    hark.say(OWNER, "integer: many").await;
    let hint = hark
        .bot
        .expect("a hint", WAIT, |s| s.text.contains("does not fit"))
        .await;
    assert!(
        hint.text.contains("`integer` must be a whole number"),
        "{}",
        hint.text
    );
    hark.say(OWNER, "name: Ada Lovelace\ncheck: yes\ninteger: 7")
        .await;
    let done = hark
        .bot
        .expect("the server's answer", WAIT, |s| {
            s.text.contains("Name: Ada Lovelace")
        })
        .await;
    assert!(
        done.text.contains("- Agreed to terms: true")
            && done.text.contains("- Favorite Integer: 7"),
        "{}",
        done.text
    );
    assert_eq!(
        hark.task(&short).await.state,
        pb::TaskState::Completed as i32
    );
    hark.stop().await;
    let _ = std::fs::remove_file(config);
}
