//! `[sinks.NAME]` keys of `kind = "nats"`: the servers, where each row goes (a fixed subject,
//! or a payload field under a prefix), the stream expected to take it, the id its
//! `Nats-Msg-Id` starts with, and the credentials.
//!
//! Guarantees: every error names its key; the secrets (`token`, `password`, the contents of
//! `credentials_file`) are [`Secret`]s, read at start and never quoted in an error; a URL
//! with a user or password in it is refused (the client library logs server addresses, so
//! credentials go in their own keys); at most one way of authenticating is given.

use serde::Deserialize;

use super::subject::{self, Route};
use crate::config::{ConfigError, Secret, number};

/// NATS' own default `max_payload` (1 MiB): larger messages are refused by a default server.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// A NATS sink's settings, validated.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// The servers, as written (`nats://host:4222` or `tls://...`), at least one.
    pub urls: Vec<String>,
    /// Where each row is published.
    pub route: Route,
    /// The stream every publish must land in (`Nats-Expected-Stream`), checked at start and
    /// by `check-config`.
    pub stream: Option<String>,
    /// Put before the row id in `Nats-Msg-Id`; `None`: `outbox-<database.table>-`.
    pub msg_id_prefix: Option<String>,
    /// How the connection authenticates.
    pub auth: Auth,
    /// Larger payloads are FAILED without being published.
    pub max_payload_bytes: usize,
}

/// One way of authenticating, or none.
#[derive(Debug, Clone, PartialEq)]
pub enum Auth {
    None,
    /// A `.creds` file's contents (user JWT and nkey seed), read at start.
    Credentials(Secret),
    Token(Secret),
    UserPassword {
        user: String,
        password: Secret,
    },
}

/// The table as written; checked in [`NatsConfig::parse`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNats {
    /// One URL, or several separated by commas.
    url: Option<String>,
    subject: Option<String>,
    subject_field: Option<String>,
    subject_prefix: Option<String>,
    stream: Option<String>,
    msg_id_prefix: Option<String>,
    credentials_file: Option<String>,
    token: Option<Secret>,
    user: Option<String>,
    password: Option<Secret>,
    #[serde(
        default,
        deserialize_with = "number::int_opt::<_, _, 1, { number::USIZE_MAX }>"
    )]
    max_payload_bytes: Option<usize>,
}

impl NatsConfig {
    pub(crate) fn parse(prefix: &str, value: config::Value) -> Result<Self, ConfigError> {
        let raw: RawNats = value
            .try_deserialize()
            .map_err(|e| ConfigError::within(prefix, &e))?;
        let key = |k: &str| format!("{prefix}.{k}");
        let urls = parse_urls(&key("url"), raw.url.as_deref())?;
        let route = match (raw.subject, raw.subject_field) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    key("subject_field"),
                    "give either subject or subject_field, not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::new(
                    key("subject"),
                    "is required (or subject_field): the subject each row is published to",
                ));
            }
            (Some(s), None) => {
                if raw.subject_prefix.is_some() {
                    return Err(ConfigError::new(
                        key("subject_prefix"),
                        "goes with subject_field only",
                    ));
                }
                subject::check_configured(&s).map_err(|p| ConfigError::new(key("subject"), p))?;
                Route::Fixed(s)
            }
            (None, Some(field)) => {
                if field.trim().is_empty() || field != field.trim() {
                    return Err(ConfigError::new(
                        key("subject_field"),
                        "must name a top-level field of the payload",
                    ));
                }
                let prefix = raw.subject_prefix.unwrap_or_default();
                subject::check_prefix(&prefix)
                    .map_err(|p| ConfigError::new(key("subject_prefix"), p))?;
                Route::Field { field, prefix }
            }
        };
        if let Some(stream) = &raw.stream {
            subject::check_stream_name(stream).map_err(|p| ConfigError::new(key("stream"), p))?;
        }
        if let Some(p) = &raw.msg_id_prefix
            && !p.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(ConfigError::new(
                key("msg_id_prefix"),
                "must be printable ASCII without spaces (it is a header value)",
            ));
        }
        let max_payload_bytes = raw.max_payload_bytes.unwrap_or(DEFAULT_MAX_PAYLOAD_BYTES);
        let auth = parse_auth(
            &key,
            raw.credentials_file,
            raw.token,
            raw.user,
            raw.password,
        )?;
        Ok(NatsConfig {
            urls,
            route,
            stream: raw.stream,
            msg_id_prefix: raw.msg_id_prefix,
            auth,
            max_payload_bytes,
        })
    }

    /// The servers as one line (no credentials can be in them: see [`parse_urls`]).
    pub fn urls_text(&self) -> String {
        self.urls.join(",")
    }
}

