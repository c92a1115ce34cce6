//! Building the `messages:send` body from a row: the payload is the FCM `message` object and
//! the row's `recipient` becomes `message.token`.
//!
//! Guarantees: a row FCM would refuse for its shape is refused here, without a request, with a
//! reason naming the field (G5):
//! - exactly one target: `token` (from `recipient` or the payload), `topic` or `condition`;
//!   a `recipient` and a payload `token` must agree;
//! - `data` (and `android.data`) is an object of string values, with no reserved key
//!   (`from`, `message_type`, or a key starting with `google` or `gcm`);
//! - the payload FCM counts (`data` keys and values plus the `notification` texts) fits in
//!   4096 bytes, 2048 for topic and condition messages. The rest of the message (platform
//!   overrides, JSON syntax) is not counted, so nothing FCM would accept is refused; FCM's own
//!   `INVALID_ARGUMENT` still catches what this estimate misses.

use serde_json::{Map, Value, json};

/// FCM's payload limit for messages to a token.
pub const MAX_PAYLOAD: usize = 4096;
/// FCM's payload limit for topic (and condition) messages.
pub const MAX_TOPIC_PAYLOAD: usize = 2048;

/// The request body for one row, or why the row can never be sent.
pub fn build(
    payload: &str,
    recipient: Option<&str>,
    validate_only: bool,
) -> Result<Vec<u8>, String> {
    let value: Value =
        serde_json::from_str(payload).map_err(|e| format!("payload is not valid JSON: {e}"))?;
    let Value::Object(mut message) = value else {
        return Err("payload must be a JSON object: the FCM message".into());
    };
    let topical = set_target(&mut message, recipient)?;
    check_string_map(message.get("data"), "message.data")?;
    if let Some(Value::Object(android)) = message.get("android") {
        check_string_map(android.get("data"), "message.android.data")?;
    }
    let size = counted_size(&message);
    let limit = if topical {
        MAX_TOPIC_PAYLOAD
    } else {
        MAX_PAYLOAD
    };
    if size > limit {
        return Err(format!(
            "message payload is {size} bytes (data and notification); FCM allows {limit}"
        ));
    }
    let mut body = json!({ "message": Value::Object(message) });
    if validate_only {
        body["validate_only"] = Value::Bool(true);
    }
    serde_json::to_vec(&body).map_err(|e| format!("cannot encode the message: {e}"))
}

/// Puts the one target in place; returns true for a topic or condition message.
fn set_target(message: &mut Map<String, Value>, recipient: Option<&str>) -> Result<bool, String> {
    let recipient = recipient.map(str::trim).filter(|r| !r.is_empty());
    let mut targets = Vec::new();
    for key in ["token", "topic", "condition"] {
        match message.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if !s.trim().is_empty() => targets.push(key),
            Some(_) => return Err(format!("message.{key} must be a non-empty string")),
        }
    }
    match (targets.as_slice(), recipient) {
        ([], Some(r)) => {
            message.insert("token".into(), Value::String(r.to_string()));
            Ok(false)
        }
        ([], None) => Err(
            "no target: set the row's recipient (a device token) or the payload's topic or \
             condition"
                .into(),
        ),
        (["token"], None) => Ok(false),
        (["token"], Some(r)) if message.get("token").and_then(Value::as_str) == Some(r) => {
            Ok(false)
        }
        ([one], None) => Ok(*one != "token"),
        ([one], Some(_)) => Err(format!(
            "two targets: the row's recipient and message.{one}; give exactly one"
        )),
        (many, _) => Err(format!(
            "message has {} targets ({}); give exactly one of token, topic, condition",
            many.len(),
            many.join(", ")
        )),
    }
}

/// `data` maps must hold strings only, under keys FCM does not reserve.
fn check_string_map(map: Option<&Value>, at: &str) -> Result<(), String> {
    match map {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if !v.is_string() {
                    return Err(format!(
                        "{at}.{k} must be a string (FCM data values are strings: send {v} as \"{}\")",
                        v.to_string().trim_matches('"')
                    ));
                }
                if k == "from"
                    || k == "message_type"
                    || k.starts_with("google")
                    || k.starts_with("gcm")
                {
                    return Err(format!("{at}.{k} uses a key FCM reserves"));
                }
            }
            Ok(())
        }
        Some(_) => Err(format!("{at} must be an object of strings")),
    }
}

/// Bytes FCM counts against its limit: `data` keys and values, and the `notification` texts.
fn counted_size(message: &Map<String, Value>) -> usize {
    let data: usize = match message.get("data") {
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum(),
        _ => 0,
    };
    let notification: usize = match message.get("notification") {
        Some(Value::Object(m)) => m.values().filter_map(Value::as_str).map(str::len).sum(),
        _ => 0,
    };
    data + notification
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(payload: &str, recipient: Option<&str>) -> Result<Value, String> {
        build(payload, recipient, false).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn recipient_becomes_the_token() {
        let b = body(r#"{"notification":{"title":"t"}}"#, Some(" tok ")).unwrap();
        assert_eq!(
            b,
            json!({"message": {"token": "tok", "notification": {"title": "t"}}})
        );
        let b = build(r#"{"topic":"news"}"#, None, true).unwrap();
        let b: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            b,
            json!({"message": {"topic": "news"}, "validate_only": true})
        );
        // The same token twice is one target.
        assert!(body(r#"{"token":"a"}"#, Some("a")).is_ok());
    }

    #[test]
    fn exactly_one_target() {
        for (payload, recipient) in [
            ("{}", None),
            (r#"{"topic":"a","condition":"'a' in topics"}"#, None),
            (r#"{"topic":"a"}"#, Some("tok")),
            (r#"{"token":"a"}"#, Some("b")),
            (r#"{"token":""}"#, None),
            (r#"{"topic":5}"#, None),
        ] {
            let e = body(payload, recipient).unwrap_err();
            assert!(
                e.contains("target") || e.contains("non-empty string"),
                "{payload}: {e}"
            );
        }
    }

    #[test]
    fn data_values_are_strings_and_keys_not_reserved() {
        let e = body(r#"{"data":{"count":3}}"#, Some("t")).unwrap_err();
        assert!(e.contains("message.data.count must be a string"), "{e}");
        assert!(e.contains("\"3\""), "{e}");
        let e = body(r#"{"android":{"data":{"ok":true}}}"#, Some("t")).unwrap_err();
        assert!(e.contains("message.android.data.ok"), "{e}");
        for key in ["from", "message_type", "google.x", "gcm.notification.x"] {
            let p = json!({"data": {key: "v"}}).to_string();
            assert!(
                body(&p, Some("t")).unwrap_err().contains("reserves"),
                "{key}"
            );
        }
        assert!(body(r#"{"data":[1]}"#, Some("t")).is_err());
        assert!(body(r#"[1]"#, Some("t")).is_err());
        assert!(body("not json", Some("t")).is_err());
    }

    #[test]
    fn size_limits() {
        let ok = json!({"data": {"k": "x".repeat(MAX_PAYLOAD - 1)}}).to_string();
        assert!(body(&ok, Some("t")).is_ok());
        let big = json!({"data": {"k": "x".repeat(MAX_PAYLOAD)}}).to_string();
        let e = body(&big, Some("t")).unwrap_err();
        assert!(e.contains("4097 bytes") && e.contains("4096"), "{e}");
        let topic =
            json!({"topic": "a", "notification": {"body": "x".repeat(MAX_TOPIC_PAYLOAD + 1)}})
                .to_string();
        assert!(body(&topic, None).unwrap_err().contains("2048"));
    }
}
