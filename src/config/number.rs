//! Numbers and booleans as the configuration reads them, from the file or from the
//! environment (where every value is a string): `#[serde(deserialize_with = ...)]` adapters
//! that take the value as it is (serde's `deserialize_any`), never as the `config` crate would
//! convert it.
//!
//! Guarantees:
//! - an integer key takes a TOML integer or a string of one (`"500"`, as the environment gives
//!   it), within its range, and nothing else: not a fraction (`1.5` is not rounded), not a
//!   boolean, not `NaN`; every refusal says the key's range (`must be an integer from 1 to
//!   10000`), whatever was wrong: too large (beyond 64 bits too: see `file`), negative,
//!   below the minimum, a fraction, not a number;
//! - a float key takes a TOML number or a string of one, finite and within its range;
//! - a boolean key takes `true`/`false`, or from a string (the environment) `true`, `false`,
//!   `1`, `0`, `yes`, `no`, `on`, `off` in any case; a TOML integer is not a boolean;
//! - a value is quoted in a message only for these keys (none of them is a secret), cut to a
//!   few dozen characters.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// The largest `u32`, as a range bound.
pub const U32_MAX: i128 = u32::MAX as i128;
/// The largest `usize`, as a range bound.
pub const USIZE_MAX: i128 = usize::MAX as i128;

/// An integer in `MIN..=MAX`: `#[serde(deserialize_with = "number::int::<_, _, 1, 10_000>")]`.
pub fn int<'de, D, T, const MIN: i128, const MAX: i128>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i128>,
{
    let n = d.deserialize_any(IntVisitor { min: MIN, max: MAX })?;
    // In range, so it fits the field's type whenever the range was written for that type.
    T::try_from(n)
        .map_err(|_| de::Error::custom(range_problem(&format!("{n} does not fit"), MIN, MAX)))
}

/// As [`int`], for an optional key.
pub fn int_opt<'de, D, T, const MIN: i128, const MAX: i128>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i128>,
{
    int::<D, T, MIN, MAX>(d).map(Some)
}

/// A finite number in `min..=max`.
pub fn float<'de, D: Deserializer<'de>>(d: D, min: f64, max: f64) -> Result<f64, D::Error> {
    d.deserialize_any(FloatVisitor { min, max })
}

/// A boolean: `true`/`false`, or one of the words of the environment.
pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    d.deserialize_any(FlagVisitor)
}

/// As [`flag`], for an optional key.
pub fn flag_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    flag(d).map(Some)
}

/// A value as quoted in a message: at most 40 characters.
fn shown(v: &str) -> String {
    let cut: String = v.chars().take(40).collect();
    if cut.len() < v.len() {
        format!("{:?}...", cut)
    } else {
        format!("{cut:?}")
    }
}

fn range_problem(what: &str, min: i128, max: i128) -> String {
    format!("{what}: must be an integer from {min} to {max}")
}

struct IntVisitor {
    min: i128,
    max: i128,
}

impl IntVisitor {
    fn check<E: de::Error>(&self, n: i128) -> Result<i128, E> {
        let what = if n > self.max {
            format!("{n} is too large")
        } else if n < 0 && self.min >= 0 {
            format!("{n} is negative")
        } else if n < self.min {
            format!("{n} is too small")
        } else {
            return Ok(n);
        };
        Err(E::custom(range_problem(&what, self.min, self.max)))
    }

    fn refuse<E: de::Error>(&self, what: String) -> E {
        E::custom(range_problem(&what, self.min, self.max))
    }
}

