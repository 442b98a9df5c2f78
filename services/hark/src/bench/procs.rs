//! The hark processes under test: started by the bench, or found among the running ones; and
//! the memory they (and Postgres) use.

use std::{process::Stdio, time::Duration};

use anyhow::Context as _;
use hark_core::config::Config;
use hark_proto::v1::task_service_client::TaskServiceClient;
use tokio::process::{Child, Command};
use tonic::transport::Channel;

pub struct Proc {
    pub role: String,
    pub pid: u32,
    child: Option<Child>,
}

pub struct Processes {
    procs: Vec<Proc>,
}

impl Processes {
    pub fn list(&self) -> &[Proc] {
        &self.procs
    }

    /// Starts `controls` × `hark control`, `hark gateway` and `workers` × `hark worker` with
    /// `config`'s database and namespace, the workers calling `llm_url`. A listener `config`
    /// puts on port 0 is set to the address the process bound; `config` names the first
    /// control's, and the others listen on ports of their own choosing.
    pub async fn spawn(
        config: &mut Config,
        llm_url: &str,
        controls: u32,
        workers: u32,
        concurrency: u32,
        observing: Option<&super::observe::Observe>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the hark binary")?;
        let env = [
            (
                "HARK_DATABASE__URL",
                config.database.url.expose().to_owned(),
            ),
            ("HARK_NATS__URL", config.nats.url.expose().to_owned()),
            ("HARK_NATS__NAMESPACE", config.nats.namespace.clone()),
            (
                "HARK_CONTROL__GRPC_LISTEN",
                config.control.grpc_listen.to_string(),
            ),
            ("HARK_GATEWAY__LISTEN", config.gateway.listen.to_string()),
            // The web console on a port of its own choosing: the bench times its inbox.
            ("HARK_CONTROL__HTTP_LISTEN", "127.0.0.1:0".to_owned()),
            (
                "HARK_GATEWAY__ONEBOT__ACCESS_TOKEN",
                config.gateway.onebot.access_token.expose().to_owned(),
            ),
            ("HARK_LLM__BASE_URL", llm_url.to_owned()),
            ("HARK_WORKER__CONCURRENCY", concurrency.to_string()),
            ("HARK_GATEWAY__RATE_LIMIT", "1000000".to_owned()),
            // One bench owner has every W2 task, and its bot sends every W1 answer.
            ("HARK_TASK__MAX_ACTIVE_PER_OWNER", "0".to_owned()),
            (
                "HARK_GATEWAY__SPOOL_DIR",
                std::env::temp_dir()
                    .join(format!("hark-bench-spool-{}", config.nats.namespace))
                    .display()
                    .to_string(),
            ),
            ("HARK_CHAT__COMMANDS_PER_MINUTE", "0".to_owned()),
            (
                "HARK_CONTROL__MAX_WATCHERS",
                config.control.max_watchers.to_string(),
            ),
            (
                "HARK_CONTROL__MAX_WATCHERS_PER_TOKEN",
                config.control.max_watchers_per_token.to_string(),
            ),
            (
                "HARK_LOG__FILTER",
                std::env::var("HARK_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned()),
            ),
        ];
        let addr_file =
            std::env::temp_dir().join(format!("hark-bench-{}.addr", config.nats.namespace));
        let _ = std::fs::remove_file(&addr_file);
        let start = |args: Vec<String>, observed: Vec<(String, String)>| -> anyhow::Result<Proc> {
            let child = Command::new(&exe)
                .args(&args)
                .env_remove("HARK_CONFIG")
                .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
                .env(hark_core::listen::ENV_ADDR_FILE, &addr_file)
                .envs(observed)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot start hark {}", args.join(" ")))?;
            Ok(Proc {
                role: args.join(" "),
                pid: child.id().unwrap_or(0),
                child: Some(child),
            })
        };
        let observed =
            |role: &str, index: usize| observing.map(|o| o.env(role, index)).unwrap_or_default();
        let mut procs = vec![start(vec!["control".into()], observed("control", 0))?];
        config.control.grpc_listen = bound(&addr_file, "control.grpc_listen").await?;
        config.control.http_listen = bound(&addr_file, "control.http_listen").await?.to_string();
        // task-control migrates and creates the streams; the others start once it answers.
        connect_api(config).await?;
        procs.push(start(vec!["gateway".into()], observed("gateway", 0))?);
        config.gateway.listen = bound(&addr_file, "gateway.listen").await?;
        // Each further replica, once the one before it has said where it listens (the last
        // line of a key is the latest process's).
        for _ in 1..controls {
            let _ = std::fs::remove_file(&addr_file);
            let mut replica = start(
                vec!["control".into()],
                vec![(
                    "HARK_CONTROL__GRPC_LISTEN".to_owned(),
                    "127.0.0.1:0".to_owned(),
                )],
            )?;
            let grpc = bound(&addr_file, "control.grpc_listen").await?;
            replica.role = format!("control {grpc}");
            procs.push(replica);
        }
        let _ = std::fs::remove_file(&addr_file);
        for n in 1..=workers {
            procs.push(start(
                vec!["worker".into(), "--id".into(), format!("bench-w{n}")],
                observed("worker", n as usize - 1),
            )?);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Self { procs })
    }

    /// The hark processes running on this machine (`hark control|gateway|worker|dev`).
    pub fn find_running() -> Self {
        let mut procs = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_hark = args
                .first()
                .is_some_and(|a| a.ends_with("/hark") || a == "hark");
            let role = args
                .iter()
                .skip(1)
                .find(|a| ["control", "gateway", "worker", "dev"].contains(&a.as_str()));
            if let (true, Some(role)) = (is_hark, role) {
                procs.push(Proc {
                    role: role.clone(),
                    pid,
                    child: None,
                });
            }
        }
        Self { procs }
    }

