//! The watchers of task events in this process: one NATS subscription to every task's events,
//! handed to the `WatchTask` streams that watch each task, and one ordered consumer of the task
//! event stream (the feed), handed to every `WatchTasks` stream. A stream costs a small channel,
//! not a subscription or a consumer of its own, and the number of streams is capped by
//! `control.max_watchers`, per connection and per token too.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use futures_util::StreamExt;
use hark_core::{bus::Names, codec, domain::TaskId};
use hark_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// Events one watcher may have waiting; beyond it, events are dropped for that watcher, whose
/// stream then catches up from the task row.
const QUEUE: usize = 16;

/// Events the feed keeps for `WatchTasks` streams that are behind; one further behind ends, and
/// its client goes on from its last token.
const FEED: usize = 4096;

/// What the feed hands every `WatchTasks` stream.
#[derive(Debug)]
pub enum Fed {
    /// A task event at its place in the stream of task events.
    Event {
        /// When that stream was made, in nanoseconds since the epoch.
        created: i128,
        sequence: u64,
        event: Box<pb::TaskEvent>,
    },
    /// The feed lost its place (the stream was made anew, or events were dropped before it read
    /// them): the streams it feeds end, and their clients go on from their last token.
    Lost(String),
}

/// Each task's watchers, by their id.
type ByTask = HashMap<TaskId, Vec<(u64, mpsc::Sender<Arc<pb::TaskEvent>>)>>;

/// Who holds a watcher: the connection it came on and the token it signed in with, each of
/// which may hold only so many (`control.max_watchers_per_connection`, `…_per_token`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Holder {
    pub connection: Option<std::net::SocketAddr>,
    /// The position of the token in `control.api_tokens`.
    pub token: Option<usize>,
}

/// How many watchers there may be: in all, per connection and per token.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub total: u64,
    pub per_connection: u64,
    pub per_token: u64,
}

/// The watchers of every task, by task, and what each holder holds.
#[derive(Debug, Default)]
struct Held {
    by_task: ByTask,
    per_connection: HashMap<std::net::SocketAddr, u64>,
    per_token: HashMap<usize, u64>,
}

/// The watchers of every task, by task.
#[derive(Debug)]
pub struct Watchers {
    held: Mutex<Held>,
    count: AtomicU64,
    next: AtomicU64,
    limits: Limits,
    /// Cancelled when task-control stops: every stream ends then, telling its client to watch
    /// again, so that none holds the server's shutdown up.
    stopping: CancellationToken,
    /// Every task event, in the order of the stream, for the `WatchTasks` streams.
    feed: broadcast::Sender<std::sync::Arc<Fed>>,
    /// Cancelled once the feed reads the stream: from then on it misses no event.
    feeding: CancellationToken,
}

/// A watcher limit was reached.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum TooMany {
    #[error(
        "task-control serves {0} task watchers already, the most control.max_watchers allows; try again later"
    )]
    Total(u64),
    #[error(
        "this connection holds {0} task watchers already, the most control.max_watchers_per_connection allows; close some first"
    )]
    Connection(u64),
    #[error(
        "this token holds {0} task watchers already, the most control.max_watchers_per_token allows; close some first"
    )]
    Token(u64),
}

/// A place among the watchers, given back when dropped.
#[derive(Debug)]
struct Place {
    watchers: Arc<Watchers>,
    holder: Holder,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.watchers.lock();
        self.watchers.count.fetch_sub(1, Ordering::Relaxed);
        let Held {
            per_connection,
            per_token,
            ..
        } = &mut *held;
        if let Some(connection) = self.holder.connection {
            release(per_connection, connection);
        }
        if let Some(token) = self.holder.token {
            release(per_token, token);
        }
    }
}

fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u64>, key: K) {
    if let Some(count) = counts.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

/// One registered watcher: the task's events arrive on it until it is dropped.
#[derive(Debug)]
pub struct Watch {
    watchers: Arc<Watchers>,
    _place: Place,
    task: TaskId,
    id: u64,
    /// Shared with the task's other watchers: a slot of the channel's buffer, which every watch
    /// allocates, costs a pointer.
    events: mpsc::Receiver<Arc<pb::TaskEvent>>,
}

impl Watch {
    /// Cancelled when task-control stops.
    pub fn stopping(&self) -> CancellationToken {
        self.watchers.stopping()
    }

    /// The next event of the task, or `None` when the hub stopped.
    pub async fn next(&mut self) -> Option<pb::TaskEvent> {
        self.events.recv().await.map(Arc::unwrap_or_clone)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.watchers.forget(self.task, self.id);
    }
}

/// A place among the watchers taken by a stream of many tasks' events, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    watchers: Arc<Watchers>,
    _place: Place,
}

