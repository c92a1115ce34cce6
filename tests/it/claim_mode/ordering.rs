//! Ordering keys across instances, with injected 500s: each key one row at a time, in id order,
//! and a key waiting for a retry holds back no other.

use super::*;

// ---------------------------------------------------------------------------------------------
// 3. Per-key ordering across three instances with injected 500s.

async fn ordering_keys_in_id_order_across_instances(db: Db) {
    let Some(td) = TestDb::open(db, "cm_order").await else {
        return;
    };
    const KEYS: usize = 50;
    const PER_KEY: usize = 40;
    let rx = Receiver::start(None).await;
    // Interleaved: row i belongs to key i % 50 and is that key's (i / 50)-th row.
    let rows: Vec<(Option<String>, String)> = (0..KEYS * PER_KEY)
        .map(|i| {
            let (k, seq) = (i % KEYS, i / KEYS);
            (
                Some(format!("key-{k:02}")),
                format!(r#"{{"key":"key-{k:02}","seq":{seq}}}"#),
            )
        })
        .collect();
    td.insert("hook", rows.iter().cloned()).await;
    let table = ids_and_keys(&td).await;
    assert_eq!(table.len(), KEYS * PER_KEY);
    // id -> (key, seq), checked against the insertion order (ids increase with it).
    let mut row_of: HashMap<i64, (String, usize)> = HashMap::new();
    for (i, (id, key)) in table.iter().enumerate() {
        let key = key.clone().expect("ordering key");
        assert_eq!(key, format!("key-{:02}", i % KEYS), "row {id} out of order");
        row_of.insert(*id, (key, i / KEYS));
    }
    let scripted_500s = script_500s(&rx, &table);
    eprintln!(
        "{db:?}: {} of {} rows answer 500 first ({} of them twice)",
        scripted_500s.len(),
        table.len(),
        scripted_500s.values().filter(|n| **n == 2).count()
    );

    let config =
        |n: &str| base(&rx, n).retry(Duration::from_millis(100), Duration::from_millis(300), 10);
    let started = Instant::now();
    let names = ["a", "b", "c"];
    let mut relays: Vec<RelayProc> = names
        .iter()
        .map(|n| RelayProc::start(&td, &config(n), n))
        .collect();
    let total = (KEYS * PER_KEY) as i64;
    let tdr = &td;
    until(
        "every keyed row SUCCESS",
        Duration::from_secs(60),
        || async move { tdr.counts().await[2] == total },
    )
    .await;
    let took = started.elapsed();
    for r in &mut relays {
        assert!(r.running(), "relay {} exited", r.name);
    }

    let reqs = rx.requests();
    let share = shares(&reqs);
    eprintln!(
        "{db:?}: {KEYS} keys x {PER_KEY} rows with ordering in {took:?}; {} requests; shares {share:?}",
        reqs.len()
    );
    for n in names {
        assert!(
            share.contains_key(n),
            "instance {n} sent nothing: {share:?}"
        );
    }
    // Every row: its scripted 500s, then exactly one success.
    let mut by_row: HashMap<i64, Vec<&Received>> = HashMap::new();
    for r in &reqs {
        by_row.entry(r.id.expect("webhook-id")).or_default().push(r);
    }
    for (id, (key, seq)) in &row_of {
        let got = by_row.get(id).map(Vec::as_slice).unwrap_or_default();
        let fails = scripted_500s.get(id).copied().unwrap_or(0);
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        let mut want = vec![500; fails];
        want.push(200);
        assert_eq!(statuses, want, "row {id} ({key} #{seq}) attempts");
        let body: serde_json::Value = serde_json::from_str(&got[0].body).expect("JSON body");
        assert_eq!(body["key"], key.as_str());
        assert_eq!(body["seq"], *seq);
    }

    assert_each_key_in_order(&reqs, &row_of, (KEYS, PER_KEY));

    assert_retries_hold_back_one_key(db, &reqs, &by_row);
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0
    );
    td.drop_table().await;
}
per_db!(ordering_keys_in_id_order_across_instances);

/// About 10% of first attempts answer 500 (deterministic by id), a few of them twice: the
/// rows scripted so, and how many 500s each gets.
fn script_500s(rx: &Receiver, table: &[(i64, Option<String>)]) -> HashMap<i64, usize> {
    let mut scripted_500s: HashMap<i64, usize> = HashMap::new();
    for (id, _) in table {
        let n = match id.rem_euclid(97) {
            x if x % 10 == 3 => 1,
            7 | 48 => 2,
            _ => 0,
        };
        if n > 0 {
            rx.script(*id, vec![Reply::status(500).body("injected"); n]);
            scripted_500s.insert(*id, n);
        }
    }
    scripted_500s
}

/// Per key: requests one at a time (each arrives after the previous one was answered), and
/// successful deliveries strictly in id order, seq 0..`per_key`, for each of `keys` keys.
fn assert_each_key_in_order(
    reqs: &[Received],
    row_of: &HashMap<i64, (String, usize)>,
    (keys, per_key): (usize, usize),
) {
    let mut by_key: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in reqs {
        let (key, _) = &row_of[&r.id.expect("id")];
        by_key.entry(key.as_str()).or_default().push(r);
    }
    assert_eq!(by_key.len(), keys);
    for (key, list) in &by_key {
        for pair in list.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            let answered = prev.answered_at.expect("answered");
            assert!(
                next.at >= answered,
                "{key}: row {:?} was sent while row {:?} (status {}) was still in flight",
                next.id,
                prev.id,
                prev.status
            );
            let (_, prev_seq) = row_of[&prev.id.expect("id")];
            let (_, next_seq) = row_of[&next.id.expect("id")];
            // After a success comes the next row; after a 500, the same row again.
            let want = if prev.status == 200 {
                prev_seq + 1
            } else {
                prev_seq
            };
            assert_eq!(
                next_seq, want,
                "{key}: after row {:?} (#{prev_seq}, status {}) came row {:?} (#{next_seq})",
                prev.id, prev.status, next.id
            );
        }
        let delivered: Vec<i64> = list
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| r.id.expect("id"))
            .collect();
        assert_eq!(delivered.len(), per_key, "{key}");
        assert!(
            delivered.windows(2).all(|w| w[0] < w[1]),
            "{key}: deliveries out of id order: {delivered:?}"
        );
        assert_eq!(row_of[&delivered[0]].1, 0, "{key} started with a later row");
    }
}

/// A key whose head waits for a retry holds back only that key: during most retry waits,
/// other keys were delivered (near the end, few other keys may be left).
fn assert_retries_hold_back_one_key(
    db: Db,
    reqs: &[Received],
    by_row: &HashMap<i64, Vec<&Received>>,
) {
    let mut waits = 0;
    let mut others_moved = 0;
    for list in by_row.values() {
        for pair in list.windows(2) {
            let (from, to) = (pair[0].answered_at.expect("answered"), pair[1].at);
            waits += 1;
            if reqs
                .iter()
                .any(|r| r.status == 200 && r.at > from && r.at < to)
            {
                others_moved += 1;
            }
        }
    }
    eprintln!("{db:?}: other keys delivered during {others_moved} of {waits} retry waits");
    assert!(
        others_moved * 2 >= waits,
        "other keys were held back during retry waits: only {others_moved} of {waits} waits saw other deliveries"
    );
}
