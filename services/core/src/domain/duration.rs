//! Durations as people write them: `90s`, `30m`, `2h`, `1h30m`, `500ms`, `0`.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How far ahead a task may be scheduled (`--in`, `--at`, `start_at`): ten years.
pub const MAX_AHEAD: Duration = Duration::from_secs(10 * 365 * 86_400);
/// The longest a question may wait for its answer (`--timeout`, `ask_timeout_s`, `timeout_s`):
/// a year and a day.
pub const MAX_QUESTION_WAIT: Duration = Duration::from_secs(366 * 86_400);

/// `duration` when it is at most `max`; otherwise a sentence saying what the limit is.
pub fn at_most(duration: Duration, max: Duration) -> Result<Duration, String> {
    if duration <= max {
        Ok(duration)
    } else {
        Err(format!(
            "{} is longer than the limit of {}",
            HumanDuration(duration),
            HumanDuration(max)
        ))
    }
}

/// A [`Duration`] that parses from and prints as `1h30m`-style text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a duration: expected a number with a unit, e.g. 90s, 30m, 2h or 1h30m")]
pub struct DurationError {
    input: String,
}

impl HumanDuration {
    pub const ZERO: Self = Self(Duration::ZERO);

    pub fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl FromStr for HumanDuration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = || DurationError {
            input: super::ids::shown(input),
        };
        let text = input.trim();
        if text == "0" {
            return Ok(Self::ZERO);
        }
        if text.is_empty() {
            return Err(err());
        }
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(err());
            }
            let value: u64 = rest[..digits].parse().map_err(|_| err())?;
            rest = &rest[digits..];
            let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let part = match &rest[..unit_len] {
                "ms" => Duration::from_millis(value),
                "s" => Duration::from_secs(value),
                "m" => Duration::from_secs(value.checked_mul(60).ok_or_else(err)?),
                "h" => Duration::from_secs(value.checked_mul(3600).ok_or_else(err)?),
                "d" => Duration::from_secs(value.checked_mul(86_400).ok_or_else(err)?),
                _ => return Err(err()),
            };
            rest = &rest[unit_len..];
            total = total.checked_add(part).ok_or_else(err)?;
        }
        Ok(Self(total))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        if d.subsec_millis() != 0 {
            return write!(f, "{}ms", d.as_millis());
        }
        let mut secs = d.as_secs();
        for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
            if secs >= size {
                write!(f, "{}{unit}", secs / size)?;
                secs %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_people_write_parse() {
        let cases = [
            ("90s", 90),
            ("30m", 1800),
            ("2h", 7200),
            ("1h30m", 5400),
            ("1d", 86_400),
            ("0", 0),
        ];
        for (text, secs) in cases {
            assert_eq!(
                text.parse::<HumanDuration>(),
                Ok(HumanDuration::from_secs(secs)),
                "{text}"
            );
        }
        assert_eq!(
            "250ms".parse::<HumanDuration>(),
            Ok(HumanDuration(Duration::from_millis(250)))
        );
    }

    #[test]
    fn text_without_a_known_unit_is_refused() {
        for text in [
            "",
            "10",
            "m",
            "10x",
            "1h 30m",
            "-5s",
            "99999999999999999999d",
        ] {
            assert!(text.parse::<HumanDuration>().is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["1h30m", "10m", "90s", "0s", "1d2h3m4s", "250ms"] {
            let parsed: HumanDuration = text.parse().expect(text);
            let shown = parsed.to_string();
            assert_eq!(
                shown.parse::<HumanDuration>(),
                Ok(parsed),
                "{text} shown as {shown}"
            );
        }
        assert_eq!(HumanDuration::from_secs(5400).to_string(), "1h30m");
    }
}
