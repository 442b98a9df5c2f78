//! When scheduled tasks run: a cron expression of five fields (minute, hour, day of month, month,
//! day of week) read in a time zone, or one moment. Pure: the next run after a moment is
//! computed, never waited for.

use std::{fmt, str::FromStr};

use jiff::{civil, tz::TimeZone};
use time::OffsetDateTime;

/// Why a schedule could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "`{0}` is not a cron expression: give five fields (minute hour day-of-month month day-of-week), e.g. \"0 9 * * 1-5\""
    )]
    Fields(String),
    #[error("cron field {field} `{value}`: {why}")]
    Field {
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("`{0}` is not a time zone: give an IANA name such as Asia/Shanghai or UTC")]
    TimeZone(String),
    #[error("`{0}` is not a date and time: give one such as 2026-12-24T09:00")]
    At(String),
    #[error("the cron expression `{0}` never runs")]
    Never(String),
}

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    text: String,
    minutes: u64,
    hours: u32,
    /// Bit `d - 1` for day `d`.
    days: u32,
    /// Bit `m - 1` for month `m`.
    months: u16,
    /// Bit 0 for Sunday.
    weekdays: u8,
    /// Whether the day of month / day of week field begins with `*` (`*`, `*/2`). As in Vixie
    /// cron, a day must then match both fields; when neither does, it must match either one.
    any_day: bool,
    any_weekday: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Reads one field into a bit set of the values `min..=max`.
fn field(
    name: &'static str,
    text: &str,
    min: u32,
    max: u32,
    names: &[&str],
) -> Result<u64, ScheduleError> {
    let bad = |why: String| ScheduleError::Field {
        field: name,
        value: super::ids::shown(text),
        why,
    };
    let value = |s: &str| -> Result<u32, ScheduleError> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            return Ok(min + i as u32);
        }
        let n: u32 = s
            .parse()
            .map_err(|_| bad(format!("`{}` is not a number", super::ids::shown(s))))?;
        if n < min || n > max {
            return Err(bad(format!("{n} is outside {min}-{max}")));
        }
        Ok(n)
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 =
                    step.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                        bad(format!("the step `{step}` is not a positive number"))
                    })?;
                (range, step)
            }
            None => (part, 1),
        };
        let (from, to) = match range {
            "*" => (min, max),
            _ => match range.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                None if step > 1 => (value(range)?, max),
                None => {
                    let v = value(range)?;
                    (v, v)
                }
            },
        };
        if from > to {
            return Err(bad(format!("the range {from}-{to} runs backwards")));
        }
        let mut v = from;
        while v <= to {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

/// The day-of-week field as a bit set with bit 0 for Sunday, which may be written 0 or 7
/// (`5-7` is Friday to Sunday).
fn weekdays(text: &str) -> Result<u8, ScheduleError> {
    let set = field("day-of-week", text, 0, 7, &WEEKDAYS)?;
    Ok(((set | set >> 7) & 0x7f) as u8)
}

impl FromStr for Cron {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fields: Vec<&str> = s.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(ScheduleError::Fields(super::ids::shown(s)));
        };
        let cron = Cron {
            text: fields.join(" "),
            minutes: field("minute", minute, 0, 59, &[])?,
            hours: field("hour", hour, 0, 23, &[])? as u32,
            days: (field("day-of-month", day, 1, 31, &[])? >> 1) as u32,
            months: (field("month", month, 1, 12, &MONTHS)? >> 1) as u16,
            weekdays: weekdays(weekday)?,
            any_day: day.starts_with('*'),
            any_weekday: weekday.starts_with('*'),
        };
        // 31 February and the like: a day that never comes.
        if cron
            .next_after(OffsetDateTime::UNIX_EPOCH, &TimeZone::UTC)
            .is_none()
        {
            return Err(ScheduleError::Never(cron.text));
        }
        Ok(cron)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Cron {
    fn day_matches(&self, date: civil::Date) -> bool {
        let dom = self.days & (1 << (date.day() as u32 - 1)) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.any_day || self.any_weekday {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first moment after `after` that the expression names, read in `tz`; `None` when there
    /// is none within eight years.
    pub fn next_after(&self, after: OffsetDateTime, tz: &TimeZone) -> Option<OffsetDateTime> {
        let after = jiff::Timestamp::from_second(after.unix_timestamp()).ok()?;
        let start = after.to_zoned(tz.clone()).datetime();
        let mut date = start.date();
        for _ in 0..(366 * 8) {
            if self.months & (1 << (date.month() as u32 - 1)) != 0 && self.day_matches(date) {
                for hour in 0..24i8 {
                    if self.hours & (1 << hour) == 0 {
                        continue;
                    }
                    for minute in 0..60i8 {
                        if self.minutes & (1 << minute) == 0 {
                            continue;
                        }
                        let civil = date.at(hour, minute, 0, 0);
                        if civil <= start {
                            continue;
                        }
                        // A time a clock change skips runs at the first moment after the gap.
                        let Ok(zoned) = tz.to_ambiguous_zoned(civil).compatible() else {
                            continue;
                        };
                        let at = zoned.timestamp();
                        if at > after {
                            return OffsetDateTime::from_unix_timestamp(at.as_second()).ok();
                        }
                    }
                }
            }
            date = date.tomorrow().ok()?;
        }
        None
    }
}

/// The time zone named `name` (an IANA name).
pub fn time_zone(name: &str) -> Result<TimeZone, ScheduleError> {
    TimeZone::get(name).map_err(|_| ScheduleError::TimeZone(super::ids::shown(name)))
}

/// `text` (`2026-12-24T09:00`, seconds optional, a space for the `T` allowed) as a moment in `tz`.
pub fn at(text: &str, tz: &TimeZone) -> Result<OffsetDateTime, ScheduleError> {
    let bad = || ScheduleError::At(super::ids::shown(text));
    let civil: civil::DateTime = text
        .trim()
        .replacen(' ', "T", 1)
        .parse()
        .map_err(|_| bad())?;
    let zoned = tz
        .to_ambiguous_zoned(civil)
        .compatible()
        .map_err(|_| bad())?;
    OffsetDateTime::from_unix_timestamp(zoned.timestamp().as_second()).map_err(|_| bad())
}

/// `at` as a first run, when it is no more than [`super::duration::MAX_AHEAD`] after `now`;
/// otherwise a sentence saying so, with `at` in `tz`.
pub fn within_reach(
    at: OffsetDateTime,
    now: OffsetDateTime,
    tz: &TimeZone,
) -> Result<OffsetDateTime, String> {
    let max = super::duration::MAX_AHEAD;
    if at - now > max {
        Err(format!(
            "{} is more than {} ahead",
            shown(at, tz),
            super::HumanDuration(max)
        ))
    } else {
        Ok(at)
    }
}

/// `at` as people in `tz` read it: `2026-12-24 09:00`.
pub fn shown(at: OffsetDateTime, tz: &TimeZone) -> String {
    match jiff::Timestamp::from_second(at.unix_timestamp()) {
        Ok(ts) => ts
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%d %H:%M")
            .to_string(),
        Err(_) => at.to_string(),
    }
}

/// `at` as people in the zone named `zone` read it, with UTC for a name that is not a zone.
pub fn shown_in(at: OffsetDateTime, zone: &str) -> String {
    shown(at, &time_zone(zone).unwrap_or(TimeZone::UTC))
}

/// Where a schedule stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleState {
    /// It runs at its next run time.
    Active,
    /// A one-off that ran.
    Done,
    Cancelled,
}

impl ScheduleState {
    pub const ALL: [ScheduleState; 3] = [
        ScheduleState::Active,
        ScheduleState::Done,
        ScheduleState::Cancelled,
    ];

    /// The name stored in Postgres and shown to people.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleState::Active => "active",
            ScheduleState::Done => "done",
            ScheduleState::Cancelled => "cancelled",
        }
    }
}

