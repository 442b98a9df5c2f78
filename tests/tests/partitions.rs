//! hark with `TASK_RUN` split into four partitions (`nats.partitions = 4`), from outside: owners
//! in a group start tasks, each asks, each owner answers, and every result reaches the group once,
//! with the run jobs spread over the partitions' streams.

use std::time::{Duration, Instant};

use hark_e2e::{Env, group::GroupHark};

const WAIT: Duration = Duration::from_secs(120);
const TASKS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_through_four_partitions_exactly_once() {
    let mut env = Env::new().await;
    let mut hark = GroupHark::start(&mut env, &[("HARK_NATS__PARTITIONS", "4")], WAIT).await;
    let group = &mut hark.group;
    let start = Instant::now();
    group.start_tasks(0..TASKS).await;
    group.reply(0..TASKS).await;
    group.results_of(0..TASKS, start).await;
    group
        .check_exactly_once(&env, TASKS, Duration::from_secs(3))
        .await;

    // The jobs went through the partitions' own streams, each with its consumer, and none is
    // left behind in any of them.
    let names = env.names.clone().with_partitions(4);
    let mut used = 0;
    for (stream, _) in names.task_run_partitions() {
        let mut stream = env
            .js
            .get_stream(&stream)
            .await
            .expect("the partition's stream");
        let info = stream.info().await.expect("its info");
        if info.state.last_sequence > 0 {
            used += 1;
        }
        assert_eq!(
            info.state.messages, 0,
            "{} holds no job left",
            info.config.name
        );
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .get_consumer(hark_core::bus::Names::WORKER_CONSUMER)
            .await
            .expect("the workers' consumer of the partition");
        let consumer = consumer.info().await.expect("its info");
        assert_eq!(consumer.num_ack_pending, 0);
    }
    assert!(
        used >= 2,
        "the run jobs of {TASKS} tasks used {used} of 4 partitions"
    );
    hark.stop().await;
    env.cleanup().await;
}
