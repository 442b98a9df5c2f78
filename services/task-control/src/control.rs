//! Requests from agent workers, over NATS request/reply on `<ns>.control.<op>` in a queue group
//! shared by all task-control replicas. Each request is decoded, checked against its lease, and
//! answered with a response or a [`pb::Refusal`] that says what to do.

use std::time::Duration;

use futures_util::StreamExt;
use hark_core::{
    bus::ControlOp,
    codec,
    domain::{TaskId, TaskState},
    error::Classified as _,
};
use hark_proto::v1 as pb;
use prost::Message;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    cases::{
        self,
        claim::{
            HISTORY_BUDGET, INSTRUCTION_BUDGET, claim_for, pieces, refusal, refusal_of,
            within_budget,
        },
    },
    convert,
    shared::Shared,
    store::{AskInput, Escalation, Lease},
};

/// Serves control requests until `shutdown`; in-flight requests are finished first.
/// Takes this replica's share of the control requests; [`serve`] answers them.
pub async fn subscribe(shared: &Shared) -> Result<async_nats::Subscriber, async_nats::Error> {
    Ok(shared
        .nats
        .queue_subscribe(
            shared.names.control_all(),
            shared.names.control_queue_group(),
        )
        .await?)
}

pub async fn serve(
    shared: Shared,
    mut requests: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let poll_subject = shared.names.control(ControlOp::Poll);
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => break,
            message = requests.next() => match message {
                Some(message) => message,
                None => break,
            },
        };
        let shared = shared.clone();
        if message.subject.as_str() == poll_subject {
            // Parked before the next request is read, then held until a job comes for the
            // worker or its wait ends; not timed as a request.
            if let Some(poll) = crate::cases::handoff::park(&shared, message).await {
                let shutdown = shutdown.clone();
                tracker.spawn(async move { poll.hold(&shared, &shutdown).await });
            }
            continue;
        }
        tracker.spawn(async move {
            let Some(reply_to) = message.reply.clone() else {
                tracing::debug!(subject = %message.subject, "control request without a reply subject");
                return;
            };
            let op = shared.store.names().control_op_of(&message.subject);
            let trace = hark_core::trace::from_headers(message.headers.as_ref());
            let started = std::time::Instant::now();
            let span = hark_core::trace::process_span(&message.subject);
            let response =
                hark_core::trace::scope_in(span, trace, respond(&shared, op, &message.payload))
                    .await;
            let name = op.map_or("unknown", ControlOp::as_str);
            shared.store.metrics().request(name, started.elapsed());
            if let Err(e) = shared.nats.publish(reply_to, response.into()).await {
                tracing::warn!(op = name, error = %e, "cannot answer a control request");
            }
        });
    }
    let _ = requests.unsubscribe().await;
    tracker.close();
    tracker.wait().await;
}

fn invalid(message: impl Into<String>) -> Option<pb::Refusal> {
    refusal(pb::RefusalReason::Invalid, message)
}

fn lease_of(lease: Option<&pb::Lease>) -> Result<Lease, Option<pb::Refusal>> {
    let lease = lease.ok_or_else(|| invalid("the request has no lease"))?;
    let task: TaskId = lease
        .task_id
        .parse()
        .map_err(|e: hark_core::domain::IdError| invalid(e.to_string()))?;
    Ok(Lease {
        task,
        generation: i64::try_from(lease.generation)
            .map_err(|_| invalid("lease generation out of range"))?,
        worker_id: lease.worker_id.clone(),
    })
}

fn round_of(
    round: Option<&pb::Round>,
) -> Result<Option<(i32, serde_json::Value)>, Option<pb::Refusal>> {
    let Some(round) = round else { return Ok(None) };
    let number = i32::try_from(round.number)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| invalid("round numbers start at 1"))?;
    let mut messages: serde_json::Value = serde_json::from_slice(&round.messages_json)
        .map_err(|e| invalid(format!("round {number} is not a JSON array: {e}")))?;
    strip_nul_in(&mut messages);
    if !messages.is_array() {
        return Err(invalid(format!("round {number} is not a JSON array")));
    }
    Ok(Some((number, messages)))
}

/// Postgres stores no NUL character in a text or a JSON string; a model that produced one would
/// otherwise have its round, question or result refused. They carry nothing, so they are dropped.
fn strip_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "")
    } else {
        text
    }
}

