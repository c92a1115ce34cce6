//! Refuses configurations that cannot be safe (G7 in docs/design.md) or cannot work, naming the key.

use std::net::SocketAddr;
use std::time::Duration;

use super::duration::format;
use super::{
    CONSOLE_TOKEN_MIN, ConfigError, DatabaseSettings, LeaseBackend, LeaseSettings, RetrySettings,
    Secret, Settings,
};

/// The least time a claim must outlive the longest sink timeout: covers the claim round trip,
/// the result write and clock drift between the relay and the database.
pub const CLAIM_MARGIN: Duration = Duration::from_secs(5);

pub(super) fn validate(s: &Settings) -> Result<(), ConfigError> {
    validate_relay(s)?;
    let scheme = validate_database(&s.database)?;
    s.table.validate()?;
    s.tracing.validate()?;
    validate_lease(&s.lease, scheme)?;
    validate_retry("retry", &s.retry)?;
    for (name, spec) in &s.sinks {
        validate_retry(
            &format!("sinks.{name}"),
            &spec.common.retry_policy(&s.retry),
        )?;
    }
    validate_http(s)?;
    if let Some(c) = &s.console {
        // With or without [table]: the console reads and writes through the mapping.
        validate_console(c, &s.http.listen)?;
    }
    if tracing_subscriber::EnvFilter::try_new(&s.log.level).is_err() {
        return Err(ConfigError::new(
            "log.level",
            format!(
                "\"{}\" is not a level or filter (e.g. info, debug)",
                s.log.level
            ),
        ));
    }
    Ok(())
}

/// `[relay]`: `instance_id`, `poll_interval`, and `claim_ttl` against the longest sink timeout
/// (the numbers' ranges are checked as they are read: `number`).
fn validate_relay(s: &Settings) -> Result<(), ConfigError> {
    let r = &s.relay;
    if r.instance_id.trim().is_empty() {
        return Err(ConfigError::new("relay.instance_id", "must not be empty"));
    }
    if r.poll_interval < Duration::from_millis(10) {
        return Err(ConfigError::new(
            "relay.poll_interval",
            "must be at least 10ms",
        ));
    }
    if let Some((name, spec)) = s.sinks.iter().max_by_key(|(_, spec)| spec.common.timeout) {
        let needed = spec.common.timeout + CLAIM_MARGIN;
        if r.claim_ttl < needed {
            return Err(ConfigError::new(
                "relay.claim_ttl",
                format!(
                    "{} is too short: a claim must outlive the longest sink timeout \
                     (sinks.{name}.timeout = {}) plus {} margin, so at least {}; otherwise a \
                     slow send could still be running when another instance takes the row",
                    format(r.claim_ttl),
                    format(spec.common.timeout),
                    format(CLAIM_MARGIN),
                    format(needed)
                ),
            ));
        }
    }
    Ok(())
}

/// `[database]`: `url` (returning its scheme), `table`, `connect_timeout`.
fn validate_database(db: &DatabaseSettings) -> Result<&str, ConfigError> {
    let url = db.url.expose();
    let scheme = url.split("://").next().unwrap_or("");
    if !url.contains("://")
        || !["postgres", "postgresql", "mysql", "mariadb", "sqlite"].contains(&scheme)
    {
        return Err(ConfigError::new(
            "database.url",
            "must start with postgres://, mysql:// or sqlite://",
        ));
    }
    if !is_identifier(&db.table) {
        return Err(ConfigError::new(
            "database.table",
            format!(
                "\"{}\" is not a plain SQL identifier (letters, digits, _; at most 60 characters)",
                db.table
            ),
        ));
    }
    if db.connect_timeout.is_zero() {
        // Every wait for a pooled connection would fail at once.
        return Err(ConfigError::new(
            "database.connect_timeout",
            "must be above zero",
        ));
    }
    Ok(scheme)
}

