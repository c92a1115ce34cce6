//! The `nats` sink against Debian's `nats-server` with JetStream, started by each test on a
//! free port (`support::nats`). Most tests build the sink from TOML through the public
//! configuration API and look at what the stream holds; the relay binary runs where the
//! relay's side matters: the pause of a sink with no stream, a full stream, and kill -9 of the
//! relay between publishing and writing the results.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use outbox_relay::sink::{Outcome, SinkHandle};

use crate::support::nats::NatsServer;
use crate::support::process::{RelayProc, relay_command, run_to_end, until, write_config};
use crate::support::vendors::{Outbox, delivery, sink_from_toml};
use crate::support::{Db, TestDb, payload};

/// A configuration with one nats sink `events` at `nats`, with `keys` (TOML lines) of its own.
fn config(nats: &str, keys: &str) -> String {
    format!(
        "[relay]\npoll_interval = \"50ms\"\n\n[log]\nlevel = \"info\"\n\n\
         [sinks.events]\nkind = \"nats\"\nurl = \"{nats}\"\ntimeout = \"2s\"\n{keys}\n"
    )
}

/// `outbox-relay run` as `name` on the SQLite `outbox` with `config`; its log is
/// `<dir>/<name>.log`.
fn start_relay(outbox: &Outbox, config: &Path, name: &str) -> RelayProc {
    let mut cmd = relay_command(outbox.dir.path());
    cmd.env("RUST_LOG", "info,outbox_relay=debug")
        .env("OUTBOX_RELAY__DATABASE__URL", &outbox.url)
        .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
        .env("OUTBOX_RELAY__RELAY__INSTANCE_ID", name)
        .arg("--config")
        .arg(config)
        .arg("run");
    RelayProc::spawn(
        name,
        &mut cmd,
        outbox.dir.path().join(format!("{name}.log")),
    )
}

