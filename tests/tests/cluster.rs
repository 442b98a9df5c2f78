//! hark on a three-node JetStream cluster with every stream in three copies (`nats.replicas = 3`),
//! from outside: a task-control, a gateway and two workers, and a QQ group whose members each
//! started a task that asks them a question. While the answers come in:
//! - the server leading `CHAT_IN`, then the one leading `TASK_RUN`, is killed with SIGKILL;
//! - a server is killed, its store deleted, and it starts again empty, catches up, and then
//!   stands in for another killed server;
//! - two servers are killed at once, so that JetStream has no majority and takes nothing; the
//!   gateway holds the answers in its spool until they return.
//!
//! Every answer the gateway took reaches its task once: each task completes once with its own
//! answer, no task resumes twice, none fails, and each result reaches the group once. The time
//! from each fault to the first result after it is printed.

use std::time::{Duration, Instant};

use hark_e2e::{Env, eventually, group::GroupHark, postgres_url, servers::NatsCluster};

/// How long the test waits for what hark does next, a leader election included.
const WAIT: Duration = Duration::from_secs(120);
/// Tasks answered in each of the four faults.
const PER_FAULT: usize = 5;

struct Run {
    env: Env,
    cluster: NatsCluster,
    hark: GroupHark,
}

impl Run {
    /// The owners of tasks `range` answer, and their results come back; returns how long after
    /// `fault` the first one did.
    async fn answer(&mut self, range: std::ops::Range<usize>, fault: Instant) -> Duration {
        self.hark.group.reply(range.clone()).await;
        self.hark.group.results_of(range, fault).await
    }

    /// The server leading `stream` now, once it has a leader.
    async fn leader_of(&self, stream: &str) -> usize {
        let js = &self.env.js;
        let name: String = eventually(
            &format!("stream {stream} has a leader"),
            WAIT,
            || async move {
                let mut stream = js.get_stream(stream).await.ok()?;
                let info = stream.info().await.ok()?;
                info.cluster
                    .as_ref()?
                    .leader
                    .clone()
                    .filter(|l| !l.is_empty())
            },
        )
        .await;
        self.cluster
            .index_of(&name)
            .unwrap_or_else(|| panic!("a leader of this cluster, not {name}"))
    }

