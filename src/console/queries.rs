//! What the console reads from requests: form and query fields, the failed-rows filter, times
//! and durations typed by an operator. Nothing here trusts its input: a value that does not
//! parse is reported back to the operator, never unwrapped.

use std::time::Duration;

use crate::config::duration;
use crate::store::{Columns, FailedFilter, TimeBound};

/// What the failed rows can be filtered by: a mapped table (`[table]`) may have no
/// `last_error` or `created_at` column. A filter on a column the table lacks is refused,
/// naming the key, rather than silently matching nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Filterable {
    pub error: bool,
    pub created: bool,
}

impl Filterable {
    pub(super) fn of(cols: &Columns) -> Filterable {
        Filterable {
            error: cols.last_error.is_some(),
            created: cols.created_at.is_some(),
        }
    }
}

impl Default for Filterable {
    /// The relay's own table: every filter.
    fn default() -> Self {
        Filterable {
            error: true,
            created: true,
        }
    }
}

/// The fields of a form body or a query string (`application/x-www-form-urlencoded`).
#[derive(Debug, Default)]
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn parse(bytes: &[u8]) -> Form {
        Form(
            form_urlencoded::parse(bytes)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `key`, if present and not blank.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }
}

/// The filter of the failed-rows list as typed (kept as text to fill the form again and to
/// build links), and its parsed form.
#[derive(Debug, Default, Clone)]
pub(super) struct Filter {
    pub channel: String,
    pub error: String,
    pub from: String,
    pub to: String,
    pub parsed: FailedFilter,
}

impl Filter {
    /// Reads `channel`, `error`, `from`, `to` (and `max_id`, for a confirmed selection);
    /// an error names the field that did not parse, or the `[table]` key a filter needs.
    pub(super) fn from_form(f: &Form, can: Filterable) -> Result<Filter, String> {
        let text = |k: &str| f.get(k).unwrap_or("").to_string();
        let mut filter = Filter {
            channel: text("channel"),
            error: text("error"),
            from: text("from"),
            to: text("to"),
            parsed: FailedFilter::default(),
        };
        if !can.error && f.get("error").is_some() {
            return Err(
                "last error contains: this table maps no table.columns.last_error, \
                        so rows cannot be filtered by error text"
                    .into(),
            );
        }
        if !can.created && (f.get("from").is_some() || f.get("to").is_some()) {
            return Err(
                "created from/before: this table maps no table.columns.created_at, \
                        so rows cannot be filtered by creation time"
                    .into(),
            );
        }
        let p = &mut filter.parsed;
        p.channel = f.get("channel").map(str::to_string);
        p.error_contains = f.get("error").map(str::to_string);
        p.created_from = f
            .get("from")
            .map(|v| parse_time(v).map_err(|e| format!("created from: {e}")))
            .transpose()?;
        p.created_to = f
            .get("to")
            .map(|v| parse_time(v).map_err(|e| format!("created before: {e}")))
            .transpose()?;
        p.max_id = f
            .get("max_id")
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| format!("max_id: {v:?} is not a row id"))
            })
            .transpose()?;
        Ok(filter)
    }

    /// The filter as query-string fields (for links to the next page and to confirmations).
    pub(super) fn query(&self) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("channel", &self.channel),
            ("error", &self.error),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if !v.is_empty() {
                s.append_pair(k, v);
            }
        }
        s.finish()
    }

    /// The filter in words, for confirmations and the log.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.channel.is_empty() {
            parts.push(format!("channel {}", self.channel));
        }
        if !self.error.is_empty() {
            parts.push(format!("last error contains {:?}", self.error));
        }
        if !self.from.is_empty() {
            parts.push(format!("created from {}", self.from));
        }
        if !self.to.is_empty() {
            parts.push(format!("created before {}", self.to));
        }
        if parts.is_empty() {
            "every FAILED row".to_string()
        } else {
            format!("FAILED rows with {}", parts.join(", "))
        }
    }
}

