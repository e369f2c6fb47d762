//! Event time (SPEC §3): milliseconds since the Unix epoch, parsed from RFC 3339 and written
//! `YYYY-MM-DDTHH:MM:SSZ` (with `.fff` only when sub-second). No stage reads the OS clock.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub fn parse(text: &str) -> Option<Timestamp> {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|time| Timestamp(time.with_timezone(&Utc).timestamp_millis()))
    }

    pub fn from_millis(millis: i64) -> Timestamp {
        Timestamp(millis)
    }

    pub fn millis(self) -> i64 {
        self.0
    }

    /// `self + seconds`, saturating (configuration durations are bounded at load).
    pub fn plus_seconds(self, seconds: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(seconds.saturating_mul(1000)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(time) if self.0 % 1000 == 0 => {
                write!(
                    formatter,
                    "{}",
                    time.to_rfc3339_opts(SecondsFormat::Secs, true)
                )
            }
            Some(time) => write!(
                formatter,
                "{}",
                time.to_rfc3339_opts(SecondsFormat::Millis, true)
            ),
            None => write!(formatter, "invalid-time({})", self.0),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not an RFC 3339 time")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_whole_and_sub_second_times() {
        let whole = Timestamp::parse("2026-03-02T09:30:00Z").unwrap();
        assert_eq!(whole.to_string(), "2026-03-02T09:30:00Z");
        let offset = Timestamp::parse("2026-03-02T15:00:00.250+05:30").unwrap();
        assert_eq!(offset.to_string(), "2026-03-02T09:30:00.250Z");
        assert_eq!(whole.plus_seconds(60).to_string(), "2026-03-02T09:31:00Z");
        assert!(Timestamp::parse("yesterday").is_none());
    }
}