/// `url`: one or more `nats://` / `tls://` URLs, comma-separated, none with credentials.
fn parse_urls(at: &str, url: Option<&str>) -> Result<Vec<String>, ConfigError> {
    let Some(url) = url else {
        return Err(ConfigError::new(
            at,
            "is required: the NATS server, e.g. \"nats://127.0.0.1:4222\" (several separated by commas)",
        ));
    };
    let mut urls = Vec::new();
    for one in url.split(',').map(str::trim) {
        if one.is_empty() {
            return Err(ConfigError::new(at, "has an empty entry"));
        }
        let Some((scheme, rest)) = one.split_once("://") else {
            return Err(ConfigError::new(
                at,
                format!("\"{one}\" is not a nats:// or tls:// URL"),
            ));
        };
        if scheme != "nats" && scheme != "tls" {
            return Err(ConfigError::new(
                at,
                format!("\"{scheme}://\" is not supported; use nats:// or tls://"),
            ));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            // Not quoted: the part before '@' is a credential.
            return Err(ConfigError::new(
                at,
                "must not carry a user or password; use the sink's user/password or token keys",
            ));
        }
        if one.parse::<async_nats::ServerAddr>().is_err() || authority.is_empty() {
            return Err(ConfigError::new(
                at,
                format!("\"{one}\" is not a valid NATS server URL"),
            ));
        }
        urls.push(one.to_string());
    }
    Ok(urls)
}

