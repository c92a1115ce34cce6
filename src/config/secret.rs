//! Secret configuration values (database URLs with passwords, webhook secrets, vendor keys).
//!
//! A [`Secret`] never shows its value through `Debug` or `Display`, so a config dump, a log
//! line or an error message cannot leak it; code must call [`Secret::expose`] on purpose.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A string whose value is redacted everywhere except through [`Secret::expose`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value read from a file or the environment.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value itself, for the one place that must send or use it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when no value was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Refuses a header of an open `headers` table (a webhook's, `tracing.headers`) that HTTP
/// cannot carry, naming it (`<key>.<name>`) but never its value.
pub fn check_headers(
    key: &str,
    headers: &std::collections::BTreeMap<String, Secret>,
) -> Result<(), super::ConfigError> {
    for (name, value) in headers {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(value.expose()).is_err()
        {
            return Err(super::ConfigError::new(
                format!("{key}.{name}"),
                "is not a valid HTTP header",
            ));
        }
    }
    Ok(())
}

/// A list of secrets from a TOML array or from one comma-separated string: the environment
/// source reads values as strings (`try_parsing(false)`), so its list splitting never applies.
pub(super) fn secret_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Secret>, D::Error> {
    struct List;
    impl<'de> serde::de::Visitor<'de> for List {
        type Value = Vec<Secret>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of URLs, or one string of comma-separated URLs")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<Secret>, E> {
            Ok(s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(Secret::new)
                .collect())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = a.next_element::<Secret>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    d.deserialize_any(List)
}

/// Removes the password from a URL (`postgres://user:pw@host/db` -> `postgres://user:***@host/db`)
/// so that database and Redis URLs can be shown in logs and `status`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{}://{}@{}", &url[..scheme_end], masked, &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn redacts_passwords_in_urls() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            redact_url("sqlite://outbox-relay.db?mode=rwc"),
            "sqlite://outbox-relay.db?mode=rwc"
        );
    }
}
