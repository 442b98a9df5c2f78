//! The bus contract against the real nats-server with JetStream.
//!
//! Each test uses its own namespace, so tests run in parallel on one server, and deletes its
//! streams when done.

mod common;

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use common::TestBus;
use futures_util::StreamExt;
use hark_core::{
    bus::{self, Names},
    codec,
    domain::TaskId,
    publish,
};
use hark_proto::v1 as pb;

impl TestBus {
    async fn workers(&self) -> PullConsumer {
        self.js
            .get_consumer_from_stream(Names::WORKER_CONSUMER, self.names.task_run_stream())
            .await
            .expect("workers consumer exists")
    }
}

async fn publish_job(
    bus: &TestBus,
    task: TaskId,
    generation: u64,
) -> jetstream::publish::PublishAck {
    let job = pb::RunJob {
        task_id: task.to_string(),
        generation,
        reason: pb::RunReason::Start as i32,
        ..Default::default()
    };
    let msg_id = Names::run_job_msg_id(task, generation);
    let job = publish::Outgoing {
        subject: bus.names.task_run(),
        msg_id: &msg_id,
        payload: codec::encode(job),
        trace: None,
    };
    publish::publish(&bus.js, job)
        .await
        .expect("publish is acked")
}

async fn fetch_all(consumer: &PullConsumer) -> Vec<jetstream::Message> {
    let mut batch = consumer
        .fetch()
        .max_messages(100)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetch starts");
    let mut out = Vec::new();
    while let Some(message) = batch.next().await {
        out.push(message.expect("message arrives"));
    }
    out
}

#[tokio::test]
async fn ensure_creates_every_stream_and_can_run_again() {
    let bus = TestBus::start().await;
    bus::ensure(&bus.js, &bus.names)
        .await
        .expect("second ensure succeeds");
    for config in bus.names.stream_configs() {
        let mut stream = bus
            .js
            .get_stream(&config.name)
            .await
            .expect("stream exists");
        let info = stream.info().await.expect("stream info");
        assert_eq!(info.config.subjects, config.subjects);
        assert_eq!(info.config.retention, config.retention);
    }
    bus.stop().await;
}

#[tokio::test]
async fn a_task_event_stream_of_one_subject_per_task_moves_to_the_one_subject_in_place() {
    let bus = TestBus::start().await;
    let config = bus
        .names
        .stream_configs()
        .into_iter()
        .find(|c| c.name == bus.names.task_events_stream())
        .expect("a task event stream is configured");
    // As an earlier hark made it.
    let old_subjects = format!("{}.task.event.>", bus.names.namespace());
    let old = jetstream::stream::Config {
        subjects: vec![old_subjects.clone()],
        max_messages_per_subject: 100,
        ..config.clone()
    };
    bus.js
        .update_stream(old)
        .await
        .expect("the stream takes the old subjects");
    let mut stream = bus.js.get_stream(&config.name).await.expect("stream");
    let before = stream.info().await.expect("info").clone();
    bus.js
        .publish(
            format!("{}.task.event.{}", bus.names.namespace(), TaskId::new()),
            "old".into(),
        )
        .await
        .expect("publish")
        .await
        .expect("an event of the old subject is kept");

    bus::ensure(&bus.js, &bus.names).await.expect("ensure");
    let after = stream.info().await.expect("info").clone();
    assert_eq!(after.config.subjects, vec![bus.names.task_events()]);
    assert_eq!(after.config.max_messages_per_subject, -1);
    assert_eq!(
        after.created, before.created,
        "the stream is the same, so resume tokens taken before still read"
    );
    let ack = bus
        .js
        .publish(bus.names.task_events(), "new".into())
        .await
        .expect("publish")
        .await
        .expect("an event of the one subject is kept");
    assert_eq!(ack.sequence, after.state.last_sequence + 1);
    bus.stop().await;
}

