//! Memory stays bounded under hostile input (issue 9): a receiver answering every request with
//! a 500 and a 300 MiB body (with a Content-Length, and chunked without end), and a table
//! holding a 40 MB payload. The relay's peak resident memory (`VmHWM` of the real process) must
//! stay far below the Kubernetes sidecar limit of 128 Mi, and every row must end with a reason.

use std::time::Duration;

use crate::support::process::*;
use crate::support::*;
use sqlx::Row;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Peak resident memory of process `pid`, in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// A receiver that answers every request with a 500 and a huge body: 300 MiB announced by
/// Content-Length, or (`chunked`) chunks without end. It streams from one small buffer, so
/// the test itself never holds the body.
async fn hostile_receiver(chunked: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                // Read the request head and (small) body.
                let _ = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
                let head = if chunked {
                    "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n"
                        .to_string()
                } else {
                    format!(
                        "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n",
                        300u64 << 20
                    )
                };
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = "overloaded ".repeat(64 * 1024 / 11);
                let chunk = if chunked {
                    format!("{:x}\r\n{piece}\r\n", piece.len())
                } else {
                    piece
                };
                let mut sent = 0u64;
                while sent < (300u64 << 20) || chunked {
                    if s.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    sent += chunk.len() as u64;
                }
            });
        }
    });
    format!("http://{addr}/hook")
}

async fn hostile_bodies_and_payloads_keep_memory_bounded(db: Db, chunked: bool) {
    let Some(td) = TestDb::open(db, "mem").await else {
        return;
    };
    let url = hostile_receiver(chunked).await;
    for i in 0..64 {
        td.exec(&format!(
            r#"INSERT INTO {{t}} (channel, payload) VALUES ('hook', '{{"n":{i}}}')"#
        ))
        .await;
    }
    // A huge row: over max_body_bytes, so the claim must not load it. On SQLite the
    // database runs inside the relay and rewrites a row whole when it changes (about twice
    // the row's size while it is finished), so the row there is smaller.
    let pad = if db == Db::Sqlite {
        4_000_000
    } else {
        40_000_000
    };
    let cast = if db == Db::Postgres { "::jsonb" } else { "" };
    td.exec(&format!(
        r#"INSERT INTO {{t}} (channel, payload) VALUES ('hook', '{{"pad":"{}"}}'{cast})"#,
        "x".repeat(pad)
    ))
    .await;
    let big = td.scalar("SELECT MAX(id) FROM {t}").await;
    let cfg = write_config(
        td.dir.path(),
        "relay.toml",
        &format!(
            r#"
[relay]
poll_interval = "50ms"

[retry]
max_attempts = 1

[sinks.hook]
kind = "webhook"
url = "{url}"
timeout = "3s"
"#
        ),
    );
    let relay = RelayProc::start_instance(
        &td,
        &cfg,
        "one",
        [("OUTBOX_RELAY__LEASE__NAME", td.table.as_str())],
    );
    let tdr = &td;
    until("every row FAILED", Duration::from_secs(60), || async move {
        tdr.counts().await[3] == 65
    })
    .await;
    let peak_mib = vm_hwm_kib(relay.pid()) / 1024;
    println!("peak RSS (VmHWM) with hostile bodies (chunked: {chunked}): {peak_mib} MiB");
    assert!(
        peak_mib < 64,
        "peak resident memory {peak_mib} MiB; it must stay bounded"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, last_error FROM {}",
        td.table
    )))
    .fetch_all(td.store.pool())
    .await
    .expect("rows");
    for r in rows {
        let id: i64 = r.try_get(0).expect("id");
        let err: String = r.try_get(1).expect("last_error");
        if id == big {
            assert!(err.contains("max_body_bytes"), "{err}");
        } else {
            assert!(
                err.contains("500") && err.contains("overloaded"),
                "row {id}: {err}"
            );
            assert!(err.len() < 1100, "reason too long: {} bytes", err.len());
        }
    }
    td.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_and_payloads_keep_memory_bounded_postgres() {
    hostile_bodies_and_payloads_keep_memory_bounded(Db::Postgres, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_and_payloads_keep_memory_bounded_sqlite() {
    hostile_bodies_and_payloads_keep_memory_bounded(Db::Sqlite, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_chunked_bodies_keep_memory_bounded_postgres() {
    hostile_bodies_and_payloads_keep_memory_bounded(Db::Postgres, true).await
}
