//! The `hark` binary: one subcommand per role, so that one image serves every role.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use hark_core::{
    bus::{self, Names},
    config::Config,
};
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
    Migrate,
    /// Print the effective configuration (file, then environment overrides) as TOML.
    Config,
    /// Run task-control: the gRPC API, chat commands, answer routing, timers and worker requests.
    Control,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole cause chain on one line, without a backtrace.
            eprintln!("hark: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    init_tracing(&config);
    match cli.command {
        Command::Migrate => migrate(&config).await,
        Command::Control => {
            let app = hark_control::app::App::build(config).await?;
            tracing::info!(grpc = %app.grpc_addr(), "task-control started");
            app.run_until_stopped(shutdown_on_signal()).await?;
            Ok(())
        }
        Command::Config => {
            print!("{}", toml::to_string_pretty(&config)?);
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

fn init_tracing(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn migrate(config: &Config) -> anyhow::Result<()> {
    let pool = hark_control::store::connect(&config.database.url, 2)
        .await
        .with_context(|| {
            format!(
                "cannot reach Postgres at database.url = {}",
                config.database.url
            )
        })?;
    hark_control::store::migrate(&pool).await?;
    tracing::info!(database = config.database.url, "database migrated");
    let client = async_nats::connect(&config.nats.url)
        .await
        .with_context(|| format!("cannot reach NATS at nats.url = {}", config.nats.url))?;
    let names = Names::new(config.nats.namespace.parse()?);
    bus::ensure(&async_nats::jetstream::new(client), &names).await?;
    tracing::info!(
        namespace = config.nats.namespace,
        "streams and consumers are in place"
    );
    Ok(())
}
