//! Configuration through the real binary: invalid settings are refused at start with exit code
//! 2 and an error naming the key (G7), by `check-config` and by `run` alike; environment
//! overrides apply; secrets never show; the built-in defaults pass with no file at all.

use std::path::Path;
use std::time::Duration;

use crate::support::process::*;

mod keys;
mod settings;

/// What one run of the binary produced.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs the binary in `dir` (so no `config/relay.toml` of the checkout is picked up) with
/// `args` and only the given `OUTBOX_RELAY*` variables; killed and failed after 20s.
fn relay(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = relay_command(dir);
    cmd.args(args);
    if args.contains(&"run") {
        // Keep a `run` that wrongly starts off the default metrics port.
        cmd.env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_within(
        format!("outbox-relay {args:?} (it should refuse to start)"),
        &mut cmd,
        Duration::from_secs(20),
    );
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A temporary working directory holding `relay.toml` with `toml`.
fn config_dir(toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("relay.toml"), toml).expect("write config");
    dir
}

/// Both `check-config` and `run` refuse `toml` (+ `env`) with exit 2 and an error that
/// mentions every one of `needles`. Returns the `check-config` stderr.
fn refused(toml: &str, env: &[(&str, &str)], needles: &[&str]) -> String {
    let dir = config_dir(toml);
    let mut first = None;
    for verb in ["check-config", "run"] {
        let out = relay(dir.path(), &["--config", "relay.toml", verb], env);
        assert_eq!(
            out.code, 2,
            "{verb} must exit 2 on {toml:?} {env:?}:\n{out:?}"
        );
        assert!(
            !out.stdout.contains("configuration OK"),
            "{verb} claimed success:\n{out:?}"
        );
        for n in needles {
            assert!(
                out.stderr.contains(n),
                "{verb}: the error should mention {n:?}:\n{out:?}"
            );
        }
        assert!(
            out.stderr.contains("configuration error"),
            "{verb}: not reported as a configuration error:\n{out:?}"
        );
        first.get_or_insert(out.stderr);
    }
    first.unwrap()
}

/// A configuration (file text, environment) and what its error must mention.
type Refusal<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);

#[test]
fn both_verbs_refuse_every_class_of_error_with_exit_2_naming_the_key() {
    // One case per class; the many variants of each are checked at library level
    // (`settings.rs`), where they cost no process.
    let cases: &[Refusal] = &[
        // An unknown key, in a section and in a sink's own keys.
        ("[relay]\nbatchsize = 5\n", &[], &["relay", "batchsize"]),
        (
            "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\nurll = \"x\"\n",
            &[],
            &["sinks.hook", "urll"],
        ),
        // An unknown key in an inline table (a payload_object entry), from the file and the
        // environment.
        (
            "[table.payload_object]\nbody = { json = \"body\", as_text = true }\n",
            &[],
            &["table.payload_object.body.as_text", "unknown key"],
        ),
        (
            "[table.payload_object.body]\njson = \"body\"\n",
            &[("OUTBOX_RELAY__TABLE__PAYLOAD_OBJECT__BODY__AS_TEXT", "true")],
            &["table.payload_object.body.as_text"],
        ),
        // A number too large for 64 bits, and one that is not a number, naming key and range.
        (
            "[relay]\nbatch_size = 1180591620717411303424\n",
            &[],
            &["relay.batch_size", "too large", "from 1 to 10000"],
        ),
        (
            "",
            &[("OUTBOX_RELAY__RETRY__MULTIPLIER", "NaN")],
            &["retry.multiplier", "from 1 to 100"],
        ),
        // A duration without a unit or in words.
        (
            "[relay]\npoll_interval = \"5 seconds\"\n",
            &[],
            &["relay.poll_interval", "5 seconds"],
        ),
        // G7: a claim must outlive the slowest sink (default log sink: 10s + 5s margin).
        (
            "[relay]\nclaim_ttl = \"14s\"\n",
            &[],
            &["relay.claim_ttl", "sinks.log.timeout", "15s"],
        ),
        // G7: the lease ttl must cover three renewals.
        (
            "[lease]\nttl = \"2s\"\nrenew_timeout = \"1s\"\n",
            &[],
            &["lease.ttl", "lease.renew_timeout"],
        ),
        // Sinks: an unknown kind, and a kind's required key (parsed by the sink module).
        (
            "[sinks.pigeon]\nkind = \"carrier-pigeon\"\n",
            &[],
            &["sinks.pigeon.kind", "carrier-pigeon"],
        ),
        (
            "[sinks.hook]\nkind = \"webhook\"\n",
            &[],
            &["sinks.hook", "url"],
        ),
        // The environment is checked like the file.
        (
            "",
            &[("OUTBOX_RELAY__RELAY__BATCH_SIZE", "abc")],
            &["relay.batch_size"],
        ),
        (
            "",
            &[("OUTBOX_RELAY__DATABASE__URL", "oracle://db/x")],
            &["database.url"],
        ),
    ];
    for (toml, env, needles) in cases {
        refused(toml, env, needles);
    }
    // The boundaries are accepted.
    for toml in [
        "[relay]\nclaim_ttl = \"15s\"\n",
        "[lease]\nttl = \"3s\"\nrenew_timeout = \"1s\"\n",
    ] {
        let dir = config_dir(toml);
        let out = relay(dir.path(), &["--config", "relay.toml", "check-config"], &[]);
        assert_eq!(out.code, 0, "{toml:?}: {out:?}");
    }
}

