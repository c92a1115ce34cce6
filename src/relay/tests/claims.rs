//! How the loop claims: only into free slots, a claim worth its statement, the newest rows
//! after an arrival under a backlog, and result writes that wait briefly for company; and
//! how it sends a key's run.

use super::*;

#[tokio::test(start_paused = true)]
async fn claims_only_into_free_slots_and_delivers_everything() {
    let queue = MemQueue::with_rows(&[("a", 50), ("b", 50)]);
    let a = TimedSink::new(Duration::from_millis(200));
    let b = TimedSink::new(Duration::from_millis(30));
    let (relay, stop) = relay(
        &queue,
        vec![("a", &a, 8), ("b", &b, 8)],
        settings(16, 100),
        None,
    );
    let q = queue.clone();
    let t0 = Instant::now();
    run_until(relay, stop, move || q.count(State::Success) == 100).await;
    let claims = queue.claims();
    for c in &claims {
        assert!(
            c.outstanding + c.got <= 16,
            "a claim took {} rows with {} still in flight: {claims:?}",
            c.got,
            c.outstanding
        );
    }
    assert!(a.most_running.load(Ordering::SeqCst) <= 8);
    assert_eq!(a.sent().len() + b.sent().len(), 100, "each row sent once");
    // The fast sink is not held up behind the slow one: its 50 rows (30 ms each, 8 at a
    // time) are done in well under a second, while the slow sink needs 1.25 s at best.
    let last = |s: &TimedSink| s.sent().iter().map(|x| x.1).max().expect("sends");
    assert!(
        last(&b) - t0 < Duration::from_millis(500),
        "the fast sink's last send started at {:?}",
        last(&b) - t0
    );
    assert!(last(&a) - t0 >= Duration::from_millis(1050));
}

#[tokio::test(start_paused = true)]
async fn never_more_rows_claimed_than_relay_slots_whatever_the_sinks_allow() {
    let queue = MemQueue::with_rows(&[("a", 40)]);
    let a = TimedSink::new(Duration::from_millis(50));
    let (relay, stop) = relay(&queue, vec![("a", &a, 100)], settings(8, 100), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count(State::Success) == 40).await;
    let claims = queue.claims();
    assert!(
        claims.iter().all(|c| c.outstanding + c.got <= 8),
        "{claims:?}"
    );
    assert!(a.most_running.load(Ordering::SeqCst) <= 8);
    assert_eq!(a.sent().len(), 40);
}

#[tokio::test(start_paused = true)]
async fn a_claim_worth_its_statement_waits_for_half_a_batch_of_slots() {
    let queue = MemQueue::with_rows(&[("a", 200)]);
    let a = TimedSink::new(Duration::from_millis(100));
    let (relay, stop) = relay(&queue, vec![("a", &a, 64)], settings(64, 64), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count(State::Success) == 200).await;
    let claims = queue.claims();
    // 200 rows in a handful of claims, not one statement per finished send: a claim for less
    // than half a batch while sends run is made only after waiting GATHER_SLOTS for more.
    assert!(claims.len() <= 12, "{} claims: {claims:?}", claims.len());
    let took: Vec<&ClaimLog> = claims.iter().filter(|c| c.got > 0).collect();
    for w in took.windows(2) {
        if w[1].got < 32 && w[1].outstanding > 0 {
            assert!(w[1].at - w[0].at >= crate::relay::GATHER_SLOTS, "{w:?}");
        }
    }
}

