//! `hark health <role>`: a healthcheck for containers, with nothing but the hark binary.

use std::time::Duration;

use anyhow::{Context as _, bail};
use hark_core::{bus::Names, config::Config};

use crate::said;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Role {
    /// task-control's gRPC health service reports SERVING.
    Control,
    /// The gateway's /healthz answers.
    Gateway,
    /// With `metrics.listen`, the worker's own /healthz (its pull loop, NATS, task-control);
    /// without, NATS answers and the run job stream exists.
    Worker,
}

/// The role of the hark process running as PID 1 — the container's command — from its command
/// line (`hark worker --id …` → worker); `dev` runs them all.
pub fn of_container() -> anyhow::Result<Vec<Role>> {
    let cmdline = std::fs::read("/proc/1/cmdline")
        .with_context(|| said!(zh: "读不到 /proc/1/cmdline", en: "cannot read /proc/1/cmdline"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    roles_in(&args).with_context(|| {
        said!(
            zh: "PID 1（{}）运行的不是 hark 的角色：请指明一个，如 `hark health worker`",
            en: "PID 1 ({}) runs no hark role: name one, as in `hark health worker`",
            args.first().map(String::as_str).unwrap_or("?")
        )
    })
}

/// The roles a `hark …` command line runs, if it runs any.
fn roles_in(args: &[String]) -> Option<Vec<Role>> {
    let program = args.first()?;
    let is_hark = std::path::Path::new(program)
        .file_name()
        .is_some_and(|name| name == "hark");
    if !is_hark {
        return None;
    }
    // The first word that is not an option (or an option's value) is the subcommand.
    let mut words = args.iter().skip(1);
    while let Some(word) = words.next() {
        if word == "--config" {
            words.next();
            continue;
        }
        if word.starts_with('-') {
            continue;
        }
        return match word.as_str() {
            "control" => Some(vec![Role::Control]),
            "gateway" => Some(vec![Role::Gateway]),
            "worker" => Some(vec![Role::Worker]),
            "dev" => Some(vec![Role::Control, Role::Gateway]),
            _ => None,
        };
    }
    None
}

pub async fn check(config: &Config, role: Role) -> anyhow::Result<()> {
    let within = Duration::from_secs(5);
    check_role(config, role, within).await?;
    streams_led(config, within).await
}

/// Every stream has a leader: on a NATS cluster, one whose replicas are electing a leader takes
/// no message meanwhile.
async fn streams_led(config: &Config, within: Duration) -> anyhow::Result<()> {
    let client = tokio::time::timeout(
        within,
        hark_core::bus::connect_client(&config.nats, "hark health"),
    )
    .await
    .with_context(|| said!(zh: "NATS 没有及时应答", en: "NATS did not answer in time"))??;
    let names = Names::of(&config.nats)?;
    let js = async_nats::jetstream::new(client);
    let leaderless = hark_core::bus::leaderless(&js, &names, within).await;
    if !leaderless.is_empty() {
        bail!(said!(
            zh: "JetStream 流 {} 没有 leader（或还不存在），暂时不能收消息：看 `nats stream report`",
            en: "JetStream stream {} has no leader (or does not exist yet) and takes no message now: see `nats stream report`",
            leaderless.join(", ")
        ));
    }
    let left = hark_core::bus::left_behind(&js, &names).await;
    if !left.is_empty() {
        let left: Vec<String> = left
            .iter()
            .map(|(stream, held)| format!("{stream} ({held})"))
            .collect();
        bail!(said!(
            zh: "分区流 {} 超出 nats.partitions，里面还有没人处理的消息：先把 nats.partitions 调回去，等它清空再调小",
            en: "partition stream {} lies beyond nats.partitions and still holds messages nobody takes: set nats.partitions back until it is empty, then lower it",
            left.join(", ")
        ));
    }
    Ok(())
}

async fn check_role(config: &Config, role: Role, within: Duration) -> anyhow::Result<()> {
    match role {
        Role::Control => {
            let url = format!(
                "http://{}",
                hark_core::config::dial(config.control.grpc_listen)
            );
            let channel = tonic::transport::Endpoint::from_shared(url.clone())?
                .connect_timeout(within)
                .connect()
                .await
                .with_context(|| {
                    said!(zh: "task-control 在 {} 没有应答", en: "task-control does not answer at {}", url)
                })?;
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "hark.v1.TaskService".into(),
                })
                .await
                .with_context(|| {
                    said!(zh: "task-control 的健康检查失败", en: "task-control's health check failed")
                })?
                .into_inner()
                .status;
            if status != tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                bail!(said!(
                    zh: "task-control 尚未就绪（状态 {}）",
                    en: "task-control is not serving (status {})",
                    status
                ));
            }
        }
        Role::Gateway => {
            get_ok(
                hark_core::config::dial(config.gateway.listen),
                &said!(zh: "网关", en: "the gateway"),
                within,
            )
            .await?
        }
        // Without `metrics.listen`, that NATS answers and every stream exists with a leader is
        // what tells: `streams_led` checks it for every role.
        Role::Worker => {
            if let Some(addr) = config.metrics_listen()? {
                let what = said!(zh: "worker", en: "the worker");
                get_ok(hark_core::config::dial(addr), &what, within).await?
            }
        }
    }
    Ok(())
}

