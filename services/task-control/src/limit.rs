//! How many commands one sender may give: a token bucket per sender, refilled at
//! `chat.commands_per_minute` a minute and holding as many. A sender over the limit is told once
//! until a command is allowed again, so that a flood of commands never becomes a flood of
//! replies.
//!
//! Each task-control replica counts the commands it handles; with several replicas sharing the
//! chat consumer the limit holds per replica.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use hark_core::domain::Owner;

/// What to do with one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Refuse it, and say so: the first refusal since the sender's last allowed command.
    RefuseAndTell,
    /// Refuse it without a word: the sender was told already.
    RefuseQuietly,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    told: bool,
}

/// The buckets of every sender seen lately.
#[derive(Debug)]
pub struct CommandLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<Owner, Bucket>>,
}

/// Senders remembered at most; beyond it, those whose bucket refilled are forgotten (a full
/// bucket is what a new sender gets anyway).
const REMEMBERED: usize = 10_000;

impl CommandLimiter {
    /// `per_minute` commands a minute per sender; `0` allows everything.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Whether `sender` may give a command at `now`.
    pub fn check(&self, sender: &Owner, now: Instant) -> Verdict {
        if self.per_minute == 0 {
            return Verdict::Allow;
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= REMEMBERED && !buckets.contains_key(sender) {
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < capacity
            });
            // A flood of distinct senders within a minute: forgetting them all costs each at
            // most one more burst.
            if buckets.len() >= 2 * REMEMBERED {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(sender.clone()).or_insert(Bucket {
            tokens: capacity,
            at: now,
            told: false,
        });
        let elapsed = now.saturating_duration_since(bucket.at);
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * per_second).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            bucket.told = false;
            Verdict::Allow
        } else if bucket.told {
            Verdict::RefuseQuietly
        } else {
            bucket.told = true;
            Verdict::RefuseAndTell
        }
    }

    /// How long until `per_minute` allows one more command, for the refusal's text.
    pub fn wait_hint(&self) -> Duration {
        Duration::from_secs(60 / u64::from(self.per_minute.max(1)).min(60))
            .max(Duration::from_secs(1))
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(n: u32) -> Owner {
        format!("qq:{n}").parse().expect("owner")
    }

    #[test]
    fn a_burst_beyond_the_limit_is_refused_with_one_notice_then_refills() {
        let limiter = CommandLimiter::new(10);
        let start = Instant::now();
        let alice = owner(1);
        let verdicts: Vec<Verdict> = (0..2000).map(|_| limiter.check(&alice, start)).collect();
        assert_eq!(
            verdicts.iter().filter(|v| **v == Verdict::Allow).count(),
            10
        );
        assert_eq!(
            verdicts
                .iter()
                .filter(|v| **v == Verdict::RefuseAndTell)
                .count(),
            1,
            "one notice for the whole flood"
        );
        // Another sender is not affected.
        assert_eq!(limiter.check(&owner(2), start), Verdict::Allow);
        // Six seconds later one more command is allowed (10 a minute), and a new flood gets one
        // new notice.
        let later = start + Duration::from_secs(6);
        assert_eq!(limiter.check(&alice, later), Verdict::Allow);
        assert_eq!(limiter.check(&alice, later), Verdict::RefuseAndTell);
        assert_eq!(limiter.check(&alice, later), Verdict::RefuseQuietly);
        // A minute of quiet refills the whole burst.
        let much_later = later + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(limiter.check(&alice, much_later), Verdict::Allow);
        }
    }

    #[test]
    fn zero_means_no_limit_and_memory_stays_bounded() {
        let open = CommandLimiter::new(0);
        let now = Instant::now();
        assert!((0..1000).all(|_| open.check(&owner(1), now) == Verdict::Allow));
        let limiter = CommandLimiter::new(5);
        for n in 0..(REMEMBERED as u32 + 500) {
            limiter.check(&owner(n), now);
        }
        // Everyone above used one command; a minute later all buckets are full and forgotten.
        limiter.check(&owner(u32::MAX), now + Duration::from_secs(60));
        assert!(
            limiter.remembered() <= REMEMBERED,
            "{}",
            limiter.remembered()
        );
    }
}
