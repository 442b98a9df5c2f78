//! hark when its servers are away: every role waits for them at start and says so, and the
//! gateway keeps every chat message it read on disk until NATS has it — across a kill.

use std::time::Duration;

use futures_util::StreamExt;
use hark_e2e::{
    Env, Process,
    bot::Bot,
    servers::{PrivateNats, PrivatePostgres},
};
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};

const WAIT: Duration = Duration::from_secs(60);
const GROUP: i64 = 777;
const OWNER: i64 = 100;

/// What `hark health <role>` says now: its exit status.
async fn healthy(env: &Env, role: &str) -> bool {
    // The port `hark health` asks, once the role reported it.
    match role {
        "control" => drop(env.grpc_port().await),
        "gateway" => drop(env.gateway_port().await),
        _ => {}
    }
    let mut check = env.spawn(&["health", role], &[]);
    check
        .exited_within(WAIT)
        .await
        .is_some_and(|status| status.success())
}

async fn get(url: &str) -> (u16, serde_json::Value) {
    hark_core::install_crypto();
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth("tok")
        .send()
        .await
        .expect("the gateway answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test]
async fn hark_migrate_waits_for_postgres_and_nats_when_told_to_and_otherwise_fails_naming_the_key()
{
    let postgres = PrivatePostgres::start();
    postgres.crash();
    let mut nats = PrivateNats::start();
    nats.kill();
    let env = Env::on(
        nats.url(),
        format!("postgres://postgres@127.0.0.1:{}", postgres.port),
    )
    .await;

    // Without --wait, a Postgres that does not answer fails it at once, naming the key.
    let mut at_once = env.spawn_named("migrate-at-once", &["migrate"], &[]);
    let status = at_once
        .exited_within(Duration::from_secs(30))
        .await
        .expect("exits");
    assert!(!status.success());
    assert!(
        at_once.output().contains("database.url"),
        "{}",
        at_once.output()
    );

    // With it, it waits for each in turn, saying so, and migrates once they answer.
    let mut waiting = env.spawn_named("migrate-waiting", &["migrate", "--wait", "5m"], &[]);
    waiting
        .wait_for_output("waiting for Postgres at database.url", WAIT)
        .await;
    postgres.start_again();
    waiting
        .wait_for_output("waiting for NATS with JetStream at nats.url", WAIT)
        .await;
    nats.start_again();
    let status = waiting
        .exited_within(Duration::from_secs(60))
        .await
        .expect("exits once both answer");
    assert!(status.success(), "{}", waiting.output());
    assert_ne!(
        env.sql("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .await,
        "0"
    );
    let mut stream = env
        .js
        .get_stream(env.names.task_run_stream())
        .await
        .expect("the run queue was created");
    assert!(stream.info().await.is_ok());

    // A wait that runs out says so.
    postgres.crash();
    let mut short = env.spawn_named("migrate-short", &["migrate", "--wait", "1s"], &[]);
    let status = short
        .exited_within(Duration::from_secs(30))
        .await
        .expect("gives up");
    assert!(!status.success());
    assert!(
        short
            .output()
            .contains("did not answer within 1s (hark migrate --wait)"),
        "{}",
        short.output()
    );
}

#[tokio::test]
async fn every_role_waits_for_postgres_and_nats_at_start_and_says_so() {
    let postgres = PrivatePostgres::start();
    postgres.crash();
    let mut nats = PrivateNats::start();
    nats.kill();
    let llm = ScriptedLlm::with_default(Script::new(vec![Step::say("all up")]))
        .await
        .expect("scripted LLM");
    let mut env = Env::on(
        nats.url(),
        format!("postgres://postgres@127.0.0.1:{}", postgres.port),
    )
    .await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok");
    let mut control = env.spawn(&["control"], &[]);
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);

    control
        .wait_for_output("waiting for Postgres at database.url", WAIT)
        .await;
    worker
        .wait_for_output("waiting for NATS with JetStream at nats.url", WAIT)
        .await;
    // Up, and not ready: the health checks say so instead of the processes exiting.
    assert!(!healthy(&env, "control").await, "control is not ready yet");
    let base = format!("http://127.0.0.1:{}", env.gateway_port().await);
    let (status, _) = get(&format!("{base}/healthz")).await;
    assert_eq!(status, 200, "the gateway is alive");
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    for process in [&mut control, &mut gateway, &mut worker] {
        assert!(
            process
                .exited_within(Duration::from_millis(10))
                .await
                .is_none(),
            "{} gave up",
            process.name
        );
    }

    // The servers come; every role goes on by itself.
    postgres.start_again();
    nats.start_again();
    control.wait_for_output("task-control started", WAIT).await;
    worker.wait_for_output("worker started", WAIT).await;
    let mut ready = false;
    for _ in 0..600 {
        if get(&format!("{base}/readyz")).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the gateway became ready");
    let mut serving = false;
    for _ in 0..100 {
        if healthy(&env, "control").await {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(serving, "control reports serving");
    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:una", "after the outage").await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest { task_id: task.id })
        .await
        .expect("watch")
        .into_inner();
    let mut last = None;
    while let Some(event) = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("events in time")
        .expect("ok")
    {
        last = Some(event.state);
    }
    assert_eq!(last, Some(pb::TaskState::Completed as i32));
    for process in [&mut worker, &mut gateway, &mut control] {
        process.stop().await;
    }
    drop(llm);
    env.cleanup().await;
}

/// An installation on a private nats-server, with a question waiting in the group.
struct Outage {
    env: Env,
    nats: PrivateNats,
    llm: ScriptedLlm,
    control: Process,
    gateway: Process,
    worker: Process,
    bot: Bot,
}

impl Outage {
    async fn start(gateway_vars: &[(&str, &str)]) -> Self {
        let nats = PrivateNats::start();
        let llm = ScriptedLlm::with_default(Script::new(vec![
            Step::ask("Which colour?"),
            Step::say("Painted {answer}."),
        ]))
        .await
        .expect("scripted LLM");
        let mut env = Env::on(nats.url(), hark_e2e::postgres_url()).await;
        env.set("HARK_LLM__BASE_URL", &llm.base_url());
        env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok");
        let control = env.spawn(&["control"], &[]);
        env.client().await;
        let gateway = env.spawn(&["gateway"], gateway_vars);
        let worker = env.spawn(&["worker", "--id", "w1"], &[]);
        let mut bot = Bot::connect(env.gateway_port().await, 42, "tok").await;
        bot.group_message(GROUP, OWNER, "/task new paint the fence")
            .await;
        bot.expect("the question", WAIT, |s| s.text.contains("Which colour?"))
            .await;
        Self {
            env,
            nats,
            llm,
            control,
            gateway,
            worker,
            bot,
        }
    }

    /// How many messages the gateway's spool holds, as /healthz tells a token holder.
    async fn spooled(&self) -> u64 {
        let (_, health) = get(&format!(
            "http://127.0.0.1:{}/healthz",
            self.env.gateway_port().await
        ))
        .await;
        health["spooled"].as_u64().unwrap_or(0)
    }

    async fn until_spooled(&self, count: u64) {
        let what = format!("the spool holds {count} messages");
        hark_e2e::eventually(&what, Duration::from_secs(30), || async {
            (self.spooled().await >= count).then_some(())
        })
        .await
    }

    async fn stop(mut self) {
        for process in [&mut self.worker, &mut self.gateway, &mut self.control] {
            process.stop().await;
        }
        drop(self.llm);
        // While the private nats-server still answers the cleanup.
        self.env.cleanup().await;
        drop(self.nats);
    }
}

#[tokio::test]
async fn a_gateway_killed_while_nats_is_away_loses_none_of_the_messages_it_read() {
    let mut hark = Outage::start(&[]).await;
    hark.nats.kill();
    // The owner answers, and asks for another task, while NATS is away.
    hark.bot.group_message(GROUP, OWNER, "green").await;
    hark.bot
        .group_message(GROUP, OWNER, "/task new sweep the yard")
        .await;
    hark.until_spooled(2).await;
    // The log says where they are, and calls nothing lost.
    let output = hark
        .gateway
        .wait_for_output("kept in the spool", WAIT)
        .await;
    assert!(
        !output.contains("lost"),
        "no message is called lost: {output}"
    );

    // The gateway dies before NATS is back; it starts again after.
    hark.gateway.kill().await;
    hark.nats.start_again();
    hark.gateway = hark.env.spawn(&["gateway"], &[]);
    hark.bot = Bot::connect(hark.env.gateway_port().await, 42, "tok").await;

    let mut posted = Vec::new();
    while !(posted.iter().any(|t: &String| t.contains("Painted green."))
        && posted.iter().any(|t| t.contains("created: sweep the yard")))
    {
        posted.push(
            hark.bot
                .expect("the answer's result and the new task", WAIT, |_| true)
                .await
                .text,
        );
    }
    let resumed = hark
        .llm
        .requests()
        .iter()
        .filter(|r| hark_worker::scripted::last_tool_result(&r.body).as_deref() == Some("green"))
        .count();
    assert_eq!(resumed, 1, "the answer was applied once");
    hark.stop().await;
}

#[tokio::test]
async fn a_gateway_killed_right_after_spooling_or_right_after_publishing_applies_the_message_once()
{
    for failpoint in ["inbound.after_spool:2", "inbound.after_publish:2"] {
        let mut hark = Outage::start(&[("HARK_FAILPOINT", failpoint)]).await;
        // The first message (the task's creation) passed the point; the second, the answer,
        // kills the gateway there.
        hark.bot.group_message(GROUP, OWNER, "blue").await;
        let status = hark
            .gateway
            .exited_within(WAIT)
            .await
            .expect("the gateway dies at the failpoint");
        assert!(!status.success(), "{failpoint}");
        hark.gateway = hark.env.spawn(&["gateway"], &[]);
        hark.bot = Bot::connect(hark.env.gateway_port().await, 42, "tok").await;
        let done = hark
            .bot
            .expect("the result", WAIT, |s| s.text.contains("Painted"))
            .await;
        assert!(
            done.text.contains("Painted blue."),
            "{failpoint}: {}",
            done.text
        );
        let resumed = hark
            .llm
            .requests()
            .iter()
            .filter(|r| hark_worker::scripted::last_tool_result(&r.body).as_deref() == Some("blue"))
            .count();
        assert_eq!(resumed, 1, "{failpoint}: the answer was applied once");
        hark.stop().await;
    }
}

#[tokio::test]
async fn the_http_adapter_accepts_only_what_jetstream_has() {
    let mut nats = PrivateNats::start();
    let mut env = Env::on(nats.url(), hark_e2e::postgres_url()).await;
    env.set("HARK_GATEWAY__HTTP__PLATFORMS", "myapp");
    env.set("HARK_GATEWAY__HTTP__BOTS", "myapp:main");
    let mut gateway = env.spawn(&["gateway"], &[]);
    gateway.wait_for_output("gateway started", WAIT).await;
    let url = format!(
        "http://127.0.0.1:{}/api/v1/messages",
        env.gateway_port().await
    );
    let post = |id: &'static str| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(&url)
                .json(&serde_json::json!({"platform": "myapp", "bot_id": "main",
                    "stream": "private:u1", "sender": {"user_id": "u1"}, "text": "hi",
                    "message_id": id}))
                .send()
                .await
                .expect("the gateway answers")
        }
    };
    hark_core::install_crypto();
    let mut accepted = false;
    for _ in 0..600 {
        if post("m0").await.status().as_u16() == 202 {
            accepted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(accepted, "the adapter takes messages while NATS answers");
    nats.kill();
    let refused = post("m1").await;
    assert_eq!(refused.status().as_u16(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    nats.start_again();
    let mut again = false;
    for _ in 0..600 {
        if post("m1").await.status().as_u16() == 202 {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again, "the same message is taken once NATS is back");
    gateway.stop().await;
    env.cleanup().await;
    drop(nats);
}

#[tokio::test]
async fn a_resume_token_from_before_a_nats_restart_is_refused_not_misread() {
    let mut nats = PrivateNats::start();
    let env = Env::on(nats.url(), hark_e2e::postgres_url()).await;
    let mut control = env.spawn(&["control"], &[]);
    let mut api = env.client().await;
    let watch = |api: &mut hark_proto::v1::task_service_client::TaskServiceClient<_>,
                 token: &str| {
        let mut api = api.clone();
        let request = pb::WatchTasksRequest {
            owner: "api:erin".into(),
            resume_token: token.into(),
            ..Default::default()
        };
        async move { api.watch_tasks(request).await }
    };
    let create = |api: &mut hark_proto::v1::task_service_client::TaskServiceClient<_>| {
        let mut api = api.clone();
        async move {
            api.create_task(pb::CreateTaskRequest {
                owner: "api:erin".into(),
                goal: "wait".into(),
                ..Default::default()
            })
            .await
            .expect("created")
        }
    };
    let mut events = watch(&mut api, "").await.expect("watch").into_inner();
    create(&mut api).await;
    let first = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("an event")
        .expect("open")
        .expect("ok");

    // NATS restarts: the events it kept in memory are gone, and its sequence starts again.
    nats.kill();
    nats.start_again();
    // A stream open across the restart does not go quiet: it ends, saying to watch again.
    let ended = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("the open stream ends instead of going quiet")
        .expect("it ends with a status");
    let err = ended.expect_err("no event: the stream lost its events");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert!(err.message().contains("watch again"), "{err}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut again = loop {
        match watch(&mut api, "").await {
            Ok(events) => break events.into_inner(),
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no watch after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // More events than before, so the old token's sequence exists again.
    for _ in 0..3 {
        create(&mut api).await;
        tokio::time::timeout(WAIT, again.next())
            .await
            .expect("an event after the restart")
            .expect("open")
            .expect("ok");
    }
    let err = watch(&mut api, &first.resume_token)
        .await
        .expect_err("the old token must not resume somewhere else");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    control.stop().await;
    env.cleanup().await;
}
