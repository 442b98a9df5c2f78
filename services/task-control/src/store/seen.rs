//! The chats each person was seen speaking in: written at most once a minute per person and
//! chat, so that a busy group costs no write per message.

use std::{
    hash::{Hash, Hasher},
    time::{Duration, Instant},
};

use hark_core::domain::Owner;
use time::OffsetDateTime;

use super::{Error, Store};

/// How often one person's sighting in one chat is written at most.
const SEEN_EVERY: Duration = Duration::from_secs(60);

/// A chat a person was seen in.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SeenChat {
    pub platform: String,
    pub bot_id: String,
    pub stream: String,
    pub last_seen_at: OffsetDateTime,
}

impl Store {
    /// Records that `owner` spoke in `stream` through `bot_id`.
    pub async fn saw(
        &self,
        owner: &Owner,
        platform: &str,
        bot_id: &str,
        stream: &str,
    ) -> Result<(), Error> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (owner.as_str(), platform, bot_id, stream).hash(&mut hasher);
        let key = hasher.finish();
        if self
            .seen
            .get(key)
            .is_some_and(|at| at.elapsed() < SEEN_EVERY)
        {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO person_chats (owner, platform, bot_id, stream) VALUES ($1, $2, $3, $4)
             ON CONFLICT (owner, platform, bot_id, stream) DO UPDATE SET last_seen_at = now()
             WHERE person_chats.last_seen_at < now() - interval '1 minute'",
        )
        .bind(owner.as_str())
        .bind(platform)
        .bind(bot_id)
        .bind(stream)
        .execute(&self.pool)
        .await?;
        self.seen.remember(key, Instant::now());
        Ok(())
    }

    /// The chats `owner` was seen in, the latest first.
    pub async fn chats_of(&self, owner: &Owner) -> Result<Vec<SeenChat>, Error> {
        Ok(sqlx::query_as::<_, SeenChat>(
            "SELECT platform, bot_id, stream, last_seen_at FROM person_chats
             WHERE owner = $1 ORDER BY last_seen_at DESC, stream LIMIT 200",
        )
        .bind(owner.as_str())
        .fetch_all(&self.pool)
        .await?)
    }
}
