//! Claiming a task for a worker: the compare-and-set a worker's claim request makes, and what a
//! task handed to a polling worker carries. Control requests and the hand-over both claim here.

use std::time::Duration;

use hark_core::{
    domain::{Role, TaskId, TaskState, decide},
    error::Classified as _,
};
use hark_proto::v1 as pb;
use prost::Message;

use crate::{
    convert,
    shared::Shared,
    store::{self, Take},
};

pub(crate) fn refusal(
    reason: pb::RefusalReason,
    message: impl Into<String>,
) -> Option<pb::Refusal> {
    Some(pb::Refusal {
        reason: reason as i32,
        message: message.into(),
    })
}

/// Maps a store error onto what a worker should do about it.
pub(crate) fn refusal_of(error: &store::Error) -> Option<pb::Refusal> {
    use pb::RefusalReason as R;
    // The precise reasons where task-control knows them; otherwise the kind's one mapping.
    let reason = match error {
        store::Error::Cancelled { .. } => R::Cancelled,
        store::Error::LeaseLost { .. } => R::LeaseLost,
        e => e.kind().refusal(),
    };
    refusal(reason, error.to_string())
}

/// A claim refused for `reason`.
pub fn refused(reason: pb::RefusalReason, message: impl Into<String>) -> pb::ClaimResponse {
    pb::ClaimResponse {
        refusal: refusal(reason, message),
        ..Default::default()
    }
}

/// Takes a pending task for `worker`, for the run job of `task` at `job_generation`: the job's
/// own task if its generation is still current and no task of a higher priority is pending;
/// else that task of a higher priority, or a task this job is owed to, so the claimed task may
/// not be the job's. A job that stands for no task is refused as stale (or as cancelled).
pub async fn claim(
    store: &store::Store,
    task: TaskId,
    job_generation: i64,
    worker: &str,
    lease: Duration,
) -> Result<store::Claimed, store::Error> {
    let decided = decide::decide_on_state(
        decide::State::Pending,
        &decide::Command::Claim { lease },
        time::OffsetDateTime::now_utc(),
        store.policy(),
    )
    .map_err(|r| store::Error::refused(task, r))?;
    // The job's own task; when it is not the one to take, a task of a higher priority or one
    // this job is owed to; when that went meanwhile, the job's own task again.
    let mut attempts = 0;
    loop {
        for take in [Take::Own, Take::Instead] {
            if let Some(claimed) = store
                .claim_task(take, (task, job_generation), worker, &decided)
                .await?
            {
                return Ok(claimed);
            }
        }
        let current = store.get_task(task).await?;
        attempts += 1;
        if current.state == TaskState::Pending
            && current.generation == job_generation
            && attempts < 3
        {
            continue;
        }
        return Err(match current.state {
            TaskState::Cancelled => store::Error::Cancelled {
                task: task.to_string(),
            },
            state => store::Error::StaleJob {
                task: task.to_string(),
                state,
                current: current.generation,
                job: job_generation,
            },
        });
    }
}

/// Claims `task`, pending at `generation`, for `worker` (see [`claim`]), and says
/// what the worker needs to run it: the claim response a worker's claim request gets, and what
/// a task handed to a polling worker carries.
pub async fn claim_for(
    shared: &Shared,
    task: TaskId,
    generation: i64,
    worker: &str,
    lease: Duration,
) -> pb::ClaimResponse {
    let result = claim(&shared.store, task, generation, worker, lease)
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
            deadline: claimed.task.deadline_at.map(convert::timestamp),
            on_deadline: claimed.task.on_deadline.to_proto() as i32,
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
pub(crate) fn within_budget<M: Message>(items: impl Iterator<Item = M>, budget: usize) -> Vec<M> {
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
