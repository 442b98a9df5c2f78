//! What the gateway measures, per platform: the bots connected, the messages in and out, and
//! the sends that failed (to be retried) or were given up.

use hark_core::metrics::{Collect, CollectFuture, Counter, Family, Gauge, Labels, Text};

#[derive(Debug)]
pub struct Metrics {
    pub bots: Family<Gauge>,
    pub inbound: Family<Counter>,
    pub outbound: Family<Counter>,
    pub send_failures: Family<Counter>,
    pub given_up: Family<Counter>,
}

impl Metrics {
    /// Metrics whose platform label takes the values of `platforms` (the configured ones) and
    /// `other`.
    pub fn new(platforms: impl IntoIterator<Item = String>) -> Self {
        let platforms = Labels::new("platform", platforms);
        Self {
            bots: Family::gauges(platforms.clone()),
            inbound: Family::counters(platforms.clone()),
            outbound: Family::counters(platforms.clone()),
            send_failures: Family::counters(platforms.clone()),
            given_up: Family::counters(platforms),
        }
    }
}

impl Collect for Metrics {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()> {
        Box::pin(async move {
            out.gauges(
                "hark_gateway_bots",
                "Bots connected to this gateway.",
                &self.bots,
            );
            out.counters(
                "hark_gateway_inbound_messages_total",
                "Chat messages taken from bots and apps (spooled, or accepted by JetStream).",
                &self.inbound,
            );
            out.counters(
                "hark_gateway_outbound_messages_total",
                "Messages a platform confirmed sending.",
                &self.outbound,
            );
            out.counters(
                "hark_gateway_send_failures_total",
                "Sends that failed and will be retried after a backoff.",
                &self.send_failures,
            );
            out.counters(
                "hark_gateway_sends_given_up_total",
                "Messages given up after every attempt failed.",
                &self.given_up,
            );
        })
    }
}
