//! OneBot v11: frame parsing ([`event`], [`cq`]), bot connections ([`conn`]), and the
//! [`crate::platform::Platform`] they make ([`platform`]).

pub mod conn;
pub mod cq;
pub mod event;
pub mod platform;
