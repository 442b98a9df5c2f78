//! W2, mass suspend and resume: N tasks that all end up waiting, the memory they cost while they
//! wait, then all N answered with a bounded number of answers in flight.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::{sync::Semaphore, task::JoinSet};

use super::{Bench, Report, limits::Limits, mib, procs};

/// Postgres statements on the resume path, answer to the worker's next LLM call: the answer's
/// read, the answer and the claim. All three are taken in batches, so under load they share their
/// transactions with others; the transactions a task really costs are measured.
const STATEMENTS_PER_RESUME: f64 = 3.0;
/// NATS round trips on that path: the run job's publish and ack, its delivery to the worker,
/// the claim request and reply, and the job's ack (not awaited).
const NATS_PER_RESUME: f64 = 4.0;

async fn xact_commit(bench: &Bench) -> anyhow::Result<i64> {
    let pool = sqlx::PgPool::connect(bench.config.database.url.expose()).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(n)
}

pub(super) fn memory(bench: &Bench) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = bench
        .procs
        .list()
        .iter()
        .map(|p| {
            (
                format!("hark {} (pid {})", p.role, p.pid),
                procs::rss(p.pid),
            )
        })
        .collect();
    out.push((
        "postgres (all processes, PSS)".into(),
        procs::postgres_pss(),
    ));
    out
}

/// CPU seconds used so far, by process: each hark process, all of Postgres, nats-server, the
/// bench itself (the scripted LLM, and the gRPC client when it is Rust's), and the Python client
/// `client` when there is one.
pub(super) fn cpu(bench: &Bench, client: Option<u32>) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = bench
        .procs
        .list()
        .iter()
        .map(|p| (format!("hark {}", p.role), procs::cpu_s(p.pid)))
        .collect();
    out.push(("postgres".into(), procs::cpu_s_of_all("postgres")));
    out.push(("nats-server".into(), procs::cpu_s_of_all("nats-server")));
    out.push(("bench".into(), procs::cpu_s(std::process::id())));
    if let Some(pid) = client {
        out.push(("python client".into(), procs::cpu_s(pid)));
    }
    out
}

/// CPU milliseconds per task between two [`cpu`] readings, by process, with the total last.
pub(super) fn cpu_per_task(
    before: &[(String, f64)],
    after: &[(String, f64)],
    n: usize,
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = before
        .iter()
        .zip(after)
        .map(|((name, b), (_, a))| (name.clone(), (a - b) * 1000.0 / n as f64))
        .collect();
    let total = out.iter().map(|(_, ms)| ms).sum();
    out.push(("total".into(), total));
    out
}

