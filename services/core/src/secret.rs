//! Values that must never be printed: tokens, API keys, passwords.
//!
//! A [`Secret`] shows `[redacted]` in `Debug`, has no `Display`, and is read only through
//! [`Secret::expose`], so that a log line, an error or `hark config` cannot print one by
//! accident. It serializes as its value, because the configuration is merged as TOML; what is
//! printed for people goes through [`crate::config::Config::redacted`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a redacted secret shows instead of its value.
pub const REDACTED: &str = "[redacted]";

/// A string that is never printed.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that sends it where it belongs.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret as `hark config` shows it: empty stays empty (so "not set" is visible),
    /// anything else is [`REDACTED`].
    pub fn redacted(&self) -> Self {
        if self.0.is_empty() {
            Self::default()
        } else {
            Self(REDACTED.to_owned())
        }
    }

    /// Compares with `given` in time that does not depend on where they differ.
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str(REDACTED)
        }
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// A URL as messages and logs may show it: a password, a token in place of a user (as in
/// `nats://token@host`, anywhere but Postgres, whose bare user is only a name), and the values of
/// query parameters that look like credentials (`password`, `access_token`, `api_key`, `sig`, …)
/// replaced by `***`. A password holding `/`, `?`, `#` or `@` unencoded is still hidden whole:
/// credentials end at the URL's last `@`. A comma-separated list (`nats.url`) is redacted URL by
/// URL.
pub fn redact_url(url: &str) -> String {
    if url.contains(',') && url.split(',').skip(1).all(|part| part.contains("://")) {
        return url.split(',').map(redact_url).collect::<Vec<_>>().join(",");
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let bare_user_is_a_name = matches!(
        scheme.to_ascii_lowercase().as_str(),
        "postgres" | "postgresql"
    );
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((credentials, host)) => {
            let shown = match credentials.split_once(':') {
                Some((user, _password)) if !user.contains(['/', '?', '#']) => {
                    format!("{user}:***@")
                }
                None if bare_user_is_a_name && !credentials.contains(['/', '?', '#']) => {
                    format!("{credentials}@")
                }
                _ => "***@".to_owned(),
            };
            (shown, host)
        }
        None => (String::new(), rest),
    };
    let (path, fragment) = match rest.split_once('#') {
        Some((path, fragment)) => (path, format!("#{fragment}")),
        None => (rest, String::new()),
    };
    let tail = match path.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if credential_key(key) => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => path.to_owned(),
    };
    format!("{scheme}://{credentials}{tail}{fragment}")
}

/// Whether a query parameter named `key` carries a credential.
fn credential_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "token",
        "key",
        "secret",
        "auth",
        "sig",
        "credential",
    ]
    .iter()
    .any(|part| key.contains(part))
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): other processes of the same user, a
/// stdio MCP server this process started among them, can then neither read its
/// `/proc/<pid>/environ` or memory nor attach a debugger to it, and it leaves no core dump with
/// its secrets. Only a process with `CAP_SYS_PTRACE` (root, usually) still can. Elsewhere than
/// Linux it does nothing.
pub fn keep_from_other_processes() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .map_err(|e| format!("cannot make the process non-dumpable (PR_SET_DUMPABLE): {e}"))?;
    }
    Ok(())
}

/// Failed sign-ins counted per address, so that a token cannot be guessed at speed: an address
/// with [`Failures::ALLOWED`] failures within [`Failures::WINDOW`] is refused, token or not, until
/// that window is over. Shared by every clone; bounded, forgetting the oldest windows first.
#[derive(Debug, Clone, Default)]
pub struct Failures(
    std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
    >,
);

impl Failures {
    pub const ALLOWED: u32 = 20;
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
    /// The most addresses remembered at once.
    const REMEMBERED: usize = 65_536;

    /// Whether `peer` is refused now; `Some(seconds)` until it may try again.
    pub fn refused(&self, peer: std::net::IpAddr) -> Option<u64> {
        let failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (since, count) = failures.get(&Self::holder(peer))?;
        let left = Self::WINDOW.checked_sub(since.elapsed())?;
        (*count >= Self::ALLOWED).then(|| left.as_secs().max(1))
    }

    /// Counts a failed sign-in from `peer`.
    pub fn failed(&self, peer: std::net::IpAddr) {
        let peer = Self::holder(peer);
        let mut failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= Self::REMEMBERED {
            failures.retain(|_, (since, _)| since.elapsed() < Self::WINDOW);
            if failures.len() >= Self::REMEMBERED {
                failures.clear();
            }
        }
        let entry = failures
            .entry(peer)
            .or_insert((std::time::Instant::now(), 0));
        if entry.0.elapsed() >= Self::WINDOW {
            *entry = (std::time::Instant::now(), 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }

    /// Whom an address's failures are counted for: an IPv4 address, or the /64 an IPv6 one is
    /// in (one host commonly holds a whole /64, and would otherwise guess from a new address each
    /// time).
    fn holder(peer: std::net::IpAddr) -> std::net::IpAddr {
        match peer {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.into(),
                None => std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1)).into(),
            },
            v4 => v4,
        }
    }

    /// What a refused caller is told.
    pub fn message(seconds: u64) -> String {
        format!(
            "too many failed sign-ins from this address; try again in {seconds}s with the right token"
        )
    }
}

