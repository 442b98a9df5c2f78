//! The bus contract: every NATS subject, JetStream stream and consumer name hark uses, derived
//! from one [`Namespace`], and the functions that create or update the streams and consumers.
//!
//! Nobody else formats a subject string. Two installations with different namespaces share a
//! nats-server without seeing each other's messages: their subjects start with different first
//! tokens and their streams have different names.
//!
//! | stream       | subjects                          | retention  | consumed by                         |
//! |--------------|-----------------------------------|------------|-------------------------------------|
//! | `CHAT_IN`    | `<ns>.chat.in.<platform>`         | limits     | `control` (all task-control replicas) |
//! | `CHAT_OUT`   | `<ns>.chat.out.<platform>.<bot>`  | work queue | `gateway_<platform>_<bot>`          |
//! | `CHAT_RECEIPT` | `<ns>.chat.receipt`             | work queue | `control`                           |
//! | `TASK_RUN`   | `<ns>.task.run`                   | work queue | `workers` (all workers)             |
//! | `TASK_EVENTS`| `<ns>.task.events`                | limits, 1 h, memory (file when replicated) | watchers (best effort) |
//! | `DEAD`       | `<ns>.dead.<source>`              | limits, 30 d | `hark health` reads it            |
//!
//! Core NATS (no stream): `<ns>.task.cancel.<task id>` and `<ns>.control.<op>` (request/reply in
//! the queue group `<ns>.control`).

use std::{fmt, str::FromStr, time::Duration};

use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, pull},
    stream::{self, RetentionPolicy, StorageType},
};

use crate::domain::TaskId;

/// The header JetStream deduplicates on.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// How long `CHAT_OUT` keeps a message that no bot took.
pub const CHAT_OUT_MAX_AGE: Duration = Duration::from_secs(7 * 86_400);

/// Why a bus operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "`{0}` is not a namespace: expected 1 to 32 characters of a-z, 0-9, _ or - (e.g. `hark`)"
    )]
    Namespace(String),
    #[error(
        "`{0}` cannot be part of a NATS subject: it must be non-empty and contain no `.`, `*`, `>` or spaces"
    )]
    Token(String),
    #[error("cannot reach NATS at nats.url = {url}: {source}")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[error(
        "NATS answers at nats.url, but JetStream is off there: start nats-server with -js (and -sd \
         <dir> to keep its streams), or point nats.url (HARK_NATS__URL) at one that has it"
    )]
    NoJetStream,
    #[error("cannot create or update JetStream stream {stream}: {source}")]
    Stream {
        stream: String,
        source: async_nats::Error,
    },
    #[error(
        "nats.replicas (HARK_NATS__REPLICAS) = {replicas}, but the NATS server keeps JetStream \
         alone, not in a cluster, so stream {stream} can have one copy only: set nats.replicas = 1, \
         or point nats.url at a JetStream cluster of at least {replicas} servers ({source})"
    )]
    NotClustered {
        stream: String,
        replicas: usize,
        source: async_nats::Error,
    },
    #[error(
        "JetStream stream {stream} exists with settings NATS will not change in place: {source}. \
         Its copies or placement (nats.replicas, nats.placement) differ from the configuration; \
         move it with `nats stream edit {stream}` on nats-server 2.10 or later, or set them back \
         to what `nats stream info {stream}` shows"
    )]
    Unchangeable {
        stream: String,
        source: async_nats::Error,
    },
    #[error("cannot create or update JetStream consumer {consumer} on {stream}: {source}")]
    Consumer {
        stream: String,
        consumer: String,
        source: async_nats::Error,
    },
    #[error("cannot publish to {subject}: {source}")]
    Publish {
        subject: String,
        source: async_nats::Error,
    },
}

impl crate::startup::Permanent for Error {
    /// JetStream off, credentials refused, or a name NATS cannot take: waiting does not help.
    fn permanent(&self) -> bool {
        match self {
            Error::Namespace(_)
            | Error::Token(_)
            | Error::NoJetStream
            | Error::NotClustered { .. }
            | Error::Unchangeable { .. } => true,
            Error::Connect { source, .. } => matches!(
                source.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::ServerParse
                    | async_nats::ConnectErrorKind::Tls
            ),
            Error::Stream { .. } | Error::Consumer { .. } | Error::Publish { .. } => false,
        }
    }
}

