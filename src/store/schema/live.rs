//! A mapped table as the database's catalog describes it (information_schema, `pg_enum`,
//! `pragma_table_xinfo`): its columns with their types, lengths, nullability and collations,
//! and how a configured name resolves among them.
//!
//! Guarantee: a configured name is taken for a live column only if the database resolves it
//! to that column when it is quoted, as every statement on a mapped table quotes it
//! (case-sensitive on PostgreSQL, ignoring ASCII case on MySQL/MariaDB and SQLite): what the
//! check accepts is what the claims name.

use std::collections::BTreeMap;

use sqlx::Row;

use super::SchemaSql;
use crate::store::db::Db;
use crate::store::sql::ident::bare;
use crate::store::sql::payload::LiveType;

/// One column of the live table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveColumn {
    pub name: String,
    /// The server's type name, lower-case (PostgreSQL's `data_type`, MySQL's `DATA_TYPE`,
    /// SQLite's declared type).
    pub ty: String,
    /// The full type: PostgreSQL's `udt_name` (an enum type's name), MySQL's `COLUMN_TYPE`
    /// (`enum('A','B')`, `smallint(5) unsigned`), SQLite's declared type.
    pub full: String,
    /// Characters a text column holds at most.
    pub max_len: Option<i64>,
    pub nullable: bool,
    pub collation: Option<String>,
    pub charset: Option<String>,
}

/// The kinds of column type the check tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Text,
    Time,
    Json,
    Other,
}

/// What a column's declared type is, by the server's name for it.
pub fn kind(t: &str) -> Kind {
    let t = t.to_ascii_lowercase();
    if t.contains("int") && !t.contains("interval") && !t.contains("point") {
        Kind::Int
    } else if t.starts_with("json") {
        Kind::Json
    } else if t.contains("timestamp") || t.contains("datetime") {
        Kind::Time
    } else if t.contains("char")
        || t.contains("text")
        || t == "enum"
        || t == "set"
        || t == "user-defined"
    {
        Kind::Text
    } else {
        Kind::Other
    }
}

/// The table's columns, or `None` when there is no such table.
pub async fn columns(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Option<Vec<LiveColumn>>> {
    let rows = db
        .query(sql.live_columns(db.table_name()))
        .fetch_all(db.pool())
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let text = |i: usize| {
            r.try_get::<Option<String>, _>(i)
                .map(Option::unwrap_or_default)
        };
        out.push(LiveColumn {
            name: text(0)?,
            ty: text(1)?.to_ascii_lowercase(),
            full: text(2)?,
            max_len: r.try_get::<Option<i64>, _>(3)?,
            nullable: !text(4)?.eq_ignore_ascii_case("NO"),
            collation: r.try_get::<Option<String>, _>(5)?,
            charset: r.try_get::<Option<String>, _>(6)?,
        });
    }
    Ok(Some(out))
}

/// The live column a configured name (its SQL form or bare) resolves to.
pub fn find<'a>(
    sql: &dyn SchemaSql,
    live: &'a [LiveColumn],
    configured: &str,
) -> Option<&'a LiveColumn> {
    let name = bare(configured);
    live.iter().find(|c| sql.resolves(&name, &c.name))
}

/// `; did you mean "x"?` when a name that resolves to nothing differs from a live one only in
/// case (PostgreSQL: a column created quoted in mixed case, or unquoted and so lower case).
pub fn did_you_mean<'a>(names: impl IntoIterator<Item = &'a str>, configured: &str) -> String {
    let name = bare(configured);
    names
        .into_iter()
        .find(|n| n.eq_ignore_ascii_case(&name) && **n != name)
        .map_or(String::new(), |n| format!("; did you mean \"{n}\"?"))
}

/// The names of the tables beside it, for a table name that resolves to nothing.
pub async fn table_names(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Vec<String>> {
    db.query(sql.table_names())
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok(r.try_get::<String, _>(0)?))
        .collect()
}

