//! `[table.status]`: the table's value(s) for each of the relay's states, as strings or
//! integers, from the file or from the environment (docs/adopting-a-table.md, "Keys").
//!
//! Guarantees:
//! - one kind for all values, the status column's: integers or strings. The environment gives
//!   only strings, so a string of decimal digits (`"1"`, as `OUTBOX_RELAY__TABLE__STATUS__FAILED=1`
//!   gives it) is taken as an integer when any status value of the file is a TOML integer (even
//!   one the environment replaces) or any other value is, and stays a string otherwise (a
//!   quoted literal, which matches an integer or a text column: the live check of the
//!   column's type, `store::Columns::status_kinds`, allows both then);
//! - a comma separates values: `pending` and `retry` take a list as a TOML array or as one
//!   string `"PENDING,READY"` (the environment's only form), `success` and `failed` one value;
//!   no value holds a comma;
//! - every value is usable as an SQL literal, no value is in two states (except a retry that
//!   goes back to a pending value), and every error names its key.

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use config::ValueKind;

use super::ConfigError;
use super::file::TomlFile;
use super::validate::literal_safe;

/// `[table.status]`: the table's value(s) for each state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatusSettings {
    pub pending: Option<Codes>,
    pub retry: Option<Codes>,
    pub success: Option<Code>,
    pub failed: Option<Code>,
}

/// One status value or several (the first is the one the relay writes).
#[derive(Debug, Clone, PartialEq)]
pub enum Codes {
    One(Code),
    Many(Vec<Code>),
}

impl Codes {
    fn list(&self) -> Vec<Code> {
        match self {
            Codes::One(c) => vec![c.clone()],
            Codes::Many(v) => v.clone(),
        }
    }

    fn codes_mut(&mut self) -> Vec<&mut Code> {
        match self {
            Codes::One(c) => vec![c],
            Codes::Many(v) => v.iter_mut().collect(),
        }
    }
}

/// A status value: a string (`'READY'`) or an integer code (`0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    Int(i64),
    Text(String),
}

impl Code {
    /// The value as an SQL literal (checked by [`StatusSettings::validate`]).
    pub fn literal(&self) -> String {
        match self {
            Code::Int(n) => n.to_string(),
            Code::Text(s) => super::sql_string(s),
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::Int(n) => write!(f, "{n}"),
            Code::Text(s) => write!(f, "{s}"),
        }
    }
}

const INT_RANGE: &str = "status integers go from -9223372036854775808 to 9223372036854775807";

/// Reads status values: one (`many` false) or a list (`many` true).
struct CodeVisitor {
    many: bool,
}

impl CodeVisitor {
    fn int<E: de::Error>(v: impl TryInto<i64> + std::fmt::Display + Copy) -> Result<Codes, E> {
        match v.try_into() {
            Ok(n) => Ok(Codes::One(Code::Int(n))),
            Err(_) => Err(E::custom(format!("{v} is out of range: {INT_RANGE}"))),
        }
    }
}

