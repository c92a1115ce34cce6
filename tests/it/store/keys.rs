//! Ordering keys: one row of a key at a time, in id order, and the blocked-keys gauge.

use super::*;

/// Enqueues one row of channel `log` per key of `keys` (`None`: keyless), in that order;
/// returns their ids.
async fn enqueue_logs<const N: usize>(td: &TestDb, keys: [Option<&str>; N]) -> [i64; N] {
    let mut ids = [0; N];
    for (id, key) in ids.iter_mut().zip(keys) {
        *id = td.enqueue("log", r#"{"n":1}"#, key).await;
    }
    ids
}

/// Writes `resolution` for row `id` of the claim `req`, and checks that it was written.
pub(super) async fn complete_one(td: &TestDb, req: &ClaimRequest, id: i64, resolution: Resolution) {
    let done = [completion(req, id, resolution)];
    assert_eq!(complete(&*td.store, &done).await, 1);
}

per_db!(ordering_keys_deliver_one_at_a_time);
async fn ordering_keys_deliver_one_at_a_time(db: Db) {
    let Some(td) = TestDb::open(db, "st_order").await else {
        return;
    };
    let store = td.store.clone();
    let (a, b) = (Some("A"), Some("B"));
    let [a1, k1, b1, a2, k2, b2, a3] = enqueue_logs(&td, [a, None, b, a, None, b, a]).await;

    let (r1, heads) = claim(&*store, 100, LONG, "a", None).await;
    assert_eq!(
        ids(&heads),
        vec![a1, k1, b1, k2],
        "only the heads of each key plus keyless rows"
    );
    assert_eq!(heads[0].ordering_key.as_deref(), Some("A"));
    assert_eq!(heads[1].ordering_key, None);

    // While A1 is claimed (still PENDING), A2 waits; so does B2 behind B1.
    let (_, none) = claim(&*store, 100, LONG, "b", None).await;
    assert!(none.is_empty(), "claimed behind a head: {:?}", ids(&none));

    // A1 released (throttled): still the head, A2 still waits.
    let release = Resolution::Release {
        delay: Duration::ZERO,
        error: None,
    };
    complete_one(&td, &r1, a1, release).await;
    let (r2, again) = claim(&*store, 100, LONG, "b", None).await;
    assert_eq!(
        ids(&again),
        vec![a1],
        "a released head is the next of its key"
    );

    // A1 delivered, B1 to RETRY later, keyless ones delivered.
    let done = [
        completion(&r2, a1, Resolution::Delivered),
        completion(
            &r1,
            b1,
            Resolution::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
        completion(&r1, k1, Resolution::Delivered),
        completion(&r1, k2, Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 4);
    // A2 is next for A; the RETRY head B1 holds back B2 only. Claimed as an idle poll does,
    // reading first whether anything is claimable: on MariaDB that read (plain, through the
    // index of unfinished rows of every channel) once found nothing here, under load with
    // the rows just changed (docs/design.md, "Claim-mode locks on MySQL").
    let r3 = request(100, LONG, "c", None);
    assert_eq!(
        bounded("probe", store.probe(&r3)).await,
        Probe::Claimable,
        "the idle poll's read missed a2"
    );
    let next = bounded("claim", store.claim(&r3)).await;
    assert_eq!(ids(&next), vec![a2], "the idle poll's read missed a2");
    let bad = Resolution::Failed {
        error: "bad".into(),
    };
    complete_one(&td, &r3, a2, bad).await;
    // A FAILED head no longer holds its key back.
    let (r4, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![a3]);
    deliver(&td, &r4, &next).await;
    // B1 becomes due and is delivered: then B2.
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {} WHERE id = {b1}",
        db_time(db, -1)
    ))
    .await;
    let (r5, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b1]);
    deliver(&td, &r5, &next).await;
    let (_, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b2]);
    td.drop_table().await;
}

per_db!(blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row);
/// `ordering_blocked_keys`: keys with an unfinished row behind an earlier unfinished row of the
/// same key. (On MySQL/MariaDB it reads the indexed `open_key` column, which holds the key of
/// unfinished rows only: a finished head no longer blocks.)
async fn blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row(db: Db) {
    let Some(td) = TestDb::open(db, "st_blocked").await else {
        return;
    };
    let store = td.store.clone();
    let k1 = td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("j")).await;
    let j2 = td.enqueue("hook", "{}", Some("j")).await;
    td.enqueue("hook", "{}", Some("alone")).await;
    td.enqueue("hook", "{}", None).await;
    let blocked = || async {
        store
            .sample(false)
            .await
            .expect("sample")
            .ordering_blocked_keys
    };
    assert_eq!(blocked().await, 2, "k and j wait behind their heads");
    td.exec(&format!(
        "UPDATE {} SET status = 'SUCCESS' WHERE id = {k1}",
        td.table
    ))
    .await;
    td.exec(&format!("DELETE FROM {} WHERE id = {j2}", td.table))
        .await;
    assert_eq!(
        blocked().await,
        1,
        "k's next row still waits behind the one after its head"
    );
    td.drop_table().await;
}

