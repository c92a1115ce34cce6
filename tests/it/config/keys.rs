//! Every key, as a class: an unknown key anywhere (sections, `[table.*]`, inline tables such as
//! a `payload_object` entry, sink tables, arrays of tables) is refused by its full path, from
//! the file and from the environment; every kind of key can be set from the environment,
//! where every value is a string (the status codes by the rule of docs/adopting-a-table.md);
//! every number out of its key's range (too large for 64 or 128 bits, negative, zero, a
//! fraction, NaN, infinite, a boolean) is refused naming the key and the range, never a panic.

use std::time::Duration;

use outbox_relay::config::*;
use outbox_relay::sink::SinkKind;

use super::settings::{err, kind, load, ok};

/// A mapped table whose mapping is complete, so that only the case's own key can be wrong.
const TABLE: &str = "[table]\nchannel_value = \"hook\"\n\
                     [table.columns]\nid = \"event_id\"\nstatus = \"state\"\npayload = \"body\"\n\
                     [table.status]\npending = 0\nsuccess = 1\nfailed = 2\n";

/// One sink of each kind whose own keys parse (before anything reads a file or a network).
const HOOK: &str = "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n";

/// A configuration file, its environment, and the key its error must name.
type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);

/// The key `load` refuses `toml` + `vars` with; panics when it loads.
fn refused_key(toml: &str, vars: &[(&str, &str)]) -> ConfigError {
    match load(toml, vars) {
        Ok(_) => panic!("{toml:?} {vars:?} should be refused"),
        Err(e) => e,
    }
}

/// Unknown keys in a file, at every depth: (the file, no variables, the key refused).
fn unknown_keys_in_files() -> Vec<Case<'static>> {
    vec![
        ("relays = 1\n".into(), vec![], "relays"),
        ("[relay]\nbatchsize = 5\n".into(), vec![], "relay.batchsize"),
        ("[database]\nurll = \"x\"\n".into(), vec![], "database.urll"),
        ("[lease]\nttl_ms = 5\n".into(), vec![], "lease.ttl_ms"),
        (
            "[retry]\nmax_attemps = 5\n".into(),
            vec![],
            "retry.max_attemps",
        ),
        ("[http]\nlistn = \"x\"\n".into(), vec![], "http.listn"),
        ("[log]\nlvl = \"x\"\n".into(), vec![], "log.lvl"),
        (
            "[retention]\nsucces_after = \"1d\"\n".into(),
            vec![],
            "retention.succes_after",
        ),
        ("[console]\ntokn = \"x\"\n".into(), vec![], "console.tokn"),
        (
            format!("{TABLE}channel = \"x\"\n"),
            vec![],
            "table.status.channel",
        ),
        (
            TABLE.replace("[table.columns]\n", "[table.columns]\nidd = \"x\"\n"),
            vec![],
            "table.columns.idd",
        ),
        (
            TABLE.replace("[table]\n", "[table]\nnotify = true\n"),
            vec![],
            "table.notify",
        ),
        (
            format!(
                "{TABLE}[table.payload_object]\nbody = {{ json = \"body\", as_text = true }}\n"
            ),
            vec![],
            "table.payload_object.body.as_text",
        ),
        (
            format!("{TABLE}[table.payload_object.parameters.code]\njson = \"c\"\nraw = \"d\"\n"),
            vec![],
            "table.payload_object.parameters.code.raw",
        ),
        (format!("{HOOK}urll = \"x\"\n"), vec![], "sinks.hook.urll"),
        (
            format!("{HOOK}timeout_s = 5\n"),
            vec![],
            "sinks.hook.timeout_s",
        ),
        (
            "[sinks.l]\nkind = \"log\"\nlevel = \"x\"\n".into(),
            vec![],
            "sinks.l.level",
        ),
        (
            "[sinks.p]\nkind = \"fcm\"\nprojectid = \"x\"\n".into(),
            vec![],
            "sinks.p.projectid",
        ),
        (
            "[sinks.k]\nkind = \"alimtalk\"\nprovider = \"nhn\"\nappkey = \"x\"\n".into(),
            vec![],
            "sinks.k.appkey",
        ),
        (
            "[sinks.n]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:1\"\nsubjct = \"x\"\n".into(),
            vec![],
            "sinks.n.subjct",
        ),
    ]
}

