//! The one classification of what went wrong, chosen where an error is built.
//!
//! Every error a service can hand to someone else has a [`Kind`]. What the receiver does follows
//! from the kind through one mapping each: the gRPC status code (task-control's API), the
//! refusal a worker gets ([`Kind::refusal`] and back with [`Kind::of_refusal`]), and what a
//! JetStream consumer does with the message ([`Kind::settle`]). So a NUL byte in a request is
//! `Invalid` everywhere, and a database that is down is `Unavailable` everywhere.

use std::fmt;

use hark_proto::v1 as pb;

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The request itself is wrong: a malformed id, a field too long, data the database refuses.
    /// Sending it again changes nothing.
    Invalid,
    /// What the request names does not exist.
    NotFound,
    /// What the request names is in a state that does not allow this (a closed question, a task
    /// that moved on). Another request may succeed; this one will not.
    Conflict,
    /// What the request names ended for this caller for good: the task was cancelled, the run
    /// job is stale, the lease went to another worker.
    Gone,
    /// The caller may not do this.
    Forbidden,
    /// A limit was reached: too many active tasks, too many watchers.
    Exhausted,
    /// A dependency (Postgres, NATS, task-control) did not answer. Trying again later may work.
    Unavailable,
    /// An inconsistency in hark itself.
    Internal,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Invalid,
        Kind::NotFound,
        Kind::Conflict,
        Kind::Gone,
        Kind::Forbidden,
        Kind::Exhausted,
        Kind::Unavailable,
        Kind::Internal,
    ];

    /// Whether the same request, sent again later, may succeed.
    pub fn is_retryable(self) -> bool {
        self == Kind::Unavailable
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Invalid => "invalid",
            Kind::NotFound => "not_found",
            Kind::Conflict => "conflict",
            Kind::Gone => "gone",
            Kind::Forbidden => "forbidden",
            Kind::Exhausted => "exhausted",
            Kind::Unavailable => "unavailable",
            Kind::Internal => "internal",
        }
    }

    /// The refusal reason a worker is sent for an error of this kind. task-control sends the
    /// more precise `CANCELLED` and `LEASE_LOST` where it knows them; both are `Gone`.
    pub fn refusal(self) -> pb::RefusalReason {
        use pb::RefusalReason as R;
        match self {
            Kind::Invalid | Kind::Forbidden | Kind::Exhausted | Kind::Internal => R::Invalid,
            Kind::NotFound => R::NotFound,
            Kind::Conflict | Kind::Gone => R::StaleJob,
            Kind::Unavailable => R::Unavailable,
        }
    }

    /// The kind of a refusal a worker received.
    pub fn of_refusal(reason: pb::RefusalReason) -> Self {
        use pb::RefusalReason as R;
        match reason {
            R::LeaseLost | R::Cancelled | R::StaleJob => Kind::Gone,
            R::NotFound => Kind::NotFound,
            R::Invalid => Kind::Invalid,
            R::Unavailable => Kind::Unavailable,
            // A refusal without a reason comes from a newer or broken peer: do not retry it.
            R::Unspecified => Kind::Internal,
        }
    }

    /// The gRPC status code of an error of this kind: the one mapping every gRPC door uses.
    pub fn grpc_code(self) -> tonic::Code {
        use tonic::Code;
        match self {
            Kind::Invalid => Code::InvalidArgument,
            Kind::NotFound => Code::NotFound,
            Kind::Conflict | Kind::Gone => Code::FailedPrecondition,
            Kind::Forbidden => Code::PermissionDenied,
            Kind::Exhausted => Code::ResourceExhausted,
            Kind::Unavailable => Code::Unavailable,
            Kind::Internal => Code::Internal,
        }
    }

    /// The kind of a gRPC status a client received (or a door that speaks HTTP got from one
    /// that speaks gRPC).
    pub fn of_grpc(code: tonic::Code) -> Self {
        use tonic::Code;
        match code {
            Code::InvalidArgument | Code::OutOfRange => Kind::Invalid,
            Code::NotFound => Kind::NotFound,
            Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => Kind::Conflict,
            Code::PermissionDenied | Code::Unauthenticated => Kind::Forbidden,
            Code::ResourceExhausted => Kind::Exhausted,
            Code::Unavailable | Code::DeadlineExceeded => Kind::Unavailable,
            _ => Kind::Internal,
        }
    }

    /// The HTTP status of an error of this kind: the one mapping every HTTP door uses.
    pub fn http_status(self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            Kind::Invalid => StatusCode::BAD_REQUEST,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::Conflict => StatusCode::CONFLICT,
            Kind::Gone => StatusCode::GONE,
            Kind::Forbidden => StatusCode::FORBIDDEN,
            Kind::Exhausted => StatusCode::TOO_MANY_REQUESTS,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What a JetStream consumer does with a message whose handling failed this way: a retryable
    /// failure is delivered again later; anything else would fail the same way every time, so the
    /// message is dropped.
    pub fn settle(self) -> Settle {
        if self.is_retryable() {
            Settle::Retry
        } else {
            Settle::Drop
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to a JetStream message once it was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Handled: acknowledge it.
    Done,
    /// Handled, and the server confirms the ack before the handler goes on: for work that
    /// cannot be undone (a message sent into a chat), so that it is not done again.
    Confirmed,
    /// Deliver it again after a backoff ([`crate::bus::retry_delay`]).
    Retry,
    /// Deliver it again at once: it was not handled for a reason of this consumer's own (its
    /// bot went offline), not of the message's.
    Again,
    /// It can never be handled: terminate it, so it is not delivered again.
    Drop,
}

impl Settle {
    /// The settlement of a handling outcome.
    pub fn of(outcome: Result<(), Kind>) -> Self {
        match outcome {
            Ok(()) => Settle::Done,
            Err(kind) => kind.settle(),
        }
    }
}

/// An error that knows its kind.
pub trait Classified {
    fn kind(&self) -> Kind;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_keeps_its_kind_through_grpc_and_has_an_http_status_of_its_class() {
        for kind in Kind::ALL {
            let back = Kind::of_grpc(kind.grpc_code());
            // Gone and Conflict share FAILED_PRECONDITION: a client cannot tell them apart.
            let expected = if kind == Kind::Gone {
                Kind::Conflict
            } else {
                kind
            };
            assert_eq!(back, expected, "{kind}");
            let status = kind.http_status();
            assert_eq!(
                status.is_server_error(),
                matches!(kind, Kind::Unavailable | Kind::Internal),
                "{kind}: {status}"
            );
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{kind}"
            );
        }
    }

    #[test]
    fn only_unavailable_is_retried_and_every_kind_maps_both_ways() {
        for kind in Kind::ALL {
            assert_eq!(kind.is_retryable(), kind == Kind::Unavailable);
            assert_eq!(
                Settle::of(Err(kind)),
                if kind == Kind::Unavailable {
                    Settle::Retry
                } else {
                    Settle::Drop
                }
            );
            // A refusal sent for a kind is read back as a kind the worker treats the same way:
            // retried exactly when the original was retryable.
            let back = Kind::of_refusal(kind.refusal());
            assert_eq!(back.is_retryable(), kind.is_retryable(), "{kind}");
        }
        assert_eq!(Settle::of(Ok(())), Settle::Done);
        assert_eq!(Kind::of_refusal(pb::RefusalReason::Cancelled), Kind::Gone);
        assert_eq!(Kind::of_refusal(pb::RefusalReason::LeaseLost), Kind::Gone);
    }
}