/// `GET /healthz` of `what` at `addr` answers 200; otherwise says what it answered.
async fn get_ok(addr: std::net::SocketAddr, what: &str, within: Duration) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let late = || said!(zh: "{} 没有及时应答", en: "{} did not answer in time", what);
    let mut stream = tokio::time::timeout(within, tokio::net::TcpStream::connect(addr))
        .await
        .with_context(late)?
        .with_context(
            || said!(zh: "{} 在 {} 没有应答", en: "{} does not answer at {}", what, addr),
        )?;
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut answer))
        .await
        .with_context(late)??;
    let answer = String::from_utf8_lossy(&answer);
    if !answer.starts_with("HTTP/1.1 200") {
        let status = answer.lines().next().unwrap_or_default();
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        bail!(said!(
            zh: "{} 在 {} 的 /healthz 答复 {}：{}",
            en: "{}'s /healthz at {} answered {}: {}",
            what,
            addr,
            status,
            body
        ));
    }
    Ok(())
}

/// `hark health --dead-letters`: what was set aside because it could never be handled, newest
/// first, at most `limit` of them, with the reason of each. Dead letters are not an outage:
/// listing them exits 0.
pub async fn dead_letters(config: &Config, limit: u64) -> anyhow::Result<String> {
    use hark_core::consume;
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        hark_core::bus::connect_client(&config.nats, "hark health"),
    )
    .await
    .with_context(|| said!(zh: "NATS 没有及时应答", en: "NATS did not answer in time"))??;
    let names = Names::of(&config.nats)?;
    let js = async_nats::jetstream::new(client);
    let name = names.dead_letter_stream();
    let Ok(mut stream) = js.get_stream(&name).await else {
        return Ok(said!(
            zh: "没有死信（流 {} 还不存在）\n",
            en: "no dead letters (the stream {} does not exist yet)\n",
            name
        ));
    };
    let state = stream
        .info()
        .await
        .with_context(|| said!(zh: "读不到死信流", en: "cannot read the dead-letter stream"))?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(said!(zh: "{} 中没有死信\n", en: "no dead letters in {}\n", name));
    }
    let mut out = if crate::said::zh() {
        format!(
            "{name} 中有 {} 条死信（保留 30 天），最新的在前：\n",
            state.messages
        )
    } else {
        format!(
            "{} dead letter{} in {name} (kept 30 days); newest first:\n",
            state.messages,
            if state.messages == 1 { "" } else { "s" }
        )
    };
    let header = |m: &async_nats::jetstream::message::StreamMessage, key: &str| {
        m.headers
            .get(key)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default()
    };
    let mut shown = 0;
    let mut seq = state.last_sequence;
    while shown < limit && seq >= state.first_sequence && seq > 0 {
        if let Ok(m) = stream.get_raw_message(seq).await {
            let at = m
                .time
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let source = names.dead_letter_source(&m.subject).unwrap_or(&m.subject);
            out.push_str(&said!(
                zh: "  #{} {} {}：{}\n    来自 {} #{}（{}），消息 id {}，{} 字节{}\n",
                en: "  #{} {} {}: {}\n    from {} #{} ({}), message id {}, {} bytes{}\n",
                seq,
                at,
                source,
                header(&m, consume::REASON_HEADER),
                header(&m, consume::STREAM_HEADER),
                header(&m, consume::SEQUENCE_HEADER),
                header(&m, consume::SUBJECT_HEADER),
                header(&m, consume::MSG_ID_HEADER),
                m.payload.len(),
                match header(&m, consume::CUT_HEADER) {
                    cut if cut.is_empty() => String::new(),
                    cut => said!(zh: "（原为 {}，已截断）", en: " (cut from {})", cut),
                },
            ));
            shown += 1;
        }
        seq -= 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(line: &str) -> Option<Vec<&'static str>> {
        let args: Vec<String> = line.split(' ').map(str::to_owned).collect();
        roles_in(&args).map(|roles| {
            roles
                .into_iter()
                .map(|r| match r {
                    Role::Control => "control",
                    Role::Gateway => "gateway",
                    Role::Worker => "worker",
                })
                .collect()
        })
    }

    #[test]
    fn the_role_is_read_from_a_hark_command_line() {
        assert_eq!(roles("hark worker --id w1"), Some(vec!["worker"]));
        assert_eq!(roles("/usr/local/bin/hark control"), Some(vec!["control"]));
        assert_eq!(
            roles("hark --config /etc/hark/hark.toml gateway"),
            Some(vec!["gateway"])
        );
        assert_eq!(roles("hark dev"), Some(vec!["control", "gateway"]));
    }

    #[test]
    fn a_command_line_that_runs_no_role_has_none() {
        assert_eq!(roles("hark migrate --wait 10m"), None);
        assert_eq!(roles("hark --help"), None);
        assert_eq!(roles("/bin/sh -c hark worker"), None);
        assert_eq!(roles("hark"), None);
    }
}
