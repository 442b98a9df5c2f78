//! Starting while a dependency is away. A role that starts before Postgres or NATS answers (after
//! an outage, or while a cluster comes up) does not exit, which under Kubernetes would mean
//! crash-loop back-off: it waits, tries again with capped backoff, and says each time what it
//! waits for and why.

use std::{fmt::Display, future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds; `None` once `shutdown` fires first. `what` names the
/// dependency and its config key, e.g. `Postgres at database.url = postgres://…`.
pub async fn wait_for<T, E, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pause = FIRST_PAUSE;
    let mut failures = 0u32;
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return None,
            result = attempt() => result,
        };
        match result {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(what, failures, "{what} answers now");
                }
                return Some(value);
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(
                    what,
                    error = %e,
                    retry_in_s = pause.as_secs(),
                    "waiting for {what}: {e}"
                );
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tries_again_with_capped_backoff_until_it_works_or_shutdown() {
        let shutdown = CancellationToken::new();
        let mut tries = 0;
        let started = tokio::time::Instant::now();
        let got = wait_for("a thing", &shutdown, || {
            tries += 1;
            let now = tries;
            async move {
                if now < 8 {
                    Err(format!("not yet ({now})"))
                } else {
                    Ok(now)
                }
            }
        })
        .await;
        assert_eq!(got, Some(8));
        // 1 + 2 + 4 + 8 + 16 + 30 + 30 seconds of pauses before the eighth try.
        assert_eq!(started.elapsed(), Duration::from_secs(91));

        shutdown.cancel();
        let never: Option<()> = wait_for("nothing", &shutdown, || async { Err("down") }).await;
        assert_eq!(never, None);
    }
}