/// Enqueues `n` rows of channel `hook` under `key(i)`; returns their ids.
pub(super) async fn enqueue_keyed(
    td: &TestDb,
    n: usize,
    key: impl Fn(usize) -> String,
) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(td.enqueue("hook", "{}", Some(&key(i))).await);
    }
    ids
}

/// Inserts a row of channel `hook` and key `key` with the id `id` (a free id below rows
/// already there): a transaction that committed late, as the claims see it.
pub(super) async fn appears_late(td: &TestDb, id: i64, key: &str) {
    td.exec(&format!(
        "INSERT INTO {{t}} (id, channel, payload, ordering_key) VALUES ({id}, 'hook', '{{}}', '{key}')"
    ))
    .await;
}

/// Delivers `rows` (claimed by `req`).
pub(super) async fn deliver(td: &TestDb, req: &ClaimRequest, rows: &[ClaimedRow]) {
    let done: Vec<Completion> = rows
        .iter()
        .map(|r| completion(req, r.delivery.id, Resolution::Delivered))
        .collect();
    assert_eq!(complete(&*td.store, &done).await, rows.len() as u64);
}

per_db!(a_keyed_backlog_is_claimed_in_runs_of_its_freed_keys);
/// Fewer keys than the claim could take, many rows each (docs/design.md, "Claims"): the first
/// claim takes each key's head; once those are delivered their keys are freed, and the next
/// claim reads those keys' first rows and takes runs of them (each key's head and the rows
/// right behind it), a key's rows breadth first so that the budget is shared among the keys.
async fn a_keyed_backlog_is_claimed_in_runs_of_its_freed_keys(db: Db) {
    let Some(td) = TestDb::open(db, "st_runs").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 200, |i| format!("k{}", i % 4)).await;
    let first = hook_request(8, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..4].to_vec(), "the four keys' heads");
    deliver(&td, &first, &got).await;
    for round in 0..3 {
        let req = hook_request(8, "a");
        let got = bounded("claim", store.claim(&req)).await;
        let from = 4 + round * 8;
        assert_eq!(
            ids(&got),
            rows[from..from + 8].to_vec(),
            "round {round}: two rows of each key, its head and the row right behind it"
        );
        deliver(&td, &req, &got).await;
    }
    td.drop_table().await;
}