/// At most one of `credentials_file`, `token`, `user` + `password`.
fn parse_auth(
    key: &dyn Fn(&str) -> String,
    credentials_file: Option<String>,
    token: Option<Secret>,
    user: Option<String>,
    password: Option<Secret>,
) -> Result<Auth, ConfigError> {
    let given = [
        ("credentials_file", credentials_file.is_some()),
        ("token", token.is_some()),
        ("user", user.is_some() || password.is_some()),
    ];
    let mut chosen = given.iter().filter(|(_, g)| *g);
    if let (Some(_), Some((second, _))) = (chosen.next(), chosen.next()) {
        return Err(ConfigError::new(
            key(second),
            "give one of credentials_file, token or user + password",
        ));
    }
    if let Some(path) = credentials_file {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::new(key("credentials_file"), format!("cannot read {path}: {e}"))
        })?;
        // Parsed now so that a wrong file stops the start, not every publish; the error
        // says only what is wrong, never the file's contents.
        if async_nats::ConnectOptions::with_credentials(&text).is_err() {
            return Err(ConfigError::new(
                key("credentials_file"),
                format!("{path} is not a NATS credentials file (a user JWT and an nkey seed)"),
            ));
        }
        return Ok(Auth::Credentials(Secret::new(text)));
    }
    if let Some(token) = token {
        if token.is_empty() {
            return Err(ConfigError::new(key("token"), "is empty"));
        }
        return Ok(Auth::Token(token));
    }
    match (user, password) {
        (None, None) => Ok(Auth::None),
        (Some(user), Some(password)) if !user.is_empty() && !password.is_empty() => {
            Ok(Auth::UserPassword { user, password })
        }
        (Some(_), Some(_)) => Err(ConfigError::new(
            key("user"),
            "user and password must both be non-empty",
        )),
        (Some(_), None) => Err(ConfigError::new(key("password"), "is required with user")),
        (None, Some(_)) => Err(ConfigError::new(key("user"), "is required with password")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<NatsConfig, ConfigError> {
        let value = config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .expect("toml")
            .cache;
        NatsConfig::parse("sinks.ev", value)
    }

    fn err(toml: &str) -> ConfigError {
        match parse(toml) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_minimal_sink_has_its_defaults() {
        let c = parse("url = \"nats://127.0.0.1:4222\"\nsubject = \"orders.created\"").unwrap();
        assert_eq!(c.urls, ["nats://127.0.0.1:4222"]);
        assert_eq!(c.route, Route::Fixed("orders.created".into()));
        assert_eq!(c.auth, Auth::None);
        assert_eq!(c.stream, None);
        assert_eq!(c.max_payload_bytes, DEFAULT_MAX_PAYLOAD_BYTES);
    }

    #[test]
    fn several_urls_and_a_field_route() {
        let c = parse(
            "url = \"nats://a:4222, tls://b:4222\"\nsubject_field = \"type\"\n\
             subject_prefix = \"events.\"\nstream = \"EVENTS\"\nmsg_id_prefix = \"svc-a-\"",
        )
        .unwrap();
        assert_eq!(c.urls, ["nats://a:4222", "tls://b:4222"]);
        assert_eq!(
            c.route,
            Route::Field {
                field: "type".into(),
                prefix: "events.".into()
            }
        );
        assert_eq!(c.stream.as_deref(), Some("EVENTS"));
        assert_eq!(c.msg_id_prefix.as_deref(), Some("svc-a-"));
    }

    #[test]
    fn errors_name_their_key() {
        let base = "url = \"nats://127.0.0.1:4222\"\n";
        assert_eq!(err("subject = \"a\"").key, "sinks.ev.url");
        assert_eq!(err(base).key, "sinks.ev.subject");
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nsubject_field = \"t\"")).key,
            "sinks.ev.subject_field"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a.*\"")).key,
            "sinks.ev.subject"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a..b\"")).key,
            "sinks.ev.subject"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nsubject_prefix = \"x.\"")).key,
            "sinks.ev.subject_prefix"
        );
        assert_eq!(
            err(&format!(
                "{base}subject_field = \"t\"\nsubject_prefix = \"x\""
            ))
            .key,
            "sinks.ev.subject_prefix"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nstream = \"A.B\"")).key,
            "sinks.ev.stream"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nsubjekt = \"a\"")).key,
            "sinks.ev.subjekt"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nmax_payload_bytes = 0")).key,
            "sinks.ev.max_payload_bytes"
        );
        assert_eq!(
            err(&format!("{base}subject = \"a\"\nmsg_id_prefix = \"a b\"")).key,
            "sinks.ev.msg_id_prefix"
        );
        assert_eq!(
            err("url = \"http://127.0.0.1:4222\"\nsubject = \"a\"").key,
            "sinks.ev.url"
        );
        assert_eq!(
            err("url = \"nats://a:4222,,nats://b\"\nsubject = \"a\"").key,
            "sinks.ev.url"
        );
    }

    #[test]
    fn credentials_never_go_in_the_url_and_never_into_errors() {
        let e = err("url = \"nats://me:hunter2@127.0.0.1:4222\"\nsubject = \"a\"");
        assert_eq!(e.key, "sinks.ev.url");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let base = "url = \"nats://127.0.0.1:4222\"\nsubject = \"a\"\n";
        assert_eq!(
            err(&format!(
                "{base}token = \"t\"\nuser = \"u\"\npassword = \"p\""
            ))
            .key,
            "sinks.ev.user"
        );
        assert_eq!(err(&format!("{base}user = \"u\"")).key, "sinks.ev.password");
        assert_eq!(err(&format!("{base}password = \"p\"")).key, "sinks.ev.user");
        assert_eq!(err(&format!("{base}token = \"\"")).key, "sinks.ev.token");
        let c = parse(&format!("{base}user = \"u\"\npassword = \"hunter2\"")).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = err(&format!(
            "{base}credentials_file = \"/nonexistent/x.creds\""
        ));
        assert_eq!(e.key, "sinks.ev.credentials_file");
    }

    #[test]
    fn a_credentials_file_is_read_and_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.creds");
        std::fs::write(&bad, "SUAsecretseedthatmustnotleak").unwrap();
        let base = "url = \"nats://127.0.0.1:4222\"\nsubject = \"a\"\n";
        let e = err(&format!("{base}credentials_file = \"{}\"", bad.display()));
        assert_eq!(e.key, "sinks.ev.credentials_file");
        assert!(!e.to_string().contains("SUAsecret"), "{e}");
        // The example of async-nats' documentation (a published, unused seed).
        let good = dir.path().join("good.creds");
        std::fs::write(
            &good,
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJqd3QiLCJhbGciOiJlZDI1NTE5...\n\
             ------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n\
             SUAIO3FHUX5PNV2LQIIP7TZ3N4L7TX3W53MQGEIVYFIGA635OZCKEYHFLM\n\
             ------END USER NKEY SEED------\n",
        )
        .unwrap();
        let c = parse(&format!("{base}credentials_file = \"{}\"", good.display())).unwrap();
        assert!(matches!(c.auth, Auth::Credentials(_)));
        assert!(!format!("{c:?}").contains("SUAIO3"), "{c:?}");
    }
}
