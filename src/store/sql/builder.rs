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

    /// The condition that `e` is one of `ids`, integers of the relay's own (never empty:
    /// an empty set is no row, `1 = 0`). As `e IN (...)`, or, where the database prefers
    /// ranges ([`Syntax::ids_as_ranges`]), each run of at least [`RUN`] consecutive ids as
    /// `e BETWEEN first AND last - 1`, with `last` and the ids in no run in one `IN` list:
    /// the same rows, whatever the order or repeats of `ids`.
    ///
    /// Why a range ends one id short: a scan of a range reads the row after its end to find
    /// that it ended, and a locking read locks that row for the moment, or waits for it where
    /// another transaction holds it (without `SKIP LOCKED`). Ended right before `last`, the
    /// row it reads past its end is one of the set's own, which the statement locks anyway.
    pub fn one_of_ids(&mut self, s: &dyn Syntax, e: &str, ids: &[i64]) -> &mut Sql {
        if ids.is_empty() {
            return self.push("1 = 0");
        }
        if !s.ids_as_ranges() {
            return self
                .push(&format!("{e} IN ("))
                .ints(ids.iter().copied())
                .push(")");
        }
        let (runs, mut points) = runs_of(ids);
        self.push("(");
        for (first, last) in &runs {
            self.push(&format!("{e} BETWEEN "))
                .int(*first)
                .push(" AND ")
                .int(last - 1)
                .push(" OR ");
            points.push(*last);
        }
        points.sort_unstable();
        self.push(&format!("{e} IN (")).ints(points).push("))")
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

/// Shortest run of consecutive ids [`Sql::one_of_ids`] writes as a range.
pub const RUN: usize = 3;

/// `ids` sorted and without repeats, split into runs of at least [`RUN`] consecutive ids
/// (first, last) and the ids in no such run.
fn runs_of(ids: &[i64]) -> (Vec<(i64, i64)>, Vec<i64>) {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (mut runs, mut rest) = (Vec::new(), Vec::new());
    for run in sorted.chunk_by(|a, b| a.checked_add(1) == Some(*b)) {
        match (run.first(), run.last()) {
            (Some(&first), Some(&last)) if run.len() >= RUN => runs.push((first, last)),
            _ => rest.extend_from_slice(run),
        }
    }
    (runs, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A syntax with numbered placeholders (as PostgreSQL's) or `?`.
    struct Test {
        numbered: bool,
        literals: bool,
        ranges: bool,
    }

    const NUMBERED: Test = Test {
        numbered: true,
        literals: false,
        ranges: false,
    };
    const PLAIN: Test = Test {
        numbered: false,
        literals: false,
        ranges: false,
    };
    const LITERALS: Test = Test {
        numbered: false,
        literals: true,
        ranges: false,
    };
    const RANGES: Test = Test {
        numbered: false,
        literals: true,
        ranges: true,
    };

    impl Syntax for Test {
        fn numbered_placeholders(&self) -> bool {
            self.numbered
        }
        fn values_as_literals(&self) -> bool {
            self.literals
        }
        fn ids_as_ranges(&self) -> bool {
            self.ranges
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

    #[test]
    fn id_sets_go_as_runs_and_a_list_where_ranges_are_preferred() {
        let ids = [9, 3, 4, 5, 6, 20, 21, 30, 4, 31, 32, -1];
        let mut q = Sql::new("");
        q.one_of_ids(&RANGES, "o.id", &ids);
        assert_eq!(
            q.inlined().unwrap(),
            "(o.id BETWEEN 3 AND 5 OR o.id BETWEEN 30 AND 31 OR o.id IN (-1, 6, 9, 20, 21, 32))"
        );
        let mut q = Sql::new("");
        q.one_of_ids(&PLAIN, "id", &[2, 1]);
        assert_eq!(q.render(&PLAIN), "id IN (?, ?)");
        for s in [&RANGES, &PLAIN] {
            let mut q = Sql::new("");
            q.one_of_ids(s, "id", &[]);
            assert_eq!(q.inlined().unwrap(), "1 = 0");
        }
    }

    /// Every id is in exactly one run or in the rest, runs are at least [`RUN`] consecutive
    /// ids, and the rest holds no such run, over sets of many shapes.
    #[test]
    fn runs_cover_exactly_the_ids() {
        let mut seed = 7u64;
        for n in 0..300usize {
            let mut ids = Vec::new();
            for _ in 0..n % 40 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ids.push(((seed >> 33) % 60) as i64 - 5);
            }
            let (runs, rest) = runs_of(&ids);
            let mut got: Vec<i64> = runs.iter().flat_map(|&(a, b)| a..=b).collect();
            got.extend(&rest);
            got.sort_unstable();
            let mut want = ids.clone();
            want.sort_unstable();
            want.dedup();
            assert_eq!(got, want, "{ids:?}");
            assert!(runs.iter().all(|&(a, b)| b - a + 1 >= RUN as i64));
            let (again, _) = runs_of(&rest);
            assert!(again.is_empty(), "{rest:?}");
        }
        let top = [i64::MAX - 2, i64::MAX, i64::MAX - 1];
        assert_eq!(runs_of(&top).0, [(i64::MAX - 2, i64::MAX)]);
    }
}
