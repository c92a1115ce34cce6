//! [`Sql`]: a statement built as text and bound values together, so the order of the values
//! can never drift from the order of their placeholders. Every statement with values is built
//! with it; the dialect rewrites `?` into its own placeholders when the query is made.

use std::time::Duration;

use super::sql::{AnyQuery, SqlStore};
use super::{Dialect, future_ms};

/// A statement being built.
#[derive(Default, Clone)]
pub(super) struct Sql {
    /// The SQL text, with `?` for each value.
    text: String,
    /// The values, in placeholder order.
    args: Vec<Arg>,
}

/// One bound value.
#[derive(Clone)]
enum Arg {
    Int(i64),
    Text(Option<String>),
}

impl Sql {
    /// A statement starting with `text`.
    pub(super) fn new(text: &str) -> Sql {
        let mut q = Sql::default();
        q.push(text);
        q
    }

    /// Appends SQL text (no values: it must not come from a row or a user).
    pub(super) fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `v`.
    pub(super) fn int(&mut self, v: i64) -> &mut Sql {
        self.text.push('?');
        self.args.push(Arg::Int(v));
        self
    }

    /// Appends a placeholder bound to `v`.
    pub(super) fn text(&mut self, v: &str) -> &mut Sql {
        self.opt_text(Some(v.to_string()))
    }

    /// Appends a placeholder bound to `v` (NULL when `None`).
    pub(super) fn opt_text(&mut self, v: Option<String>) -> &mut Sql {
        self.text.push('?');
        self.args.push(Arg::Text(v));
        self
    }

    /// `?, ?, ?` bound to `values`.
    pub(super) fn texts(&mut self, values: &[String]) -> &mut Sql {
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.text(v);
        }
        self
    }

    /// `?, ?, ?` bound to `values`.
    pub(super) fn ints(&mut self, values: impl IntoIterator<Item = i64>) -> &mut Sql {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.int(v);
        }
        self
    }

    /// `now + by` on the database clock (`by` capped at a year, see [`future_ms`]).
    pub(super) fn now_plus(&mut self, d: Dialect, by: Duration) -> &mut Sql {
        self.now_offset(d, future_ms(by))
    }

    /// `now - by` on the database clock (not capped: a purge may reach years back).
    pub(super) fn now_minus(&mut self, d: Dialect, by: Duration) -> &mut Sql {
        self.now_offset(d, -i64::try_from(by.as_millis()).unwrap_or(i64::MAX))
    }

    /// The instant `secs` after the Unix epoch, on the database's terms.
    pub(super) fn unix_time(&mut self, d: Dialect, secs: i64) -> &mut Sql {
        // MySQL's TIMESTAMP (and FROM_UNIXTIME) end in 2038: a later bound means "any time"
        // there, and FROM_UNIXTIME would give NULL (no row) instead.
        let secs = match d {
            Dialect::MySql { .. } => secs.clamp(0, i64::from(i32::MAX)),
            _ => secs,
        };
        let expr = d.from_unix_secs();
        let (before, after) = expr.split_once('?').unwrap_or((expr, ""));
        self.push(before).int(secs).push(after)
    }

    fn now_offset(&mut self, d: Dialect, ms: i64) -> &mut Sql {
        let expr = d.now_plus_ms();
        let (before, after) = expr.split_once('?').unwrap_or((expr, ""));
        self.push(before).int(ms).push(after)
    }

    /// Appends another statement part, text and values.
    pub(super) fn append(&mut self, other: Sql) -> &mut Sql {
        self.text.push_str(&other.text);
        self.args.extend(other.args);
        self
    }

    /// The query, in `store`'s dialect, with every value bound (and counted in the store's
    /// statements).
    pub(super) fn query(self, store: &SqlStore) -> AnyQuery<'static> {
        store.count_statement();
        self.finalized(store.dialect)
    }

    /// The query in dialect `d`, with every value bound.
    pub(super) fn finalized(self, d: Dialect) -> AnyQuery<'static> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(d.finalize(&self.text)));
        for a in self.args {
            q = match a {
                Arg::Int(v) => q.bind(v),
                Arg::Text(v) => q.bind(v),
            };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_their_placeholders() {
        let mut q = Sql::new("UPDATE t SET a = ");
        q.int(1)
            .push(" WHERE b IN (")
            .texts(&["x".into(), "y".into()]);
        q.push(") AND c IN (").ints([7, 8]).push(") AND d = ");
        q.opt_text(None);
        assert_eq!(
            q.text,
            "UPDATE t SET a = ? WHERE b IN (?, ?) AND c IN (?, ?) AND d = ?"
        );
        assert_eq!(q.args.len(), 6);
        assert!(matches!(q.args[0], Arg::Int(1)));
        assert!(matches!(&q.args[2], Arg::Text(Some(s)) if s == "y"));
        assert!(matches!(q.args[4], Arg::Int(8)));
        assert!(matches!(q.args[5], Arg::Text(None)));
        let mut n = Sql::default();
        n.now_plus(Dialect::Postgres, Duration::from_secs(2));
        assert_eq!(n.text, Dialect::Postgres.now_plus_ms());
        assert!(matches!(n.args[0], Arg::Int(2000)));
        n.now_minus(Dialect::Sqlite, Duration::from_secs(3 * 365 * 86_400));
        assert!(matches!(n.args[1], Arg::Int(ms) if ms == -94_608_000_000));
    }
}