per_db!(unkeyed_rows_among_keys_go_before_the_rest_of_their_runs);
/// Two keys of many rows with unkeyed rows among them (docs/design.md, "Ordering keys: a
/// keyed share"): each claim takes its keyed share of keys' first rows, the oldest first,
/// then the oldest unkeyed rows, and only what is left goes to the other keys and to runs;
/// the keys take turns, and with budget for all each takes a run.
async fn unkeyed_rows_among_keys_go_before_the_rest_of_their_runs(db: Db) {
    let Some(td) = TestDb::open(db, "st_mixed").await else {
        return;
    };
    let store = td.store.clone();
    // Rows k0, k1, unkeyed, k0, k1, unkeyed, ...
    let mut rows = Vec::new();
    for _ in 0..30 {
        rows.push(td.enqueue("hook", "{}", Some("k0")).await);
        rows.push(td.enqueue("hook", "{}", Some("k1")).await);
        rows.push(td.enqueue("hook", "{}", None).await);
    }
    let unkeyed = |from: usize, n: usize| {
        (from..from + n)
            .map(|i| rows[3 * i + 2])
            .collect::<Vec<_>>()
    };
    let first = hook_request(3, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(
        ids(&got),
        rows[..3].to_vec(),
        "both keys' heads and the unkeyed row"
    );
    deliver(&td, &first, &got).await;
    let mut from = 1;
    // A budget of 8 has a keyed share of one: the oldest keyed row, k0's, k1's, k0's.
    for (round, keyed) in [(1, rows[3]), (2, rows[4]), (3, rows[6])] {
        let req = hook_request(8, "a");
        let got = bounded("claim", store.claim(&req)).await;
        let mut want = vec![keyed];
        want.extend(unkeyed(from, 7));
        want.sort();
        assert_eq!(
            ids(&got),
            want,
            "round {round}: the oldest key's row, then seven unkeyed rows, no run"
        );
        from += 7;
        deliver(&td, &req, &got).await;
    }
    // With budget for all: the rest of the unkeyed rows, and a run of each key. On
    // MySQL/MariaDB the claim before was crowded, so each freed key is read from the rows
    // read ahead behind the row that freed it (docs/design.md, "Ordering keys: rows read
    // ahead"): of the 16 rows read from each key's head in rounds 1 and 2, k0's 14 left and
    // k1's 15; elsewhere each key is read from its first row, a run of 16.
    let (k0_to, k1_to) = match db {
        Db::MySql => (17, 17),
        _ => (19, 18),
    };
    let req = hook_request(100, "a");
    let got = bounded("claim", store.claim(&req)).await;
    let mut want: Vec<i64> = (3..k0_to).map(|j| rows[3 * j]).collect();
    want.extend((2..k1_to).map(|j| rows[3 * j + 1]));
    want.extend(unkeyed(from, 30 - from));
    want.sort();
    assert_eq!(
        ids(&got),
        want,
        "the unkeyed rows left, and a run of each key"
    );
    deliver(&td, &req, &got).await;
    // Not crowded now: the rest of each key.
    let req = hook_request(100, "a");
    let got = bounded("claim", store.claim(&req)).await;
    let mut want: Vec<i64> = (k0_to..30).map(|j| rows[3 * j]).collect();
    want.extend((k1_to..30).map(|j| rows[3 * j + 1]));
    want.sort();
    assert_eq!(ids(&got), want, "the rest of each key");
    td.drop_table().await;
}

per_db!(a_hot_key_hides_no_row_behind_it);
/// A window full of one key's rows, behind its head: the claim reads on past it, a window at
/// a time, and takes the other keys' heads beyond it; once the hot key's head is delivered its
/// next rows come as a run.
async fn a_hot_key_hides_no_row_behind_it(db: Db) {
    let Some(td) = TestDb::open(db, "st_hot").await else {
        return;
    };
    let store = td.store.clone();
    let hot = enqueue_keyed(&td, 100, |_| "hot".into()).await;
    let others = enqueue_keyed(&td, 8, |i| format!("k{}", i % 4)).await;

    let first = hook_request(8, "a");
    let got = bounded("claim", store.claim(&first)).await;
    let mut heads = vec![hot[0]];
    heads.extend(&others[..4]);
    assert_eq!(ids(&got), heads, "the hot key's head and the others'");
    deliver(&td, &first, &got).await;

    let second = hook_request(8, "a");
    let got = bounded("claim", store.claim(&second)).await;
    let mut next = vec![hot[1], hot[2], hot[3], hot[4]];
    next.extend(&others[4..]);
    next.sort();
    assert_eq!(
        ids(&got),
        next,
        "each key's next row, then the hot key's run with what is left of the budget"
    );
    td.drop_table().await;
}

per_db!(keys_of_any_text_are_claimed_in_order);
/// Keys with quotes, backslashes, control characters, placeholders' marks and non-ASCII text
/// (on MySQL/MariaDB values go out as literals where they can, and are bound where they
/// cannot: docs/design.md, "Statements as text on MySQL/MariaDB"): each key's head first,
/// then, once it is delivered, the rest of its rows, each row with its key as written.
async fn keys_of_any_text_are_claimed_in_order(db: Db) {
    let Some(td) = TestDb::open(db, "st_keytext").await else {
        return;
    };
    let store = td.store.clone();
    let keys = [
        "o'brien",
        "back\\slash",
        "tab\tnew\nline",
        "q?$1 %s",
        "키-é-😀",
        "it''s\\'",
    ];
    let rows = enqueue_keyed(&td, 3 * keys.len(), |i| keys[i % keys.len()].to_string()).await;
    let key_of = |id: i64| keys[rows.iter().position(|&r| r == id).unwrap() % keys.len()];

    let first = hook_request(32, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..keys.len()], "each key's head");
    for r in &got {
        assert_eq!(r.ordering_key.as_deref(), Some(key_of(r.delivery.id)));
    }
    deliver(&td, &first, &got).await;

    let second = hook_request(32, "a");
    let got = bounded("claim", store.claim(&second)).await;
    let mut rest = ids(&got);
    rest.sort();
    assert_eq!(
        rest,
        rows[keys.len()..],
        "the rest of each key, behind its delivered head"
    );
    for r in &got {
        assert_eq!(r.ordering_key.as_deref(), Some(key_of(r.delivery.id)));
    }
    td.drop_table().await;
}

