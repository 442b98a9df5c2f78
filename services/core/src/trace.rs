//! W3C trace context (`traceparent`) carried in NATS headers and gRPC metadata, so that what one
//! request or chat message causes across the services shares one trace id in every log line.
//!
//! Each external stimulus — a gRPC call, a chat message, a timer firing — continues the trace its
//! caller sent or starts one. While a service handles it, the context is the task-local
//! [`current`] one (see [`scope`]); every message sent meanwhile carries a child of it (same trace
//! id, a new parent id), including the outbox rows written for later publishing.

use std::{fmt, future::Future};

use tracing::Instrument as _;

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

    /// Parses a `traceparent` value. Versions other than 00 are read by their 00 fields, as the
    /// W3C recommendation asks; anything malformed, and all-zero ids, give `None`.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.splitn(5, '-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let parent = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        let lower_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
            return None;
        }
        if !(lower_hex(trace, 32) && lower_hex(parent, 16) && lower_hex(flags, 2)) {
            return None;
        }
        let context = Self {
            trace_id: u128::from_str_radix(trace, 16).ok()?,
            parent_id: u64::from_str_radix(parent, 16).ok()?,
            flags: u8::from_str_radix(flags, 16).ok()?,
        };
        (context.trace_id != 0 && context.parent_id != 0).then_some(context)
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

/// The `traceparent` to send with a message sent now: a child of the current context.
pub fn outgoing() -> Option<String> {
    current().map(|c| c.child().to_string())
}

/// Runs `work` under `context` (a new trace when `None`), with every log line inside it carrying
/// the trace id.
pub async fn scope<F: Future>(context: Option<TraceContext>, work: F) -> F::Output {
    let context = context.unwrap_or_else(TraceContext::new_root);
    let span = tracing::info_span!("trace", trace_id = %TraceId(context.trace_id));
    CURRENT.scope(context, work.instrument(span)).await
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
