//! The `hark` binary: one subcommand per role, so that one image serves every role.

use std::{path::PathBuf, process::ExitCode};

mod bench;
mod dev;
mod health;
mod key;
mod listen;
mod said;
mod servers;
mod task;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use hark_core::{bus, config::Config};
use hark_worker::{llm, scripted::ScriptedLlm, worker::Worker};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "hark",
    version,
    about = "Background AI agent tasks that can ask their owner in chat"
)]
struct Cli {
    /// The TOML config file. Every key can also be set with HARK_<SECTION>__<KEY>.
    #[arg(long, global = true, env = "HARK_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the database if needed, run its migrations, and create the NATS streams.
    Migrate {
        /// Wait this long (e.g. `10m`) for Postgres and NATS to answer, saying so, instead of
        /// failing at once: for an init container that may start before them.
        #[arg(long, value_name = "DURATION")]
        wait: Option<hark_core::domain::HumanDuration>,
    },
    /// Print the effective configuration (file, then environment overrides) as TOML, with
    /// tokens, keys and passwords redacted.
    Config {
        /// Print tokens, keys and passwords as they are.
        #[arg(long)]
        show_secrets: bool,
    },
    /// Run task-control: the gRPC API, chat commands, answer routing, timers and worker requests.
    Control,
    /// Run the gateway: OneBot v11 bots (reverse and forward WebSocket) and the HTTP adapter.
    Gateway,
    /// Run an agent worker: pulls run jobs and runs the LLM tool loop.
    Worker {
        /// This worker's name in leases and logs (default: host name and process id).
        #[arg(long, env = "HARK_WORKER_ID")]
        id: Option<String>,
    },
    /// Run everything in one process: gateway, task-control and workers. Creates the database
    /// and the streams; with no llm.base_url it runs the built-in demo model.
    Dev {
        /// How many workers to run.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Where private Postgres and NATS keep their data, when hark dev starts them because
        /// nothing answers at database.url or nats.url, and where the gateway spools
        /// [default: $XDG_DATA_HOME/hark or ~/.local/share/hark]
        #[arg(long, env = "HARK_DATA_DIR", value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Talk to a running hark over its gRPC API.
    Task(Box<task::TaskArgs>),
    /// Make, list and revoke keys that belong to a person, over the gRPC API.
    Key(Box<key::KeyArgs>),
    /// Measure resume latency and mass suspend/resume against a running hark (see BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// Print a completion script for a shell, e.g. `hark completions bash >
    /// ~/.local/share/bash-completion/completions/hark`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Exit 0 when a role answers on this host (for container healthchecks).
    Health {
        /// Without one: the role the container runs (the `hark` command of PID 1).
        #[arg(value_enum)]
        role: Option<health::Role>,
        /// List the messages set aside because they could never be handled (the dead-letter
        /// stream), newest first, with their reasons, instead of checking a role.
        #[arg(long)]
        dead_letters: bool,
        /// How many dead letters to list.
        #[arg(long, default_value_t = 20)]
        limit: u64,
    },
}

// The services allocate and free many small buffers per message; mimalloc does that with less
// CPU than the system allocator (measured with `hark bench`, see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hark: {}", said_once(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each said once: a cause whose text what it caused
/// already says is left out (most errors here quote their cause), and Postgres's errors without
/// the line of Postgres's own source code.
fn said_once(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
            hark_control::store::said(e)
        } else if let Some(e) = cause.downcast_ref::<hark_core::config::Error>() {
            config_error(e)
        } else {
            cause.to_string()
        };
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// A configuration error in the reader's language. What is wrong with a value is said in
/// English, as the logs and the documentation of the keys say it; the key, the file and the
/// variable are named either way.
fn config_error(e: &hark_core::config::Error) -> String {
    use hark_core::config::Error;
    if !said::zh() {
        return e.to_string();
    }
    match e {
        Error::Read { path, source } => format!("读不到配置文件 {path}：{source}"),
        Error::Syntax { path, message } => format!("配置文件 {path} 不是合法的 TOML：{message}"),
        Error::Env { var, message } => format!("环境变量 {var}：{message}"),
        Error::Key { key, message } => format!("配置项 `{key}`：{message}"),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Needs no config: it works before one exists.
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory as _;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "hark", &mut script);
        said::out_bytes(&script);
        return Ok(());
    }
    let config = Config::load(cli.config.as_deref())?;
    // The task client prints for people; only warnings belong on its stderr.
    let quiet = matches!(
        cli.command,
        Command::Task(_)
            | Command::Key(_)
            | Command::Config { .. }
            | Command::Health { .. }
            | Command::Bench(_)
            | Command::Completions { .. }
    );
    let role = match &cli.command {
        Command::Control => Some("control"),
        Command::Gateway => Some("gateway"),
        Command::Worker { .. } => Some("worker"),
        Command::Dev { .. } => Some("dev"),
        _ => None,
    };
    // Flushes the last spans when the role stops.
    let _telemetry = init_tracing(&config, quiet, role)?;
    // A role holds secrets and may start stdio MCP servers: they, and every other process of
    // this user, cannot read its environment or memory.
    if role.is_some()
        && let Err(e) = hark_core::secret::keep_from_other_processes()
    {
        tracing::warn!("{e}; other processes of this user can read hark's secrets");
    }
    match cli.command {
        Command::Migrate { wait } => migrate(&config, wait.map(|w| w.0)).await,
        Command::Dev { workers, data_dir } => {
            let data_dir = data_dir.unwrap_or_else(servers::default_data_dir);
            dev::run(config, workers, data_dir, shutdown_on_signal()).await
        }
        Command::Task(args) => task::run(&config, *args).await,
        Command::Key(args) => key::run(&config, *args).await,
        Command::Health {
            dead_letters: true,
            limit,
            ..
        } => {
            print!("{}", health::dead_letters(&config, limit).await?);
            Ok(())
        }
        Command::Health { role, .. } => {
            let roles = match role {
                Some(role) => vec![role],
                None => health::of_container()?,
            };
            for role in roles {
                health::check(&config, role).await?;
            }
            Ok(())
        }
        Command::Bench(args) => bench::run(config, args, shutdown_on_signal()).await,
        Command::Completions { .. } => Ok(()),
        Command::Gateway => {
            let app = hark_gateway::app::App::build(&config).await?;
            tracing::info!(addr = %app.addr(), "gateway started");
            app.run_until_stopped(shutdown_on_signal()).await?;
            Ok(())
        }
        Command::Worker { id } => {
            let (settings, _demo) = llm_settings(&config).await?;
            let id = id.unwrap_or_else(default_worker_id);
            let shutdown = shutdown_on_signal();
            let Some(worker) = Worker::build_waiting(&config, settings, id, &shutdown).await?
            else {
                return Ok(());
            };
            listen::metrics(&config, Some(worker.health()), shutdown.clone()).await?;
            worker.run_until_stopped(shutdown).await?;
            Ok(())
        }
        Command::Control => {
            let shutdown = shutdown_on_signal();
            let Some(app) = hark_control::app::App::build_waiting(config, &shutdown).await? else {
                return Ok(());
            };
            tracing::info!(grpc = %app.grpc_addr(), "task-control started");
            listen::metrics(&app.shared().config, None, shutdown.clone()).await?;
            app.run_until_stopped(shutdown).await?;
            Ok(())
        }
        Command::Config { show_secrets } => {
            let shown = if show_secrets {
                config
            } else {
                config.redacted()
            };
            print!("{}", toml::to_string_pretty(&shown)?);
            Ok(())
        }
    }
}

