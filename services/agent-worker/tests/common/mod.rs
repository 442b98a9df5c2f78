//! The worker's test bed: a real task-control (in process, on a database of its own), real
//! workers, and the scripted LLM server, over the real NATS and Postgres.

#![allow(dead_code)]

use std::time::Duration;

use hark_control::{app::App, store::Store};
use hark_core::{bus::Names, config::Config};
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use hark_worker::{llm, scripted::ScriptedLlm, worker::Worker};
use tokio_util::sync::CancellationToken;

pub use hark_testkit::nats_url;

#[derive(Debug)]
pub struct Bed {
    pub config: Config,
    pub llm: ScriptedLlm,
    pub store: Store,
    pub names: Names,
    pub grpc: String,
    pub nats: async_nats::Client,
    /// The workers polling task-control for jobs handed over directly.
    pub parked: std::sync::Arc<hark_control::parked::Parked>,
    /// Removed by [`Bed::stop`], or when this is dropped (a panic too).
    database: hark_testkit::Database,
    namespace: hark_testkit::Namespace,
    control_stop: CancellationToken,
    control: tokio::task::JoinHandle<()>,
    /// Each worker runs on a runtime of its own, so that killing it drops every task it has.
    workers: Vec<(CancellationToken, Option<tokio::runtime::Runtime>)>,
    /// Each worker's tools and MCP servers, by worker index.
    pub tools: Vec<std::sync::Arc<hark_worker::mcp::Hub>>,
}

impl Bed {
    pub async fn start(llm: ScriptedLlm, tweak: impl FnOnce(&mut Config)) -> Self {
        let database = hark_testkit::Database::new();
        let namespace = hark_testkit::Namespace::new();
        let mut config = Config::default();
        config.database.url = database.url().into();
        config.nats.url = nats_url().into();
        config.nats.namespace = namespace.name.clone();
        config.control.grpc_listen = "127.0.0.1:0".parse().expect("addr");
        config.control.http_listen = "127.0.0.1:0".into();
        config.llm.base_url = llm.base_url();
        config.llm.max_retries = 3;
        config.llm.request_timeout = "20s".parse().expect("duration");
        config.worker.concurrency = 2;
        config.chat.language = hark_core::config::ChatLanguage::En;
        tweak(&mut config);
        let app = App::build(config.clone())
            .await
            .expect("task-control builds");
        let grpc = format!("http://{}", app.grpc_addr());
        let store = app.shared().store.clone();
        let names = app.shared().names.clone();
        let parked = app.shared().parked.clone();
        let control_stop = CancellationToken::new();
        let token = control_stop.clone();
        let control = tokio::spawn(async move {
            app.run_until_stopped(token)
                .await
                .expect("task-control runs");
        });
        let nats = async_nats::connect(nats_url()).await.expect("nats");
        Self {
            config,
            llm,
            store,
            names,
            grpc,
            nats,
            parked,
            database,
            namespace,
            control_stop,
            control,
            workers: Vec::new(),
            tools: Vec::new(),
        }
    }

    /// Starts a worker on a runtime of its own; returns its index.
    pub async fn add_worker(&mut self, id: &str) -> usize {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("worker runtime");
        let (config, id) = (self.config.clone(), id.to_owned());
        let stop = CancellationToken::new();
        let token = stop.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let worker = Worker::build(&config, llm::Settings::from_config(&config.llm), id)
                .await
                .expect("worker builds");
            let _ = ready_tx.send(worker.tools());
            worker.run_until_stopped(token).await.expect("worker runs");
        });
        let tools = ready_rx.await.expect("worker started");
        self.workers.push((stop, Some(runtime)));
        self.tools.push(tools);
        self.workers.len() - 1
    }

    /// Kills a worker as abruptly as can be done in one process: its runtime is shut down, so
    /// every task of it is dropped where it stands and it sends nothing more, not even a
    /// heartbeat.
    pub async fn kill_worker(&mut self, index: usize) {
        if let Some(runtime) = self.workers[index].1.take() {
            runtime.shutdown_background();
        }
    }

    pub async fn client(&self) -> TaskServiceClient<tonic::transport::Channel> {
        TaskServiceClient::connect(self.grpc.clone())
            .await
            .expect("gRPC connects")
    }

    pub async fn create(
        &self,
        owner: &str,
        goal: &str,
        tweak: impl FnOnce(&mut pb::CreateTaskRequest),
    ) -> String {
        let mut request = pb::CreateTaskRequest {
            owner: owner.into(),
            goal: goal.into(),
            ..Default::default()
        };
        tweak(&mut request);
        self.client()
            .await
            .create_task(request)
            .await
            .expect("created")
            .into_inner()
            .task
            .expect("task")
            .id
    }

    pub async fn task(&self, id: &str) -> pb::GetTaskResponse {
        self.client()
            .await
            .get_task(pb::GetTaskRequest { task_id: id.into() })
            .await
            .expect("get")
            .into_inner()
    }

    /// Waits until the task is in `state`; returns it.
    pub async fn wait_state(
        &self,
        id: &str,
        state: pb::TaskState,
        wait: Duration,
    ) -> pb::GetTaskResponse {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let got = self.task(id).await;
            if got.task.as_ref().map(|t| t.state) == Some(state as i32) {
                return got;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "task {id} did not reach {state:?} within {wait:?}: {:?}",
                    got.task
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn answer(&self, id: &str, text: &str) {
        self.try_answer(id, text).await.expect("answered");
    }

    /// Answers the open question of task `id`, as a client would; the status when refused.
    pub async fn try_answer(&self, id: &str, text: &str) -> Result<(), tonic::Status> {
        self.client()
            .await
            .answer_question(pb::AnswerQuestionRequest {
                task_id: id.into(),
                answer: text.into(),
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    /// Waits until `count` workers poll task-control.
    pub async fn polling(&self, count: usize, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        while self.parked.len() != count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{count} polling workers expected, {} poll",
                self.parked.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The sequence of the last run job published to the run queue.
    pub async fn run_queue_last_sequence(&self) -> u64 {
        let js = async_nats::jetstream::new(self.nats.clone());
        let mut stream = js
            .get_stream(self.names.task_run_stream())
            .await
            .expect("the run queue exists");
        stream
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence
    }

    pub async fn stop(self) {
        for (stop, runtime) in self.workers {
            stop.cancel();
            if let Some(runtime) = runtime {
                tokio::time::sleep(Duration::from_millis(100)).await;
                runtime.shutdown_background();
            }
        }
        self.control_stop.cancel();
        let _ = self.control.await;
        self.namespace.remove().await;
        self.store.pool().close().await;
        self.database.remove().await;
    }
}

/// The tool results in a recorded request, in order.
pub fn tool_results(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}
