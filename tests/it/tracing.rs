//! Trace propagation and span export (issue 38, part 1; docs/tracing.md): the relay binary
//! against a real database, a loopback webhook receiver and a loopback OTLP/HTTP collector
//! that decodes what it receives (`support::otlp`).
//!
//! What is checked: one span per attempt, a child of the row's `traceparent` (its column, or
//! a payload field), with its trace id; the webhook's `traceparent` names the attempt's span
//! as its parent; attributes name the sink, channel, row, attempt, outcome and HTTP status and
//! never the payload, the recipient or a secret; invalid values start a trace of their own and
//! fail nothing; an unsampled parent exports nothing but still propagates; a mapped table's
//! own trace columns; `check-config` without secrets; and a collector that never answers or
//! refuses connections, which costs deliveries nothing while the drops are counted.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use outbox_relay::sink::TraceContext;
use outbox_relay::store::NewRow;

use crate::support::config::Config;
use crate::support::otlp::{Collector, Span, refusing_url};
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const COLLECTOR_TOKEN: &str = "Bearer collector-token-9f3";
const RECIPIENT: &str = "recipient-7d1e";
/// Writers' contexts: sampled (with a tracestate), unsampled, and one in a payload field.
const SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
const IN_FIELD: &str = "00-11111111111111111111111111111111-2222222222222222-01";
const RETRIED: &str = "00-33333333333333333333333333333333-4444444444444444-01";

/// Tracing on, exporting to `endpoint` (with a collector's token), and `extra` keys.
fn traced(rx: &Receiver, endpoint: &str, extra: &str) -> Config {
    Config::webhook(&rx.url())
        .shutdown_timeout(Duration::from_secs(10))
        .retry(Duration::from_secs(1), Duration::from_secs(2), 3)
        .hook(|s| s.secret(SECRET))
        .sections(&format!(
            "[tracing]\nendpoint = \"{endpoint}\"\n\
             headers = {{ authorization = \"{COLLECTOR_TOKEN}\" }}\n{extra}"
        ))
}

/// Enqueues a `hook` row with `payload`, and the writer's context when given.
async fn row(td: &TestDb, payload: &str, traceparent: Option<(&str, Option<&str>)>) -> i64 {
    let r = NewRow {
        channel: "hook".into(),
        recipient: Some(RECIPIENT.into()),
        payload: payload.into(),
        ordering_key: None,
    };
    match traceparent {
        Some((tp, ts)) => {
            let cx = TraceContext::parse(tp, ts).expect("a valid context");
            bounded("enqueue", td.store.enqueue_traced(&r, &cx)).await
        }
        None => bounded("enqueue", td.store.enqueue(&r)).await,
    }
}

/// The spans of row `id`, by attempt.
fn spans_of(spans: &[Span], id: i64) -> Vec<Span> {
    let mut out: Vec<Span> = spans
        .iter()
        .filter(|s| s.attr("outbox.row_id") == Some(&id.to_string()))
        .cloned()
        .collect();
    out.sort_by_key(|s| s.attr("outbox.attempt").map(str::to_string));
    out
}

/// `traceparent` → (trace id, parent id, flags).
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    (p[1].into(), p[2].into(), p[3].into())
}