#[tokio::test]
async fn two_namespaces_on_one_server_never_see_each_others_jobs() {
    let a = TestBus::start().await;
    let b = TestBus::start().await;
    let task = TaskId::new();
    publish_job(&a, task, 1).await;

    let seen_by_b = fetch_all(&b.workers().await).await;
    assert!(
        seen_by_b.is_empty(),
        "namespace b received {} jobs of a",
        seen_by_b.len()
    );

    let seen_by_a = fetch_all(&a.workers().await).await;
    assert_eq!(seen_by_a.len(), 1);
    let job: pb::RunJob = codec::decode(&seen_by_a[0].payload).expect("job decodes");
    assert_eq!(job.task_id, task.to_string());
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_job_published_twice_with_one_msg_id_is_delivered_once() {
    let bus = TestBus::start().await;
    let task = TaskId::new();
    let first = publish_job(&bus, task, 3).await;
    let second = publish_job(&bus, task, 3).await;
    assert!(!first.duplicate);
    assert!(
        second.duplicate,
        "the second publish must be recognised as a duplicate"
    );
    let next_generation = publish_job(&bus, task, 4).await;
    assert!(!next_generation.duplicate);

    let jobs = fetch_all(&bus.workers().await).await;
    let generations: Vec<u64> = jobs
        .iter()
        .map(|m| {
            codec::decode::<pb::RunJob>(&m.payload)
                .expect("decodes")
                .generation
        })
        .collect();
    assert_eq!(generations, vec![3, 4]);
    bus.stop().await;
}

#[tokio::test]
async fn an_acked_job_leaves_the_work_queue_and_an_unacked_one_comes_back() {
    let bus = TestBus::start().await;
    let consumer = bus.workers().await;
    // A short ack wait so that the unacked job is redelivered quickly.
    let short = bus::durable(
        Names::WORKER_CONSUMER,
        bus.names.task_run(),
        Duration::from_secs(1),
        -1,
    );
    bus::ensure_consumer(&bus.js, &bus.names.task_run_stream(), short)
        .await
        .expect("consumer is updated");

    // The first job is acknowledged, and the server confirmed it, before the second exists and
    // while no pull is waiting: whatever the machine's pace, it cannot be delivered again.
    publish_job(&bus, TaskId::new(), 1).await;
    let acked = fetch_all(&consumer).await;
    assert_eq!(acked.len(), 1);
    acked[0].double_ack().await.expect("ack is confirmed");
    publish_job(&bus, TaskId::new(), 2).await;
    let unacked = fetch_all(&consumer).await;
    assert_eq!(unacked.len(), 1);
    // The second is neither acked nor nacked: it must come back after the ack wait, and it is
    // the only one that does.
    let redelivered = loop {
        let batch = fetch_all(&consumer).await;
        if !batch.is_empty() {
            break batch;
        }
    };
    let described = |messages: &[jetstream::Message]| -> Vec<String> {
        messages
            .iter()
            .map(|m| {
                let job: pb::RunJob = codec::decode(&m.payload).expect("job decodes");
                let delivered = m.info().map(|i| i.delivered).unwrap_or_default();
                format!("generation {} delivered {delivered} times", job.generation)
            })
            .collect()
    };
    // Only the unacked job comes back. On a loaded machine it may come back more than once
    // before it is acked (each time its ack wait passes), never the acked one.
    assert!(
        redelivered.iter().all(|m| m.payload == unacked[0].payload),
        "redelivered: {:?}",
        described(&redelivered)
    );
    let latest = redelivered
        .iter()
        .max_by_key(|m| m.info().map(|i| i.delivered).unwrap_or_default())
        .expect("one came back");
    latest.double_ack().await.expect("ack is confirmed");

    let mut stream = bus
        .js
        .get_stream(bus.names.task_run_stream())
        .await
        .expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 0);
    bus.stop().await;
}

