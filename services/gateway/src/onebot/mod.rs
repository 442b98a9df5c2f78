//! OneBot v11: frame parsing ([`event`], [`cq`]) and bot connections ([`conn`]).

pub mod conn;
pub mod cq;
pub mod event;