fn strip_nul_in(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.contains('\0') => *s = s.replace('\0', ""),
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_nul_in),
        serde_json::Value::Object(fields) => {
            if fields.keys().any(|k| k.contains('\0')) {
                *fields = std::mem::take(fields)
                    .into_iter()
                    .map(|(k, v)| (k.replace('\0', ""), v))
                    .collect();
            }
            fields.values_mut().for_each(strip_nul_in);
        }
        _ => {}
    }
}

fn ids_of(ids: &[String]) -> Vec<uuid::Uuid> {
    ids.iter().filter_map(|id| id.parse().ok()).collect()
}

/// Answers one request; the result is the encoded response.
pub async fn respond(shared: &Shared, op: Option<ControlOp>, payload: &[u8]) -> Vec<u8> {
    let lease_ms = shared.config.task.lease.0;
    match op {
        Some(ControlOp::Claim) => claim(shared, payload, lease_ms).await.encode_to_vec(),
        Some(ControlOp::Heartbeat) => heartbeat(shared, payload, lease_ms).await.encode_to_vec(),
        Some(ControlOp::Ask) => ask(shared, payload).await.encode_to_vec(),
        Some(ControlOp::Checkpoint) => match checkpoint(shared, payload).await {
            Ok(pause) => pb::ControlAck {
                refusal: None,
                pause,
            }
            .encode_to_vec(),
            Err(refusal) => ack(Err(refusal)),
        },
        Some(ControlOp::Complete) => ack(complete(shared, payload).await),
        Some(ControlOp::Fail) => ack(fail(shared, payload).await),
        Some(ControlOp::Release) => ack(release(shared, payload).await),
        Some(ControlOp::History) => history(shared, payload).await.encode_to_vec(),
        // Served by `handoff::poll`; one that reaches here has nothing for it.
        Some(ControlOp::Poll) => pb::PollResponse::default().encode_to_vec(),
        Some(ControlOp::Send) => ack(send(shared, payload).await),
        Some(ControlOp::Tasks) => tasks(shared, payload).await.encode_to_vec(),
        Some(ControlOp::Subtask) => subtask(shared, payload).await.encode_to_vec(),
        None => ack(Err(invalid("unknown control operation"))),
    }
}

