//! [`Sql`]: a statement built as text and bound values together, so the order of the values
//! can never drift from the order of their placeholders. Every statement with values is built
//! with it.
//!
//! Guarantee: a placeholder exists only where a value was bound. The text pushed is kept as
//! it is (a `?` inside a literal stays a `?`); the positions of the placeholders are
//! remembered, and the database's own form (`?`, or `$1, $2, ...`) is written there when the
//! query is made.

use std::time::Duration;

use super::dialect::Syntax;
use super::stmt::{AnyQuery, Stmt};
use crate::config::sql_string;
use crate::store::model::future_ms;

/// A statement being built.
#[derive(Default, Clone)]
pub struct Sql {
    /// The SQL text, without placeholders.
    text: String,
    /// Where in `text` each placeholder goes, in order.
    marks: Vec<usize>,
    /// The values, in placeholder order.
    args: Vec<Arg>,
}

/// One bound value.
#[derive(Clone, Debug, PartialEq)]
enum Arg {
    Int(i64),
    Text(Option<String>),
}

impl Sql {
    /// A statement starting with `text`.
    pub fn new(text: &str) -> Sql {
        let mut q = Sql::default();
        q.push(text);
        q
    }

    /// Appends SQL text (no values: it must not come from a row or a user).
    pub fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    fn bind(&mut self, arg: Arg) -> &mut Sql {
        self.marks.push(self.text.len());
        self.args.push(arg);
        self
    }

    /// Appends a placeholder bound to `v`.
    pub fn int(&mut self, v: i64) -> &mut Sql {
        self.bind(Arg::Int(v))
    }

    /// Appends a placeholder bound to `v`.
    pub fn text(&mut self, v: &str) -> &mut Sql {
        self.opt_text(Some(v.to_string()))
    }

    /// Appends a placeholder bound to `v` (NULL when `None`).
    pub fn opt_text(&mut self, v: Option<String>) -> &mut Sql {
        self.bind(Arg::Text(v))
    }

