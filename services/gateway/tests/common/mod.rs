//! What the gateway's tests share: a gateway of its own on the real NATS, in a namespace of its
//! own, and reading a stream's next message.

#![allow(dead_code)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use hark_core::{bus::Names, codec, config::Config};
use hark_gateway::{app::App, hub::Hub};
use tokio_util::sync::CancellationToken;

pub use hark_testkit::nats_url;

/// A config for a gateway of its own: a fresh namespace and spool, any free port.
pub fn config() -> Config {
    hark_core::install_crypto();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut config = Config::default();
    config.nats.url = nats_url().into();
    config.nats.namespace = hark_testkit::unique_namespace();
    config.gateway.listen = "127.0.0.1:0".parse().expect("addr");
    config.gateway.spool_dir = std::env::temp_dir()
        .join(format!("hark-gw-test-{}", uuid::Uuid::new_v4().simple()))
        .display()
        .to_string();
    config
}

/// A running gateway.
pub struct Running {
    pub addr: SocketAddr,
    pub hub: Arc<Hub>,
    pub names: Names,
    pub js: jetstream::Context,
    pub stop: CancellationToken,
    /// Its streams are deleted when this is dropped, also when a test panics.
    _namespace: hark_testkit::Namespace,
}

impl Running {
    /// Starts a gateway with `config` and returns once its streams exist.
    pub async fn start(config: &Config) -> Self {
        let app = App::build(config).await.expect("gateway builds");
        let (addr, hub, ready) = (app.addr(), app.hub().clone(), app.ready());
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move { app.run_until_stopped(token).await.expect("gateway runs") });
        ready.cancelled().await;
        Self {
            addr,
            hub,
            names: Names::new(config.nats.namespace.parse().expect("ns")),
            js: jetstream::new(async_nats::connect(nats_url()).await.expect("nats")),
            stop,
            _namespace: hark_testkit::Namespace::adopt(nats_url(), config.nats.namespace.clone()),
        }
    }

    /// task-control's consumer of `stream`, which the gateway's tests read as it would.
    pub async fn control_consumer(&self, stream: String) -> PullConsumer {
        self.js
            .get_consumer_from_stream(Names::CONTROL_CONSUMER, stream)
            .await
            .expect("consumer")
    }

    /// Stops the gateway and deletes its streams.
    pub async fn stop(&self) {
        self.stop.cancel();
        for config in self.names.stream_configs() {
            let _ = self.js.delete_stream(&config.name).await;
        }
    }
}

/// The next message on `consumer` within `wait`, acknowledged and decoded.
pub async fn next<M: codec::Versioned>(consumer: &PullConsumer, wait: Duration) -> Option<M> {
    next_traced(consumer, wait).await.map(|(m, _)| m)
}

/// The next message with the trace context it was published with.
pub async fn next_traced<M: codec::Versioned>(
    consumer: &PullConsumer,
    wait: Duration,
) -> Option<(M, Option<hark_core::trace::TraceContext>)> {
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .expect("fetch");
    let message = batch.next().await?.expect("message");
    message.ack().await.expect("ack");
    let trace = hark_core::trace::from_headers(message.headers.as_ref());
    Some((codec::decode(&message.payload).expect("decodes"), trace))
}
