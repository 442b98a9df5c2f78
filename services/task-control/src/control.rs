//! Requests from agent workers, over NATS request/reply on `<ns>.control.<op>` in a queue group
//! shared by all task-control replicas. Each request is decoded, checked against its lease, and
//! answered with a response or a [`pb::Refusal`] that says what to do.

use std::time::Duration;

use futures_util::StreamExt;
use hark_core::{
    bus::ControlOp,
    codec,
    domain::{Role, TaskId, TaskState},
    error::Classified as _,
};
use hark_proto::v1 as pb;
use prost::Message;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    convert,
    shared::Shared,
    store::{self, AskInput, Lease},
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
            if let Some(poll) = crate::handoff::park(&shared, message).await {
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
            let op = message.subject.as_str().rsplit('.').next().unwrap_or_default().to_owned();
            let trace = hark_core::trace::from_headers(message.headers.as_ref());
            let started = std::time::Instant::now();
            let span = hark_core::trace::process_span(&message.subject);
            let response =
                hark_core::trace::scope_in(span, trace, respond(&shared, &op, &message.payload))
                    .await;
            shared.store.metrics().request(&op, started.elapsed());
            if let Err(e) = shared.nats.publish(reply_to, response.into()).await {
                tracing::warn!(op, error = %e, "cannot answer a control request");
            }
        });
    }
    let _ = requests.unsubscribe().await;
    tracker.close();
    tracker.wait().await;
}

fn refusal(reason: pb::RefusalReason, message: impl Into<String>) -> Option<pb::Refusal> {
    Some(pb::Refusal {
        reason: reason as i32,
        message: message.into(),
    })
}

