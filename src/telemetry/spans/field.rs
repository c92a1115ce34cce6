//! The writer's trace context from top-level string fields of a row's payload
//! (`tracing.traceparent_field`, `tracing.tracestate_field`), for tables without trace
//! columns.
//!
//! Guarantees: only the top level of a JSON object is looked at, the rest is skipped without
//! being built (serde's `IgnoredAny`); a payload that is not an object, a field that is not a
//! string or holds no valid `traceparent` gives no context, never an error.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::sink::TraceContext;

/// The payload fields holding the writer's context.
#[derive(Debug, Clone)]
pub(super) struct Fields {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl Fields {
    /// The context in `payload`'s fields, if it has a valid one.
    pub(super) fn read(&self, payload: &str) -> Option<TraceContext> {
        let mut de = serde_json::Deserializer::from_str(payload);
        let (tp, ts) = Seek { fields: self }.deserialize(&mut de).ok()?;
        TraceContext::parse(&tp?, ts.as_deref())
    }
}

/// Finds the two fields in a JSON object.
struct Seek<'a> {
    fields: &'a Fields,
}

type Found = (Option<String>, Option<String>);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let (mut tp, mut ts) = (None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let slot = if key == self.fields.traceparent.as_str() {
                &mut tp
            } else if Some(key.as_ref()) == self.fields.tracestate.as_deref() {
                &mut ts
            } else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            // A value of another type is no context (and not an error for the rest).
            *slot = map
                .next_value::<serde_json::Value>()?
                .as_str()
                .map(str::to_owned);
        }
        Ok((tp, ts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_top_level_string_fields_only() {
        let f = Fields {
            traceparent: "tp".into(),
            tracestate: Some("ts".into()),
        };
        let c = f
            .read(&format!(
                r#"{{"a":[1,{{"tp":"x"}}],"tp":"{TP}","ts":"k=v"}}"#
            ))
            .expect("found");
        assert_eq!(c.traceparent(), TP);
        assert_eq!(c.state.as_deref(), Some("k=v"));
        for none in [
            format!(r#"{{"nested":{{"tp":"{TP}"}}}}"#),
            r#"{"tp": 5}"#.to_string(),
            r#"{"tp": "not one"}"#.to_string(),
            format!(r#"["{TP}"]"#),
            "not json".to_string(),
            String::new(),
        ] {
            assert_eq!(f.read(&none), None, "{none}");
        }
        // Escaped keys are keys all the same.
        assert!(f.read(&format!(r#"{{"\u0074p":"{TP}"}}"#)).is_some());
    }
}