/// The same from the environment, at each depth (`payload`: a table with a payload object).
fn unknown_keys_in_the_environment(payload: &str) -> Vec<Case<'static>> {
    vec![
        ("".into(), vec![("OUTBOX_RELAY__RELAYS__X", "1")], "relays"),
        (
            "".into(),
            vec![("OUTBOX_RELAY__RELAY__BATCHSIZE", "5")],
            "relay.batchsize",
        ),
        (
            TABLE.into(),
            vec![("OUTBOX_RELAY__TABLE__COLUMNS__IDD", "x")],
            "table.columns.idd",
        ),
        (
            TABLE.into(),
            vec![("OUTBOX_RELAY__TABLE__STATUS__PENDIN", "0")],
            "table.status.pendin",
        ),
        (
            payload.to_string(),
            vec![("OUTBOX_RELAY__TABLE__PAYLOAD_OBJECT__BODY__AS_TEXT", "true")],
            "table.payload_object.body.as_text",
        ),
        (
            HOOK.into(),
            vec![("OUTBOX_RELAY__SINKS__HOOK__URLL", "x")],
            "sinks.hook.urll",
        ),
        (
            "".into(),
            vec![("OUTBOX_RELAY__CONSOLE__TOKN", "x")],
            "console.tokn",
        ),
    ]
}

#[test]
fn unknown_keys_are_refused_by_their_full_path_at_every_depth() {
    let payload = format!(
        "{}[table.payload_object]\nbody = {{ json = \"body\" }}\n",
        TABLE.replace("payload = \"body\"\n", "")
    );
    let mut cases = unknown_keys_in_files();
    cases.extend(unknown_keys_in_the_environment(&payload));
    for (toml, vars, key) in &cases {
        let e = refused_key(toml, vars);
        assert_eq!(e.key, *key, "{toml:?} {vars:?}: {e}");
        assert!(e.problem.starts_with("unknown key ("), "{e}");
    }
    // The json form names what it takes.
    let json = cases
        .iter()
        .find(|c| c.2 == "table.payload_object.body.as_text");
    let e = refused_key(&json.expect("the json case").0, &[]);
    assert!(e.problem.contains("expected json"), "{e}");
    // Arrays of tables where a table or a value is expected are refused by their key too.
    for (toml, key) in [
        // serde reads a struct from a list too, so the key is its first element's.
        ("[[relay]]\nbatch_size = 5\n".to_string(), "relay[0]"),
        ("[[sinks.hook]]\nkind = \"log\"\n".to_string(), "sinks.hook"),
        (
            format!("{TABLE}[[table.payload_object.items]]\nx = \"y\"\n"),
            "table.payload_object.items",
        ),
        (
            TABLE.replace("pending = 0", "[[table.status.pending]]\nx = 1"),
            "table.status.pending[0]",
        ),
    ] {
        let e = refused_key(&toml, &[]);
        assert_eq!(e.key, key, "{toml:?}: {e}");
    }
    // An open section takes any name: a webhook's headers.
    ok(
        &format!("{HOOK}headers = {{ \"x-anything\" = \"v\" }}\n"),
        &[],
    );
    ok(
        HOOK,
        &[("OUTBOX_RELAY__SINKS__HOOK__HEADERS__X-TEAM", "payments")],
    );
    // And the json form's own key from the environment is read.
    let s = ok(
        &TABLE.replace("payload = \"body\"\n", ""),
        &[("OUTBOX_RELAY__TABLE__PAYLOAD_OBJECT__BODY__JSON", "body")],
    );
    assert_eq!(
        s.table.payload_object.as_ref().and_then(|o| o.get("body")),
        Some(&PayloadValue::Json {
            json: "body".into()
        })
    );
}