/// Maps a store error onto what a worker should do about it.
fn refusal_of(error: &store::Error) -> Option<pb::Refusal> {
    use pb::RefusalReason as R;
    // The precise reasons where task-control knows them; otherwise the kind's one mapping.
    let reason = match error {
        store::Error::Cancelled { .. } => R::Cancelled,
        store::Error::LeaseLost { .. } => R::LeaseLost,
        e => e.kind().refusal(),
    };
    refusal(reason, error.to_string())
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
pub async fn respond(shared: &Shared, op: &str, payload: &[u8]) -> Vec<u8> {
    let lease_ms = shared.config.task.lease.0;
    let op = ControlOp::ALL.into_iter().find(|o| o.as_str() == op);
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

/// A claim refused for `reason`.
pub fn refused(reason: pb::RefusalReason, message: impl Into<String>) -> pb::ClaimResponse {
    pb::ClaimResponse {
        refusal: refusal(reason, message),
        ..Default::default()
    }
}

/// Claims `task`, pending at `generation`, for `worker` (see [`store::Store::claim`]), and says
/// what the worker needs to run it: the claim response a worker's claim request gets, and what
/// a task handed to a polling worker carries.
pub async fn claim_for(
    shared: &Shared,
    task: TaskId,
    generation: i64,
    worker: &str,
    lease: Duration,
) -> pb::ClaimResponse {
    let result = shared
        .store
        .claim(task, generation, worker, lease)
        .await
        .map_err(|e| refusal_of(&e));
    match result {
        Err(refusal) => pb::ClaimResponse {
            refusal,
            ..Default::default()
        },
        Ok(claimed) => claim_response(shared, claimed, lease),
    }
}

/// What a worker needs to run a task its claim won.
pub fn claim_response(
    shared: &Shared,
    claimed: store::Claimed,
    lease: Duration,
) -> pb::ClaimResponse {
    tracing::debug!(task = %claimed.task.id, "claim won");
    let role = shared.role_of(&claimed.task.owner);
    let (rounds, more_rounds) = pieces(&claimed.rounds, 0, HISTORY_BUDGET);
    let instructions = within_budget(
        claimed.instructions.into_iter().map(convert::instruction),
        INSTRUCTION_BUDGET,
    );
    pb::ClaimResponse {
        rounds,
        more_rounds,
        refusal: None,
        lease: Some(pb::Lease {
            task_id: claimed.lease.task.to_string(),
            generation: claimed.lease.generation as u64,
            worker_id: claimed.lease.worker_id.clone(),
        }),
        lease_ms: lease.as_millis() as u32,
        task: Some(pb::TaskSpec {
            id: claimed.task.id.to_string(),
            owner: claimed.task.owner.to_string(),
            owner_role: role.as_str().to_owned(),
            goal: claimed.task.goal.clone(),
            chat: claimed.task.chat().map(|c| convert::route(&c)),
            // Questions are answered in the chat or with AnswerQuestion; only a task whose
            // owner may not use ask_user has no way to be answered.
            can_ask: role >= Role::User,
            attempt: claimed.task.attempt as u32,
            questionnaire: claimed
                .task
                .questionnaire()
                .iter()
                .map(convert::form_question)
                .collect(),
        }),
        resume: claimed.resume.map(|r| pb::Resume {
            question_id: r.question_id.to_string(),
            tool_call_id: r.tool_call_id,
            expired: r.expired,
            text: r.text,
            asked_traceparent: r.asked_trace.unwrap_or_default(),
        }),
        instructions,
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
        };
        shared
            .store
            .ask(&lease, &input)
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
    shared
        .store
        .complete(
            &lease,
            round.as_ref().map(|(n, m)| (*n, m)),
            &strip_nul(request.result),
        )
        .await
        .map(|_| ())
        .map_err(|e| refusal_of(&e))
}

async fn fail(shared: &Shared, payload: &[u8]) -> Result<(), Option<pb::Refusal>> {
    let request: pb::FailRequest = decode(payload)?;
    let lease = lease_of(request.lease.as_ref())?;
    shared
        .store
        .fail(&lease, &strip_nul(request.error))
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
    let released = shared
        .store
        .release(&lease, hark_core::domain::ids::shown(&reason).as_str())
        .await
        .map_err(|e| refusal_of(&e))?;
    tracing::info!(task = %released.id, worker = lease.worker_id, "a stopping worker handed its task back");
    Ok(())
}

/// The most bytes of checkpoint one response carries, well below NATS's payload limit (1 MiB by
/// default), whatever else it carries.
pub const HISTORY_BUDGET: usize = 512 * 1024;
/// The most bytes of told instructions one response carries; more come with later heartbeats.
pub const INSTRUCTION_BUDGET: usize = 192 * 1024;

/// The next piece of a checkpoint: the rounds of `rounds` (each after the last one received
/// whole) from `offset` bytes into the first, whole rounds while they fit in `budget` bytes,
/// and a part of one when even that does not fit. At least some bytes are always sent. Returns
/// the pieces and whether more follow.
pub fn pieces(rounds: &[store::RoundRow], offset: usize, budget: usize) -> (Vec<pb::Round>, bool) {
    let mut out = Vec::new();
    let mut used = 0;
    let mut offset = offset;
    for round in rounds {
        let bytes = serde_json::to_vec(&round.messages.0).unwrap_or_else(|_| b"[]".to_vec());
        let rest = bytes.get(offset..).unwrap_or_default();
        let room = budget.saturating_sub(used);
        if rest.len() <= room {
            used += rest.len();
            out.push(pb::Round {
                number: round.round as u32,
                messages_json: rest.to_vec(),
                partial: false,
            });
            offset = 0;
            continue;
        }
        // It does not fit: a piece of it if nothing else was sent, else it waits for the next.
        if out.is_empty() {
            out.push(pb::Round {
                number: round.round as u32,
                messages_json: rest[..room.max(1).min(rest.len())].to_vec(),
                partial: true,
            });
        }
        return (out, true);
    }
    (out, false)
}

/// As many of `items` as fit in `budget` bytes, at least one.
fn within_budget<M: Message>(items: impl Iterator<Item = M>, budget: usize) -> Vec<M> {
    let mut used = 0;
    let mut out = Vec::new();
    for item in items {
        let size = item.encoded_len();
        if !out.is_empty() && used + size > budget {
            break;
        }
        used += size;
        out.push(item);
    }
    out
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
        let goal =
            hark_core::domain::text::text(&request.goal, hark_core::domain::text::MAX_TEXT_BYTES)
                .map_err(|e| invalid(format!("goal {e}")))?
                .to_owned();
        let parent = shared
            .store
            .held(&lease)
            .await
            .map_err(|e| refusal_of(&e))?;
        let config = &shared.config.task;
        shared
            .store
            .create_task(&store::NewTask {
                owner: parent.owner.clone(),
                goal: strip_nul(goal),
                chat: parent.chat(),
                ask_timeout: config.ask_timeout.0,
                on_timeout: config.on_timeout,
                request_id: (!request.idempotency_key.is_empty())
                    .then(|| format!("subtask:{}", request.idempotency_key)),
                active_limit: config.max_active_per_owner,
                questionnaire: None,
                schedule: None,
                priority: parent.priority,
            })
            .await
            .map_err(|e| refusal_of(&e))
    }
    .await;
    match result {
        Ok(task) => pb::SubtaskResponse {
            refusal: None,
            task_id: task.id.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn round(number: i32, bytes: usize) -> store::RoundRow {
        // A JSON array holding one string: two brackets and two quotes around the text.
        store::RoundRow {
            round: number,
            messages: sqlx::types::Json(serde_json::json!(["x".repeat(bytes - 4)])),
        }
    }

    /// Reassembles what the pieces carry, as a worker does, asking again while more follow.
    fn fetch_all(rounds: &[store::RoundRow], budget: usize) -> (Vec<(u32, Vec<u8>)>, usize) {
        let mut whole: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut partial: Vec<u8> = Vec::new();
        let mut requests = 0;
        loop {
            let after = whole.last().map_or(0, |(n, _)| *n);
            let remaining: Vec<store::RoundRow> = rounds
                .iter()
                .filter(|r| r.round as u32 > after)
                .cloned()
                .collect();
            let (pieces, more) = pieces(&remaining, partial.len(), budget);
            requests += 1;
            let size: usize = pieces.iter().map(|p| p.messages_json.len()).sum();
            assert!(size <= budget.max(1), "{size} bytes in one response");
            for piece in pieces {
                partial.extend(piece.messages_json);
                if !piece.partial {
                    whole.push((piece.number, std::mem::take(&mut partial)));
                }
            }
            if !more {
                return (whole, requests);
            }
            assert!(requests < 1000, "no progress");
        }
    }

    #[test]
    fn any_history_arrives_whole_in_pieces_that_each_fit() {
        let rounds = vec![
            round(1, 100),
            round(2, 3000),
            round(3, 10),
            round(4, 999),
            round(5, 1000),
        ];
        for budget in [7, 100, 999, 1000, 2500, 10_000] {
            let (got, requests) = fetch_all(&rounds, budget);
            let expected: Vec<(u32, Vec<u8>)> = rounds
                .iter()
                .map(|r| {
                    (
                        r.round as u32,
                        serde_json::to_vec(&r.messages.0).expect("json"),
                    )
                })
                .collect();
            assert_eq!(got, expected, "budget {budget}");
            if budget >= 10_000 {
                assert_eq!(requests, 1);
            }
        }
        assert_eq!(pieces(&[], 0, 10), (vec![], false));
    }
}
