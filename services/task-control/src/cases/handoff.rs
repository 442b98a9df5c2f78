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
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt as _;
use hark_core::{codec, domain::TaskId, error::Kind, publish};
use hark_proto::v1 as pb;
use prost::Message as _;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::claim;
use crate::{
    parked::{MAX_WAIT, Waiter},
    shared::Shared,
    store::{self, OutboxMessage},
};

/// How long a worker has to acknowledge a task handed to it.
pub const ACK_WAIT: Duration = Duration::from_secs(5);

/// Outbox rows whose messages were delivered, for the relay to delete with its next batch:
/// `(subject, msg_id)`.
pub type Delivered = Arc<Mutex<Vec<(String, String)>>>;

/// Hands `claimed`, the claim of a task an answer won for `waiter` in its own statement, over
/// to that worker: `job` is the run job the claim stands for (never published), `trace` the
/// context the run continues.
pub(super) fn hand(
    shared: &Shared,
    waiter: Waiter,
    claimed: store::Claimed,
    job: pb::RunJob,
    trace: Option<String>,
) {
    let claim = claim::claim_response(shared, claimed, shared.config.task.lease.0);
    shared.store.metrics().run_job(crate::metrics::HANDED_OVER);
    tokio::spawn(deliver(shared.clone(), waiter, claim, job, trace));
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
    let claim = claim(&shared, &job, waiter.worker()).await;
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
            return claim::refused(pb::RefusalReason::Invalid, format!("{e}"));
        }
    };
    let generation = i64::try_from(job.generation).unwrap_or(i64::MAX);
    claim::claim_for(shared, task, generation, worker, shared.config.task.lease.0).await
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
    let reason = "the worker did not take the task handed to it";
    if let Err(e) = super::command::release(&shared.store, &held, reason).await {
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
    let job = publish::Outgoing {
        subject: message.subject.clone(),
        msg_id: &message.msg_id,
        payload: message.payload.clone(),
        trace: traceparent.as_deref(),
    };
    match publish::publish(&shared.js, job).await {
        Ok(_) => {
            shared.store.metrics().run_job(crate::metrics::QUEUED);
            done(&delivered, message)
        }
        Err(e) => tracing::warn!(error = %e, "the sweep will publish the run job"),
    }
}

fn done(delivered: &Delivered, message: OutboxMessage) {
    delivered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((message.subject, message.msg_id));
}
