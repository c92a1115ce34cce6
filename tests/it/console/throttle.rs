//! Guessing the console token, through the relay binary: wrong tokens sent at once from many
//! connections and several addresses (`127.0.0.2`, `127.0.0.3`, ... on loopback), at the
//! login form and as bearer tokens, are answered no faster than the process-wide limit (one
//! per 250 ms after a burst of 8: docs/console.md, "Security"), while the right token is
//! accepted at once during the attack, from an attacking address too.
//!
//! `OUTBOX_RELAY_THROTTLE_ATTEMPTS=200` sends 200 wrong tokens instead of 40, and
//! `OUTBOX_RELAY_THROTTLE_ADDRESSES=200` sends them from 200 addresses instead of 8 (at most
//! 250); the figures are printed.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use crate::support::console::*;
use crate::support::receiver::Receiver;
use crate::support::*;

/// The limiter's burst and spacing (`src/console/throttle.rs`).
const BURST: u32 = 8;
const SPACING: Duration = Duration::from_millis(250);

/// An HTTP client whose connections come from `127.0.0.n`.
fn client_from(n: u8) -> reqwest::Client {
    outbox_relay::install_crypto_provider();
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// One attempt with `token`, at the login form or as a bearer token: (status, seconds).
async fn attempt(http: &reqwest::Client, base: &str, token: &str, login: bool) -> (u16, f64) {
    let started = Instant::now();
    let req = if login {
        http.post(format!("{base}/login"))
            .header("origin", base)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", token), ("next", "/")]))
    } else {
        http.get(format!("{base}/"))
            .header("authorization", format!("Bearer {token}"))
    };
    let status = req.send().await.map_or(0, |r| r.status().as_u16());
    (status, started.elapsed().as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_throttled_across_connections_and_the_right_one_is_not() {
    let Some(td) = TestDb::open(Db::Sqlite, "console_throttle").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let (relay, base) = start_relay(&td, &rx, |c| c).await;
    let knob = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let attempts = knob("OUTBOX_RELAY_THROTTLE_ATTEMPTS", 40);
    let addresses = knob("OUTBOX_RELAY_THROTTLE_ADDRESSES", 8).clamp(2, 250) as u8;

    // The attack: every wrong token at once, each on its own connection, half at the login
    // form and half as bearer tokens, from `addresses` addresses.
    let clients: Vec<reqwest::Client> = (2..2 + addresses).map(client_from).collect();
    let started = Instant::now();
    let attack: Vec<_> = (0..attempts)
        .map(|i| {
            let (http, base) = (
                clients[(i % u32::from(addresses)) as usize].clone(),
                base.clone(),
            );
            tokio::spawn(async move {
                let wrong = format!("wrong-token-{i:04}-0123456789");
                attempt(&http, &base, &wrong, i % 2 == 0).await
            })
        })
        .collect();

    // During the attack the right token goes through at once: from an attacking address
    // (login and bearer) and from another. A second into the attack, so it is in full swing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut right = Vec::new();
    for (n, login) in [(2, true), (3, false), (1, true), (1, false)] {
        let (status, secs) = attempt(&client_from(n), &base, TOKEN, login).await;
        assert_eq!(status, if login { 303 } else { 200 }, "127.0.0.{n}");
        right.push(secs);
    }
    let answered: Vec<(u16, f64)> = futures_of(attack).await;
    let total = started.elapsed();

    let slowest_right = right.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "{attempts} wrong tokens from {addresses} addresses answered in {:.1} s (statuses: {} \
         x 401, {} x 429); the right token accepted in at most {slowest_right:.3} s during it",
        total.as_secs_f64(),
        answered.iter().filter(|(s, _)| *s == 401).count(),
        answered.iter().filter(|(s, _)| *s == 429).count(),
    );
    assert!(slowest_right < 1.5, "right token took {right:?}");
    assert!(
        answered.iter().all(|(s, _)| *s == 401 || *s == 429),
        "{answered:?}"
    );
    // No faster than the process-wide schedule, whatever the connections and addresses.
    let floor = SPACING * attempts.saturating_sub(BURST);
    assert!(
        total >= floor,
        "{attempts} answered in {total:?}, under {floor:?}"
    );
    // And one log line per answer, never the token.
    let log = relay.log_text();
    let lines = log.matches("answer throttled").count();
    assert!(lines >= attempts as usize, "{lines} lines:\n{log}");
    assert!(!log.contains(TOKEN));
    td.drop_table().await;
}

/// Every spawned attempt's answer.
async fn futures_of(tasks: Vec<tokio::task::JoinHandle<(u16, f64)>>) -> Vec<(u16, f64)> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("attempt"));
    }
    out
}
