//! kill -9 of one instance mid-run: its claims expire, the others deliver its rows, and only
//! rows on the wire at the kill arrive twice.

use super::*;

// ---------------------------------------------------------------------------------------------
// 2. kill -9 one instance mid-run: its claims expire and the others deliver those rows; only
//    rows whose request was on the wire at the kill may arrive twice.

/// Rows in the table at the start.
const ROWS: usize = 600;

async fn kill9_claims_expire_and_others_deliver(db: Db) {
    let Some(td) = TestDb::open(db, "cm_kill").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    // A slow receiver keeps requests in flight.
    rx.set_delay(Duration::from_millis(150));
    td.insert_hooks(ROWS).await;
    let mut relays = start_three(&td, &rx);
    let (kill_at, b) = kill_b_mid_run(&td, &rx, &mut relays).await;

    let tdr = &td;
    until(
        "every row SUCCESS after the kill",
        Duration::from_secs(40),
        || async move { tdr.counts().await[2] == ROWS as i64 },
    )
    .await;
    let recovered_after = kill_at.elapsed();
    assert_eq!(td.counts().await, [0, 0, ROWS as i64, 0]);
    for r in relays.iter_mut().filter(|r| r.name != "b") {
        assert!(r.running(), "relay {} exited", r.name);
    }

    let reqs = rx.requests();
    let counts = rx.count_by_id();
    assert_eq!(counts.len(), ROWS, "every row received");
    let dupes = duplicates(&rx);
    let late_from_b = reqs
        .iter()
        .filter(|r| sender(r) == "b" && r.at > kill_at + Duration::from_millis(100))
        .count();
    eprintln!(
        "{db:?}: kill -9 of b after it sent {} requests: it held {} claims: {} sent \
         with no result recorded ({} unanswered at the kill, {} answered in the 500ms before), {} \
         not sent; {} rows arrived twice {:?}; all {ROWS} SUCCESS {:?} after the kill; shares {:?}",
        b.sent,
        b.orphan_ids.len(),
        b.on_wire.len(),
        b.unanswered,
        b.just_answered,
        b.orphan_ids.len() - b.on_wire.len(),
        dupes.len(),
        dupes.keys().collect::<Vec<_>>(),
        recovered_after,
        shares(&reqs)
    );
    assert_eq!(
        late_from_b, 0,
        "requests from the killed instance after its death"
    );
    assert_only_wire_rows_twice(&rx, &dupes, &b);
    assert_claims_waited_for(&rx, &counts, &b);
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0,
        "claims left behind"
    );
    td.drop_table().await;
}
per_db!(kill9_claims_expire_and_others_deliver);

/// Starts instances `a`, `b` and `c`, in that order.
fn start_three(td: &TestDb, rx: &Receiver) -> Vec<RelayProc> {
    // Each instance claims up to 32 rows but sends only 8 at once: at the kill, the victim
    // holds claims on rows it has sent (in flight) and on rows it has not sent yet.
    let config = |n: &str| {
        base(rx, n)
            .claim_ttl(Duration::from_secs(6))
            .in_flight(32)
            .hook(|s| s.timeout(Duration::from_secs(1)).concurrency(8))
    };
    let names = ["a", "b", "c"];
    names
        .iter()
        .map(|n| RelayProc::start(td, &config(n), n))
        .collect()
}

/// Kills instance `b` (`relays[1]`) with SIGKILL mid-run, once it has got going, and reads
/// what it left behind: the kill's time and its [`LeftBehind`].
async fn kill_b_mid_run(
    td: &TestDb,
    rx: &Receiver,
    relays: &mut [RelayProc],
) -> (Instant, LeftBehind) {
    // Let the victim get going, then kill it mid-run.
    let ok = rx
        .wait_until(
            |r| {
                r.iter()
                    .filter(|q| q.header("x-relay") == Some("b"))
                    .count()
                    >= 40
            },
            Duration::from_secs(20),
        )
        .await;
    assert!(
        ok,
        "instance b never got going: {:?}",
        shares(&rx.requests())
    );
    // Half a receiver delay later: the kill falls in the middle of a round of sends.
    tokio::time::sleep(Duration::from_millis(70)).await;
    let kill_at = Instant::now();
    relays[1].kill9();
    let reqs_at_kill = rx.requests();
    // A result statement the victim sent just before it died may still be running on the
    // server: let it finish before reading what the victim left behind. (Its claims are under
    // a second old at the kill and last 6s, so none expires meanwhile.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The victim's rows as it left them: claimed, unfinished, with their claims' time left.
    let queried_at = Instant::now();
    let orphans = live_claims_of(td, "b").await;
    let delivered_at_kill = td.counts().await[2];
    assert!(
        (delivered_at_kill as usize) < ROWS - 100,
        "the kill was not mid-run: {delivered_at_kill} of {ROWS} already delivered"
    );
    assert!(!orphans.is_empty(), "instance b held no claims at the kill");
    let b = left_behind(&orphans, queried_at, &reqs_at_kill, kill_at);
    (kill_at, b)
}