impl Slot {
    /// Cancelled when task-control stops.
    pub fn stopping(&self) -> CancellationToken {
        self.watchers.stopping()
    }

    /// Every task event the feed reads from now on.
    pub fn feed(&self) -> broadcast::Receiver<Arc<Fed>> {
        self.watchers.feed.subscribe()
    }

    /// Cancelled once the feed reads the stream of task events.
    pub fn feeding(&self) -> CancellationToken {
        self.watchers.feeding.clone()
    }
}

impl Watchers {
    /// Takes a place for a stream of many tasks, unless a limit is reached.
    pub fn slot(self: &Arc<Self>, holder: Holder) -> Result<Slot, TooMany> {
        let mut held = self.lock();
        let place = self.take(&mut held, holder)?;
        Ok(Slot {
            watchers: self.clone(),
            _place: place,
        })
    }

    /// Counts a place for `holder`, unless a limit is reached. Called with the lock held.
    fn take(self: &Arc<Self>, held: &mut Held, holder: Holder) -> Result<Place, TooMany> {
        let count = self.count.load(Ordering::Relaxed);
        if count >= self.limits.total {
            return Err(TooMany::Total(count));
        }
        let of_connection = holder
            .connection
            .and_then(|c| held.per_connection.get(&c).copied())
            .unwrap_or(0);
        if of_connection >= self.limits.per_connection {
            return Err(TooMany::Connection(of_connection));
        }
        let of_token = holder
            .token
            .and_then(|t| held.per_token.get(&t).copied())
            .unwrap_or(0);
        if of_token >= self.limits.per_token {
            return Err(TooMany::Token(of_token));
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(connection) = holder.connection {
            *held.per_connection.entry(connection).or_default() += 1;
        }
        if let Some(token) = holder.token {
            *held.per_token.entry(token).or_default() += 1;
        }
        Ok(Place {
            watchers: self.clone(),
            holder,
        })
    }

    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            count: AtomicU64::new(0),
            next: AtomicU64::new(1),
            limits,
            stopping: CancellationToken::new(),
            feed: broadcast::channel(FEED).0,
            feeding: CancellationToken::new(),
        })
    }

    /// Cancelled when task-control stops.
    pub fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// Ends every stream: task-control is stopping.
    pub fn stop(&self) {
        self.stopping.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many watchers there are now.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Registers a watcher of `task` for `holder`, unless a limit is reached.
    pub fn watch(self: &Arc<Self>, task: TaskId, holder: Holder) -> Result<Watch, TooMany> {
        let mut held = self.lock();
        let place = self.take(&mut held, holder)?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, events) = mpsc::channel(QUEUE);
        held.by_task.entry(task).or_default().push((id, tx));
        Ok(Watch {
            watchers: self.clone(),
            _place: place,
            task,
            id,
            events,
        })
    }

    fn forget(&self, task: TaskId, id: u64) {
        let mut held = self.lock();
        if let Some(list) = held.by_task.get_mut(&task) {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                held.by_task.remove(&task);
            }
        }
    }

    /// Hands an event to the watchers of its task.
    pub fn dispatch(&self, event: pb::TaskEvent) {
        let Ok(task) = event.task_id.parse::<TaskId>() else {
            return;
        };
        let event = Arc::new(event);
        let held = self.lock();
        for (_, tx) in held.by_task.get(&task).into_iter().flatten() {
            // A watcher that is behind misses this one and reads the row instead.
            let _ = tx.try_send(event.clone());
        }
    }

    /// Receives every task event of the namespace and dispatches it, until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        nats: async_nats::Client,
        subject: String,
        shutdown: CancellationToken,
    ) {
        loop {
            let mut events = match nats.subscribe(subject.clone()).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to task events; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    message = events.next() => message,
                };
                let Some(message) = message else { break };
                match codec::decode::<pb::TaskEvent>(&message.payload) {
                    Ok(event) => self.dispatch(event),
                    Err(e) => tracing::debug!(error = %e, "skipping a malformed task event"),
                }
            }
        }
    }
}