/// `outbox-relay check-config` on `outbox` with `config`: (exit code, stdout, stderr).
async fn check_config(outbox: &Outbox, config: &Path) -> (i32, String, String) {
    let mut cmd = relay_command(outbox.dir.path());
    cmd.env("OUTBOX_RELAY__DATABASE__URL", &outbox.url)
        .arg("--config")
        .arg(config)
        .arg("check-config");
    let out = run_to_end("check-config", &mut cmd, Duration::from_secs(30)).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A server with stream ORDERS on `orders.>` and a sink `events` publishing to
/// `orders.created`, expecting ORDERS.
async fn orders() -> Option<(NatsServer, Arc<SinkHandle>)> {
    let nats = NatsServer::start().await?;
    nats.create_stream("ORDERS", &["orders.>"], None).await;
    let sink = sink_from_toml(
        &config(
            &nats.url(),
            "subject = \"orders.created\"\nstream = \"ORDERS\"",
        ),
        "events",
    );
    Some((nats, sink))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_published_with_their_subject_body_and_msg_id_once() {
    let Some((nats, sink)) = orders().await else {
        return;
    };
    for id in 1..=3 {
        let o = sink
            .sink
            .deliver(&delivery(id, None, &payload(id as usize), 0))
            .await;
        assert_eq!(o, Outcome::Delivered, "row {id}");
    }
    let stored = nats.messages("ORDERS").await;
    assert_eq!(stored.len(), 3, "{stored:?}");
    for (i, m) in stored.iter().enumerate() {
        let id = i + 1;
        assert_eq!(m.subject, "orders.created");
        assert_eq!(
            m.payload,
            payload(id),
            "the body is the payload, byte for byte"
        );
        assert_eq!(
            m.msg_id.as_deref(),
            Some(format!("outbox-outbox-{id}").as_str())
        );
    }
    // A second send of row 2 (a retry, a re-send after a crash) is acknowledged as a
    // duplicate: delivered, and the stream still holds it once.
    let again = sink.sink.deliver(&delivery(2, None, &payload(2), 1)).await;
    assert_eq!(again, Outcome::Delivered);
    assert_eq!(nats.count("ORDERS").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_field_routes_each_row_under_the_prefix() {
    let Some(nats) = NatsServer::start().await else {
        return;
    };
    nats.create_stream("EVENTS", &["events.>"], None).await;
    let sink = sink_from_toml(
        &config(
            &nats.url(),
            "subject_field = \"type\"\nsubject_prefix = \"events.\"\nmsg_id_prefix = \"svc-a-\"",
        ),
        "events",
    );
    let shipped = r#"{"type":"order.shipped","id":7}"#;
    let user = r#"{"type":"user","id":8}"#;
    assert_eq!(
        sink.sink.deliver(&delivery(1, None, shipped, 0)).await,
        Outcome::Delivered
    );
    assert_eq!(
        sink.sink.deliver(&delivery(2, None, user, 0)).await,
        Outcome::Delivered
    );
    // Rows that would publish outside the prefix, or name no subject, fail alone.
    for (id, bad, why) in [
        (3, r#"{"type":"order.*"}"#, "tokens"),
        (4, r#"{"type":"$JS.API.STREAM.DELETE.EVENTS"}"#, "tokens"),
        (5, r#"{"kind":"user"}"#, "no field \"type\""),
        (6, r#"{"type":["a"]}"#, "not a string"),
    ] {
        let o = sink.sink.deliver(&delivery(id, None, bad, 0)).await;
        assert!(
            matches!(&o, Outcome::Permanent { reason } if reason.contains(why)),
            "{bad}: {o:?}"
        );
    }
    let stored = nats.messages("EVENTS").await;
    let got: Vec<(&str, &str, Option<&str>)> = stored
        .iter()
        .map(|m| (m.subject.as_str(), m.payload.as_str(), m.msg_id.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("events.order.shipped", shipped, Some("svc-a-1")),
            ("events.user", user, Some("svc-a-2")),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_or_another_stream_is_a_configuration_error_and_a_big_row_fails() {
    let Some(nats) = NatsServer::start().await else {
        return;
    };
    nats.create_stream("OTHER", &["orders.>"], None).await;
    // The subject is captured, but by another stream than the one configured.
    let wrong = sink_from_toml(
        &config(
            &nats.url(),
            "subject = \"orders.created\"\nstream = \"ORDERS\"",
        ),
        "events",
    );
    let o = wrong.sink.deliver(&delivery(1, None, "{}", 0)).await;
    assert!(
        matches!(&o, Outcome::ConfigError { reason } if reason.contains("sinks.events.stream") && reason.contains("10060")),
        "{o:?}"
    );
    // No stream captures the subject at all.
    let nowhere = sink_from_toml(&config(&nats.url(), "subject = \"nowhere.x\""), "events");
    let o = nowhere.sink.deliver(&delivery(1, None, "{}", 0)).await;
    assert!(
        matches!(&o, Outcome::ConfigError { reason } if reason.contains("no JetStream stream captures subject nowhere.x")),
        "{o:?}"
    );
    assert_eq!(nats.count("OTHER").await, 0, "nothing was stored anywhere");
    // Larger than the server's max_payload (1 MiB by default): that row fails, unsent.
    let big = sink_from_toml(
        &config(
            &nats.url(),
            "subject = \"orders.created\"\nmax_payload_bytes = 4000000",
        ),
        "events",
    );
    let huge = format!(r#"{{"pad":"{}"}}"#, "x".repeat(2_000_000));
    let o = big.sink.deliver(&delivery(2, None, &huge, 0)).await;
    assert!(matches!(o, Outcome::Permanent { .. }), "{o:?}");
    assert_eq!(nats.count("OTHER").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_outage_is_retried_and_the_row_goes_after_the_restart() {
    let Some((mut nats, sink)) = orders().await else {
        return;
    };
    let send = |id: i64| {
        let sink = sink.clone();
        async move { sink.sink.deliver(&delivery(id, None, "{}", 0)).await }
    };
    assert_eq!(send(1).await, Outcome::Delivered);
    nats.kill();
    let o = send(2).await;
    assert!(matches!(o, Outcome::Retry { after: None, .. }), "{o:?}");
    // The same store: the stream and row 1 are still there once JetStream has recovered them
    // (until then "no responders" after the reconnect is a retry, not a missing stream).
    nats.restart().await;
    until(
        "row 2 delivered after the restart",
        Duration::from_secs(30),
        || async {
            match send(2).await {
                Outcome::Delivered => true,
                Outcome::Retry { .. } => false,
                other => panic!("during the reconnect: {other:?}"),
            }
        },
    )
    .await;
    let ids: Vec<Option<String>> = nats
        .messages("ORDERS")
        .await
        .into_iter()
        .map(|m| m.msg_id)
        .collect();
    assert_eq!(
        ids,
        [
            Some("outbox-outbox-1".into()),
            Some("outbox-outbox-2".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_and_credentials_the_server_refuses_are_configuration_errors() {
    let Some(nats) = NatsServer::start_with_users(
        r#"{ user: relay, password: "relay-pw-4f1c", permissions: { publish: ["orders.>"], subscribe: ["_INBOX.>"] } }"#,
    )
    .await
    else {
        return;
    };
    nats.create_stream("ORDERS", &["orders.>"], None).await;
    nats.create_stream("SECRET", &["secret.>"], None).await;
    let creds = "user = \"relay\"\npassword = \"relay-pw-4f1c\"\n";
    let allowed = sink_from_toml(
        &config(
            &nats.url(),
            &format!("subject = \"orders.created\"\n{creds}"),
        ),
        "events",
    );
    assert_eq!(
        allowed.sink.deliver(&delivery(1, None, "{}", 0)).await,
        Outcome::Delivered
    );
    // The server drops a publish the user may not make and says so on the connection only.
    let denied = sink_from_toml(
        &config(&nats.url(), &format!("subject = \"secret.x\"\n{creds}")),
        "events",
    );
    let o = denied.sink.deliver(&delivery(1, None, "{}", 0)).await;
    assert!(
        matches!(&o, Outcome::ConfigError { reason } if reason.contains("Permissions Violation") && reason.contains("secret.x")),
        "{o:?}"
    );
    assert_eq!(nats.count("SECRET").await, 0);
    // Wrong credentials: a configuration error that does not quote them.
    let refused = sink_from_toml(
        &config(
            &nats.url(),
            "subject = \"orders.created\"\nuser = \"relay\"\npassword = \"wrong-pw-93ab\"",
        ),
        "events",
    );
    let o = refused.sink.deliver(&delivery(2, None, "{}", 0)).await;
    assert!(
        matches!(&o, Outcome::ConfigError { reason } if reason.contains("credentials")),
        "{o:?}"
    );
    assert!(!o.reason().contains("wrong-pw-93ab"), "{o:?}");
    assert_eq!(nats.count("ORDERS").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_shows_the_sink_and_says_when_nats_cannot_be_reached() {
    let outbox = Outbox::create().await;
    // Nothing listens there.
    let port = crate::support::process::free_port();
    let path = outbox.write(
        "relay.toml",
        &config(
            &format!("nats://127.0.0.1:{port}"),
            "subject = \"orders.created\"\nstream = \"ORDERS\"\npassword = \"pw-77\"\nuser = \"u\"",
        ),
    );
    let (code, out, err) = check_config(&outbox, &path).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("sink events: kind=nats timeout=2s"), "{out}");
    assert!(
        out.contains("sinks.events.stream not checked: could not reach NATS"),
        "{out}"
    );
    assert!(
        !out.contains("pw-77") && !err.contains("pw-77"),
        "{out}\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_pauses_the_sink_until_it_exists() {
    let Some(nats) = NatsServer::start().await else {
        return;
    };
    let outbox = Outbox::create().await;
    let a = outbox.enqueue("events", "r", r#"{"n":1}"#).await;
    let b = outbox.enqueue("events", "r", r#"{"n":2}"#).await;
    let token = "nats-console-token-0123456789";
    let path = outbox.write(
        "relay.toml",
        &format!(
            "{}\n[console]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n",
            config(
                &nats.url(),
                "subject = \"orders.created\"\nstream = \"ORDERS\""
            )
        ),
    );
    // check-config refuses the configuration, naming the key.
    let (code, out, err) = check_config(&outbox, &path).await;
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("sinks.events.stream") && err.contains("ORDERS"),
        "{err}"
    );

    let relay = start_relay(&outbox, &path, "relay-a");
    until(
        "the sink paused by its configuration error",
        Duration::from_secs(30),
        || async {
            relay
                .metric_labelled("outbox_relay_sink_paused", "sink=\"events\"")
                .await
                == 1.0
        },
    )
    .await;
    // The rows sent are given back with the error; a row that found the sink already paused
    // (its send began after another's answer paused it) is given back unsent, without one
    // (docs/sinks.md). Both stay pending, no attempt counted.
    until(
        "a row given back with the configuration error",
        Duration::from_secs(30),
        || async { outbox.row(a).await.2.is_some() || outbox.row(b).await.2.is_some() },
    )
    .await;
    for id in [a, b] {
        let (status, attempts, error) = outbox.row(id).await;
        assert_eq!((status.as_str(), attempts), ("PENDING", 0), "{error:?}");
        if let Some(error) = error {
            assert!(
                error.contains("sink configuration error")
                    && error.contains("no JetStream stream captures subject orders.created"),
                "{error}"
            );
        }
    }
    let log = relay.log_text();
    assert!(
        log.contains("sinks.events.stream: stream ORDERS does not exist"),
        "the start-up check names the key:\n{log}"
    );
    // The console shows the sink paused, with the reason.
    let console = format!("http://{}", relay.console_addr().await);
    let page = crate::support::console::ConsoleClient::new(&console)
        .send(
            "GET",
            "/",
            None,
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("paused") && page.body.contains("no JetStream stream captures"),
        "{}",
        page.body
    );

    nats.create_stream("ORDERS", &["orders.>"], None).await;
    let (code, out, err) = check_config(&outbox, &path).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("sink events: stream ORDERS exists"), "{out}");
    // The pause (60 s) runs out, and the rows go.
    until("both rows delivered", Duration::from_secs(120), || async {
        outbox.row(a).await.0 == "SUCCESS" && outbox.row(b).await.0 == "SUCCESS"
    })
    .await;
    let stored = nats.messages("ORDERS").await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(
        relay
            .metric_labelled("outbox_relay_sink_paused", "sink=\"events\"")
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_throttles_and_the_rows_go_once_space_frees() {
    let Some(nats) = NatsServer::start().await else {
        return;
    };
    nats.create_stream("ORDERS", &["orders.>"], Some(3)).await;
    let outbox = Outbox::create().await;
    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(
            outbox
                .enqueue("events", "r", &format!(r#"{{"n":{n}}}"#))
                .await,
        );
    }
    let path = outbox.write(
        "relay.toml",
        &config(&nats.url(), "subject = \"orders.created\"\nconcurrency = 1"),
    );
    let relay = start_relay(&outbox, &path, "relay-a");
    // Three fit; the other two are given back without a counted attempt (the one that met
    // the full stream says so; one that found the sink paused was not even tried).
    until(
        "three rows delivered, two given back",
        Duration::from_secs(30),
        || async {
            let (mut success, mut back, mut full) = (0, 0, 0);
            for id in &ids {
                let (status, attempts, error) = outbox.row(*id).await;
                match (status.as_str(), attempts) {
                    ("SUCCESS", _) => success += 1,
                    ("PENDING", 0) => back += 1,
                    _ => {}
                }
                full += usize::from(error.is_some_and(|e| e.contains("is full (discard new)")));
            }
            success == 3 && back == 2 && full >= 1
        },
    )
    .await;
    assert!(
        relay
            .metric_labelled("outbox_relay_deliveries_total", "outcome=\"throttle\"")
            .await
            >= 1.0
    );
    assert_eq!(nats.count("ORDERS").await, 3);
    let waiting: Vec<i64> = {
        let mut w = Vec::new();
        for id in &ids {
            if outbox.row(*id).await.0 != "SUCCESS" {
                w.push(*id);
            }
        }
        w
    };
    // Consumers catch up: space frees, and the throttled rows go without a counted attempt.
    nats.purge("ORDERS").await;
    until("every row delivered", Duration::from_secs(60), || async {
        let mut all = true;
        for id in &ids {
            all &= outbox.row(*id).await.0 == "SUCCESS";
        }
        all
    })
    .await;
    let mut stored: Vec<String> = nats
        .messages("ORDERS")
        .await
        .into_iter()
        .filter_map(|m| m.msg_id)
        .collect();
    stored.sort();
    let mut want: Vec<String> = waiting
        .iter()
        .map(|id| format!("outbox-outbox-{id}"))
        .collect();
    want.sort();
    assert_eq!(stored, want);
    for id in &waiting {
        assert_eq!(
            outbox.row(*id).await.1,
            1,
            "one counted attempt: the delivery"
        );
    }
}

/// kill -9 of the relay after JetStream stored a batch and before the results were written:
/// a second relay sends the rows again, JetStream drops them as duplicates of their
/// `Nats-Msg-Id`, and the stream holds each row once. The window is held open by a trigger
/// that keeps the delivered rows' result write waiting (PostgreSQL: it can wait in a trigger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_publish_and_result_write_leaves_each_row_once_in_the_stream() {
    let Some(nats) = NatsServer::start().await else {
        return;
    };
    let Some(td) = TestDb::open(Db::Postgres, "nats_crash").await else {
        return;
    };
    nats.create_stream("ORDERS", &["orders.>"], None).await;
    td.exec("CREATE TABLE {t}_hold (state text NOT NULL)").await;
    td.exec("INSERT INTO {t}_hold VALUES ('wait')").await;
    td.exec(
        "CREATE FUNCTION {t}_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.status = 'SUCCESS' THEN \
             WHILE EXISTS (SELECT 1 FROM {t}_hold WHERE state = 'wait') LOOP \
               PERFORM pg_sleep(0.02); \
             END LOOP; \
             IF EXISTS (SELECT 1 FROM {t}_hold WHERE state = 'abort') THEN \
               RAISE EXCEPTION 'result write aborted by the test'; \
             END IF; \
           END IF; \
           RETURN NEW; \
         END $$",
    )
    .await;
    td.exec(
        "CREATE TRIGGER {t}_hold BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_hold()",
    )
    .await;
    const ROWS: usize = 40;
    td.insert("events", (1..=ROWS).map(|i| (None, payload(i))))
        .await;
    let cfg = |dir: &Path, name: &str| {
        write_config(
            dir,
            name,
            &format!(
                "[relay]\npoll_interval = \"50ms\"\nclaim_ttl = \"7s\"\n\n\
                 [lease]\nttl = \"2s\"\nrenew_timeout = \"500ms\"\n\n[log]\nlevel = \"info\"\n\n\
                 [sinks.events]\nkind = \"nats\"\nurl = \"{}\"\ntimeout = \"2s\"\n\
                 subject = \"orders.created\"\nstream = \"ORDERS\"\n",
                nats.url()
            ),
        )
    };
    let path = cfg(td.dir.path(), "relay.toml");
    let mut first = RelayProc::start_instance(&td, &path, "relay-a", [("RUST_LOG", "info")]);
    until(
        "every row in the stream",
        Duration::from_secs(30),
        || async { nats.count("ORDERS").await == ROWS as u64 },
    )
    .await;
    assert_eq!(
        td.counts().await[2],
        0,
        "no result may be written yet (the trigger holds the write)"
    );
    first.kill9();
    // The dead relay's result write fails and the trigger goes; the rows keep their claims
    // until claim_ttl runs out.
    td.exec("UPDATE {t}_hold SET state = 'abort'").await;
    td.exec("DROP TRIGGER {t}_hold ON {t}").await;
    assert_eq!(td.counts().await[2], 0, "the aborted write wrote nothing");

    let second = RelayProc::start_instance(&td, &path, "relay-b", [("RUST_LOG", "info")]);
    td.wait_all_success(Duration::from_secs(60)).await;
    // relay-b published every row again (so the re-send happened), and each was a duplicate.
    let sent = second
        .metric_labelled("outbox_relay_deliveries_total", "outcome=\"delivered\"")
        .await;
    assert_eq!(sent, ROWS as f64);
    let stored = nats.messages("ORDERS").await;
    let mut ids: Vec<String> = stored.iter().filter_map(|m| m.msg_id.clone()).collect();
    ids.sort();
    let mut want: Vec<String> = (1..=ROWS)
        .map(|i| format!("outbox-{}-{i}", td.table))
        .collect();
    want.sort();
    assert_eq!(ids, want, "the stream holds each row exactly once");
    td.exec("DROP FUNCTION {t}_hold()").await;
    td.exec("DROP TABLE {t}_hold").await;
    td.drop_table().await;
}