#[test]
fn every_kind_of_key_can_come_from_the_environment() {
    let file = format!(
        "[relay]\nbatch_size = 50\nmode = \"leader\"\npoll_interval = \"1s\"\n\
         [database]\nlisten = true\nmax_connections = 4\n\
         [retry]\nmultiplier = 3.0\nmax_attempts = 5\n\
         [console]\ntoken = \"file-token-0123456789\"\nshow_payloads = false\n\
         {HOOK}concurrency = 2\nrate_per_sec = 1.0\nmax_attempts = 2\nmultiplier = 2\n\
         max_body_bytes = 100\ntimeout = \"1s\"\n"
    );
    let vars = [
        // integers
        ("OUTBOX_RELAY__RELAY__BATCH_SIZE", "70"),
        ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "300"),
        ("OUTBOX_RELAY__DATABASE__MAX_CONNECTIONS", " 3 "),
        ("OUTBOX_RELAY__RETRY__MAX_ATTEMPTS", "9"),
        ("OUTBOX_RELAY__SINKS__HOOK__CONCURRENCY", "7"),
        ("OUTBOX_RELAY__SINKS__HOOK__MAX_ATTEMPTS", "4"),
        ("OUTBOX_RELAY__SINKS__HOOK__MAX_BODY_BYTES", "2048"),
        // floats
        ("OUTBOX_RELAY__RETRY__MULTIPLIER", "1.5"),
        ("OUTBOX_RELAY__SINKS__HOOK__RATE_PER_SEC", "2.5"),
        ("OUTBOX_RELAY__SINKS__HOOK__MULTIPLIER", "4"),
        // booleans
        ("OUTBOX_RELAY__DATABASE__LISTEN", "false"),
        ("OUTBOX_RELAY__DATABASE__MIGRATE", "0"),
        ("OUTBOX_RELAY__CONSOLE__SHOW_PAYLOADS", "yes"),
        ("OUTBOX_RELAY__CONSOLE__MASK_RECIPIENTS", "OFF"),
        ("OUTBOX_RELAY__CONSOLE__ENABLED", "True"),
        // durations
        ("OUTBOX_RELAY__RELAY__POLL_INTERVAL", "250ms"),
        ("OUTBOX_RELAY__LEASE__TTL", "12s"),
        ("OUTBOX_RELAY__RETENTION__SUCCESS_AFTER", "7d"),
        ("OUTBOX_RELAY__SINKS__HOOK__TIMEOUT", "2s"),
        // enumerations
        ("OUTBOX_RELAY__RELAY__MODE", "claim"),
        ("OUTBOX_RELAY__LOG__FORMAT", "json"),
        // lists
        (
            "OUTBOX_RELAY__LEASE__REDLOCK_URLS",
            "redis://127.0.0.1:1, redis://127.0.0.1:2,redis://127.0.0.1:3",
        ),
        // strings and secrets
        ("OUTBOX_RELAY__DATABASE__TABLE", "events_outbox"),
        ("OUTBOX_RELAY__CONSOLE__TOKEN", "env-token-0123456789"),
        ("OUTBOX_RELAY__SINKS__HOOK__HEADERS__X-TEAM", "payments"),
    ];
    let s = ok(&file, &vars);
    assert_eq!(s.relay.batch_size, 70);
    assert_eq!(s.relay.max_in_flight, 300);
    assert_eq!(s.database.max_connections, 3);
    assert_eq!(s.retry.max_attempts, 9);
    let hook = &s.sinks["hook"];
    assert_eq!(hook.common.concurrency, 7);
    assert_eq!(hook.common.max_attempts, Some(4));
    assert_eq!(s.retry.multiplier, 1.5);
    assert_eq!(hook.common.rate_per_sec, Some(2.5));
    assert_eq!(hook.common.multiplier, Some(4.0));
    assert!(!s.database.listen && !s.database.migrate);
    let console = s.console.as_ref().expect("console on");
    assert!(console.show_payloads && !console.mask_recipients);
    assert_eq!(console.token.expose(), "env-token-0123456789");
    assert_eq!(s.relay.poll_interval, Duration::from_millis(250));
    assert_eq!(s.lease.ttl, Duration::from_secs(12));
    assert_eq!(
        s.retention.success_after,
        Some(Duration::from_secs(7 * 86_400))
    );
    assert_eq!(hook.common.timeout, Duration::from_secs(2));
    assert_eq!(s.relay.mode, Mode::Claim);
    assert_eq!(s.log.format, LogFormat::Json);
    assert_eq!(s.lease.redlock_urls.len(), 3);
    assert_eq!(s.lease.redlock_urls[1].expose(), "redis://127.0.0.1:2");
    assert_eq!(s.database.table, "events_outbox");
    match kind(&s, "hook") {
        SinkKind::Webhook(w) => {
            assert_eq!(w.max_body_bytes, 2048);
            assert_eq!(
                w.headers.get("x-team").map(Secret::expose),
                Some("payments")
            );
        }
        other => panic!("not a webhook: {other:?}"),
    }
    // `false` from the environment turns the console off.
    let s = ok(&file, &[("OUTBOX_RELAY__CONSOLE__ENABLED", "false")]);
    assert!(s.console.is_none());
}

