//! What a client sees, measured over the public gRPC API only, from this separate process: no
//! NATS subscription, no look at the scripted LLM's requests. Both task kinds side by side: a
//! questionnaire (hark's own mechanics, no model) and an agent that calls the scripted model
//! (which answers at once).
//!
//! - **W1**: a task waits on its question (seen through `WatchTask`); the client answers with
//!   `AnswerQuestion` waiting for the next question or the end, and times until that reply,
//!   carrying the completed task's output, is in its hands.
//! - **W2**: N tasks created with a bounded number of calls in flight and each seen waiting on
//!   one `WatchTasks` stream; then all N answered the same way, each answer's reply carrying its
//!   task's output.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures_util::StreamExt;
use hark_proto::v1 as pb;
use serde_json::json;
use tokio::{sync::Semaphore, task::JoinSet};

use super::{Bench, Report, limits::Limits, mib, summary, w2};

const WAIT: Duration = Duration::from_secs(30);

/// The kind of task measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Questionnaire,
    Agent,
}

impl Kind {
    pub const BOTH: [Kind; 2] = [Kind::Questionnaire, Kind::Agent];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Questionnaire => "questionnaire",
            Kind::Agent => "agent",
        }
    }

    /// A task of this kind that asks one question, then ends with the answer in its output.
    fn task(self, owner: &str, script: &str, label: &str) -> pb::CreateTaskRequest {
        match self {
            Kind::Questionnaire => pb::CreateTaskRequest {
                owner: owner.into(),
                goal: label.into(),
                questionnaire: vec![pb::FormQuestion {
                    key: "go".into(),
                    text: "Go on?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            Kind::Agent => pb::CreateTaskRequest {
                owner: owner.into(),
                goal: format!("[script:{script}] {label}"),
                ..Default::default()
            },
        }
    }
}

/// An answer that waits for the task's end; the completed event it brings back.
async fn answer_until_end(
    api: &mut hark_proto::v1::task_service_client::TaskServiceClient<tonic::transport::Channel>,
    task: &str,
    answer: &str,
) -> anyhow::Result<pb::TaskEvent> {
    let replied = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: task.into(),
            answer: answer.into(),
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            wait_timeout_ms: WAIT.as_millis() as u32,
            ..Default::default()
        })
        .await
        .context("AnswerQuestion failed")?
        .into_inner();
    let event = replied
        .event
        .with_context(|| format!("task {task} did not end within {WAIT:?} of its answer"))?;
    anyhow::ensure!(
        event.state == pb::TaskState::Completed as i32,
        "task {task} ended {:?}: {}",
        pb::TaskState::try_from(event.state),
        event.error
    );
    anyhow::ensure!(
        event.result.contains(answer),
        "task {task}'s output `{}` lacks its answer `{answer}`",
        event.result
    );
    Ok(event)
}

