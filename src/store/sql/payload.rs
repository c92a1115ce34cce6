//! How a claim reads the payload: one column, or a JSON object the database builds from the
//! row's columns (`[table.payload_object]`, docs/adopting-a-table.md).
//!
//! Guarantees: an object is built by the database (`json_build_object`, `JSON_OBJECT`,
//! `json_object`), never by concatenating text, so every value is escaped as JSON; its keys
//! are SQL string literals (quotes doubled; the configuration refuses backslashes and control
//! characters), which the statement builder never takes for placeholders; a column's value
//! becomes text in the documented format of its type ([`Syntax::scalar_text`]); an object of
//! any size is built where the database can join objects, and refused by the live check
//! where it cannot ([`Payload::widest_object`]).

use std::collections::BTreeMap;

use super::dialect::Syntax;
use crate::config::{PayloadValue, sql_string};

/// What the live table says of a mapped column (read at start, `Columns::with_types`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveType {
    /// The server's type name, lower-case.
    pub ty: String,
    /// Characters a text column holds at most.
    pub max_len: Option<i64>,
}

/// How the payload is read.
#[derive(Debug, Clone)]
pub enum Payload {
    /// One column holding the JSON payload (its SQL form).
    Column(String),
    /// An object built from columns (their SQL forms).
    Object(BTreeMap<String, PayloadValue>),
}

impl Payload {
    /// The payload of row `a` as JSON; `types` has the server's type of each column (by its
    /// SQL form), where known.
    pub fn render(&self, a: &str, s: &dyn Syntax, types: &BTreeMap<String, LiveType>) -> String {
        match self {
            Payload::Column(c) => format!("{a}{c}"),
            Payload::Object(obj) => object(a, obj, s, types),
        }
    }

    /// (key, column SQL form, embedded as JSON) of every column it reads.
    pub fn columns(&self) -> Vec<(String, String, bool)> {
        match self {
            Payload::Column(c) => vec![("table.columns.payload".into(), c.clone(), false)],
            Payload::Object(obj) => {
                let mut out = Vec::new();
                collect("table.payload_object", obj, &mut out);
                out
            }
        }
    }

    /// The key and number of pairs of its widest object (nested ones included), if any.
    pub fn widest_object(&self) -> Option<(String, usize)> {
        fn walk(key: &str, obj: &BTreeMap<String, PayloadValue>, best: &mut (String, usize)) {
            if obj.len() > best.1 {
                *best = (key.to_string(), obj.len());
            }
            for (k, v) in obj {
                if let PayloadValue::Object(inner) = v {
                    walk(&format!("{key}.{k}"), inner, best);
                }
            }
        }
        match self {
            Payload::Column(_) => None,
            Payload::Object(obj) => {
                let mut best = (String::new(), 0);
                walk("table.payload_object", obj, &mut best);
                Some(best)
            }
        }
    }
}

/// (key, column, embedded as JSON) of every column an object reads.
fn collect(key: &str, obj: &BTreeMap<String, PayloadValue>, out: &mut Vec<(String, String, bool)>) {
    for (k, v) in obj {
        let at = format!("{key}.{k}");
        match v {
            PayloadValue::Column(c) => out.push((at, c.clone(), false)),
            PayloadValue::Json { json } => out.push((at, json.clone(), true)),
            PayloadValue::Object(inner) => collect(&at, inner, out),
        }
    }
}

/// A JSON object built by the database from the columns of row `a`.
fn object(
    a: &str,
    obj: &BTreeMap<String, PayloadValue>,
    s: &dyn Syntax,
    types: &BTreeMap<String, LiveType>,
) -> String {
    let args: Vec<String> = obj
        .iter()
        .map(|(k, v)| {
            let value = match v {
                PayloadValue::Column(c) => {
                    let ty = types.get(c).map_or("", |t| t.ty.as_str());
                    s.scalar_text(&format!("{a}{c}"), ty)
                }
                PayloadValue::Json { json } => s.json_value(&format!("{a}{json}")),
                PayloadValue::Object(inner) => object(a, inner, s, types),
            };
            format!("{}, {value}", sql_string(k))
        })
        .collect();
    s.json_object(&args)
}
