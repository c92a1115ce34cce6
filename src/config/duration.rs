//! Human-readable durations for configuration values: `"500ms"`, `"30s"`, `"5m"`, `"2h"`, `"7d"`.
//!
//! Durations are always strings in the TOML file and in the environment, so that a bare number
//! never has to be guessed as seconds or milliseconds.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

/// The longest duration any setting takes: far beyond any sensible value, and far enough
/// from the limits of the clock types that adding it to "now" can never overflow.
pub const MAX: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses `"<number><unit>"` (units `ms`, `s`, `m`, `h`, `d`; fractions allowed, e.g. `"1.5s"`).
/// Several terms may be joined (`"1m30s"`). Never panics: a value over [`MAX`] (100 years),
/// or one that is not a finite number, is an error.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; expected e.g. \"30s\"".into());
    }
    let mut rest = text;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("\"{text}\" has no unit; expected e.g. \"{text}s\""))?;
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!(
                "\"{text}\" is not a duration; expected e.g. \"30s\" (units ms, s, m, h, d; no spaces)"
            ));
        }
        let value: f64 = num
            .parse()
            .map_err(|_| format!("\"{text}\" is not a duration; expected e.g. \"30s\""))?;
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            "d" => value * 86400.0,
            _ => {
                return Err(format!(
                    "\"{text}\" has unknown unit \"{unit}\"; use ms, s, m, h or d"
                ));
            }
        };
        let too_long = || format!("\"{text}\" is too long; at most 100 years (\"36500d\")");
        let term = Duration::try_from_secs_f64(seconds).map_err(|_| too_long())?;
        total = total
            .checked_add(term)
            .filter(|t| *t <= MAX)
            .ok_or_else(too_long)?;
        rest = tail;
    }
    Ok(total)
}

/// Formats a duration the way [`parse`] reads it (used in messages and `check-config`).
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms.is_multiple_of(86_400_000) {
        format!("{}d", ms / 86_400_000)
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Serde adapter: `#[serde(deserialize_with = "duration::deserialize")]`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_str(DurationVisitor)
}

/// Serde adapter for optional durations (absent key, or a duration string).
pub fn deserialize_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    deserialize(d).map(Some)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration string such as \"500ms\", \"30s\" or \"5m\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86400)));
    }

    #[test]
    fn rejects_bare_numbers_and_unknown_units() {
        assert!(parse("30").unwrap_err().contains("no unit"));
        assert!(parse("3 weeks").is_err());
        assert!(parse("5w").unwrap_err().contains("unknown unit"));
        assert!(parse("").is_err());
    }

    #[test]
    fn overflowing_values_are_errors_not_panics() {
        for v in [
            "99999999999999999999d",
            "18446744073709551615s",
            "18446744073709551616000ms",
            "36501d",
            "36500d1s",
            "1e400s",
            "-5s",
            "NaNs",
            ".s",
            "1..2s",
            "9".repeat(400).as_str(),
            &format!("{}s", "9".repeat(400)),
        ] {
            assert!(parse(v).is_err(), "{v} should be refused");
        }
        assert_eq!(parse("36500d"), Ok(MAX));
    }

    #[test]
    fn format_round_trips() {
        for s in ["250ms", "30s", "5m", "2h", "7d"] {
            assert_eq!(format(parse(s).unwrap()), s);
        }
    }
}