async fn spans_are_children_of_the_rows_context(db: Db) {
    let Some(td) = TestDb::open(db, "tr_ctx").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let otlp = Collector::start().await;
    let sampled = row(&td, r#"{"n":1}"#, Some((SAMPLED, Some("vendor=abc")))).await;
    let root = row(&td, r#"{"n":2}"#, None).await;
    let invalid = row(&td, r#"{"n":3}"#, None).await;
    td.exec(&format!(
        "UPDATE {{t}} SET traceparent = 'NOT-A-TRACEPARENT', tracestate = 'x' WHERE id = {invalid}"
    ))
    .await;
    let field = row(&td, &format!(r#"{{"n":4,"trace":"{IN_FIELD}"}}"#), None).await;
    let unsampled = row(&td, r#"{"n":5}"#, Some((UNSAMPLED, None))).await;
    let retried = row(&td, r#"{"n":6}"#, Some((RETRIED, None))).await;
    rx.script(retried, vec![Reply::status(500)]);

    let config = traced(&rx, &otlp.endpoint(), "traceparent_field = \"trace\"\n");
    let relay = RelayProc::start(&td, &config, "one");
    td.wait_all_success(Duration::from_secs(30)).await;
    assert!(
        otlp.wait_for(Duration::from_secs(10), |s| s.len() >= 6)
            .await,
        "six spans exported: {:?}",
        otlp.spans()
    );
    let spans = otlp.spans();
    assert_eq!(otlp.authorization().as_deref(), Some(COLLECTOR_TOKEN));

    // A child of the row's context, and the webhook's parent.
    let child_of = |id: i64, tp: &str| {
        let s = spans_of(&spans, id);
        assert_eq!(s.len(), 1, "one span for row {id}: {s:?}");
        let (trace, parent, _) = parts(tp);
        assert_eq!((&s[0].trace_id, &s[0].parent_span_id), (&trace, &parent));
        s[0].clone()
    };
    let header = |id: i64, name: &str| -> Vec<String> {
        rx.requests_for(id)
            .iter()
            .map(|r| r.header(name).unwrap_or_default().to_string())
            .collect()
    };
    let s = child_of(sampled, SAMPLED);
    assert_eq!(
        header(sampled, "traceparent"),
        [format!("00-{}-{}-01", s.trace_id, s.span_id)]
    );
    assert_eq!(header(sampled, "tracestate"), ["vendor=abc"]);
    let s = child_of(field, IN_FIELD);
    assert_eq!(
        header(field, "traceparent"),
        [format!("00-{}-{}-01", s.trace_id, s.span_id)]
    );
    // No context, or an invalid one: a root of its own, delivered all the same.
    for id in [root, invalid] {
        let s = spans_of(&spans, id);
        assert_eq!(s.len(), 1, "row {id}: {s:?}");
        assert_eq!(s[0].parent_span_id, "", "row {id} is a root");
        assert_eq!(
            header(id, "traceparent"),
            [format!("00-{}-{}-01", s[0].trace_id, s[0].span_id)]
        );
        assert_eq!(header(id, "tracestate"), [""]);
    }
    // An unsampled parent: nothing recorded, its trace still propagated, unsampled, with a
    // span id of the attempt's own.
    assert!(spans_of(&spans, unsampled).is_empty());
    let (trace, parent, flags) = parts(&header(unsampled, "traceparent")[0]);
    let (u_trace, u_parent, _) = parts(UNSAMPLED);
    assert_eq!((trace, flags.as_str()), (u_trace, "00"));
    assert_ne!(parent, u_parent);
    a_span_per_attempt(&spans_of(&spans, retried), &header(retried, "traceparent"));
    nothing_but_what_is_allowed(&spans);
    // The relay counts a batch once the collector's answer is read, after it was received.
    until(
        "six spans counted as exported",
        Duration::from_secs(10),
        || async { relay.metric("outbox_relay_spans_exported_total").await >= 6.0 },
    )
    .await;
    assert_eq!(relay.metric("outbox_relay_spans_dropped_total").await, 0.0);
}

per_db!(spans_are_children_of_the_rows_context);

/// A retried row's spans `r` (one per attempt, both children of the row's context) and the
/// `traceparent` each of its requests carried (`sent`).
fn a_span_per_attempt(r: &[Span], sent: &[String]) {
    let (trace, parent, _) = parts(RETRIED);
    let seen: Vec<_> = r
        .iter()
        .map(|s| {
            assert_eq!((&s.trace_id, &s.parent_span_id), (&trace, &parent));
            (
                s.attr("outbox.attempt").unwrap_or_default(),
                s.attr("outbox.outcome").unwrap_or_default(),
                s.attr("http.response.status_code").unwrap_or_default(),
                s.status,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("1", "retry", "500", 2), ("2", "delivered", "200", 0)]
    );
    let own: Vec<String> = r
        .iter()
        .map(|s| format!("00-{}-{}-01", s.trace_id, s.span_id))
        .collect();
    assert_eq!(sent, own, "each attempt carries its own span");
}

/// What every span says, and what none ever does (the payload, the recipient, a secret).
fn nothing_but_what_is_allowed(spans: &[Span]) {
    let allowed: BTreeSet<&str> = [
        "outbox.sink",
        "outbox.channel",
        "outbox.row_id",
        "outbox.attempt",
        "outbox.outcome",
        "http.response.status_code",
        "outbox.vendor_code",
    ]
    .into();
    for s in spans {
        assert_eq!((s.name.as_str(), s.kind), ("deliver hook", 3), "{s:?}");
        assert_eq!(s.service, "outbox-relay");
        assert_eq!(
            (s.attr("outbox.sink"), s.attr("outbox.channel")),
            (Some("hook"), Some("hook"))
        );
        for (k, v) in &s.attributes {
            assert!(allowed.contains(k.as_str()), "unexpected attribute {k}");
            for secret in [RECIPIENT, SECRET, COLLECTOR_TOKEN, "\"n\"", "trace\""] {
                assert!(!v.contains(secret), "{k}={v} holds {secret}");
            }
        }
    }
}

/// A table of the application's with trace columns of its own names, mapped.
async fn a_mapped_tables_trace_columns(db: Db) {
    let Some(td) = TestDb::open(db, "tr_map").await else {
        return;
    };
    td.drop_table().await;
    let id = match db {
        Db::Postgres => "id BIGSERIAL PRIMARY KEY",
        Db::MySql => "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        Db::Sqlite => "id INTEGER PRIMARY KEY AUTOINCREMENT",
    };
    td.exec(&format!(
        "CREATE TABLE {{t}} ({id}, body TEXT NOT NULL, state VARCHAR(16) NOT NULL, \
         w3c_parent VARCHAR(55) NULL, w3c_state VARCHAR(512) NULL)"
    ))
    .await;
    td.exec(&format!(
        "INSERT INTO {{t}} (body, state, w3c_parent, w3c_state) VALUES \
         ('{{}}', 'NEW', '{SAMPLED}', 'app=1'), ('{{}}', 'NEW', NULL, NULL)"
    ))
    .await;
    let rx = Receiver::start(Some(SECRET)).await;
    let otlp = Collector::start().await;
    let config = traced(&rx, &otlp.endpoint(), "").sections(
        "[table]\nchannel_value = \"hook\"\n\
         [table.columns]\nid = \"id\"\npayload = \"body\"\nstatus = \"state\"\n\
         traceparent = \"w3c_parent\"\ntracestate = \"w3c_state\"\n\
         [table.status]\npending = \"NEW\"\nsuccess = \"SENT\"\nfailed = \"DEAD\"\n",
    );
    let path = config.write(td.dir.path(), "map.toml");
    let out = run_to_end(
        "migrate --adopt",
        relay_with_config(&td, &path).args(["migrate", "--adopt"]),
        Duration::from_secs(60),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let check = run_to_end(
        "check-config",
        relay_with_config(&td, &path).arg("check-config"),
        Duration::from_secs(60),
    )
    .await;
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(
        text.contains("traceparent=") && text.contains("w3c_parent"),
        "{text}"
    );
    assert!(text.contains("headers=[authorization]") && !text.contains("collector-token"));
    let _relay = RelayProc::start_instance(
        &td,
        &path,
        "map",
        [("OUTBOX_RELAY__LEASE__NAME", td.table.clone())],
    );
    assert!(
        otlp.wait_for(Duration::from_secs(30), |s| s.len() >= 2)
            .await,
        "two spans: {:?}",
        otlp.spans()
    );
    let spans = otlp.spans();
    let (trace, parent, _) = parts(SAMPLED);
    let s1 = spans_of(&spans, 1);
    assert_eq!((&s1[0].trace_id, &s1[0].parent_span_id), (&trace, &parent));
    assert_eq!(spans_of(&spans, 2)[0].parent_span_id, "");
    let r1 = rx.requests_for(1);
    assert_eq!(r1[0].header("tracestate"), Some("app=1"));
    assert_eq!(
        r1[0].header("traceparent").map(str::to_string),
        Some(format!("00-{trace}-{}-01", s1[0].span_id))
    );
}

per_db!(a_mapped_tables_trace_columns);

/// Drains `n` rows with `config` and returns how long it took.
async fn drain(td: &TestDb, config: &Config, n: usize) -> (Duration, RelayProc) {
    td.insert_hooks(n).await;
    let t0 = Instant::now();
    let relay = RelayProc::start(td, config, "drain");
    td.wait_all_success(Duration::from_secs(60)).await;
    (t0.elapsed(), relay)
}

/// A collector that never answers, then one that refuses connections: deliveries go on as
/// fast as without tracing, and the spans that cannot go are dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_stuck_or_down_costs_deliveries_nothing() {
    const N: usize = 2000;
    let Some(plain) = TestDb::open(Db::Sqlite, "tr_plain").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let base = Config::webhook(&rx.url()).hook(|s| s.secret(SECRET));
    let (untraced, _r) = drain(&plain, &base, N).await;

    let otlp = Collector::start().await;
    otlp.hang();
    let stuck = TestDb::open(Db::Sqlite, "tr_stuck").await.expect("sqlite");
    let small = "queue_size = 16\nbatch_size = 8\nexport_timeout = \"60s\"\n";
    let config = traced(&rx, &otlp.endpoint(), small).shutdown_timeout(Duration::from_secs(4));
    let (hung, mut relay) = drain(&stuck, &config, N).await;
    let dropped = relay
        .metric_labelled("outbox_relay_spans_dropped_total", "queue_full")
        .await;
    assert!(dropped >= (N - 16 - 8) as f64, "dropped {dropped}");
    assert!(otlp.requests() >= 1, "the stuck collector was asked");
    // Not slower than without tracing beyond this machine's noise.
    assert!(
        hung <= untraced * 3 + Duration::from_secs(2),
        "{N} rows in {hung:?} with a stuck collector, {untraced:?} without tracing"
    );
    // Shutdown does not wait for the stuck export beyond its share of shutdown_timeout.
    relay.sigterm();
    let status = relay.wait_exit(Duration::from_secs(8)).await;
    assert!(status.success(), "{status:?}");

    let down = TestDb::open(Db::Sqlite, "tr_down").await.expect("sqlite");
    let config = traced(&rx, &refusing_url(), "");
    let (refused, relay) = drain(&down, &config, N).await;
    let failed = until_metric(&relay, "export_failed").await;
    assert!(failed >= 1.0, "export failures counted");
    assert!(
        refused <= untraced * 3 + Duration::from_secs(2),
        "{N} rows in {refused:?} with the collector down, {untraced:?} without tracing"
    );
}

/// Waits (bounded) until spans dropped for `reason` are counted; returns the count.
async fn until_metric(relay: &RelayProc, reason: &str) -> f64 {
    let read = async || {
        relay
            .metric_labelled("outbox_relay_spans_dropped_total", reason)
            .await
    };
    // At the deadline the count as it is: the caller's assertion says what is missing.
    match poll_every(POLL, Duration::from_secs(10), async || {
        Some(read().await).filter(|n| *n > 0.0)
    })
    .await
    {
        Some(n) => n,
        None => read().await,
    }
}