per_db!(many_keys_leave_the_unkeyed_rows_among_them_all_but_their_share);
/// Unkeyed rows mixed one for one into 40 keys of three rows (docs/design.md, "Ordering keys: a
/// keyed share"): once every key is known, each claim of 32 while unkeyed rows wait takes no
/// more keyed rows than its keyed share (two), however many keys it freed, and its windows pass
/// the freed keys' rows; then the keys drain. Every row is claimed once, each key's in id
/// order.
async fn many_keys_leave_the_unkeyed_rows_among_them_all_but_their_share(db: Db) {
    let Some(td) = TestDb::open(db, "st_share").await else {
        return;
    };
    let store = td.store.clone();
    let mut keyed: Vec<(String, i64)> = Vec::new();
    let mut unkeyed: Vec<i64> = Vec::new();
    for _ in 0..3 {
        for k in 0..40 {
            let key = format!("k{k}");
            keyed.push((key.clone(), td.enqueue("hook", "{}", Some(&key)).await));
            unkeyed.push(td.enqueue("hook", "{}", None).await);
        }
    }
    let mut claimed: Vec<ClaimedRow> = Vec::new();
    for claims in 1.. {
        assert!(claims < 100, "the table did not drain");
        let waiting = unkeyed.len() - claimed.iter().filter(|r| r.ordering_key.is_none()).count();
        let known = (claimed.iter().filter_map(|r| r.ordering_key.as_ref()))
            .collect::<std::collections::HashSet<_>>()
            .len();
        let req = hook_request(32, "a");
        let got = bounded("claim", store.claim(&req)).await;
        if got.is_empty() {
            break;
        }
        let took_keyed = got.iter().filter(|r| r.ordering_key.is_some()).count();
        if known == 40 && waiting >= 32 {
            assert!(
                took_keyed <= 2,
                "claim {claims}: {took_keyed} keyed rows while {waiting} unkeyed rows wait"
            );
        }
        deliver(&td, &req, &got).await;
        claimed.extend(got);
    }
    claimed_once_in_key_order(&claimed, &keyed, &unkeyed);
    td.drop_table().await;
}

/// Every row of `keyed` (key, id) and `unkeyed` is in `claimed` once, and nothing else is;
/// each key's rows were claimed in id order.
fn claimed_once_in_key_order(claimed: &[ClaimedRow], keyed: &[(String, i64)], unkeyed: &[i64]) {
    let mut got: Vec<i64> = ids(claimed);
    got.sort_unstable();
    let mut all: Vec<i64> = (keyed.iter().map(|(_, id)| *id))
        .chain(unkeyed.iter().copied())
        .collect();
    all.sort_unstable();
    assert_eq!(got, all, "every row claimed once");
    let keys: HashSet<&String> = keyed.iter().map(|(k, _)| k).collect();
    for key in keys {
        let order: Vec<i64> = (claimed.iter())
            .filter(|r| r.ordering_key.as_ref() == Some(key))
            .map(|r| r.delivery.id)
            .collect();
        let want: Vec<i64> = (keyed.iter().filter(|(k, _)| k == key))
            .map(|(_, id)| *id)
            .collect();
        assert_eq!(order, want, "{key} in id order");
    }
}

