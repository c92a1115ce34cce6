//! What operators watch, checked against the real thing: the `/metrics` output by `promtool
//! check metrics`, JSON logs without secrets, the alert rules and the dashboard's queries
//! (`promtool`), and that every metric the README lists is the relay's.

use super::*;

/// Runs `promtool` with `args` and `input` on stdin; `None` when promtool is not installed.
fn promtool(args: &[&str], input: &str) -> Option<Output> {
    use std::io::Write;
    let mut child = match Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    Some(child.wait_with_output().unwrap())
}

/// The real `/metrics` output of a relay that delivered a row passes `promtool check metrics`
/// (the README's Metrics section), and carries every metric name the README lists.
#[tokio::test]
async fn metrics_output_passes_promtool_check() {
    if promtool(&["--version"], "").is_none() {
        assert!(
            !services_required(),
            "promtool is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but not on PATH; \
             install the Debian package `prometheus`"
        );
        eprintln!("SKIPPED: promtool not on PATH (Debian package `prometheus`)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    enqueue_log_row(dir.path(), r#"{"hi":1}"#);
    let _relay = RelayProc::spawn(
        "relay",
        relay_command(dir.path())
            .env("OUTBOX_RELAY__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .arg("run"),
        dir.path().join("relay.log"),
    );
    let metrics = until_some(
        "a delivery seen on /metrics",
        Duration::from_secs(30),
        || async {
            fetch(&format!("{base}/metrics"))
                .await
                .and_then(|(code, body)| {
                    (code == 200
                        && body.contains(
                            r#"outbox_relay_deliveries_total{sink="log",outcome="delivered"} 1"#,
                        )
                        && body.contains(r#"outbox_relay_rows{status="#))
                    .then_some(body)
                })
        },
    )
    .await;
    // Every metric but the lease's renewals and losses, which no run this short may have had.
    for name in METRICS
        .iter()
        .filter(|m| !matches!(**m, "lease_renewals_total" | "lease_lost_total"))
    {
        assert!(
            metrics.contains(&format!("# TYPE outbox_relay_{name} ")),
            "no outbox_relay_{name} in:\n{metrics}"
        );
    }
    let checked = promtool(&["check", "metrics"], &metrics).expect("promtool");
    assert!(
        checked.status.success(),
        "promtool check metrics failed ({:?}):\n{}{}\n--- metrics ---\n{metrics}",
        checked.status.code(),
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// `log.format = "json"`: every log line is one JSON object, and neither the database
/// password nor a webhook secret appears in the logs or in `check-config`.
#[tokio::test]
async fn json_logs_never_show_secrets() {
    const PASSWORD: &str = "pw-do-not-log-71";
    const SECRET: &str = "whsec_ZG8tbm90LWxvZy10aGlzLXNlY3JldA==";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env = [
        (
            "OUTBOX_RELAY__DATABASE__URL",
            format!("postgres://app:{PASSWORD}@127.0.0.1:1/test"),
        ),
        ("OUTBOX_RELAY__DATABASE__CONNECT_TIMEOUT", "300ms".into()),
        ("OUTBOX_RELAY__LOG__FORMAT", "json".into()),
        ("OUTBOX_RELAY__LOG__LEVEL", "debug".into()),
        ("OUTBOX_RELAY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
        ("OUTBOX_RELAY__SINKS__HOOK__KIND", "webhook".into()),
        (
            "OUTBOX_RELAY__SINKS__HOOK__URL",
            "http://127.0.0.1:1/hook".into(),
        ),
        ("OUTBOX_RELAY__SINKS__HOOK__SECRET", SECRET.into()),
    ];
    let mut cmd = relay_command(dir.path());
    cmd.arg("check-config");
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(PASSWORD) && !text.contains(SECRET), "{text}");

    // `run` against an unreachable database logs its retries; then SIGTERM.
    let mut cmd = relay_command(dir.path());
    cmd.arg("run").stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn relay");
    let pid = child.id();
    until_or(
        Duration::from_secs(20),
        || async {
            fetch(&format!("http://127.0.0.1:{port}/healthz"))
                .await
                .is_some()
        },
        || "relay did not start".into(),
    )
    .await;
    // A few connection attempts (500ms, 1s backoff) for the log to show: its output is piped
    // to the end, so the test cannot watch for them and gives them this long.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let logs = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() >= 2,
        "expected start-up and retry log lines:\n{logs}"
    );
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}"));
        assert!(
            v.get("level").is_some() && v.get("timestamp").is_some(),
            "{l}"
        );
    }
    assert!(
        logs.contains("database unavailable") && logs.contains("app:***@127.0.0.1:1"),
        "the retry log names the redacted URL:\n{logs}"
    );
    assert!(!logs.contains(PASSWORD), "password logged:\n{logs}");
    assert!(!logs.contains(SECRET), "webhook secret logged:\n{logs}");
}

/// A file of the repository, by path from its root.
fn repo_file(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Skips (returns false) when promtool is missing, unless services are required.
fn have_promtool() -> bool {
    if promtool(&["--version"], "").is_some() {
        return true;
    }
    assert!(
        !services_required(),
        "promtool is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but not on PATH; \
         install the Debian package `prometheus`"
    );
    eprintln!("SKIPPED: promtool not on PATH (Debian package `prometheus`)");
    false
}

/// Every metric the relay exports (the README's Metrics section, plus `ordering_blocked_keys`).
const METRICS: &[&str] = &[
    "deliveries_total",
    "delivery_duration_seconds",
    "end_to_end_seconds",
    "claimed_total",
    "claim_duration_seconds",
    "in_flight",
    "rows",
    "oldest_pending_seconds",
    "ordering_blocked_keys",
    "lease_held",
    "lease_epoch",
    "lease_acquisitions_total",
    "lease_renewals_total",
    "lease_lost_total",
    "sink_paused",
    "build_info",
];

/// The `outbox_relay_*` names `text` mentions that the relay does not export.
fn unknown_metrics(text: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    for (i, _) in text.match_indices("outbox_relay_") {
        let name: String = text[i + "outbox_relay_".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        if !METRICS.contains(&base) && !unknown.contains(&name) {
            unknown.push(name);
        }
    }
    unknown
}

fn run_promtool(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// deploy/prometheus/alerts.yml passes `promtool check rules`, its expressions pass the unit
/// tests in alerts_test.yml, it names only exported metrics, and the PrometheusRule in
/// deploy/kubernetes carries exactly the same groups.
#[test]
fn alert_rules_pass_promtool_and_match_the_prometheusrule() {
    let alerts = repo_file("deploy/prometheus/alerts.yml");
    assert_eq!(unknown_metrics(&alerts), Vec::<String>::new());
    let groups = &alerts[alerts.find("\ngroups:").expect("groups:") + 1..];
    let rule = repo_file("deploy/kubernetes/base/prometheusrule.yaml");
    let spec = &rule[rule.find("\nspec:\n").expect("spec:") + "\nspec:\n".len()..];
    let dedented: String = spec
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    if dedented != groups {
        let (n, (a, b)) = groups
            .lines()
            .chain(std::iter::repeat("<end of file>"))
            .zip(dedented.lines().chain(std::iter::repeat("<end of file>")))
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .expect("a differing line");
        panic!(
            "deploy/kubernetes/base/prometheusrule.yaml's spec must be deploy/prometheus/alerts.yml's \
             groups indented by two spaces; line {} of the groups differs:\n  alerts.yml:     {a}\n  \
             prometheusrule: {b}",
            n + 1
        );
    }
    if !have_promtool() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    run_promtool(root, &["check", "rules", "deploy/prometheus/alerts.yml"]);
    // promtool test rules compares annotations too; test the expressions on a copy without
    // them (their templates were checked just above).
    let mut stripped = String::new();
    let mut skip_deeper_than: Option<usize> = None;
    for line in alerts.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(level) = skip_deeper_than {
            if line.trim().is_empty() || indent > level {
                continue;
            }
            skip_deeper_than = None;
        }
        if line.trim() == "annotations:" {
            skip_deeper_than = Some(indent);
            continue;
        }
        stripped.push_str(line);
        stripped.push('\n');
    }
    assert!(!stripped.contains("description:"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alerts.yml"), stripped).unwrap();
    std::fs::write(
        dir.path().join("alerts_test.yml"),
        repo_file("deploy/prometheus/alerts_test.yml"),
    )
    .unwrap();
    run_promtool(dir.path(), &["check", "rules", "alerts.yml"]);
    run_promtool(dir.path(), &["test", "rules", "alerts_test.yml"]);
}

/// The Grafana dashboard is JSON, names only exported metrics, and every query parses as
/// PromQL (checked by promtool as recording rules, Grafana variables filled in).
#[test]
fn dashboard_is_json_and_its_queries_parse() {
    let text = repo_file("deploy/grafana/outbox-relay.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert_eq!(dash["uid"], "outbox-relay");
    let mut exprs = Vec::new();
    fn collect(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|v| collect(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&dash, &mut exprs);
    assert!(exprs.len() >= 15, "only {} queries", exprs.len());
    assert_eq!(unknown_metrics(&exprs.join("\n")), Vec::<String>::new());
    for m in [
        "delivery_duration_seconds_bucket",
        "end_to_end_seconds_bucket",
    ] {
        assert!(
            exprs
                .iter()
                .any(|e| e.contains(m) && e.contains("histogram_quantile")),
            "no quantile of {m}"
        );
    }
    if !have_promtool() {
        return;
    }
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:q{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    run_promtool(dir.path(), &["check", "rules", "dashboard.yml"]);
}