impl Watchers {
    /// Reads the stream of task events with one ordered consumer and hands each event to the
    /// `WatchTasks` streams, until `shutdown`. After NATS was away it goes on from its last
    /// event, or tells the streams that it lost its place.
    pub async fn feed(
        self: Arc<Self>,
        js: async_nats::jetstream::Context,
        names: Names,
        shutdown: CancellationToken,
    ) {
        use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
        let Some(config) = names
            .stream_configs()
            .into_iter()
            .find(|c| c.name == names.task_events_stream())
        else {
            return;
        };
        let retry = || async {
            tokio::select! {
                _ = shutdown.cancelled() => false,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => true,
            }
        };
        // Where the feed is: the stream (by when it was made) and the last event read.
        let mut at: Option<(i128, u64)> = None;
        loop {
            let stream = match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the task event stream; retrying");
                    if retry().await {
                        continue;
                    }
                    return;
                }
            };
            let info = stream.cached_info();
            let created = info.created.unix_timestamp_nanos();
            let deliver_policy = match at {
                Some((made, last)) if made == created && last + 1 >= info.state.first_sequence => {
                    DeliverPolicy::ByStartSequence {
                        start_sequence: last + 1,
                    }
                }
                Some(_) => {
                    let _ = self.feed.send(Arc::new(Fed::Lost(
                        "task events were lost while NATS was away".into(),
                    )));
                    DeliverPolicy::New
                }
                None => DeliverPolicy::New,
            };
            let messages = match stream
                .create_consumer(OrderedConfig {
                    filter_subject: names.task_events(),
                    deliver_policy,
                    ..Default::default()
                })
                .await
            {
                Ok(consumer) => consumer.messages().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let mut messages = match messages {
                Ok(messages) => messages,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the task event stream; retrying");
                    if retry().await {
                        continue;
                    }
                    return;
                }
            };
            at.get_or_insert((created, info.state.last_sequence));
            self.feeding.cancel();
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    message = messages.next() => message,
                };
                let message = match message {
                    Some(Ok(message)) => message,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "the task event feed stopped; reading again");
                        break;
                    }
                    None => break,
                };
                let Ok(info) = message.info() else { continue };
                let sequence = info.stream_sequence;
                at = Some((created, sequence));
                if self.feed.receiver_count() == 0 {
                    continue;
                }
                match codec::decode::<pb::TaskEvent>(&message.payload) {
                    Ok(event) => {
                        let _ = self.feed.send(Arc::new(Fed::Event {
                            created,
                            sequence,
                            event: Box::new(event),
                        }));
                    }
                    Err(e) => tracing::debug!(error = %e, "skipping a malformed task event"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(task: TaskId, generation: u64) -> pb::TaskEvent {
        pb::TaskEvent {
            task_id: task.to_string(),
            generation,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn events_reach_the_watchers_of_their_task_and_a_dropped_watch_is_forgotten() {
        let watchers = Watchers::new(Limits {
            total: 3,
            per_connection: 3,
            per_token: 3,
        });
        let anyone = Holder::default();
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut first = watchers.watch(a, anyone).expect("room");
        let mut second = watchers.watch(a, anyone).expect("room");
        let mut other = watchers.watch(b, anyone).expect("room");
        assert!(
            watchers.watch(b, anyone).is_err(),
            "the fourth is over the limit"
        );
        watchers.dispatch(event(a, 2));
        assert_eq!(first.next().await.expect("event").generation, 2);
        assert_eq!(second.next().await.expect("event").generation, 2);
        watchers.dispatch(event(b, 5));
        assert_eq!(other.next().await.expect("event").generation, 5);
        drop(first);
        assert_eq!(watchers.count(), 2);
        let _again = watchers.watch(b, anyone).expect("room again");
        drop(second);
        drop(other);
        assert_eq!(watchers.count(), 1);
        assert!(
            !watchers.lock().by_task.contains_key(&a),
            "nothing is kept for a"
        );
    }

    #[test]
    fn a_connection_and_a_token_each_hold_only_so_many_watchers() {
        let watchers = Watchers::new(Limits {
            total: 100,
            per_connection: 2,
            per_token: 3,
        });
        let on = |port: u16, token: usize| Holder {
            connection: Some(std::net::SocketAddr::from(([192, 0, 2, 1], port))),
            token: Some(token),
        };
        let task = TaskId::new();
        let first = watchers.watch(task, on(1, 0)).expect("room");
        let _second = watchers.slot(on(1, 0)).expect("room");
        assert!(matches!(
            watchers.watch(task, on(1, 0)),
            Err(TooMany::Connection(2))
        ));
        // Another connection of the same token: one more, then the token is full.
        let _third = watchers.watch(task, on(2, 0)).expect("room");
        assert!(matches!(watchers.slot(on(3, 0)), Err(TooMany::Token(3))));
        // Another token is not held back; a place given back is free again.
        let _other = watchers.watch(task, on(3, 1)).expect("another token");
        drop(first);
        let _again = watchers.watch(task, on(1, 0)).expect("given back");
        assert_eq!(watchers.count(), 4);
        assert!(watchers.lock().per_connection.len() <= 3);
    }
}
