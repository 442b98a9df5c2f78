//! Where the bench learns what happened: task events from NATS, and LLM request arrivals from
//! the scripted server, each dispatched to whoever waits for them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures_util::StreamExt;
use hark_core::{bus::Names, codec};
use hark_proto::v1 as pb;
use hark_worker::scripted::{ScriptedLlm, last_tool_result};
use tokio::sync::{Notify, oneshot};

/// Counts state changes by state, and lets a caller await one task reaching a state.
#[derive(Clone, Default)]
pub struct EventHub {
    inner: Arc<Mutex<EventState>>,
    changed: Arc<Notify>,
}

#[derive(Default)]
struct EventState {
    counts: HashMap<i32, usize>,
    waiters: HashMap<(String, i32), oneshot::Sender<Instant>>,
    /// States already seen per task, for waiters that register late.
    seen: HashMap<(String, i32), Instant>,
    track_tasks: bool,
}

impl EventHub {
    pub async fn start(nats: &async_nats::Client, names: &Names) -> anyhow::Result<Self> {
        let mut events = nats.subscribe(names.task_events()).await?;
        let hub = Self::default();
        hub.lock().track_tasks = true;
        let h = hub.clone();
        tokio::spawn(async move {
            while let Some(message) = events.next().await {
                let Ok(event) = codec::decode::<pb::TaskEvent>(&message.payload) else {
                    continue;
                };
                let now = Instant::now();
                let mut state = h.lock();
                *state.counts.entry(event.state).or_default() += 1;
                let key = (event.task_id, event.state);
                if let Some(tx) = state.waiters.remove(&key) {
                    let _ = tx.send(now);
                } else if state.track_tasks {
                    state.seen.insert(key, now);
                }
                drop(state);
                h.changed.notify_waiters();
            }
        });
        Ok(hub)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stop remembering per-task events (W2 only counts).
    pub fn count_only(&self, yes: bool) {
        let mut state = self.lock();
        state.track_tasks = !yes;
        state.seen.clear();
    }

    pub fn count(&self, state: pb::TaskState) -> usize {
        self.lock()
            .counts
            .get(&(state as i32))
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `count(state) >= n`; returns when it happened.
    pub async fn until_count(&self, state: pb::TaskState, n: usize) -> Instant {
        loop {
            let notified = self.changed.notified();
            if self.count(state) >= n {
                return Instant::now();
            }
            notified.await;
        }
    }

    /// Resolves when `task` reaches `state`.
    pub fn when(&self, task: &str, state: pb::TaskState) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        let key = (task.to_owned(), state as i32);
        let mut inner = self.lock();
        if let Some(at) = inner.seen.remove(&key) {
            let _ = tx.send(at);
        } else {
            inner.waiters.insert(key, tx);
        }
        rx
    }
}

/// LLM requests that carry an answer, keyed by the answer text.
#[derive(Clone, Default)]
pub struct ArrivalHub {
    inner: Arc<Mutex<ArrivalState>>,
    changed: Arc<Notify>,
}

#[derive(Default)]
struct ArrivalState {
    waiters: HashMap<String, oneshot::Sender<Instant>>,
    answered: usize,
}

impl ArrivalHub {
    pub fn start(llm: &ScriptedLlm) -> Self {
        let mut feed = llm.subscribe();
        let hub = Self::default();
        let h = hub.clone();
        tokio::spawn(async move {
            loop {
                let recorded = match feed.recv().await {
                    Ok(r) => r,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        eprintln!("bench: missed {n} LLM arrivals (the feed lagged)");
                        continue;
                    }
                    Err(_) => return,
                };
                let Some(answer) = last_tool_result(&recorded.body) else {
                    continue;
                };
                let mut state = h.inner.lock().unwrap_or_else(|p| p.into_inner());
                state.answered += 1;
                if let Some(tx) = state.waiters.remove(&answer) {
                    let _ = tx.send(recorded.at);
                }
                drop(state);
                h.changed.notify_waiters();
            }
        });
        hub
    }

    /// Resolves when a request whose last tool result is `answer` arrives. Register before the
    /// answer is given.
    pub fn when(&self, answer: &str) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiters
            .insert(answer.to_owned(), tx);
        rx
    }

    /// How many requests carrying a tool result have arrived.
    pub fn answered(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answered
    }

    pub async fn until_answered(&self, n: usize) -> Instant {
        loop {
            let notified = self.changed.notified();
            if self.answered() >= n {
                return Instant::now();
            }
            notified.await;
        }
    }
}
