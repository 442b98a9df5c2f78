//! hark through a Postgres failover, from outside: a primary with a synchronous streaming standby
//! (`pg_basebackup -R`, `synchronous_standby_names = '*'`), reached through a TCP forwarder as
//! through a Kubernetes Service. While the owners' answers flow, the primary is killed
//! (`pg_ctl -m immediate stop`), the forwarder switched to the standby while it is still read-only
//! (hark must say it met a standby, and wait), and the standby promoted, as an operator
//! (CloudNativePG, Patroni) moves the `-rw` Service and promotes.
//!
//! Every answer the gateway took reaches its task once: each task completes once with its own
//! answer, no task resumes twice or fails, and each result reaches the group once. The time from
//! the kill to the first result after it is printed.

use std::time::{Duration, Instant};

use hark_e2e::{
    Env,
    group::GroupHark,
    nats_url,
    servers::{Forwarder, PrivatePostgres},
};

const WAIT: Duration = Duration::from_secs(120);
const TASKS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_mid_load_and_its_standby_promoted_lose_no_answer_and_apply_none_twice() {
    let primary = tokio::task::block_in_place(PrivatePostgres::start);
    let standby = tokio::task::block_in_place(|| {
        let standby = PrivatePostgres::standby_of(&primary);
        primary.make_synchronous();
        standby
    });
    let service = Forwarder::start(primary.port).await;
    let mut env = Env::on(
        nats_url(),
        format!("postgres://postgres@127.0.0.1:{}", service.port),
    )
    .await;
    let mut hark = GroupHark::start(&mut env, &[], WAIT).await;
    let group = &mut hark.group;
    group.start_tasks(0..TASKS).await;

    // Half the owners answer; while those answers are being applied, the primary dies.
    let half = TASKS / 2;
    group.reply(0..half).await;
    let fault = Instant::now();
    tokio::task::block_in_place(|| primary.crash());
    // The service moves to the standby before it is promoted, as a misrouted Service would: hark
    // tells a read-only standby from an outage, says so, and retries its writes.
    service.switch(standby.port);
    hark.roles[0]
        .wait_for_output("read-only Postgres standby", WAIT)
        .await;
    tokio::task::block_in_place(|| standby.promote());
    assert!(
        !tokio::task::block_in_place(|| standby.in_recovery()),
        "the standby is the primary now"
    );
    // The rest answer after the failover.
    group.reply(half..TASKS).await;
    let took = group.results_of(half..TASKS, fault).await;
    group.results_of(0..TASKS, fault).await;
    group
        .check_exactly_once(&env, TASKS, Duration::from_secs(3))
        .await;
    eprintln!(
        "\nPostgres failover (service switched to the synchronous standby, which is then promoted), {TASKS} tasks: \
         first result of an answer sent after the fault {took:?} after the kill"
    );
    hark.stop().await;
    env.cleanup().await;
}