/// A token cancelled by the first SIGINT or SIGTERM; a second signal exits at once.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stopping; a second signal exits at once");
        trigger.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// A worker id unique on this host: host name and process id.
pub(crate) fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// The LLM the workers use: the configured one, or, with no `llm.base_url`, the built-in demo
/// model served on a local port. The returned server must live as long as the workers.
pub(crate) async fn llm_settings(
    config: &Config,
) -> anyhow::Result<(llm::Settings, Option<ScriptedLlm>)> {
    if !config.llm.base_url.is_empty() {
        return Ok((llm::Settings::from_config(&config.llm), None));
    }
    let demo = ScriptedLlm::demo()
        .await
        .context("cannot start the demo model")?;
    tracing::warn!(
        url = demo.base_url(),
        "NO LLM CONFIGURED: using hark's built-in demo model, which asks one question and then finishes. \
         Set llm.base_url (HARK_LLM__BASE_URL), llm.api_key and llm.model to use a real one."
    );
    let mut settings = llm::Settings::from_config(&config.llm);
    settings.base_url = demo.base_url();
    Ok((settings, Some(demo)))
}

/// `filter` with the NATS client's connection chatter left to warnings, unless the filter names
/// it; under `hark dev`, whose banner stays the last thing at start, the roles' start lines too.
fn quieter(filter: &str, dev: bool) -> String {
    let mut wanted = filter.to_owned();
    // rmcp says every stateless MCP request it serves at info.
    let mut quiet = vec!["async_nats", "rmcp"];
    if dev {
        quiet.extend(["hark_worker::worker", "hark_control::console"]);
    }
    for target in quiet {
        if !wanted.contains(target) {
            wanted.push_str(&format!(",{target}=warn"));
        }
    }
    wanted
}

