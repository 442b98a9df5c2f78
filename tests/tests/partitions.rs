//! hark with `TASK_RUN` and `CHAT_IN` split into four partitions (`nats.partitions = 4`), from
//! outside: owners in a group and in private chats start tasks, each asks, each owner answers,
//! and every result arrives once, with the run jobs and the chats' messages spread over the
//! partitions' streams.

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
    // Half in the group, one chat; half in private chats, each a chat of its own.
    let half = TASKS / 2;
    group.start_tasks(0..half).await;
    group.reply(0..half).await;
    group.private = true;
    group.start_tasks(half..TASKS).await;
    group.reply(half..TASKS).await;
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
    // The chats' messages went through CHAT_IN's partitions, and task-control took every one.
    let mut used = 0;
    for (stream, _) in names.chat_in_partitions() {
        let mut stream = env
            .js
            .get_stream(&stream)
            .await
            .expect("the partition's stream");
        let info = stream.info().await.expect("its info").clone();
        if info.state.messages > 0 {
            used += 1;
        }
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .get_consumer(hark_core::bus::Names::CONTROL_CONSUMER)
            .await
            .expect("task-control's consumer of the partition");
        let consumer = consumer.info().await.expect("its info");
        assert_eq!(
            (consumer.num_pending, consumer.num_ack_pending),
            (0, 0),
            "{} has no message left",
            info.config.name
        );
    }
    assert!(
        used >= 2,
        "the messages of {} chats used {used} of 4 partitions",
        half + 1
    );
    hark.stop().await;
    env.cleanup().await;
}
