//! The servers `hark dev` needs, when nothing answers where the config says they are: a private
//! Postgres (the distribution's `initdb` and `pg_ctl`) and a private `nats-server` with
//! JetStream, their data kept under the data directory and used again the next time. They stop
//! when `hark dev` does. When their programs are not installed, the error says what to install.

use std::{
    path::{Path, PathBuf},
    process::Child,
    time::Duration,
};

use anyhow::{Context as _, bail};
use hark_core::config::{Config, loopback_name};
use hark_servers::{Error, Postgres};

/// The default data directory: `$XDG_DATA_HOME/hark`, or `~/.local/share/hark`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("hark")
}

/// The servers this process started; [`Private::stop`] stops them.
#[derive(Debug, Default)]
pub struct Private {
    postgres: Option<Postgres>,
    nats: Option<Child>,
    /// What was started, for the banner.
    pub started: Vec<String>,
}

/// The host and port of a server URL (`postgres://u@host:5432/db`, `nats://host:4222`).
fn host_port(url: &str, default_port: u16) -> Option<(String, u16)> {
    let first = url.split(',').next()?.trim();
    let parsed = reqwest::Url::parse(first).ok()?;
    let host = parsed.host_str()?.trim_matches(['[', ']']).to_owned();
    Some((host, parsed.port().unwrap_or(default_port)))
}

async fn answers(host: &str, port: u16) -> bool {
    let host = host.to_owned();
    tokio::task::spawn_blocking(move || hark_servers::answers(&host, port))
        .await
        .unwrap_or(false)
}

const DEPS: &str = "or start both with `docker compose --profile deps up -d` from hark's source";

/// Makes sure Postgres and NATS answer where `config` says, starting private ones under
/// `data_dir` for those that do not. A server on this host that answers but cannot serve hark (a Postgres that asks for a password, a nats-server without
/// JetStream) is left alone: a private one starts on a free port instead, `config` is pointed at
/// it, and one line says so and what to change to use the other.
pub async fn ensure(config: &mut Config, data_dir: &Path) -> anyhow::Result<Private> {
    let mut private = Private::default();
    if let Err(e) = ensure_into(config, data_dir, &mut private).await {
        private.stop().await;
        return Err(e);
    }
    Ok(private)
}

/// Why the Postgres at `url` cannot serve hark, if it cannot: it refuses hark's user, or it is
/// not Postgres. `None` when it lets hark in (or is merely slow, which waiting mends).
async fn postgres_refuses(url: &str) -> Option<String> {
    use hark_control::store::Error;
    match hark_control::store::probe(url).await {
        Err(Error::Refused { said, .. }) => Some(said),
        Err(Error::NotPostgres { said, .. }) => Some(format!("it is not Postgres: {said}")),
        _ => None,
    }
}

/// Why the NATS at `config`'s URL cannot serve hark, if it cannot: JetStream is off there, or it
/// refuses the client.
async fn nats_refuses(config: &hark_core::config::NatsConfig) -> Option<String> {
    use hark_core::startup::Permanent as _;
    let probe = async {
        let client = hark_core::bus::connect_client(config, "hark dev").await?;
        let js = async_nats::jetstream::new(client);
        match js.query_account().await {
            Ok(_) => Ok(()),
            Err(e) if hark_core::bus::jetstream_off(&e.to_string()) => {
                Err(hark_core::bus::Error::NoJetStream)
            }
            Err(_) => Ok(()),
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), probe).await {
        Ok(Err(e)) if e.permanent() => Some(match e {
            hark_core::bus::Error::NoJetStream => "JetStream is off there".to_owned(),
            other => other.to_string(),
        }),
        _ => None,
    }
}

/// A free TCP port on 127.0.0.1 from `from` up.
fn free_port(from: u16) -> anyhow::Result<u16> {
    (from..from.saturating_add(200))
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .with_context(|| format!("no free port on 127.0.0.1 from {from}"))
}