/// An axum middleware that refuses an address with too many failed sign-ins (`429`) and counts
/// every `401` it answers as one. It reads the peer from `ConnectInfo<SocketAddr>`: serve the
/// router with `into_make_service_with_connect_info`.
pub async fn throttle(
    axum::extract::State(failures): axum::extract::State<Failures>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip());
    if let Some(seconds) = peer.and_then(|peer| failures.refused(peer)) {
        return (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, seconds.to_string())],
            Failures::message(seconds),
        )
            .into_response();
    }
    let response = next.run(request).await;
    if let Some(peer) = peer
        && response.status() == axum::http::StatusCode::UNAUTHORIZED
    {
        failures.failed(peer);
    }
    response
}

/// The token of an `Authorization: Bearer <token>` header, the scheme in any case.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_shown_by_debug() {
        let secret = Secret::new("sk-very-secret");
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(
            format!("{:?}", Some(secret.clone())),
            format!("Some({REDACTED})")
        );
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        assert_eq!(secret.expose(), "sk-very-secret");
        assert_eq!(secret.redacted().expose(), REDACTED);
        assert!(Secret::default().redacted().is_empty());
        assert!(secret.matches("sk-very-secret"));
        assert!(!secret.matches("sk-very-secreT"));
        assert!(!secret.matches("sk"));
    }

    #[test]
    fn a_url_keeps_everything_but_its_password() {
        assert_eq!(
            redact_url("postgres://postgres:TopSecret@db.example:5432/hark"),
            "postgres://postgres:***@db.example:5432/hark"
        );
        assert_eq!(
            redact_url("postgres://u:p%40ss@h/d?sslmode=require&password=again"),
            "postgres://u:***@h/d?sslmode=require&password=***"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/hark"),
            "postgres://postgres@127.0.0.1:5432/hark"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(
            redact_url("postgres://h/d?password=x"),
            "postgres://h/d?password=***"
        );
        // An `@` in the password does not leak its first part.
        assert_eq!(redact_url("postgres://u:a@b@h/d"), "postgres://u:***@h/d");
        // Nor do `/`, `?` and `#` left unencoded.
        assert_eq!(redact_url("postgres://u:a/b@h/d"), "postgres://u:***@h/d");
        assert_eq!(redact_url("postgres://u:a?b@h/d"), "postgres://u:***@h/d");
        assert_eq!(redact_url("postgres://u:a#b@h/d"), "postgres://u:***@h/d");
        assert_eq!(
            redact_url("postgres://u:/?#@h:5/d"),
            "postgres://u:***@h:5/d"
        );
    }

    #[test]
    fn an_address_that_keeps_failing_is_refused_and_others_are_not() {
        let failures = Failures::default();
        let (guesser, other): (std::net::IpAddr, std::net::IpAddr) = (
            "192.0.2.1".parse().expect("ip"),
            "192.0.2.2".parse().expect("ip"),
        );
        for _ in 0..Failures::ALLOWED - 1 {
            failures.failed(guesser);
        }
        assert_eq!(failures.refused(guesser), None, "below the bound");
        failures.failed(guesser);
        let wait = failures.refused(guesser).expect("refused at the bound");
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!(failures.refused(other), None);
        // IPv6: counted per /64.
        let here: std::net::IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        for n in 0..Failures::ALLOWED {
            failures.failed(format!("2001:db8:1:2::{:x}", n + 2).parse().expect("ip"));
        }
        assert!(failures.refused(here).is_some(), "the same /64");
        assert_eq!(
            failures.refused("2001:db8:1:3::1".parse().expect("ip")),
            None
        );
    }

    #[test]
    fn every_url_form_that_carries_a_credential_is_redacted() {
        let cases = [
            // NATS: a token as the user, a user and password.
            ("nats://s3cr3t@nats:4222", "nats://***@nats:4222"),
            ("nats://u:s3cr3t@nats:4222", "nats://u:***@nats:4222"),
            (
                "nats://s3cr3t@a:4222,nats://b:4222",
                "nats://***@a:4222,nats://b:4222",
            ),
            (
                "nats://a:4222,nats://s3cr3t@b:4222",
                "nats://a:4222,nats://***@b:4222",
            ),
            // Webhooks, OTLP and the LLM: credentials in the authority or the query.
            (
                "https://hooks.example/in?token=s3cr3t&chat=1",
                "https://hooks.example/in?token=***&chat=1",
            ),
            ("http://u:s3cr3t@otel:4317", "http://u:***@otel:4317"),
            (
                "https://llm.example/v1?key=s3cr3t",
                "https://llm.example/v1?key=***",
            ),
            (
                "https://llm.example/v1?api_key=s3cr3t#x",
                "https://llm.example/v1?api_key=***#x",
            ),
            // A forward OneBot server, with the token in the query as NapCat takes it.
            (
                "ws://napcat:3001/?access_token=s3cr3t",
                "ws://napcat:3001/?access_token=***",
            ),
            (
                "wss://napcat:3001?Access_Token=s3cr3t",
                "wss://napcat:3001?Access_Token=***",
            ),
            ("ws://s3cr3t@napcat:3001", "ws://***@napcat:3001"),
            (
                "https://a%40b:s3cr3t@h/x?sig=s3cr3t",
                "https://a%40b:***@h/x?sig=***",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("s3cr3t"), "{url}");
        }
        // What carries no credential is kept as it is.
        for url in [
            "http://127.0.0.1:8080/hook?chat=1",
            "nats://127.0.0.1:4222",
            "postgres://postgres@127.0.0.1:5432/hark",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}
