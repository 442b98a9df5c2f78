//! Where hark may reach a person without being told: their own private chat, through the bot that
//! saw them last; or a chat they were seen speaking in. Nobody can make the bot post where the
//! person is not.

use hark_core::domain::{Owner, StreamId};

use super::Error;
use crate::{shared::Shared, store::ChatRoute};

/// The chat to ask `owner` in: `chat` (a stream such as `group:456`) when given, else their
/// private chat.
pub async fn route_for(
    shared: &Shared,
    owner: &Owner,
    chat: Option<&str>,
) -> Result<ChatRoute, Error> {
    let private = StreamId::private(owner.user_id()).map_err(|_| Error::NeverSeen {
        owner: owner.clone(),
    })?;
    let stream = match chat.map(str::trim).filter(|c| !c.is_empty()) {
        None => private.clone(),
        Some(chat) => chat.parse::<StreamId>().map_err(|_| Error::NotTheirChat {
            owner: owner.clone(),
            chat: hark_core::domain::ids::shown(chat),
        })?,
    };
    let seen = shared.store.chats_of(owner).await?;
    let on_platform = seen.iter().filter(|c| c.platform == owner.platform());
    let bot = if stream == private {
        // Their own private chat: through the bot that saw them last, wherever that was.
        on_platform.map(|c| c.bot_id.clone()).next()
    } else {
        on_platform
            .filter(|c| c.stream == stream.as_str())
            .map(|c| c.bot_id.clone())
            .next()
    };
    match bot {
        Some(bot_id) => Ok(ChatRoute {
            platform: owner.platform().to_owned(),
            bot_id,
            stream: stream.as_str().to_owned(),
            origin_message_id: None,
        }),
        None if stream == private => Err(Error::NeverSeen {
            owner: owner.clone(),
        }),
        None => Err(Error::NotTheirChat {
            owner: owner.clone(),
            chat: stream.as_str().to_owned(),
        }),
    }
}
