//! Waiting for a condition with a deadline, instead of sleeping a fixed time and hoping that
//! whatever the test waits for (a relay's start, a row's state, a lease's move) has settled.
//!
//! Every wait re-checks its condition every [`POLL`] (or a period of its own, where a test
//! measures the moment a condition comes true) and gives up at its deadline: [`until`],
//! [`until_or`], [`until_some`] and [`until_reads`] panic then, [`poll_every`] and
//! [`holds_within`] say so. The checks are async closures (`async || ...`), which may borrow
//! what they read, mutably too.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How often the waits re-check their condition.
pub const POLL: Duration = Duration::from_millis(20);

/// Runs `check` every `every` until it gives a value; `None` once `timeout` has passed
/// (`check` runs at least once, and once more at the deadline).
pub async fn poll_every<T>(
    every: Duration,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// True as soon as `check` holds, false if it did not within `timeout`.
pub async fn holds_within(timeout: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    poll_every(POLL, timeout, async || check().await.then_some(()))
        .await
        .is_some()
}

/// Polls `check` until it holds; panics naming `what` after `timeout`.
pub async fn until(what: impl Display, timeout: Duration, check: impl AsyncFnMut() -> bool) {
    until_or(timeout, check, || {
        format!("timed out after {timeout:?} waiting for {what}")
    })
    .await
}

/// Polls `check` until it holds; after `timeout` panics with `explain()`, which is called
/// only then (so it can show the state at the deadline: a relay's log, the rows).
pub async fn until_or(
    timeout: Duration,
    check: impl AsyncFnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    if !holds_within(timeout, check).await {
        panic!("{}", explain());
    }
}

/// Polls `check` until it gives a value and returns it; panics naming `what` after `timeout`.
pub async fn until_some<T>(
    what: impl Display,
    timeout: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    match poll_every(POLL, timeout, check).await {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `read` until what it reads is `done`, and returns that reading; after `timeout`
/// panics with `explain` of the last reading (the rows' states, say, with a relay's log).
pub async fn until_reads<T>(
    timeout: Duration,
    mut read: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
    explain: impl FnOnce(T) -> String,
) -> T {
    let mut last = None;
    let found = poll_every(POLL, timeout, async || {
        let got = read().await;
        if done(&got) {
            return Some(got);
        }
        last = Some(got);
        None
    })
    .await;
    found.unwrap_or_else(|| panic!("{}", explain(last.expect("read at least once"))))
}

/// Runs `check` every `every` for `window`: what a test watches hold throughout (a lease kept,
/// a rival kept out, nothing sent) is its subject, so this wait is a fixed time on purpose.
/// `check` runs at least once, and once more at the end of the window.
pub async fn throughout(window: Duration, every: Duration, mut check: impl AsyncFnMut()) {
    let end = Instant::now() + window;
    loop {
        check().await;
        if Instant::now() >= end {
            return;
        }
        tokio::time::sleep(every).await;
    }
}