#[test]
fn status_codes_from_the_environment_take_the_kind_of_the_others() {
    let status = |s: &Settings| {
        let st = &s.table.status;
        (
            st.pending.clone(),
            st.retry.clone(),
            st.success.clone(),
            st.failed.clone(),
        )
    };
    // The file's values are integers: digits from the environment are integers too, for
    // every state, and a list is comma-separated.
    let s = ok(
        TABLE,
        &[
            ("OUTBOX_RELAY__TABLE__STATUS__PENDING", "0,5"),
            ("OUTBOX_RELAY__TABLE__STATUS__RETRY", "7"),
            ("OUTBOX_RELAY__TABLE__STATUS__SUCCESS", "3"),
            ("OUTBOX_RELAY__TABLE__STATUS__FAILED", "-1"),
        ],
    );
    assert_eq!(
        status(&s),
        (
            Some(Codes::Many(vec![Code::Int(0), Code::Int(5)])),
            Some(Codes::One(Code::Int(7))),
            Some(Code::Int(3)),
            Some(Code::Int(-1)),
        )
    );
    // One override is enough to have failed the old check ("mixes integer and string").
    let s = ok(TABLE, &[("OUTBOX_RELAY__TABLE__STATUS__FAILED", "9")]);
    assert_eq!(s.table.status.failed, Some(Code::Int(9)));
    // A string that is not digits among integers is refused by its key, saying why.
    let e = err(
        TABLE,
        &[("OUTBOX_RELAY__TABLE__STATUS__FAILED", "DONE")],
        "table.status.failed",
    );
    assert!(e.problem.contains("integer"), "{e}");
    err(
        TABLE,
        &[(
            "OUTBOX_RELAY__TABLE__STATUS__FAILED",
            "99999999999999999999",
        )],
        "table.status.failed",
    );
    // The file's values are strings: digits stay strings (quoted, they match an integer or a
    // text column alike; the live check accepts both then).
    let strings = TABLE
        .replace("pending = 0", "pending = \"NEW\"")
        .replace("success = 1", "success = \"SENT\"")
        .replace("failed = 2", "failed = \"ERR\"");
    let s = ok(&strings, &[("OUTBOX_RELAY__TABLE__STATUS__FAILED", "9")]);
    assert_eq!(s.table.status.failed, Some(Code::Text("9".into())));
    let s = ok(
        &strings,
        &[("OUTBOX_RELAY__TABLE__STATUS__PENDING", "NEW, READY")],
    );
    assert_eq!(
        s.table.status.pending,
        Some(Codes::Many(vec![
            Code::Text("NEW".into()),
            Code::Text("READY".into())
        ]))
    );
    // All from the environment: strings, as written.
    let s = ok(
        "",
        &[
            ("OUTBOX_RELAY__TABLE__CHANNEL_VALUE", "hook"),
            ("OUTBOX_RELAY__TABLE__COLUMNS__ID", "id"),
            ("OUTBOX_RELAY__TABLE__COLUMNS__STATUS", "st"),
            ("OUTBOX_RELAY__TABLE__COLUMNS__PAYLOAD", "body"),
            ("OUTBOX_RELAY__TABLE__STATUS__PENDING", "0"),
            ("OUTBOX_RELAY__TABLE__STATUS__SUCCESS", "1"),
            ("OUTBOX_RELAY__TABLE__STATUS__FAILED", "2"),
            ("OUTBOX_RELAY__TABLE__NOTIFY_TRIGGER", "true"),
        ],
    );
    assert_eq!(s.table.status.success, Some(Code::Text("1".into())));
    assert_eq!(s.table.notify_trigger, Some(true));
    // A comma is never part of a value: one state's single value is refused.
    err(
        TABLE,
        &[("OUTBOX_RELAY__TABLE__STATUS__SUCCESS", "1,3")],
        "table.status.success",
    );
}

