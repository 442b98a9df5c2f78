//! Starting while a dependency is away. A role that starts before Postgres or NATS answers (after
//! an outage, or while a cluster comes up) does not exit, which under Kubernetes would mean
//! crash-loop back-off: it waits, tries again with capped backoff, and says what it waits for and
//! why (once per cause, then again only when the cause changes). A dependency that answers and
//! refuses for good (wrong credentials, JetStream off, not Postgres at that port) is no outage:
//! that error is returned at once, to stop with.

use std::{fmt::Display, future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Whether an error will happen again however long one waits: the caller's to fix, not an outage.
pub trait Permanent {
    fn permanent(&self) -> bool;
}

/// Runs `attempt` until it succeeds; `Ok(None)` once `shutdown` fires first, `Err` at once when
/// it fails for good. `what` names the dependency and its config key, e.g. `Postgres at
/// database.url = postgres://…`.
pub async fn wait_for<T, E, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Result<Option<T>, E>
where
    E: Display + Permanent,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pause = FIRST_PAUSE;
    let mut failures = 0u32;
    let mut last_said = String::new();
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            result = attempt() => result,
        };
        match result {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(what, failures, "{what} answers now");
                }
                return Ok(Some(value));
            }
            Err(e) if e.permanent() => return Err(e),
            Err(e) => {
                failures += 1;
                let said = e.to_string();
                if said != last_said {
                    tracing::warn!(
                        what,
                        retry_in_s = pause.as_secs(),
                        "waiting for {what}: {said}"
                    );
                } else {
                    tracing::debug!(what, failures, "still waiting for {what}: {said}");
                }
                last_said = said;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure of a test's dependency: for good when `for_good`.
    #[derive(Debug, PartialEq)]
    struct Failed {
        text: String,
        for_good: bool,
    }

    impl Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.text)
        }
    }

    impl Permanent for Failed {
        fn permanent(&self) -> bool {
            self.for_good
        }
    }

    fn down(text: String) -> Failed {
        Failed {
            text,
            for_good: false,
        }
    }

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
                    Err(down(format!("not yet ({now})")))
                } else {
                    Ok(now)
                }
            }
        })
        .await;
        assert_eq!(got, Ok(Some(8)));
        // 1 + 2 + 4 + 8 + 16 + 30 + 30 seconds of pauses before the eighth try.
        assert_eq!(started.elapsed(), Duration::from_secs(91));

        shutdown.cancel();
        let never: Result<Option<()>, Failed> =
            wait_for("nothing", &shutdown, || async { Err(down("down".into())) }).await;
        assert_eq!(never, Ok(None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_for_good_is_returned_at_once() {
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let got: Result<Option<()>, Failed> = wait_for("a thing", &shutdown, || async {
            Err(Failed {
                text: "password authentication failed".into(),
                for_good: true,
            })
        })
        .await;
        assert!(got.is_err_and(|e| e.text.contains("password")));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