    /// `?, ?, ?` bound to `values`.
    pub fn texts(&mut self, values: &[String]) -> &mut Sql {
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.text(v);
        }
        self
    }

    /// `?, ?, ?` bound to `values`.
    pub fn ints(&mut self, values: impl IntoIterator<Item = i64>) -> &mut Sql {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.int(v);
        }
        self
    }

    /// `now + by` on the database clock (`by` capped at a year, see [`future_ms`]).
    pub fn now_plus(&mut self, s: &dyn Syntax, by: Duration) -> &mut Sql {
        self.now_plus_ms(s, future_ms(by))
    }

    /// `now - by` on the database clock (not capped: a purge may reach years back).
    pub fn now_minus(&mut self, s: &dyn Syntax, by: Duration) -> &mut Sql {
        self.now_plus_ms(s, -i64::try_from(by.as_millis()).unwrap_or(i64::MAX))
    }

    /// `now + ms` milliseconds on the database clock.
    pub fn now_plus_ms(&mut self, s: &dyn Syntax, ms: i64) -> &mut Sql {
        let (before, after) = s.now_plus_ms();
        self.push(before).int(ms).push(after)
    }

    /// The instant `secs` after the Unix epoch, on the database's terms.
    pub fn unix_time(&mut self, s: &dyn Syntax, secs: i64) -> &mut Sql {
        let (before, after) = s.unix_time();
        self.push(before).int(s.unix_secs(secs)).push(after)
    }

    /// `payload` (text) as a value of the payload column's type.
    pub fn payload(&mut self, s: &dyn Syntax, payload: &str) -> &mut Sql {
        let (before, after) = s.payload_value();
        self.push(before).text(payload).push(after)
    }

    /// Appends another statement part, text and values.
    pub fn append(&mut self, other: Sql) -> &mut Sql {
        let at = self.text.len();
        self.text.push_str(&other.text);
        self.marks.extend(other.marks.iter().map(|m| m + at));
        self.args.extend(other.args);
        self
    }

    /// The statement's text in `s`'s placeholder form.
    pub fn render(&self, s: &dyn Syntax) -> String {
        let numbered = s.numbered_placeholders();
        self.filled(4, |out, n, _| {
            match numbered {
                true => {
                    out.push('$');
                    out.push_str(&(n + 1).to_string());
                }
                false => out.push('?'),
            }
            true
        })
        .unwrap_or_default()
    }

    /// The text with each placeholder's place filled by `fill(out, n, value)` (the `n`th
    /// value), about `each` bytes apiece; `None` as soon as `fill` says it cannot.
    fn filled(
        &self,
        each: usize,
        fill: impl Fn(&mut String, usize, &Arg) -> bool,
    ) -> Option<String> {
        let mut out = String::with_capacity(self.text.len() + each * self.marks.len());
        let mut from = 0;
        for (n, (&at, arg)) in self.marks.iter().zip(&self.args).enumerate() {
            out.push_str(&self.text[from..at]);
            if !fill(&mut out, n, arg) {
                return None;
            }
            from = at;
        }
        out.push_str(&self.text[from..]);
        Some(out)
    }

    /// The text with every value written as an SQL literal (integers as they are, text
    /// quoted with its quotes doubled, `NULL`), or `None` when a text value holds a backslash
    /// or a control character: MySQL reads a backslash as an escape unless the session's
    /// `sql_mode` says `NO_BACKSLASH_ESCAPES`, so such a value is bound instead, and the
    /// literal means the same text in every mode.
    pub fn inlined(&self) -> Option<String> {
        self.filled(8, |out, _, arg| {
            match arg {
                Arg::Int(v) => out.push_str(&v.to_string()),
                Arg::Text(None) => out.push_str("NULL"),
                Arg::Text(Some(v)) if v.chars().any(|c| c == '\\' || c.is_control()) => {
                    return false;
                }
                Arg::Text(Some(v)) => out.push_str(&sql_string(v)),
            }
            true
        })
    }

    /// The statement in `s`'s form: text with its values as literals where `s` says so
    /// ([`Syntax::values_as_literals`]) and they can be, otherwise prepared, every value
    /// bound.
    pub fn finalized(self, s: &dyn Syntax) -> Stmt {
        if s.values_as_literals()
            && let Some(text) = self.inlined()
        {
            return Stmt::Text(text);
        }
        Stmt::Prepared(self.prepared(s))
    }

    /// The query in `s`'s form, prepared, with every value bound.
    fn prepared(self, s: &dyn Syntax) -> AnyQuery<'static> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(self.render(s)));
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

    /// A syntax with numbered placeholders (as PostgreSQL's) or `?`.
    struct Test {
        numbered: bool,
        literals: bool,
    }

    const NUMBERED: Test = Test {
        numbered: true,
        literals: false,
    };
    const PLAIN: Test = Test {
        numbered: false,
        literals: false,
    };
    const LITERALS: Test = Test {
        numbered: false,
        literals: true,
    };

    impl Syntax for Test {
        fn numbered_placeholders(&self) -> bool {
            self.numbered
        }
        fn values_as_literals(&self) -> bool {
            self.literals
        }
        fn now(&self) -> &'static str {
            "now()"
        }
        fn now_plus_ms(&self) -> (&'static str, &'static str) {
            ("(now() + ", " ms)")
        }
        fn unix_time(&self) -> (&'static str, &'static str) {
            ("to_timestamp(", ")")
        }
        fn age_ms(&self, col: &str) -> String {
            col.into()
        }
        fn time_text(&self, col: &str) -> String {
            col.into()
        }
        fn payload_text(&self, col: &str) -> String {
            col.into()
        }
        fn byte_length(&self, col: &str) -> String {
            col.into()
        }
        fn null_text(&self) -> &'static str {
            "NULL"
        }
        fn null_int(&self) -> &'static str {
            "NULL"
        }
        fn cast_text(&self, expr: &str) -> String {
            expr.into()
        }
        fn json_value(&self, col: &str) -> String {
            col.into()
        }
        fn json_object(&self, pairs: &[String]) -> String {
            pairs.join(", ")
        }
    }

    #[test]
    fn values_follow_their_placeholders() {
        let mut q = Sql::new("UPDATE t SET a = ");
        q.int(1)
            .push(" WHERE b IN (")
            .texts(&["x".into(), "y".into()]);
        q.push(") AND c IN (").ints([7, 8]).push(") AND d = ");
        q.opt_text(None);
        renders(
            &q,
            "UPDATE t SET a = ? WHERE b IN (?, ?) AND c IN (?, ?) AND d = ?",
            "UPDATE t SET a = $1 WHERE b IN ($2, $3) AND c IN ($4, $5) AND d = $6",
        );
        assert_eq!(q.args.len(), 6);
        assert_eq!(q.args[0], Arg::Int(1));
        assert_eq!(q.args[2], Arg::Text(Some("y".into())));
        assert_eq!(q.args[4], Arg::Int(8));
        assert_eq!(q.args[5], Arg::Text(None));
        let mut n = Sql::default();
        n.now_plus(&NUMBERED, Duration::from_secs(2));
        assert_eq!(n.render(&NUMBERED), "(now() + $1 ms)");
        assert_eq!(n.args[0], Arg::Int(2000));
        n.now_minus(&NUMBERED, Duration::from_secs(3 * 365 * 86_400));
        assert_eq!(n.args[1], Arg::Int(-94_608_000_000));
    }

    #[test]
    fn a_question_mark_in_the_text_is_never_a_placeholder() {
        let mut q = Sql::new("SELECT 'NEW?', json_build_object('vip?', x) WHERE a = ");
        q.int(5).push(" AND b = '?'");
        let mut tail = Sql::new(" AND c = ");
        tail.text("?");
        q.append(tail);
        renders(
            &q,
            "SELECT 'NEW?', json_build_object('vip?', x) WHERE a = ? AND b = '?' AND c = ?",
            "SELECT 'NEW?', json_build_object('vip?', x) WHERE a = $1 AND b = '?' AND c = $2",
        );
    }

    #[test]
    fn values_are_written_as_literals_unless_a_text_holds_a_backslash_or_a_control_character() {
        let mut q = Sql::new("UPDATE t SET a = ");
        q.int(-7).push(", b = ").text("it's ? $1").push(", c = ");
        q.opt_text(None)
            .push(" WHERE k IN (")
            .texts(&["키 😀".into(), "''".into()]);
        q.push(") AND d = '?'");
        assert_eq!(
            q.inlined().as_deref(),
            Some(
                "UPDATE t SET a = -7, b = 'it''s ? $1', c = NULL WHERE k IN ('키 😀', '''''') \
                 AND d = '?'"
            )
        );
        for bad in ["a\\b", "\\'", "x\ny", "nul\0"] {
            let mut q = Sql::new("SELECT ");
            q.text("fine").push(", ").text(bad);
            assert_eq!(q.inlined(), None, "{bad:?}");
        }
        assert!(matches!(q.clone().finalized(&PLAIN), Stmt::Prepared(_)));
        assert!(matches!(q.finalized(&LITERALS), Stmt::Text(_)));
    }

    /// Asserts that `q` renders as `plain` with `?` placeholders and as `numbered` with `$n`.
    fn renders(q: &Sql, plain: &str, numbered: &str) {
        assert_eq!(q.render(&PLAIN), plain);
        assert_eq!(q.render(&NUMBERED), numbered);
    }
}