    /// Every stream has a leader and all its copies are current: a server that came back has
    /// caught up.
    async fn settled(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut unsettled = Vec::new();
            for config in self.env.names.stream_configs() {
                let state = match self.env.js.get_stream(&config.name).await {
                    Ok(mut stream) => match stream.info().await {
                        Ok(info) => match info.cluster.as_ref() {
                            Some(cluster) => {
                                let led = cluster.leader.as_deref().is_some_and(|l| !l.is_empty());
                                // Task events are best effort: a copy of them may stay a
                                // message behind, and only their leader counts.
                                let copies = config.name == self.env.names.task_events_stream()
                                    || (cluster.replicas.len() == 2
                                        && cluster
                                            .replicas
                                            .iter()
                                            .all(|r| r.current && !r.offline));
                                (!(led && copies)).then(|| format!("{cluster:?}"))
                            }
                            None => Some("no cluster".to_owned()),
                        },
                        Err(e) => Some(e.to_string()),
                    },
                    Err(e) => Some(e.to_string()),
                };
                if let Some(state) = state {
                    unsettled.push(format!("{}: {state}", config.name));
                }
            }
            if unsettled.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "streams without a leader and three current copies after {WAIT:?}: {unsettled:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What the gateway's `/readyz` says.
    async fn gateway_ready(&self) -> serde_json::Value {
        let port = self.env.gateway_port().await;
        let url = format!("http://127.0.0.1:{port}/readyz");
        hark_core::install_crypto();
        match reqwest::get(&url).await {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_three_node_cluster_losing_leaders_disks_and_a_majority_no_answer_is_lost_or_applied_twice()
 {
    let cluster = tokio::task::block_in_place(|| NatsCluster::start(3));
    let mut env = Env::on(cluster.url(), postgres_url()).await;
    let hark = GroupHark::start(&mut env, &[("HARK_NATS__REPLICAS", "3")], WAIT).await;
    let mut run = Run { env, cluster, hark };
    // The streams hark made have three copies each.
    run.settled().await;

    let tasks = 4 * PER_FAULT;
    run.hark.group.start_tasks(0..tasks).await;
    let mut figures = Vec::new();

    // 1. The leader of CHAT_IN dies with the answers on their way.
    let chat_in = run.env.names.chat_in_stream();
    let leader = run.leader_of(&chat_in).await;
    let fault = Instant::now();
    tokio::task::block_in_place(|| run.cluster.kill(leader));
    let took = run.answer(0..PER_FAULT, fault).await;
    figures.push((format!("leader of {chat_in} (n{leader}) killed"), took));
    tokio::task::block_in_place(|| run.cluster.start_again(leader));
    run.settled().await;

    // 2. The leader of TASK_RUN dies as the resumed tasks' jobs go out.
    let task_run = run.env.names.task_run_stream();
    let leader = run.leader_of(&task_run).await;
    let fault = Instant::now();
    tokio::task::block_in_place(|| run.cluster.kill(leader));
    let took = run.answer(PER_FAULT..2 * PER_FAULT, fault).await;
    figures.push((format!("leader of {task_run} (n{leader}) killed"), took));
    tokio::task::block_in_place(|| run.cluster.start_again(leader));
    run.settled().await;

    // 3. A server loses its disk and comes back empty; once it caught up, another dies, so that
    //    the copies it holds now are needed.
    let wiped = run.leader_of(&chat_in).await;
    tokio::task::block_in_place(|| {
        run.cluster.kill(wiped);
        run.cluster.wipe(wiped);
        run.cluster.start_again(wiped);
    });
    run.settled().await;
    let other = (wiped + 1) % 3;
    let fault = Instant::now();
    tokio::task::block_in_place(|| run.cluster.kill(other));
    let took = run.answer(2 * PER_FAULT..3 * PER_FAULT, fault).await;
    figures.push((
        format!("n{other} killed after n{wiped} came back with an empty store and caught up"),
        took,
    ));
    tokio::task::block_in_place(|| run.cluster.start_again(other));
    run.settled().await;

    // 4. Two servers die: no majority, JetStream takes nothing. The gateway takes the answers
    //    into its spool and says it is not ready; they go on when the servers are back.
    let (a, b) = (0, 1);
    let fault = Instant::now();
    tokio::task::block_in_place(|| {
        run.cluster.kill(a);
        run.cluster.kill(b);
    });
    run.hark.group.reply(3 * PER_FAULT..tasks).await;
    eventually(
        "the gateway holds the answers in its spool and is not ready",
        WAIT,
        || async {
            let ready = run.gateway_ready().await;
            (ready["status"] != "ready"
                && ready["spooled"].as_u64().unwrap_or(0) >= PER_FAULT as u64)
                .then_some(())
        },
    )
    .await;
    assert!(
        run.hark.group.results.keys().all(|i| *i < 3 * PER_FAULT),
        "a task resumed while JetStream had no majority"
    );
    tokio::task::block_in_place(|| {
        run.cluster.start_again(a);
        run.cluster.start_again(b);
    });
    let took = run.hark.group.results_of(3 * PER_FAULT..tasks, fault).await;
    figures.push(("n0 and n1 killed, then started again".to_owned(), took));
    run.settled().await;
    eventually("the gateway is ready again", WAIT, || async {
        (run.gateway_ready().await["status"] == "ready").then_some(())
    })
    .await;

    // Nothing comes twice: whatever hark would still post is posted by the time it is idle.
    run.hark
        .group
        .check_exactly_once(&run.env, tasks, Duration::from_secs(3))
        .await;
    let lost_leases = run
        .env
        .sql("SELECT count(*) FROM transitions WHERE event = 'lease_expired'")
        .await;
    eprintln!("\nthree-node cluster, R3 streams, {tasks} tasks ({lost_leases} leases lost):");
    for (fault, took) in &figures {
        eprintln!("  {fault}: first resumed task's result {took:?} after the fault");
    }
    run.hark.stop().await;
    run.env.cleanup().await;
}
