//! The loop when things go wrong or end: a database outage, the lease (claims only under a
//! live confirmed lease; rows claimed as it is lost are given back unsent), and shutdown.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_database_outage_pauses_claims_and_never_loses_rows() {
    let queue = MemQueue::with_rows(&[("a", 10)]);
    queue.failing_claims.store(4, Ordering::SeqCst);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(&queue, vec![("a", &a, 4)], settings(4, 4), None);
    let health = relay.health.clone();
    let q = queue.clone();
    let t0 = Instant::now();
    run_until(relay, stop, move || q.count(State::Success) == 10).await;
    assert!(
        health.database_ok(),
        "readiness recovered with the database"
    );
    // Four failures back off 0.5 + 1 + 2 + 4 s before the fifth claim gets through.
    let first = queue.claims()[0].at;
    assert_eq!(first - t0, Duration::from_millis(7500));
    assert_eq!(a.sent().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn leader_mode_claims_only_under_a_live_confirmed_lease() {
    let queue = MemQueue::with_rows(&[("a", 6)]);
    let a = TimedSink::new(Duration::from_millis(10));
    let (tx, rx) = watch::channel(LeaseState::Standby);
    let mut s = settings(4, 4);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(&queue, vec![("a", &a, 4)], s, Some(rx));
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(queue.claims().is_empty(), "claimed without the lease");
    // Held but unconfirmed (after a failed renewal): still nothing new is claimed.
    let deadline = Instant::now() + Duration::from_secs(20);
    tx.send_replace(LeaseState::Held {
        epoch: 7,
        deadline,
        confirmed: false,
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        queue.claims().is_empty(),
        "claimed under an unconfirmed hold"
    );
    tx.send_replace(LeaseState::Held {
        epoch: 7,
        deadline,
        confirmed: true,
    });
    while queue.count(State::Success) < 6 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(queue.claims().iter().all(|c| c.epoch == Some(7)));
    // The deadline passes without a renewal: claims stop by themselves, even though the
    // keeper published nothing.
    queue.put(100, State::Pending, deadline + Duration::from_secs(1));
    tokio::time::sleep_until(deadline + Duration::from_secs(5)).await;
    assert_eq!(
        queue.count(State::Pending),
        1,
        "claimed after the lease deadline"
    );
    stop.cancel();
    task.await.expect("relay task");
}

#[tokio::test(start_paused = true)]
async fn rows_claimed_as_the_lease_is_lost_are_given_back_unsent() {
    // The claim statement takes 100 ms (a slow database) and the lease is lost while it runs:
    // the claim was fenced when it began, but no row it returns may be sent (G4).
    let queue = MemQueue::with_rows(&[("a", 5)]);
    *queue.claim_delay.lock().expect("delay") = Duration::from_millis(100);
    let a = TimedSink::new(Duration::from_millis(10));
    let (tx, rx) = watch::channel(LeaseState::Held {
        epoch: 1,
        deadline: Instant::now() + Duration::from_secs(30),
        confirmed: true,
    });
    let mut s = settings(8, 8);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], s, Some(rx));
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send_replace(LeaseState::Standby);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    task.await.expect("relay task");
    assert_eq!(queue.claims().len(), 1);
    assert_eq!(queue.claims()[0].got, 5);
    assert!(a.sent().is_empty(), "sent after the lease was lost");
    let results = queue.results();
    assert_eq!(results.len(), 5);
    assert!(
        results
            .iter()
            .all(|(_, c)| matches!(c.resolution, Resolution::Release { .. })),
        "{results:?}"
    );
    let rows = queue.rows.lock().expect("rows");
    assert!(
        rows.rows
            .values()
            .all(|r| !r.live && r.state == State::Pending && r.attempts == 0),
        "a given-back row is still claimed or counted an attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_sends_in_flight_finish_and_records_them_and_claims_nothing_more() {
    let queue = MemQueue::with_rows(&[("a", 20)]);
    let a = TimedSink::new(Duration::from_secs(3));
    let (relay, stop) = relay(&queue, vec![("a", &a, 4)], settings(4, 4), None);
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let claims_before = queue.claims().len();
    let stopped_at = Instant::now();
    stop.cancel();
    task.await.expect("relay task");
    // The four sends in flight ran to their end (2 s more) and their results were written
    // before run() returned; nothing was claimed after the signal.
    let took = stopped_at.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2100),
        "{took:?}"
    );
    assert_eq!(queue.count(State::Success), 4);
    assert_eq!(queue.claims().len(), claims_before);
    assert_eq!(a.sent().len(), 4);
    assert!(queue.results().iter().all(|(at, _)| *at <= Instant::now()));
}

#[tokio::test(start_paused = true)]
async fn shutdown_gives_up_on_sends_that_outlast_its_budget() {
    let queue = MemQueue::with_rows(&[("a", 2)]);
    let a = TimedSink::new(Duration::from_secs(3600));
    let mut s = settings(4, 4);
    s.shutdown_timeout = Duration::from_secs(8);
    let (relay, stop) = relay(&queue, vec![("a", &a, 4)], s, None);
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped_at = Instant::now();
    stop.cancel();
    task.await.expect("relay task");
    // Sends get 75% of shutdown_timeout and results 10%: run() is back within 85% of it.
    assert!(stopped_at.elapsed() <= Duration::from_millis(6800));
    assert_eq!(queue.count(State::Success), 0);
}
