//! The row's side of an Alimtalk send: the payload
//! `{"template_code": "...", "parameters": {...}}` (plus optional `buttons`, `fallback`,
//! `vendor`) and the recipient's phone number.
//!
//! Guarantees: a row the vendor would refuse for its shape is refused here with a reason naming
//! the field (G5), without a (paid) request:
//! - unknown top-level keys are refused (a typo such as `paramters` would otherwise send a
//!   message with its variables unfilled);
//! - parameter names may be given bare (`name`) or as written in the template (`#{name}`) and
//!   are stored bare; values must be strings; names with `@` (NHN -3347) or `.` (Solapi) and
//!   the same name twice are refused;
//! - the phone number loses `-`, spaces, dots and parentheses, `+82` becomes the domestic
//!   `0`, and what remains must be 8 to 15 digits.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Keys a payload may have.
const KEYS: &[&str] = &[
    "template_code",
    "parameters",
    "buttons",
    "fallback",
    "vendor",
];

/// A template message as the row describes it, vendor-neutral.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateMessage {
    /// The approved template's code (NHN `templateCode`, Solapi `templateId`).
    pub template_code: String,
    /// Variable values by bare name (without `#{}`).
    pub parameters: BTreeMap<String, String>,
    /// Buttons in the vendor's own shape, passed through.
    pub buttons: Option<Vec<Value>>,
    /// SMS/LMS fallback: `false` turns it off; an object is NHN's `resendParameter`.
    pub fallback: Option<Fallback>,
    /// Extra fields merged into the vendor's per-message object (NHN recipient entry, Solapi
    /// `kakaoOptions`), for anything else the vendor accepts.
    pub vendor: Map<String, Value>,
}

/// The payload's `fallback`.
#[derive(Debug, Clone, PartialEq)]
pub enum Fallback {
    /// `true` / `false`: the vendor's default fallback, or none.
    Enabled(bool),
    /// NHN `resendParameter` as given.
    Nhn(Map<String, Value>),
}

impl TemplateMessage {
    /// Parses and checks a row's payload.
    pub fn parse(payload: &str) -> Result<TemplateMessage, String> {
        let value: Value =
            serde_json::from_str(payload).map_err(|e| format!("payload is not valid JSON: {e}"))?;
        let Value::Object(mut obj) = value else {
            return Err(
                "payload must be an object {\"template_code\": ..., \"parameters\": {...}}".into(),
            );
        };
        if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(format!(
                "payload has an unknown key \"{k}\"; expected {}",
                KEYS.join(", ")
            ));
        }
        let template_code = match obj.remove("template_code") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(_) => return Err("template_code must be a non-empty string".into()),
            None => return Err("payload lacks template_code".into()),
        };
        let mut parameters = BTreeMap::new();
        match obj.remove("parameters") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let name = bare_name(&k)?;
                    let Value::String(v) = v else {
                        return Err(format!(
                            "parameters.{k} must be a string (send {v} as \"{}\")",
                            v.to_string().trim_matches('"')
                        ));
                    };
                    if parameters.insert(name.clone(), v).is_some() {
                        return Err(format!("parameter \"{name}\" is given twice"));
                    }
                }
            }
            Some(_) => return Err("parameters must be an object of strings".into()),
        }
        let buttons = match obj.remove("buttons") {
            None | Some(Value::Null) => None,
            Some(Value::Array(b)) => Some(b),
            Some(_) => return Err("buttons must be an array".into()),
        };
        let fallback = match obj.remove("fallback") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(Fallback::Enabled(b)),
            Some(Value::Object(m)) => Some(Fallback::Nhn(m)),
            Some(_) => return Err("fallback must be true, false or an object".into()),
        };
        let vendor = match obj.remove("vendor") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err("vendor must be an object".into()),
        };
        Ok(TemplateMessage {
            template_code,
            parameters,
            buttons,
            fallback,
            vendor,
        })
    }
}

