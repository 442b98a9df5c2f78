//! Crash points for tests that kill a process at an exact instant.
//!
//! `HARK_FAILPOINT=<name>` makes the process abort when it reaches [`hit`] with that name, as a
//! `kill -9` would at that point: no destructors, no flushing, no graceful shutdown.
//! `HARK_FAILPOINT=<name>:<n>` aborts the `n`-th time it is reached, so that a test can let the
//! first passes through go by.

use std::sync::{
    OnceLock,
    atomic::{AtomicU64, Ordering},
};

fn armed() -> Option<&'static (String, u64)> {
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var("HARK_FAILPOINT")
                .ok()
                .filter(|s| !s.is_empty())?;
            Some(match value.rsplit_once(':') {
                Some((name, n)) if n.parse::<u64>().is_ok() => {
                    (name.to_owned(), n.parse().unwrap_or(1))
                }
                _ => (value, 1),
            })
        })
        .as_ref()
}

/// Aborts the process if the failpoint `name` is armed and this is the time it fires.
pub fn hit(name: &str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((armed, at)) = armed()
        && armed == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *at
    {
        eprintln!("hark: failpoint {name} reached; aborting");
        std::process::abort();
    }
}
