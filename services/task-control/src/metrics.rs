//! What task-control measures. The store counts each move that won ([`Metrics`] is handed the
//! rows of its statements); the tasks by state, the outbox and the consumers' lag are read at
//! scrape time ([`Scraped`]), so they cost nothing between scrapes.

use std::{sync::Arc, time::Duration};

use hark_core::{
    bus::Names,
    domain::{QuestionOutcome, TaskState},
    metrics::{self, Collect, CollectFuture, Counter, Family, Histogram, Labels, Text, labels},
};

/// The label of tasks that no chat started (created over the API).
pub const API: &str = "api";

/// Counts and times of what task-control decides.
#[derive(Debug)]
pub struct Metrics {
    created: Family<Counter>,
    completed: Family<Counter>,
    failed: Family<Counter>,
    cancelled: Family<Counter>,
    asked: Counter,
    closed: Family<Counter>,
    time_to_answer: Histogram,
    resume: Histogram,
    requests: Family<Histogram>,
    run_jobs: Family<Counter>,
    answer_starts: Family<Counter>,
}

/// How a run job reached a worker: handed to a worker's poll, or published to the run queue.
pub const HANDED_OVER: &str = "handed_over";
pub const QUEUED: &str = "queued";

/// Where an answer found the question and the task state it starts from: remembered from this
/// process's own ask, or read from the database.
pub const REMEMBERED: &str = "remembered";
pub const READ: &str = "read";

impl Metrics {
    /// Metrics whose platform label takes the values of `platforms` (the configured ones), `api`
    /// and `other`.
    pub fn new(platforms: impl IntoIterator<Item = String>) -> Self {
        let platforms = Labels::new("platform", platforms.into_iter().chain([API.to_owned()]));
        let by_platform = || Family::counters(platforms.clone());
        Self {
            created: by_platform(),
            completed: by_platform(),
            failed: by_platform(),
            cancelled: by_platform(),
            asked: Counter::default(),
            closed: Family::counters(Labels::new(
                "outcome",
                [
                    QuestionOutcome::Answered,
                    QuestionOutcome::Expired,
                    QuestionOutcome::Cancelled,
                ]
                .map(|o| o.as_str()),
            )),
            time_to_answer: Histogram::new(metrics::PEOPLE),
            resume: Histogram::new(metrics::LATENCY),
            requests: Family::histograms(
                Labels::new(
                    "operation",
                    hark_core::bus::ControlOp::ALL.map(|op| op.as_str()),
                ),
                metrics::LATENCY,
            ),
            run_jobs: Family::counters(Labels::new("path", [HANDED_OVER, QUEUED])),
            answer_starts: Family::counters(Labels::new("source", [REMEMBERED, READ])),
        }
    }

    /// A run job reached a worker by `path` ([`HANDED_OVER`] or [`QUEUED`]).
    pub fn run_job(&self, path: &str) {
        self.run_jobs.of(path).inc();
    }

    /// An answer applied from what `source` ([`REMEMBERED`] or [`READ`]) gave it.
    pub fn answer_start(&self, source: &str) {
        self.answer_starts.of(source).inc();
    }

    /// How many answers were applied from what `source` gave them.
    pub fn answer_starts(&self, source: &str) -> u64 {
        self.answer_starts.of(source).get()
    }

    /// A move of a task on `platform` into `state` won, recorded as `event`.
    pub fn moved(&self, platform: Option<&str>, state: TaskState, event: &str) {
        let platform = platform.unwrap_or(API);
        match (event, state) {
            ("create", _) => self.created.of(platform).inc(),
            ("ask", _) => self.asked.inc(),
            (_, TaskState::Completed) => self.completed.of(platform).inc(),
            (_, TaskState::Failed) => self.failed.of(platform).inc(),
            (_, TaskState::Cancelled) => self.cancelled.of(platform).inc(),
            _ => {}
        }
    }

    /// A question closed as expired or cancelled (answers are counted by [`Metrics::answered`]).
    pub fn closed(&self, outcome: QuestionOutcome) {
        self.closed.of(outcome.as_str()).inc();
    }

    /// A question was answered `waited` after it was asked.
    pub fn answered(&self, waited: Duration) {
        self.closed.of(QuestionOutcome::Answered.as_str()).inc();
        self.time_to_answer.observe_duration(waited);
    }

    /// A task was claimed `since_answer` after its answer committed.
    pub fn resumed(&self, since_answer: Duration) {
        self.resume.observe_duration(since_answer);
    }

    /// A worker request `operation` took `took` to answer.
    pub fn request(&self, operation: &str, took: Duration) {
        self.requests.of(operation).observe_duration(took);
    }

