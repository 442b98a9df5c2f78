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

/// A Postgres URL with its password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The authority ends at the first `/`, `?` or `#`; credentials end at its last `@`.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    // A password may also come as a query parameter.
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
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
    }
}
