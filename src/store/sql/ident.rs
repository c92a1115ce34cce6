//! Column names that are SQL keywords: an application's table may well have a column named
//! `key`, `order` or `type`. Such a name is quoted for the database ([`quote`]); every other
//! name stays bare, since quoting makes a name case-sensitive on PostgreSQL (an unquoted
//! `receiverMobileNo` is the column `receivermobileno`).

use std::collections::BTreeMap;

use super::dialect::Syntax;
use crate::config::PayloadValue;

/// Words that cannot be a bare column name in at least one of the databases (the reserved
/// words an outbox table's columns plausibly use).
const KEYWORDS: &[&str] = &[
    "all",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "both",
    "by",
    "case",
    "cast",
    "change",
    "check",
    "collate",
    "column",
    "condition",
    "constraint",
    "create",
    "cross",
    "current_date",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "delete",
    "desc",
    "describe",
    "distinct",
    "div",
    "do",
    "else",
    "end",
    "except",
    "exists",
    "explain",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "grant",
    "group",
    "having",
    "if",
    "in",
    "index",
    "inner",
    "insert",
    "interval",
    "into",
    "is",
    "join",
    "key",
    "keys",
    "leading",
    "left",
    "like",
    "limit",
    "lock",
    "match",
    "mod",
    "natural",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "option",
    "or",
    "order",
    "outer",
    "primary",
    "range",
    "rank",
    "read",
    "references",
    "release",
    "rename",
    "repeat",
    "replace",
    "require",
    "return",
    "returning",
    "right",
    "row",
    "rows",
    "schema",
    "select",
    "signal",
    "some",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "update",
    "usage",
    "user",
    "using",
    "values",
    "when",
    "where",
    "window",
    "with",
    "write",
    "xor",
];

/// `name` quoted for the database if it is a keyword.
pub(super) fn quote(s: &dyn Syntax, name: &str) -> String {
    if !KEYWORDS.contains(&name.to_ascii_lowercase().as_str()) {
        return name.to_string();
    }
    s.quote_ident(name)
}

/// A column name without the quotes [`Columns::quoted_for`] may have added.
pub fn bare(name: &str) -> &str {
    name.trim_matches(|c| c == '"' || c == '`')
}

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
