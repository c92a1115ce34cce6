//! The status values of `[table.status]` against the live status column: every value must be
//! one the column can hold (an integer in its type's range, text within its length, a member
//! of its enum, characters of its character set), and no two values of different states may
//! be equal as the column compares them (its collation may ignore case and trailing spaces:
//! `ready` and `READY`, `NEW` and `NEW `), or a finished row would read as unfinished and be
//! sent again, or the relay could not write a state at all.
//!
//! Equality is asked of the database itself, in the column's own terms: the value is put in
//! a column of the same type and collation by `SELECT col FROM t WHERE 1 = 0 UNION ALL
//! SELECT <value>`, and compared there with the others (an integer column is compared by
//! number here instead: MySQL would compare the union's text). Values are written as SQL
//! literals (validated by the configuration, quotes doubled), never bound: PostgreSQL must
//! see them untyped to convert them to the column's type.
//!
//! Guarantee: every refusal names the key of the value at fault (`table.status.failed`) and
//! what the column is. What this cannot see (a CHECK constraint, a trigger) is caught when a
//! result is written: the row is parked, never sent again (docs/design.md, "Results").

use sqlx::Row;

use super::live::{LiveColumn, enum_members};
use super::{Problem, SchemaSql};
use crate::config::Code;
use crate::store::db::Db;
use crate::store::fault::is_transient;
use crate::store::sql::State;

/// One configured value: its key, state and value.
struct Value {
    key: String,
    state: State,
    code: Code,
}

/// Checks every status value against the live status column `col`.
pub async fn check(db: &Db, sql: &dyn SchemaSql, col: &LiveColumn) -> anyhow::Result<Vec<Problem>> {
    let c = db.cols();
    let mut values: Vec<Value> = Vec::new();
    for state in State::ALL {
        for code in c.values(state) {
            // A retry state without values of its own writes the first pending value:
            // checked once, as pending.
            if state == State::Retry && c.values(State::Pending).contains(code) {
                continue;
            }
            values.push(Value {
                key: format!("table.status.{}", state.name().to_ascii_lowercase()),
                state,
                code: code.clone(),
            });
        }
    }
    let mut problems = Vec::new();
    let range = integer_range(col);
    let typed = sql.typed_columns();
    if let Some(range) = range {
        // Where columns take any value (SQLite), an integer column stores text that reads as
        // a number as that number, and keeps other text: numbers are compared here, text
        // below.
        fits_integers(&values, col, range, typed, &mut problems);
        if typed {
            return Ok(problems);
        }
    }
    if typed {
        let fits = fits_text(db, sql, &values, col, &mut problems).await;
        unchecked(fits, col, &mut problems)?;
    }
    if problems.is_empty() {
        let apart = told_apart(db, col, &values, &mut problems).await;
        unchecked(apart, col, &mut problems)?;
    }
    Ok(problems)
}

/// A check the database refused to answer (not for the moment: a type it cannot compare)
/// becomes a problem naming the column, so that `run` refuses instead of retrying for ever.
fn unchecked(
    result: anyhow::Result<()>,
    col: &LiveColumn,
    problems: &mut Vec<Problem>,
) -> anyhow::Result<()> {
    match result {
        Err(e) if !is_transient(&e) => {
            problems.push(Problem::at(
                "table.columns.status",
                format!(
                    "the status values could not be checked against column \"{}\" ({}): {e:#}",
                    col.name, col.full
                ),
            ));
            Ok(())
        }
        other => other,
    }
}

/// The range of an integer column, by its type (`None`: not an integer column).
fn integer_range(col: &LiveColumn) -> Option<(i128, i128)> {
    let unsigned = col.full.to_ascii_lowercase().contains("unsigned");
    let bits = match col.ty.as_str() {
        "tinyint" => 8,
        "smallint" => 16,
        "mediumint" => 24,
        "int" | "integer" => 32,
        "bigint" => 64,
        _ => return None,
    };
    Some(match unsigned {
        true => (0, (1i128 << bits) - 1),
        false => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
    })
}

/// Every value is an integer in the column's range (`typed`; else values that are not
/// numbers are left to the comparison in the column), and no two states share one.
fn fits_integers(
    values: &[Value],
    col: &LiveColumn,
    (lo, hi): (i128, i128),
    typed: bool,
    problems: &mut Vec<Problem>,
) {
    let mut numbers: Vec<(usize, i128)> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let n = match &v.code {
            Code::Int(n) => Some(i128::from(*n)),
            Code::Text(t) => t.trim().parse::<i128>().ok(),
        };
        match n {
            Some(n) if !typed || (lo..=hi).contains(&n) => numbers.push((i, n)),
            None if !typed => {}
            Some(n) => problems.push(Problem::at(
                &v.key,
                format!(
                    "value {n} does not fit column \"{}\" ({}: {lo} to {hi}); the relay could \
                     never write it",
                    col.name, col.full
                ),
            )),
            None => problems.push(Problem::at(
                &v.key,
                format!(
                    "value \"{}\" is not a number, and column \"{}\" holds integers ({})",
                    v.code, col.name, col.full
                ),
            )),
        }
    }
    for (a, (i, n)) in numbers.iter().enumerate() {
        if let Some((j, _)) = numbers[..a]
            .iter()
            .find(|(j, m)| m == n && clash(&values[*j], &values[*i]))
        {
            problems.push(same(&values[*i], &values[*j], col, "as a number"));
        }
    }
}

