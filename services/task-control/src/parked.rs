//! The workers polling this replica for a run job, oldest first. The relay and the answers take
//! one to hand a job to ([`crate::handoff`]); a poll whose wait ends is unparked and told that
//! nothing came.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::oneshot;

/// The longest a poll is held, whatever it asks.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The workers waiting at this replica for a run job, oldest first.
#[derive(Debug, Default)]
pub struct Parked {
    waiting: Mutex<VecDeque<Waiter>>,
    /// Workers that said they stop, and when: a poll of theirs that arrives after that (it was
    /// sent before, or read after the word) is not parked.
    stopped: Mutex<std::collections::HashMap<String, std::time::Instant>>,
    next: AtomicU64,
}

/// A worker's poll, held until a job comes or its wait ends.
#[derive(Debug)]
pub struct Waiter {
    id: u64,
    worker: String,
    /// Where the poll's reply goes.
    pub(crate) reply: async_nats::Subject,
    /// When the poll's wait ends.
    until: std::time::Instant,
    /// Dropped when the waiter is taken, which ends the poll's own wait at once.
    _taken: oneshot::Sender<()>,
}

impl Parked {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiter>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks a poll of `worker`; `None` when the worker said it stops.
    pub(crate) fn park(
        &self,
        worker: String,
        reply: async_nats::Subject,
        wait: Duration,
    ) -> Option<(u64, oneshot::Receiver<()>)> {
        if self.has_stopped(&worker) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (taken, gone) = oneshot::channel();
        self.lock().push_back(Waiter {
            id,
            worker,
            reply,
            until: std::time::Instant::now() + wait,
            _taken: taken,
        });
        Some((id, gone))
    }

    fn has_stopped(&self, worker: &str) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped
            .get(worker)
            .is_some_and(|since| since.elapsed() < MAX_WAIT)
    }

    /// Removes the poll `id`; whether it was still waiting (its reply is then the caller's).
    pub(crate) fn unpark(&self, id: u64) -> Option<Waiter> {
        let mut waiting = self.lock();
        let at = waiting.iter().position(|w| w.id == id)?;
        waiting.remove(at)
    }

    /// Forgets the polls of `worker`, which stops; how many there were.
    pub fn withdraw(&self, worker: &str) -> usize {
        {
            // Remembered for as long as a poll of the worker may still arrive; a worker that
            // comes back under the same id after that polls as usual.
            let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
            stopped.retain(|_, since| since.elapsed() < MAX_WAIT);
            stopped.insert(worker.to_owned(), std::time::Instant::now());
        }
        let mut waiting = self.lock();
        let before = waiting.len();
        waiting.retain(|w| w.worker != worker);
        before - waiting.len()
    }

    /// Gives back a poll taken for a job that went elsewhere: it waited longest, so it is first.
    pub fn put_back(&self, waiter: Waiter) {
        self.lock().push_front(waiter);
    }

    /// The worker that has waited longest, taken for a job.
    /// Polls whose wait ended are passed over: one given back after its wait ended has nobody
    /// holding it any more.
    pub fn take(&self) -> Option<Waiter> {
        let mut waiting = self.lock();
        while let Some(waiter) = waiting.pop_front() {
            if waiter.until > std::time::Instant::now() {
                return Some(waiter);
            }
        }
        None
    }

    /// How many workers wait here.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Waiter {
    /// The polling worker.
    pub fn worker(&self) -> &str {
        &self.worker
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(s: &str) -> async_nats::Subject {
        async_nats::Subject::from(s)
    }

    #[test]
    fn a_stopping_worker_s_polls_are_forgotten_and_no_others() {
        let parked = Parked::default();
        let _a = parked.park("w1".into(), subject("r1"), MAX_WAIT);
        let _b = parked.park("w2".into(), subject("r2"), MAX_WAIT);
        let _c = parked.park("w1".into(), subject("r3"), MAX_WAIT);
        assert_eq!(parked.withdraw("w1"), 2);
        assert_eq!(parked.take().map(|w| w.worker), Some("w2".into()));
        assert!(parked.is_empty());
        // A poll it sent before it stopped, read only now, is not parked.
        assert!(parked.park("w1".into(), subject("r4"), MAX_WAIT).is_none());
        assert!(parked.park("w2".into(), subject("r5"), MAX_WAIT).is_some());
    }

    #[test]
    fn a_poll_whose_wait_ended_is_passed_over_even_when_given_back() {
        let parked = Parked::default();
        let _a = parked.park("w1".into(), subject("r1"), Duration::ZERO);
        let _b = parked.park("w2".into(), subject("r2"), MAX_WAIT);
        let taken = parked.take().expect("w2 waits");
        assert_eq!(taken.worker, "w2");
        parked.put_back(taken);
        assert_eq!(parked.take().map(|w| w.worker), Some("w2".into()));
        assert!(parked.take().is_none());
    }

    #[test]
    fn the_worker_that_waited_longest_is_taken_first() {
        let parked = Parked::default();
        let _a = parked.park("w1".into(), subject("r1"), MAX_WAIT);
        let _b = parked.park("w2".into(), subject("r2"), MAX_WAIT);
        assert_eq!(parked.take().map(|w| w.worker), Some("w1".into()));
        assert_eq!(parked.take().map(|w| w.worker), Some("w2".into()));
        assert!(parked.take().is_none());
    }

    #[test]
    fn a_poll_whose_wait_ended_is_no_longer_taken_and_a_taken_one_is_not_unparked() {
        let parked = Parked::default();
        let (a, _ga) = parked
            .park("w1".into(), subject("r1"), MAX_WAIT)
            .expect("parked");
        let (b, mut gb) = parked
            .park("w2".into(), subject("r2"), MAX_WAIT)
            .expect("parked");
        assert!(
            parked.unpark(a).is_some(),
            "its wait ended first: its reply is the poll's"
        );
        let taken = parked.take().expect("w2 waits");
        assert_eq!(taken.worker, "w2");
        assert!(
            parked.unpark(b).is_none(),
            "taken: its reply is the hand-over's"
        );
        assert!(matches!(
            gb.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        drop(taken);
        assert!(
            matches!(gb.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the poll learns it was taken"
        );
        assert!(parked.is_empty());
    }
}
