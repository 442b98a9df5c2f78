//! What every part of task-control shares: the store, the NATS connection, the bus names and the
//! configuration, with the few bus actions they all take.

use std::sync::Arc;

use async_nats::jetstream;
use hark_core::{
    bus::Names,
    codec,
    config::Config,
    domain::{Owner, Role},
    publish,
};
use hark_proto::v1 as pb;

use crate::store::Store;

#[derive(Debug, Clone)]
pub struct Shared {
    pub store: Store,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub names: Names,
    pub config: Arc<Config>,
    /// How many chat commands each sender may give (`chat.commands_per_minute`).
    pub commands: Arc<crate::limit::CommandLimiter>,
    /// The `WatchTask` streams of this process and the events they wait for.
    pub watchers: Arc<crate::watchers::Watchers>,
    /// This role's metrics, registered with the process's registry while it lives.
    pub metrics: Arc<crate::metrics::Scraped>,
    /// Workers polling this replica, to whom the relay hands run jobs directly.
    pub parked: Arc<crate::parked::Parked>,
    /// Where messages that can never be handled are set aside.
    pub dead: hark_core::consume::DeadLetters,
    /// Whether this replica's consumers consume; its gRPC health reports one that does not.
    pub liveness: hark_core::consume::Liveness,
}

impl Shared {
    /// The texts of chats on `platform`, in their language.
    pub fn texts(&self, platform: &str) -> crate::texts::Texts {
        crate::texts::Texts::new(self.config.chat.language_for(platform))
    }

    pub fn role_of(&self, owner: &Owner) -> Role {
        self.config.permission.role_of(owner)
    }

    /// Sends a reply into a chat, quoting `reply_to` when given. A lost reply is logged, not
    /// retried: replies carry no state.
    pub async fn reply(
        &self,
        platform: &str,
        bot_id: &str,
        stream: &str,
        text: &str,
        reply_to: &str,
    ) {
        let subject = match self.names.chat_out(platform, bot_id) {
            Ok(subject) => subject,
            Err(e) => {
                tracing::debug!(error = %e, "cannot reply: the chat has no usable route");
                return;
            }
        };
        for part in crate::render::parts(text) {
            let id = uuid::Uuid::now_v7().to_string();
            let message = pb::OutboundMessage {
                id: id.clone(),
                route: Some(pb::ChatRoute {
                    platform: platform.to_owned(),
                    bot_id: bot_id.to_owned(),
                    stream: stream.to_owned(),
                    origin_message_id: String::new(),
                }),
                text: part,
                reply_to_message_id: reply_to.to_owned(),
                ..Default::default()
            };
            let reply = publish::Outgoing {
                subject: subject.clone(),
                msg_id: &id,
                payload: codec::encode(message),
                trace: None,
            };
            if let Err(e) = publish::publish(&self.js, reply).await {
                tracing::warn!(error = %e, "cannot send a chat reply");
            }
        }
    }
}