/// A time typed by an operator: a duration meaning that long ago (`30m`, `2h`, `7d`), or a UTC
/// date and time (`2026-11-24 13:05`, `2026-11-24T13:05:30`, `2026-11-24`).
pub(super) fn parse_time(s: &str) -> Result<TimeBound, String> {
    let s = s.trim();
    if let Ok(d) = duration::parse(s) {
        return Ok(TimeBound::Ago(d));
    }
    parse_utc(s).map(TimeBound::Unix).ok_or_else(|| {
        format!("{s:?} is neither a UTC time (2026-11-24 13:05) nor a duration ago (2h, 7d)")
    })
}

/// `YYYY-MM-DD[( |T)HH:MM[:SS]]` (UTC) as Unix seconds.
fn parse_utc(s: &str) -> Option<i64> {
    let (date, time) = match s.split_once([' ', 'T']) {
        Some((d, t)) => (d, Some(t.trim_end_matches('Z'))),
        None => (s, None),
    };
    let mut d = date.split('-');
    let (y, m, day) = (
        d.next()?.parse::<i64>().ok()?,
        d.next()?.parse::<u32>().ok()?,
        d.next()?.parse::<u32>().ok()?,
    );
    if d.next().is_some()
        || !(1970..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    let mut secs = 0i64;
    if let Some(t) = time {
        let mut p = t.split(':');
        let h = p.next()?.parse::<i64>().ok()?;
        let min = p.next()?.parse::<i64>().ok()?;
        let sec = match p.next() {
            Some(x) => x.split('.').next()?.parse::<i64>().ok()?,
            None => 0,
        };
        if p.next().is_some()
            || !(0..24).contains(&h)
            || !(0..60).contains(&min)
            || !(0..61).contains(&sec)
        {
            return None;
        }
        secs = h * 3600 + min * 60 + sec;
    }
    Some(days_from_civil(y, m, day) * 86_400 + secs)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A duration typed by an operator (`7d`, `12h`), at least one minute: purging rows that
/// failed a moment ago is never what was meant.
pub(super) fn parse_age(s: &str) -> Result<Duration, String> {
    let d = duration::parse(s.trim())?;
    if d < Duration::from_secs(60) {
        return Err(format!(
            "{s:?} is under a minute; give an age such as 7d or 12h"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_utc_or_as_ago() {
        assert_eq!(parse_time("1970-01-02"), Ok(TimeBound::Unix(86_400)));
        assert_eq!(
            parse_time("2000-03-01 00:00"),
            Ok(TimeBound::Unix(951_868_800))
        );
        assert_eq!(
            parse_time("2026-11-24T13:05:30"),
            Ok(TimeBound::Unix(1_795_525_530))
        );
        assert_eq!(
            parse_time("2h"),
            Ok(TimeBound::Ago(Duration::from_secs(7200)))
        );
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("2026-13-01").is_err());
        assert!(parse_time("2026-01-01 25:00").is_err());
    }

    #[test]
    fn forms_decode_and_filters_round_trip() {
        let f = Form::parse(b"channel=sms&error=HTTP+5%25&from=&to=2h&csrf=x");
        let all = Filterable::default();
        let filter = Filter::from_form(&f, all).expect("parses");
        assert_eq!(filter.parsed.error_contains.as_deref(), Some("HTTP 5%"));
        assert_eq!(filter.parsed.created_from, None);
        assert_eq!(filter.query(), "channel=sms&error=HTTP+5%25&to=2h");
        assert!(Filter::from_form(&Form::parse(b"from=soon"), all).is_err());
        // A mapped table without the columns: the filter is refused, naming the key.
        let none = Filterable {
            error: false,
            created: false,
        };
        let e = Filter::from_form(&Form::parse(b"error=x"), none).expect_err("no last_error");
        assert!(e.contains("table.columns.last_error"), "{e}");
        let e = Filter::from_form(&Form::parse(b"to=2h"), none).expect_err("no created_at");
        assert!(e.contains("table.columns.created_at"), "{e}");
        // Blank fields (the confirmation page's hidden inputs) are no filter.
        assert!(Filter::from_form(&Form::parse(b"channel=sms&error=&from="), none).is_ok());
        assert!(parse_age("30s").is_err());
        assert!(parse_age("7d").is_ok());
    }
}