    fn render(&self, out: &mut Text) {
        out.counters(
            "hark_tasks_created_total",
            "Tasks created, by the platform of the chat that started them (api: none).",
            &self.created,
        );
        out.counters(
            "hark_tasks_completed_total",
            "Tasks that completed.",
            &self.completed,
        );
        out.counters(
            "hark_tasks_failed_total",
            "Tasks that failed.",
            &self.failed,
        );
        out.counters(
            "hark_tasks_cancelled_total",
            "Tasks that were cancelled.",
            &self.cancelled,
        );
        out.counter(
            "hark_questions_asked_total",
            "Questions asked of people.",
            &self.asked,
        );
        out.counters(
            "hark_questions_closed_total",
            "Questions closed, by how.",
            &self.closed,
        );
        out.histogram(
            "hark_question_answer_seconds",
            "How long people took to answer, from the question to its answer.",
            &self.time_to_answer,
        );
        out.histogram(
            "hark_resume_seconds",
            "From an answer's commit to the claim that resumes its task.",
            &self.resume,
        );
        out.histograms(
            "hark_control_request_seconds",
            "How long task-control took to answer a worker request.",
            &self.requests,
        );
        out.counters(
            "hark_run_jobs_total",
            "Run jobs relayed: handed to a polling worker, or queued on the run queue.",
            &self.run_jobs,
        );
        out.counters(
            "hark_answer_starts_total",
            "Answers given by question or task id (the API, the console, a subtask's end), by \
             where their question and its task's state came from: remembered from this process's ask, \
             or read from the database.",
            &self.answer_starts,
        );
    }
}

/// What is read at scrape time: the tasks by state, the outbox, and the lag of the consumers
/// task-control and the workers read.
#[derive(Debug)]
pub struct Scraped {
    pub metrics: Arc<Metrics>,
    pub pool: sqlx::PgPool,
    pub js: async_nats::jetstream::Context,
    pub names: Names,
}

impl Scraped {
    async fn tasks_by_state(&self) -> Vec<(String, f64)> {
        let active = [
            TaskState::Pending,
            TaskState::Running,
            TaskState::WaitingInput,
            TaskState::Paused,
        ];
        let counted: Vec<(String, i64)> = sqlx::query_as(
            "SELECT state, count(*) FROM tasks WHERE state = ANY($1) GROUP BY state",
        )
        .bind(active.map(|s| s.as_str()).to_vec())
        .fetch_all(&self.pool)
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, "cannot count the tasks by state for /metrics");
            Vec::new()
        });
        active
            .iter()
            .map(|state| {
                let n = counted
                    .iter()
                    .find(|(s, _)| s == state.as_str())
                    .map_or(0, |(_, n)| *n);
                (labels([("state", state.as_str())]), n as f64)
            })
            .collect()
    }

    async fn outbox(&self) -> (f64, f64) {
        let row: Result<(i64, Option<f64>), _> = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM outbox",
        )
        .fetch_one(&self.pool)
        .await;
        match row {
            Ok((rows, age)) => (rows as f64, age.unwrap_or(0.0)),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the outbox for /metrics");
                (0.0, 0.0)
            }
        }
    }

    async fn consumers(&self) -> Vec<(String, String, f64, f64)> {
        let mut out = Vec::new();
        let run = self
            .names
            .task_run_partitions()
            .into_iter()
            .map(|(stream, _)| (stream, Names::WORKER_CONSUMER));
        let chat_in = self
            .names
            .chat_in_partitions()
            .into_iter()
            .map(|(stream, _)| (stream, Names::CONTROL_CONSUMER));
        for (stream, consumer) in run
            .chain(chat_in)
            .chain([(self.names.chat_receipt_stream(), Names::CONTROL_CONSUMER)])
        {
            let info = async {
                let mut c: async_nats::jetstream::consumer::PullConsumer = self
                    .js
                    .get_consumer_from_stream(consumer, &stream)
                    .await
                    .map_err(|e| e.to_string())?;
                c.info().await.cloned().map_err(|e| e.to_string())
            };
            match tokio::time::timeout(Duration::from_secs(2), info).await {
                Ok(Ok(info)) => out.push((
                    stream,
                    consumer.to_owned(),
                    info.num_pending as f64,
                    info.num_ack_pending as f64,
                )),
                Ok(Err(e)) => tracing::debug!(stream, error = %e, "no consumer info for /metrics"),
                Err(_) => tracing::debug!(stream, "no consumer info within 2s for /metrics"),
            }
        }
        out
    }
}

impl Collect for Scraped {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()> {
        Box::pin(async move {
            self.metrics.render(out);
            out.gauge(
                "hark_tasks",
                "Tasks that have not ended, by state.",
                self.tasks_by_state().await,
            );
            let (rows, age) = self.outbox().await;
            out.gauge(
                "hark_outbox_rows",
                "Outbox messages committed and not yet published.",
                [(String::new(), rows)],
            );
            out.gauge(
                "hark_outbox_oldest_seconds",
                "The age of the oldest unpublished outbox message.",
                [(String::new(), age)],
            );
            let consumers = self.consumers().await;
            let of = |(stream, consumer, _, _): &(String, String, f64, f64)| {
                labels([("stream", stream.as_str()), ("consumer", consumer.as_str())])
            };
            out.gauge(
                "hark_jetstream_pending",
                "Messages of a stream its consumer has not taken yet (the run queue's lag for \
                 the workers' consumer; a waiting task has no message there).",
                consumers.iter().map(|c| (of(c), c.2)),
            );
            out.gauge(
                "hark_jetstream_ack_pending",
                "Messages a consumer took and has not acknowledged yet.",
                consumers.iter().map(|c| (of(c), c.3)),
            );
        })
    }
}