#[tokio::test]
async fn three_copies_on_a_single_server_are_refused_naming_the_key() {
    let client = async_nats::connect(common::nats_url()).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    let namespace = hark_testkit::Namespace::new();
    let config = hark_core::config::NatsConfig {
        namespace: namespace.name.clone(),
        replicas: 3,
        ..Default::default()
    };
    let names = bus::Names::of(&config).expect("names");
    for stream in names.stream_configs() {
        assert_eq!(stream.num_replicas, 3, "{}", stream.name);
    }
    let err = bus::ensure(&js, &names)
        .await
        .expect_err("a single nats-server keeps one copy");
    assert!(
        matches!(err, bus::Error::NotClustered { replicas: 3, .. }),
        "{err:?}"
    );
    let said = err.to_string();
    assert!(said.contains("nats.replicas"), "{said}");
    assert!(said.contains("set nats.replicas = 1"), "{said}");
    assert!(
        hark_core::startup::Permanent::permanent(&err),
        "waiting does not help"
    );
    namespace.remove().await;
}

#[tokio::test]
async fn a_stream_of_one_server_has_its_leader() {
    let bus = TestBus::start().await;
    let leaderless = bus::leaderless(&bus.js, &bus.names, Duration::from_secs(5)).await;
    assert!(leaderless.is_empty(), "{leaderless:?}");
    // A stream that does not exist takes nothing either, and is named.
    let other = bus::Names::new("nosuchns".parse().expect("namespace"));
    let missing = bus::leaderless(&bus.js, &other, Duration::from_secs(5)).await;
    assert_eq!(missing.len(), other.stream_configs().len(), "{missing:?}");
    bus.stop().await;
}

#[tokio::test]
async fn run_jobs_split_over_partitions_keep_each_task_in_one_and_every_partition_has_its_consumer()
{
    let bus = TestBus::start_with(4).await;
    let partitions = bus.names.task_run_partitions();
    assert_eq!(partitions.len(), 4);
    assert_eq!(
        partitions[0].0,
        bus.names.task_run_stream(),
        "the first keeps the name"
    );
    assert_eq!(partitions[0].1, bus.names.task_run());
    let tasks: Vec<TaskId> = (0..40).map(|_| TaskId::new()).collect();
    for task in &tasks {
        // Two generations of a task: both in its partition, in order.
        for generation in 1..=2 {
            let job = pb::RunJob {
                task_id: task.to_string(),
                generation,
                ..Default::default()
            };
            let msg_id = Names::run_job_msg_id(*task, generation);
            let subject = bus.names.task_run_of(*task);
            assert!(bus.names.is_task_run(&subject), "{subject}");
            publish::publish(
                &bus.js,
                publish::Outgoing {
                    subject,
                    msg_id: &msg_id,
                    payload: codec::encode(job),
                    trace: None,
                },
            )
            .await
            .expect("published");
        }
    }
    let mut seen: Vec<(u16, String, u64)> = Vec::new();
    for (p, (stream, _)) in partitions.iter().enumerate() {
        let consumer: PullConsumer = bus
            .js
            .get_consumer_from_stream(Names::WORKER_CONSUMER, stream.as_str())
            .await
            .expect("each partition has the workers' consumer");
        for message in fetch_all(&consumer).await {
            let job: pb::RunJob = codec::decode(&message.payload).expect("a job");
            message.ack().await.expect("acked");
            seen.push((p as u16, job.task_id, job.generation));
        }
    }
    assert_eq!(seen.len(), 80, "every job once");
    let used: std::collections::BTreeSet<u16> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        used.len(),
        4,
        "40 tasks spread over all 4 partitions: {used:?}"
    );
    for task in &tasks {
        let id = task.to_string();
        let mine: Vec<&(u16, String, u64)> = seen.iter().filter(|s| s.1 == id).collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(mine[0].0, mine[1].0, "a task's jobs share a partition");
        assert_eq!(mine[0].0, bus.names.task_run_partition(*task));
        assert_eq!((mine[0].2, mine[1].2), (1, 2), "in order");
    }
    assert!(
        !bus.names
            .is_task_run(&format!("{}.4", bus.names.task_run()))
    );
    assert!(
        !bus.names
            .is_task_run(&format!("{}.x", bus.names.task_run()))
    );
    let ns = bus.names.namespace();
    assert!(!bus.names.is_task_run(&format!("{ns}x.task.run")));
    assert!(!bus.names.is_task_run(&format!("{ns}.task.running")));
    let unsplit = Names::new("x".parse().expect("namespace"));
    assert_eq!(unsplit.task_run_of(tasks[0]), unsplit.task_run());
    bus.stop().await;
}

