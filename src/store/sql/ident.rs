//! Identifiers on a table mapped by `[table]` (docs/adopting-a-table.md): every name the relay
//! writes into SQL for such a table (the table, its columns, the indexes, columns and trigger
//! the relay adds) is quoted the database's own way ([`Syntax::quote_ident`]), so that a
//! column named like a keyword of one database (`key`, `order`, MariaDB's `partition`,
//! PostgreSQL's `full`) or created quoted in mixed case (`"receiverMobileNo"`) is used as it
//! is. Quoting makes a name resolve exactly as it is spelled (case-sensitive on PostgreSQL),
//! which is why the live check (`schema/check.rs`) resolves every configured name the same
//! way before anything runs on the table.
//!
//! The relay's own table keeps its bare names: they are the relay's, and its SQL is what it
//! always was.

use std::collections::BTreeMap;

use super::dialect::Syntax;
use crate::config::PayloadValue;

/// The longest name of an object the relay creates (PostgreSQL truncates names at 63 bytes,
/// MySQL refuses names over 64 characters).
const MAX_NAME: usize = 63;

/// `name` quoted for the database.
pub(super) fn quote(s: &dyn Syntax, name: &str) -> String {
    s.quote_ident(name)
}

/// A name as the configuration spelled it, from its SQL form: the quotes [`quote`] added are
/// removed and doubled quote characters undoubled; a bare name is returned as it is.
pub fn bare(name: &str) -> String {
    for q in ['"', '`'] {
        if name.len() >= 2 && name.starts_with(q) && name.ends_with(q) {
            let inner = &name[1..name.len() - 1];
            return inner.replace(&format!("{q}{q}"), &q.to_string());
        }
    }
    name.to_string()
}

/// The name of an object the relay creates for table `table` (an index, a virtual column's
/// index, a trigger): `<table>_<suffix>`, or, when that would be longer than the databases
/// keep, the table's name cut short with a hash of the whole name in its place, so that two
/// long table names still get two names and the same table always the same one.
pub fn derived(table: &str, suffix: &str) -> String {
    let plain = format!("{table}_{suffix}");
    if plain.len() <= MAX_NAME {
        return plain;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let tail = format!("_{:08x}_{suffix}", hash as u32);
    let mut keep = MAX_NAME.saturating_sub(tail.len());
    while !table.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{tail}", &table[..keep])
}

/// Every column of a payload object quoted (see [`quote`]).
pub(super) fn quote_object(
    s: &dyn Syntax,
    obj: BTreeMap<String, PayloadValue>,
) -> BTreeMap<String, PayloadValue> {
    obj.into_iter()
        .map(|(k, v)| {
            let v = match v {
                PayloadValue::Column(c) => PayloadValue::Column(quote(s, &c)),
                PayloadValue::Json { json } => PayloadValue::Json {
                    json: quote(s, &json),
                },
                PayloadValue::Object(inner) => PayloadValue::Object(quote_object(s, inner)),
            };
            (k, v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_undoes_any_quoting() {
        assert_eq!(bare("\"receiverMobileNo\""), "receiverMobileNo");
        assert_eq!(bare("`partition`"), "partition");
        assert_eq!(bare("\"a\"\"b\""), "a\"b");
        assert_eq!(bare("`a``b`"), "a`b");
        assert_eq!(bare("plain"), "plain");
    }

    #[test]
    fn derived_names_fit_and_stay_apart() {
        assert_eq!(derived("events", "open_idx"), "events_open_idx");
        let long = "a".repeat(60);
        let other = format!("{}b", "a".repeat(59));
        let (x, y) = (
            derived(&long, "channel_due_idx"),
            derived(&other, "channel_due_idx"),
        );
        assert!(x.len() <= MAX_NAME && y.len() <= MAX_NAME, "{x} {y}");
        assert!(x.ends_with("_channel_due_idx"), "{x}");
        assert_ne!(x, y);
        assert_eq!(x, derived(&long, "channel_due_idx"));
        let wide = "é".repeat(40);
        assert!(derived(&wide, "notify").len() <= MAX_NAME);
    }
}