    pub async fn stop(&mut self) {
        for proc in &mut self.procs {
            if let Some(child) = &mut proc.child {
                let _ = Command::new("kill")
                    .args(["-TERM", &proc.pid.to_string()])
                    .status()
                    .await;
                let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
                let _ = child.start_kill();
            }
        }
    }
}

/// Resident memory of a process, in bytes.
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Proportional memory of all Postgres processes together (shared buffers counted once), in bytes.
pub fn postgres_pss() -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let is_postgres = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|c| c.trim().starts_with("postgres"));
        if !is_postgres {
            continue;
        }
        if let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup"))
            && let Some(kb) = rollup
                .lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        {
            total += kb * 1024;
        }
    }
    total
}

/// The address the process started last bound for `key`, as it wrote it to `file`.
async fn bound(file: &std::path::Path, key: &str) -> anyhow::Result<std::net::SocketAddr> {
    for _ in 0..600 {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(addr) = hark_core::listen::last(&text, key) {
            return Ok(addr);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the bench's hark processes did not say within 60 s where {key} listens")
}

pub async fn connect_api(config: &Config) -> anyhow::Result<TaskServiceClient<Channel>> {
    let url = format!(
        "http://{}",
        hark_core::config::dial(config.control.grpc_listen)
    );
    // While it starts, task-control answers health only: wait until it serves.
    for _ in 0..600 {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(url.clone())?
            .connect()
            .await
        {
            let serving = tonic_health::pb::health_client::HealthClient::new(channel.clone())
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "hark.v1.TaskService".into(),
                })
                .await
                .is_ok_and(|r| {
                    r.into_inner().status
                        == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                });
            if serving {
                return Ok(TaskServiceClient::new(channel));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("task-control did not serve at {url} within 60s")
}

pub async fn drop_database(config: &Config) {
    let Some((base, name)) = config.database.url.expose().rsplit_once('/') else {
        return;
    };
    if let Ok(pool) = sqlx::PgPool::connect(&format!("{base}/postgres")).await {
        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
        pool.close().await;
    }
}

/// CPU time a process used so far (user and system, its reaped children included), in seconds.
pub fn cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name is in parentheses and may hold spaces; the fields follow it.
    let Some(fields) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    // utime, stime, cutime and cstime are fields 14 to 17 of the line, 12 to 15 after the name.
    let ticks: u64 = fields
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / clock_ticks_per_s()
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux unless it says otherwise).
fn clock_ticks_per_s() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU seconds used so far by every process whose command name starts with `comm`.
pub fn cpu_s_of_all(comm: &str) -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let matches = std::fs::read_to_string(entry.path().join("comm"))
            .is_ok_and(|c| c.trim().starts_with(comm));
        if matches {
            total += cpu_s(pid);
        }
    }
    total
}
