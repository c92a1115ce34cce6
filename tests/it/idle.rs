//! What an idle relay costs the database, as the server counts it (docs/design.md, "Idle
//! cost"): the relay binary with the default lease (`database`) and a 500 ms poll, on a
//! PostgreSQL server of the test's own, so that nothing else's statements are counted. The
//! relay's sessions log every statement (`log_statement = all` in the URL's `options`), and
//! the test counts the lines between two markers of its own.

use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::support::config::Config;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::{RelayProc, relay_on_table, run_to_end, until};
use crate::support::receiver::Receiver;
use crate::support::{Db, TestDb};

/// The default poll interval.
const POLL: Duration = Duration::from_millis(500);
/// How long the idle relay is counted.
const WINDOW: Duration = Duration::from_secs(10);

/// Starts the relay with a `POLL` poll interval, and waits until it is ready and its first
/// claims and the lease are behind it.
async fn start_idle_relay(td: &TestDb, rx: &Receiver) -> RelayProc {
    let config = Config::webhook(&rx.url()).poll_interval(POLL);
    let relay = RelayProc::start(td, &config, "idle");
    until("the relay is ready", Duration::from_secs(15), || async {
        relay.readyz().await.0 == 200
    })
    .await;
    // Its first claims and the lease are behind it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    relay
}

/// The statements the server logged in a `WINDOW` of the relay idling: the log lines between
/// two markers the test sends on its own connection.
async fn statements_in_the_window(pg: &PrivatePostgres, url: &str) -> Vec<String> {
    let mut marker = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query("SELECT 'idle window opens'")
        .execute(&mut marker)
        .await
        .expect("marker");
    tokio::time::sleep(WINDOW).await;
    sqlx::query("SELECT 'idle window closes'")
        .execute(&mut marker)
        .await
        .expect("marker");
    pg.log_text()
        .lines()
        .skip_while(|l| !l.contains("idle window opens"))
        .skip(1)
        .take_while(|l| !l.contains("idle window closes"))
        .filter(|l| l.contains("LOG:  execute ") || l.contains("LOG:  statement: "))
        .map(str::to_string)
        .collect()
}

/// Waits until the test's one row is delivered (SUCCESS); `what` names the wait.
async fn until_delivered(td: &TestDb, what: &str) {
    until(what, Duration::from_secs(5), || async {
        td.counts().await[2] == 1
    })
    .await;
}

/// Puts row `id` back with the `requeue` verb, and checks that the verb announced it (a
/// notification on the table's channel); returns when the verb was started.
async fn requeue_announced(td: &TestDb, url: &str, id: i64) -> Instant {
    let mut listener = sqlx::postgres::PgListener::connect(url)
        .await
        .expect("listen");
    listener
        .listen(&format!("{}_new", td.table))
        .await
        .expect("listen");
    let requeued = Instant::now();
    let out = run_to_end(
        "outbox-relay requeue",
        relay_on_table(td).args(["requeue", "--id", &id.to_string()]),
        Duration::from_secs(60),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the requeue was not announced")
        .expect("notification");
    requeued
}

/// On PostgreSQL every insert is announced (NOTIFY), so an idle relay reads the table only for
/// rows whose time comes and, every second poll interval, for changes nothing announces: with
/// the lease's renewals (every ttl/3) and the gauges' sample, fewer statements than poll
/// intervals. (It was 21 reads, 3 renewals and the sample in 10 s.) An inserted row still
/// goes out at once; a row put back by hand, which nothing announces, within two poll
/// intervals, and one put back by the `requeue` verb at once.
#[tokio::test]
async fn an_idle_relay_on_postgres_sends_fewer_statements_than_poll_intervals() {
    let Some(pg) = PrivatePostgres::start().await else {
        return;
    };
    let url = format!("{}?options=-c%20log_statement%3Dall", pg.url());
    let Some(td) = TestDb::open_at(Db::Postgres, url.clone(), "idle").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let mut relay = start_idle_relay(&td, &rx).await;

    let window = statements_in_the_window(&pg, &url).await;
    let reads = window
        .iter()
        .filter(|l| l.contains(&format!("FROM {}", td.table)))
        .count();
    let renewals = window
        .iter()
        .filter(|l| l.contains("outbox_relay_lease"))
        .count();
    println!(
        "MEASURED idle relay on PostgreSQL, {WINDOW:?}: {} statements ({reads} of the outbox table, {renewals} of the lease)",
        window.len()
    );
    let intervals = (WINDOW.as_millis() / POLL.as_millis()) as usize;
    // At most: 10 reads, 4 renewals and one gauge sample (3 statements, every 15 s).
    assert!(
        window.len() < intervals,
        "{} statements in {intervals} poll intervals:\n{}",
        window.len(),
        window.join("\n")
    );
    assert!(
        (intervals / 2 - 2..=intervals / 2 + 2).contains(&reads),
        "the table read {reads} times: every second poll interval expected"
    );

    // An insert is announced: it goes out at once, not at the next read.
    let inserted = Instant::now();
    let id = td.enqueue("hook", r#"{"n": 1}"#, None).await;
    rx.expect_requests(1, Duration::from_secs(5), "the inserted row")
        .await;
    let took = inserted.elapsed();
    assert!(took < POLL, "an announced row waited {took:?}");
    // A row put back by hand is announced by nothing: the next read, within two poll
    // intervals, finds it.
    until_delivered(&td, "the row is delivered").await;
    let requeued = Instant::now();
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'PENDING', next_attempt_at = now() WHERE id = {id}"
    ))
    .await;
    rx.expect_requests(2, Duration::from_secs(5), "the row put back by hand")
        .await;
    let took = requeued.elapsed();
    assert!(
        took < POLL * 2 + Duration::from_millis(300),
        "a row put back by hand waited {took:?}"
    );
    // The `requeue` verb announces what it puts back, as the insert trigger does.
    until_delivered(&td, "the row is delivered again").await;
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'FAILED' WHERE id = {id}"
    ))
    .await;
    let requeued = requeue_announced(&td, &url, id).await;
    rx.expect_requests(3, Duration::from_secs(5), "the requeued row")
        .await;
    println!(
        "MEASURED requeue verb started to the row delivered: {:?}",
        requeued.elapsed()
    );
    relay.stop(Duration::from_secs(15)).await;
}