/// What a run does while the task of the run before has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Overlap {
    /// Skip the run.
    #[default]
    Skip,
    /// Start it anyway.
    Allow,
}

impl Overlap {
    pub const ALL: [Overlap; 2] = [Overlap::Skip, Overlap::Allow];

    /// The name stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

/// A stored name that is not one of a schedule's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not one of {1}")]
pub struct UnknownName(pub String, pub &'static str);

macro_rules! named {
    ($($ty:ty => $names:literal),* $(,)?) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownName(super::ids::shown(s), $names))
            }
        }

        impl TryFrom<String> for $ty {
            type Error = UnknownName;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }
    )*};
}

named!(
    ScheduleState => "active, done, cancelled",
    Overlap => "skip, allow",
);

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> OffsetDateTime {
        at(text, &TimeZone::UTC).expect("moment")
    }

    fn next(cron: &str, after: &str, tz: &str) -> String {
        let tz = time_zone(tz).expect("zone");
        let cron: Cron = cron.parse().expect("cron");
        shown(
            cron.next_after(at(after, &tz).expect("after"), &tz)
                .expect("next"),
            &tz,
        )
    }

    #[test]
    fn weekday_mornings_in_shanghai() {
        // 2026-12-04 is a Friday.
        assert_eq!(
            next("0 9 * * 1-5", "2026-12-04T08:59", "Asia/Shanghai"),
            "2026-12-04 09:00"
        );
        assert_eq!(
            next("0 9 * * 1-5", "2026-12-04T09:00", "Asia/Shanghai"),
            "2026-12-07 09:00"
        );
        assert_eq!(
            next("0 9 * * MON-FRI", "2026-12-05T12:00", "Asia/Shanghai"),
            "2026-12-07 09:00"
        );
        // Read in the zone, not in UTC: 09:00 in Shanghai is 01:00 UTC.
        let tz = time_zone("Asia/Shanghai").unwrap();
        let cron: Cron = "0 9 * * *".parse().unwrap();
        let run = cron.next_after(utc("2026-12-04T00:00"), &tz).unwrap();
        assert_eq!(run, utc("2026-12-04T01:00"));
    }

    #[test]
    fn steps_lists_and_ranges() {
        assert_eq!(
            next("*/15 * * * *", "2026-01-01T10:07", "UTC"),
            "2026-01-01 10:15"
        );
        assert_eq!(
            next("5,35 8-9 * * *", "2026-01-01T08:36", "UTC"),
            "2026-01-01 09:05"
        );
        assert_eq!(
            next("0 0 1 */3 *", "2026-02-10T00:00", "UTC"),
            "2026-04-01 00:00"
        );
        assert_eq!(
            next("0 12 * * 0", "2026-12-01T00:00", "UTC"),
            "2026-12-06 12:00"
        );
        assert_eq!(
            next("0 12 * * 7", "2026-12-01T00:00", "UTC"),
            "2026-12-06 12:00"
        );
    }

    #[test]
    fn a_restricted_day_of_month_or_of_week_either_runs() {
        // The 1st, or any Monday: cron's rule when both fields are given.
        assert_eq!(
            next("0 0 1 * 1", "2026-12-01T00:00", "UTC"),
            "2026-12-07 00:00"
        );
        assert_eq!(
            next("0 0 1 * 1", "2026-12-29T00:00", "UTC"),
            "2027-01-01 00:00"
        );
    }

    #[test]
    fn sunday_is_seven_at_the_end_of_a_range() {
        // crontab(5): 0 or 7 is Sunday. Friday to Sunday, from Saturday 2026-12-05.
        assert_eq!(
            next("0 9 * * 5-7", "2026-12-05T10:00", "UTC"),
            "2026-12-06 09:00"
        );
        assert_eq!(
            next("0 9 * * 5-7", "2026-12-06T10:00", "UTC"),
            "2026-12-11 09:00"
        );
        assert_eq!(
            next("0 9 * * 6-7/1", "2026-12-06T10:00", "UTC"),
            "2026-12-12 09:00"
        );
        assert_eq!(
            next("0 9 * * sat,7", "2026-12-06T10:00", "UTC"),
            "2026-12-12 09:00"
        );
        let err = "0 9 * * 7-5".parse::<Cron>().unwrap_err().to_string();
        assert!(err.contains("backwards"), "{err}");
    }

    #[test]
    fn a_day_field_that_begins_with_a_star_must_match_too() {
        // crontab(5): the two day fields are ORed only when neither begins with `*`. `*/2` in
        // the day of month with Monday: odd days that are Mondays (December 2026's Mondays are
        // the 7th, 14th, 21st and 28th).
        assert_eq!(
            next("0 0 */2 * 1", "2026-12-01T00:00", "UTC"),
            "2026-12-07 00:00"
        );
        assert_eq!(
            next("0 0 */2 * 1", "2026-12-08T00:00", "UTC"),
            "2026-12-21 00:00"
        );
        // And the same the other way round: the 1st when it is a Sunday, Tuesday, Thursday or
        // Saturday (2026-12-01 is a Tuesday; January's is a Friday, 2027-04-01 a Thursday).
        assert_eq!(
            next("0 0 1 * */2", "2026-11-30T00:00", "UTC"),
            "2026-12-01 00:00"
        );
        assert_eq!(
            next("0 0 1 * */2", "2026-12-02T00:00", "UTC"),
            "2027-04-01 00:00"
        );
        // `*/2` alone: odd days.
        assert_eq!(
            next("0 0 */2 * *", "2026-12-01T00:00", "UTC"),
            "2026-12-03 00:00"
        );
    }

    #[test]
    fn a_time_a_clock_change_skips_runs_once_after_it() {
        // New York springs forward at 02:00 on 2026-03-08: 02:30 does not exist that day.
        assert_eq!(
            next("30 2 * * *", "2026-03-07T03:00", "America/New_York"),
            "2026-03-08 03:30"
        );
        assert_eq!(
            next("30 2 * * *", "2026-03-08T04:00", "America/New_York"),
            "2026-03-09 02:30"
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Cron>().unwrap_err().to_string();
        assert!(err("0 9 * *").contains("five fields"));
        assert!(err("61 * * * *").contains("minute `61`: 61 is outside 0-59"));
        assert!(err("0 9 * * FUN").contains("day-of-week"));
        assert!(err("*/0 * * * *").contains("step"));
        assert!(err("0 0 31 2 *").contains("never runs"));
        assert!(err("0 0 5-1 * *").contains("backwards"));
        assert!(
            time_zone("Mars/Olympus")
                .unwrap_err()
                .to_string()
                .contains("IANA")
        );
        assert!(
            at("tomorrow", &TimeZone::UTC)
                .unwrap_err()
                .to_string()
                .contains("2026-12-24T09:00")
        );
        assert_eq!(
            shown(
                at("2026-12-24 09:00", &TimeZone::UTC).unwrap(),
                &TimeZone::UTC
            ),
            "2026-12-24 09:00"
        );
    }
}