/// Under a backlog, a claim takes each channel's newest rows too when an arrival was signalled
/// since the last claim (NOTIFY, the newest-id check), so a row just committed waits one claim
/// round; without a signal only every `NEWEST_EVERY` (100 ms).
#[tokio::test(start_paused = true)]
async fn under_a_backlog_the_claim_after_an_arrival_takes_the_newest_rows() {
    let queue = MemQueue::with_rows(&[("a", 5_000)]);
    *queue.claim_delay.lock().expect("delay") = Duration::from_millis(1);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], settings(64, 32), None);
    let arrivals = relay.arrivals.clone();
    let task = tokio::spawn(relay.run());
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(130)).await;
    let signalled_at = Instant::now();
    arrivals.signal();
    tokio::time::sleep(Duration::from_millis(60)).await;
    stop.cancel();
    task.await.expect("relay task");

    let claims = queue.claims();
    let at = |c: &ClaimLog| c.at.duration_since(start);
    assert!(
        claims.iter().all(|c| c.got > 0),
        "a backlog: every claim found rows"
    );
    // Without a signal: the first claim and one every 100 ms.
    let timed: Vec<Duration> = claims
        .iter()
        .filter(|c| c.newest && c.at < signalled_at)
        .map(at)
        .collect();
    assert_eq!(
        timed.len(),
        2,
        "newest picks before the signal at {timed:?}"
    );
    let between = claims
        .iter()
        .filter(|c| at(c) > timed[0] + Duration::from_millis(5) && at(c) < timed[1])
        .count();
    assert!(
        between >= 5,
        "claims without the newest pick between the timed ones: {between}"
    );
    // After the signal: the next claim (or the one after, if one was on its way) asks for the
    // newest rows, well before the timer would.
    let after: Vec<&ClaimLog> = claims.iter().filter(|c| c.at > signalled_at).collect();
    let first = after
        .iter()
        .position(|c| c.newest)
        .expect("a claim with the newest pick after the signal");
    assert!(
        first <= 1,
        "the newest pick came {first} claims after the signal"
    );
    assert!(
        after[first].at.duration_since(signalled_at) < Duration::from_millis(20),
        "and within a claim round"
    );
    // One signal, one extra pick: the claims after it go back to oldest first.
    assert!(
        after.iter().skip(first + 1).take(4).all(|c| !c.newest),
        "claims after the signalled one: {:?}",
        after.iter().map(|c| c.newest).collect::<Vec<_>>()
    );
}

