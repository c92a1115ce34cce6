//! When the loop claims without a backlog: an idle relay reads before it claims, on its poll
//! and not on each lease renewal; a wake-up claims at once; one that is not an arrival, after a
//! short claim, waits for the rows in flight.

use super::*;

/// The lease's renewals (every ttl/3) say nothing about the table: they do not wake an idle
/// relay into an extra read. A new epoch does wake it, and its next claim is fenced with it.
#[tokio::test(start_paused = true)]
async fn an_idle_relay_reads_on_its_poll_not_on_each_lease_renewal() {
    let queue = MemQueue::with_rows(&[]);
    let a = TimedSink::new(Duration::from_millis(5));
    let held = |epoch: i64| LeaseState::Held {
        epoch,
        deadline: Instant::now() + Duration::from_secs(10),
        confirmed: true,
    };
    let (tx, rx) = watch::channel(held(3));
    let mut s = settings(8, 8);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], s, Some(rx));
    let start = Instant::now();
    let task = tokio::spawn(relay.run());
    // Renewed every 300 ms for 2.1 s.
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.send_replace(held(3));
    }
    let ms = |at: Instant| at.duration_since(start).as_millis();
    let reads: Vec<u128> = queue.probes().iter().map(|p| ms(p.0)).collect();
    assert_eq!(reads, [500, 1000, 1500, 2000], "a renewal woke the loop");
    // Lost and taken again at another epoch (as after a hand-off): the loop looks at once.
    tx.send_replace(LeaseState::Standby);
    tokio::time::sleep(Duration::from_millis(10)).await;
    queue.put(1, State::Pending, Instant::now());
    tx.send_replace(held(4));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    task.await.expect("relay task");
    let claims = queue.claims();
    let last = claims.last().expect("claims");
    assert_eq!((last.got, last.epoch), (1, Some(4)), "{claims:?}");
    assert!(ms(last.at) < 2_250, "claimed at {} ms", ms(last.at));
}