per_db!(unkeyed_rows_another_claimer_holds_leave_the_keys_their_share);
/// Claim mode (docs/design.md, "Ordering keys: a keyed share among claimers"): another claimer
/// holds the 128 unkeyed rows right behind 20 keys this store freed, and 64 free unkeyed rows
/// wait behind those. A claim of 32 takes the keys' first rows up to the keyed share (two) and
/// reads on past the held rows for the free ones, instead of giving the keys the whole budget
/// because its first window found no free unkeyed row. Then the rest drains, each key in id
/// order, and none of the other claimer's rows is taken.
async fn unkeyed_rows_another_claimer_holds_leave_the_keys_their_share(db: Db) {
    let Some(td) = TestDb::open(db, "st_share_held").await else {
        return;
    };
    let store = td.store.clone();
    let mut keyed: Vec<(String, i64)> = Vec::new();
    for _ in 0..4 {
        for k in 0..20 {
            let key = format!("k{k}");
            keyed.push((key.clone(), td.enqueue("hook", "{}", Some(&key)).await));
        }
    }
    let req = hook_request(20, "a");
    let heads = bounded("claim", store.claim(&req)).await;
    assert_eq!(
        ids(&heads),
        (keyed[..20].iter().map(|(_, id)| *id)).collect::<Vec<_>>()
    );
    let held: Vec<i64> = td.enqueue_n("hook", "{}", 128).await;
    let other = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("connect");
    let other_req = hook_request(128, "b");
    let got = bounded("the other claim", other.claim(&other_req)).await;
    assert_eq!(ids(&got), held, "the other claimer holds the unkeyed rows");
    deliver(&td, &req, &heads).await;
    let free: Vec<i64> = td.enqueue_n("hook", "{}", 64).await;
    let req = hook_request(32, "a");
    let got = bounded("claim", store.claim(&req)).await;
    let firsts = [keyed[20].1, keyed[21].1];
    assert_eq!(
        ids(&got[..2]),
        firsts,
        "the keyed share, the oldest keys first"
    );
    assert_eq!(
        ids(&got[2..]),
        free[..30],
        "then the free unkeyed rows behind the held ones"
    );
    deliver(&td, &req, &got).await;
    let mut claimed: Vec<ClaimedRow> = heads.into_iter().chain(got).collect();
    for claims in 1.. {
        assert!(claims < 50, "the table did not drain");
        let req = hook_request(32, "a");
        let got = bounded("claim", store.claim(&req)).await;
        if got.is_empty() {
            break;
        }
        deliver(&td, &req, &got).await;
        claimed.extend(got);
    }
    // None of the held rows.
    claimed_once_in_key_order(&claimed, &keyed, &free);
    td.drop_table().await;
}

/// A claim-mode request for up to `n` rows of `hook`, of which `starts` its sink can start now.
fn starting(n: u32, starts: u32, claimer: &str) -> ClaimRequest {
    let mut req = hook_request(n, claimer);
    if let Some(b) = req.budgets.as_mut() {
        b.starts = Some(vec![("hook".into(), starts)]);
    }
    req
}

// In claim mode a claim takes no more heads of keys new to it than its sink can start now: a
// key stays with the claimer that holds its rows, so heads taken ahead of the sink's slots
// would wait in that claimer's queue while another claimer could send them; heads it left that
// no one took are its own again after a while. Unkeyed rows are not bound so (docs/design.md,
// "Ordering keys: keys among claimers").
per_db!(a_claimer_takes_no_more_new_keys_than_it_can_start);
async fn a_claimer_takes_no_more_new_keys_than_it_can_start(db: Db) {
    let Some(td) = TestDb::open(db, "st_starts").await else {
        return;
    };
    let store = td.store.clone();
    let mut rows: Vec<(Option<String>, String)> = Vec::new();
    for n in 0..3 {
        for k in 0..10 {
            rows.push((Some(format!("k{k}")), format!(r#"{{"k":{k},"n":{n}}}"#)));
        }
    }
    rows.extend((0..6).map(|n| (None, format!(r#"{{"u":{n}}}"#))));
    td.insert("hook", rows).await;
    let keyed_heads = |got: &[ClaimedRow]| {
        (got.iter())
            .filter_map(|r| r.ordering_key.clone())
            .collect::<Vec<_>>()
    };
    let got = bounded("claim", store.claim(&starting(32, 4, "a"))).await;
    assert_eq!(
        keyed_heads(&got),
        ["k0", "k1", "k2", "k3"],
        "four keys' heads, as many as the sink can start"
    );
    assert_eq!(got.len(), 4 + 6, "and every unkeyed row: {:?}", ids(&got));
    let other = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("connect");
    let got = bounded("the other claim", other.claim(&starting(32, 4, "b"))).await;
    assert_eq!(
        keyed_heads(&got),
        ["k4", "k5", "k6", "k7"],
        "the other claimer starts the next keys"
    );
    // The first claimer, its slots full, leaves the heads it left before to another claimer for
    // a while, then takes them: no one else did.
    let got = bounded("claim", store.claim(&starting(32, 0, "a"))).await;
    assert_eq!(keyed_heads(&got), Vec::<String>::new(), "none at once");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = bounded("claim", store.claim(&starting(32, 0, "a"))).await;
    assert_eq!(
        keyed_heads(&got),
        ["k8", "k9"],
        "the heads no other claimer took, once they waited"
    );
    td.drop_table().await;
}
