//! OneBot v11: frame parsing ([`event`], [`cq`]), bot connections ([`conn`]) and the bots online
//! ([`bots`]), the reverse WebSocket bots dial into ([`reverse`]) and the bots' own servers
//! hark dials ([`forward`]), and the [`crate::platform::Platform`] they make ([`platform`]).

use std::sync::Arc;

use crate::hub::Hub;

pub mod bots;
pub mod conn;
pub mod cq;
pub mod event;
pub mod forward;
pub mod platform;
pub mod reverse;

/// What OneBot's connections share: the gateway's hub, and the bots online.
#[derive(Debug, Clone)]
pub struct Door {
    pub hub: Arc<Hub>,
    pub bots: Arc<bots::Bots>,
}