/// Leader mode tells the store that no other instance claims, also with the `none` lease,
/// where no fence says so; claim mode that others may. On MySQL/MariaDB that decides how a
/// claim reads its picks (`store::ClaimRequest::alone`).
#[tokio::test(start_paused = true)]
async fn only_leader_mode_claims_alone() {
    for (mode, alone) in [(Mode::Leader, true), (Mode::Claim, false)] {
        let queue = MemQueue::with_rows(&[("a", 4)]);
        let a = TimedSink::new(Duration::from_millis(5));
        let mut s = settings(8, 8);
        s.mode = mode;
        let (relay, stop) = relay(&queue, vec![("a", &a, 8)], s, None);
        let task = tokio::spawn(relay.run());
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        task.await.expect("relay task");
        assert_eq!(a.sent().len(), 4, "{mode:?}");
        let claims = queue.claims();
        assert!(!claims.is_empty(), "{mode:?}");
        assert!(
            claims.iter().all(|c| c.alone == alone),
            "{mode:?}: {claims:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_poll_reads_first_and_a_wake_up_claims_at_once() {
    let (queue, a, relay, stop) = idle_relay();
    let wake = relay.wake.clone();
    let task = tokio::spawn(relay.run());
    // Claims at 0, 500, 1000 and 1500 ms find nothing; only the poll timer woke the loop.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    queue.put(1, State::Pending, Instant::now());
    // A wake-up (NOTIFY, the newest-id check) means rows arrived: claimed without a probe.
    wake.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    task.await.expect("relay task");
    assert_eq!(a.sent().len(), 1);
    let got: Vec<usize> = queue.claims().iter().map(|c| c.got).collect();
    assert_eq!(
        got,
        [0, 1],
        "the first claim and the one after a wake-up claim at once; polls after an empty claim read first"
    );
    let probes: Vec<Probe> = queue.probes().iter().map(|p| p.1).collect();
    let empty = Probe::Nothing {
        quiet_for: Duration::MAX,
    };
    assert_eq!(probes, [empty; 3], "a read at 500, 1000 and 1500 ms");
}

/// After a claim that came back short, with rows in flight: a wake-up that is not an arrival
/// (a result that unblocked an ordering key) waits for the rows in flight to finish, at most
/// as long as that claim took (10 ms here), before the next claim; an arrival (NOTIFY,
/// the newest-id check) is claimed at once (docs/design.md, "Ordering keys and claim rounds").
#[tokio::test(start_paused = true)]
async fn a_wake_up_that_is_not_an_arrival_waits_as_long_as_the_short_claim_took() {
    for arrival in [false, true] {
        let queue = MemQueue::with_rows(&[("a", 8)]);
        *queue.claim_delay.lock().expect("delay") = Duration::from_millis(10);
        let a = TimedSink::new(Duration::from_millis(40));
        let (relay, stop) = relay(&queue, vec![("a", &a, 16)], settings(64, 32), None);
        let (wake, arrivals) = (relay.wake.clone(), relay.arrivals.clone());
        let started = Instant::now();
        let task = tokio::spawn(relay.run());
        // The first claim ends at 10 ms with 8 rows, fewer than asked; they are sent until 50.
        tokio::time::sleep(Duration::from_millis(12)).await;
        for id in 9..=12 {
            queue.put(id, State::Pending, Instant::now());
        }
        match arrival {
            true => arrivals.signal(),
            false => wake.notify_one(),
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        stop.cancel();
        task.await.expect("relay task");
        let claims = queue.claims();
        let at: Vec<u128> = claims
            .iter()
            .map(|c| (c.at - started).as_millis())
            .collect();
        let got: Vec<usize> = claims.iter().map(|c| c.got).collect();
        // Each claim is logged when its 10 ms statement ends.
        let want = if arrival { [10, 22] } else { [10, 32] };
        assert_eq!(at, want, "arrival: {arrival}, claims {claims:?}");
        assert_eq!(got, [8, 4]);
    }
}

/// With every insert announced (NOTIFY), an idle relay reads the table every
/// `QUIET_POLLS` poll intervals, and sooner when a waiting row's retry comes due: such a row
/// is still claimed when it is due, not later; a wake-up still claims at once. Without the
/// announcement it reads every poll interval.
#[tokio::test(start_paused = true)]
async fn an_announced_idle_relay_reads_when_a_retry_comes_due_and_seldom_otherwise() {
    for announced in [true, false] {
        let (queue, a, relay, stop) = idle_relay();
        relay.arrivals.set_announced(announced);
        let arrivals = relay.arrivals.clone();
        let start = Instant::now();
        let task = tokio::spawn(relay.run());
        // Idle for 2.1 s; then a row retrying 2.1 s from now (at 4.2 s) is written without a
        // signal (another instance's result), and at 6.05 s one is inserted and announced.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        queue.put(
            1,
            State::Retry,
            Instant::now() + Duration::from_millis(2_100),
        );
        tokio::time::sleep(Duration::from_millis(3_950)).await;
        queue.put(2, State::Pending, Instant::now());
        arrivals.signal();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        task.await.expect("relay task");

        let ms = |at: Instant| at.duration_since(start).as_millis();
        let reads: Vec<u128> = queue.probes().iter().map(|p| ms(p.0)).collect();
        let claims: Vec<(u128, usize)> = queue.claims().iter().map(|c| (ms(c.at), c.got)).collect();
        let sent: Vec<(i64, u128)> = a.sent().iter().map(|(id, at)| (*id, ms(*at))).collect();
        if announced {
            // Reads a second apart while nothing is due soon; at 3500 the retry is 700 ms
            // away, so the next read is at 4200, when it is due (never sooner than a poll
            // interval: a row due but not claimable must not make the loop spin).
            assert_eq!(reads[..5], [500, 1500, 2500, 3500, 4200], "{reads:?}");
            assert_eq!(claims[..2], [(0, 0), (4200, 1)], "{claims:?}");
        } else {
            assert_eq!(reads[..4], [500, 1000, 1500, 2000], "{reads:?}");
            assert_eq!(claims[..2], [(0, 0), (4500, 1)], "{claims:?}");
        }
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[1].0, 2);
        assert!(sent[1].1 <= 6_060, "an announced row waited: {sent:?}");
    }
}