/// The integer keys and their ranges: (section, key, min, max).
const INTEGERS: &[(&str, &str, &str, &str)] = &[
    ("relay", "batch_size", "1", "10000"),
    ("relay", "max_in_flight", "1", "100000"),
    ("database", "max_connections", "1", "4294967295"),
    ("retry", "max_attempts", "1", "4294967295"),
    ("sinks.hook", "concurrency", "1", "4294967295"),
    ("sinks.hook", "max_attempts", "1", "4294967295"),
    ("sinks.hook", "max_body_bytes", "1", "18446744073709551615"),
];

/// The float keys and their ranges.
const FLOATS: &[(&str, &str, &str, &str)] = &[
    ("retry", "multiplier", "1", "100"),
    ("sinks.hook", "multiplier", "1", "100"),
    ("sinks.hook", "rate_per_sec", "0.001", "1000000"),
];

/// `OUTBOX_RELAY__SECTION__KEY` of `section.key`.
fn var(section: &str, key: &str) -> String {
    format!("OUTBOX_RELAY__{}__{}", section.replace('.', "__"), key).to_uppercase()
}

/// The sink `hook` and `section.key = value`.
fn with(section: &str, key: &str, value: &str) -> String {
    if section == "sinks.hook" {
        format!("{HOOK}{key} = {value}\n")
    } else {
        format!("{HOOK}[{section}]\n{key} = {value}\n")
    }
}

/// `section.key` refuses `value` written in the file as `toml` and, as a string, from the
/// environment, naming the key and `range`.
fn refuses_number(section: &str, key: &str, toml: &str, env: &str, range: &str) {
    let full = format!("{section}.{key}");
    let file = with(section, key, toml);
    let e = err(&file, &[], &full);
    assert!(e.problem.contains(range), "{file:?}: {e}");
    let e = err(HOOK, &[(&var(section, key), env)], &full);
    assert!(e.problem.contains(range), "{env:?}: {e}");
}

#[test]
fn numbers_out_of_range_name_the_key_and_the_range() {
    let huge = "9".repeat(45);
    for (section, key, min, max) in INTEGERS {
        let range = format!("from {min} to {max}");
        let above = format!("{}0", max);
        for (toml, env) in [
            ("1180591620717411303424", "1180591620717411303424"),
            (huge.as_str(), huge.as_str()),
            (above.as_str(), above.as_str()),
            ("-1", "-1"),
            ("-1180591620717411303424", "-1180591620717411303424"),
            ("0", "0"),
            ("1.5", "1.5"),
            ("2.0", "2.0"),
            ("1e3", "1e3"),
            ("nan", "NaN"),
            ("inf", "inf"),
            ("-inf", "-inf"),
            ("true", "yes"),
            ("\"ten\"", "ten"),
            ("[1]", ""),
        ] {
            refuses_number(section, key, toml, env, &range);
        }
    }
    for (section, key, min, max) in FLOATS {
        let range = format!("from {min} to {max}");
        for (toml, env) in [
            ("nan", "NaN"),
            ("inf", "inf"),
            ("-inf", "-infinity"),
            ("1e400", "1e400"),
            ("1180591620717411303424", "1180591620717411303424"),
            ("-1", "-1"),
            ("0", "0"),
            ("true", "on"),
            ("\"fast\"", "fast"),
        ] {
            refuses_number(section, key, toml, env, &range);
        }
    }
    // Each range's ends are accepted, from the file and from the environment.
    for (section, key, min, max) in INTEGERS.iter().chain(FLOATS) {
        for v in [min, max] {
            ok(&with(section, key, v), &[]);
            ok(HOOK, &[(&var(section, key), v)]);
        }
    }
}

#[test]
fn zero_durations_that_cannot_work_are_refused() {
    err(
        "[database]\nconnect_timeout = \"0s\"\n",
        &[],
        "database.connect_timeout",
    );
    err(
        "",
        &[("OUTBOX_RELAY__LEASE__RENEW_TIMEOUT", "0ms")],
        "lease.renew_timeout",
    );
    err(
        &format!("{HOOK}timeout = \"0s\"\n"),
        &[],
        "sinks.hook.timeout",
    );
}