impl<'de> Visitor<'de> for CodeVisitor {
    type Value = Codes;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.many {
            f.write_str("a status value (a string or an integer), or a list of them")
        } else {
            f.write_str("a status value (a string or an integer)")
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Codes, E> {
        Self::int(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Codes, E> {
        Self::int(v)
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Codes, E> {
        Self::int(v)
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Codes, E> {
        Self::int(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Codes, E> {
        Err(E::custom(format!(
            "{v} is not a status value: a string or an integer"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Codes, E> {
        if !v.contains(',') {
            return Ok(Codes::One(Code::Text(v.to_string())));
        }
        if !self.many {
            return Err(E::custom(format!(
                "\"{v}\" holds a comma: this state takes one value, and no value holds a comma"
            )));
        }
        let parts: Vec<&str> = v.split(',').map(str::trim).collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(E::custom(format!(
                "\"{v}\" has an empty value: list values separated by commas, e.g. \"PENDING,READY\""
            )));
        }
        Ok(Codes::Many(
            parts.into_iter().map(|p| Code::Text(p.into())).collect(),
        ))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Codes, A::Error> {
        if !self.many {
            return Err(de::Error::custom(
                "takes one value, not a list (only pending and retry list several)",
            ));
        }
        let mut out = Vec::new();
        while let Some(code) = seq.next_element::<Code>()? {
            out.push(code);
        }
        Ok(Codes::Many(out))
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Code, D::Error> {
        match d.deserialize_any(CodeVisitor { many: false })? {
            Codes::One(c) => Ok(c),
            // A single value's visitor never reads a list.
            Codes::Many(_) => Err(de::Error::custom("takes one value, not a list")),
        }
    }
}

impl<'de> Deserialize<'de> for Codes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Codes, D::Error> {
        d.deserialize_any(CodeVisitor { many: true })
    }
}

/// Whether `t` is the decimal form of an integer, and which (`None`: not one; `Some(None)`:
/// digits beyond 64 bits).
fn decimal(t: &str) -> Option<Option<i64>> {
    let t = t.trim();
    let digits = t.strip_prefix('-').unwrap_or(t);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok())
}

impl StatusSettings {
    fn entries(&self) -> [(&'static str, Vec<Code>); 4] {
        [
            ("pending", self.pending.as_ref().map_or(vec![], Codes::list)),
            ("retry", self.retry.as_ref().map_or(vec![], Codes::list)),
            ("success", self.success.iter().cloned().collect()),
            ("failed", self.failed.iter().cloned().collect()),
        ]
    }

    /// Gives every value the kind of the column: when any value is a TOML integer, in the
    /// settings or in the `file` under them (a value the environment replaced), strings of
    /// digits (the environment's form) become integers, and any other string is refused.
    pub(super) fn settle_kinds(&mut self, file: Option<&TomlFile>) -> Result<(), ConfigError> {
        let int = |v: &config::Value| {
            matches!(
                v.kind,
                ValueKind::I64(_) | ValueKind::I128(_) | ValueKind::U64(_) | ValueKind::U128(_)
            )
        };
        let in_file = || {
            ["pending", "retry", "success", "failed"]
                .into_iter()
                .find_map(|k| {
                    let v = file?.get(&["table", "status", k])?;
                    let found = match &v.kind {
                        ValueKind::Array(a) => a.iter().find(|e| int(e)),
                        _ => Some(v).filter(|v| int(v)),
                    };
                    found.map(|v| (k, v.to_string()))
                })
        };
        let Some((int_key, int)) = self
            .entries()
            .into_iter()
            .find_map(|(k, codes)| {
                codes
                    .into_iter()
                    .find(|c| matches!(c, Code::Int(_)))
                    .map(|c| (k, c.to_string()))
            })
            .or_else(in_file)
        else {
            return Ok(());
        };
        let mut slots: Vec<(&str, &mut Code)> = Vec::new();
        for (key, codes) in [("pending", &mut self.pending), ("retry", &mut self.retry)] {
            if let Some(codes) = codes {
                slots.extend(codes.codes_mut().into_iter().map(|c| (key, c)));
            }
        }
        for (key, code) in [("success", &mut self.success), ("failed", &mut self.failed)] {
            if let Some(code) = code {
                slots.push((key, code));
            }
        }
        for (key, code) in slots {
            let Code::Text(t) = code else { continue };
            match decimal(t) {
                Some(Some(n)) => *code = Code::Int(n),
                Some(None) => {
                    return Err(ConfigError::new(
                        format!("table.status.{key}"),
                        format!("{t} is out of range: {INT_RANGE}"),
                    ));
                }
                None => {
                    return Err(ConfigError::new(
                        format!("table.status.{key}"),
                        format!(
                            "\"{t}\" is a string, but table.status.{int_key} is an integer \
                             ({int}) in the configuration: the values are all integers or all \
                             strings, as the status column is (from the environment, digits are \
                             taken as an integer when the file's values are integers)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `pending`, `success` and `failed` set, `retry` optional; each value usable as a
    /// literal, no value in two states (but `retry` may reuse `pending`'s), and all integers
    /// or all strings.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let mut seen: Vec<(String, Code)> = Vec::new();
        for (key, codes) in self.entries() {
            let set = match key {
                "pending" => self.pending.is_some(),
                "retry" => self.retry.is_some(),
                "success" => self.success.is_some(),
                _ => self.failed.is_some(),
            };
            let key = format!("table.status.{key}");
            if !set {
                if !key.ends_with("retry") {
                    return Err(ConfigError::new(
                        key,
                        "is required for a mapped table (the table's value for this state, \
                         a string or an integer)",
                    ));
                }
                continue;
            }
            if codes.is_empty() {
                return Err(ConfigError::new(key, "must list at least one value"));
            }
            for code in codes {
                status_code(&key, &code, &seen)?;
                seen.push((key.clone(), code));
            }
        }
        let ints = seen
            .iter()
            .filter(|(_, c)| matches!(c, Code::Int(_)))
            .count();
        if ints > 0 && ints < seen.len() {
            return Err(ConfigError::new(
                "table.status",
                "mixes integer and string values; use one kind (the status column's type)",
            ));
        }
        Ok(())
    }
}

/// One value of the status `key`: usable as a literal, and not a value of another state in
/// `seen` (a retried row may go back to the pending value, for tables without a RETRY state;
/// every other overlap would make a finished row unfinished).
fn status_code(key: &str, code: &Code, seen: &[(String, Code)]) -> Result<(), ConfigError> {
    if let Code::Text(t) = code
        && (!literal_safe(t) || t.contains(','))
    {
        return Err(ConfigError::new(
            key,
            format!(
                "\"{t}\" is not a usable status value (1 to 200 characters, no comma, \
                 backslash or control character)"
            ),
        ));
    }
    if let Some((other, _)) = seen.iter().find(|(k, c)| c == code && k != key) {
        let pending_retry = key.ends_with("retry") && other.ends_with("pending");
        if !pending_retry {
            return Err(ConfigError::new(
                key,
                format!("value {code} is also {other}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pairs: &[(&str, &str)]) -> Result<StatusSettings, ConfigError> {
        let text: String = pairs.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        let mut s: StatusSettings = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::within("table.status", &e))?;
        s.settle_kinds(None)?;
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn digits_take_the_kind_of_the_other_values() {
        let s = status(&[("pending", "0"), ("success", "\"1\""), ("failed", "\"2\"")]).unwrap();
        assert_eq!(s.failed, Some(Code::Int(2)));
        let s = status(&[("pending", "\"0,5\""), ("success", "1"), ("failed", "2")]).unwrap();
        assert_eq!(
            s.pending,
            Some(Codes::Many(vec![Code::Int(0), Code::Int(5)]))
        );
        // Without an integer anywhere, digits stay strings (quoted literals).
        let s = status(&[
            ("pending", "\"0\""),
            ("success", "\"1\""),
            ("failed", "\"2\""),
        ])
        .unwrap();
        assert_eq!(s.failed, Some(Code::Text("2".into())));
        let e = status(&[("pending", "0"), ("success", "1"), ("failed", "\"DONE\"")]).unwrap_err();
        assert_eq!(e.key, "table.status.failed", "{e}");
        assert!(e.problem.contains("table.status.pending"), "{e}");
        let e = status(&[
            ("pending", "0"),
            ("success", "1"),
            ("failed", "\"99999999999999999999\""),
        ])
        .unwrap_err();
        assert_eq!(e.key, "table.status.failed", "{e}");
        assert!(e.problem.contains("9223372036854775807"), "{e}");
    }

    #[test]
    fn lists_are_arrays_or_comma_separated_and_values_are_checked() {
        let s = status(&[
            ("pending", "\"PENDING, READY\""),
            ("success", "\"OK\""),
            ("failed", "\"KO\""),
        ])
        .unwrap();
        assert_eq!(s.pending.unwrap().list().len(), 2);
        for (pairs, key) in [
            (
                &[
                    ("pending", "\"A\""),
                    ("success", "\"B,C\""),
                    ("failed", "\"D\""),
                ][..],
                "table.status.success",
            ),
            (
                &[
                    ("pending", "\"A,,B\""),
                    ("success", "\"C\""),
                    ("failed", "\"D\""),
                ],
                "table.status.pending",
            ),
            (
                &[
                    ("pending", "[\"A\", 1.5]"),
                    ("success", "\"C\""),
                    ("failed", "\"D\""),
                ],
                "table.status.pending[1]",
            ),
            (
                &[
                    ("pending", "true"),
                    ("success", "\"C\""),
                    ("failed", "\"D\""),
                ],
                "table.status.pending",
            ),
            (
                &[
                    ("pending", "\"A\""),
                    ("success", "[\"C\"]"),
                    ("failed", "\"D\""),
                ],
                "table.status.success",
            ),
            (
                &[
                    ("pending", "\"A\""),
                    ("success", "\"C\""),
                    ("failed", "{ x = 1 }"),
                ],
                "table.status.failed",
            ),
        ] {
            let e = status(pairs).expect_err(&format!("{pairs:?}"));
            assert_eq!(e.key, key, "{pairs:?}: {e}");
        }
    }
}