/// `[lease]`: `name`, `ttl` against `renew_timeout`, then what the backend needs (the
/// database's `scheme` for `mysql-get-lock`).
fn validate_lease(l: &LeaseSettings, scheme: &str) -> Result<(), ConfigError> {
    if l.name.is_empty() || l.name.len() > 200 {
        return Err(ConfigError::new(
            "lease.name",
            "must be 1 to 200 characters",
        ));
    }
    if l.renew_timeout.is_zero() {
        // Every acquire and renewal would time out at once: no instance would ever deliver.
        return Err(ConfigError::new(
            "lease.renew_timeout",
            "must be above zero",
        ));
    }
    if l.ttl < Duration::from_millis(300) {
        return Err(ConfigError::new("lease.ttl", "must be at least 300ms"));
    }
    if l.ttl < l.renew_timeout * 3 {
        return Err(ConfigError::new(
            "lease.ttl",
            format!(
                "{} is under 3 x lease.renew_timeout ({}): a renewal every ttl/3 must be able \
                 to fail and be retried before the lease runs out",
                format(l.ttl),
                format(l.renew_timeout)
            ),
        ));
    }
    match l.backend {
        LeaseBackend::Redis | LeaseBackend::Redisson => validate_redis_url(l.redis_url.as_ref()),
        LeaseBackend::Redlock => validate_redlock_urls(&l.redlock_urls),
        LeaseBackend::Shedlock => validate_shedlock(l),
        LeaseBackend::MysqlGetLock => {
            if !["mysql", "mariadb"].contains(&scheme) {
                return Err(ConfigError::new(
                    "lease.backend",
                    format!(
                        "\"mysql-get-lock\" needs a MySQL or MariaDB database (GET_LOCK is theirs), \
                         but database.url is {scheme}://; use \"database\", \"shedlock\", \"redis\" \
                         or \"redisson\" instead"
                    ),
                ));
            }
            validate_java_lock_name("mysql-get-lock", &l.name)
        }
        LeaseBackend::Database | LeaseBackend::None => Ok(()),
    }
}

/// `lease.redis_url`, for the `redis` and `redisson` backends: required, `redis://` or
/// `rediss://`.
fn validate_redis_url(url: Option<&Secret>) -> Result<(), ConfigError> {
    match url {
        None => Err(ConfigError::new(
            "lease.redis_url",
            "is required with lease.backend = \"redis\" or \"redisson\" (redis://[user:pw@]host:6379 or rediss://)",
        )),
        Some(url)
            if !(url.expose().starts_with("redis://") || url.expose().starts_with("rediss://")) =>
        {
            Err(ConfigError::new(
                "lease.redis_url",
                "must start with redis:// or rediss:// (TLS)",
            ))
        }
        Some(_) => Ok(()),
    }
}

/// The `shedlock` backend: `lease.name` as ShedLock stores it, `lease.shedlock_time_zone`,
/// `lease.shedlock_table`.
fn validate_shedlock(l: &LeaseSettings) -> Result<(), ConfigError> {
    validate_java_lock_name("shedlock", &l.name)?;
    if l.shedlock_utc_offset_minutes().is_none() {
        return Err(ConfigError::new(
            "lease.shedlock_time_zone",
            format!(
                "\"{}\" is not UTC or a fixed offset like +09:00: the zone of the times \
                 the Java side writes (UTC with ShedLock's usingDbTime(), else its JVM's \
                 zone)",
                l.shedlock_time_zone
            ),
        ));
    }
    if !l.shedlock_table.split('.').all(is_identifier) || l.shedlock_table.split('.').count() > 2 {
        return Err(ConfigError::new(
            "lease.shedlock_table",
            format!(
                "\"{}\" is not a plain SQL identifier (letters, digits, _; optionally \
                 schema.table)",
                l.shedlock_table
            ),
        ));
    }
    Ok(())
}

/// `http.listen`: empty (no endpoints) or host:port.
fn validate_http(s: &Settings) -> Result<(), ConfigError> {
    if !s.http.listen.is_empty() && s.http.listen.parse::<SocketAddr>().is_err() {
        return Err(ConfigError::new(
            "http.listen",
            format!(
                "\"{}\" is not host:port (e.g. 127.0.0.1:9090)",
                s.http.listen
            ),
        ));
    }
    Ok(())
}

/// `lease.name` for the locks shared with Java pollers: ShedLock's `name` column is
/// `VARCHAR(64)`, and MySQL/MariaDB refuse a `GET_LOCK` name over 64 characters. The name must
/// be exactly the one the Java side uses, so it is refused rather than shortened.
fn validate_java_lock_name(backend: &str, name: &str) -> Result<(), ConfigError> {
    if name.chars().count() > 64 {
        return Err(ConfigError::new(
            "lease.name",
            format!(
                "is {} characters; lease.backend = \"{backend}\" allows at most 64 (set it to the \
                 lock name the Java poller uses)",
                name.chars().count()
            ),
        ));
    }
    if name.trim() != name || name.chars().any(char::is_control) {
        return Err(ConfigError::new(
            "lease.name",
            format!(
                "must not start or end with spaces or hold control characters with \
                 lease.backend = \"{backend}\""
            ),
        ));
    }
    Ok(())
}

