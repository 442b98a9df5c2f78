//! `/metrics` of each role, scraped from separate `hark control`, `hark gateway` and
//! `hark worker` processes and parsed with a Prometheus text-format parser, moves as tasks move:
//! asked, answered, resumed, completed, failed. The worker's `/healthz` answers for its loop.

use std::time::Duration;

use hark_e2e::{Env, Process, bot::Bot, closed_port};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use prometheus_parse::{Scrape, Value};

const WAIT: Duration = Duration::from_secs(30);
const GROUP: i64 = 777;
const OWNER: i64 = 100;

/// The answer to a GET of `url`, once something listens there (a role binds its metrics listener
/// as it starts).
async fn answer(url: &str, token: Option<&str>) -> reqwest::Response {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(response) => return response,
            Err(e) if e.is_connect() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{url}: {e}"),
        }
    }
}

/// One scrape, parsed.
struct Metrics(Scrape);

impl Metrics {
    async fn of(url: &str, token: Option<&str>) -> Self {
        let response = answer(url, token).await;
        assert_eq!(response.status(), 200, "{url}");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        let text = response.text().await.expect("text");
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        Self(Scrape::parse(lines).expect("the Prometheus text format"))
    }

    /// The value of `name` with `labels` (a counter's or gauge's value, a histogram's count);
    /// `None` when no such sample exists.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let sample = self.0.samples.iter().find(|s| {
            s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })?;
        Some(match &sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            Value::Summary(_) => panic!("{name} is not a summary"),
        })
    }

    fn at(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    }
}

struct Hark {
    env: Env,
    llm: ScriptedLlm,
    control: Process,
    gateway: Process,
    worker: Process,
    bot: Bot,
    control_metrics: String,
    worker_metrics: String,
}

impl Hark {
    async fn start() -> Self {
        hark_core::install_crypto();
        let llm = ScriptedLlm::with_default(Script::new(vec![
            Step::ask("Which city?"),
            Step::say("The weather in {answer} is sunny."),
        ]))
        .await
        .expect("scripted LLM");
        llm.set_script(
            "broken",
            Script::new(vec![Step::say("never said").failing_first(&[400])]),
        );
        let mut env = Env::new().await;
        env.set("HARK_LLM__BASE_URL", &llm.base_url());
        env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok");
        let control = env.spawn(&["control"], &[("HARK_METRICS__LISTEN", "127.0.0.1:0")]);
        env.client().await;
        let gateway = env.spawn(&["gateway"], &[("HARK_METRICS__TOKEN", "scrape-token")]);
        let worker = env.spawn(
            &["worker", "--id", "w1"],
            &[("HARK_METRICS__LISTEN", "127.0.0.1:0")],
        );
        let bot = Bot::connect(env.gateway_port().await, 42, "tok").await;
        let control_metrics = control.addr("metrics.listen").await;
        let worker_metrics = worker.addr("metrics.listen").await;
        Self {
            control_metrics: format!("http://{control_metrics}/metrics"),
            worker_metrics: format!("http://{worker_metrics}"),
            env,
            llm,
            control,
            gateway,
            worker,
            bot,
        }
    }

    async fn control(&self) -> Metrics {
        Metrics::of(&self.control_metrics, None).await
    }

    async fn gateway(&self) -> Metrics {
        let url = format!("http://127.0.0.1:{}/metrics", self.env.gateway_port().await);
        Metrics::of(&url, Some("scrape-token")).await
    }

    async fn worker(&self) -> Metrics {
        Metrics::of(&format!("{}/metrics", self.worker_metrics), None).await
    }

    /// Scrapes `scrape` until `holds` is true of it.
    async fn until<F, Fut>(
        &self,
        what: &str,
        scrape: F,
        holds: impl Fn(&Metrics) -> bool,
    ) -> Metrics
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Metrics>,
    {
        hark_e2e::eventually(what, WAIT, || async {
            let metrics = scrape().await;
            holds(&metrics).then_some(metrics)
        })
        .await
    }

    async fn stop(mut self) {
        self.worker.stop().await;
        self.gateway.stop().await;
        self.control.stop().await;
        drop(self.llm);
        self.env.cleanup().await;
    }
}