impl Visitor<'_> for IntVisitor {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an integer from {} to {}", self.min, self.max)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        self.check(v.into())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        self.check(v.into())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<i128, E> {
        self.check(v)
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<i128, E> {
        match i128::try_from(v) {
            Ok(n) => self.check(n),
            Err(_) => Err(self.refuse(format!("{v} is too large"))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i128, E> {
        Err(self.refuse(not_integer(&v.to_string(), v)))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<i128, E> {
        Err(self.refuse(format!("{v} is not a number")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
        let t = v.trim();
        let negative = t.starts_with('-');
        let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
        // As TOML writes integers too: decimal, or 0x, 0o, 0b.
        let (radix, digits) = match unsigned.get(..2) {
            Some("0x") => (16, &unsigned[2..]),
            Some("0o") => (8, &unsigned[2..]),
            Some("0b") => (2, &unsigned[2..]),
            _ => (10, unsigned),
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return Err(self.refuse(not_integer(&shown(v), t.parse::<f64>().unwrap_or(f64::NAN))));
        }
        if let Ok(n) = u128::from_str_radix(digits, radix) {
            let n = if negative {
                0_i128.checked_sub_unsigned(n)
            } else {
                i128::try_from(n).ok()
            };
            if let Some(n) = n {
                return self.check(n);
            }
        }
        // Only digits, yet no i128: beyond 128 bits (a TOML integer too, see `file`).
        let cut: String = t.chars().take(30).collect();
        let shown = format!("{cut}... ({} digits)", digits.len());
        Err(self.refuse(if !negative {
            format!("{shown} is too large")
        } else if self.min >= 0 {
            format!("{shown} is negative")
        } else {
            format!("{shown} is too small")
        }))
    }
}

/// Why `v` (shown as `shown`), a number that no integer key takes, is refused: a fraction
/// (`1.5`), a float even if whole (`2.0`, `1e3`: never rounded), or not a number at all.
fn not_integer(shown: &str, v: f64) -> String {
    if !v.is_finite() {
        format!("{shown} is not a number")
    } else if v.fract() != 0.0 {
        format!("{shown} is not a whole number")
    } else {
        format!("{shown} is not an integer (no decimal point or exponent)")
    }
}

struct FloatVisitor {
    min: f64,
    max: f64,
}

impl FloatVisitor {
    fn check<E: de::Error>(&self, v: f64, shown: &str) -> Result<f64, E> {
        if v.is_finite() && v >= self.min && v <= self.max {
            return Ok(v);
        }
        let what = if v.is_nan() || v.is_infinite() {
            "is not a finite number"
        } else if v > self.max {
            "is too large"
        } else {
            "is too small"
        };
        Err(E::custom(format!(
            "{shown} {what}: must be a number from {} to {}",
            self.min, self.max
        )))
    }
}

impl Visitor<'_> for FloatVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a number from {} to {}", self.min, self.max)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        self.check(v, &v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        self.check(v as f64, &v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        self.check(v as f64, &v.to_string())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<f64, E> {
        self.check(v as f64, &v.to_string())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<f64, E> {
        self.check(v as f64, &v.to_string())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<f64, E> {
        self.check(f64::NAN, &v.to_string())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        // Rust reads "inf" and "NaN" too: `check` refuses them as not finite.
        let n = v.trim().parse::<f64>().unwrap_or(f64::NAN);
        self.check(n, &shown(v))
    }
}

struct FlagVisitor;

impl Visitor<'_> for FlagVisitor {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("true or false")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(E::custom(format!(
                "{} is not a boolean: must be true or false (from the environment also 1/0, \
                 yes/no, on/off)",
                shown(v)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_of(v: config::Value) -> Result<u32, String> {
        int::<_, u32, 1, 10_000>(v).map_err(|e| e.to_string())
    }

    #[test]
    fn integers_are_whole_and_in_range() {
        assert_eq!(int_of(config::Value::from(42)), Ok(42));
        assert_eq!(int_of(config::Value::from(" 42 ")), Ok(42));
        assert_eq!(int_of(config::Value::from("0x10")), Ok(16));
        assert_eq!(int_of(config::Value::from("+0b101")), Ok(5));
        for (v, why) in [
            (config::Value::from(0), "0 is too small"),
            (config::Value::from(-1), "-1 is negative"),
            (config::Value::from(10_001), "10001 is too large"),
            (
                config::Value::from(1_180_591_620_717_411_303_424_u128),
                "too large",
            ),
            (config::Value::from("9".repeat(50)), "is too large"),
            (
                config::Value::from(format!("-{}", "9".repeat(50))),
                "is negative",
            ),
            (
                config::Value::from(format!("0x{}", "f".repeat(40))),
                "is too large",
            ),
            (config::Value::from(1.5), "not a whole number"),
            (config::Value::from("1.5"), "not a whole number"),
            (config::Value::from(f64::NAN), "not a number"),
            (config::Value::from("NaN"), "not a number"),
            (config::Value::from(true), "not a number"),
            (config::Value::from("yes"), "not a number"),
            (config::Value::from(""), "not a number"),
        ] {
            let e = int_of(v.clone()).expect_err(&format!("{v:?}"));
            assert!(e.contains(why), "{v:?}: {e}");
            assert!(e.contains("from 1 to 10000"), "{v:?}: {e}");
        }
    }

    #[test]
    fn floats_are_finite_and_in_range() {
        let f = |v: config::Value| float(v, 1.0, 100.0).map_err(|e| e.to_string());
        assert_eq!(f(config::Value::from(2)), Ok(2.0));
        assert_eq!(f(config::Value::from("2.5")), Ok(2.5));
        for v in [
            config::Value::from(f64::NAN),
            config::Value::from(f64::INFINITY),
            config::Value::from("inf"),
            config::Value::from("nan"),
            config::Value::from(0.5),
            config::Value::from("x"),
            config::Value::from(false),
        ] {
            let e = f(v.clone()).expect_err(&format!("{v:?}"));
            assert!(e.contains("from 1 to 100"), "{v:?}: {e}");
        }
    }

    #[test]
    fn flags_take_the_words_of_the_environment() {
        let f = |v: config::Value| flag(v).map_err(|e| e.to_string());
        assert_eq!(f(config::Value::from(true)), Ok(true));
        for (s, b) in [("TRUE", true), ("1", true), ("off", false), ("No", false)] {
            assert_eq!(f(config::Value::from(s)), Ok(b), "{s}");
        }
        assert!(f(config::Value::from(1)).is_err());
        assert!(f(config::Value::from("maybe")).is_err());
    }
}