/// `lease.redlock_urls`: at least 3 independent nodes (a majority of 2 tolerates no failure),
/// each `redis://` or `rediss://`, no URL twice (one server counted twice would make a
/// "majority" of fewer real nodes). Errors name entries by index: a URL may hold a password.
fn validate_redlock_urls(urls: &[Secret]) -> Result<(), ConfigError> {
    const KEY: &str = "lease.redlock_urls";
    if urls.len() < 3 {
        return Err(ConfigError::new(
            KEY,
            format!(
                "has {} URL(s); lease.backend = \"redlock\" needs at least 3 independent Redis \
                 nodes (an odd number is best: 3 or 5), e.g. \
                 [\"redis://r1:6379\", \"redis://r2:6379\", \"redis://r3:6379\"]",
                urls.len()
            ),
        ));
    }
    for (i, url) in urls.iter().enumerate() {
        let u = url.expose();
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            return Err(ConfigError::new(
                KEY,
                format!("entry {i} must start with redis:// or rediss:// (TLS)"),
            ));
        }
        if let Some(j) = urls[..i].iter().position(|o| o.expose() == u) {
            return Err(ConfigError::new(
                KEY,
                format!("entries {j} and {i} are the same URL: Redlock needs independent nodes"),
            ));
        }
    }
    Ok(())
}

/// `[console]`: a usable address of its own and a token long enough not to be guessed.
fn validate_console(c: &super::ConsoleSettings, http_listen: &str) -> Result<(), ConfigError> {
    let Ok(addr) = c.listen.parse::<SocketAddr>() else {
        return Err(ConfigError::new(
            "console.listen",
            format!("\"{}\" is not host:port (e.g. 127.0.0.1:9091)", c.listen),
        ));
    };
    if http_listen
        .parse::<SocketAddr>()
        .is_ok_and(|h| h == addr && h.port() != 0)
    {
        return Err(ConfigError::new(
            "console.listen",
            format!(
                "{addr} is also http.listen: the console needs its own address (the metrics \
                 port is often exposed to Prometheus)"
            ),
        ));
    }
    let n = c.token.expose().chars().count();
    if n == 0 {
        return Err(ConfigError::new(
            "console.token",
            "is required when the console is on (or set console.token_file, or \
             OUTBOX_RELAY__CONSOLE__TOKEN); e.g. `openssl rand -hex 24`",
        ));
    }
    if n < CONSOLE_TOKEN_MIN {
        return Err(ConfigError::new(
            "console.token",
            format!(
                "is too short ({n} characters): use at least {CONSOLE_TOKEN_MIN}, e.g. \
                 `openssl rand -hex 24`"
            ),
        ));
    }
    Ok(())
}

/// `initial_backoff` against `max_backoff` (`max_attempts` and `multiplier` are checked as
/// they are read: `number`).
fn validate_retry(section: &str, r: &RetrySettings) -> Result<(), ConfigError> {
    if r.initial_backoff.is_zero() || r.initial_backoff > r.max_backoff {
        return Err(ConfigError::new(
            format!("{section}.initial_backoff"),
            "must be above zero and not above max_backoff",
        ));
    }
    Ok(())
}

/// A table name we can splice into SQL: `[A-Za-z_][A-Za-z0-9_]*`, at most 60 characters
/// (so derived index names stay under PostgreSQL's 63).
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 60
}

/// A string as an SQL literal: quotes doubled. Only for text checked by [`literal_safe`]
/// (no backslash, which MySQL treats as an escape, and no control character).
pub fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Whether `s` may be written as an SQL string literal by [`sql_string`].
pub(super) fn literal_safe(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && !s.chars().any(|c| c == '\\' || c.is_control())
}

/// Refuses `name` at `key` unless it is a plain SQL identifier ([`is_identifier`]).
pub(super) fn column_name(key: &str, name: &str) -> Result<(), ConfigError> {
    if is_identifier(name) {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!(
                "\"{name}\" is not a plain SQL identifier (letters, digits, _; at most 60 \
                 characters)"
            ),
        ))
    }
}
