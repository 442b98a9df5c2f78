//! The worker's side of the control protocol: typed requests to task-control over NATS.

use std::time::Duration;

use hark_core::{
    bus::{ControlOp, Names},
    codec::{self, Versioned},
};
use hark_proto::v1 as pb;
use prost::Message;

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
}

impl Error {
    fn from_refusal(refusal: pb::Refusal) -> Self {
        Error::Refused {
            reason: pb::RefusalReason::try_from(refusal.reason)
                .unwrap_or(pb::RefusalReason::Unspecified),
            message: refusal.message,
        }
    }

    /// Whether the task is gone from this worker (cancelled, or its lease lost).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Error::Refused {
                reason: pb::RefusalReason::Cancelled
                    | pb::RefusalReason::LeaseLost
                    | pb::RefusalReason::NotFound
                    | pb::RefusalReason::StaleJob,
                ..
            }
        )
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

#[derive(Debug, Clone)]
pub struct ControlClient {
    nats: async_nats::Client,
    names: Names,
    timeout: Duration,
}

impl ControlClient {
    pub fn new(nats: async_nats::Client, names: Names) -> Self {
        Self {
            nats,
            names,
            timeout: Duration::from_secs(10),
        }
    }

    /// Sends a request, retrying while task-control does not answer (it may be restarting).
    async fn call<Req: Versioned, Resp: Message + Default>(
        &self,
        op: ControlOp,
        request: Req,
    ) -> Result<Resp, Error> {
        let payload = codec::encode(request);
        let mut headers = async_nats::HeaderMap::new();
        hark_core::trace::inject(&mut headers);
        let mut last = String::new();
        for attempt in 0..5u32 {
            let sent = tokio::time::timeout(
                self.timeout,
                self.nats.request_with_headers(
                    self.names.control(op),
                    headers.clone(),
                    payload.clone(),
                ),
            )
            .await;
            match sent {
                Ok(Ok(reply)) => {
                    return Resp::decode(reply.payload).map_err(|e| Error::Unreachable {
                        op: op.as_str(),
                        message: format!("undecodable response: {e}"),
                    });
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("no reply within {:?}", self.timeout),
            }
            tokio::time::sleep(Duration::from_millis(200) * 2u32.pow(attempt)).await;
        }
        Err(Error::Unreachable {
            op: op.as_str(),
            message: last,
        })
    }

    pub async fn claim(
        &self,
        job: &pb::RunJob,
        worker_id: &str,
    ) -> Result<pb::ClaimResponse, Error> {
        let response: pb::ClaimResponse = self
            .call(
                ControlOp::Claim,
                pb::ClaimRequest {
                    task_id: job.task_id.clone(),
                    generation: job.generation,
                    worker_id: worker_id.to_owned(),
                    ..Default::default()
                },
            )
            .await?;
        match response.refusal.clone() {
            Some(refusal) => Err(Error::from_refusal(refusal)),
            None => Ok(response),
        }
    }

    pub async fn heartbeat(&self, lease: &pb::Lease) -> Result<pb::HeartbeatResponse, Error> {
        let response: pb::HeartbeatResponse = self
            .call(
                ControlOp::Heartbeat,
                pb::HeartbeatRequest {
                    lease: Some(lease.clone()),
                    ..Default::default()
                },
            )
            .await?;
        match response.refusal.clone() {
            Some(refusal) => Err(Error::from_refusal(refusal)),
            None => Ok(response),
        }
    }

    pub async fn checkpoint(
        &self,
        lease: &pb::Lease,
        round: pb::Round,
        consumed: Vec<String>,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Checkpoint,
            pb::CheckpointRequest {
                lease: Some(lease.clone()),
                round: Some(round),
                consumed_instruction_ids: consumed,
                ..Default::default()
            },
        )
        .await
    }

    pub async fn ask(&self, request: pb::AskRequest) -> Result<pb::AskResponse, Error> {
        let response: pb::AskResponse = self.call(ControlOp::Ask, request).await?;
        match response.refusal.clone() {
            Some(refusal) => Err(Error::from_refusal(refusal)),
            None => Ok(response),
        }
    }

    pub async fn complete(
        &self,
        lease: &pb::Lease,
        round: Option<pb::Round>,
        result: &str,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Complete,
            pb::CompleteRequest {
                lease: Some(lease.clone()),
                round,
                result: result.to_owned(),
                ..Default::default()
            },
        )
        .await
    }

    pub async fn fail(&self, lease: &pb::Lease, error: &str) -> Result<(), Error> {
        self.ack(
            ControlOp::Fail,
            pb::FailRequest {
                lease: Some(lease.clone()),
                error: error.to_owned(),
                ..Default::default()
            },
        )
        .await
    }

    pub async fn send(
        &self,
        lease: &pb::Lease,
        text: &str,
        idempotency_key: &str,
    ) -> Result<(), Error> {
        self.ack(
            ControlOp::Send,
            pb::SendRequest {
                lease: Some(lease.clone()),
                text: text.to_owned(),
                idempotency_key: idempotency_key.to_owned(),
                ..Default::default()
            },
        )
        .await
    }

    async fn ack<Req: Versioned>(&self, op: ControlOp, request: Req) -> Result<(), Error> {
        let response: pb::ControlAck = self.call(op, request).await?;
        match response.refusal {
            Some(refusal) => Err(Error::from_refusal(refusal)),
            None => Ok(()),
        }
    }
}
