//! What every hark service shares.
//!
//! - [`domain`] is the task model without I/O: the id newtypes parsed where data enters, the task
//!   lifecycle as one transition function, question outcomes and roles.
//! - [`config`] reads the one TOML file and its `HARK_…` environment overrides.
//! - [`bus`] owns every NATS subject, JetStream stream and consumer name, derived from one
//!   namespace, and creates the streams and consumers.
//! - [`codec`] encodes and decodes the protobuf payloads that travel on the bus.
//! - [`consume`] takes messages off a JetStream consumer so that no single one can stop it: a
//!   panic is caught, and a message that never succeeds is set aside in the dead-letter stream.
//! - [`error`] is the one classification of failures that every service maps from.
//! - [`listen`] says where a role listens once bound, for listeners configured on port 0.
//! - [`startup`] waits for a dependency that does not answer yet, saying what it waits for.
//! - [`metrics`] counts and times what each role does, for Prometheus, without locks.
//! - [`secret`] types tokens and passwords so that nothing prints them.
//! - [`telemetry`] exports traces over OTLP when an endpoint is set.
//! - [`trace`] carries W3C trace context across the bus and the gRPC API.

pub mod bus;
pub mod codec;
pub mod config;
pub mod consume;
pub mod domain;
pub mod error;
pub mod failpoint;
pub mod listen;
pub mod metrics;
pub mod publish;
pub mod secret;
pub mod startup;
pub mod telemetry;
pub mod trace;

/// Installs ring as rustls's process-wide crypto provider, for HTTPS clients (the LLM client,
/// webhooks). Safe to call any number of times.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