#[test]
fn env_overrides_file_and_defaults() {
    let dir = config_dir("[relay]\nbatch_size = 50\n");
    let out = relay(
        dir.path(),
        &["--config", "relay.toml", "check-config"],
        &[
            ("OUTBOX_RELAY__RELAY__BATCH_SIZE", "7"),
            ("OUTBOX_RELAY__LEASE__NAME", "from-env"),
            ("OUTBOX_RELAY__DATABASE__TABLE", "events_outbox"),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("batch_size=7"), "{out:?}");
    assert!(out.stdout.contains("name=from-env"), "{out:?}");
    assert!(out.stdout.contains("table=events_outbox"), "{out:?}");
    // Without the override the file's value shows.
    let out = relay(dir.path(), &["--config", "relay.toml", "check-config"], &[]);
    assert!(out.stdout.contains("batch_size=50"), "{out:?}");
}

#[test]
fn secrets_never_show() {
    const SECRET: &str = "whsec_c2VjcmV0LXZhbHVlLTEyMzQ1Njc4OTA=";
    const PASSWORD: &str = "pw-Zq81xx";
    let hook = format!(
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\nsecret = \"{SECRET}\"\n"
    );
    let db_url = format!("postgres://app:{PASSWORD}@127.0.0.1:1/app");
    let env = [("OUTBOX_RELAY__DATABASE__URL", db_url.as_str())];
    let no_leak = |out: &Outcome| {
        for s in [SECRET, "c2VjcmV0LXZhbHVl", PASSWORD] {
            assert!(
                !out.stdout.contains(s) && !out.stderr.contains(s),
                "a secret leaked:\n{out:?}"
            );
        }
    };

    // check-config shows the effective settings, masked.
    let dir = config_dir(&hook);
    let out = relay(
        dir.path(),
        &["--config", "relay.toml", "check-config"],
        &env,
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("sink hook: kind=webhook"), "{out:?}");
    assert!(out.stdout.contains("app:***@127.0.0.1"), "{out:?}");
    no_leak(&out);

    // The secret from a file, and from the environment.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), format!("{SECRET}\n")).unwrap();
    std::fs::write(
        dir.path().join("relay.toml"),
        "[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\nsecret_file = \"secret\"\n",
    )
    .unwrap();
    let out = relay(
        dir.path(),
        &["--config", "relay.toml", "check-config"],
        &env,
    );
    assert_eq!(out.code, 0, "{out:?}");
    no_leak(&out);
    let dir = config_dir("[sinks.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n");
    let out = relay(
        dir.path(),
        &["--config", "relay.toml", "check-config"],
        &[
            ("OUTBOX_RELAY__SINKS__HOOK__SECRET", SECRET),
            ("OUTBOX_RELAY__DATABASE__URL", db_url.as_str()),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    no_leak(&out);

    // Errors elsewhere in a config holding secrets do not print them either.
    for (toml, key) in [
        (format!("{hook}timeout = \"90s\"\n"), "relay.claim_ttl"),
        (format!("{hook}urll = \"x\"\n"), "urll"),
        (
            format!("{hook}secret_file = \"/nonexistent\"\n"),
            "sinks.hook.secret_file",
        ),
        (
            hook.replace("http://127.0.0.1:1/", "not a url"),
            "sinks.hook.url",
        ),
        (
            format!("[lease]\nttl = \"1s\"\nrenew_timeout = \"1s\"\n{hook}"),
            "lease.ttl",
        ),
    ] {
        let dir = config_dir(&toml);
        for verb in ["check-config", "run"] {
            let out = relay(dir.path(), &["--config", "relay.toml", verb], &env);
            assert_eq!(out.code, 2, "{out:?}");
            assert!(out.stderr.contains(key), "{out:?}");
            no_leak(&out);
        }
    }
    // An invalid secret is refused without being echoed.
    let bad = "whsec_!!not-base64-Zq81!!";
    let dir = config_dir(&hook.replace(SECRET, bad));
    let out = relay(dir.path(), &["--config", "relay.toml", "check-config"], &[]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("sinks.hook.secret"), "{out:?}");
    assert!(!out.stderr.contains("not-base64-Zq81"), "{out:?}");
}

#[test]
fn builtin_defaults_pass_with_no_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = relay(dir.path(), &["check-config"], &[]);
    assert_eq!(out.code, 0, "{out:?}");
    for expected in [
        "built-in defaults",
        "mode=Leader",
        "url=sqlite://outbox-relay.db",
        "table=outbox",
        "backend=Database",
        "sink log: kind=log",
    ] {
        assert!(
            out.stdout.contains(expected),
            "missing {expected:?}:\n{out:?}"
        );
    }
}

#[test]
fn missing_config_file_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for verb in ["check-config", "run"] {
        let out = relay(dir.path(), &["--config", "nope.toml", verb], &[]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("nope.toml"), "{out:?}");
    }
}

/// Every duration key, in the file and in the environment, refuses values that overflow or
/// are not finite with exit 2 naming the key: never a panic (exit 101).
#[test]
fn overflowing_durations_are_refused_not_panics() {
    let keys = [
        ("relay", "poll_interval"),
        ("relay", "claim_ttl"),
        ("relay", "shutdown_timeout"),
        ("lease", "ttl"),
        ("lease", "renew_timeout"),
        ("retry", "initial_backoff"),
        ("retry", "max_backoff"),
        ("database", "connect_timeout"),
        ("retention", "success_after"),
    ];
    let values = [
        "99999999999999999999d",
        "18446744073709551615s",
        "18446744073709551616000ms",
        "36501d",
        "1e400s",
        "-1s",
    ];
    for (section, key) in keys {
        for value in values {
            let toml = format!("[{section}]\n{key} = \"{value}\"\n");
            let stderr = refused(&toml, &[], &[&format!("{section}.{key}")]);
            assert!(!stderr.contains("panicked"), "{stderr}");
            let var = format!(
                "OUTBOX_RELAY__{}__{}",
                section.to_uppercase(),
                key.to_uppercase()
            );
            let stderr = refused("", &[(&var, value)], &[&format!("{section}.{key}")]);
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
    // A sink's own keys too.
    for (key, value) in [
        ("timeout", "\"99999999999999999999d\""),
        ("rate_per_sec", "1e-300"),
        ("rate_per_sec", "1e300"),
        ("concurrency", "0"),
        ("concurrency", "99999999999"),
    ] {
        let toml = format!("[sinks.s]\nkind = \"log\"\n{key} = {value}\n");
        refused(&toml, &[], &[&format!("sinks.s.{key}")]);
    }
}

/// Duration arguments of the verbs refuse overflowing values with exit 2.
#[test]
fn overflowing_cli_durations_are_usage_errors() {
    let dir = config_dir("");
    for value in ["99999999999999999999d", "18446744073709551615s", "1e400s"] {
        let out = relay(dir.path(), &["purge", "--older-than", value], &[]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(!out.stderr.contains("panicked"), "{out:?}");
    }
}

/// A configuration file that is not valid UTF-8 is refused, naming the file and the place.
#[test]
fn config_file_that_is_not_utf8_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("relay.toml"),
        b"[relay]\ninstance_id = \"ab\xffc\"\n",
    )
    .expect("write");
    for verb in ["check-config", "run"] {
        let out = relay(dir.path(), &["--config", "relay.toml", verb], &[]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(
            out.stderr.contains("relay.toml") && out.stderr.contains("UTF-8"),
            "{out:?}"
        );
        assert!(out.stderr.contains("line 2"), "{out:?}");
    }
}

/// A verb whose stdout is closed by its reader (`check-config | head -0`) ends quietly with
/// exit 0: no panic, no exit 101.
#[test]
fn closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let dir = config_dir("");
    let mut cmd = relay_command(dir.path());
    cmd.args(["check-config"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    // Close the read end at once, as `head -0` would.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
