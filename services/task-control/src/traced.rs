//! The gRPC side of trace context: each call runs in the trace its `traceparent` metadata names
//! (a new one when it names none), so that what the call causes — run jobs, chat messages, the
//! worker's steps — carries that trace across the bus.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use hark_core::trace::{self, TraceContext};
use tonic::codegen::http;

/// Wraps every gRPC service of the server in [`Traced`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

impl<S> tower_layer::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner }
    }
}

/// A gRPC service whose calls run in their caller's trace.
#[derive(Debug, Clone)]
pub struct Traced<S> {
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for Traced<S>
where
    S: tower_service::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let context = request
            .headers()
            .get(trace::HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceContext::parse);
        // `/hark.v1.TaskService/CreateTask`: the service and the method, by the RPC conventions.
        let path = request.uri().path().trim_start_matches('/');
        let (service, method) = path.split_once('/').unwrap_or((path, ""));
        let span = tracing::info_span!(
            "grpc",
            otel.name = path,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        Box::pin(trace::scope_in(span, context, self.inner.call(request)))
    }
}
