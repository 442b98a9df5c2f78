//! What the core's bus tests share: the real nats-server, and a namespace of their own on it.

#![allow(dead_code)]

use async_nats::jetstream;
use hark_core::bus::{self, Names};

pub fn nats_url() -> String {
    std::env::var("HARK_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// The streams of a namespace of one test's own, created; [`TestBus::stop`] deletes them.
pub struct TestBus {
    pub js: jetstream::Context,
    pub names: Names,
}

impl TestBus {
    pub async fn start() -> Self {
        let client = async_nats::connect(nats_url()).await.expect(
            "nats-server with JetStream must answer on HARK_TEST_NATS_URL or 127.0.0.1:4222",
        );
        let js = jetstream::new(client);
        let ns = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let names = Names::new(ns.parse().expect("namespace"));
        bus::ensure(&js, &names).await.expect("streams are created");
        Self { js, names }
    }

    pub async fn stop(self) {
        for config in self.names.stream_configs() {
            let _ = self.js.delete_stream(&config.name).await;
        }
    }
}