#[tokio::test]
async fn each_roles_metrics_move_as_a_task_asks_is_answered_completes_and_another_fails() {
    let mut hark = Hark::start().await;
    let qq = [("platform", "qq")];

    // The worker's health answers once its loop pulls and task-control answers it.
    let health_url = format!("{}/healthz", hark.worker_metrics);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = answer(&health_url, None).await;
        if response.status() == 200 {
            let body: serde_json::Value = response.json().await.expect("json");
            assert_eq!(body["status"], "ok", "{body}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never got healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // `hark health worker` asks that listener, as a probe would.
    let listen = hark.worker_metrics.trim_start_matches("http://").to_owned();
    let mut probe = hark
        .env
        .spawn(&["health", "worker"], &[("HARK_METRICS__LISTEN", &listen)]);
    let status = probe.exited_within(WAIT).await.expect("the probe ends");
    assert!(status.success(), "{}", probe.output());
    let nowhere = format!("127.0.0.1:{}", closed_port());
    let mut probe = hark
        .env
        .spawn(&["health", "worker"], &[("HARK_METRICS__LISTEN", &nowhere)]);
    let status = probe.exited_within(WAIT).await.expect("the probe ends");
    assert!(!status.success(), "no worker listens at {nowhere}");
    assert!(
        probe.output().contains("does not answer"),
        "{}",
        probe.output()
    );

    let before = hark.control().await;
    assert_eq!(before.at("hark_tasks_created_total", &qq), 0.0);
    assert_eq!(before.at("hark_tasks", &[("state", "waiting_input")]), 0.0);
    // Tokens are refused to strangers wherever a token is set.
    let url = format!("http://127.0.0.1:{}/metrics", hark.env.gateway_port().await);
    let refused = answer(&url, None).await;
    assert_eq!(refused.status(), 401);
    // Nor does a bot's token read them.
    let refused = answer(&url, Some("tok")).await;
    assert_eq!(refused.status(), 401);

    hark.bot
        .group_message(GROUP, OWNER, "/task new check the weather")
        .await;
    let question = hark
        .bot
        .expect("the question", WAIT, |s| s.text.contains("Which city?"))
        .await;
    let asked = hark
        .until(
            "the question is counted",
            || hark.control(),
            |m| m.at("hark_questions_asked_total", &[]) == 1.0,
        )
        .await;
    assert_eq!(asked.at("hark_tasks_created_total", &qq), 1.0);
    assert_eq!(asked.at("hark_tasks", &[("state", "waiting_input")]), 1.0);
    assert!(
        asked.at(
            "hark_control_request_seconds_count",
            &[("operation", "claim")]
        ) >= 1.0
    );
    assert!(
        asked.at(
            "hark_control_request_seconds_count",
            &[("operation", "ask")]
        ) >= 1.0
    );
    assert!(
        asked
            .value("hark_jetstream_pending", &[("consumer", "workers")])
            .is_some(),
        "the run queue's lag is shown"
    );
    let gateway = hark.gateway().await;
    assert_eq!(gateway.at("hark_gateway_bots", &qq), 1.0);
    assert!(gateway.at("hark_gateway_inbound_messages_total", &qq) >= 1.0);
    assert!(gateway.at("hark_gateway_outbound_messages_total", &qq) >= 2.0);
    let worker = hark.worker().await;
    let model_calls = worker.at(
        "gen_ai_client_operation_duration_seconds_count",
        &[("gen_ai_operation_name", "chat")],
    );
    assert!(model_calls >= 1.0, "{model_calls}");
    assert!(
        worker.at(
            "gen_ai_client_token_usage_count",
            &[("gen_ai_token_type", "input")]
        ) >= 1.0
    );

    // The owner answers by quoting the question: answered, resumed, completed.
    hark.bot
        .group_message_quoting(GROUP, OWNER, "Paris", Some(question.message_id))
        .await;
    hark.bot
        .expect("the result", WAIT, |s| s.text.contains("sunny"))
        .await;
    let done = hark
        .until(
            "the completion is counted",
            || hark.control(),
            |m| m.at("hark_tasks_completed_total", &qq) == 1.0,
        )
        .await;
    assert_eq!(
        done.at("hark_questions_closed_total", &[("outcome", "answered")]),
        1.0
    );
    assert_eq!(done.at("hark_question_answer_seconds_count", &[]), 1.0);
    assert_eq!(done.at("hark_resume_seconds_count", &[]), 1.0);
    // Its start and its resume each reached the worker: handed to its poll or queued.
    let relayed = done.at("hark_run_jobs_total", &[("path", "handed_over")])
        + done.at("hark_run_jobs_total", &[("path", "queued")]);
    assert_eq!(relayed, 2.0);
    assert_eq!(done.at("hark_tasks", &[("state", "waiting_input")]), 0.0);
    assert_eq!(done.at("hark_tasks_failed_total", &qq), 0.0);

    // A task whose model refuses the request fails, and the worker says why.
    hark.bot
        .group_message(GROUP, OWNER, "/task new [script:broken] do something")
        .await;
    hark.until(
        "the failure is counted",
        || hark.control(),
        |m| m.at("hark_tasks_failed_total", &qq) == 1.0,
    )
    .await;
    let worker = hark
        .until(
            "the model's refusal is counted",
            || hark.worker(),
            |m| m.at("hark_llm_errors_total", &[("error_type", "400")]) == 1.0,
        )
        .await;
    assert!(
        worker.at("gen_ai_client_operation_duration_seconds_count", &[]) > model_calls,
        "every attempt is timed"
    );

    // Every metric the Grafana dashboard queries is one a role serves.
    let served: std::collections::BTreeSet<String> =
        [hark.control().await, hark.gateway().await, worker]
            .iter()
            .flat_map(|m| m.0.samples.iter().map(|s| s.metric.clone()))
            .collect();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/grafana/dashboards/hark.json"),
        )
        .expect("dashboard"),
    )
    .expect("JSON");
    let mut queried = 0;
    for target in dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
    {
        let expr = target["expr"].as_str().expect("expr");
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("hark_") || w.starts_with("gen_ai_client"))
        {
            queried += 1;
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                served.contains(name) || served.contains(base),
                "the dashboard queries {name}, which no role serves"
            );
        }
    }
    assert!(queried >= 20, "{queried}");
    hark.stop().await;
}