/// The first token of every subject and the prefix of every stream name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl FromStr for Namespace {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = (1..=32).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(Error::Namespace(crate::domain::ids::shown(s)))
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A control request a worker sends to task-control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlOp {
    Claim,
    /// An idle worker waits for a run job handed over directly (see `PollRequest`).
    Poll,
    Heartbeat,
    Checkpoint,
    Ask,
    Complete,
    Fail,
    Release,
    History,
    Send,
    /// The tasks of the owner of the task a worker holds (`list_my_tasks`).
    Tasks,
    /// A task for the same owner and chat (`create_subtask`).
    Subtask,
}

impl ControlOp {
    pub const ALL: [ControlOp; 12] = [
        ControlOp::Claim,
        ControlOp::Poll,
        ControlOp::Heartbeat,
        ControlOp::Checkpoint,
        ControlOp::Ask,
        ControlOp::Complete,
        ControlOp::Fail,
        ControlOp::Release,
        ControlOp::History,
        ControlOp::Send,
        ControlOp::Tasks,
        ControlOp::Subtask,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ControlOp::Claim => "claim",
            ControlOp::Poll => "poll",
            ControlOp::Heartbeat => "heartbeat",
            ControlOp::Checkpoint => "checkpoint",
            ControlOp::Ask => "ask",
            ControlOp::Complete => "complete",
            ControlOp::Fail => "fail",
            ControlOp::Release => "release",
            ControlOp::History => "history",
            ControlOp::Send => "send",
            ControlOp::Tasks => "tasks",
            ControlOp::Subtask => "subtask",
        }
    }
}

/// Checks that `s` can stand as one subject token.
pub fn token(s: &str) -> Result<&str, Error> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s
            .chars()
            .any(|c| matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control());
    if ok {
        Ok(s)
    } else {
        Err(Error::Token(crate::domain::ids::shown(s)))
    }
}

/// What task-control made of an inbound chat message, told on [`Names::chat_verdict`] for a
/// framework in front of the chat: whether hark took it, and as what (`answer`, `command`,
/// `hint`, or `left`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatVerdict {
    pub taken: bool,
    #[serde(rename = "as")]
    pub kind: String,
}

/// A subject token that stands for the message key `key`: 128 bits of FNV-1a, stable across
/// builds and hosts (the gateway and task-control compute it apart).
fn verdict_token(key: &str) -> String {
    let fnv = |offset: u64| {
        key.bytes().fold(offset, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x6c62_272e_07bb_0142)
    )
}

/// Every name on the bus, for one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    ns: Namespace,
    /// Upper-cased namespace, the prefix of stream names.
    stream_prefix: String,
    /// How many copies of each stream, and where.
    replication: Replication,
    /// How many streams `TASK_RUN` and `CHAT_IN` are each split into (`nats.partitions`).
    partitions: u16,
}

/// How many copies of each stream JetStream keeps, and on which servers (`nats.replicas`,
/// `nats.placement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    pub replicas: usize,
    pub cluster: Option<String>,
    pub tags: Vec<String>,
}

impl Default for Replication {
    fn default() -> Self {
        Self {
            replicas: 1,
            cluster: None,
            tags: Vec::new(),
        }
    }
}

impl Replication {
    pub fn of(config: &crate::config::NatsConfig) -> Self {
        Self {
            replicas: config.replicas.max(1),
            cluster: Some(config.placement.cluster.trim().to_owned()).filter(|c| !c.is_empty()),
            tags: config.placement.tags.clone(),
        }
    }

    fn placement(&self) -> Option<stream::Placement> {
        (self.cluster.is_some() || !self.tags.is_empty()).then(|| stream::Placement {
            cluster: self.cluster.clone(),
            tags: self.tags.clone(),
        })
    }
}

impl Names {
    /// The names of the configured namespace, with the configured replication.
    pub fn of(config: &crate::config::NatsConfig) -> Result<Self, Error> {
        let mut names = Self::new(config.namespace.parse()?);
        names.replication = Replication::of(config);
        names.partitions = config.partitions.max(1);
        Ok(names)
    }

    /// These names with `TASK_RUN` and `CHAT_IN` each split into `partitions` streams.
    pub fn with_partitions(mut self, partitions: u16) -> Self {
        self.partitions = partitions.max(1);
        self
    }

