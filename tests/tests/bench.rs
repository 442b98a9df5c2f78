//! `hark bench` stays a working program: a small run against real processes prints one JSON line
//! per workload and the table, and leaves no database behind. Its numbers are not checked
//! against any time (benchmarks print numbers; tests do not time things).

use std::time::Duration;

use hark_e2e::{hark_binary, nats_url, postgres_url};
use serde_json::Value;

/// `hark bench` with `args`, on this machine's Postgres and NATS, every listener on port 0.
fn bench_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(hark_binary());
    command
        .args(args)
        .env_remove("HARK_CONFIG")
        .env("HARK_NATS__URL", nats_url())
        .env("HARK_DATABASE__URL", format!("{}/postgres", postgres_url()))
        .env("HARK_CONTROL__GRPC_LISTEN", "127.0.0.1:0")
        .env("HARK_GATEWAY__LISTEN", "127.0.0.1:0")
        .env("HARK_CONTROL__HTTP_LISTEN", "")
        .kill_on_drop(true);
    command
}

/// Runs a small bench with `extra` arguments; returns its stdout, its stderr and its JSON lines.
async fn small_bench(extra: &[&str]) -> (String, String, Vec<Value>) {
    // Every listener on port 0: the bench finds where its processes listen.
    let llm = "127.0.0.1:0".to_owned();
    let mut args = vec![
        "bench",
        "--llm-listen",
        &llm,
        "--rounds",
        "3",
        "--warmup",
        "1",
        "--tasks",
        "30",
        "--in-flight",
        "8",
        "--workers",
        "1",
        "--worker-concurrency",
        "8",
    ];
    args.extend_from_slice(extra);
    let output = tokio::time::timeout(Duration::from_secs(300), bench_command(&args).output())
        .await
        .expect("the bench finishes within 5 minutes")
        .expect("the bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "bench failed: {stderr}\n{stdout}");
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (stdout, stderr, lines)
}

/// The database a bench's banner on stderr names (`… database postgres://…/hark_bench_x, …`).
fn database_of(stderr: &str) -> String {
    let database = stderr
        .split("database ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|url| url.rsplit('/').next())
        .expect("the bench names its database")
        .to_owned();
    assert!(database.starts_with("hark_bench_"), "{database}");
    database
}

/// Whether Postgres has a database of this name.
async fn database_exists(database: &str) -> bool {
    let found = tokio::process::Command::new("psql")
        .args([
            &format!("{}/postgres", postgres_url()),
            "-Atc",
            &format!("SELECT count(*) FROM pg_database WHERE datname = '{database}'"),
        ])
        .output()
        .await
        .expect("psql runs");
    assert!(found.status.success(), "psql failed: {found:?}");
    String::from_utf8_lossy(&found.stdout).trim() != "0"
}

#[tokio::test]
async fn client_mode_measures_both_task_kinds_over_the_api() {
    let (stdout, _, lines) = small_bench(&["--client"]).await;
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        workloads,
        [
            "limits",
            "w1-floor",
            "w1-client-questionnaire",
            "w1-client-agent",
            "w2-client-questionnaire",
            "w2-client-agent"
        ]
    );
    floor_measured(&lines[1], &["rust"]);
    for w1 in &lines[2..4] {
        assert_eq!(w1["rounds"], 3);
        assert!(w1["p50_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{w1}");
    }
    for w2 in &lines[4..6] {
        client_w2_measured(w2);
        let pages = w2["first_page_p50_ms"]
            .as_object()
            .expect("the first pages");
        for page in [
            "ListQuestions, first page of 50",
            "WatchTasks opened",
            "console inbox, first page",
        ] {
            assert!(
                pages
                    .get(page)
                    .and_then(Value::as_f64)
                    .is_some_and(|ms| ms > 0.0),
                "{page}: {w2}"
            );
        }
    }
    assert!(
        stdout.contains("| w1-client-questionnaire | questionnaire task, answer sent"),
        "{stdout}"
    );
}

#[tokio::test]
async fn kinds_picks_which_task_kinds_the_client_workloads_drive() {
    let (_, _, lines) =
        small_bench(&["--client", "--workloads", "w2-client", "--kinds", "agent"]).await;
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(workloads, ["w2-client-agent"]);
    client_w2_measured(&lines[0]);
}

/// The floor timed its 3 calls with and without a commit from each of `clients`.
fn floor_measured(floor: &Value, clients: &[&str]) {
    assert_eq!(floor["workload"], "w1-floor");
    assert_eq!(floor["rounds"], 3);
    for client in clients {
        for call in ["commit", "nothing"] {
            let p50 = &floor[format!("{client}_{call}")]["p50_ms"];
            assert!(
                p50.as_f64().is_some_and(|ms| ms > 0.0),
                "{client} {call}: {floor}"
            );
        }
    }
}

#[tokio::test]
async fn controls_starts_and_measures_that_many_replicas_of_task_control() {
    let (stdout, _, lines) = small_bench(&[
        "--client",
        "--controls",
        "2",
        "--workloads",
        "w2-client",
        "--kinds",
        "agent",
    ])
    .await;
    let w2 = &lines[0];
    client_w2_measured(w2);
    // Both replicas ran through the workload, and each has its CPU and memory reported.
    let cpu = w2["cpu_ms_per_task_resume_to_completion"]
        .as_object()
        .expect("CPU by process");
    let controls: Vec<(&String, f64)> = cpu
        .iter()
        .filter(|(name, _)| name.starts_with("hark control"))
        .map(|(name, ms)| (name, ms.as_f64().unwrap_or_default()))
        .collect();
    assert_eq!(controls.len(), 2, "{w2}");
    assert!(controls.iter().all(|(_, ms)| *ms > 0.0), "{controls:?}");
    assert_eq!(
        stdout.matches("| memory of hark control").count(),
        2,
        "{stdout}"
    );
}

/// A client W2 of the small bench's 30 tasks measured both phases, the memory and the CPU.
fn client_w2_measured(w2: &Value) {
    assert_eq!(w2["tasks"], 30);
    for key in [
        "suspends_per_s",
        "resumes_per_s",
        "hark_rss_total_mib_waiting",
    ] {
        assert!(w2[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {w2}");
    }
    for phase in ["suspend", "resume_to_completion"] {
        assert!(
            w2[format!("cpu_ms_per_task_{phase}")]["postgres"].is_number(),
            "{w2}"
        );
    }
}

/// The interpreter of a venv with `bench/python/requirements.txt` (official grpcio).
fn bench_python() -> std::path::PathBuf {
    let path = std::env::var_os("HARK_TEST_BENCH_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/opt/hark-ci/bench-python/bin/python".into());
    assert!(
        path.exists(),
        "{} is missing: make a venv with `pip install -r bench/python/requirements.txt` \
         (as .ci/run does) and point HARK_TEST_BENCH_PYTHON at its python",
        path.display()
    );
    path
}

#[tokio::test]
async fn the_python_grpcio_client_drives_the_same_workloads_beside_the_rust_one() {
    let python = bench_python();
    let python = python.to_str().expect("a UTF-8 path");
    let (stdout, _, lines) = small_bench(&[
        "--client",
        "--python",
        python,
        "--think-ms",
        "20",
        "--workloads",
        "w1-floor,w1-client,w2-client",
    ])
    .await;
    let by_name = |name: &str| {
        lines
            .iter()
            .find(|l| l["workload"] == name)
            .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
    };
    floor_measured(by_name("w1-floor"), &["rust", "python"]);
    for kind in ["questionnaire", "agent"] {
        for driver in ["client", "python"] {
            let w1 = by_name(&format!("w1-{driver}-{kind}"));
            assert_eq!(
                (w1["rounds"].clone(), w1["think_ms"].clone()),
                (3.into(), 20.into())
            );
            assert!(w1["p50_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{w1}");
            client_w2_measured(by_name(&format!("w2-{driver}-{kind}")));
        }
    }
    assert!(
        stdout.contains("| w1-python-agent | agent task, answer sent → reply with the output received, over gRPC from Python grpcio after 20 ms"),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_small_bench_run_reports_every_workload_and_cleans_up() {
    let (stdout, stderr, lines) = small_bench(&[]).await;
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(workloads, ["limits", "w1-grpc", "w1-onebot", "w2"]);
    for w1 in &lines[1..3] {
        assert_eq!(w1["rounds"], 3);
        assert!(w1["p50_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{w1}");
    }
    let w2 = &lines[3];
    assert_eq!(w2["tasks"], 30);
    for key in [
        "suspends_per_s",
        "resumes_per_s",
        "hark_rss_total_mib_waiting",
    ] {
        assert!(w2[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {w2}");
    }
    assert!(
        w2["memory_waiting_mib"]
            .as_object()
            .is_some_and(|m| m.keys().any(|k| k.starts_with("hark worker"))),
        "{w2}"
    );
    assert!(
        stdout.contains("| w2 | resumes/s (8 answers in flight) |"),
        "{stdout}"
    );

    // The bench named its database; it is gone.
    let database = database_of(&stderr);
    assert!(!database_exists(&database).await, "{database} is left");
}

/// The first SIGINT ends a long bench where it is: it exits with an error saying so, and its
/// processes, its database and its streams are gone, as after a finished run.
#[tokio::test]
async fn a_signal_ends_the_bench_which_still_removes_what_it_started() {
    use tokio::io::AsyncBufReadExt as _;

    let mut bench = bench_command(&[
        "bench",
        "--llm-listen",
        "127.0.0.1:0",
        "--workloads",
        "w2",
        // Far more than it can create before the signal.
        "--tasks",
        "1000000",
        "--workers",
        "1",
    ])
    .stderr(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .spawn()
    .expect("the bench starts");
    let pid = bench.id().expect("the bench runs").to_string();
    let mut stderr =
        tokio::io::BufReader::new(bench.stderr.take().expect("stderr is piped")).lines();
    // The bench names its namespace and database once its processes are up, as its workload starts.
    let banner = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = stderr.next_line().await.expect("stderr reads") {
            if line.starts_with("bench: namespace") {
                return line;
            }
        }
        panic!("the bench exited before it started its workloads");
    })
    .await
    .expect("the bench starts its processes within 2 minutes");
    let database = database_of(&banner);
    let children = tokio::process::Command::new("pgrep")
        .args(["-P", &pid])
        .output()
        .await
        .expect("pgrep runs");
    let children: Vec<String> = String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert!(
        children.len() >= 3,
        "control, gateway and a worker: {children:?}"
    );

    let sent = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(sent.success());
    let rest = tokio::time::timeout(Duration::from_secs(120), async {
        let mut rest = String::new();
        while let Some(line) = stderr.next_line().await.expect("stderr reads") {
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    })
    .await
    .expect("the bench ends within 2 minutes of the signal");
    let status = bench.wait().await.expect("the bench is waited for");
    assert!(
        !status.success(),
        "an interrupted bench does not exit 0: {rest}"
    );
    assert!(rest.contains("interrupted by a signal"), "{rest}");

    // A child the bench stopped is gone once it is reaped, which may come just after the exit.
    tokio::time::timeout(Duration::from_secs(30), async {
        while children
            .iter()
            .any(|child| std::path::Path::new(&format!("/proc/{child}")).exists())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("processes of the bench are left running: {children:?}"));
    assert!(!database_exists(&database).await, "{database} is left");
}
