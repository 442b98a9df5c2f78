//! `hark bench`: measures resume latency (W1), mass suspend and resume (W2), and what Postgres and
//! JetStream allow on this machine (the limits), against a running hark whose workers call the
//! bench's scripted LLM, which answers at once.
//!
//! By default the bench starts that hark itself, as separate `hark control`, `hark gateway` and
//! `hark worker` processes on a fresh database and NATS namespace, so that each process's memory
//! can be read. With `--external` it measures a hark you started, whose `llm.base_url` must point
//! at `--llm-listen`.

mod client;
mod floor;
mod hub;
mod limits;
mod observe;
mod procs;
mod storage;
mod w1;
mod w2;
mod watchers;

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use clap::Args;
use hark_core::{bus::Names, config::Config};
use hark_proto::v1::task_service_client::TaskServiceClient;
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Measure a hark that is already running (its llm.base_url must be http://<llm-listen>/v1,
    /// and task.max_active_per_owner = 0, since one owner has every W2 task) instead of starting
    /// one.
    #[arg(long)]
    external: bool,
    /// Where the bench's scripted LLM listens.
    #[arg(long, default_value = "127.0.0.1:18080")]
    llm_listen: SocketAddr,
    /// Workers to start (without --external).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// task-control replicas to start (without --external). The clients call the first, as an
    /// app's connection stays with one replica; workers' requests are shared by all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    controls: u32,
    /// Slots per worker (without --external).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    worker_concurrency: u32,
    /// Measured W1 rounds, after the warm-up rounds.
    #[arg(long, default_value_t = 200, value_parser = at_least_one)]
    rounds: usize,
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Tasks in W2.
    #[arg(long, default_value_t = 2000, value_parser = at_least_one)]
    tasks: usize,
    /// Requests in flight while W2 creates and answers tasks.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    in_flight: usize,
    /// Measure as a client does, over the public API only: answer → output received, for a
    /// questionnaire and an agent task side by side (workloads limits,w1-floor,w1-client,w2-client).
    #[arg(long)]
    client: bool,
    /// How long the client thinks between seeing a question and answering it, in milliseconds
    /// (--client workloads).
    #[arg(long, default_value_t = 100)]
    think_ms: u64,
    /// Also drive the --client workloads through Python's official grpcio, with this
    /// interpreter (a venv with bench/python/requirements.txt), side by side with the Rust client.
    #[arg(long)]
    python: Option<std::path::PathBuf>,
    /// Everything observable on, to measure what it costs: every span exported (sampler 1.0) to
    /// an OTLP sink the bench runs, and every role's `/metrics` scraped once a second.
    #[arg(long)]
    observe: bool,
    /// Which workloads to run, in order [default: limits,w1-grpc,w1-onebot,w2; with --client
    /// limits,w1-floor,w1-client,w2-client].
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = ["limits", "w1-grpc", "w1-onebot", "w2", "w1-floor", "w1-client", "w2-client", "watchers"]
    )]
    workloads: Option<Vec<String>>,
    /// Which task kinds the --client workloads drive, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "questionnaire,agent",
        value_parser = ["questionnaire", "agent"]
    )]
    kinds: Vec<String>,
    /// Streams the watchers workload holds open at once, half `WatchTask`, half `WatchTasks`
    /// (without --external, task-control is started to serve that many).
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one)]
    watchers: usize,
}

