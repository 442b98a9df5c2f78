//! Run jobs handed straight to an idle worker.
//!
//! A worker with a free slot sends a poll request, and task-control holds it. When the relay is
//! about to publish a run job and a worker waits here, it claims the job's task for that worker
//! and hands the claim over in the poll's reply instead. A resume then skips the run queue's
//! hop and the worker's claim request; everything else stays as it is:
//! - the claim is the same compare-and-set a worker's own claim request makes;
//! - the job's outbox row stays until the hand-over is done, so a crash before then publishes
//!   the job, whose claim is then refused as stale or takes the task;
//! - the worker answers the hand-over at once; one that does not within [`ACK_WAIT`] (it stopped
//!   meanwhile) has the task taken back and queued again, so nothing waits for a lease to lapse.
//!
//! Only the replica a worker polls can hand it jobs; jobs committed elsewhere, and every job
//! while no worker waits, go through the run queue as before.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt as _;
use hark_core::{bus, codec, domain::TaskId, error::Kind};
use hark_proto::v1 as pb;
use prost::Message as _;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::{control, shared::Shared, store::OutboxMessage};

/// How long a worker has to acknowledge a task handed to it.
pub const ACK_WAIT: Duration = Duration::from_secs(5);
/// The longest a poll is held, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Outbox rows whose messages were delivered, for the relay to delete with its next batch:
/// `(subject, msg_id)`.
pub type Delivered = Arc<Mutex<Vec<(String, String)>>>;

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
    reply: async_nats::Subject,
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
    fn park(
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
    fn unpark(&self, id: u64) -> Option<Waiter> {
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

/// A task an answer claimed for a polling worker in its own statement, to hand over.
#[derive(Debug)]
pub struct Handoff {
    pub waiter: Waiter,
    pub claimed: crate::store::Claimed,
    /// The run job the claim stands for (never published).
    pub job: pb::RunJob,
    /// The trace the run continues: the answer's.
    pub trace: Option<String>,
}

/// Hands over the tasks answers claimed for polling workers, until the answers stop.
pub async fn hand_over_claims(
    shared: Shared,
    mut claims: tokio::sync::mpsc::UnboundedReceiver<Handoff>,
) {
    while let Some(handoff) = claims.recv().await {
        let lease = shared.config.task.lease.0;
        let claim = control::claim_response(&shared, handoff.claimed, lease);
        shared.store.metrics().run_job(crate::metrics::HANDED_OVER);
        tokio::spawn(deliver(
            shared.clone(),
            handoff.waiter,
            claim,
            handoff.job,
            handoff.trace,
        ));
    }
}

/// A worker's poll, parked where the relay finds it. Parked in the order polls arrive (the
/// caller parks each before it reads the next request), and then held by [`Poll::hold`].
#[derive(Debug)]
pub struct Poll {
    id: u64,
    wait: Duration,
    taken: oneshot::Receiver<()>,
}

/// Parks the poll `message`; `None` when it cannot wait (it was answered at once, or has no
/// reply subject).
pub async fn park(shared: &Shared, message: async_nats::Message) -> Option<Poll> {
    let Some(reply) = message.reply else {
        tracing::debug!("a poll without a reply subject");
        return None;
    };
    let request = match codec::decode::<pb::PollRequest>(&message.payload) {
        Ok(request) if !request.worker_id.is_empty() => request,
        Ok(_) => {
            tracing::debug!("a poll without a worker id");
            nothing(shared, reply).await;
            return None;
        }
        Err(e) => {
            tracing::debug!(error = %e, "an undecodable poll");
            nothing(shared, reply).await;
            return None;
        }
    };
    let wait = Duration::from_millis(request.wait_ms.into()).min(MAX_WAIT);
    let Some((id, taken)) = shared.parked.park(request.worker_id, reply.clone(), wait) else {
        nothing(shared, reply).await;
        return None;
    };
    Some(Poll { id, wait, taken })
}

impl Poll {
    /// Holds the poll until the relay hands it a job (and replies itself), its wait ends or
    /// task-control stops: then the worker is told nothing came, and polls again.
    pub async fn hold(self, shared: &Shared, shutdown: &CancellationToken) {
        tokio::select! {
            _ = self.taken => return,
            _ = tokio::time::sleep(self.wait) => {}
            _ = shutdown.cancelled() => {}
        }
        if let Some(waiter) = shared.parked.unpark(self.id) {
            nothing(shared, waiter.reply).await;
        }
    }
}

/// Forgets the polls of every worker that says it stops (each replica hears it), until
/// `shutdown`.
pub async fn forget_stopping(shared: Shared, shutdown: CancellationToken) {
    let mut stopping = match shared.nats.subscribe(shared.names.worker_stopping()).await {
        Ok(stopping) => stopping,
        Err(e) => {
            tracing::warn!(error = %e, "cannot hear workers stop; a task handed to a stopped one is taken back after a few seconds");
            return;
        }
    };
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = stopping.next() => message,
        };
        let Some(message) = message else { return };
        let worker = String::from_utf8_lossy(&message.payload);
        let forgotten = shared.parked.withdraw(&worker);
        tracing::debug!(%worker, forgotten, "a worker stops");
    }
}

async fn nothing(shared: &Shared, reply: async_nats::Subject) {
    let empty = pb::PollResponse::default().encode_to_vec();
    if let Err(e) = shared.nats.publish(reply, empty.into()).await {
        tracing::debug!(error = %e, "cannot answer a poll");
    }
}

