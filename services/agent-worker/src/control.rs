//! The worker's side of the control protocol: typed requests to task-control over NATS.
//!
//! A request that task-control cannot decide now — it does not answer, or it answers that its
//! store is unavailable — is sent again with backoff for as long as the run holds its lease:
//! a database blip costs the run a pause, not its work. The run gives up only when its lease is
//! really gone (the heartbeat or a refusal says so), and a refusal that can never succeed is
//! returned at once.

use std::time::Duration;

use hark_core::{
    bus::{ControlOp, Names},
    codec::{self, Versioned},
    error::{Classified, Kind},
};
use hark_proto::v1 as pb;
use prost::Message;
use tokio_util::sync::CancellationToken;

/// Why a control request did not go through.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// task-control said no: stop, or drop the job, as the reason says.
    #[error("task-control refused: {message} ({reason:?})")]
    Refused {
        reason: pb::RefusalReason,
        message: String,
    },
    #[error("no answer from task-control to {op}: {message}")]
    Unreachable { op: &'static str, message: String },
    /// The run lost its lease (or its task was cancelled) while the request waited to be sent
    /// again.
    #[error("{op} was given up: the run no longer holds its task")]
    GaveUp { op: &'static str },
}

impl Classified for Error {
    fn kind(&self) -> Kind {
        match self {
            Error::Refused { reason, .. } => Kind::of_refusal(*reason),
            Error::Unreachable { .. } => Kind::Unavailable,
            Error::GaveUp { .. } => Kind::Gone,
        }
    }
}

impl Error {
    fn from_refusal(refusal: &pb::Refusal) -> Self {
        Error::Refused {
            reason: pb::RefusalReason::try_from(refusal.reason)
                .unwrap_or(pb::RefusalReason::Unspecified),
            message: refusal.message.clone(),
        }
    }

    /// Whether the task is gone from this worker (cancelled, its lease lost, the job stale).
    pub fn is_final(&self) -> bool {
        matches!(self.kind(), Kind::Gone | Kind::NotFound | Kind::Conflict)
    }

    pub fn is_cancelled(&self) -> bool {
        matches!(
            self,
            Error::Refused {
                reason: pb::RefusalReason::Cancelled,
                ..
            }
        )
    }
}

/// A response that may carry a refusal.
pub trait Refusable: Message + Default {
    fn refusal(&self) -> Option<&pb::Refusal>;
}

macro_rules! refusable {
    ($($ty:ident),*) => {$(
        impl Refusable for pb::$ty {
            fn refusal(&self) -> Option<&pb::Refusal> {
                self.refusal.as_ref()
            }
        }
    )*};
}

refusable!(
    ClaimResponse,
    HeartbeatResponse,
    AskResponse,
    HistoryResponse,
    TasksResponse,
    SubtaskResponse,
    ControlAck
);

/// How long one attempt waits for task-control's answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before a request is sent again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A task task-control claimed for this worker and handed over in the reply to its poll.
#[derive(Debug)]
pub struct Handed {
    pub claim: pb::ClaimResponse,
    /// The run job it was handed over for.
    pub job: pb::RunJob,
    /// The W3C traceparent the run continues.
    pub traceparent: String,
    /// Where to say it was taken.
    ack: Option<async_nats::Subject>,
}

#[derive(Debug, Clone)]
pub struct ControlClient {
    nats: async_nats::Client,
    names: Names,
}

/// How long a request is sent again while task-control cannot decide it.
#[derive(Debug, Clone, Copy)]
enum Persist<'a> {
    /// For as long as the run holds its lease: until `gone` is cancelled.
    WhileHeld(&'a CancellationToken),
    /// A few times within about a second (a claim, whose job comes back anyway).
    Briefly,
    /// Once (a heartbeat, which comes again anyway).
    Once,
}

impl ControlClient {
    pub fn new(nats: async_nats::Client, names: Names) -> Self {
        Self { nats, names }
    }

    async fn attempt<Req: Versioned + Clone, Resp: Refusable>(
        &self,
        op: ControlOp,
        request: &Req,
    ) -> Result<Resp, Error> {
        use tracing::Instrument as _;
        let subject = self.names.control(op);
        // A request by the messaging conventions; task-control's span is its child.
        let span = hark_core::trace::send_span(&subject);
        let sent = async {
            let mut headers = async_nats::HeaderMap::new();
            hark_core::trace::inject(&mut headers);
            tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                self.nats
                    .request_with_headers(subject, headers, codec::encode(request.clone())),
            )
            .await
        }
        .instrument(span)
        .await;
        let reply = match sent {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                return Err(Error::Unreachable {
                    op: op.as_str(),
                    message: e.to_string(),
                });
            }
            Err(_) => {
                return Err(Error::Unreachable {
                    op: op.as_str(),
                    message: format!("no reply within {ATTEMPT_TIMEOUT:?}"),
                });
            }
        };
        let response = Resp::decode(reply.payload).map_err(|e| Error::Refused {
            reason: pb::RefusalReason::Unspecified,
            message: format!("undecodable response to {}: {e}", op.as_str()),
        })?;
        match response.refusal() {
            Some(refusal) => Err(Error::from_refusal(refusal)),
            None => Ok(response),
        }
    }

    /// Sends a request, and sends it again with backoff while task-control cannot decide it,
    /// as `persist` allows.
    async fn call<Req: Versioned + Clone, Resp: Refusable>(
        &self,
        op: ControlOp,
        request: Req,
        persist: Persist<'_>,
    ) -> Result<Resp, Error> {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let error = match self.attempt(op, &request).await {
                Err(e) if e.kind().is_retryable() => e,
                done => {
                    if tries > 1 {
                        tracing::info!(
                            op = op.as_str(),
                            tries,
                            "task-control decided it after all"
                        );
                    }
                    return done;
                }
            };
            match persist {
                Persist::Once => return Err(error),
                Persist::Briefly if tries >= 4 => return Err(error),
                Persist::WhileHeld(gone) if gone.is_cancelled() => {
                    return Err(Error::GaveUp { op: op.as_str() });
                }
                _ => {}
            }
            if tries == 1 || tries.is_power_of_two() {
                tracing::warn!(
                    op = op.as_str(),
                    tries,
                    error = %error,
                    "task-control cannot decide this now; sending it again while the task is held"
                );
            }
            match persist {
                Persist::WhileHeld(gone) => tokio::select! {
                    _ = gone.cancelled() => return Err(Error::GaveUp { op: op.as_str() }),
                    _ = tokio::time::sleep(backoff) => {}
                },
                _ => tokio::time::sleep(backoff).await,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    pub async fn claim(
        &self,
        job: &pb::RunJob,
        worker_id: &str,
    ) -> Result<pb::ClaimResponse, Error> {
        self.call(
            ControlOp::Claim,
            pb::ClaimRequest {
                task_id: job.task_id.clone(),
                generation: job.generation,
                worker_id: worker_id.to_owned(),
                ..Default::default()
            },
            Persist::Briefly,
        )
        .await
    }

    /// Waits up to `wait` at task-control for a run job handed over directly; `None` when none
    /// came. A handed-over task is this worker's: say so with [`ControlClient::take`] at once.
    pub async fn poll(&self, worker_id: &str, wait: Duration) -> Result<Option<Handed>, Error> {
        let op = ControlOp::Poll;
        let request = async_nats::Request::new()
            // An inbox of its own, unsubscribed when the poll is dropped: a task handed over
            // after that finds no responder, and task-control takes it back at once.
            .inbox(self.nats.new_inbox())
            .payload(codec::encode(pb::PollRequest {
                worker_id: worker_id.to_owned(),
                wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
                ..Default::default()
            }))
            // task-control answers by `wait` at the latest; past this it is not there.
            .timeout(Some(wait + ATTEMPT_TIMEOUT));
        let reply = self
            .nats
            .send_request(self.names.control(op), request)
            .await
            .map_err(|e| Error::Unreachable {
                op: op.as_str(),
                message: e.to_string(),
            })?;
        let response = pb::PollResponse::decode(reply.payload).map_err(|e| Error::Refused {
            reason: pb::RefusalReason::Unspecified,
            message: format!("undecodable response to poll: {e}"),
        })?;
        let pb::PollResponse {
            claim: Some(claim),
            job,
            traceparent,
        } = response
        else {
            return Ok(None);
        };
        if claim.refusal.is_some() || claim.lease.is_none() {
            return Ok(None);
        }
        Ok(Some(Handed {
            claim,
            job: job.unwrap_or_default(),
            traceparent,
            ack: reply.reply,
        }))
    }

    /// Tells every task-control replica that this worker stops, so that they forget its polls,
    /// and waits until NATS has routed that.
    pub async fn stopping(&self, worker_id: &str) {
        let subject = self.names.worker_stopping();
        if let Err(e) = self
            .nats
            .publish(subject, worker_id.to_owned().into())
            .await
        {
            tracing::debug!(error = %e, "cannot say the worker stops");
            return;
        }
        if tokio::time::timeout(Duration::from_secs(2), self.nats.flush())
            .await
            .is_err()
        {
            tracing::debug!("NATS did not confirm that the worker stops");
        }
    }

    /// Tells task-control that a handed-over task was taken.
    pub async fn take(&self, handed: &Handed) {
        if let Some(ack) = &handed.ack
            && let Err(e) = self.nats.publish(ack.clone(), Default::default()).await
        {
            tracing::debug!(error = %e, "cannot acknowledge a handed-over task");
        }
    }

    pub async fn heartbeat(&self, lease: &pb::Lease) -> Result<pb::HeartbeatResponse, Error> {
        self.call(
            ControlOp::Heartbeat,
            pb::HeartbeatRequest {
                lease: Some(lease.clone()),
                ..Default::default()
            },
            Persist::Once,
        )
        .await
    }

    /// Stores a round; whether the task's owner paused it, so that the run stops here.
    pub async fn checkpoint(
        &self,
        lease: &pb::Lease,
        round: pb::Round,
        consumed: Vec<String>,
        gone: &CancellationToken,
    ) -> Result<bool, Error> {
        let request = pb::CheckpointRequest {
            lease: Some(lease.clone()),
            round: Some(round),
            consumed_instruction_ids: consumed,
            ..Default::default()
        };
        self.call::<_, pb::ControlAck>(ControlOp::Checkpoint, request, Persist::WhileHeld(gone))
            .await
            .map(|ack| ack.pause)
    }

    pub async fn ask(
        &self,
        request: pb::AskRequest,
        gone: &CancellationToken,
    ) -> Result<pb::AskResponse, Error> {
        self.call(ControlOp::Ask, request, Persist::WhileHeld(gone))
            .await
    }

    pub async fn complete(
        &self,
        lease: &pb::Lease,
        round: Option<pb::Round>,
        result: &str,
        gone: &CancellationToken,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Complete,
            pb::CompleteRequest {
                lease: Some(lease.clone()),
                round,
                result: result.to_owned(),
                ..Default::default()
            },
            gone,
        )
        .await
    }

    pub async fn fail(
        &self,
        lease: &pb::Lease,
        error: &str,
        gone: &CancellationToken,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Fail,
            pb::FailRequest {
                lease: Some(lease.clone()),
                error: error.to_owned(),
                ..Default::default()
            },
            gone,
        )
        .await
    }

    /// Hands the task back (the worker stops). Sent again until it is decided or `gone`.
    pub async fn release(
        &self,
        lease: &pb::Lease,
        reason: &str,
        gone: &CancellationToken,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Release,
            pb::ReleaseRequest {
                lease: Some(lease.clone()),
                reason: reason.to_owned(),
                ..Default::default()
            },
            gone,
        )
        .await
    }

    /// The next piece of the checkpoint of a claimed task (see `HistoryRequest`).
    pub async fn history(
        &self,
        lease: &pb::Lease,
        after_round: u32,
        offset: u64,
        gone: &CancellationToken,
    ) -> Result<pb::HistoryResponse, Error> {
        self.call(
            ControlOp::History,
            pb::HistoryRequest {
                lease: Some(lease.clone()),
                after_round,
                offset,
                ..Default::default()
            },
            Persist::WhileHeld(gone),
        )
        .await
    }

    /// Creates a task for the owner and chat of the task `lease` holds; its id. The same
    /// `idempotency_key` creates it once.
    pub async fn subtask(
        &self,
        lease: &pb::Lease,
        goal: &str,
        idempotency_key: &str,
        gone: &CancellationToken,
    ) -> Result<String, Error> {
        let response: pb::SubtaskResponse = self
            .call(
                ControlOp::Subtask,
                pb::SubtaskRequest {
                    lease: Some(lease.clone()),
                    goal: goal.to_owned(),
                    idempotency_key: idempotency_key.to_owned(),
                    ..Default::default()
                },
                Persist::WhileHeld(gone),
            )
            .await?;
        Ok(response.task_id)
    }

    /// The tasks of the owner of the task `lease` holds, newest first.
    pub async fn tasks(
        &self,
        lease: &pb::Lease,
        states: Vec<String>,
        limit: u32,
        gone: &CancellationToken,
    ) -> Result<Vec<pb::TaskSummary>, Error> {
        let response: pb::TasksResponse = self
            .call(
                ControlOp::Tasks,
                pb::TasksRequest {
                    lease: Some(lease.clone()),
                    states,
                    limit,
                    ..Default::default()
                },
                Persist::WhileHeld(gone),
            )
            .await?;
        Ok(response.tasks)
    }

    pub async fn send(
        &self,
        lease: &pb::Lease,
        text: &str,
        idempotency_key: &str,
        gone: &CancellationToken,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Send,
            pb::SendRequest {
                lease: Some(lease.clone()),
                text: text.to_owned(),
                idempotency_key: idempotency_key.to_owned(),
                ..Default::default()
            },
            gone,
        )
        .await
    }

    async fn ack<Req: Versioned + Clone>(
        &self,
        op: ControlOp,
        request: Req,
        gone: &CancellationToken,
    ) -> Result<(), Error> {
        self.call::<_, pb::ControlAck>(op, request, Persist::WhileHeld(gone))
            .await
            .map(|_| ())
    }
}