pub async fn w1(
    bench: &mut Bench,
    kind: Kind,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Report> {
    let name = format!("w1-client-{}", kind.name());
    let mut samples = Vec::with_capacity(rounds);
    let mut api = bench.api.clone();
    for round in 0..warmup + rounds {
        let token = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let task = api
            .create_task(kind.task("bench:w1c", "w1", &format!("{name} round {round}")))
            .await
            .context("CreateTask failed")?
            .into_inner()
            .task
            .context("no task")?;
        let mut watch = api
            .watch_task(pb::WatchTaskRequest {
                task_id: task.id.clone(),
            })
            .await
            .context("WatchTask failed")?
            .into_inner();
        loop {
            let event = tokio::time::timeout(WAIT, watch.next())
                .await
                .context("a W1 task did not reach waiting_input within 30s")?
                .context("the watch ended before the task waited")??;
            if event.state == pb::TaskState::WaitingInput as i32 {
                break;
            }
        }
        drop(watch);
        let answer = format!("yes-{token}");
        let t0 = Instant::now();
        answer_until_end(&mut api, &task.id, &answer).await?;
        if round >= warmup {
            samples.push(t0.elapsed());
        }
    }
    let stats = summary(&mut samples);
    let mut json =
        json!({"workload": name, "kind": kind.name(), "rounds": rounds, "warmup": warmup});
    if let (Some(obj), Some(s)) = (json.as_object_mut(), stats.as_object()) {
        obj.extend(s.clone());
    }
    let rows = vec![(
        name.clone(),
        format!(
            "{} task, answer sent → reply with the output received, over gRPC (p50 / p90 / p99)",
            kind.name()
        ),
        format!(
            "{} / {} / {} ms",
            stats["p50_ms"], stats["p90_ms"], stats["p99_ms"]
        ),
    )];
    Ok(Report { json, rows })
}

pub async fn w2(
    bench: &mut Bench,
    kind: Kind,
    n: usize,
    in_flight: usize,
    limits: Option<&Limits>,
) -> anyhow::Result<Report> {
    let name = format!("w2-client-{}", kind.name());
    let owner = format!(
        "bench:w2c-{}-{}",
        kind.name(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let idle = w2::memory(bench);
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut watch = bench
        .api
        .clone()
        .watch_tasks(pb::WatchTasksRequest {
            owner: owner.clone(),
            states: vec![pb::TaskState::WaitingInput as i32],
            ..Default::default()
        })
        .await
        .context("WatchTasks failed")?
        .into_inner();

    // Suspend: create N tasks, each seen waiting on the stream.
    let cpu_start = w2::cpu(bench);
    let t0 = Instant::now();
    let mut creating = JoinSet::new();
    let creator = {
        let api = bench.api.clone();
        let slots = slots.clone();
        let owner = owner.clone();
        tokio::spawn(async move {
            for i in 0..n {
                let permit = slots.clone().acquire_owned().await?;
                let mut api = api.clone();
                let request = kind.task(&owner, "w2", &format!("w2 task {i}"));
                creating.spawn(async move {
                    let created = api.create_task(request).await;
                    drop(permit);
                    created.map(|r| r.into_inner().task.map(|t| t.id).unwrap_or_default())
                });
            }
            let mut ids = Vec::with_capacity(n);
            while let Some(created) = creating.join_next().await {
                ids.push(created?.context("CreateTask failed")?);
            }
            anyhow::Ok(ids)
        })
    };
    let mut seen = HashSet::with_capacity(n);
    while seen.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(120), watch.next())
            .await
            .context("W2 tasks stopped reaching waiting_input for 2 minutes")?
            .context("the WatchTasks stream ended")??;
        if let Some(event) = next.event {
            seen.insert(event.task_id);
        }
    }
    let suspend_s = t0.elapsed().as_secs_f64();
    drop(watch);
    let ids = creator.await??;
    let cpu_suspend = w2::cpu_per_task(&cpu_start, &w2::cpu(bench), n);

    // The processes settle before their memory is read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = w2::memory(bench);

    // Resume: answer all N, each answer waiting for its task's end.
    let cpu_waiting = w2::cpu(bench);
    let t1 = Instant::now();
    let mut answering = JoinSet::new();
    for (i, id) in ids.into_iter().enumerate() {
        let permit = slots.clone().acquire_owned().await?;
        let mut api = bench.api.clone();
        answering.spawn(async move {
            let done = answer_until_end(&mut api, &id, &format!("w2-{i}")).await;
            drop(permit);
            done.map(|_| ())
        });
    }
    while let Some(answered) = answering.join_next().await {
        answered??;
    }
    let resume_s = t1.elapsed().as_secs_f64();
    let cpu_resume = w2::cpu_per_task(&cpu_waiting, &w2::cpu(bench), n);

    let suspends_per_s = n as f64 / suspend_s;
    let resumes_per_s = n as f64 / resume_s;
    let hark_total = w2::hark_total(&waiting);
    let mut json = json!({
        "workload": name,
        "kind": kind.name(),
        "tasks": n,
        "in_flight": in_flight,
        "suspends_per_s": suspends_per_s.round(),
        "resumes_per_s": resumes_per_s.round(),
        "suspend_all_s": (suspend_s * 1000.0).round() / 1000.0,
        "resume_all_s": (resume_s * 1000.0).round() / 1000.0,
        "hark_rss_total_mib_waiting": mib(hark_total),
        "cpu_ms_per_task_suspend": w2::cpu_json(&cpu_suspend),
        "cpu_ms_per_task_resume_to_completion": w2::cpu_json(&cpu_resume),
        "memory_idle_mib": w2::memory_json(&idle),
        "memory_waiting_mib": w2::memory_json(&waiting),
    });
    let mut rows = vec![
        (
            name.clone(),
            format!(
                "suspends/s ({n} {} tasks created and seen waiting over gRPC)",
                kind.name()
            ),
            format!("{suspends_per_s:.0}"),
        ),
        (
            name.clone(),
            format!("resumes/s ({in_flight} answers in flight, each reply bringing its output)"),
            format!("{resumes_per_s:.0}"),
        ),
        (
            name.clone(),
            "CPU ms per task, create to seen waiting, by process".to_owned(),
            w2::cpu_row(&cpu_suspend),
        ),
        (
            name.clone(),
            "CPU ms per task, answer to output received, by process".to_owned(),
            w2::cpu_row(&cpu_resume),
        ),
    ];
    rows.extend(w2::memory_rows(&name, &idle, &waiting, n));
    if let Some(limits) = limits
        && let Some(obj) = json.as_object_mut()
    {
        obj.insert(
            "pg_commits_per_s_limit".into(),
            json!(limits.commits_per_s.round()),
        );
        obj.insert(
            "js_publish_acks_per_s_limit".into(),
            json!(limits.publish_per_s.round()),
        );
    }
    Ok(Report { json, rows })
}