#[tokio::test]
async fn chat_messages_split_over_partitions_keep_each_chat_in_one_and_in_order() {
    let bus = TestBus::start_with(4).await;
    let partitions = bus.names.chat_in_partitions();
    assert_eq!(partitions.len(), 4);
    assert_eq!(
        partitions[0],
        (bus.names.chat_in_stream(), bus.names.chat_in_all()),
        "the first keeps the name and subjects"
    );
    assert_eq!(
        partitions
            .iter()
            .enumerate()
            .map(|(p, _)| Names::chat_in_consumer_name(p))
            .collect::<Vec<_>>(),
        ["chat_in", "chat_in_1", "chat_in_2", "chat_in_3"]
    );
    // 30 chats of two platforms, three messages each.
    let chats: Vec<(&str, String)> = (0..30)
        .map(|i| (["qq", "satori:discord"][i % 2], format!("group:{i}")))
        .collect();
    for n in 0..3 {
        for (platform, stream) in &chats {
            let message = pb::ChatMessage {
                platform: (*platform).to_owned(),
                bot_id: "42".into(),
                stream: stream.clone(),
                message_id: n.to_string(),
                text: format!("{n}"),
                ..Default::default()
            };
            let msg_id = Names::chat_in_msg_id(platform, "42", stream, &n.to_string());
            publish::publish(
                &bus.js,
                publish::Outgoing {
                    subject: bus
                        .names
                        .chat_in_of(platform, stream)
                        .expect("a chat subject"),
                    msg_id: &msg_id,
                    payload: codec::encode(message),
                    trace: None,
                },
            )
            .await
            .expect("published into a stream of CHAT_IN");
        }
    }
    let mut seen: Vec<(u16, String, String, String)> = Vec::new();
    for (p, (stream, _)) in partitions.iter().enumerate() {
        let consumer: PullConsumer = bus
            .js
            .get_consumer_from_stream(Names::CONTROL_CONSUMER, stream.as_str())
            .await
            .expect("each partition has task-control's consumer");
        for message in fetch_all(&consumer).await {
            let chat: pb::ChatMessage = codec::decode(&message.payload).expect("a message");
            message.ack().await.expect("acked");
            seen.push((p as u16, chat.platform, chat.stream, chat.text));
        }
    }
    assert_eq!(seen.len(), 90, "every message once");
    let used: std::collections::BTreeSet<u16> = seen.iter().map(|s| s.0).collect();
    assert_eq!(used.len(), 4, "30 chats spread over all 4: {used:?}");
    for (platform, stream) in &chats {
        let mine: Vec<_> = seen
            .iter()
            .filter(|s| s.1 == *platform && s.2 == *stream)
            .collect();
        let partition = bus.names.chat_in_partition(platform, stream);
        assert!(
            mine.iter().all(|s| s.0 == partition),
            "one chat, one partition"
        );
        let texts: Vec<&str> = mine.iter().map(|s| s.3.as_str()).collect();
        assert_eq!(texts, ["0", "1", "2"], "in order");
    }
    let unsplit = Names::new("x".parse().expect("namespace"));
    assert_eq!(
        unsplit.chat_in_of("qq", "group:1").expect("subject"),
        unsplit.chat_in("qq").expect("subject")
    );
    bus.stop().await;
}