impl BenchArgs {
    fn workloads(&self) -> Vec<String> {
        let default: &[&str] = if self.client {
            &["limits", "w1-floor", "w1-client", "w2-client"]
        } else {
            &["limits", "w1-grpc", "w1-onebot", "w2"]
        };
        self.workloads
            .clone()
            .unwrap_or_else(|| default.iter().map(|w| (*w).to_owned()).collect())
    }
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// What every workload needs.
pub struct Bench {
    pub config: Config,
    pub names: Names,
    pub api: TaskServiceClient<Channel>,
    pub nats: async_nats::Client,
    /// The scripted LLM the workers call; it stops when dropped.
    pub llm: ScriptedLlm,
    pub events: hub::EventHub,
    pub arrivals: hub::ArrivalHub,
    pub procs: procs::Processes,
}

/// One finished measurement: a JSON line and a row of the table.
#[derive(Debug, Clone)]
pub struct Report {
    pub json: Value,
    pub rows: Vec<(String, String, String)>,
}

/// The scripts: W1 and W2 tasks ask at once, then finish as soon as they have the answer.
fn scripts() -> std::collections::BTreeMap<String, Script> {
    let ask_then_finish = Script::new(vec![Step::ask("Go on?"), Step::say("done: {answer}")]);
    [
        ("w1", ask_then_finish.clone()),
        ("w2", ask_then_finish.clone()),
        ("default", ask_then_finish),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs the chosen workloads and prints what they measured. A cancelled `stop` (the first
/// SIGINT or SIGTERM) ends the workloads where they are; the bench still removes what it started.
pub async fn run(
    mut config: Config,
    args: BenchArgs,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let llm = ScriptedLlm::start(args.llm_listen, scripts())
        .await
        .with_context(|| format!("cannot listen for the scripted LLM on {}", args.llm_listen))?;
    llm.keep_requests(false);
    let mut observing = None;
    let procs = if args.external {
        procs::Processes::find_running()
    } else {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        config.nats.namespace = format!("bench{tag}");
        let url = config.database.url.expose();
        let base = url.rsplit_once('/').map_or(url, |(b, _)| b);
        config.database.url = format!("{base}/hark_bench_{tag}").into();
        anyhow::ensure!(
            !(args.observe && args.controls > 1),
            "--observe scrapes one task-control; run it with --controls 1"
        );
        if args.observe {
            observing = Some(observe::Observe::start(args.workers).await?);
        }
        let streams = u32::try_from(args.watchers).unwrap_or(u32::MAX);
        config.control.max_watchers = config.control.max_watchers.max(streams.saturating_add(100));
        config.control.max_watchers_per_token = config.control.max_watchers_per_token.max(streams);
        procs::Processes::spawn(
            &mut config,
            &llm.base_url(),
            args.controls,
            args.workers,
            args.worker_concurrency,
            observing.as_ref(),
        )
        .await?
    };
    if let Some(observing) = &observing {
        observing.scrape(
            config.gateway.listen,
            config.gateway.onebot.access_token.expose().to_owned(),
        );
    }
    let names = Names::of(&config.nats)?;
    let nats = hark_core::bus::connect_client(&config.nats, "hark bench").await?;
    let api = procs::connect_api(&config).await?;
    let events = hub::EventHub::start(&nats, &names).await?;
    let arrivals = hub::ArrivalHub::start(&llm);
    let mut bench = Bench {
        config,
        names,
        api,
        nats,
        llm,
        events,
        arrivals,
        procs,
    };
    eprintln!(
        "bench: namespace {}, database {}, {} hark processes, scripted LLM at {}",
        bench.config.nats.namespace,
        hark_core::secret::redact_url(bench.config.database.url.expose()),
        bench.procs.list().len(),
        bench.llm.base_url()
    );

    // Whatever the workloads do, and on a signal, the processes, the database and the streams
    // go afterwards.
    let measured = tokio::select! {
        biased;
        () = stop.cancelled() => Err(anyhow::anyhow!(
            "interrupted by a signal before the workloads ended, so nothing is reported; \
             what the bench started is stopped and removed"
        )),
        measured = measure(&mut bench, &args) => measured,
    };
    bench.procs.stop().await;
    if !args.external {
        procs::drop_database(&bench.config).await;
        let js = async_nats::jetstream::new(bench.nats.clone());
        for stream in bench.names.stream_configs() {
            let _ = js.delete_stream(&stream.name).await;
        }
    }
    let mut reports = measured?;
    if let Some(observing) = &observing {
        observing.stop();
        let spans = observing
            .sink
            .spans
            .load(std::sync::atomic::Ordering::Relaxed);
        let scrapes = observing.scrapes.load(std::sync::atomic::Ordering::Relaxed);
        crate::out!(
            "{}",
            serde_json::json!({"workload": "observe", "spans_exported": spans, "scrapes": scrapes})
        );
        let mut rows = vec![(
            "observe".into(),
            "spans exported (sampler 1.0) · /metrics scrapes".into(),
            format!("{spans} · {scrapes}"),
        )];
        // Where the time goes: every span seen often enough, the slowest first.
        for times in observing.sink.times(50) {
            crate::out!(
                "{}",
                serde_json::json!({"workload": "observe", "span": times.name,
                    "count": times.count, "p50_us": times.p50_us, "p90_us": times.p90_us})
            );
            rows.push((
                "observe".into(),
                format!("span `{}` (×{}), p50 / p90", times.name, times.count),
                format!(
                    "{:.3} / {:.3} ms",
                    times.p50_us as f64 / 1000.0,
                    times.p90_us as f64 / 1000.0
                ),
            ));
        }
        reports.push(Report {
            json: serde_json::json!({"spans_exported": spans, "scrapes": scrapes}),
            rows,
        });
    }
    crate::out!("\n| workload | measure | value |\n|---|---|---|");
    for report in &reports {
        for (workload, measure, value) in &report.rows {
            crate::out!("| {workload} | {measure} | {value} |");
        }
    }
    Ok(())
}

/// Runs the chosen workloads in order, printing each one's JSON line as it ends.
async fn measure(bench: &mut Bench, args: &BenchArgs) -> anyhow::Result<Vec<Report>> {
    let mut reports = Vec::new();
    let mut limits = None;
    for workload in &args.workloads() {
        if workload == "w1-client" || workload == "w2-client" {
            let think = Duration::from_millis(args.think_ms);
            let drives = std::iter::once(client::Driver::Rust)
                .chain(args.python.clone().map(client::Driver::Python))
                .map(|driver| client::Drive { driver, think });
            for drive in drives {
                for kind in args.kinds.iter().filter_map(|k| client::Kind::named(k)) {
                    let report = if workload == "w1-client" {
                        client::w1(bench, kind, &drive, args.warmup, args.rounds).await?
                    } else {
                        let (n, in_flight) = (args.tasks, args.in_flight);
                        client::w2(bench, kind, &drive, n, in_flight, limits.as_ref()).await?
                    };
                    crate::out!("{}", report.json);
                    reports.push(report);
                }
            }
            continue;
        }
        let report = match workload.as_str() {
            "limits" => {
                let l = limits::measure(bench).await?;
                let r = l.report();
                limits = Some(l);
                r
            }
            "w1-grpc" => w1::run(bench, w1::Via::Grpc, args.warmup, args.rounds).await?,
            "w1-onebot" => w1::run(bench, w1::Via::OneBot, args.warmup, args.rounds).await?,
            "w2" => w2::run(bench, args.tasks, args.in_flight, limits.as_ref()).await?,
            "w1-floor" => {
                let think = Duration::from_millis(args.think_ms);
                let python = args.python.as_deref();
                floor::run(bench, python, think, args.warmup, args.rounds).await?
            }
            "watchers" => watchers::run(bench, args.watchers).await?,
            other => anyhow::bail!(
                "unknown workload `{other}`: expected limits, w1-grpc, w1-onebot, w2, w1-floor, \
                 w1-client, w2-client or watchers"
            ),
        };
        crate::out!("{}", report.json);
        reports.push(report);
    }
    Ok(reports)
}

/// Percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0
}

pub fn mib(bytes: u64) -> f64 {
    ((bytes as f64) / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

pub fn summary(samples: &mut [Duration]) -> Value {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    json!({
        "p50_ms": ms(percentile(samples, 50.0)),
        "p90_ms": ms(percentile(samples, 90.0)),
        "p99_ms": ms(percentile(samples, 99.0)),
        "max_ms": ms(samples.last().copied().unwrap_or_default()),
        "mean_ms": ms(mean),
    })
}
