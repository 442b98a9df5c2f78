//! Keys that belong to a person. Only a SHA-256 of each key is kept, so a leaked database does
//! not give the keys away; the key itself is shown once, to whoever made it.

use std::time::Duration;

use hark_core::domain::{Owner, Role};
use uuid::Uuid;

use super::{Error, KeyRow, Store};

/// The columns of `person_keys` in the order of [`KeyRow`], all but the hash.
macro_rules! key_columns {
    () => {
        "id, owner, name, role, created_by, created_at, expires_at, revoked_at, last_used_at"
    };
}

/// A key to make.
#[derive(Debug)]
pub struct NewKey<'a> {
    pub owner: &'a Owner,
    pub name: &'a str,
    pub role: Role,
    /// How long it works; `None` until revoked.
    pub expires_in: Option<Duration>,
    /// Who made it, for the audit: an operator's door or the owner.
    pub created_by: &'a str,
}

impl Store {
    /// Keeps `new` with the hash of `secret`.
    pub async fn create_key(&self, new: &NewKey<'_>, secret: &str) -> Result<KeyRow, Error> {
        Ok(sqlx::query_as::<_, KeyRow>(concat!(
            "INSERT INTO person_keys (id, owner, name, role, key_hash, created_by, expires_at)
             VALUES ($1, $2, $3, $4, sha256(convert_to($5, 'UTF8')), $6,
                     now() + $7 * interval '1 millisecond')
             RETURNING ",
            key_columns!()
        ))
        .bind(Uuid::new_v4())
        .bind(new.owner.as_str())
        .bind(new.name)
        .bind(new.role.as_str())
        .bind(secret)
        .bind(new.created_by)
        .bind(new.expires_in.map(|d| d.as_millis() as i64))
        .fetch_one(&self.pool)
        .await?)
    }

    /// The keys of `owner`, or of everyone, newest last.
    pub async fn keys_of(&self, owner: Option<&Owner>) -> Result<Vec<KeyRow>, Error> {
        Ok(sqlx::query_as::<_, KeyRow>(concat!(
            "SELECT ",
            key_columns!(),
            " FROM person_keys WHERE $1::text IS NULL OR owner = $1
             ORDER BY created_at, id LIMIT 1000"
        ))
        .bind(owner.map(Owner::as_str))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Revokes the key whose id starts with `id` (of `owner`'s keys, when given). Revoking a
    /// revoked key again changes nothing.
    pub async fn revoke_key(&self, id: &str, owner: Option<&Owner>) -> Result<KeyRow, Error> {
        let id = id.trim().to_ascii_lowercase().replace('-', "");
        if id.len() < 4 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::KeyNotFound(hark_core::domain::ids::shown(&id)));
        }
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query_as::<_, KeyRow>(concat!(
            "UPDATE person_keys SET revoked_at = coalesce(revoked_at, now())
             WHERE id IN (SELECT id FROM person_keys
                          WHERE replace(id::text, '-', '') LIKE $1 || '%'
                            AND ($2::text IS NULL OR owner = $2) LIMIT 2)
             RETURNING ",
            key_columns!()
        ))
        .bind(&id)
        .bind(owner.map(Owner::as_str))
        .fetch_all(&mut *tx)
        .await?;
        match rows.len() {
            0 => Err(Error::KeyNotFound(id)),
            1 => {
                tx.commit().await?;
                Ok(rows.into_iter().next().expect("one row"))
            }
            _ => Err(Error::AmbiguousKey(id)),
        }
    }

    /// The key `secret` is, while it is neither revoked nor expired; it is marked used at most
    /// once a minute, so that using a key does not write on every call.
    pub async fn key_holder(&self, secret: &str) -> Result<Option<KeyRow>, Error> {
        Ok(sqlx::query_as::<_, KeyRow>(concat!(
            "WITH k AS (
                SELECT ",
            key_columns!(),
            " FROM person_keys
                WHERE key_hash = sha256(convert_to($1, 'UTF8')) AND revoked_at IS NULL
                  AND (expires_at IS NULL OR expires_at > now())
             ), used AS (
                UPDATE person_keys p SET last_used_at = now() FROM k
                WHERE p.id = k.id
                  AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute')
             )
             SELECT * FROM k"
        ))
        .bind(secret)
        .fetch_optional(&self.pool)
        .await?)
    }
}
