//! What a worker measures: its model calls as the OpenTelemetry GenAI conventions name them
//! (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`, in Prometheus spelling),
//! failed model calls by status, tool calls by tool, and the liveness of its pull loop, which
//! its `/healthz` reports.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use hark_core::metrics::{
    self, Collect, CollectFuture, Counter, Family, Gauge, Histogram, Labels, Text, labels,
};

/// What a failed model call is counted as.
pub const ERRORS: &[&str] = &[
    "timeout",
    "transport",
    "malformed",
    "400",
    "401",
    "403",
    "404",
    "408",
    "413",
    "429",
    "500",
    "502",
    "503",
    "504",
];

#[derive(Debug)]
pub struct Metrics {
    /// `gen_ai_provider_name`, `gen_ai_request_model` and the operation, on every GenAI sample.
    model: String,
    provider: String,
    calls: Histogram,
    input_tokens: Histogram,
    output_tokens: Histogram,
    errors: Family<Counter>,
    tools: Family<Histogram>,
    /// Runs in flight.
    pub running: Gauge,
    /// When the pull loop last asked for jobs, in Unix milliseconds.
    last_pull_ms: AtomicI64,
}

impl Metrics {
    /// The process's worker metrics, made and registered by the first worker to ask. `model`
    /// and `provider` are those of `llm.*`, the same for every worker of a process.
    pub fn global(model: &str, provider: &str) -> Arc<Metrics> {
        static GLOBAL: std::sync::OnceLock<Arc<Metrics>> = std::sync::OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let metrics = Arc::new(Metrics::new(model, provider));
                hark_core::metrics::Registry::global().register(metrics.clone());
                metrics
            })
            .clone()
    }

    pub fn new(model: &str, provider: &str) -> Self {
        let tools = crate::tools::METRIC_NAMES;
        Self {
            provider: provider.to_owned(),
            model: labels([
                ("gen_ai_operation_name", "chat"),
                ("gen_ai_provider_name", provider),
                ("gen_ai_request_model", model),
            ]),
            calls: Histogram::new(metrics::CALL),
            input_tokens: Histogram::new(metrics::TOKENS),
            output_tokens: Histogram::new(metrics::TOKENS),
            errors: Family::counters(Labels::new("error_type", ERRORS.iter().copied())),
            tools: Family::histograms(Labels::new("gen_ai_tool_name", tools), metrics::CALL),
            running: Gauge::default(),
            last_pull_ms: AtomicI64::new(0),
        }
    }

    /// The provider as `gen_ai.provider.name` gives it: the endpoint's host.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// One model call (one attempt) took `took`; `error` says how it failed, if it did.
    pub fn call(&self, took: Duration, error: Option<&str>) {
        self.calls.observe_duration(took);
        if let Some(error) = error {
            self.errors.of(error).inc();
        }
    }

    /// The tokens a model call reports using.
    pub fn tokens(&self, input: Option<u64>, output: Option<u64>) {
        if let Some(n) = input {
            self.input_tokens.observe(n as f64);
        }
        if let Some(n) = output {
            self.output_tokens.observe(n as f64);
        }
    }

    pub fn tool(&self, tool: &str, took: Duration) {
        self.tools.of(tool).observe_duration(took);
    }

    /// The pull loop is about to ask for jobs.
    pub fn pulling(&self) {
        self.last_pull_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// How long ago the pull loop last asked for jobs; `None` before it first did.
    pub fn since_pull(&self) -> Option<Duration> {
        match self.last_pull_ms.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(
                u64::try_from(now_ms() - at).unwrap_or(0),
            )),
        }
    }
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

impl Collect for Metrics {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()> {
        Box::pin(async move {
            out.histogram_series(
                "gen_ai_client_operation_duration_seconds",
                Some("Duration of model calls, one per attempt."),
                &self.model,
                &self.calls,
            );
            let name = "gen_ai_client_token_usage";
            let input = format!("{},gen_ai_token_type=\"input\"", self.model);
            let output = format!("{},gen_ai_token_type=\"output\"", self.model);
            out.histogram_series(
                name,
                Some("Tokens a model call used, by gen_ai_token_type."),
                &input,
                &self.input_tokens,
            );
            out.histogram_series(name, None, &output, &self.output_tokens);
            out.counters(
                "hark_llm_errors_total",
                "Model calls that failed, by HTTP status or kind (timeout, transport, malformed).",
                &self.errors,
            );
            out.histograms(
                "hark_tool_call_seconds",
                "Duration of tool calls, by tool.",
                &self.tools,
            );
            out.gauge(
                "hark_worker_runs",
                "Runs this process's workers have in flight.",
                [(String::new(), self.running.get() as f64)],
            );
        })
    }
}