async fn ensure_into(
    config: &mut Config,
    data_dir: &Path,
    private: &mut Private,
) -> anyhow::Result<()> {
    let database = config.database.url.expose().to_owned();
    let (host, port) = host_port(&database, 5432).with_context(|| {
        "database.url is not a URL like postgres://postgres@127.0.0.1:5432/hark".to_owned()
    })?;
    let refused = if answers(&host, port).await {
        postgres_refuses(&database).await
    } else {
        None
    };
    if let Some(why) = refused {
        if !loopback_name(&host) {
            bail!(
                "the Postgres at database.url ({host}:{port}) cannot serve hark: {why}. Set \
                 database.url (HARK_DATABASE__URL) to a user and password it takes"
            );
        }
        let own = free_port(port + 1)?;
        eprintln!(
            "{}",
            crate::said!(
                zh: "hark dev：{host}:{port} 上的 Postgres 无法为 hark 所用（{why}）；改为在 \
                     127.0.0.1:{own} 启动自己的（数据在 {}）。若要用那个：在那里执行 `ALTER USER \
                     postgres PASSWORD '…'`，并设置 database.url = postgres://postgres:…@{host}:{port}/hark",
                en: "hark dev: the Postgres on {host}:{port} cannot serve hark ({why}); starting its own \
                     on 127.0.0.1:{own} (data in {}). To use that one instead: `ALTER USER postgres \
                     PASSWORD '…'` there, and database.url = postgres://postgres:…@{host}:{port}/hark",
                data_dir.join("postgres").display()
            )
        );
        private.postgres = Some(start_postgres(data_dir, own).await?);
        private.started.push(format!(
            "Postgres on 127.0.0.1:{own} (data in {})",
            data_dir.join("postgres").display()
        ));
        config.database.url = format!("postgres://postgres@127.0.0.1:{own}/hark").into();
    } else if !answers(&host, port).await {
        if !loopback_name(&host) {
            bail!(
                "Postgres does not answer at database.url ({host}:{port}). Start it, or set \
                 database.url (HARK_DATABASE__URL) to one that answers"
            );
        }
        private.postgres = Some(start_postgres(data_dir, port).await?);
        private.started.push(format!(
            "Postgres on 127.0.0.1:{port} (data in {})",
            data_dir.join("postgres").display()
        ));
    }
    let (host, port) = host_port(config.nats.url.expose(), 4222)
        .context("nats.url is not a URL like nats://127.0.0.1:4222")?;
    let refused = if answers(&host, port).await {
        nats_refuses(&config.nats).await
    } else {
        None
    };
    if let Some(why) = refused {
        if !loopback_name(&host) {
            bail!(
                "the NATS at nats.url ({host}:{port}) cannot serve hark: {why}. Turn JetStream on \
                 there (`jetstream {{}}` in /etc/nats-server.conf, or `nats-server -js`), set \
                 nats.url (HARK_NATS__URL) to one that has it"
            );
        }
        let own = free_port(port + 1)?;
        eprintln!(
            "{}",
            crate::said!(
                zh: "hark dev：{host}:{port} 上的 NATS 无法为 hark 所用（{why}）；改为在 127.0.0.1:{own} \
                     启动自己的、带 JetStream 的（数据在 {}）。若要用那个：在那里打开 JetStream \
                     （/etc/nats-server.conf 里写 `jetstream {{}}`）并重启它",
                en: "hark dev: the NATS on {host}:{port} cannot serve hark ({why}); starting its own with \
                     JetStream on 127.0.0.1:{own} (data in {}). To use that one instead: turn JetStream \
                     on there (`jetstream {{}}` in /etc/nats-server.conf) and restart it",
                data_dir.join("nats").display()
            )
        );
        private.nats = Some(start_nats(data_dir, "127.0.0.1", own).await?);
        private.started.push(format!(
            "nats-server with JetStream on 127.0.0.1:{own} (data in {})",
            data_dir.join("nats").display()
        ));
        config.nats.url = format!("nats://127.0.0.1:{own}").into();
    } else if !answers(&host, port).await {
        if !loopback_name(&host) {
            bail!(
                "NATS does not answer at nats.url ({host}:{port}). Start it with JetStream \
                 (`nats-server -js`), or set nats.url (HARK_NATS__URL) to one that answers"
            );
        }
        private.nats = Some(start_nats(data_dir, &host, port).await?);
        private.started.push(format!(
            "nats-server with JetStream on {host}:{port} (data in {})",
            data_dir.join("nats").display()
        ));
    }
    Ok(())
}