/// The server's type of every mapped column the relay reads as text or writes expressions
/// over (the payload object's, the recipient, the ordering key, the trace columns, the
/// channel, the status), by its SQL form: what [`Db::with_types`] takes.
pub fn text_types(db: &Db, sql: &dyn SchemaSql, live: &[LiveColumn]) -> BTreeMap<String, LiveType> {
    let c = db.cols();
    let mut read: Vec<String> = c
        .payload_columns()
        .into_iter()
        .filter(|(_, _, json)| !json)
        .map(|(_, col, _)| col)
        .collect();
    read.extend(c.recipient.iter().cloned());
    read.extend(c.ordering_key.iter().cloned());
    read.extend(c.traceparent.iter().cloned());
    read.extend(c.tracestate.iter().cloned());
    read.extend(c.channel_column().map(str::to_string));
    read.push(c.status.clone());
    read.into_iter()
        .filter_map(|col| {
            let found = find(sql, live, &col)?;
            let ty = LiveType {
                ty: found.ty.clone(),
                max_len: found.max_len,
            };
            Some((col, ty))
        })
        .collect()
}

/// Whether an index (or, `trigger`, a trigger) of this name exists on the table.
pub async fn exists(
    db: &Db,
    sql: &dyn SchemaSql,
    name: &str,
    trigger: bool,
) -> anyhow::Result<bool> {
    let n: i64 = db
        .query(sql.object_exists(db.table_name(), name, trigger))
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(n > 0)
}

/// A bookkeeping column `migrate --adopt` adds: (SQL form of its name, type).
pub type Bookkeeping = (String, &'static str);

/// The bookkeeping columns the relay needs on this table.
pub fn bookkeeping(db: &Db, sql: &dyn SchemaSql) -> Vec<Bookkeeping> {
    let c = db.cols();
    let ty = sql.column_types();
    let mut out: Vec<Bookkeeping> = vec![
        ("claimed_by".into(), ty.claimer),
        ("claim_token".into(), ty.token),
        ("claimed_until".into(), ty.time),
    ];
    let t = &c.owned;
    if t.sent_at {
        out.push((c.sent_at.clone(), ty.time));
    }
    if t.attempts {
        out.push((c.attempts.clone(), ty.attempts));
    }
    if t.next_attempt_at {
        out.push((c.next_attempt_at.clone(), ty.time));
    }
    out
}

/// The members of an enum column, in order (`None`: not an enum). PostgreSQL lists them in
/// `pg_enum`; MySQL in the column's type, `enum('A','B''s')`.
pub async fn enum_members(
    db: &Db,
    sql: &dyn SchemaSql,
    col: &LiveColumn,
) -> anyhow::Result<Option<Vec<String>>> {
    if col.ty == "enum" {
        return Ok(Some(mysql_members(&col.full)));
    }
    if col.ty != "user-defined" {
        return Ok(None);
    }
    let Some(q) = sql.enum_labels(&col.full) else {
        return Ok(None);
    };
    let labels = db
        .query(q)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>(0))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((!labels.is_empty()).then_some(labels))
}

/// The members of MySQL's `enum('A','B''s')` (quotes doubled inside a member).
fn mysql_members(full: &str) -> Vec<String> {
    let inner = full
        .find('(')
        .and_then(|i| full.rfind(')').map(|j| &full[i + 1..j]))
        .unwrap_or("");
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    member.push('\'');
                }
                '\'' => break,
                c => member.push(c),
            }
        }
        out.push(member);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_server_types() {
        for (t, k) in [
            ("bigint", Kind::Int),
            ("integer", Kind::Int),
            ("tinyint", Kind::Int),
            ("character varying", Kind::Text),
            ("varchar", Kind::Text),
            ("enum", Kind::Text),
            ("set", Kind::Text),
            ("USER-DEFINED", Kind::Text),
            ("longtext", Kind::Text),
            ("jsonb", Kind::Json),
            ("timestamp with time zone", Kind::Time),
            ("datetime", Kind::Time),
            ("numeric", Kind::Other),
            ("interval", Kind::Other),
            ("point", Kind::Other),
            ("bytea", Kind::Other),
        ] {
            assert_eq!(kind(t), k, "{t}");
        }
    }

    #[test]
    fn members_of_a_mysql_enum() {
        assert_eq!(mysql_members("enum('A','B''s','')"), ["A", "B's", ""]);
        assert_eq!(mysql_members("enum('a,b','c')"), ["a,b", "c"]);
        assert!(mysql_members("varchar(3)").is_empty());
    }

    #[test]
    fn suggestions_differ_only_in_case() {
        let names = ["receivermobileno", "status"];
        assert_eq!(
            did_you_mean(names, "\"receiverMobileNo\""),
            "; did you mean \"receivermobileno\"?"
        );
        assert_eq!(did_you_mean(names, "status"), "");
        assert_eq!(did_you_mean(names, "phone"), "");
    }
}