/// What the killed instance `b` left behind: its claims (row, ms left at `queried_at`), and
/// its requests whose outcome it never recorded.
struct LeftBehind {
    /// The rows it held claims on, and when each claim expires (measured from before the
    /// query, so if anything early).
    orphan_ids: HashSet<i64>,
    expiry: HashMap<i64, Instant>,
    /// Rows it had sent (the receiver has the request) that are still under its claim: only
    /// these may arrive twice.
    on_wire: HashSet<i64>,
    /// Its requests literally on the wire at the kill, and those answered so shortly before
    /// it that the result may not have been written yet.
    unanswered: usize,
    just_answered: usize,
    /// All its requests.
    sent: usize,
}

/// [`LeftBehind`] from `b`'s claims read at `queried_at` and the requests at the kill.
fn left_behind(
    orphans: &[(i64, i64)],
    queried_at: Instant,
    reqs_at_kill: &[Received],
    kill_at: Instant,
) -> LeftBehind {
    let orphan_ids: HashSet<i64> = orphans.iter().map(|o| o.0).collect();
    let expiry: HashMap<i64, Instant> = orphans
        .iter()
        .map(|&(id, ms)| (id, queried_at + Duration::from_millis(ms.max(0) as u64)))
        .collect();
    let from_b: Vec<&Received> = reqs_at_kill.iter().filter(|r| sender(r) == "b").collect();
    let on_wire: HashSet<i64> = from_b
        .iter()
        .filter_map(|r| r.id)
        .filter(|id| orphan_ids.contains(id))
        .collect();
    let unanswered = from_b
        .iter()
        .filter(|r| r.answered_at.is_none_or(|t| t > kill_at))
        .count();
    // The recorder flushes every 10ms; 500ms leaves room for a slow result statement.
    let just_answered = from_b
        .iter()
        .filter(|r| {
            r.answered_at
                .is_some_and(|t| t <= kill_at && t + Duration::from_millis(500) > kill_at)
        })
        .count();
    LeftBehind {
        orphan_ids,
        expiry,
        on_wire,
        unanswered,
        just_answered,
        sent: from_b.len(),
    }
}

/// Only rows on the wire at the kill arrived twice (G3), and each at most twice: at most the
/// requests the victim had sent without a recorded result, which are at most those unanswered
/// at the kill (bounded by the sink's concurrency, 8) plus those answered in the moment
/// before it.
fn assert_only_wire_rows_twice(rx: &Receiver, dupes: &BTreeMap<i64, usize>, b: &LeftBehind) {
    let (on_wire, unanswered, just_answered) = (&b.on_wire, b.unanswered, b.just_answered);
    assert!(
        dupes.len() <= on_wire.len(),
        "{} duplicates but only {} requests of the killed instance had no recorded result",
        dupes.len(),
        on_wire.len()
    );
    assert!(
        unanswered <= 8,
        "{unanswered} requests of b in flight, over its sink concurrency of 8"
    );
    assert!(
        on_wire.len() <= unanswered + just_answered,
        "{} of b's rows were sent without a recorded result, but only {unanswered} were \
         unanswered at the kill and {just_answered} answered just before it",
        on_wire.len()
    );
    for (id, n) in dupes {
        assert_eq!(*n, 2, "row {id} arrived {n} times");
        assert!(
            on_wire.contains(id),
            "row {id} arrived twice but was not on the wire from the killed instance"
        );
        let first = &rx.requests_for(*id)[0];
        assert_eq!(sender(first), "b", "row {id}: first request not from b");
    }
}

/// The victim's claimed rows went to the others, and only after their claims expired (G1,
/// G2; 100ms allows for the database's clock granularity and the query's round trip); every
/// other row arrived exactly once.
fn assert_claims_waited_for(rx: &Receiver, counts: &HashMap<i64, usize>, b: &LeftBehind) {
    for id in &b.orphan_ids {
        let after: Vec<Received> = rx
            .requests_for(*id)
            .into_iter()
            .filter(|r| sender(r) != "b")
            .collect();
        assert_eq!(after.len(), 1, "row {id} claimed by b: {after:?}");
        let r = &after[0];
        assert!(
            ["a", "c"].contains(&sender(r)),
            "row {id} from {}",
            sender(r)
        );
        assert!(
            r.at + Duration::from_millis(100) >= b.expiry[id],
            "row {id} was re-sent {:?} before b's claim on it expired",
            b.expiry[id] - r.at
        );
    }
    for (id, n) in counts {
        if !b.orphan_ids.contains(id) {
            assert_eq!(
                *n, 1,
                "row {id}, not claimed by b at the kill, arrived {n} times"
            );
        }
    }
}
