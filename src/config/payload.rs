//! `table.payload_object`: the payload as a JSON object the database builds from columns
//! (docs/adopting-a-table.md, "Keys").
//!
//! Guarantees: each entry is `key = "column"` (the column's value as text), `key = { json =
//! "column" }` (a JSON column embedded as JSON), or a table (a nested object), and nothing
//! else. A table holding `json` is the second form, so any other key in it is refused by its
//! full path (`table.payload_object.body.as_text: unknown key (expected json)`) rather than
//! dropped; a value that is neither a column name nor a table is refused by its path too.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::ConfigError;
use super::error::keyed;
use super::validate::{column_name, literal_safe};

/// One entry of `table.payload_object`.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadValue {
    /// A column, its value as text.
    Column(String),
    /// `{ json = "column" }`: a column holding JSON, embedded as JSON.
    Json { json: String },
    /// A nested object.
    Object(BTreeMap<String, PayloadValue>),
}

/// An entry as written, before it is told which form it is: the form of a table depends on
/// all of its keys, which come in no particular order.
enum Node {
    Text(String),
    Table(Vec<(String, Node)>),
    /// Anything else, by what it is ("a boolean").
    Other(&'static str),
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a column name, { json = \"column\" } or a table")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Text(v.to_string()))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Other("a number"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Other("empty"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Node::Other("a list"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            entries.push((k, map.next_value::<Node>()?));
        }
        Ok(Node::Table(entries))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for PayloadValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PayloadValue, D::Error> {
        let node = Node::deserialize(d)?;
        PayloadValue::from_node("", node).map_err(|(path, problem)| keyed(&path, problem))
    }
}

/// `path.key`, or `key` at the top.
fn below(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl PayloadValue {
    /// The entry `node`, at `path` below the entry being read: an error is (path, problem).
    fn from_node(path: &str, node: Node) -> Result<PayloadValue, (String, String)> {
        match node {
            Node::Text(c) => Ok(PayloadValue::Column(c)),
            Node::Other(what) => Err((
                path.to_string(),
                format!("must be a column name, {{ json = \"column\" }} or a table, not {what}"),
            )),
            Node::Table(entries) if entries.iter().any(|(k, _)| k == "json") => {
                let mut json = None;
                for (k, v) in entries {
                    match (k.as_str(), v) {
                        ("json", Node::Text(c)) => json = Some(c),
                        ("json", _) => {
                            return Err((
                                below(path, "json"),
                                "must be the name of a column holding JSON".into(),
                            ));
                        }
                        _ => {
                            return Err((
                                below(path, &k),
                                "unknown key (expected json: { json = \"column\" } embeds a \
                                 JSON column, and takes no other key)"
                                    .into(),
                            ));
                        }
                    }
                }
                Ok(PayloadValue::Json {
                    json: json.unwrap_or_default(),
                })
            }
            Node::Table(entries) => {
                let mut out = BTreeMap::new();
                for (k, v) in entries {
                    let at = below(path, &k);
                    out.insert(k, PayloadValue::from_node(&at, v)?);
                }
                Ok(PayloadValue::Object(out))
            }
        }
    }
}

/// Refuses an object that is empty, or holds a key that cannot be an SQL literal or a value
/// that is not a plain column name, naming the key (`table.payload_object.p.x`).
pub(super) fn validate(key: &str, obj: &BTreeMap<String, PayloadValue>) -> Result<(), ConfigError> {
    if obj.is_empty() {
        return Err(ConfigError::new(key, "must have at least one key"));
    }
    for (k, v) in obj {
        let at = format!("{key}.{k}");
        if !literal_safe(k) {
            return Err(ConfigError::new(
                at,
                "a payload key must be 1 to 200 characters without backslash or control \
                 characters",
            ));
        }
        match v {
            PayloadValue::Column(c) => column_name(&at, c)?,
            PayloadValue::Json { json } => column_name(&format!("{at}.json"), json)?,
            PayloadValue::Object(inner) => validate(&at, inner)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(toml: &str) -> Result<BTreeMap<String, PayloadValue>, ConfigError> {
        config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::within("table.payload_object", &e))
    }

    #[test]
    fn each_form_is_read() {
        let o = object(
            "a = \"col_a\"\nb = { json = \"col_b\" }\n[c]\nd = \"col_d\"\n[c.e]\njson = \"col_e\"\n",
        )
        .unwrap();
        assert_eq!(o["a"], PayloadValue::Column("col_a".into()));
        assert_eq!(
            o["b"],
            PayloadValue::Json {
                json: "col_b".into()
            }
        );
        let PayloadValue::Object(c) = &o["c"] else {
            panic!("{o:?}")
        };
        assert_eq!(
            c["e"],
            PayloadValue::Json {
                json: "col_e".into()
            }
        );
    }

    #[test]
    fn anything_else_is_refused_by_its_path() {
        for (toml, key) in [
            (
                "body = { json = \"body\", as_text = true }",
                "table.payload_object.body.as_text",
            ),
            (
                "body = { as_text = true, json = \"body\" }",
                "table.payload_object.body.as_text",
            ),
            (
                "[p.q]\njson = \"x\"\nextra = \"y\"",
                "table.payload_object.p.q.extra",
            ),
            ("body = { json = 1 }", "table.payload_object.body.json"),
            ("body = true", "table.payload_object.body"),
            ("[p]\nq = [\"a\"]", "table.payload_object.p.q"),
            ("[p.q]\nr = 1.5", "table.payload_object.p.q.r"),
        ] {
            let e = object(toml).expect_err(toml);
            assert_eq!(e.key, key, "{toml}: {e}");
        }
        let e = object("body = { json = \"body\", as_text = true }").unwrap_err();
        assert!(e.problem.starts_with("unknown key (expected json"), "{e}");
    }
}
