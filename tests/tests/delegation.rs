//! A question passed on in a QQ group, through the real binary: the person asked mentions
//! someone with `/转交`, the question is asked of them with an @, and their answer resumes the
//! task. task-control is killed right after the delegation commits; started again, it passes
//! the question on once, and the chat message it was sent in, delivered again, changes nothing.

use std::time::Duration;

use hark_core::bus::Names;
use hark_e2e::{Env, bot::Bot};

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "5d2c9a7be41d08c6a5f3e9d27b1c40ab";

#[tokio::test]
async fn killing_task_control_right_after_a_question_is_passed_on_passes_it_on_once() {
    let llm = hark_e2e::booking_llm().await;
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    // QQ's own language, as a group sees it.
    env.set("HARK_CHAT__LANGUAGE", "zh");
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "delegate.after_commit")]);
    let _api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_002, TOKEN).await;

    bot.group_message(5001, 100, "/task new book a room").await;
    bot.expect("the question", WAIT, |s| s.text.contains("Which day?"))
        .await;
    bot.group_message_mentioning(5001, 100, "/转交", &[200])
        .await;
    let status = control
        .exited_within(WAIT)
        .await
        .expect("task-control died right after the delegation committed");
    assert!(!status.success());
    assert_eq!(
        env.sql("SELECT owner FROM questions").await,
        "qq:200",
        "the delegation committed"
    );

    // Started again: the question is asked of the one mentioned, from what the dead process
    // committed, and their answer resumes the task.
    let mut control = env.spawn(&["control"], &[]);
    let asked = bot
        .expect("the question, asked of the one mentioned", WAIT, |s| {
            s.text.contains("转交给了你")
        })
        .await;
    assert_eq!(asked.mentions, ["200"], "{asked:?}");
    assert!(asked.text.contains("Which day?"), "{}", asked.text);
    bot.group_message(5001, 100, "Monday").await;
    bot.group_message_quoting(5001, 200, "Friday", Some(asked.message_id))
        .await;
    let mut seen = Vec::new();
    let done = loop {
        let sent = bot.expect("the result", WAIT, |_| true).await;
        if sent.text.contains("Booked for") {
            break sent;
        }
        seen.push(sent);
    };
    assert!(
        done.text.contains("Booked for Friday."),
        "the answer of the one passed over is not taken: {}",
        done.text
    );

    // The chat message that passed it on comes again once its ack wait lapses, and is settled
    // without passing anything on a second time.
    let consumer = env
        .js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            Names::CONTROL_CONSUMER,
            env.names.chat_in_stream(),
        )
        .await
        .expect("the chat consumer");
    hark_testkit::eventually(
        "the delegation's message redelivered and settled",
        Duration::from_secs(60),
        || {
            let mut consumer = consumer.clone();
            async move {
                let info = consumer.info().await.ok()?;
                // Every message of the stream (numbered from 1, all this test's) was delivered
                // and settled, one of them twice.
                let settled = info.num_ack_pending == 0 && info.num_pending == 0;
                let again = info.delivered.consumer_sequence > info.delivered.stream_sequence;
                (settled && again).then_some(())
            }
        },
    )
    .await;
    seen.extend(bot.drain(Duration::from_millis(500)).await);
    let again: Vec<_> = seen
        .iter()
        .filter(|s| s.text.contains("转交给了你"))
        .collect();
    assert!(again.is_empty(), "asked a second time: {again:?}");
    assert_eq!(
        env.sql("SELECT count(*) FROM transitions WHERE event = 'delegate'")
            .await,
        "1"
    );
    assert_eq!(env.sql("SELECT answerer FROM questions").await, "qq:200");

    for role in [&mut worker, &mut gateway, &mut control] {
        role.stop().await;
    }
    env.cleanup().await;
}
