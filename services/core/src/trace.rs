//! W3C trace context (`traceparent`) carried in NATS headers and gRPC metadata, so that what one
//! request or chat message causes across the services shares one trace id in every log line.
//!
//! Each external stimulus — a gRPC call, a chat message, a timer firing — continues the trace its
//! caller sent or starts one. While a service handles it, the context is the task-local
//! [`current`] one (see [`scope`]); every message sent meanwhile carries a child of it (same trace
//! id, a new parent id), including the outbox rows written for later publishing.

use std::{fmt, future::Future};

use opentelemetry::{
    propagation::TextMapPropagator as _,
    trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId as OtelTraceId, TraceState,
    },
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header (and gRPC metadata key) that carries the context.
pub const HEADER: &str = "traceparent";

/// One `traceparent`: version 00, a trace id, the id of the sending span and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    parent_id: u64,
    flags: u8,
}

tokio::task_local! {
    static CURRENT: TraceContext;
}

impl TraceContext {
    /// A new trace, sampled.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero_u128(),
            parent_id: nonzero_u64(),
            flags: 1,
        }
    }

    /// The same trace, sent from a new span.
    pub fn child(&self) -> Self {
        Self {
            parent_id: nonzero_u64(),
            ..*self
        }
    }

    /// Parses a `traceparent` value, by the W3C TraceContext propagator of the OpenTelemetry
    /// SDK. Anything malformed, and all-zero ids, give `None`.
    pub fn parse(value: &str) -> Option<Self> {
        // The propagator reads ids of any length up to theirs; W3C fixes them.
        let mut fields = value.trim().split('-').skip(1);
        if fields.next()?.len() != 32 || fields.next()?.len() != 16 {
            return None;
        }
        let carrier =
            std::collections::HashMap::from([(HEADER.to_owned(), value.trim().to_owned())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        Self::of(context.span().span_context())
    }

    /// The context of an OpenTelemetry span, when it is a valid one.
    pub fn of(span: &SpanContext) -> Option<Self> {
        span.is_valid().then(|| Self {
            trace_id: u128::from_be_bytes(span.trace_id().to_bytes()),
            parent_id: u64::from_be_bytes(span.span_id().to_bytes()),
            flags: span.trace_flags().to_u8(),
        })
    }

    /// This context as the remote span it names.
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            OtelTraceId::from_bytes(self.trace_id.to_be_bytes()),
            SpanId::from_bytes(self.parent_id.to_be_bytes()),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        )
    }

    /// This context as the remote parent of a span.
    pub fn remote(&self) -> opentelemetry::Context {
        opentelemetry::Context::new().with_remote_span_context(self.span_context())
    }

    /// The trace id as 32 lowercase hex digits, as logs show it.
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

fn nonzero_u128() -> u128 {
    loop {
        let id = (u128::from(random_u64()) << 64) | u128::from(random_u64());
        if id != 0 {
            return id;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let id = random_u64();
        if id != 0 {
            return id;
        }
    }
}

/// Random ids without a system call each: a per-thread splitmix64 sequence seeded from the
/// operating system's randomness. Trace ids need to be unique, not secret.
fn random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(uuid::Uuid::new_v4().as_u64_pair().0);
    }
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// A trace id as logs show it, formatted only when a log line is written.
struct TraceId(u128);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The context of what this task is handling now, if any.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|c| *c).ok()
}

/// The `traceparent` to send with a message sent now. While traces are exported, the current
/// span's context through the propagator, so that the receiver's spans are its children;
/// otherwise a child of the current context.
pub fn outgoing() -> Option<String> {
    if crate::telemetry::exporting() {
        let mut carrier = std::collections::HashMap::new();
        let context = tracing::Span::current().context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut carrier)
        });
        if let Some(value) = carrier.remove(HEADER) {
            return Some(value);
        }
    }
    current().map(|c| c.child().to_string())
}

/// Runs `work` under `context` (a new trace when `None`), with every log line inside it
/// carrying the trace id and the span id. While traces are exported, the span is exported as the
/// child of `context`.
pub async fn scope<F: Future>(context: Option<TraceContext>, work: F) -> F::Output {
    scope_in(
        tracing::info_span!(
            "trace",
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty
        ),
        context,
        work,
    )
    .await
}

