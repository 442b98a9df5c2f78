//! Crash points for tests that kill a process at an exact instant.
//!
//! `HARK_FAILPOINT=<name>` makes the process abort when it reaches [`hit`] with that name, as a
//! `kill -9` would at that point: no destructors, no flushing, no graceful shutdown.

use std::sync::OnceLock;

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            std::env::var("HARK_FAILPOINT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Aborts the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    if armed() == Some(name) {
        eprintln!("hark: failpoint {name} reached; aborting");
        std::process::abort();
    }
}