/// Every value fits a text column: its length, its enum's members, its character set.
async fn fits_text(
    db: &Db,
    sql: &dyn SchemaSql,
    values: &[Value],
    col: &LiveColumn,
    problems: &mut Vec<Problem>,
) -> anyhow::Result<()> {
    let members = enum_members(db, sql, col).await?;
    for v in values {
        let text = v.code.to_string();
        if let Some(max) = col.max_len
            && members.is_none()
            && text.chars().count() as i64 > max
        {
            problems.push(Problem::at(
                &v.key,
                format!(
                    "value \"{text}\" is {} characters; column \"{}\" ({}) holds at most {max}",
                    text.chars().count(),
                    col.name,
                    col.full
                ),
            ));
        }
        if let Some(members) = &members
            && !is_member(db, col, &text, members).await?
        {
            problems.push(Problem::at(
                &v.key,
                format!(
                    "value \"{text}\" is not a member of column \"{}\"'s type ({}: {}); the \
                     relay could never write it",
                    col.name,
                    col.full,
                    members.join(", ")
                ),
            ));
        }
        if let Some(charset) = &col.charset
            && !representable(db, charset, &text).await?
        {
            problems.push(Problem::at(
                &v.key,
                format!(
                    "value \"{text}\" has characters column \"{}\"'s character set {charset} \
                     cannot hold",
                    col.name
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `text` is one of `members`, as the database compares them in the column (MySQL's
/// enums take a member in any case its collation ignores; PostgreSQL's are exact).
async fn is_member(
    db: &Db,
    col: &LiveColumn,
    text: &str,
    members: &[String],
) -> anyhow::Result<bool> {
    if members.iter().any(|m| m == text) {
        return Ok(true);
    }
    if col.ty != "enum" {
        return Ok(false);
    }
    let others: Vec<Code> = members.iter().map(|m| Code::Text(m.clone())).collect();
    let eq = equal_in_column(db, col, &Code::Text(text.into()), &others).await?;
    Ok(eq.iter().any(|e| *e))
}

/// Whether `text` survives a round trip through character set `charset` (MySQL).
async fn representable(db: &Db, charset: &str, text: &str) -> anyhow::Result<bool> {
    if text.is_ascii()
        || !charset
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Ok(true);
    }
    let lit = Code::Text(text.into()).literal();
    let q = format!(
        "SELECT CAST(CONVERT(CONVERT({lit} USING {charset}) USING utf8mb4) = {lit} \
         COLLATE utf8mb4_bin AS SIGNED)"
    );
    let same: i64 = db.sql(&q).fetch_one(db.pool()).await?.try_get(0)?;
    Ok(same == 1)
}

/// No two values of different states are equal in the column (see the module doc).
async fn told_apart(
    db: &Db,
    col: &LiveColumn,
    values: &[Value],
    problems: &mut Vec<Problem>,
) -> anyhow::Result<()> {
    for (i, v) in values.iter().enumerate() {
        let later: Vec<&Value> = values[i + 1..].iter().filter(|w| clash(v, w)).collect();
        if later.is_empty() {
            continue;
        }
        let codes: Vec<Code> = later.iter().map(|w| w.code.clone()).collect();
        let eq = match equal_in_column(db, col, &v.code, &codes).await {
            Ok(eq) => eq,
            Err(e) => {
                problems.push(Problem::at(
                    &v.key,
                    format!(
                        "value \"{}\" cannot be compared in column \"{}\" ({}): {e}",
                        v.code, col.name, col.full
                    ),
                ));
                continue;
            }
        };
        for (w, eq) in later.iter().zip(eq) {
            if eq {
                problems.push(same(w, v, col, "as a value"));
            }
        }
    }
    Ok(())
}

/// Whether two values must be told apart: of different states, except pending and retry (a
/// retried row may go back to the pending value, see `Columns::from_settings`).
fn clash(a: &Value, b: &Value) -> bool {
    let open = |s: State| matches!(s, State::Pending | State::Retry);
    a.state != b.state && !(open(a.state) && open(b.state))
}

/// The problem of `v` being equal to the earlier `w`.
fn same(v: &Value, w: &Value, col: &LiveColumn, how: &str) -> Problem {
    let collation = col
        .collation
        .as_ref()
        .map_or(String::new(), |c| format!(", collation {c}"));
    Problem::at(
        &v.key,
        format!(
            "value \"{}\" equals \"{}\" ({}) {how} of column \"{}\" ({}{collation}): the two \
             states could not be told apart (a finished row could be taken for an unfinished \
             one and sent again)",
            v.code, w.code, w.key, col.name, col.full
        ),
    )
}

/// For each of `others`: whether it equals `v` when `v` is a value of the column.
async fn equal_in_column(
    db: &Db,
    col: &LiveColumn,
    v: &Code,
    others: &[Code],
) -> anyhow::Result<Vec<bool>> {
    let column = db.syntax().quote_ident(&col.name);
    let tests: Vec<String> = others
        .iter()
        .map(|o| {
            format!(
                "CASE WHEN x.{column} = {} THEN 'y' ELSE 'n' END",
                o.literal()
            )
        })
        .collect();
    let q = format!(
        "SELECT {} FROM (SELECT {column} FROM {} WHERE 1 = 0 UNION ALL SELECT {}) x",
        tests.join(", "),
        db.table(),
        v.literal()
    );
    let row = db.sql(&q).fetch_one(db.pool()).await?;
    (0..others.len())
        .map(|i| Ok(row.try_get::<String, _>(i)? == "y"))
        .collect()
}
