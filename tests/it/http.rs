//! The binary's HTTP endpoints and start-up behaviour: `/healthz` answers at once, `/readyz`
//! stays false while the database is unreachable (the relay retries instead of crashing), and
//! `/metrics` carries the metric names the README lists after a delivery.

use std::time::Duration;

use crate::support::process::*;

/// `outbox-relay run` in `dir` with only the variables `envs`; its log is `<dir>/relay.log`.
fn start(dir: &std::path::Path, envs: &[(&str, String)]) -> RelayProc {
    let mut cmd = relay_command(dir);
    cmd.arg("run");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    RelayProc::spawn("relay", &mut cmd, dir.join("relay.log"))
}

/// Polls `url` until its answer satisfies `pred`; panics after 20 s.
async fn wait_for<F: Fn(&(u16, String)) -> bool>(url: &str, pred: F) -> (u16, String) {
    until_some(
        format!("an answer of {url}"),
        Duration::from_secs(20),
        async || fetch(url).await.filter(&pred),
    )
    .await
}

#[tokio::test]
async fn unreachable_database_keeps_readyz_false_without_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut relay = start(
        dir.path(),
        &[
            // Nothing listens on port 1.
            (
                "OUTBOX_RELAY__DATABASE__URL",
                "postgres://postgres@127.0.0.1:1/test".into(),
            ),
            ("OUTBOX_RELAY__DATABASE__CONNECT_TIMEOUT", "500ms".into()),
            ("OUTBOX_RELAY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
        ],
    );
    let (status, _) = wait_for(&format!("{base}/healthz"), |_| true).await;
    assert_eq!(status, 200);
    let (status, body) = fetch(&format!("{base}/readyz")).await.unwrap();
    assert_eq!(status, 503, "{body}");
    // Still running (retrying) after a few connection attempts: 2 s of them (500ms, 1s
    // backoff), which the relay must live through.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(relay.running(), "relay exited");
    let (status, _) = fetch(&format!("{base}/readyz")).await.unwrap();
    assert_eq!(status, 503);
    // SIGTERM while still connecting: a clean exit.
    relay.sigterm();
    let code = relay.wait_exit(Duration::from_secs(10)).await.code();
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn metrics_and_readiness_on_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // Enqueue before the relay starts: the embedded SQLite default is created on demand.
    enqueue_log_row(dir.path(), r#"{"hello":"metrics"}"#);
    let _relay = start(
        dir.path(),
        &[("OUTBOX_RELAY__HTTP__LISTEN", format!("127.0.0.1:{port}"))],
    );
    wait_for(&format!("{base}/readyz"), |(s, _)| *s == 200).await;
    let (_, metrics) = wait_for(&format!("{base}/metrics"), |(_, body)| {
        body.contains(r#"outbox_relay_deliveries_total{sink="log",outcome="delivered"} 1"#)
    })
    .await;
    for name in [
        "outbox_relay_delivery_duration_seconds_bucket",
        "outbox_relay_end_to_end_seconds_bucket",
        "outbox_relay_claimed_total",
        "outbox_relay_claim_duration_seconds",
        "outbox_relay_in_flight",
        "outbox_relay_lease_held 1",
        "outbox_relay_lease_epoch",
        "outbox_relay_lease_acquisitions_total 1",
        r#"outbox_relay_sink_paused{sink="log"} 0"#,
        r#"outbox_relay_build_info{version="#,
    ] {
        assert!(metrics.contains(name), "missing {name} in:\n{metrics}");
    }
    let (status, body) = fetch(&format!("{base}/healthz")).await.unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));
}