/// A log line as a person reads it: time, level, where, the message and its fields, without
/// the fields of every span around it (those go to the traces).
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::{FormatFields as _, time::FormatTime as _};
        let meta = event.metadata();
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut writer)?;
        write!(writer, " {:>5} {}: ", meta.level(), meta.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn init_tracing(
    config: &Config,
    quiet: bool,
    role: Option<&str>,
) -> anyhow::Result<hark_core::telemetry::Guard> {
    use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let wanted = if quiet {
        "warn".to_owned()
    } else {
        quieter(&config.log.filter, role == Some("dev"))
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&wanted))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal, not for a log file or a collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = if config.log.format == "json" {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .event_format(Plain)
            .boxed()
    };
    let (traces, guard) = match role {
        Some(role) => hark_core::telemetry::init(&config.telemetry, role)?,
        None => (None, hark_core::telemetry::Guard::default()),
    };
    // The log filter is the logs' own: spans are exported at info whatever the logs show.
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces.map(|t| t.with_filter(tracing_subscriber::filter::LevelFilter::INFO)))
        .init();
    Ok(guard)
}

async fn migrate(config: &Config, wait: Option<std::time::Duration>) -> anyhow::Result<()> {
    let shown = hark_core::secret::redact_url(config.database.url.expose());
    let connect = || hark_control::store::connect(config.database.url.expose(), 2);
    let pool = match wait {
        None => connect().await.with_context(|| {
            said!(
                zh: "连不上 database.url = {} 的 Postgres",
                en: "cannot reach Postgres at database.url = {}",
                shown
            )
        })?,
        Some(wait) => {
            waited(
                &format!("Postgres at database.url = {shown}"),
                wait,
                connect,
            )
            .await?
        }
    };
    hark_control::store::migrate(&pool).await?;
    tracing::info!(database = shown, "database migrated");
    let name = "hark migrate";
    match wait {
        None => {
            bus::connect(&config.nats, name).await?;
        }
        Some(wait) => {
            let what = format!(
                "NATS with JetStream at nats.url = {}",
                hark_core::secret::redact_url(config.nats.url.expose())
            );
            waited(&what, wait, || bus::connect(&config.nats, name)).await?;
        }
    }
    tracing::info!(
        namespace = config.nats.namespace,
        "streams and consumers are in place"
    );
    Ok(())
}

/// Runs `attempt` until it succeeds, for at most `wait` (a signal ends the wait too).
async fn waited<T, E, F, Fut>(
    what: &str,
    wait: std::time::Duration,
    attempt: F,
) -> anyhow::Result<T>
where
    E: std::fmt::Display
        + hark_core::startup::Permanent
        + std::error::Error
        + Send
        + Sync
        + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let give_up = shutdown_on_signal();
    let timer = give_up.clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        timer.cancel();
    });
    hark_core::startup::wait_for(what, &give_up, attempt)
        .await?
        .with_context(|| {
            said!(
                zh: "{} 在 {} 内没有应答（hark migrate --wait）",
                en: "{} did not answer within {} (hark migrate --wait)",
                what,
                hark_core::domain::HumanDuration(wait)
            )
        })
}
