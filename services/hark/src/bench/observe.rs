//! `hark bench --observe`: what tracing and metrics cost, with everything on. The bench runs an
//! OTLP/gRPC trace sink that counts the spans the roles export (sampler 1.0), gives task-control
//! and the workers a metrics listener, and scrapes every role's `/metrics` once a second while
//! the workloads run.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use tokio_util::sync::CancellationToken;

/// Counts what it receives, and keeps each span's duration by role and name (at most
/// [`KEPT`] per name) to say where a resume's time goes.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    pub spans: Arc<AtomicU64>,
    durations: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<u64>>>>,
}

/// Durations kept per span name.
const KEPT: usize = 100_000;

/// One span name's durations: how many, and their p50 and p90 in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanTimes {
    pub name: String,
    pub count: usize,
    pub p50_us: u64,
    pub p90_us: u64,
}

impl Sink {
    /// Each span name seen at least `min` times, the slowest p50 first.
    pub fn times(&self, min: usize) -> Vec<SpanTimes> {
        let durations = self.durations.lock().unwrap_or_else(|p| p.into_inner());
        let mut times: Vec<SpanTimes> = durations
            .iter()
            .filter(|(_, d)| d.len() >= min)
            .map(|(name, d)| {
                let mut sorted = d.clone();
                sorted.sort_unstable();
                let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
                SpanTimes {
                    name: name.clone(),
                    count: sorted.len(),
                    p50_us: at(0.5),
                    p90_us: at(0.9),
                }
            })
            .collect();
        times.sort_by(|a, b| b.p50_us.cmp(&a.p50_us).then(a.name.cmp(&b.name)));
        times
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        let mut spans = 0;
        let mut durations = self.durations.lock().unwrap_or_else(|p| p.into_inner());
        for resource in &request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s),
                    ) => Some(s.as_str()),
                    _ => None,
                })
                .unwrap_or("?");
            for span in resource.scope_spans.iter().flat_map(|s| &s.spans) {
                spans += 1;
                let took = span
                    .end_time_unix_nano
                    .saturating_sub(span.start_time_unix_nano)
                    / 1_000;
                let kept = durations
                    .entry(format!("{service} · {}", span.name))
                    .or_default();
                if kept.len() < KEPT {
                    kept.push(took);
                }
            }
        }
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The sink, the metrics ports, and the scraper.
#[derive(Debug)]
pub struct Observe {
    pub sink: Sink,
    pub otlp: SocketAddr,
    /// `metrics.listen` of task-control, then of each worker.
    pub metrics: Vec<SocketAddr>,
    pub scrapes: Arc<AtomicU64>,
    stop: CancellationToken,
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Observe {
    pub async fn start(workers: u32) -> anyhow::Result<Self> {
        let sink = Sink::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let otlp = listener.local_addr()?;
        let stop = CancellationToken::new();
        {
            let (sink, stop) = (sink.clone(), stop.clone());
            tokio::spawn(async move {
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(sink))
                    .serve_with_incoming_shutdown(incoming, stop.cancelled())
                    .await;
            });
        }
        let metrics = (0..=workers)
            .map(|_| free_port())
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            sink,
            otlp,
            metrics,
            scrapes: Arc::default(),
            stop,
        })
    }

    /// The environment of the role processes: export every span, and serve metrics.
    pub fn env(&self, role: &str, index: usize) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                format!("http://{}", self.otlp),
            ),
            ("OTEL_TRACES_SAMPLER".to_owned(), "always_on".to_owned()),
        ];
        let port = match role {
            "control" => self.metrics.first(),
            "worker" => self.metrics.get(index + 1),
            _ => None,
        };
        if let Some(addr) = port {
            env.push(("HARK_METRICS__LISTEN".to_owned(), addr.to_string()));
        }
        env
    }

    /// Scrapes every role's `/metrics` (the gateway's at `gateway`) once a second until stopped.
    pub fn scrape(&self, gateway: SocketAddr, token: String) {
        let mut urls: Vec<String> = self
            .metrics
            .iter()
            .map(|a| format!("http://{a}/metrics"))
            .collect();
        urls.push(format!("http://{gateway}/metrics"));
        let (scrapes, stop) = (self.scrapes.clone(), self.stop.clone());
        hark_core::install_crypto();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                for url in &urls {
                    match client.get(url).bearer_auth(&token).send().await {
                        Ok(response) if response.status().is_success() => {
                            if response.bytes().await.is_ok() {
                                scrapes.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(response) => {
                            eprintln!("bench: {url} answered {}", response.status())
                        }
                        Err(e) => eprintln!("bench: cannot scrape {url}: {e}"),
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::{
        common::v1::{AnyValue, KeyValue, any_value::Value},
        resource::v1::Resource,
        trace::v1::{ResourceSpans, ScopeSpans, Span},
    };

    fn request(service: &str, spans: &[(&str, u64)]) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(Value::StringValue(service.into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: spans
                        .iter()
                        .map(|(name, micros)| Span {
                            name: (*name).into(),
                            start_time_unix_nano: 1_000_000,
                            end_time_unix_nano: 1_000_000 + micros * 1_000,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn spans_are_timed_by_role_and_name_the_slowest_first() {
        let sink = Sink::default();
        let answers: Vec<(&str, u64)> = (1..=10).map(|n| ("answer", n * 100)).collect();
        sink.export(tonic::Request::new(request("hark-control", &answers)))
            .await
            .expect("exported");
        sink.export(tonic::Request::new(request(
            "hark-worker",
            &[("llm", 5_000), ("llm", 7_000), ("rare", 1)],
        )))
        .await
        .expect("exported");
        assert_eq!(sink.spans.load(Ordering::Relaxed), 13);
        let times = sink.times(2);
        assert_eq!(
            times,
            vec![
                SpanTimes {
                    name: "hark-worker · llm".into(),
                    count: 2,
                    p50_us: 7_000,
                    p90_us: 7_000,
                },
                SpanTimes {
                    name: "hark-control · answer".into(),
                    count: 10,
                    p50_us: 600,
                    p90_us: 900,
                },
            ]
        );
    }
}
