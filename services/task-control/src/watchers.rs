//! The watchers of task events in this process: one NATS subscription to every task's events,
//! handed to the `WatchTask` streams that watch each task. A stream costs a small channel, not a
//! subscription of its own, and the number of streams is capped by `control.max_watchers`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use futures_util::StreamExt;
use hark_core::{codec, domain::TaskId};
use hark_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events one watcher may have waiting; beyond it, events are dropped for that watcher, whose
/// stream then catches up from the task row.
const QUEUE: usize = 16;

/// Each task's watchers, by their id.
type ByTask = HashMap<TaskId, Vec<(u64, mpsc::Sender<pb::TaskEvent>)>>;

/// The watchers of every task, by task.
#[derive(Debug)]
pub struct Watchers {
    by_task: Mutex<ByTask>,
    count: AtomicU64,
    next: AtomicU64,
    /// `control.max_watchers`.
    max: u64,
    /// Cancelled when task-control stops: every stream ends then, telling its client to watch
    /// again, so that none holds the server's shutdown up.
    stopping: CancellationToken,
}

/// The watcher limit was reached.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "task-control serves {0} task watchers already, the most control.max_watchers allows; try again later"
)]
pub struct TooMany(pub u64);

/// One registered watcher: the task's events arrive on it until it is dropped.
#[derive(Debug)]
pub struct Watch {
    watchers: Arc<Watchers>,
    task: TaskId,
    id: u64,
    events: mpsc::Receiver<pb::TaskEvent>,
}

impl Watch {
    /// Cancelled when task-control stops.
    pub fn stopping(&self) -> CancellationToken {
        self.watchers.stopping()
    }

    /// The next event of the task, or `None` when the hub stopped.
    pub async fn next(&mut self) -> Option<pb::TaskEvent> {
        self.events.recv().await
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
}

impl Slot {
    /// Cancelled when task-control stops.
    pub fn stopping(&self) -> CancellationToken {
        self.watchers.stopping()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.watchers.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Watchers {
    /// Takes a place for a stream of many tasks, unless the limit is reached.
    pub fn slot(self: &Arc<Self>) -> Result<Slot, TooMany> {
        let _by_task = self.lock();
        let count = self.count.load(Ordering::Relaxed);
        if count >= self.max {
            return Err(TooMany(count));
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            watchers: self.clone(),
        })
    }

    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(Self {
            by_task: Mutex::default(),
            count: AtomicU64::new(0),
            next: AtomicU64::new(1),
            max,
            stopping: CancellationToken::new(),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, ByTask> {
        self.by_task.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many watchers there are now.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Registers a watcher of `task`, unless the limit is reached.
    pub fn watch(self: &Arc<Self>, task: TaskId) -> Result<Watch, TooMany> {
        let mut by_task = self.lock();
        let count = self.count.load(Ordering::Relaxed);
        if count >= self.max {
            return Err(TooMany(count));
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, events) = mpsc::channel(QUEUE);
        by_task.entry(task).or_default().push((id, tx));
        Ok(Watch {
            watchers: self.clone(),
            task,
            id,
            events,
        })
    }

    fn forget(&self, task: TaskId, id: u64) {
        let mut by_task = self.lock();
        if let Some(list) = by_task.get_mut(&task) {
            let before = list.len();
            list.retain(|(i, _)| *i != id);
            if list.len() < before {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            if list.is_empty() {
                by_task.remove(&task);
            }
        }
    }

    /// Hands an event to the watchers of its task.
    pub fn dispatch(&self, event: pb::TaskEvent) {
        let Ok(task) = event.task_id.parse::<TaskId>() else {
            return;
        };
        let by_task = self.lock();
        for (_, tx) in by_task.get(&task).into_iter().flatten() {
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
        let watchers = Watchers::new(3);
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut first = watchers.watch(a).expect("room");
        let mut second = watchers.watch(a).expect("room");
        let mut other = watchers.watch(b).expect("room");
        assert!(watchers.watch(b).is_err(), "the fourth is over the limit");
        watchers.dispatch(event(a, 2));
        assert_eq!(first.next().await.expect("event").generation, 2);
        assert_eq!(second.next().await.expect("event").generation, 2);
        watchers.dispatch(event(b, 5));
        assert_eq!(other.next().await.expect("event").generation, 5);
        drop(first);
        assert_eq!(watchers.count(), 2);
        let _again = watchers.watch(b).expect("room again");
        drop(second);
        drop(other);
        assert_eq!(watchers.count(), 1);
        assert!(watchers.lock().get(&a).is_none(), "nothing is kept for a");
    }
}