/// Hands the run job `message` to `waiter`: claims its task for the waiting worker and replies
/// to its poll with the claim. `traceparent` is the context the job would have been published
/// with. A job that cannot be claimed now is published to the run queue instead.
pub async fn hand_over(
    shared: Shared,
    waiter: Waiter,
    message: OutboxMessage,
    traceparent: Option<String>,
    delivered: Delivered,
) {
    let job: pb::RunJob = match codec::decode(&message.payload) {
        Ok(job) => job,
        Err(e) => {
            tracing::warn!(error = %e, "a run job in the outbox does not decode");
            shared.parked.put_back(waiter);
            return publish(&shared, message, traceparent, delivered).await;
        }
    };
    let started = std::time::Instant::now();
    let claim = claim(&shared, &job, &waiter.worker).await;
    shared.store.metrics().request("claim", started.elapsed());
    if claim.lease.is_none() || claim.refusal.is_some() {
        let kind = claim
            .refusal
            .as_ref()
            .and_then(|r| pb::RefusalReason::try_from(r.reason).ok())
            .map_or(Kind::Internal, Kind::of_refusal);
        // The worker waits on for the next job.
        shared.parked.put_back(waiter);
        // A job whose task moved on is done, as a worker's refused claim would settle it; one
        // task-control could not decide now goes to the run queue.
        return match kind {
            Kind::Gone | Kind::NotFound | Kind::Conflict => {
                tracing::debug!(task = job.task_id, ?claim.refusal, "run job no longer applies");
                done(&delivered, message);
            }
            _ => {
                tracing::debug!(task = job.task_id, ?claim.refusal, "cannot claim for a waiting worker; queueing the job");
                publish(&shared, message, traceparent, delivered).await
            }
        };
    }
    hark_core::failpoint::hit("handoff.after_claim");
    // The claim spent the job: its generation is gone.
    done(&delivered, message);
    shared.store.metrics().run_job(crate::metrics::HANDED_OVER);
    deliver(shared, waiter, claim, job, traceparent).await;
}

/// Replies to `waiter`'s poll with `claim`, and takes the task back (queued again) when the
/// worker does not acknowledge it within [`ACK_WAIT`].
async fn deliver(
    shared: Shared,
    waiter: Waiter,
    claim: pb::ClaimResponse,
    job: pb::RunJob,
    traceparent: Option<String>,
) {
    let Some(lease) = claim.lease.clone() else {
        return;
    };
    let response = pb::PollResponse {
        claim: Some(claim),
        job: Some(job),
        traceparent: traceparent.unwrap_or_default(),
    };
    let request = async_nats::Request::new()
        .payload(response.encode_to_vec().into())
        .timeout(Some(ACK_WAIT));
    if let Err(e) = shared.nats.send_request(waiter.reply, request).await {
        tracing::info!(task = lease.task_id, worker = lease.worker_id, error = %e, "the worker did not take the task handed to it; queueing it again");
        take_back(&shared, &lease).await;
    }
}

/// Claims the job's task for `worker`, as its own claim request would.
async fn claim(shared: &Shared, job: &pb::RunJob, worker: &str) -> pb::ClaimResponse {
    let task: TaskId = match job.task_id.parse() {
        Ok(task) => task,
        Err(e) => {
            return control::refused(pb::RefusalReason::Invalid, format!("{e}"));
        }
    };
    let generation = i64::try_from(job.generation).unwrap_or(i64::MAX);
    control::claim_for(shared, task, generation, worker, shared.config.task.lease.0).await
}

/// Queues a handed-over task again: the worker never took it.
async fn take_back(shared: &Shared, lease: &pb::Lease) {
    let (Ok(task), Ok(generation)) = (
        lease.task_id.parse::<TaskId>(),
        i64::try_from(lease.generation),
    ) else {
        return;
    };
    let held = crate::store::Lease {
        task,
        generation,
        worker_id: lease.worker_id.clone(),
    };
    // Refused when the worker took it after all and wrote since, or the task ended: then it
    // is not ours to take back. Should the store be down, the lease lapses instead.
    if let Err(e) = shared
        .store
        .release(&held, "the worker did not take the task handed to it")
        .await
    {
        use hark_core::error::{Classified as _, Kind};
        match e.kind() {
            Kind::Gone | Kind::Conflict | Kind::NotFound => {
                tracing::debug!(task = lease.task_id, error = %e, "a handed-over task was not taken back");
            }
            _ => tracing::warn!(
                task = lease.task_id,
                error = %e,
                "a handed-over task could not be taken back; its lease lapses instead (task.lease)"
            ),
        }
    }
}

/// Publishes the job to the run queue, as the relay would have.
async fn publish(
    shared: &Shared,
    message: OutboxMessage,
    traceparent: Option<String>,
    delivered: Delivered,
) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(bus::MSG_ID_HEADER, message.msg_id.as_str());
    if let Some(trace) = &traceparent {
        headers.insert(hark_core::trace::HEADER, trace.as_str());
    }
    let sent = shared
        .js
        .publish_with_headers(message.subject.clone(), headers, message.payload.clone())
        .await;
    match sent {
        Ok(ack) => match ack.await {
            Ok(_) => {
                shared.store.metrics().run_job(crate::metrics::QUEUED);
                done(&delivered, message)
            }
            Err(e) => tracing::warn!(error = %e, "publish not acknowledged; the sweep will retry"),
        },
        Err(e) => tracing::warn!(error = %e, "cannot publish; the sweep will retry"),
    }
}

fn done(delivered: &Delivered, message: OutboxMessage) {
    delivered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((message.subject, message.msg_id));
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