/// `#{name}` or `name` -> `name`, checked.
fn bare_name(key: &str) -> Result<String, String> {
    let name = key
        .strip_prefix("#{")
        .and_then(|k| k.strip_suffix('}'))
        .unwrap_or(key)
        .trim();
    if name.is_empty() || name.contains(['#', '{', '}', '@', '.']) {
        return Err(format!(
            "parameter name \"{key}\" is not usable (no @, ., # or braces inside the name)"
        ));
    }
    Ok(name.to_string())
}

/// The recipient's phone number in the domestic digits-only form vendors take.
pub fn normalize_phone(recipient: Option<&str>) -> Result<String, String> {
    let Some(raw) = recipient.map(str::trim).filter(|r| !r.is_empty()) else {
        return Err("recipient (a phone number) is missing".into());
    };
    let mut digits: String = raw
        .chars()
        .filter(|c| !matches!(c, '-' | ' ' | '.' | '(' | ')'))
        .collect();
    if let Some(rest) = digits.strip_prefix('+') {
        let Some(national) = rest.strip_prefix("82") else {
            return Err(format!(
                "recipient \"{raw}\" is not a Korean number (only +82 is supported)"
            ));
        };
        let national = national.strip_prefix('0').unwrap_or(national);
        digits = format!("0{national}");
    }
    if !digits.chars().all(|c| c.is_ascii_digit()) || !(8..=15).contains(&digits.len()) {
        return Err(format!(
            "recipient \"{raw}\" is not a phone number (8 to 15 digits)"
        ));
    }
    Ok(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_template_message() {
        let m = TemplateMessage::parse(
            r##"{"template_code":" ORDER ","parameters":{"#{name}":"홍길동","no":"1234"},
                "buttons":[{"x":1}],"fallback":false,"vendor":{"quickReplies":[]}}"##,
        )
        .unwrap();
        assert_eq!(m.template_code, "ORDER");
        assert_eq!(m.parameters["name"], "홍길동");
        assert_eq!(m.parameters["no"], "1234");
        assert_eq!(m.buttons.as_ref().map(Vec::len), Some(1));
        assert_eq!(m.fallback, Some(Fallback::Enabled(false)));
        assert!(m.vendor.contains_key("quickReplies"));
    }

    #[test]
    fn refuses_bad_payloads_with_a_reason() {
        for (payload, expect) in [
            ("nope", "not valid JSON"),
            ("[]", "must be an object"),
            (r#"{"parameters":{}}"#, "lacks template_code"),
            (r#"{"template_code":""}"#, "non-empty"),
            (
                r#"{"template_code":"T","paramters":{}}"#,
                "unknown key \"paramters\"",
            ),
            (
                r#"{"template_code":"T","parameters":{"n":3}}"#,
                "parameters.n must be a string",
            ),
            (
                r#"{"template_code":"T","parameters":{"a@b":"x"}}"#,
                "not usable",
            ),
            (
                r##"{"template_code":"T","parameters":{"a":"x","#{a}":"y"}}"##,
                "twice",
            ),
            (
                r#"{"template_code":"T","buttons":{}}"#,
                "buttons must be an array",
            ),
            (
                r#"{"template_code":"T","fallback":"sms"}"#,
                "fallback must be",
            ),
        ] {
            let e = TemplateMessage::parse(payload).unwrap_err();
            assert!(e.contains(expect), "{payload}: {e}");
        }
    }

    #[test]
    fn phone_numbers() {
        assert_eq!(
            normalize_phone(Some("010-1234-5678")).unwrap(),
            "01012345678"
        );
        assert_eq!(normalize_phone(Some(" 02 123 4567 ")).unwrap(), "021234567");
        assert_eq!(
            normalize_phone(Some("+82 10-1234-5678")).unwrap(),
            "01012345678"
        );
        assert_eq!(
            normalize_phone(Some("+82 010 1234 5678")).unwrap(),
            "01012345678"
        );
        assert!(normalize_phone(None).is_err());
        assert!(normalize_phone(Some("")).is_err());
        assert!(normalize_phone(Some("010-CALL-ME")).is_err());
        assert!(normalize_phone(Some("123")).is_err());
        assert!(normalize_phone(Some("+1 555 123 4567")).is_err());
    }
}
