//! Event time (SPEC §3): milliseconds since the Unix epoch, parsed from RFC 3339 and written
//! `YYYY-MM-DDTHH:MM:SSZ` (with `.fff` only when sub-second). No stage reads the OS clock.

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub fn parse(text: &str) -> Option<Timestamp> {
        if let Some(time) = Timestamp::parse_canonical(text) {
            return Some(time);
        }
        DateTime::parse_from_rfc3339(text).ok().map(|time| Timestamp(time.with_timezone(&Utc).timestamp_millis()))
    }

    /// The form every time is written in, `YYYY-MM-DDTHH:MM:SSZ` or `YYYY-MM-DDTHH:MM:SS.fffZ`, read
    /// without chrono's general RFC 3339 parser (every record and statement line carries times): the
    /// digits are read here and chrono's calendar checks and converts them. None for anything else,
    /// including impossible dates, which the general parser then decides; a property test checks both
    /// agree.
    fn parse_canonical(text: &str) -> Option<Timestamp> {
        let bytes = text.as_bytes();
        let number = |range: std::ops::Range<usize>| -> Option<i64> {
            bytes
                .get(range)?
                .iter()
                .try_fold(0i64, |value, byte| byte.is_ascii_digit().then(|| value * 10 + i64::from(byte - b'0')))
        };
        let millis = match bytes.len() {
            20 if bytes[19] == b'Z' => 0,
            24 if bytes[19] == b'.' && bytes[23] == b'Z' => number(20..23)?,
            _ => return None,
        };
        let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
        if separators.iter().any(|(at, separator)| bytes[*at] != *separator) {
            return None;
        }
        let field = |range| number(range).and_then(|value| u32::try_from(value).ok());
        let date = NaiveDate::from_ymd_opt(i32::try_from(number(0..4)?).ok()?, field(5..7)?, field(8..10)?)?;
        let time =
            date.and_hms_milli_opt(field(11..13)?, field(14..16)?, field(17..19)?, u32::try_from(millis).ok()?)?;
        Some(Timestamp(time.and_utc().timestamp_millis()))
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

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar (Howard Hinnant's
/// `civil_from_days`): formatting is on every output's path, so it avoids chrono's general formatter.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A time's RFC 3339 text (`2026-03-02T09:30:00.123Z`), written into a buffer on the stack.
struct TimestampText {
    bytes: [u8; 24],
    length: usize,
}

impl TimestampText {
    fn as_str(&self) -> &str {
        // Only ASCII digits and separators are written.
        std::str::from_utf8(self.bytes.get(..self.length).unwrap_or_default()).unwrap_or_default()
    }
}

impl Timestamp {
    /// The text of a time in the years 0–9999 (None outside them: chrono writes those).
    fn text(self) -> Option<TimestampText> {
        let millis = self.0.rem_euclid(1000);
        let seconds = self.0.div_euclid(1000);
        let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
        if !(0..=9999).contains(&year) {
            return None;
        }
        let second_of_day = seconds.rem_euclid(86_400);
        let (hour, minute, second) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
        let mut text = [0u8; 24];
        let digits = |buffer: &mut [u8], value: i64| {
            let mut value = value;
            for slot in buffer.iter_mut().rev() {
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        digits(&mut text[0..4], year);
        text[4] = b'-';
        digits(&mut text[5..7], i64::from(month));
        text[7] = b'-';
        digits(&mut text[8..10], i64::from(day));
        text[10] = b'T';
        digits(&mut text[11..13], hour);
        text[13] = b':';
        digits(&mut text[14..16], minute);
        text[16] = b':';
        digits(&mut text[17..19], second);
        let length = if millis == 0 {
            text[19] = b'Z';
            20
        } else {
            text[19] = b'.';
            digits(&mut text[20..23], millis);
            text[23] = b'Z';
            24
        };
        Some(TimestampText { bytes: text, length })
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(text) = self.text() {
            return formatter.write_str(text.as_str());
        }
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(time) => write!(formatter, "{}", time.to_rfc3339_opts(SecondsFormat::Millis, true)),
            None => write!(formatter, "invalid-time({})", self.0),
        }
    }
}

impl Serialize for Timestamp {
    /// A string written in one piece, not through `fmt` (times are on every record's path).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.text() {
            Some(text) => serializer.serialize_str(text.as_str()),
            None => serializer.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Parsed in place: no allocation per time.
        crate::decode::parse_str(deserializer, |text| {
            Timestamp::parse(text).ok_or_else(|| format!("`{text}` is not an RFC 3339 time"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_chrono_across_the_calendar() {
        for millis in [0i64, 951_782_400_000, 1_709_251_199_999, 4_102_444_800_000, 1_772_443_800_123, -86_400_000] {
            let ours = Timestamp(millis).to_string();
            let time = DateTime::<Utc>::from_timestamp_millis(millis).unwrap();
            let format = if millis % 1000 == 0 { SecondsFormat::Secs } else { SecondsFormat::Millis };
            assert_eq!(ours, time.to_rfc3339_opts(format, true), "millis {millis}");
            assert_eq!(serde_json::to_string(&Timestamp(millis)).unwrap(), format!("\"{ours}\""), "millis {millis}");
        }
        // Past the year 9999 chrono writes the text, as a JSON string too.
        let far = Timestamp(253_402_300_800_000);
        assert_eq!(far.to_string(), "+10000-01-01T00:00:00.000Z");
        assert_eq!(serde_json::to_string(&far).unwrap(), "\"+10000-01-01T00:00:00.000Z\"");
    }

    use proptest::prelude::*;

    fn chrono_parse(text: &str) -> Option<Timestamp> {
        DateTime::parse_from_rfc3339(text).ok().map(|time| Timestamp(time.with_timezone(&Utc).timestamp_millis()))
    }

    proptest! {
        /// The canonical-form reader agrees with chrono on what it accepts (impossible dates and
        /// other forms go to chrono), and writing then reading gives the same time back.
        #[test]
        fn the_canonical_reader_agrees_with_chrono(
            text in r"[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-6][0-9]:[0-6][0-9](\.[0-9]{3})?Z|[0-9:TZ.+-]{18,26}",
            millis in 0i64..253_402_300_799_999,
        ) {
            if let Some(time) = Timestamp::parse_canonical(&text) {
                prop_assert_eq!(Some(time), chrono_parse(&text), "{}", text);
            }
            prop_assert_eq!(Timestamp::parse(&text), chrono_parse(&text), "{}", text);
            let written = Timestamp(millis).to_string();
            prop_assert_eq!(Timestamp::parse_canonical(&written), Some(Timestamp(millis)), "{}", written);
        }
    }

    #[test]
    fn impossible_dates_are_left_to_chrono() {
        for text in ["2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-04-31T00:00:00Z", "2026-01-01T24:00:00Z"] {
            assert_eq!(Timestamp::parse_canonical(text), None, "{text}");
            assert_eq!(Timestamp::parse(text), chrono_parse(text), "{text}");
        }
        assert_eq!(Timestamp::parse_canonical("2024-02-29T23:59:59.999Z"), chrono_parse("2024-02-29T23:59:59.999Z"));
    }

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
