//! What the core's bus tests share: the real nats-server, and a namespace of their own on it.

#![allow(dead_code)]

use async_nats::jetstream;
use hark_core::bus::{self, Names};

pub use hark_testkit::nats_url;

/// The streams of a namespace of one test's own, created; [`TestBus::stop`] deletes them, and
/// so does dropping it (a panic too).
pub struct TestBus {
    pub js: jetstream::Context,
    pub names: Names,
    namespace: hark_testkit::Namespace,
}

impl TestBus {
    pub async fn start() -> Self {
        Self::start_with(1).await
    }

    /// With `TASK_RUN` split into `partitions` streams.
    pub async fn start_with(partitions: u16) -> Self {
        let client = async_nats::connect(nats_url()).await.expect(
            "nats-server with JetStream must answer on HARK_TEST_NATS_URL or 127.0.0.1:4222",
        );
        let js = jetstream::new(client);
        let namespace = hark_testkit::Namespace::new();
        let names =
            Names::new(namespace.name.parse().expect("namespace")).with_partitions(partitions);
        bus::ensure(&js, &names).await.expect("streams are created");
        Self {
            js,
            names,
            namespace,
        }
    }

    pub async fn stop(self) {
        self.namespace.remove().await;
    }
}
