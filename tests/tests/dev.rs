//! `hark dev` on a machine where nothing answers at `database.url` or `nats.url`: it starts a
//! private Postgres (the distribution's `initdb`/`pg_ctl`) and `nats-server` under its data
//! directory, stops them when it exits, and finds its tasks there again the next time.

use std::time::Duration;

use hark_e2e::{Env, free_port};
use hark_proto::v1 as pb;

/// initdb and a first start of Postgres take a while on a loaded machine.
const START: Duration = Duration::from_secs(180);

async fn answers(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// Waits until nothing answers on `port` any more.
async fn closed(port: u16) -> bool {
    for _ in 0..200 {
        if !answers(port).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn hark_dev_starts_private_servers_where_none_answer_and_keeps_their_data() {
    let pg_port = free_port();
    let nats_port = free_port();
    let data = std::env::temp_dir().join(format!("hark-dev-{}", uuid::Uuid::new_v4().simple()));
    let env = Env::new().await;
    let database = format!("postgres://postgres@127.0.0.1:{pg_port}/hark");
    let nats = format!("nats://127.0.0.1:{nats_port}");
    let data_dir = data.display().to_string();
    let vars = [
        ("HARK_DATABASE__URL", database.as_str()),
        ("HARK_NATS__URL", nats.as_str()),
        // The built-in demo model: no llm.base_url.
        ("HARK_LLM__BASE_URL", ""),
    ];
    let args = ["dev", "--workers", "1", "--data-dir", &data_dir];

    let mut dev = env.spawn_named("dev-1", &args, &vars);
    let banner = dev.wait_for_output("hark dev is up", START).await;
    assert!(
        banner.contains(&format!(
            "started:                  Postgres on 127.0.0.1:{pg_port}"
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!(
            "started:                  nats-server with JetStream on 127.0.0.1:{nats_port}"
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("data:                     {data_dir}")),
        "{banner}"
    );
    assert!(banner.contains("web console:"), "{banner}");
    assert!(data.join("postgres/PG_VERSION").exists());

    let mut api = env.client().await;
    let task = hark_e2e::new_task(&mut api, "api:me", "say hello").await;
    let asking = tokio::time::Instant::now() + START;
    let question = loop {
        assert!(
            tokio::time::Instant::now() < asking,
            "the demo model asked nothing:\n{}",
            dev.output()
        );
        let got = api
            .get_task(pb::GetTaskRequest {
                task_id: task.id.clone(),
            })
            .await
            .expect("get task")
            .into_inner();
        if let Some(q) = got.task.and_then(|t| t.open_question) {
            break q;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        question.text.contains("What should I call you?"),
        "{}",
        question.text
    );

    // It stops its servers when it stops.
    let status = dev.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", dev.output());
    assert!(closed(pg_port).await, "the private Postgres stopped");
    assert!(closed(nats_port).await, "the private nats-server stopped");

    // The next time, the task is still there, waiting; answered, it completes.
    let mut again = env.spawn_named("dev-2", &args, &vars);
    again.wait_for_output("hark dev is up", START).await;
    let mut api = env.client().await;
    let answered = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.id.clone(),
            answer: "Ada".into(),
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            wait_timeout_ms: 60_000,
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner();
    let event = answered.event.expect("the task ended in time");
    assert_eq!(event.state, pb::TaskState::Completed as i32, "{event:?}");
    assert!(event.result.contains("Ada"), "{}", event.result);
    let status = again.stop().await.expect("hark dev stops");
    assert!(status.success(), "{}", again.output());
    assert!(closed(pg_port).await && closed(nats_port).await);

    let _ = std::fs::remove_dir_all(&data);
    env.cleanup().await;
}
