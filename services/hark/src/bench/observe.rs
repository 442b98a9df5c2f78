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

/// Counts what it receives and keeps nothing.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    pub spans: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
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