/// The recorder writes a lone result after waiting briefly for others to share the statement:
/// 5 ms, or 2 ms once a result of a row with an ordering key is among them (that key's next
/// row waits for the write). Results arriving while it waits go in the same write.
#[tokio::test(start_paused = true)]
async fn a_lone_result_waits_briefly_for_company_and_a_keyed_one_less() {
    let queue = MemQueue::with_rows(&[("hook", 4)]);
    let recorder = crate::relay::Recorder::start(queue.clone(), Arc::new(Notify::new()), 512);
    let handle = recorder.handle();
    let done = |id: i64| Completion {
        id,
        token: Arc::from("t"),
        resolution: Resolution::Delivered,
    };
    let written_after = async |from: Instant, n: usize| {
        while queue.results().len() < n {
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        queue.results()[n - 1].0 - from
    };

    let start = Instant::now();
    handle.record(done(1), false, None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle.record(done(2), false, None);
    assert_eq!(written_after(start, 2).await, Duration::from_millis(5));
    let results = queue.results();
    assert_eq!(results[0].0, results[1].0, "one write for both");

    let start = Instant::now();
    handle.record(done(3), false, None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle.record(done(4), true, None);
    assert_eq!(written_after(start, 4).await, Duration::from_millis(2));
    recorder.close(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_keys_run_is_sent_one_row_after_another_and_given_back_behind_a_failure() {
    let queue = MemQueue::with_rows(&[]);
    let t0 = Instant::now();
    for id in 1..=4 {
        queue.put_keyed(id, Some("k1"), State::Pending, t0);
    }
    for id in 5..=6 {
        queue.put_keyed(id, Some("k2"), State::Pending, t0);
    }
    for id in 7..=8 {
        queue.put(id, State::Pending, t0);
    }
    let a = TimedSink::new(Duration::from_millis(100));
    a.refuse_once.lock().expect("refuse").push(2);
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], settings(64, 32), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count(State::Success) == 8).await;
    let sent = a.sent();
    let of = |ids: &[i64]| -> Vec<(i64, Duration)> {
        (sent.iter())
            .filter(|(id, _)| ids.contains(id))
            .map(|(id, at)| (*id, *at - t0))
            .collect()
    };
    let ms = Duration::from_millis;
    // One claim took every row; the keys' heads and the unkeyed rows went out at once.
    for id in [1, 5, 7, 8] {
        assert!(
            of(&[id])[0].1 < ms(10),
            "row {id} not sent at once: {sent:?}"
        );
    }
    // k2: the second row only after the first was delivered.
    assert_eq!(of(&[5, 6]).iter().map(|x| x.0).collect::<Vec<_>>(), [5, 6]);
    assert!(of(&[6])[0].1 >= ms(100), "{sent:?}");
    // k1: row 2 refused, so rows 3 and 4 were given back unsent, and the key went on in
    // order only once row 2's retry (1 s later) was delivered.
    let k1 = of(&[1, 2, 3, 4]);
    assert_eq!(
        k1.iter().map(|x| x.0).collect::<Vec<_>>(),
        [1, 2, 2, 3, 4],
        "{sent:?}"
    );
    assert!(
        k1[2].1 >= ms(1200),
        "row 2 again only after its retry delay: {k1:?}"
    );
    let results = queue.results();
    let released = results.iter().filter(|(_, c)| {
        matches!(c.resolution, Resolution::Release { .. }) && [3, 4].contains(&c.id)
    });
    assert_eq!(released.count(), 2, "rows 3 and 4 given back: {results:?}");
}

#[tokio::test]
async fn a_keys_chain_is_claimed_behind_its_rows_in_flight_and_kept_in_order() {
    let queue = MemQueue::with_rows(&[]);
    let t0 = Instant::now();
    for id in 1..=48 {
        queue.put_keyed(id, Some("k"), State::Pending, t0);
    }
    let a = TimedSink::new(Duration::from_millis(5));
    a.refuse_once.lock().expect("refuse").push(20);
    // Claims of 4 rows at most: the key's 48 rows take many claims, each made while the
    // key's earlier rows are still being sent.
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], settings(64, 4), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count(State::Success) == 48).await;
    let order: Vec<i64> = a.sent().iter().map(|(id, _)| *id).collect();
    let mut want: Vec<i64> = (1..=20).collect();
    want.extend(20..=48);
    assert_eq!(
        order, want,
        "the key's rows in id order, row 20 again after its retry"
    );
    let chained = queue
        .claims()
        .iter()
        .filter(|c| c.got > 0 && c.outstanding > 0)
        .count();
    assert!(
        chained >= 4,
        "claims took the key's rows while earlier ones were in flight: {:?}",
        queue.claims()
    );
    let results = queue.results();
    let released: Vec<i64> = (results.iter())
        .filter(|(_, c)| matches!(c.resolution, Resolution::Release { .. }))
        .map(|(_, c)| c.id)
        .collect();
    assert!(
        !released.is_empty() && released.iter().all(|id| *id > 20),
        "rows claimed behind row 20 went back unsent when it was refused: {released:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn rows_behind_a_keys_run_do_not_hold_the_sinks_budget() {
    let queue = MemQueue::with_rows(&[]);
    let t0 = Instant::now();
    // A key's eight rows (one claim takes them as a run), then eight rows of no key.
    for id in 1..=16 {
        let key = (id <= 8).then_some("k");
        queue.put_keyed(id, key, State::Pending, t0);
    }
    let a = TimedSink::new(Duration::from_millis(50));
    let (relay, stop) = relay(&queue, vec![("a", &a, 4)], settings(64, 64), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count(State::Success) == 16).await;
    let sent = a.sent();
    let started = |ids: std::ops::RangeInclusive<i64>| {
        let at = sent.iter().filter(|(id, _)| ids.contains(id));
        at.map(|(_, t)| *t - t0).max().expect("sent")
    };
    // The run goes one row at a time (50 ms each), so it holds one of the sink's four slots;
    // the other rows take the other three, the last of them starting at 100 ms. Counted as
    // waiting for slots, the run's rows kept them out of claims until its third row was sent
    // (the last at 203 ms).
    assert!(
        started(9..=16) < Duration::from_millis(150),
        "the rows of no key waited for the key's run: the last started at {:?}, sends {sent:?}",
        started(9..=16)
    );
    assert!(
        started(1..=8) >= Duration::from_millis(350),
        "the run goes one row at a time"
    );
}
