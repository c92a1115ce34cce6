//! Loading and validation at library level, where every case is cheap: `Settings::load_with_env`
//! with a file in a temp directory and an explicit environment (the process environment is
//! never read here), then the sinks' own keys, as the CLI does. The binary's side (exit codes,
//! messages, both verbs) is checked once per class of error in `config/mod.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use outbox_relay::config::*;
use outbox_relay::sink::{SinkKind, SinkSpec};

/// A config file with `toml` (kept alive with its directory).
struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn file(toml: &str) -> File {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, toml).expect("write config");
    File { _dir: dir, path }
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Loads the configuration and parses every sink's own keys, as the CLI does.
pub(super) fn load(toml: &str, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let f = file(toml);
    let s = Settings::load_with_env(Some(&f.path), Some(env(vars)))?;
    SinkSpec::all(&s)?;
    Ok(s)
}

/// The parsed kind of sink `name`.
pub(super) fn kind(s: &Settings, name: &str) -> SinkKind {
    SinkSpec::parse(&s.sinks[name]).expect("sink parses").kind
}

pub(super) fn ok(toml: &str, vars: &[(&str, &str)]) -> Settings {
    load(toml, vars).unwrap_or_else(|e| panic!("{toml:?} {vars:?} should load: {e}"))
}

/// Loading fails with an error whose key is `key`; returns it.
pub(super) fn err(toml: &str, vars: &[(&str, &str)], key: &str) -> ConfigError {
    match load(toml, vars) {
        Ok(s) => panic!("{toml:?} {vars:?} should be refused, loaded {s:?}"),
        Err(e) => {
            assert_eq!(e.key, key, "wrong key in {e}");
            assert!(e.to_string().starts_with(&format!("{key}: ")), "{e}");
            e
        }
    }
}

#[test]
fn an_empty_file_gives_the_builtin_defaults() {
    let s = ok("", &[]);
    assert_eq!(s.relay.mode, Mode::Leader);
    assert_eq!(s.relay.batch_size, 400);
    assert!(!s.relay.instance_id.is_empty());
    assert!(
        s.database
            .url
            .expose()
            .starts_with("sqlite://outbox-relay.db")
    );
    assert_eq!(s.database.table, "outbox");
    assert_eq!(s.lease.backend, LeaseBackend::Database);
    assert!(s.lease.ttl >= s.lease.renew_timeout * 3);
    assert!(s.relay.claim_ttl >= Duration::from_secs(10) + CLAIM_MARGIN);
    let log = s.sinks.get("log").expect("a sink named log");
    assert!(matches!(kind(&s, &log.name), SinkKind::Log));
    assert_eq!(s.sinks.len(), 1);
    assert!(s.source.is_some());
    // The sends at once and the slots the README and docs/design.md ("Sends at once") state,
    // for the built-in sink and for a sink table that leaves `concurrency` out.
    assert_eq!(s.relay.max_in_flight, 1024);
    assert_eq!(log.common.concurrency, 128);
    let hook = ok(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n",
        &[],
    );
    let hook = hook.sinks.get("hook").expect("a sink named hook");
    assert_eq!(hook.common.concurrency, 128);
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let e = Settings::load_with_env(
        Some(std::path::Path::new("/nonexistent/relay.toml")),
        Some(BTreeMap::new()),
    )
    .unwrap_err();
    assert!(e.key.contains("/nonexistent/relay.toml"), "{e}");
}

