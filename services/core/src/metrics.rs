//! Prometheus metrics without locks on the hot path.
//!
//! A metric is an atomic ([`Counter`], [`Gauge`]) or an array of atomics ([`Histogram`]), and a
//! labelled family is an array of them indexed by a label value chosen from a fixed set
//! ([`Labels`]): recording is one atomic add after a lookup in a short list, never a lock or an
//! allocation. Label sets are bounded by construction: platforms come from the configuration
//! (anything else counts as `other`), states and outcomes from the domain's enums; no task or
//! user id is ever a label.
//!
//! What each role measures is a [`Collect`]; the process's [`Registry`] renders them all in the
//! text format (version 0.0.4) for `GET /metrics`. A collector may read something at scrape time
//! (the tasks by state, the run queue's lag), which costs nothing between scrapes.

use std::{
    fmt::Write as _,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::secret::Secret;

/// A boxed future, as [`Collect`] returns it.
pub type CollectFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A monotonic count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }

    pub fn add(&self, delta: i64) {
        self.0.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bucket bounds in seconds for latencies inside hark: 1 ms to 1 minute.
pub const LATENCY: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Bucket bounds in seconds for calls to the outside (a model, a tool): 10 ms to 10 minutes.
pub const CALL: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 600.0,
];

/// Bucket bounds in seconds for a person's time to answer: a second to four weeks. The top
/// buckets are days apart, so that a question left for a week shows as one, not as "more than
/// an hour".
pub const PEOPLE: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0,
    172800.0, 345600.0, 604800.0, 1209600.0, 2419200.0,
];

/// Bucket bounds for token counts of one model call.
pub const TOKENS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];