/// [`scope`] in a span of the caller's making (with `trace_id` and `span_id` fields left
/// empty), so that it can carry the attributes of what it handles.
pub async fn scope_in<F: Future>(
    span: tracing::Span,
    context: Option<TraceContext>,
    work: F,
) -> F::Output {
    let context = if crate::telemetry::exporting() {
        if let Some(remote) = context {
            let _ = span.set_parent(remote.remote());
        }
        // A new root's trace id is the one the span is exported with.
        TraceContext::of(span.context().span().span_context())
            .or(context)
            .unwrap_or_else(TraceContext::new_root)
    } else {
        context.unwrap_or_else(TraceContext::new_root)
    };
    span.record(
        "trace_id",
        tracing::field::display(TraceId(context.trace_id)),
    );
    // The exported span's own id; without export, the id this context's sender gave.
    let span_id = span.context().span().span_context().span_id();
    if span_id != SpanId::INVALID {
        span.record("span_id", tracing::field::display(span_id));
    } else {
        span.record(
            "span_id",
            tracing::field::display(format_args!("{:016x}", context.parent_id)),
        );
    }
    CURRENT.scope(context, work.instrument(span)).await
}

/// The span of handling one NATS message on `subject`, by the OpenTelemetry messaging
/// conventions; for [`scope_in`].
pub fn process_span(subject: &str) -> tracing::Span {
    tracing::info_span!(
        "process",
        otel.name = format!("process {subject}"),
        otel.kind = "consumer",
        messaging.system = "nats",
        messaging.destination.name = subject,
        messaging.operation.type = "process",
        trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
    )
}

/// The span of publishing one NATS message to `subject`, by the messaging conventions.
pub fn send_span(subject: &str) -> tracing::Span {
    tracing::info_span!(
        "send",
        otel.name = format!("send {subject}"),
        otel.kind = "producer",
        messaging.system = "nats",
        messaging.destination.name = subject,
        messaging.operation.type = "send",
    )
}

/// Makes `span` a child of `parent` (a message's stored context), while traces are exported.
pub fn set_parent(span: &tracing::Span, parent: Option<TraceContext>) {
    if crate::telemetry::exporting()
        && let Some(parent) = parent
    {
        let _ = span.set_parent(parent.remote());
    }
}

/// Links the current span to the span `context` names: the wait for a person is a link, not a
/// span held open for days.
pub fn link_current_to(context: TraceContext) {
    if crate::telemetry::exporting() {
        tracing::Span::current().add_link(context.span_context());
    }
}

/// The context a NATS message carries, if any.
pub fn from_headers(headers: Option<&async_nats::HeaderMap>) -> Option<TraceContext> {
    headers
        .and_then(|h| h.get(HEADER))
        .and_then(|v| TraceContext::parse(v.as_str()))
}

/// Adds the outgoing context, if there is a current one, to `headers`.
pub fn inject(headers: &mut async_nats::HeaderMap) {
    if let Some(value) = outgoing() {
        headers.insert(HEADER, value.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_w3c_example_round_trips() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(text).expect("valid");
        assert_eq!(context.to_string(), text);
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let context = TraceContext::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-next",
        )
        .expect("read");
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn a_child_keeps_the_trace_and_changes_the_parent() {
        let root = TraceContext::new_root();
        let child = root.child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.to_string(), root.to_string());
        assert_eq!(TraceContext::parse(&child.to_string()), Some(child));
    }

    #[tokio::test]
    async fn messages_sent_in_a_scope_carry_its_trace() {
        assert_eq!(outgoing(), None, "no context outside a scope");
        let root = TraceContext::new_root();
        let sent = scope(Some(root), async {
            let mut headers = async_nats::HeaderMap::new();
            inject(&mut headers);
            from_headers(Some(&headers))
        })
        .await
        .expect("a context was sent");
        assert_eq!(sent.trace_id(), root.trace_id());
        assert_ne!(sent, root);
        // Without a context to continue, a scope starts a trace of its own.
        let started = scope(None, async { current() }).await;
        assert!(started.is_some());
    }
}
