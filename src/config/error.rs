//! [`ConfigError`]: every configuration problem, with the key it is about.

use std::fmt;

/// A configuration problem, phrased for the person who wrote the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The dotted key at fault (`relay.claim_ttl`), or the file when no key applies.
    pub key: String,
    /// What is wrong and, where possible, what would be right.
    pub problem: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// The config crate's deserialization error, for a value read at `prefix` (`""` for the
    /// whole file, `sinks.hook` for a sink's table). The key comes from the error's variants,
    /// which carry it; serde's "unknown field" message and our own deserializers' [`keyed`]
    /// messages have to be read for the rest of the path, which no variant carries.
    pub fn within(prefix: &str, e: &config::ConfigError) -> ConfigError {
        use config::ConfigError as E;
        match e {
            E::At { error, key, .. } => ConfigError::within(&join(prefix, key.as_deref()), error),
            E::Type {
                key,
                unexpected,
                expected,
                ..
            } => ConfigError::new(
                or_file(&join(prefix, key.as_deref())),
                format!("invalid type: {unexpected}, expected {expected}"),
            ),
            E::NotFound(key) => ConfigError::new(or_file(prefix), format!("missing key `{key}`")),
            E::Message(text) => {
                if let Some((path, problem)) = unkey(text) {
                    return ConfigError::new(or_file(&join(prefix, Some(path))), problem);
                }
                match unknown_field(text) {
                    Some((field, expected)) => ConfigError::new(
                        or_file(&join(prefix, Some(field))),
                        format!("unknown key ({expected})"),
                    ),
                    None => ConfigError::new(or_file(prefix), text.clone()),
                }
            }
            other => ConfigError::new(or_file(prefix), other.to_string()),
        }
    }
}

/// Marks a message of [`keyed`]: a character no key or message of ours holds.
const KEYED: char = '\u{1}';

/// A problem found by one of our own deserializers below the value being read, at `path`
/// relative to it (`body.as_text`; `""` for the value itself). serde's errors carry only
/// text, so the path travels in the message, and [`ConfigError::within`] puts it back in the
/// key.
pub(super) fn keyed<E: serde::de::Error>(path: &str, problem: impl fmt::Display) -> E {
    E::custom(format!("{KEYED}{path}{KEYED}{problem}"))
}

/// The (path, problem) of a [`keyed`] message.
fn unkey(text: &str) -> Option<(&str, &str)> {
    text.strip_prefix(KEYED)?.split_once(KEYED)
}

/// `prefix.key`, `key` or `prefix`.
fn join(prefix: &str, key: Option<&str>) -> String {
    match key {
        Some(k) if !k.is_empty() && !prefix.is_empty() => format!("{prefix}.{k}"),
        Some(k) if !k.is_empty() => k.to_string(),
        _ => prefix.to_string(),
    }
}

/// The key for a problem with no key of its own.
fn or_file(prefix: &str) -> String {
    if prefix.is_empty() {
        "configuration".to_string()
    } else {
        prefix.to_string()
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`": (`x`, "expected one of a, b").
fn unknown_field(text: &str) -> Option<(&str, String)> {
    let rest = text.strip_prefix("unknown field `")?;
    // The name can hold a backtick itself (an environment variable can be called anything):
    // it ends where serde's own words start.
    let end = ["`, expected", "`, there are no fields"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .or_else(|| rest.find('`'))?;
    let expected = match rest[end..].find("expected") {
        Some(i) => rest[end + i..].replace('`', ""),
        None => "none is taken here".to_string(),
    };
    Some((&rest[..end], expected))
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.problem)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_variants() {
        let inner = config::ConfigError::Message(
            "unknown field `batchsize`, expected one of `batch_size`, `mode`".into(),
        );
        let e = config::ConfigError::At {
            error: Box::new(inner),
            origin: None,
            key: Some("relay".into()),
        };
        let ours = ConfigError::within("", &e);
        assert_eq!(ours.key, "relay.batchsize");
        assert_eq!(
            ours.problem,
            "unknown key (expected one of batch_size, mode)"
        );
        let t = config::Value::from(config::Map::from([(
            "concurrency".to_string(),
            config::Value::from(vec![1]),
        )]))
        .try_deserialize::<super::super::SinkCommon>()
        .expect_err("a list is not a number");
        assert_eq!(
            ConfigError::within("sinks.hook", &t).key,
            "sinks.hook.concurrency"
        );
        let m = config::ConfigError::Message("missing field `url`".into());
        let ours = ConfigError::within("sinks.hook", &m);
        assert_eq!(
            (ours.key.as_str(), ours.problem.as_str()),
            ("sinks.hook", "missing field `url`")
        );
        assert_eq!(ConfigError::within("", &m).key, "configuration");
    }

    #[test]
    fn a_key_with_a_backtick_is_still_named() {
        // Found by the `config` fuzz target: OUTBOX_RELAY__`INKS__HOOK__URL gave an empty key.
        let m = config::ConfigError::Message(
            "unknown field ``inks`, expected one of `relay`, `sinks`".into(),
        );
        let ours = ConfigError::within("", &m);
        assert_eq!(ours.key, "`inks");
        assert_eq!(ours.problem, "unknown key (expected one of relay, sinks)");
        let m = config::ConfigError::Message("unknown field ``, there are no fields".into());
        assert_eq!(ConfigError::within("", &m).key, "configuration");
    }

    #[test]
    fn our_deserializers_name_the_rest_of_the_path() {
        let inner = keyed::<config::ConfigError>("as_text", "unknown key (expected json)");
        let e = config::ConfigError::At {
            error: Box::new(inner),
            origin: None,
            key: Some("payload_object.body".into()),
        };
        let ours = ConfigError::within("table", &e);
        assert_eq!(ours.key, "table.payload_object.body.as_text");
        assert_eq!(ours.problem, "unknown key (expected json)");
        let ours = ConfigError::within("table.x", &keyed::<config::ConfigError>("", "bad"));
        assert_eq!(
            (ours.key.as_str(), ours.problem.as_str()),
            ("table.x", "bad")
        );
    }
}