fn ack(result: Result<(), Option<pb::Refusal>>) -> Vec<u8> {
    pb::ControlAck {
        refusal: result.err().flatten(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn decode<M: codec::Versioned>(payload: &[u8]) -> Result<M, Option<pb::Refusal>> {
    codec::decode(payload).map_err(|e| invalid(e.to_string()))
}

async fn claim(shared: &Shared, payload: &[u8], lease: Duration) -> pb::ClaimResponse {
    let request = async {
        let request: pb::ClaimRequest = decode(payload)?;
        let task: TaskId = request
            .task_id
            .parse()
            .map_err(|e: hark_core::domain::IdError| invalid(e.to_string()))?;
        if request.worker_id.is_empty() {
            return Err(invalid("worker_id is empty"));
        }
        let generation =
            i64::try_from(request.generation).map_err(|_| invalid("generation out of range"))?;
        Ok((task, generation, request.worker_id))
    }
    .await;
    match request {
        Ok((task, generation, worker)) => {
            tracing::debug!(%task, generation, worker, "claim requested");
            claim_for(shared, task, generation, &worker, lease).await
        }
        Err(refusal) => pb::ClaimResponse {
            refusal,
            ..Default::default()
        },
    }
}

async fn heartbeat(shared: &Shared, payload: &[u8], lease: Duration) -> pb::HeartbeatResponse {
    let result = async {
        let request: pb::HeartbeatRequest = decode(payload)?;
        let held = lease_of(request.lease.as_ref())?;
        shared
            .store
            .heartbeat(&held, lease)
            .await
            .map_err(|e| refusal_of(&e))
    }
    .await;
    match result {
        Ok(instructions) => pb::HeartbeatResponse {
            refusal: None,
            lease_ms: lease.as_millis() as u32,
            // What does not fit comes with a later heartbeat, once these were consumed.
            instructions: within_budget(
                instructions.into_iter().map(convert::instruction),
                INSTRUCTION_BUDGET,
            ),
        },
        Err(refusal) => pb::HeartbeatResponse {
            refusal,
            ..Default::default()
        },
    }
}

/// Stores a round; whether the task is to pause at this boundary.
async fn checkpoint(shared: &Shared, payload: &[u8]) -> Result<bool, Option<pb::Refusal>> {
    let request: pb::CheckpointRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    let (number, messages) =
        round_of(request.round.as_ref())?.ok_or_else(|| invalid("the request has no round"))?;
    shared
        .store
        .checkpoint(
            &lease,
            number,
            &messages,
            &ids_of(&request.consumed_instruction_ids),
        )
        .await
        .map_err(|e| refusal_of(&e))
}

async fn ask(shared: &Shared, payload: &[u8]) -> pb::AskResponse {
    let result = async {
        let request: pb::AskRequest = decode(payload)?;
        let lease = lease_of(request.lease.as_ref())?;
        let (round, messages) =
            round_of(request.round.as_ref())?.ok_or_else(|| invalid("the request has no round"))?;
        if request.question.trim().is_empty() {
            return Err(invalid("the question is empty"));
        }
        if request.tool_call_id.is_empty() {
            return Err(invalid("tool_call_id is empty"));
        }
        let shape = hark_core::domain::shape::Shape::from_proto(
            &request.kind,
            &request.choices,
            request.multiple,
            &request.fields,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let waits_for = match request.waits_for_task.as_str() {
            "" => None,
            id => Some(
                id.parse::<TaskId>()
                    .map_err(|e| invalid(format!("waits_for_task: {e}")))?,
            ),
        };
        let input = AskInput {
            waits_for,
            round,
            messages,
            consumed_instructions: ids_of(&request.consumed_instruction_ids),
            tool_call_id: request.tool_call_id,
            question: strip_nul(request.question),
            context: strip_nul(request.context),
            // A model's timeout past the limit is taken as the limit: the agent asked for "long".
            timeout: (request.timeout_s > 0).then(|| {
                Duration::from_secs(request.timeout_s.into())
                    .min(hark_core::domain::duration::MAX_QUESTION_WAIT)
            }),
            shape,
            escalation: Escalation {
                to: request.escalate_to,
                after: (request.escalate_after_s > 0)
                    .then(|| Duration::from_secs(request.escalate_after_s.into())),
            },
            ask_to: request.ask_to,
            need: request.need.parse().map_err(invalid)?,
        };
        crate::cases::run::ask(&shared.store, &lease, &input)
            .await
            .map_err(|e| refusal_of(&e))
    }
    .await;
    match result {
        Ok(question) => {
            tracing::info!(
                task = %question.task_id,
                handle = question.handle,
                question = crate::render::clip(&question.text, 80),
                "task asks its owner"
            );
            pb::AskResponse {
                refusal: None,
                question_id: question.id.to_string(),
                handle: question.handle,
                deadline: question.deadline.map(convert::timestamp),
            }
        }
        Err(refusal) => pb::AskResponse {
            refusal,
            ..Default::default()
        },
    }
}

async fn complete(shared: &Shared, payload: &[u8]) -> Result<(), Option<pb::Refusal>> {
    let request: pb::CompleteRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    let round = round_of(request.round.as_ref())?;
    let result = strip_nul(request.result);
    let round = round.as_ref().map(|(n, m)| (*n, m));
    crate::cases::run::complete(&shared.store, &lease, round, &result)
        .await
        .map(|_| ())
        .map_err(|e| refusal_of(&e))
}

async fn fail(shared: &Shared, payload: &[u8]) -> Result<(), Option<pb::Refusal>> {
    let request: pb::FailRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    crate::cases::command::fail(&shared.store, &lease, &strip_nul(request.error))
        .await
        .map(|_| ())
        .map_err(|e| refusal_of(&e))
}

async fn release(shared: &Shared, payload: &[u8]) -> Result<(), Option<pb::Refusal>> {
    let request: pb::ReleaseRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    let reason = if request.reason.trim().is_empty() {
        "the worker stopped".to_owned()
    } else {
        strip_nul(request.reason)
    };
    let reason = hark_core::domain::ids::shown(&reason);
    let released = crate::cases::command::release(&shared.store, &lease, reason.as_str())
        .await
        .map_err(|e| refusal_of(&e))?;
    tracing::info!(task = %released.id, worker = lease.worker_id, "a stopping worker handed its task back");
    Ok(())
}

async fn history(shared: &Shared, payload: &[u8]) -> pb::HistoryResponse {
    let result = async {
        let request: pb::HistoryRequest = decode(payload)?;
        let lease = lease_of(request.lease.as_ref())?;
        let after =
            i32::try_from(request.after_round).map_err(|_| invalid("after_round out of range"))?;
        let rounds = shared
            .store
            .rounds_after(&lease, after)
            .await
            .map_err(|e| refusal_of(&e))?;
        let offset = usize::try_from(request.offset).map_err(|_| invalid("offset out of range"))?;
        Ok(pieces(&rounds, offset, HISTORY_BUDGET))
    }
    .await;
    match result {
        Ok((rounds, more)) => pb::HistoryResponse {
            refusal: None,
            rounds,
            more,
        },
        Err(refusal) => pb::HistoryResponse {
            refusal,
            ..Default::default()
        },
    }
}

async fn subtask(shared: &Shared, payload: &[u8]) -> pb::SubtaskResponse {
    let result = async {
        let request: pb::SubtaskRequest = decode(payload)?;
        let lease = lease_of(request.lease.as_ref())?;
        let parent = shared
            .store
            .held(&lease)
            .await
            .map_err(|e| refusal_of(&e))?;
        let create = cases::Create {
            by: cases::Caller::Operator("subtask"),
            owner: parent.owner.clone(),
            goal: strip_nul(request.goal),
            chat: parent.chat(),
            ask_timeout: None,
            on_timeout: None,
            priority: parent.priority,
            request_key: (!request.idempotency_key.is_empty())
                .then(|| format!("subtask:{}", request.idempotency_key)),
            questionnaire: None,
            // A subtask has no more time than its parent has left.
            deadline: parent.deadline_at.map(|at| {
                let left = (at - time::OffsetDateTime::now_utc()).whole_milliseconds();
                Duration::from_millis(u64::try_from(left.max(1000)).unwrap_or(u64::MAX))
            }),
            on_deadline: parent.deadline_at.map(|_| parent.on_deadline),
        };
        match cases::create_task(shared, create).await {
            Ok(task) => Ok(task.id),
            // A tool call run again after a crash asks again under its key: the task it made
            // is its answer.
            Err(cases::Error::Reused { task }) => Ok(task),
            Err(cases::Error::Goal(e)) => Err(invalid(format!("goal {e}"))),
            Err(cases::Error::Store(e)) => Err(refusal_of(&e)),
            Err(e) => Err(refusal(e.kind().refusal(), e.to_string())),
        }
    }
    .await;
    match result {
        Ok(task) => pb::SubtaskResponse {
            refusal: None,
            task_id: task.to_string(),
        },
        Err(refusal) => pb::SubtaskResponse {
            refusal,
            ..Default::default()
        },
    }
}

/// The most tasks `list_my_tasks` returns.
const MAX_LISTED: u32 = 50;

async fn tasks(shared: &Shared, payload: &[u8]) -> pb::TasksResponse {
    let result = async {
        let request: pb::TasksRequest = decode(payload)?;
        let lease = lease_of(request.lease.as_ref())?;
        let states = request
            .states
            .iter()
            .map(|s| {
                s.parse::<TaskState>().map_err(|_| {
                    invalid(format!(
                        "`{}` is not a task state",
                        hark_core::domain::ids::shown(s)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let limit = match request.limit {
            0 => 20,
            n => n.min(MAX_LISTED),
        };
        shared
            .store
            .owner_tasks(&lease, &states, limit.into())
            .await
            .map_err(|e| refusal_of(&e))
    }
    .await;
    match result {
        Ok(rows) => pb::TasksResponse {
            refusal: None,
            tasks: rows.iter().map(convert::task_summary).collect(),
        },
        Err(refusal) => pb::TasksResponse {
            refusal,
            ..Default::default()
        },
    }
}

async fn send(shared: &Shared, payload: &[u8]) -> Result<(), Option<pb::Refusal>> {
    let request: pb::SendRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    if request.text.trim().is_empty() {
        return Err(invalid("the message is empty"));
    }
    shared
        .store
        .send(
            &lease,
            &strip_nul(request.text),
            (!request.idempotency_key.is_empty()).then_some(request.idempotency_key.as_str()),
        )
        .await
        .map(|_| ())
        .map_err(|e| refusal_of(&e))
}