#[test]
fn file_values_are_read() {
    let s = ok(
        r#"
        [relay]
        instance_id = "relay-a"
        mode = "claim"
        poll_interval = "250ms"
        batch_size = 42
        claim_ttl = "1m30s"
        [database]
        url = "postgres://postgres@127.0.0.1:5432/test"
        table = "events_outbox"
        [lease]
        backend = "none"
        ttl = "6s"
        renew_timeout = "2s"
        [retry]
        max_attempts = 1
        [sinks.hook]
        kind = "webhook"
        url = "http://127.0.0.1:1/hook"
        timeout = "3s"
        max_attempts = 4
        [sinks.hook.headers]
        X-Team = "payments"
        "#,
        &[],
    );
    assert_eq!(s.relay.instance_id, "relay-a");
    assert_eq!(s.relay.mode, Mode::Claim);
    assert_eq!(s.relay.poll_interval, Duration::from_millis(250));
    assert_eq!(s.relay.batch_size, 42);
    assert_eq!(s.relay.claim_ttl, Duration::from_secs(90));
    assert_eq!(s.database.table, "events_outbox");
    assert_eq!(s.lease.backend, LeaseBackend::None);
    assert_eq!(s.retry.max_attempts, 1);
    // Only the configured sink: the default `log` sink comes only with no sinks at all.
    assert_eq!(s.sinks.keys().collect::<Vec<_>>(), vec!["hook"]);
    let hook = &s.sinks["hook"];
    assert_eq!(hook.common.timeout, Duration::from_secs(3));
    assert_eq!(hook.common.retry_policy(&s.retry).max_attempts, 4);
    match kind(&s, &hook.name) {
        SinkKind::Webhook(w) => {
            assert_eq!(w.url, "http://127.0.0.1:1/hook");
            assert_eq!(
                w.headers.get("X-Team").map(Secret::expose),
                Some("payments")
            );
            assert!(w.secret.is_none());
        }
        other => panic!("not a webhook: {other:?}"),
    }
}

#[test]
fn unknown_keys_are_refused_with_their_section() {
    let e = load("[relay]\nbatchsize = 5\n", &[]).unwrap_err();
    assert_eq!(e.key, "relay.batchsize", "{e}");
    assert!(e.problem.contains("unknown key"), "{e}");
    let e = load("[relays]\nbatch_size = 5\n", &[]).unwrap_err();
    assert!(e.to_string().contains("relays"), "{e}");
    let e = err(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://x/\"\nurll = \"y\"\n",
        &[],
        "sinks.hook.urll",
    );
    assert!(e.problem.contains("unknown key"), "{e}");
    err(
        "[sinks.l]\nkind = \"log\"\nurl = \"http://x/\"\n",
        &[],
        "sinks.l.url",
    );
}

#[test]
fn durations_must_be_strings_with_units() {
    let e = err(
        "[relay]\npoll_interval = \"5 seconds\"\n",
        &[],
        "relay.poll_interval",
    );
    assert!(e.problem.contains("5 seconds"), "{e}");
    let e = err("[relay]\nclaim_ttl = \"60\"\n", &[], "relay.claim_ttl");
    assert!(e.problem.contains("no unit"), "{e}");
    err("[lease]\nttl = \"10w\"\n", &[], "lease.ttl");
    err("[lease]\nttl = 10\n", &[], "lease.ttl");
    err(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://x/\"\ntimeout = \"fast\"\n",
        &[],
        "sinks.hook.timeout",
    );
    err(
        "[retention]\nfailed_after = \"a week\"\n",
        &[],
        "retention.failed_after",
    );
    let s = ok("[retention]\nsuccess_after = \"7d\"\n", &[]);
    assert_eq!(
        s.retention.success_after,
        Some(Duration::from_secs(7 * 86400))
    );
    assert_eq!(s.retention.failed_after, None);
}

#[test]
fn claim_ttl_must_outlive_the_slowest_sink_plus_margin_g7() {
    // The default log sink times out after 10s.
    let floor = Duration::from_secs(10) + CLAIM_MARGIN;
    ok(
        &format!("[relay]\nclaim_ttl = \"{}ms\"\n", floor.as_millis()),
        &[],
    );
    let e = err(
        &format!("[relay]\nclaim_ttl = \"{}ms\"\n", floor.as_millis() - 1),
        &[],
        "relay.claim_ttl",
    );
    assert!(e.problem.contains("sinks.log.timeout"), "{e}");
    // The slowest of several sinks sets the floor.
    let sinks = "[sinks.fast]\nkind = \"log\"\ntimeout = \"1s\"\n\
                 [sinks.slow]\nkind = \"webhook\"\nurl = \"http://x/\"\ntimeout = \"50s\"\n";
    let e = err(
        &format!("[relay]\nclaim_ttl = \"54s\"\n{sinks}"),
        &[],
        "relay.claim_ttl",
    );
    assert!(e.problem.contains("sinks.slow.timeout"), "{e}");
    assert!(e.problem.contains("55s"), "{e}");
    ok(&format!("[relay]\nclaim_ttl = \"55s\"\n{sinks}"), &[]);
    // Raising a sink timeout through the environment is checked the same way.
    err(
        "",
        &[
            ("OUTBOX_RELAY__SINKS__LOG__KIND", "log"),
            ("OUTBOX_RELAY__SINKS__LOG__TIMEOUT", "2m"),
        ],
        "relay.claim_ttl",
    );
}