    pub fn replication(&self) -> &Replication {
        &self.replication
    }

    pub fn new(ns: Namespace) -> Self {
        let stream_prefix = ns.0.to_ascii_uppercase();
        Self {
            ns,
            stream_prefix,
            replication: Replication::default(),
            partitions: 1,
        }
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    // Subjects.

    /// The subject of the first `CHAT_IN` partition for `platform`: the only one unless
    /// `nats.partitions` > 1.
    pub fn chat_in(&self, platform: &str) -> Result<String, Error> {
        Ok(format!("{}.chat.in.{}", self.ns, token(platform)?))
    }

    /// The subjects of the first `CHAT_IN` partition.
    pub fn chat_in_all(&self) -> String {
        format!("{}.chat.in.>", self.ns)
    }

    /// The partition of `CHAT_IN` the messages of one chat go to: a stable hash (FNV-1a) of its
    /// platform and stream, so that one chat's messages stay in one partition, in order.
    pub fn chat_in_partition(&self, platform: &str, stream: &str) -> u16 {
        self.partition_of(&[platform.as_bytes(), b":", stream.as_bytes()])
    }

    /// The subject a message of `platform`'s chat `stream` is published on. Partitions after
    /// the first are `<ns>.chat.in<p>.<platform>`, outside the first's `<ns>.chat.in.>`, since
    /// the subjects of two streams may not overlap.
    pub fn chat_in_of(&self, platform: &str, stream: &str) -> Result<String, Error> {
        match self.chat_in_partition(platform, stream) {
            0 => self.chat_in(platform),
            p => Ok(format!("{}.chat.in{p}.{}", self.ns, token(platform)?)),
        }
    }

    /// The streams `CHAT_IN` is split into, with the subjects each holds, partition 0 first.
    pub fn chat_in_partitions(&self) -> Vec<(String, String)> {
        (0..self.partitions)
            .map(|p| match p {
                0 => (self.chat_in_stream(), self.chat_in_all()),
                p => (
                    format!("{}_CHAT_IN_{p}", self.stream_prefix),
                    format!("{}.chat.in{p}.>", self.ns),
                ),
            })
            .collect()
    }

    /// The name task-control's consumer of `CHAT_IN` partition `p` (its place in
    /// [`Names::chat_in_partitions`]) reports its liveness by: `chat_in`, then `chat_in_1` … (its
    /// dead letters are all of source `chat_in`).
    pub fn chat_in_consumer_name(p: usize) -> String {
        match p {
            0 => "chat_in".to_owned(),
            p => format!("chat_in_{p}"),
        }
    }

    /// FNV-1a of the concatenated `parts`, modulo the partitions: the same in every process
    /// and every release.
    fn partition_of(&self, parts: &[&[u8]]) -> u16 {
        if self.partitions <= 1 {
            return 0;
        }
        let hash = parts
            .iter()
            .flat_map(|part| part.iter())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            });
        (hash % u64::from(self.partitions)) as u16
    }

    pub fn chat_out(&self, platform: &str, bot_id: &str) -> Result<String, Error> {
        Ok(format!(
            "{}.chat.out.{}.{}",
            self.ns,
            token(platform)?,
            token(bot_id)?
        ))
    }

    pub fn chat_out_all(&self) -> String {
        format!("{}.chat.out.>", self.ns)
    }

    pub fn chat_receipt(&self) -> String {
        format!("{}.chat.receipt", self.ns)
    }

    /// Where the verdict on the inbound message `key` ([`Names::chat_in_msg_id`]) is told, on
    /// core NATS: whether hark took it, for a framework in front of the chat.
    pub fn chat_verdict(&self, key: &str) -> String {
        format!("{}.chat.verdict.{}", self.ns, verdict_token(key))
    }

    /// The subject of the first `TASK_RUN` partition, the only one unless `nats.partitions` > 1.
    pub fn task_run(&self) -> String {
        format!("{}.task.run", self.ns)
    }

    /// The partition of `TASK_RUN` the jobs of `task` go to: a stable hash of its id (FNV-1a),
    /// the same in every process and every release.
    pub fn task_run_partition(&self, task: TaskId) -> u16 {
        if self.partitions <= 1 {
            return 0;
        }
        self.partition_of(&[task.to_string().as_bytes()])
    }

    /// The subject the run jobs of `task` are published on.
    pub fn task_run_of(&self, task: TaskId) -> String {
        self.task_run_partition_subject(self.task_run_partition(task))
    }

    /// The subject of `TASK_RUN` partition `p`: the first keeps the unpartitioned subject, so
    /// that raising `nats.partitions` leaves its jobs where they are.
    pub fn task_run_partition_subject(&self, p: u16) -> String {
        if p == 0 {
            self.task_run()
        } else {
            format!("{}.task.run.{p}", self.ns)
        }
    }

    /// Whether `subject` is one of `TASK_RUN`'s. Allocates nothing: the relay asks it of every
    /// message it publishes.
    pub fn is_task_run(&self, subject: &str) -> bool {
        let Some(rest) = subject
            .strip_prefix(self.ns.0.as_str())
            .and_then(|rest| rest.strip_prefix(".task.run"))
        else {
            return false;
        };
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .and_then(|p| p.parse::<u16>().ok())
                .is_some_and(|p| p > 0 && p < self.partitions)
    }

    /// The streams `TASK_RUN` is split into, with their subjects, partition 0 first.
    pub fn task_run_partitions(&self) -> Vec<(String, String)> {
        (0..self.partitions)
            .map(|p| {
                let stream = if p == 0 {
                    self.task_run_stream()
                } else {
                    format!("{}_TASK_RUN_{p}", self.stream_prefix)
                };
                (stream, self.task_run_partition_subject(p))
            })
            .collect()
    }

    /// Where every task's events go, one subject for all: the event names its task. A subject
    /// per task would make the memory stream slow down as it fills. When it drops a subject's
    /// oldest message, nats-server looks for that subject's next one sequence by sequence, and
    /// a waiting task's next event is as many sequences away as there are tasks
    /// (`BENCHMARKS.md`, "Task events at their cap").
    pub fn task_events(&self) -> String {
        format!("{}.task.events", self.ns)
    }

    pub fn task_cancel(&self, task: TaskId) -> String {
        format!("{}.task.cancel.{task}", self.ns)
    }

    /// Every task's cancel subject, for a worker that watches all the tasks it runs at once.
    pub fn task_cancel_all(&self) -> String {
        format!("{}.task.cancel.*", self.ns)
    }

    pub fn control(&self, op: ControlOp) -> String {
        format!("{}.control.{}", self.ns, op.as_str())
    }

    /// Where a stopping worker says so (plain publish, every task-control replica listens): its
    /// polls are forgotten, so that no task is handed to it any more.
    pub fn worker_stopping(&self) -> String {
        format!("{}.worker.stopping", self.ns)
    }

    pub fn control_all(&self) -> String {
        format!("{}.control.*", self.ns)
    }

    /// The operation a control request's subject names; `None` for a subject that is not one.
    pub fn control_op_of(&self, subject: &str) -> Option<ControlOp> {
        let op = self.below(subject, "control")?;
        ControlOp::ALL.into_iter().find(|o| o.as_str() == op)
    }

    /// The task a cancel hint's subject names.
    pub fn task_of_cancel(&self, subject: &str) -> Option<TaskId> {
        self.below(subject, "task.cancel")?.parse().ok()
    }

    /// The source a dead letter's subject names (`chat_in`, `task_run`, …).
    pub fn dead_letter_source<'a>(&self, subject: &'a str) -> Option<&'a str> {
        self.below(subject, "dead")
    }

    /// The one token after `<ns>.<prefix>.` in `subject`.
    fn below<'a>(&self, subject: &'a str, prefix: &str) -> Option<&'a str> {
        let rest = subject
            .strip_prefix(self.ns.0.as_str())?
            .strip_prefix('.')?
            .strip_prefix(prefix)?
            .strip_prefix('.')?;
        (!rest.is_empty() && !rest.contains('.')).then_some(rest)
    }

    /// The queue group every task-control replica answers control requests in.
    pub fn control_queue_group(&self) -> String {
        format!("{}.control", self.ns)
    }

    // Streams.

    pub fn chat_in_stream(&self) -> String {
        format!("{}_CHAT_IN", self.stream_prefix)
    }

    pub fn chat_out_stream(&self) -> String {
        format!("{}_CHAT_OUT", self.stream_prefix)
    }

    pub fn chat_receipt_stream(&self) -> String {
        format!("{}_CHAT_RECEIPT", self.stream_prefix)
    }

    pub fn task_run_stream(&self) -> String {
        format!("{}_TASK_RUN", self.stream_prefix)
    }

    pub fn task_events_stream(&self) -> String {
        format!("{}_TASK_EVENTS", self.stream_prefix)
    }

    /// Messages set aside because they can never be handled ([`crate::consume`]).
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_DEAD", self.stream_prefix)
    }

    /// The dead letters of one source (a consumer, or the gateway's spool).
    pub fn dead_letter(&self, source: &str) -> String {
        format!("{}.dead.{source}", self.ns)
    }

    pub fn dead_letters_all(&self) -> String {
        format!("{}.dead.>", self.ns)
    }

    // Durable consumers.

    /// Shared by all task-control replicas on `CHAT_IN` and `CHAT_RECEIPT`.
    pub const CONTROL_CONSUMER: &'static str = "control";
    /// Shared by all workers on `TASK_RUN`.
    pub const WORKER_CONSUMER: &'static str = "workers";

    /// The consumer of one bot's outbound messages, used by the gateway that holds the bot.
    pub fn gateway_consumer(&self, platform: &str, bot_id: &str) -> Result<String, Error> {
        Ok(format!("gateway_{}_{}", token(platform)?, token(bot_id)?))
    }

    // Deduplication ids.

    /// The key of one inbound chat message: its platform, bot, stream and id, since on some
    /// platforms (Telegram) a message id is unique only within its chat.
    pub fn chat_in_msg_id(platform: &str, bot_id: &str, stream: &str, message_id: &str) -> String {
        format!("{platform}:{bot_id}:{stream}:{message_id}")
    }

    pub fn run_job_msg_id(task: TaskId, generation: u64) -> String {
        format!("{task}:{generation}")
    }

    pub fn task_event_msg_id(task: TaskId, generation: u64) -> String {
        format!("{task}:{generation}")
    }

    /// The stream configurations, in the order [`ensure`] creates them.
    pub fn stream_configs(&self) -> Vec<stream::Config> {
        let day = Duration::from_secs(86_400);
        let base = |name: String, subjects: Vec<String>, retention, max_age| stream::Config {
            name,
            subjects,
            retention,
            max_age,
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(120),
            num_replicas: self.replication.replicas,
            placement: self.replication.placement(),
            ..Default::default()
        };
        let task_run = self
            .task_run_partitions()
            .into_iter()
            .map(|(stream, subject)| {
                base(stream, vec![subject], RetentionPolicy::WorkQueue, 30 * day)
            });
        let chat_in = self
            .chat_in_partitions()
            .into_iter()
            .map(|(stream, subject)| base(stream, vec![subject], RetentionPolicy::Limits, 7 * day));
        let mut configs = vec![
            base(
                self.chat_out_stream(),
                vec![self.chat_out_all()],
                RetentionPolicy::WorkQueue,
                CHAT_OUT_MAX_AGE,
            ),
            base(
                self.chat_receipt_stream(),
                vec![self.chat_receipt()],
                RetentionPolicy::WorkQueue,
                7 * day,
            ),
            // Task events are published best effort (the task row is the truth), so they live
            // for an hour, in memory on one server. Copies on a cluster are kept on file:
            // nats-server 2.9 can leave a replicated memory stream without a leader for minutes
            // after a peer restarts (nats-server#3712), and a file stream's peers keep their raft
            // state across a restart.
            stream::Config {
                max_bytes: 256 * 1024 * 1024,
                storage: if self.replication.replicas > 1 {
                    StorageType::File
                } else {
                    StorageType::Memory
                },
                ..base(
                    self.task_events_stream(),
                    vec![self.task_events()],
                    RetentionPolicy::Limits,
                    Duration::from_secs(3600),
                )
            },
            // Kept for a person to look at (`hark health`) and bounded, so that a flood of bad
            // input cannot fill the server.
            stream::Config {
                max_messages: 100_000,
                max_bytes: 512 * 1024 * 1024,
                ..base(
                    self.dead_letter_stream(),
                    vec![self.dead_letters_all()],
                    RetentionPolicy::Limits,
                    30 * day,
                )
            },
        ];
        configs.splice(2..2, task_run);
        configs.splice(0..0, chat_in);
        configs
    }
}

