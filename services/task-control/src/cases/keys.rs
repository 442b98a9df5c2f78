//! Keys that belong to a person: made, listed and revoked by an operator for anyone, or by a
//! person for themselves; and the caller a key signs in as.

use std::time::Duration;

use hark_core::domain::{Owner, Role};
use uuid::Uuid;

use super::{Caller, Error};
use crate::{
    shared::Shared,
    store::{KeyRow, NewKey},
};

/// The longest a key's name may be, in characters.
const MAX_NAME_CHARS: usize = 64;

/// How every key starts, so that a person, a log scanner or a secret scanner knows one.
pub const KEY_PREFIX: &str = "hk_";

/// A key to make, as a door read it.
#[derive(Debug)]
pub struct Make {
    pub owner: Owner,
    pub name: String,
    /// `None`: the owner's own role.
    pub role: Option<Role>,
    /// `None`: it works until revoked.
    pub expires_in: Option<Duration>,
}

/// Makes a key for `make.owner` and returns it with the key itself, which is shown only now.
pub async fn create(
    shared: &Shared,
    caller: &Caller,
    make: Make,
) -> Result<(KeyRow, String), Error> {
    if let Caller::Person { owner, .. } = caller
        && *owner != make.owner
    {
        return Err(Error::KeyOfAnother {
            owner: make.owner.clone(),
        });
    }
    let name = make.name.trim();
    if name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(Error::KeyName);
    }
    let most = shared.role_of(&make.owner);
    if most < Role::User {
        return Err(Error::CannotHaveTasks {
            owner: make.owner,
            role: most,
        });
    }
    let role = make.role.unwrap_or(most);
    if role > most {
        return Err(Error::KeyRole {
            owner: make.owner,
            role,
            most,
        });
    }
    let secret = format!(
        "{KEY_PREFIX}{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    );
    let row = shared
        .store
        .create_key(
            &NewKey {
                owner: &make.owner,
                name,
                role,
                expires_in: make.expires_in,
                created_by: caller.actor(),
            },
            &secret,
        )
        .await?;
    Ok((row, secret))
}

/// The keys the caller may see: a person's own, or everyone's for an operator.
pub async fn list(shared: &Shared, caller: &Caller) -> Result<Vec<KeyRow>, Error> {
    Ok(shared.store.keys_of(caller.owner()).await?)
}

/// Revokes the caller's key `id` (an operator's: anyone's).
pub async fn revoke(shared: &Shared, caller: &Caller, id: &str) -> Result<KeyRow, Error> {
    Ok(shared.store.revoke_key(id, caller.owner()).await?)
}

/// The person `secret` signs in as, with the key's role capped by the owner's role now; `None`
/// for a key that is unknown, revoked or expired.
pub async fn signed_in(shared: &Shared, secret: &str) -> Result<Option<Caller>, Error> {
    Ok(holder(shared, secret).await?.map(|(_, caller)| caller))
}

/// The key `secret` is, with the person it signs in as (see [`signed_in`]).
pub async fn holder(shared: &Shared, secret: &str) -> Result<Option<(KeyRow, Caller)>, Error> {
    if !secret.starts_with(KEY_PREFIX) {
        return Ok(None);
    }
    let Some(key) = shared.store.key_holder(secret).await? else {
        return Ok(None);
    };
    let role = key.role.min(shared.role_of(&key.owner));
    let caller = Caller::Person {
        owner: key.owner.clone(),
        role,
    };
    Ok(Some((key, caller)))
}