async fn start_postgres(data_dir: &Path, port: u16) -> anyhow::Result<Postgres> {
    let data = data_dir.join("postgres");
    if !data.join("PG_VERSION").exists() {
        eprintln!(
            "hark dev: creating a Postgres cluster in {}",
            data.display()
        );
    }
    let log = data_dir.join("postgres.log");
    let started = tokio::task::spawn_blocking(move || Postgres::start(&data, &log, port)).await?;
    started.map_err(|e| match e {
        Error::NotInstalled { .. } => anyhow::anyhow!(
            "nothing answers at database.url (127.0.0.1:{port}), and Postgres is not installed \
             for hark dev to start its own. Install it (`sudo apt install postgresql`, \
             `sudo dnf install postgresql-server`, or `brew install postgresql`), {DEPS}, or set \
             database.url (HARK_DATABASE__URL)"
        ),
        Error::NoPostgresUser => {
            anyhow::anyhow!("{e}; run hark dev as another user, or start Postgres yourself")
        }
        Error::Failed { .. } => anyhow::anyhow!("the private Postgres did not start: {e}"),
    })
}

async fn start_nats(data_dir: &Path, host: &str, port: u16) -> anyhow::Result<Child> {
    let (store, log, on) = (
        data_dir.join("nats"),
        data_dir.join("nats.log"),
        host.to_owned(),
    );
    let started =
        tokio::task::spawn_blocking(move || hark_servers::start_nats(&store, &log, &on, port))
            .await?;
    started.map_err(|e| match e {
        Error::NotInstalled { .. } => anyhow::anyhow!(
            "nothing answers at nats.url ({host}:{port}), and nats-server is not installed for \
             hark dev to start its own. Install it (`sudo apt install nats-server`, or \
             `brew install nats-server`), {DEPS}, or set nats.url (HARK_NATS__URL)"
        ),
        other => anyhow::anyhow!("the private nats-server did not start: {other}"),
    })
}

impl Private {
    /// Stops what was started, the data kept.
    pub async fn stop(&mut self) {
        if let Some(mut nats) = self.nats.take() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &nats.id().to_string()])
                .status()
                .await;
            let waited = tokio::task::spawn_blocking(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while std::time::Instant::now() < deadline {
                    if let Ok(Some(_)) = nats.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = nats.kill();
                let _ = nats.wait();
            });
            let _ = waited.await;
        }
        if let Some(pg) = self.postgres.take() {
            let stopped = tokio::task::spawn_blocking(move || pg.stop()).await;
            // A Ctrl-C in the terminal reaches Postgres too, which may have stopped already.
            if let Ok(Err(e)) = stopped {
                tracing::debug!(error = %e, "the private Postgres was stopped already");
            }
        }
    }
}

impl Drop for Private {
    /// A nats-server left to this process is not left running when it ends without a stop.
    fn drop(&mut self) {
        if let Some(mut nats) = self.nats.take() {
            let _ = nats.kill();
            let _ = nats.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_url_gives_its_host_and_port() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5433/hark", 5432),
            Some(("127.0.0.1".into(), 5433))
        );
        assert_eq!(
            host_port("postgres://u:p@db.example/hark", 5432),
            Some(("db.example".into(), 5432))
        );
        assert_eq!(
            host_port("nats://a:4223,nats://b:4224", 4222),
            Some(("a".into(), 4223))
        );
        assert_eq!(
            host_port("nats://[::1]:4222", 4222),
            Some(("::1".into(), 4222))
        );
        assert_eq!(host_port("127.0.0.1:4222", 4222), None);
        assert!(loopback_name("localhost") && loopback_name("::1") && loopback_name("127.0.0.1"));
        assert!(!loopback_name("db.example"));
    }
}