#[test]
fn lease_ttl_must_be_three_renew_timeouts_g7() {
    let e = err(
        "[lease]\nttl = \"2999ms\"\nrenew_timeout = \"1s\"\n",
        &[],
        "lease.ttl",
    );
    assert!(e.problem.contains("lease.renew_timeout"), "{e}");
    ok("[lease]\nttl = \"3s\"\nrenew_timeout = \"1s\"\n", &[]);
    err(
        "[lease]\nttl = \"100ms\"\nrenew_timeout = \"10ms\"\n",
        &[],
        "lease.ttl",
    );
    err("", &[("OUTBOX_RELAY__LEASE__TTL", "2s")], "lease.ttl");
    err(
        "",
        &[("OUTBOX_RELAY__LEASE__RENEW_TIMEOUT", "4s")],
        "lease.ttl",
    );
}

#[test]
fn sinks_need_a_known_kind_and_their_keys() {
    let e = err(
        "[sinks.p]\nkind = \"carrier-pigeon\"\n",
        &[],
        "sinks.p.kind",
    );
    assert!(e.problem.contains("carrier-pigeon"), "{e}");
    let e = err("[sinks.p]\ntimeout = \"1s\"\n", &[], "sinks.p");
    assert!(e.problem.contains("kind"), "{e}");
    let e = err("[sinks.hook]\nkind = \"webhook\"\n", &[], "sinks.hook");
    assert!(e.problem.contains("url"), "{e}");
    err(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"example.com/hook\"\n",
        &[],
        "sinks.hook.url",
    );
    err(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"ftp://example.com/\"\n",
        &[],
        "sinks.hook.url",
    );
    err("[sinks.Hook]\nkind = \"log\"\n", &[], "sinks.Hook");
    err(
        "[sinks.hook]\nkind = \"log\"\nconcurrency = 0\n",
        &[],
        "sinks.hook.concurrency",
    );
    err(
        "[sinks.hook]\nkind = \"log\"\nmax_attempts = 0\n",
        &[],
        "sinks.hook.max_attempts",
    );
    err(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"\"\n",
        &[],
        "sinks.hook.secret",
    );
}

#[test]
fn other_sections_are_validated_by_key() {
    err("[relay]\nbatch_size = 0\n", &[], "relay.batch_size");
    err("[relay]\nmode = \"solo\"\n", &[], "relay.mode");
    err("[database]\nurl = \"oracle://x/y\"\n", &[], "database.url");
    err(
        "[database]\ntable = \"outbox; DROP TABLE x\"\n",
        &[],
        "database.table",
    );
    err("[http]\nlisten = \"everywhere\"\n", &[], "http.listen");
    err("[retry]\nmultiplier = 0.5\n", &[], "retry.multiplier");
    err(
        "[retry]\ninitial_backoff = \"10m\"\nmax_backoff = \"1m\"\n",
        &[],
        "retry.initial_backoff",
    );
    err("[lease]\nbackend = \"zookeeper\"\n", &[], "lease.backend");
}

