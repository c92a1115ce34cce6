//! Which subject a row is published to, and what a subject or stream name may be.
//!
//! Guarantees: a configured subject is a valid NATS publish subject (no wildcards, no empty
//! tokens, no white space); a subject taken from a payload field is confined to
//! `subject_prefix` and to tokens of letters, digits, `-` and `_` (so a row cannot name a
//! wildcard, a `$JS.API` / `$SYS` subject or another client's `_INBOX`), and a row whose field
//! is missing or not such a value is refused with a reason naming the field.

use std::borrow::Cow;

/// Longest subject the relay publishes to (NATS has no hard limit; long subjects cost every
/// server memory and are almost always a mistake).
pub const MAX_SUBJECT_BYTES: usize = 255;

/// Where a sink's rows go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Every row to this subject (`subject`).
    Fixed(String),
    /// `prefix` followed by the string value of the payload's top-level `field`
    /// (`subject_field`, `subject_prefix`).
    Field { field: String, prefix: String },
}

impl Route {
    /// The subject for a row whose payload (JSON text) is `payload`, or why there is none
    /// (the row's fault: it is FAILED with this reason).
    pub fn subject_for<'a>(&'a self, payload: &str) -> Result<Cow<'a, str>, String> {
        let (field, prefix) = match self {
            Route::Fixed(s) => return Ok(Cow::Borrowed(s)),
            Route::Field { field, prefix } => (field, prefix),
        };
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(payload)
            .map_err(|_| {
                format!("the payload is not a JSON object, so it has no field \"{field}\" to name the subject")
            })?;
        let value = match object.get(field.as_str()) {
            Some(serde_json::Value::String(s)) => s,
            Some(_) => return Err(format!("the payload's field \"{field}\" is not a string")),
            None => {
                return Err(format!(
                    "the payload has no field \"{field}\" to name the subject"
                ));
            }
        };
        check_from_payload(value, prefix)
            .map_err(|why| format!("the payload's field \"{field}\" {why}"))?;
        Ok(Cow::Owned(format!("{prefix}{value}")))
    }
}

/// A subject value taken from a payload: tokens of `[A-Za-z0-9_-]`, the first not `_INBOX`,
/// and short enough with `prefix` in front.
fn check_from_payload(value: &str, prefix: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty".into());
    }
    if prefix.len() + value.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "makes a subject longer than {MAX_SUBJECT_BYTES} bytes"
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if value
        .split('.')
        .any(|t| t.is_empty() || !t.chars().all(allowed))
    {
        // The value is not quoted: it may be anything, control characters included.
        return Err(
            "is not a subject of dot-separated tokens of letters, digits, '-' and '_'".into(),
        );
    }
    if prefix.is_empty() && value.split('.').next() == Some("_INBOX") {
        return Err("names a reply inbox (_INBOX), which rows may not publish to".into());
    }
    Ok(())
}

/// Why `subject` is not a valid publish subject, if it is not.
fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is empty".into());
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(format!("is longer than {MAX_SUBJECT_BYTES} bytes"));
    }
    if subject
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
    {
        return Err(format!(
            "\"{subject}\" has white space or a wildcard (* or >); a publish needs one literal subject"
        ));
    }
    if subject.split('.').any(str::is_empty) {
        return Err(format!(
            "\"{subject}\" has an empty token (a leading, trailing or double dot)"
        ));
    }
    Ok(())
}

/// `subject`: a literal publish subject, not one of the server's own API subjects.
pub fn check_configured(subject: &str) -> Result<(), String> {
    check_subject(subject)?;
    if ["$JS.", "$SYS.", "_INBOX."]
        .iter()
        .any(|p| subject.starts_with(p))
    {
        return Err(format!(
            "\"{subject}\" is a NATS API or reply subject, not one a stream can hold"
        ));
    }
    Ok(())
}

/// `subject_prefix`: empty, or subject tokens ending in a dot (`events.`).
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    match prefix.strip_suffix('.') {
        Some(head) => check_configured(head),
        None => Err(format!(
            "\"{prefix}\" must end with a dot: the payload's value is appended as further tokens"
        )),
    }
}

/// `stream`: a JetStream stream name (no white space, `.`, `*`, `>`, path separators).
pub fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SUBJECT_BYTES {
        return Err("must be a stream name of 1 to 255 characters".into());
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c))
    {
        return Err(format!(
            "\"{name}\" is not a stream name (no white space, '.', '*', '>', '/' or '\\')"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(prefix: &str) -> Route {
        Route::Field {
            field: "type".into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn a_fixed_subject_ignores_the_payload() {
        let r = Route::Fixed("orders".into());
        assert_eq!(r.subject_for("not json").unwrap(), "orders");
    }

    #[test]
    fn a_field_names_the_subject_under_the_prefix() {
        let r = field("events.");
        assert_eq!(
            r.subject_for(r#"{"type":"order.shipped","id":1}"#).unwrap(),
            "events.order.shipped"
        );
        assert_eq!(
            field("").subject_for(r#"{"type":"a-b_c.D9"}"#).unwrap(),
            "a-b_c.D9"
        );
    }

    #[test]
    fn a_row_cannot_publish_anywhere() {
        let r = field("events.");
        for (payload, why) in [
            (r#"{"type":"a.*"}"#, "tokens"),
            (r#"{"type":"a.>"}"#, "tokens"),
            (r#"{"type":"$JS.API.STREAM.DELETE.X"}"#, "tokens"),
            (r#"{"type":"a..b"}"#, "tokens"),
            (r#"{"type":"a b"}"#, "tokens"),
            (r#"{"type":"a\r\nPUB x 1"}"#, "tokens"),
            (r#"{"type":""}"#, "empty"),
            (r#"{"type":7}"#, "not a string"),
            (r#"{"kind":"a"}"#, "no field"),
            (r#"["type"]"#, "not a JSON object"),
            ("{", "not a JSON object"),
        ] {
            let e = r.subject_for(payload).unwrap_err();
            assert!(e.contains(why), "{payload}: {e}");
            assert!(!e.contains("PUB x"), "the value is not quoted: {e}");
        }
        let long = format!(r#"{{"type":"{}"}}"#, "a".repeat(250));
        assert!(r.subject_for(&long).unwrap_err().contains("longer"));
        let e = field("")
            .subject_for(r#"{"type":"_INBOX.abc"}"#)
            .unwrap_err();
        assert!(e.contains("_INBOX"), "{e}");
        assert!(field("x.").subject_for(r#"{"type":"_INBOX.abc"}"#).is_ok());
    }

    #[test]
    fn configured_subjects_prefixes_and_stream_names() {
        assert!(check_configured("orders.created").is_ok());
        assert!(check_configured("orders.*").is_err());
        assert!(check_configured("orders.>").is_err());
        assert!(check_configured(".orders").is_err());
        assert!(check_configured("orders.").is_err());
        assert!(check_configured("or ders").is_err());
        assert!(check_configured("$JS.API.INFO").is_err());
        assert!(check_configured("_INBOX.x").is_err());
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("events.").is_ok());
        assert!(check_prefix("events").is_err());
        assert!(check_prefix("events..").is_err());
        assert!(check_stream_name("EVENTS_1-a").is_ok());
        for bad in ["", "A.B", "A B", "A*", "A>", "a/b", "a\\b"] {
            assert!(check_stream_name(bad).is_err(), "{bad}");
        }
    }
}
