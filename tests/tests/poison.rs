//! One bad input does not stop hark, tried from outside with the real binary: a chat command
//! whose time overflows and a message on the bus that no one can read are refused or set aside,
//! the next ordinary message is served, and `hark health --dead-letters` shows what was set
//! aside and why.

use std::time::Duration;

use hark_e2e::{Env, bot::Bot};

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "3f9c2a7be41d08c6a5f3e9d27b1c40aa";

#[tokio::test]
async fn a_poison_command_and_an_unreadable_message_stop_nothing_and_are_shown() {
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    let mut control = env.spawn(&["control"], &[]);
    let _api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_001, TOKEN).await;

    // The command that once panicked task-control's chat consumer: a clear refusal instead.
    bot.group_message(5001, 100, "/task new --in 70000000h x")
        .await;
    let refused = bot.expect("a refusal", WAIT, |_| true).await;
    assert!(
        refused.text.contains("longer than the limit"),
        "{}",
        refused.text
    );

    // Bytes on CHAT_IN that are no chat message at all.
    hark_core::publish::publish(
        &env.js,
        hark_core::publish::Outgoing {
            subject: env.names.chat_in("qq").expect("subject"),
            msg_id: "poison-1",
            payload: bytes::Bytes::from_static(b"\xff\x00 not a chat message"),
            trace: None,
        },
    )
    .await
    .expect("published");

    // The next ordinary message is served, end to end.
    hark_e2e::book_a_room(&mut bot, 5001, 100).await;

    // What was set aside is shown, with its reason; listing it is not a failure.
    let deadline = tokio::time::Instant::now() + WAIT;
    env.grpc_port().await;
    let listed = loop {
        let mut health = env.spawn(&["health", "--dead-letters"], &[]);
        let status = health.exited_within(WAIT).await.expect("hark health ends");
        let output = health.output();
        assert!(status.success(), "{output}");
        if output.contains("1 dead letter ") {
            break output;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unreadable message was not set aside: {output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(listed.contains("chat_in: "), "{listed}");
    assert!(listed.contains("message id poison-1"), "{listed}");
    assert!(listed.contains("invalid"), "{listed}");
    let mut check = env.spawn(&["health", "control"], &[]);
    assert!(
        check.exited_within(WAIT).await.expect("ends").success(),
        "task-control still serves: {}",
        check.output()
    );

    for process in [&mut worker, &mut gateway, &mut control] {
        process.stop().await;
    }
    env.cleanup().await;
}
