//! Questions put to more than one person in a QQ group, through the real binary.
//!
//! Escalated: the agent asks the owner and names whom to ask next; nobody answers in time, so
//! the next person is asked in their private chat. task-control is killed right after the
//! escalation commits; started again, it asks them once, their answer resumes the task, and the
//! owner is told it was answered.
//!
//! Put to two people at once, needing both: task-control is killed right after the first answer
//! is kept; started again, that answer (delivered again) counts once, and the second resumes the
//! task with both.

use std::time::Duration;

use hark_e2e::{Env, bot::Bot};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "7c41e0b2d95f4a6e8b3d1c7a0e2f9b54";

#[tokio::test]
async fn killing_task_control_right_after_an_escalation_asks_the_next_person_once() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            json!({"question": "Which day?", "escalate_to": ["200", "qq:300"], "escalate_after_s": 3600}),
        ),
        Step::say("Booked for {answer}."),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "escalate.after_commit")]);
    let _api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_004, TOKEN).await;

    bot.group_message(5003, 100, "/task new book a room").await;
    bot.expect("the question", WAIT, |s| {
        s.text.contains("Which day?") && s.stream == "group:5003"
    })
    .await;
    assert_eq!(
        env.sql("SELECT array_to_string(escalate_to, ',') FROM questions")
            .await,
        "qq:200,qq:300"
    );
    // An hour later, as far as the question knows.
    env.sql("UPDATE questions SET escalate_at = now() - interval '1 second'")
        .await;
    let status = control
        .exited_within(WAIT)
        .await
        .expect("task-control died right after the escalation committed");
    assert!(!status.success());
    assert_eq!(
        env.sql("SELECT string_agg(owner || ' ' || outcome, ',' ORDER BY asked_at) FROM questions")
            .await,
        "qq:100 open,qq:200 open",
        "the escalation committed"
    );

    // Started again: qq:200 is asked in private, from what the dead process committed.
    let mut control = env.spawn(&["control"], &[]);
    let asked = bot
        .expect("the question, asked of qq:200", WAIT, |s| {
            s.stream == "private:200"
        })
        .await;
    assert!(asked.text.contains("Which day?"), "{}", asked.text);
    assert!(
        asked.text.contains("qq:100 has not answered"),
        "{}",
        asked.text
    );
    bot.private_message(200, "Friday").await;
    let mut seen = Vec::new();
    loop {
        let sent = bot.expect("the result", WAIT, |_| true).await;
        let done = sent.text.contains("Booked for Friday");
        seen.push(sent);
        if done && seen.iter().any(|s| s.text.contains("answered by qq:200")) {
            break;
        }
    }
    seen.extend(bot.drain(Duration::from_millis(500)).await);
    let told = seen
        .iter()
        .find(|s| s.text.contains("answered by qq:200"))
        .expect("the owner told");
    assert_eq!(told.stream, "group:5003");
    assert_eq!(
        seen.iter()
            .filter(|s| s.stream == "private:200" && s.text.contains("Which day?"))
            .count(),
        0,
        "asked twice: {seen:?}"
    );
    assert_eq!(
        env.sql("SELECT count(*) FROM transitions WHERE event = 'escalate'")
            .await,
        "1"
    );
    assert_eq!(
        env.sql("SELECT string_agg(owner || ' ' || outcome || ' ' || coalesce(answerer, '-'), ',' ORDER BY asked_at) FROM questions")
            .await,
        "qq:100 superseded -,qq:200 answered qq:200"
    );
    assert_eq!(env.sql("SELECT state FROM tasks").await, "completed");

    for role in [&mut worker, &mut gateway, &mut control] {
        role.stop().await;
    }
    env.cleanup().await;
}

#[tokio::test]
async fn killing_task_control_right_after_one_of_two_needed_answers_counts_it_once() {
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::call(
            "ask_user",
            json!({"question": "Which day?", "ask_to": ["200", "300"], "need": "all"}),
        ),
        Step::say("Booked: {answer}"),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", TOKEN);
    let mut control = env.spawn(&["control"], &[("HARK_FAILPOINT", "collect.after_commit")]);
    let _api = env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 3_889_005, TOKEN).await;

    bot.group_message(5004, 100, "/task new book a room").await;
    let mut mentioned = Vec::new();
    for _ in 0..2 {
        let asked = bot
            .expect("the question", WAIT, |s| s.text.contains("Which day?"))
            .await;
        assert_eq!(asked.stream, "group:5004");
        mentioned.extend(asked.mentions);
    }
    mentioned.sort();
    assert_eq!(mentioned, ["200", "300"]);
    bot.group_message(5004, 200, "Friday").await;
    let status = control
        .exited_within(WAIT)
        .await
        .expect("task-control died right after the first answer was kept");
    assert!(!status.success());
    assert_eq!(
        env.sql("SELECT string_agg(owner || ' ' || outcome, ',' ORDER BY owner) FROM questions")
            .await,
        "qq:200 answered,qq:300 open",
        "the first answer committed"
    );

    // Started again: the first answer, delivered again, changes nothing; the second resumes
    // the task with both.
    let mut control = env.spawn(&["control"], &[]);
    let _api = env.client().await;
    bot.group_message(5004, 300, "Saturday").await;
    let done = bot
        .expect("the result", WAIT, |s| s.text.contains("Booked:"))
        .await;
    for part in ["qq:200", "Friday", "qq:300", "Saturday"] {
        assert!(done.text.contains(part), "{part} missing: {}", done.text);
    }
    let rest = bot.drain(Duration::from_millis(500)).await;
    assert!(
        rest.iter().all(|s| !s.text.contains("Booked:")),
        "resumed twice: {rest:?}"
    );
    assert_eq!(
        env.sql(
            "SELECT (SELECT count(*) FROM transitions WHERE event = 'collect') || ' ' || \
             (SELECT count(*) FROM transitions WHERE event = 'answer')"
        )
        .await,
        "1 1"
    );
    assert_eq!(env.sql("SELECT state FROM tasks").await, "completed");

    for role in [&mut worker, &mut gateway, &mut control] {
        role.stop().await;
    }
    env.cleanup().await;
}
