//! Claims, decided in batches. Workers claim a task for every run job they take, so under load
//! many claims wait at once; one statement then decides all of them (each still a
//! compare-and-set on its task's `(state, generation)`), and one commit makes them durable. A
//! lone claim is decided at once, without waiting for company.

use std::{sync::OnceLock, time::Duration};

use hark_core::domain::{Event, TaskId, TaskState};
use tokio::sync::{mpsc, oneshot};

use super::{Error, Store, ops::CasRow};

/// The most claims one statement decides.
const MAX_BATCH: usize = 64;

/// What a worker asks: `task`, if it is still pending at `generation`.
struct ClaimRequest {
    task: TaskId,
    generation: i64,
    worker: String,
    lease: Duration,
    /// The task's row and context when the claim won, `None` when it lost.
    reply: oneshot::Sender<Result<Option<CasRow>, String>>,
}

/// The claims waiting for the next statement. The first claim starts the loop that decides them.
#[derive(Debug, Default)]
pub(crate) struct ClaimQueue {
    sender: OnceLock<mpsc::UnboundedSender<ClaimRequest>>,
}

impl std::fmt::Debug for ClaimRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimRequest")
            .field("task", &self.task)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// The row one claim of a batch returns: the task and what a worker needs to run it, and the
/// claim's place in the batch.
#[derive(sqlx::FromRow)]
struct BatchRow {
    #[sqlx(flatten)]
    row: CasRow,
    ord: i64,
}

impl Store {
    /// Decides one claim together with whatever other claims wait at the same time.
    pub(super) async fn claim_row(
        &self,
        task: TaskId,
        generation: i64,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<CasRow>, Error> {
        let sender = self.claims.sender.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(self.clone().decide_claims(receiver));
            sender
        });
        let (reply, decided) = oneshot::channel();
        let request = ClaimRequest {
            task,
            generation,
            worker: worker.to_owned(),
            lease,
            reply,
        };
        let stopped = || Error::Database(sqlx::Error::PoolClosed);
        sender.send(request).map_err(|_| stopped())?;
        decided
            .await
            .map_err(|_| stopped())?
            .map_err(|message| Error::Database(sqlx::Error::Protocol(message)))
    }

    async fn decide_claims(self, mut receiver: mpsc::UnboundedReceiver<ClaimRequest>) {
        while let Some(first) = receiver.recv().await {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            match self.claim_batch(&batch).await {
                Ok(mut won) => {
                    for (i, request) in batch.into_iter().enumerate() {
                        let _ = request.reply.send(Ok(won[i].take()));
                    }
                }
                Err(e) => {
                    let message = format!("cannot decide {} claims: {e}", batch.len());
                    for request in batch {
                        let _ = request.reply.send(Err(message.clone()));
                    }
                }
            }
        }
    }

    /// One statement for all of `batch`; the result holds, in order, the row of each claim that
    /// won.
    async fn claim_batch(&self, batch: &[ClaimRequest]) -> Result<Vec<Option<CasRow>>, Error> {
        let sql = concat!(
            "WITH c AS (
                SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::bigint[])
                    WITH ORDINALITY AS c(c_id, c_generation, c_worker, c_lease_ms, c_ord)
            ), t AS (
                UPDATE tasks SET
                    state = 'running',
                    generation = generation + 1,
                    updated_at = now(),
                    run_ms = run_ms + CASE WHEN running_since IS NULL THEN 0
                        ELSE (extract(epoch FROM now() - running_since) * 1000)::bigint END,
                    worker_id = c.c_worker,
                    lease_until = now() + c.c_lease_ms * interval '1 millisecond',
                    running_since = now(),
                    finished_at = NULL
                FROM c
                WHERE tasks.id = c.c_id AND tasks.state = 'pending' AND tasks.generation = c.c_generation
                RETURNING ",
            task_columns!(),
            ", c.c_ord
            ), audit AS (
                INSERT INTO transitions (task_id, from_state, to_state, event, generation, actor, detail)
                SELECT id, 'pending', state, 'claim', generation, worker_id, '' FROM t
            )
            SELECT t.*, t.c_ord AS ord, NULL::timestamptz AS asked_deadline,
                (SELECT coalesce(json_agg(json_build_object('round', round, 'messages', messages) ORDER BY round), '[]')
                 FROM checkpoints WHERE task_id = t.id) AS ctx_rounds,
                (SELECT json_build_object('id', id, 'tool_call_id', tool_call_id, 'round', round,
                        'outcome', outcome, 'answer', answer,
                        'waited_ms', (extract(epoch FROM deadline - asked_at) * 1000)::bigint)
                 FROM questions WHERE task_id = t.id ORDER BY asked_at DESC, id DESC LIMIT 1) AS ctx_question,
                (SELECT coalesce(json_agg(json_build_object('id', id, 'text', text, 'author', author)
                                          ORDER BY created_at, id), '[]')
                 FROM instructions WHERE task_id = t.id AND consumed_round IS NULL) AS ctx_instructions
            FROM t"
        );
        let rows: Vec<BatchRow> = sqlx::query_as(sql)
            .bind(batch.iter().map(|r| r.task.as_uuid()).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.generation).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.worker.as_str()).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|r| r.lease.as_millis() as i64)
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&self.pool)
            .await?;
        let mut won: Vec<Option<CasRow>> = batch.iter().map(|_| None).collect();
        let mut events = Vec::with_capacity(rows.len());
        for BatchRow { row, ord } in rows {
            events.push(self.event_msg(
                row.task.id,
                TaskState::Running,
                row.task.generation,
                Event::Claim.as_str(),
            ));
            if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| won.get_mut(i)) {
                *slot = Some(row);
            }
        }
        self.published(events);
        Ok(won)
    }
}
