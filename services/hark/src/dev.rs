//! `hark dev`: the whole of hark in one process, for trying it out and for small installations.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hark_core::config::Config;
use hark_worker::worker::Worker;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub async fn run(
    mut config: Config,
    workers: u32,
    data_dir: PathBuf,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    anyhow::ensure!(workers >= 1, "--workers must be at least 1");
    std::fs::create_dir_all(&data_dir).with_context(|| {
        format!(
            "cannot create the data directory {} (--data-dir, HARK_DATA_DIR)",
            data_dir.display()
        )
    })?;
    prepare(&mut config, &data_dir)?;
    let mut private = crate::servers::ensure(&mut config, &data_dir).await?;
    let ran = serve(config, workers, &data_dir, &private.started, shutdown).await;
    private.stop().await;
    ran
}

/// What hark dev sets that a config left empty: the playground's HTTP adapter bot with a token
/// of its own, and the gateway's spool under the data directory.
fn prepare(config: &mut Config, data_dir: &Path) -> anyhow::Result<()> {
    let http = &mut config.gateway.http;
    if http.platforms.is_empty() && http.bots.is_empty() && http.webhook_url.is_empty() {
        http.platforms = vec!["web".into()];
        http.bots = vec!["web:playground".into()];
    }
    // A page the developer opens in a browser must not be able to speak for the adapter's
    // users, so even on loopback the adapter takes a token: one made for this data directory.
    if !http.platforms.is_empty() && http.token.is_empty() {
        http.token = hark_core::secret::Secret::new(http_token(data_dir)?);
    }
    if config.gateway.spool_dir.is_empty() {
        config.gateway.spool_dir = data_dir.join("spool").display().to_string();
    }
    Ok(())
}

/// The file under the data directory holding the HTTP adapter's token that hark dev made.
pub const HTTP_TOKEN_FILE: &str = "http-token";

/// The HTTP adapter's token of `data_dir`, made (readable by its owner only) when there is none.
fn http_token(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join(HTTP_TOKEN_FILE);
    if let Ok(token) = std::fs::read_to_string(&path)
        && token.trim().len() >= 32
    {
        return Ok(token.trim().to_owned());
    }
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(token.as_bytes()))
        .with_context(|| {
            format!(
                "cannot write the HTTP adapter's token to {} (--data-dir)",
                path.display()
            )
        })?;
    Ok(token)
}