/// A distribution over fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, and one past the last (`+Inf`); not cumulative.
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as the bits of an `f64`.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let bucket = self.bounds.partition_point(|b| *b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    pub fn observe_duration(&self, elapsed: Duration) {
        self.observe(elapsed.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// The values one label takes, fixed when the metric is made; any other value is recorded as
/// `other`.
#[derive(Debug, Clone)]
pub struct Labels {
    name: &'static str,
    values: Vec<String>,
}

impl Labels {
    pub fn new(name: &'static str, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut values: Vec<String> = values.into_iter().map(Into::into).collect();
        values.dedup();
        if !values.iter().any(|v| v == "other") {
            values.push("other".into());
        }
        Self { name, values }
    }

    /// The index of `value`, or of `other`.
    pub fn index(&self, value: &str) -> usize {
        self.values
            .iter()
            .position(|v| v == value)
            .unwrap_or(self.values.len() - 1)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A family of one metric kind over the values of one label.
#[derive(Debug)]
pub struct Family<M> {
    labels: Labels,
    metrics: Box<[M]>,
}

impl<M> Family<M> {
    pub fn new(labels: Labels, make: impl Fn() -> M) -> Self {
        let metrics = (0..labels.len()).map(|_| make()).collect();
        Self { labels, metrics }
    }

    /// The metric of `value` (of `other` when `value` is not one of the label's values).
    pub fn of(&self, value: &str) -> &M {
        &self.metrics[self.labels.index(value)]
    }

    fn each(&self) -> impl Iterator<Item = (String, &M)> {
        self.labels
            .values
            .iter()
            .zip(self.metrics.iter())
            .map(|(v, m)| (format!("{}=\"{}\"", self.labels.name, escape(v)), m))
    }
}

impl Family<Counter> {
    pub fn counters(labels: Labels) -> Self {
        Self::new(labels, Counter::default)
    }
}

impl Family<Gauge> {
    pub fn gauges(labels: Labels) -> Self {
        Self::new(labels, Gauge::default)
    }
}

impl Family<Histogram> {
    pub fn histograms(labels: Labels, bounds: &'static [f64]) -> Self {
        Self::new(labels, || Histogram::new(bounds))
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The text of one scrape.
#[derive(Debug, Default)]
pub struct Text(String);

impl Text {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }

    pub fn counter(&mut self, name: &str, help: &str, counter: &Counter) {
        self.head(name, "counter", help);
        self.sample(name, "", counter.get());
    }

    pub fn counters(&mut self, name: &str, help: &str, family: &Family<Counter>) {
        self.head(name, "counter", help);
        for (labels, counter) in family.each() {
            self.sample(name, &labels, counter.get());
        }
    }

    /// A gauge with one sample per label set (`labels` as `name="value",…`, or empty).
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (String, f64)>,
    ) {
        self.head(name, "gauge", help);
        for (labels, value) in samples {
            self.sample(name, &labels, value);
        }
    }

    pub fn gauges(&mut self, name: &str, help: &str, family: &Family<Gauge>) {
        self.head(name, "gauge", help);
        for (labels, gauge) in family.each() {
            self.sample(name, &labels, gauge.get());
        }
    }

    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.head(name, "histogram", help);
        self.buckets(name, "", histogram);
    }

    /// One series of a histogram with the label set `labels`; its family's header is written
    /// when `help` is given, so a family's first series gives it and the others do not.
    pub fn histogram_series(
        &mut self,
        name: &str,
        help: Option<&str>,
        labels: &str,
        histogram: &Histogram,
    ) {
        if let Some(help) = help {
            self.head(name, "histogram", help);
        }
        self.buckets(name, labels, histogram);
    }

    pub fn histograms(&mut self, name: &str, help: &str, family: &Family<Histogram>) {
        self.head(name, "histogram", help);
        for (labels, histogram) in family.each() {
            self.buckets(name, &labels, histogram);
        }
    }

    fn buckets(&mut self, name: &str, labels: &str, h: &Histogram) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match h.bounds.get(i) {
                Some(bound) => bound.to_string(),
                None => "+Inf".into(),
            };
            let _ = writeln!(
                self.0,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = f64::from_bits(h.sum.load(Ordering::Relaxed));
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A label set of one sample, `name="value"` pairs joined by commas.
pub fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    pairs
        .into_iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What one part of a process measures, rendered at each scrape.
pub trait Collect: Send + Sync + 'static {
    fn collect<'a>(&'a self, out: &'a mut Text) -> CollectFuture<'a, ()>;
}

/// The collectors of a process. `hark dev` runs every role in one process, so one registry
/// holds them all and one scrape shows them all. It holds them weakly: a role that stopped is
/// no longer shown.
#[derive(Default, Clone)]
pub struct Registry {
    collectors: Arc<Mutex<Vec<Weak<dyn Collect>>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// The process's registry.
    pub fn global() -> &'static Registry {
        static GLOBAL: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(Registry::default)
    }

    /// Shows `collector` in every scrape while it lives.
    pub fn register(&self, collector: Arc<dyn Collect>) {
        let mut collectors = self.collectors.lock().unwrap_or_else(|p| p.into_inner());
        collectors.retain(|c| c.strong_count() > 0);
        collectors.push(Arc::downgrade(&collector));
    }

    /// Every collector's metrics in the text format.
    pub async fn render(&self) -> String {
        let collectors: Vec<Arc<dyn Collect>> = self
            .collectors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut out = Text::default();
        for collector in collectors {
            collector.collect(&mut out).await;
        }
        out.into_string()
    }
}

/// The content type of [`Registry::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics` of the global registry; with a `token`, only for `Authorization: Bearer
/// <token>`.
pub fn router(token: Secret) -> axum::Router {
    use axum::{
        http::{HeaderMap, StatusCode, header},
        response::IntoResponse,
        routing::get,
    };
    let handler = move |headers: HeaderMap| {
        let token = token.clone();
        async move {
            if !token.is_empty()
                && !crate::secret::bearer(&headers).is_some_and(|given| token.matches(given))
            {
                return (
                    StatusCode::UNAUTHORIZED,
                    "wrong or missing token: send Authorization: Bearer <metrics.token>\n",
                )
                    .into_response();
            }
            let text = Registry::global().render().await;
            ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
        }
    };
    axum::Router::new().route("/metrics", get(handler))
}

/// Binds `addr` (`metrics.listen`) and serves `router` on it until `shutdown`. Returns the
/// bound address (the real port when the config said 0).
pub async fn serve(
    addr: std::net::SocketAddr,
    router: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<std::net::SocketAddr, crate::config::Error> {
    let listener =
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| crate::config::Error::Key {
                key: "metrics.listen".into(),
                message: format!(
                    "cannot listen on {addr}: {e}; pick a free port or leave it empty"
                ),
            })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    crate::listen::bound("metrics.listen", bound);
    tracing::info!(addr = %bound, "metrics listening");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_observation_in_its_bucket_and_renders_them_cumulative() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 3.0, 50.0, f64::NAN] {
            h.observe(v);
        }
        assert_eq!(h.count(), 5);
        let mut text = Text::default();
        text.histogram("x_seconds", "x", &h);
        let text = text.into_string();
        assert!(text.contains("x_seconds_bucket{le=\"1\"} 3"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"10\"} 4"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\"} 5"), "{text}");
        assert!(text.contains("x_seconds_sum 54.5"), "{text}");
        assert!(text.contains("x_seconds_count 5"), "{text}");
    }

    #[test]
    fn a_label_value_outside_the_set_counts_as_other_and_values_are_escaped() {
        let family = Family::counters(Labels::new("platform", ["qq", "my\"app"]));
        family.of("qq").inc();
        family.of("telegram").add(2);
        family.of("discord").inc();
        let mut text = Text::default();
        text.counters("m_total", "m", &family);
        let text = text.into_string();
        assert!(text.contains("m_total{platform=\"qq\"} 1"), "{text}");
        assert!(text.contains("m_total{platform=\"my\\\"app\"} 0"), "{text}");
        assert!(text.contains("m_total{platform=\"other\"} 3"), "{text}");
        assert!(text.contains("# TYPE m_total counter"), "{text}");
    }
}
