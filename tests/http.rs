//! The binary's HTTP endpoints and start-up behaviour: `/healthz` answers at once, `/readyz`
//! stays false while the database is unreachable (the relay retries instead of crashing), and
//! `/metrics` carries the SPEC names after a delivery.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Kills the child when the test ends, however it ends.
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(dir: &std::path::Path, envs: &[(&str, String)]) -> Relay {
    let mut cmd = Command::new(relay_bin());
    cmd.arg("run")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Relay(cmd.spawn().expect("spawn relay"))
}

async fn get(url: &str) -> Option<(u16, String)> {
    outbox_relay::install_crypto_provider();
    let resp = reqwest::get(url).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

async fn wait_for<F: Fn(&(u16, String)) -> bool>(url: &str, pred: F) -> (u16, String) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = get(url).await
            && pred(&r)
        {
            return r;
        }
        assert!(Instant::now() < until, "timed out waiting on {url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let (status, body) = get(&format!("{base}/readyz")).await.unwrap();
    assert_eq!(status, 503, "{body}");
    // Still running (retrying) after a few connection attempts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(relay.0.try_wait().unwrap().is_none(), "relay exited");
    let (status, _) = get(&format!("{base}/readyz")).await.unwrap();
    assert_eq!(status, 503);
    // SIGTERM while still connecting: a clean exit.
    Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = relay.0.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < until, "relay did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn metrics_and_readiness_on_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // Enqueue before the relay starts: the embedded SQLite default is created on demand.
    let out = Command::new(relay_bin())
        .args([
            "enqueue",
            "--channel",
            "log",
            "--payload",
            r#"{"hello":"metrics"}"#,
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let (status, body) = get(&format!("{base}/healthz")).await.unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));
}
