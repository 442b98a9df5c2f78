//! The outbox: messages a committed change implies, relayed to NATS after the commit.

use std::time::Duration;

use bytes::Bytes;
use hark_core::publish;

use super::{Error, Store};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEntry {
    pub id: i64,
    pub subject: String,
    pub msg_id: String,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

/// A message to publish once the transaction that decided it commits.
#[derive(Debug, Clone)]
pub struct OutboxMessage {
    pub subject: String,
    pub msg_id: String,
    pub payload: Bytes,
    /// Written to the outbox table and published with an ack. Task events are not: they are
    /// published once, best effort (watchers also read the task row), which keeps them off the
    /// database and out of JetStream's acknowledgement path.
    pub durable: bool,
    /// The W3C `traceparent` to publish it with: a child of the trace that caused it.
    pub trace: Option<String>,
}

impl Store {
    /// The oldest unrelayed messages. Rows taken by another relay are skipped.
    pub async fn outbox_batch(&self, limit: i64) -> Result<Vec<OutboxEntry>, Error> {
        Ok(sqlx::query_as::<_, OutboxEntry>(
            "SELECT id, subject, msg_id, payload, traceparent FROM outbox ORDER BY id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Forgets outbox messages, named by subject and dedup id, once JetStream acknowledged them.
    pub async fn outbox_forget(&self, published: &[(String, String)]) -> Result<(), Error> {
        if published.is_empty() {
            return Ok(());
        }
        let (subjects, msg_ids): (Vec<&str>, Vec<&str>) = published
            .iter()
            .map(|(s, m)| (s.as_str(), m.as_str()))
            .unzip();
        sqlx::query(
            "DELETE FROM outbox o USING unnest($1::text[], $2::text[]) AS d(s, m)
             WHERE o.msg_id = d.m AND o.subject = d.s",
        )
        .bind(subjects)
        .bind(msg_ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Relays up to `limit` outbox messages older than `min_age` to JetStream and deletes those the stream
    /// acknowledged. Rows another relay holds are skipped. Returns how many were relayed.
    pub async fn relay_outbox(
        &self,
        js: &async_nats::jetstream::Context,
        limit: i64,
        min_age: Duration,
    ) -> Result<usize, Error> {
        let mut tx = self.pool.begin().await?;
        let batch = sqlx::query_as::<_, OutboxEntry>(
            "SELECT id, subject, msg_id, payload, traceparent FROM outbox
             WHERE created_at <= now() - $2 * interval '1 millisecond'
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .bind(min_age.as_millis() as i64)
        .fetch_all(&mut *tx)
        .await?;
        if batch.is_empty() {
            return Ok(0);
        }
        let mut pending = Vec::with_capacity(batch.len());
        for entry in &batch {
            let outgoing = publish::Outgoing {
                subject: entry.subject.clone(),
                msg_id: &entry.msg_id,
                payload: entry.payload.clone().into(),
                trace: entry.traceparent.as_deref(),
            };
            match publish::send(js, outgoing).await {
                Ok(sent) => pending.push((entry.id, sent)),
                Err(e) => {
                    tracing::warn!(error = %e, "the sweep will try the outbox message again");
                    break;
                }
            }
        }
        let mut done = Vec::with_capacity(pending.len());
        for (id, sent) in pending {
            match sent.acked().await {
                Ok(_) => done.push(id),
                Err(e) => tracing::warn!(error = %e, "the sweep will try the outbox message again"),
            }
        }
        sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
            .bind(&done)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.len())
    }
}