#[test]
fn env_keys_use_the_double_underscore_form() {
    let s = ok(
        "[relay]\nbatch_size = 50\n",
        &[
            ("OUTBOX_RELAY__RELAY__BATCH_SIZE", "7"),
            ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "9"),
            ("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "2s"),
            (
                "OUTBOX_RELAY__DATABASE__URL",
                "mysql://root@127.0.0.1:3306/test",
            ),
            ("OUTBOX_RELAY__DATABASE__LISTEN", "false"),
            ("OUTBOX_RELAY__LEASE__NAME", "orders"),
            ("OUTBOX_RELAY__SINKS__HOOK__KIND", "webhook"),
            ("OUTBOX_RELAY__SINKS__HOOK__URL", "http://127.0.0.1:1/"),
            ("OUTBOX_RELAY__SINKS__HOOK__SECRET", "shh-env-secret"),
        ],
    );
    assert_eq!(s.relay.batch_size, 7, "the environment wins over the file");
    assert_eq!(s.relay.max_in_flight, 9);
    assert_eq!(s.relay.poll_interval, Duration::from_secs(2));
    assert_eq!(s.database.url.expose(), "mysql://root@127.0.0.1:3306/test");
    assert!(!s.database.listen);
    assert_eq!(s.lease.name, "orders");
    match kind(&s, "hook") {
        SinkKind::Webhook(w) => {
            assert_eq!(w.url, "http://127.0.0.1:1/");
            assert_eq!(
                w.secret.as_ref().map(Secret::expose),
                Some("shh-env-secret")
            );
        }
        other => panic!("not a webhook: {other:?}"),
    }
    assert!(!format!("{s:?}").contains("shh-env-secret"), "Debug leaks");

    // Other spellings are not ours and are ignored.
    let s = ok(
        "",
        &[
            ("OUTBOX_RELAY_RELAY_BATCH_SIZE", "7"),
            ("OUTBOX_RELAY_RELAY__BATCH_SIZE", "8"),
            ("RELAY__BATCH_SIZE", "9"),
            ("OUTBOX_RELAY_CONFIG", "elsewhere.toml"),
        ],
    );
    assert_eq!(s.relay.batch_size, 400);
}

#[test]
fn bad_env_values_name_the_key() {
    err(
        "",
        &[("OUTBOX_RELAY__RELAY__BATCH_SIZE", "abc")],
        "relay.batch_size",
    );
    err(
        "",
        &[("OUTBOX_RELAY__RELAY__CLAIM_TTL", "forever")],
        "relay.claim_ttl",
    );
    err(
        "",
        &[("OUTBOX_RELAY__DATABASE__LISTEN", "maybe")],
        "database.listen",
    );
    let e = load("", &[("OUTBOX_RELAY__RELAY__BATCHSIZE", "5")]).unwrap_err();
    assert!(e.to_string().contains("batchsize"), "{e}");
}

#[test]
fn redlock_urls_are_a_comma_separated_list_in_the_environment() {
    let s = ok(
        "",
        &[(
            "OUTBOX_RELAY__LEASE__REDLOCK_URLS",
            "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003",
        )],
    );
    assert_eq!(s.lease.redlock_urls.len(), 3);
    assert_eq!(s.lease.redlock_urls[1].expose(), "redis://127.0.0.1:7002");
}

#[test]
fn secrets_do_not_show_in_debug_or_errors() {
    let secret = "whsec_c2VjcmV0LXZhbHVlLTk4NzY1NA==";
    let hook =
        format!("[sinks.hook]\nkind = \"webhook\"\nurl = \"http://x/\"\nsecret = \"{secret}\"\n");
    let s = ok(&hook, &[]);
    assert!(!format!("{s:?}").contains("c2VjcmV0"));
    let s = ok(
        "",
        &[(
            "OUTBOX_RELAY__DATABASE__URL",
            "postgres://app:pw-Zq81@db:5432/app",
        )],
    );
    assert!(!format!("{s:?}").contains("pw-Zq81"));
    assert_eq!(s.database_url_redacted(), "postgres://app:***@db:5432/app");
    for toml in [
        format!("{hook}timeout = \"2m\"\n"),
        format!("{hook}bogus = 1\n"),
        hook.replace(secret, "whsec_!!!"),
    ] {
        let e = load(&toml, &[]).unwrap_err();
        assert!(!e.to_string().contains("c2VjcmV0"), "{e}");
        assert!(!e.to_string().contains("!!!"), "{e}");
    }
}

#[test]
fn redlock_urls_are_a_list_in_the_file() {
    let s = ok(
        "[lease]\nredlock_urls = [\"redis://127.0.0.1:7001\", \"redis://127.0.0.1:7002\"]\n",
        &[],
    );
    assert_eq!(s.lease.redlock_urls.len(), 2);
    assert_eq!(s.lease.redlock_urls[0].expose(), "redis://127.0.0.1:7001");
    assert!(ok("", &[]).lease.redlock_urls.is_empty());
}
