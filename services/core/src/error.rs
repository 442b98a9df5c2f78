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
    /// Deliver it again after a backoff.
    Retry,
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