pub(super) fn cpu_json(per_task: &[(String, f64)]) -> serde_json::Value {
    per_task
        .iter()
        .map(|(k, v)| (k.clone(), json!((v * 1000.0).round() / 1000.0)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The resident memory of all hark processes together.
pub(super) fn hark_total(memory: &[(String, u64)]) -> u64 {
    memory
        .iter()
        .filter(|(name, _)| name.starts_with("hark"))
        .map(|(_, b)| b)
        .sum()
}

pub(super) fn memory_json(memory: &[(String, u64)]) -> serde_json::Value {
    memory
        .iter()
        .map(|(k, v)| (k.clone(), json!(mib(*v))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The table's rows of each process's memory idle and with `n` waiting, and of all hark.
pub(super) fn memory_rows(
    workload: &str,
    idle: &[(String, u64)],
    waiting: &[(String, u64)],
    n: usize,
) -> Vec<(String, String, String)> {
    let mut rows: Vec<(String, String, String)> = idle
        .iter()
        .zip(waiting)
        .map(|((name, before), (_, after))| {
            (
                workload.to_owned(),
                format!("memory of {name}: idle → {n} waiting"),
                format!("{:.1} → {:.1} MiB", mib(*before), mib(*after)),
            )
        })
        .collect();
    rows.push((
        workload.to_owned(),
        format!("all hark processes with {n} waiting"),
        format!("{:.1} MiB", mib(hark_total(waiting))),
    ));
    rows
}

pub(super) fn cpu_row(per_task: &[(String, f64)]) -> String {
    per_task
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn run(
    bench: &mut Bench,
    n: usize,
    in_flight: usize,
    limits: Option<&Limits>,
) -> anyhow::Result<Report> {
    bench.events.count_only(true);
    let idle = memory(bench);
    let stored_before = super::storage::relations(bench).await?;
    let base_waiting = bench.events.count(pb::TaskState::WaitingInput);
    let base_completed = bench.events.count(pb::TaskState::Completed);
    let base_answered = bench.arrivals.answered();
    let slots = Arc::new(Semaphore::new(in_flight));

    // Suspend: create N tasks; each asks at once.
    let cpu_start = cpu(bench, None);
    let t0 = Instant::now();
    let mut creating = JoinSet::new();
    for i in 0..n {
        let permit = slots.clone().acquire_owned().await?;
        let mut api = bench.api.clone();
        creating.spawn(async move {
            let task = api
                .create_task(pb::CreateTaskRequest {
                    owner: "bench:w2".into(),
                    goal: format!("[script:w2] w2 task {i}"),
                    ..Default::default()
                })
                .await;
            drop(permit);
            task.map(|r| r.into_inner().task.map(|t| t.id).unwrap_or_default())
        });
    }
    let mut ids = Vec::with_capacity(n);
    while let Some(created) = creating.join_next().await {
        ids.push(created?.context("CreateTask failed")?);
    }
    let t_suspended = tokio::time::timeout(
        Duration::from_secs(600),
        bench
            .events
            .until_count(pb::TaskState::WaitingInput, base_waiting + n),
    )
    .await
    .context("not all W2 tasks reached waiting_input within 10 minutes")?;
    let suspend_s = t_suspended.duration_since(t0).as_secs_f64();
    let cpu_suspend = cpu_per_task(&cpu_start, &cpu(bench, None), n);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = memory(bench);
    let stored = super::storage::relations(bench).await?;
    let (storage_json, storage_rows) =
        super::storage::report(&super::storage::growth(&stored_before, &stored, n), n);
    let xact_before = xact_commit(bench).await?;

    // Resume: answer all N.
    let cpu_waiting = cpu(bench, None);
    let t1 = Instant::now();
    let mut answering = JoinSet::new();
    for (i, id) in ids.iter().enumerate() {
        let permit = slots.clone().acquire_owned().await?;
        let mut api = bench.api.clone();
        let id = id.clone();
        answering.spawn(async move {
            let answered = api
                .answer_question(pb::AnswerQuestionRequest {
                    task_id: id,
                    answer: format!("w2-{i}"),
                    ..Default::default()
                })
                .await;
            drop(permit);
            answered.map(|_| ())
        });
    }
    while let Some(answered) = answering.join_next().await {
        answered?.context("AnswerQuestion failed")?;
    }
    let answers_s = t1.elapsed().as_secs_f64();
    let t_resumed = tokio::time::timeout(
        Duration::from_secs(600),
        bench.arrivals.until_answered(base_answered + n),
    )
    .await
    .context("not all W2 tasks resumed within 10 minutes")?;
    let t_done = tokio::time::timeout(
        Duration::from_secs(600),
        bench
            .events
            .until_count(pb::TaskState::Completed, base_completed + n),
    )
    .await
    .context("not all W2 tasks completed within 10 minutes")?;
    let cpu_resume = cpu_per_task(&cpu_waiting, &cpu(bench, None), n);
    let resume_s = t_resumed.duration_since(t1).as_secs_f64();
    let done_s = t_done.duration_since(t1).as_secs_f64();
    // Statistics are flushed by each backend within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let xact_after = xact_commit(bench).await?;
    let tx_per_task = (xact_after - xact_before) as f64 / n as f64;

    let suspends_per_s = n as f64 / suspend_s;
    let resumes_per_s = n as f64 / resume_s;
    let hark_total = hark_total(&waiting);
    let mut json = json!({
        "workload": "w2",
        "tasks": n,
        "in_flight": in_flight,
        "suspends_per_s": suspends_per_s.round(),
        "resumes_per_s": resumes_per_s.round(),
        "answer_calls_all_s": (answers_s * 1000.0).round() / 1000.0,
        "resume_all_s": (resume_s * 1000.0).round() / 1000.0,
        "complete_all_s": (done_s * 1000.0).round() / 1000.0,
        "pg_transactions_per_task_answer_to_completion": (tx_per_task * 100.0).round() / 100.0,
        "pg_statements_per_resume": STATEMENTS_PER_RESUME,
        "nats_round_trips_per_resume": NATS_PER_RESUME,
        "hark_rss_total_mib_waiting": mib(hark_total),
        "cpu_ms_per_task_suspend": cpu_json(&cpu_suspend),
        "cpu_ms_per_task_resume_to_completion": cpu_json(&cpu_resume),
        "memory_idle_mib": memory_json(&idle),
        "memory_waiting_mib": memory_json(&waiting),
    });
    let mut rows = vec![
        (
            "w2".to_owned(),
            format!("suspends/s ({n} tasks reaching waiting_input)"),
            format!("{suspends_per_s:.0}"),
        ),
        (
            "w2".to_owned(),
            format!("resumes/s ({in_flight} answers in flight)"),
            format!("{resumes_per_s:.0}"),
        ),
        (
            "w2".to_owned(),
            "time until all answer calls returned / all resumed / all completed".to_owned(),
            format!("{answers_s:.2} s / {resume_s:.2} s / {done_s:.2} s"),
        ),
        (
            "w2".to_owned(),
            "Postgres transactions (reads included) per task, answer to completion (measured)"
                .to_owned(),
            format!("{tx_per_task:.2}"),
        ),
    ];
    rows.push((
        "w2".to_owned(),
        "CPU ms per task, create to waiting_input, by process".to_owned(),
        cpu_row(&cpu_suspend),
    ));
    rows.push((
        "w2".to_owned(),
        "CPU ms per task, answer to completion, by process".to_owned(),
        cpu_row(&cpu_resume),
    ));
    rows.extend(memory_rows("w2", &idle, &waiting, n));
    rows.extend(storage_rows);
    if let (Some(obj), Value::Object(storage)) = (json.as_object_mut(), storage_json) {
        obj.extend(storage);
    }
    if let Some(limits) = limits {
        let pg_share = resumes_per_s * tx_per_task / limits.commits_per_s;
        let nats_share = resumes_per_s * NATS_PER_RESUME / limits.publish_per_s;
        if let Some(obj) = json.as_object_mut() {
            obj.insert(
                "resume_share_of_pg_commit_limit".into(),
                json!((pg_share * 1000.0).round() / 1000.0),
            );
            obj.insert(
                "resume_share_of_js_round_trip_limit".into(),
                json!((nats_share * 1000.0).round() / 1000.0),
            );
        }
        rows.push((
            "w2".to_owned(),
            format!(
                "resumes/s × {tx_per_task:.2} transactions (measured), as a share of sequential commits/s"
            ),
            format!("{:.0}%", pg_share * 100.0),
        ));
        rows.push((
            "w2".to_owned(),
            format!("resumes/s × {NATS_PER_RESUME} NATS round trips, as a share of sequential publish acks/s"),
            format!("{:.0}%", nats_share * 100.0),
        ));
    }
    Ok(Report { json, rows })
}
