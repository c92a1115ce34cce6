//! The configuration file as the first layer under the environment: TOML read with the parser
//! the `config` crate itself uses, turned into the crate's values here rather than by the
//! crate, so that no value of the file makes the whole file fail without naming its key.
//!
//! Guarantees:
//! - a syntax error names the file, its line and column;
//! - every value is kept as written: an integer too large for 64 bits is kept as a 128-bit
//!   integer, or beyond that as its digits, and a float that overflows as infinity, so the
//!   key that reads it refuses it with its own name and range (`relay.batch_size: ... must
//!   be an integer from 1 to 10000`), where the crate stopped at the first such number with
//!   "number too large to fit in target type" and no key.

use config::{Map, Value, ValueKind};
use toml::de::{DeInteger, DeTable, DeValue};

use super::ConfigError;

/// A parsed configuration file, ready to be layered under the environment.
#[derive(Debug, Clone)]
pub(super) struct TomlFile {
    table: Map<String, Value>,
}

impl TomlFile {
    /// Parses `text`, the contents of the file shown as `origin` (in errors, and as its
    /// values' origin).
    pub(super) fn parse(origin: &str, text: &str) -> Result<TomlFile, ConfigError> {
        let origin = origin.to_string();
        let table = match DeTable::parse(text) {
            Ok(t) => t.into_inner(),
            Err(mut e) => {
                // The message then carries the line, the column and the line itself.
                e.set_input(Some(text));
                return Err(ConfigError::new(origin, e.to_string().trim_end()));
            }
        };
        Ok(TomlFile {
            table: from_table(&origin, table),
        })
    }
}

impl TomlFile {
    /// The value at `path` (`["table", "status"]`), as the file wrote it.
    pub(super) fn get(&self, path: &[&str]) -> Option<&Value> {
        let (first, rest) = path.split_first()?;
        let mut v = self.table.get(*first)?;
        for k in rest {
            match &v.kind {
                ValueKind::Table(t) => v = t.get(*k)?,
                _ => return None,
            }
        }
        Some(v)
    }
}

impl config::Source for TomlFile {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self.table.clone())
    }
}

fn from_table(origin: &String, table: DeTable<'_>) -> Map<String, Value> {
    table
        .into_iter()
        .map(|(k, v)| {
            (
                k.into_inner().into_owned(),
                from_value(origin, v.into_inner()),
            )
        })
        .collect()
}

fn from_value(origin: &String, value: DeValue<'_>) -> Value {
    let kind: ValueKind = match value {
        DeValue::String(s) => s.into_owned().into(),
        DeValue::Integer(i) => integer(&i),
        // TOML's own forms (`inf`, `nan`) and overflow (`1e400`) alike: a float that is not
        // finite is refused by every key that reads a number (see `number`).
        DeValue::Float(f) => f.as_str().parse::<f64>().unwrap_or(f64::NAN).into(),
        DeValue::Boolean(b) => b.into(),
        DeValue::Datetime(d) => d.to_string().into(),
        DeValue::Array(a) => a
            .into_iter()
            .map(|v| from_value(origin, v.into_inner()))
            .collect::<Vec<Value>>()
            .into(),
        DeValue::Table(t) => from_table(origin, t).into(),
    };
    Value::new(Some(origin), kind)
}

/// An integer as written: 64 bits when it fits, else 128, else its text (`0x...` as
/// written), which no integer key accepts.
fn integer(i: &DeInteger<'_>) -> ValueKind {
    let (digits, radix) = (i.as_str(), i.radix());
    if let Ok(n) = i64::from_str_radix(digits, radix) {
        n.into()
    } else if let Ok(n) = i128::from_str_radix(digits, radix) {
        n.into()
    } else if let Ok(n) = u128::from_str_radix(digits.trim_start_matches('+'), radix) {
        n.into()
    } else {
        i.to_string().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> Value {
        let f = TomlFile::parse("t.toml", &format!("k = {text}\n")).expect("parses");
        f.table["k"].clone()
    }

    #[test]
    fn numbers_beyond_64_bits_are_kept_for_their_key_to_refuse() {
        assert_eq!(value("5").into_int().ok(), Some(5));
        assert_eq!(
            value("1180591620717411303424").into_uint128().ok(),
            Some(1_180_591_620_717_411_303_424)
        );
        assert_eq!(
            value("-1180591620717411303424").into_int128().ok(),
            Some(-1_180_591_620_717_411_303_424)
        );
        let huge = "9".repeat(60);
        assert_eq!(value(&huge).into_string().ok(), Some(huge));
        assert!(value("1e400").into_float().is_ok_and(f64::is_infinite));
        assert!(value("nan").into_float().is_ok_and(f64::is_nan));
        assert_eq!(value("0xff").into_int().ok(), Some(255));
    }

    #[test]
    fn a_syntax_error_names_the_file_and_line() {
        let e = TomlFile::parse("t.toml", "[relay]\nbatch_size = 5\n[relay\n").unwrap_err();
        assert_eq!(e.key, "t.toml");
        assert!(e.problem.contains("line 3"), "{e}");
    }
}