/// A durable pull consumer's settings: explicit acks, redelivery after `ack_wait`.
pub fn durable(
    name: &str,
    filter_subject: String,
    ack_wait: Duration,
    max_deliver: i64,
) -> pull::Config {
    pull::Config {
        durable_name: Some(name.to_owned()),
        filter_subject,
        ack_policy: AckPolicy::Explicit,
        ack_wait,
        max_deliver,
        max_ack_pending: 10_000,
        ..Default::default()
    }
}

/// Whether a JetStream request failed because the server runs without JetStream.
pub fn jetstream_off(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    error.contains("jetstream unavailable") || error.contains("jetstream not enabled")
}

/// Creates or updates every stream and the consumers shared by task-control and workers.
/// Safe to call from every replica at every start.
pub async fn ensure(js: &jetstream::Context, names: &Names) -> Result<(), Error> {
    for config in names.stream_configs() {
        let stream = config.name.clone();
        let disposable = stream == names.task_events_stream();
        match js.create_or_update_stream(config.clone()).await {
            Ok(_) => {}
            // Settings a stream cannot change in place (its storage type, say): task events are
            // disposable, so that stream is made anew.
            Err(_) if disposable => {
                let _ = js.delete_stream(&stream).await;
                js.create_stream(config).await.map_err(|e| Error::Stream {
                    stream: stream.clone(),
                    source: e.into(),
                })?;
            }
            Err(e) => {
                let source: async_nats::Error = e.into();
                let said = source.to_string().to_ascii_lowercase();
                if jetstream_off(&said) {
                    return Err(Error::NoJetStream);
                }
                if said.contains("non-clustered") {
                    return Err(Error::NotClustered {
                        stream,
                        replicas: names.replication.replicas,
                        source,
                    });
                }
                if said.contains("can not change") || said.contains("cannot change") {
                    return Err(Error::Unchangeable { stream, source });
                }
                return Err(Error::Stream { stream, source });
            }
        }
    }
    // A message whose consumer died while it handled one comes back after this long: long
    // enough for a handler that waits for a database, short enough that a person whose answer
    // it was hardly notices.
    let ack_wait = Duration::from_secs(15);
    for (stream, subject) in names.chat_in_partitions() {
        ensure_consumer(
            js,
            &stream,
            // No delivery limit: a message that cannot be decoded is terminated explicitly, and
            // one that failed because the database was down must wait for it, however long.
            durable(Names::CONTROL_CONSUMER, subject, ack_wait, -1),
        )
        .await?;
    }
    ensure_consumer(
        js,
        &names.chat_receipt_stream(),
        durable(Names::CONTROL_CONSUMER, names.chat_receipt(), ack_wait, -1),
    )
    .await?;
    for (stream, subject) in names.task_run_partitions() {
        ensure_consumer(
            js,
            &stream,
            durable(Names::WORKER_CONSUMER, subject, ack_wait, -1),
        )
        .await?;
    }
    for (stream, held) in left_behind(js, names).await {
        tracing::error!(
            stream,
            messages = held,
            partitions = names.partitions,
            "a partition beyond nats.partitions still holds messages nobody takes now; set \
             nats.partitions back until it is empty, then lower it"
        );
    }
    Ok(())
}