async fn serve(
    config: Config,
    workers: u32,
    data_dir: &Path,
    started: &[String],
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(control) = hark_control::app::App::build_waiting(config.clone(), &shutdown)
        .await
        .context("task-control did not start")?
    else {
        return Ok(());
    };
    let gateway = hark_gateway::app::App::build(&config)
        .await
        .context("the gateway did not start")?;
    let (settings, demo) = crate::llm_settings(&config).await?;
    let mut built = Vec::new();
    for n in 1..=workers {
        let id = format!("{}-dev{n}", crate::default_worker_id());
        match Worker::build_waiting(&config, settings.clone(), id, &shutdown).await? {
            Some(worker) => built.push(worker),
            None => return Ok(()),
        }
    }

    let metrics =
        crate::listen::metrics(&config, built.first().map(Worker::health), shutdown.clone())
            .await?;
    let llm = match &demo {
        Some(demo) => crate::said!(
            zh: "内置的演示模型，在 {}（设置 llm.base_url 即可使用真正的模型）",
            en: "the built-in DEMO model at {} (set llm.base_url for a real one)",
            demo.base_url()
        ),
        None => crate::said!(
            zh: "{}（模型 {}）",
            en: "{} (model {})",
            config.llm.base_url,
            if config.llm.model.is_empty() {
                "unset"
            } else {
                &config.llm.model
            }
        ),
    };
    let console = match hark_control::console::url(control.console_addr()) {
        Some(url) if config.control.api_tokens.iter().any(|t| !t.is_empty()) => {
            crate::said!(
                zh: "{url}（用 control.api_tokens 之一登录）",
                en: "{url} (sign in with one of control.api_tokens)"
            )
        }
        Some(url) => url,
        None => crate::said!(
            zh: "关闭（control.http_listen 为空）",
            en: "off (control.http_listen is empty)"
        ),
    };
    let gateway_addr = hark_core::config::dial(gateway.addr());
    let onebot_token = if config.gateway.onebot.access_token.is_empty() {
        crate::said!(
            zh: "没有访问令牌；请设置 gateway.onebot.access_token（HARK_GATEWAY__ONEBOT__ACCESS_TOKEN），\
                 并在机器人里填同一个令牌",
            en: "no access token; set gateway.onebot.access_token (HARK_GATEWAY__ONEBOT__ACCESS_TOKEN) \
                 and the same token in the bot"
        )
    } else {
        crate::said!(
            zh: "机器人以 gateway.onebot.access_token 作为令牌",
            en: "the bot sends gateway.onebot.access_token as its token"
        )
    };
    let http_adapter = if !config.gateway.http.platforms.is_empty() {
        let made = data_dir.join(HTTP_TOKEN_FILE);
        let token = match std::fs::read_to_string(&made) {
            Ok(t) if config.gateway.http.token.matches(t.trim()) => {
                crate::said!(zh: "{} 里的令牌", en: "the token in {}", made.display())
            }
            _ => "gateway.http.token".into(),
        };
        crate::said!(
            zh: "http://{gateway_addr}/api/v1/messages（平台 {}；Authorization: Bearer <{token}>）",
            en: "http://{gateway_addr}/api/v1/messages (platforms {}; Authorization: Bearer <{token}>)",
            config.gateway.http.platforms.join(", "),
        )
    } else {
        crate::said!(
            zh: "关闭（gateway.http.platforms 为空）",
            en: "off (gateway.http.platforms is empty)"
        )
    };
    let mut banner = crate::said!(
        zh: "\nhark dev 已启动\n  \
         网页控制台：              {console}\n  \
         gRPC API：                http://{}\n  \
         OneBot 反向 WebSocket：   ws://{gateway_addr}/onebot/v11/ws（{onebot_token}）\n  \
         HTTP 适配器：             {http_adapter}\n  \
         LLM：                     {llm}\n  \
         工作进程：                {workers}\n  \
         数据库：                  {}\n  \
         NATS：                    {}（命名空间 {}）\n  \
         数据：                    {}\n",
        en: "\nhark dev is up\n  \
         web console:              {console}\n  \
         gRPC API:                 http://{}\n  \
         OneBot reverse WebSocket: ws://{gateway_addr}/onebot/v11/ws ({onebot_token})\n  \
         HTTP adapter:             {http_adapter}\n  \
         LLM:                      {llm}\n  \
         workers:                  {workers}\n  \
         database:                 {}\n  \
         NATS:                     {} (namespace {})\n  \
         data:                     {}\n",
        hark_core::config::dial(control.grpc_addr()),
        hark_core::secret::redact_url(config.database.url.expose()),
        hark_core::secret::redact_url(config.nats.url.expose()),
        config.nats.namespace,
        data_dir.display(),
    );
    if let Some(metrics) = metrics {
        banner.push_str(&crate::said!(
            zh: "  指标：                    http://{metrics}/metrics\n",
            en: "  metrics:                  http://{metrics}/metrics\n"
        ));
    }
    for server in started {
        banner.push_str(&crate::said!(
            zh: "  已启动：                  {server}\n",
            en: "  started:                  {server}\n"
        ));
    }
    banner.push_str(&crate::said!(
        zh: "按 Ctrl-C 停止；再按一次立即退出。\n",
        en: "Stop with Ctrl-C; a second Ctrl-C exits at once.\n"
    ));
    eprintln!("{banner}");

    let tracker = TaskTracker::new();
    let failed = CancellationToken::new();
    // Workers stop first, handing their tasks back to a task-control that still answers; then
    // task-control and the gateway.
    let workers_done = CancellationToken::new();
    for (stop_when, role) in [
        (workers_done.clone(), Role::Control(Box::new(control))),
        (workers_done.clone(), Role::Gateway(Box::new(gateway))),
    ] {
        let (stop, failed) = (shutdown.clone(), failed.clone());
        tracker.spawn(async move {
            let ran = match role {
                Role::Control(control) => control
                    .run_until_stopped(stop_when)
                    .await
                    .map_err(|e| ("task-control", e.to_string())),
                Role::Gateway(gateway) => gateway
                    .run_until_stopped(stop_when)
                    .await
                    .map_err(|e| ("the gateway", e.to_string())),
            };
            if let Err((what, e)) = ran {
                tracing::error!(error = %e, "{what} stopped");
                failed.cancel();
                stop.cancel();
            }
        });
    }
    let workers_tracker = TaskTracker::new();
    for worker in built {
        let (stop, failed) = (shutdown.clone(), failed.clone());
        workers_tracker.spawn(async move {
            if let Err(e) = worker.run_until_stopped(stop.clone()).await {
                tracing::error!(error = %e, "a worker stopped");
                failed.cancel();
                stop.cancel();
            }
        });
    }
    workers_tracker.close();
    {
        let stop = shutdown.clone();
        tracker.spawn(async move {
            stop.cancelled().await;
            workers_tracker.wait().await;
            workers_done.cancel();
        });
    }
    tracker.close();
    tracker.wait().await;
    drop(demo);
    anyhow::ensure!(
        !failed.is_cancelled(),
        "hark dev stopped because a part of it failed"
    );
    tracing::info!("hark dev stopped");
    Ok(())
}

/// A role `hark dev` runs beside its workers.
enum Role {
    Control(Box<hark_control::app::App>),
    Gateway(Box<hark_gateway::app::App>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hark-dev-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("data dir");
        dir
    }

    #[test]
    fn hark_dev_gives_the_http_adapter_a_private_token_and_keeps_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = data_dir();
        let mut config = Config::default();
        prepare(&mut config, &dir).expect("prepared");
        let token = config.gateway.http.token.expose().to_owned();
        assert!(token.len() >= 32, "{token}");
        let file = dir.join(HTTP_TOKEN_FILE);
        let mode = std::fs::metadata(&file)
            .expect("token file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by its owner only: {mode:o}");
        // The next start uses the same token, so clients keep working.
        let mut again = Config::default();
        prepare(&mut again, &dir).expect("prepared");
        assert_eq!(again.gateway.http.token.expose(), token);
        // A token the operator set is kept.
        let mut set = Config::default();
        set.gateway.http.token = "mine-and-long-enough".into();
        prepare(&mut set, &dir).expect("prepared");
        assert_eq!(set.gateway.http.token.expose(), "mine-and-long-enough");
        let _ = std::fs::remove_dir_all(dir);
    }
}