/// The partition streams beyond `nats.partitions` whose consumer has messages not yet handled,
/// left from a run with more partitions, with how many.
pub async fn left_behind(js: &jetstream::Context, names: &Names) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (kind, consumer) in [
        ("TASK_RUN", Names::WORKER_CONSUMER),
        ("CHAT_IN", Names::CONTROL_CONSUMER),
    ] {
        // Partitions are made from 1 up, so the first one missing ends them.
        for p in names.partitions.max(1)..64 {
            let name = format!("{}_{kind}_{p}", names.stream_prefix);
            let Ok(stream) = js.get_stream(&name).await else {
                break;
            };
            let Ok(mut consumer) = stream.get_consumer::<pull::Config>(consumer).await else {
                continue;
            };
            if let Ok(info) = consumer.info().await {
                let held = info.num_pending + info.num_ack_pending as u64;
                if held > 0 {
                    out.push((name, held));
                }
            }
        }
    }
    out
}

/// The streams of `names` that have no leader now, or that JetStream cannot tell about within
/// `within`: on a cluster, a stream without a leader takes no message until its replicas elect
/// one. Empty when every stream has a leader (a single server always leads its own).
pub async fn leaderless(js: &jetstream::Context, names: &Names, within: Duration) -> Vec<String> {
    let asks = names.stream_configs().into_iter().map(|config| async move {
        let led = tokio::time::timeout(within, async {
            // Getting the stream reads its info, leader included: one request per stream.
            let stream = js.get_stream(&config.name).await.ok()?;
            Some(match &stream.cached_info().cluster {
                Some(cluster) => cluster.leader.as_deref().is_some_and(|l| !l.is_empty()),
                None => true,
            })
        })
        .await;
        (config.name, matches!(led, Ok(Some(true))))
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter(|(_, led)| !led)
        .map(|(name, _)| name)
        .collect()
}

/// A service's link to the bus: its NATS connection, JetStream context and names.
#[derive(Debug, Clone)]
pub struct Connection {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: Names,
}

/// Connects as `client_name` to the configured NATS and makes sure every stream and shared
/// consumer exists. Every role starts this way.
pub async fn connect(
    config: &crate::config::NatsConfig,
    client_name: &str,
) -> Result<Connection, Error> {
    let names = Names::of(config)?;
    let client = connect_client(config, client_name).await?;
    let js = jetstream::new(client.clone());
    ensure(&js, &names).await?;
    Ok(Connection { client, js, names })
}

/// A client of the configured NATS that connects in the background, now or whenever the server
/// answers, and reconnects for ever: for a role that works while NATS is away.
pub async fn connect_in_background(
    config: &crate::config::NatsConfig,
    client_name: &str,
) -> Result<async_nats::Client, Error> {
    let options = async_nats::ConnectOptions::new()
        .name(client_name)
        .retry_on_initial_connect()
        .max_reconnects(None);
    connect_with(config, options).await
}

/// Connects as `client_name` to the configured NATS, and nothing more.
pub async fn connect_client(
    config: &crate::config::NatsConfig,
    client_name: &str,
) -> Result<async_nats::Client, Error> {
    connect_with(config, async_nats::ConnectOptions::new().name(client_name)).await
}

/// Connects to the configured NATS with `options`: to one of the comma-separated servers, and on
/// to another when it goes away (the client also learns the cluster's other servers from the one
/// it reaches). Credentials in the URL are handed over separately, so that the client library,
/// which logs the server's address, never sees them in it.
async fn connect_with(
    config: &crate::config::NatsConfig,
    mut options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, Error> {
    let mut servers = Vec::new();
    let mut credentials = None;
    for url in config.url.expose().split(',').map(str::trim) {
        let (url, given) = split_credentials(url);
        servers.push(url);
        credentials = credentials.or(given);
    }
    options = match credentials {
        Some((user, Some(password))) => options.user_and_password(user, password),
        Some((token, None)) => options.token(token),
        None => options,
    };
    options
        .connect(servers)
        .await
        .map_err(|source| Error::Connect {
            url: crate::secret::redact_url(config.url.expose()),
            source,
        })
}

/// A NATS URL without its `user:password@` (or `token@`), and those apart, percent-decoded.
pub fn split_credentials(url: &str) -> (String, Option<(String, Option<String>)>) {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some((credentials, host)) = rest[..authority_end].rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    let decoded = |s: &str| percent_decode(s);
    let credentials = match credentials.split_once(':') {
        Some((user, password)) => (decoded(user), Some(decoded(password))),
        None => (decoded(credentials), None),
    };
    (
        format!("{scheme}{host}{}", &rest[authority_end..]),
        Some(credentials),
    )
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Creates the consumer, or updates it when it exists with other settings.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    stream: &str,
    config: pull::Config,
) -> Result<jetstream::consumer::Consumer<pull::Config>, Error> {
    let consumer = config.durable_name.clone().unwrap_or_default();
    js.create_consumer_on_stream(config, stream)
        .await
        .map_err(|e| Error::Consumer {
            stream: stream.to_owned(),
            consumer,
            source: e.into(),
        })
}

/// How long a message whose handling failed retryably waits before its `delivered`-th
/// redelivery: 1 s, 2 s, 4 s, … up to 10 s, so that a consumer does not hammer a dependency that
/// is down, and a message is handled within seconds of it coming back.
pub fn retry_delay(delivered: i64) -> Duration {
    let exponent = u32::try_from(delivered.clamp(1, 5) - 1).unwrap_or(0);
    (Duration::from_secs(1) * 2u32.pow(exponent)).min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_taken_apart_by_the_names_that_made_them() {
        let names = Names::new("hark".parse().expect("ns"));
        let other = Names::new("other".parse().expect("ns"));
        for op in ControlOp::ALL {
            assert_eq!(names.control_op_of(&names.control(op)), Some(op));
            assert_eq!(other.control_op_of(&names.control(op)), None);
        }
        assert_eq!(names.control_op_of("hark.control.unknown"), None);
        assert_eq!(names.control_op_of("hark.control.claim.more"), None);
        let task = TaskId::new();
        assert_eq!(names.task_of_cancel(&names.task_cancel(task)), Some(task));
        assert_eq!(names.task_of_cancel(&names.task_events()), None);
        assert_eq!(
            names.dead_letter_source(&names.dead_letter("chat_in")),
            Some("chat_in")
        );
        assert_eq!(names.dead_letter_source("hark.dead."), None);
    }

    fn names(ns: &str) -> Names {
        Names::new(ns.parse().expect("namespace"))
    }

    #[test]
    fn every_name_starts_with_the_namespace() {
        let n = names("blue");
        let task = TaskId::new();
        let subjects = [
            n.chat_in("qq").expect("subject"),
            n.chat_out("qq", "42").expect("subject"),
            n.chat_receipt(),
            n.task_run(),
            n.task_events(),
            n.task_cancel(task),
            n.control(ControlOp::Claim),
            n.control_queue_group(),
        ];
        for s in subjects {
            assert!(s.starts_with("blue."), "{s}");
        }
        for config in n.stream_configs() {
            assert!(config.name.starts_with("BLUE_"), "{}", config.name);
            for subject in config.subjects {
                assert!(subject.starts_with("blue."), "{subject}");
            }
        }
    }

    #[test]
    fn task_events_live_in_memory_alone_and_on_file_when_replicated() {
        let storage = |replicas| {
            let mut n = names("hark");
            n.replication.replicas = replicas;
            let events = n.task_events_stream();
            let configs = n.stream_configs();
            let config = configs.iter().find(|c| c.name == events).expect("events");
            assert_eq!(config.num_replicas, replicas);
            assert!(
                configs
                    .iter()
                    .filter(|c| c.name != events)
                    .all(|c| c.storage == StorageType::File)
            );
            config.storage
        };
        assert_eq!(storage(1), StorageType::Memory);
        assert_eq!(storage(3), StorageType::File);
    }

    #[test]
    fn subject_tokens_cannot_smuggle_wildcards() {
        let n = names("hark");
        for bad in ["", "a.b", "*", ">", "a b"] {
            assert!(n.chat_in(bad).is_err(), "{bad:?} accepted");
            assert!(n.chat_out("qq", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn credentials_are_taken_out_of_a_nats_url() {
        assert_eq!(
            split_credentials("nats://hark:p%40ss@127.0.0.1:4222"),
            (
                "nats://127.0.0.1:4222".into(),
                Some(("hark".into(), Some("p@ss".into())))
            )
        );
        assert_eq!(
            split_credentials("nats://s3cr3t@nats:4222"),
            ("nats://nats:4222".into(), Some(("s3cr3t".into(), None)))
        );
        assert_eq!(
            split_credentials("nats://127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".into(), None)
        );
        assert_eq!(
            split_credentials("127.0.0.1:4222"),
            ("127.0.0.1:4222".into(), None)
        );
    }

    #[test]
    fn namespaces_are_checked() {
        for good in ["hark", "test-1", "a_b"] {
            assert!(good.parse::<Namespace>().is_ok(), "{good}");
        }
        for bad in ["", "Hark", "a.b", "a b", "x>", &"n".repeat(33)] {
            assert!(bad.parse::<Namespace>().is_err(), "{bad:?}");
        }
    }
}
