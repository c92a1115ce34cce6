//! An idle relay's read over rows that wait for a later time (docs/design.md, "Idle cost").

use super::*;
use crate::support::plans::sqlite_plan;

/// As an idle relay polls (`Queue::probe`): the statements it took and whether it found
/// anything claimable.
async fn probe(store: &SqlStore) -> (u64, bool) {
    let before = store.statements();
    let found = match bounded("probe", store.probe(&request(8, LONG, "a", None))).await {
        Probe::Claimable => true,
        Probe::Nothing { .. } => false,
    };
    (store.statements() - before, found)
}

/// SQLite, schema version 10: over rows waiting for a retry an hour away, an idle read after
/// the first is one seek of `next_attempt_idx` (the plan searches the index, it scans
/// nothing), not a walk of every waiting row. A `next_attempt_at` that is not a time, which
/// the claim counts as due, is still found: at once when it sorts above the times (text
/// starting with a letter), and by the read of the picks that the first idle read (and one
/// a minute) makes otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_idle_reads_seek_an_index_of_due_times() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_idle").await else {
        return;
    };
    td.exec(
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 2000) \
         INSERT INTO {t} (channel, payload, status, next_attempt_at) \
         SELECT 'hook', '{}', 'RETRY', strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour') FROM s",
    )
    .await;
    // As `sqlite::anything_due` asks it.
    let seek = |range: &str| {
        format!(
            "SELECT 1 FROM (SELECT 1 FROM {t} INDEXED BY {t}_next_attempt_idx \
             WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at {range} LIMIT 1)",
            t = td.table
        )
    };
    let both = format!(
        "{} UNION ALL {} LIMIT 1",
        seek("<= strftime('%Y-%m-%d %H:%M:%f','now')"),
        seek(">= '9999'")
    );
    let plan = sqlite_plan(&td.store, &both).await;
    // Both ranges are seeks of the index; nothing of the table is scanned (only each
    // subquery's one row at most).
    let seeks = plan
        .iter()
        .filter(|s| s.starts_with("SEARCH") && s.contains("next_attempt_idx (next_attempt_at"))
        .count();
    assert_eq!(seeks, 2, "{plan:?}");
    assert!(
        !plan
            .iter()
            .any(|s| s.starts_with(&format!("SCAN {}", td.table))),
        "{plan:?}"
    );

    let store = &td.store;
    assert_eq!(probe(store).await, (1, false), "the first read: the picks");
    assert_eq!(probe(store).await, (1, false), "then: the index alone");
    let due = td.enqueue("hook", "{}", None).await;
    assert_eq!(
        probe(store).await,
        (2, true),
        "a due row: the index, then the picks"
    );
    td.exec(&format!("DELETE FROM {{t}} WHERE id = {due}"))
        .await;
    assert_eq!(probe(store).await, (1, false));

    // Not a time, above the times: the seek finds it.
    td.exec("UPDATE {t} SET next_attempt_at = 'soon' WHERE id = (SELECT MIN(id) FROM {t})")
        .await;
    assert_eq!(probe(store).await, (2, true));
    // Not a time, among the times: the seek cannot see it, the read of the picks can (a
    // fresh store's first idle read makes one), and the claim takes it.
    td.exec("UPDATE {t} SET next_attempt_at = '2099-13-45' WHERE next_attempt_at = 'soon'")
        .await;
    let fresh = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("second store");
    assert_eq!(probe(&fresh).await, (1, true));
    let (_, rows) = claim(&fresh, 8, LONG, "a", None).await;
    assert_eq!(rows.len(), 1);
    td.drop_table().await;
}

/// An idle relay's polls of one store, fenced by lease `lease`.
struct Poller<'a> {
    td: &'a TestDb,
    lease: String,
}

impl Poller<'_> {
    /// The request, as the relay asks: per-channel budgets with a newest share, and the
    /// other channels.
    fn poll(&self, epoch: i64) -> ClaimRequest {
        ClaimRequest {
            tails: Vec::new(),
            trace: false,
            budgets: Some(Budgets {
                channels: vec![("hook".into(), 8), ("log".into(), 8)],
                others: Some((vec!["hook".into(), "log".into()], 2)),
                starts: None,
            }),
            newest: true,
            ..request(
                18,
                LONG,
                "a",
                Some(Fence {
                    lease: self.lease.clone(),
                    epoch,
                }),
            )
        }
    }

    /// As the relay polls: the read, and the claim only if the read found something; the
    /// statements it took and the rows claimed.
    async fn statements_of(&self, req: &ClaimRequest) -> (u64, Vec<ClaimedRow>) {
        let store = &self.td.store;
        let before = store.statements();
        let probe = bounded("probe", store.probe(req)).await;
        let rows = match probe {
            Probe::Claimable => bounded("claim", store.claim(req)).await,
            Probe::Nothing { .. } => Vec::new(),
        };
        (store.statements() - before, rows)
    }

    /// How long until a waiting row comes due, as the read says: PostgreSQL only.
    async fn quiet(&self, req: &ClaimRequest) -> Duration {
        match bounded("probe", self.td.store.probe(req)).await {
            Probe::Nothing { quiet_for } => quiet_for,
            Probe::Claimable => panic!("nothing is claimable"),
        }
    }

    /// On PostgreSQL a claim's fence takes a shared lock on the lease row (its xmax becomes
    /// the claim's transaction id); the read takes none. `None` elsewhere.
    async fn lease_xmax(&self) -> Option<i64> {
        if self.td.db != Db::Postgres {
            return None;
        }
        let sql = format!(
            "SELECT xmax::text::bigint FROM outbox_relay_lease WHERE name = '{}'",
            self.lease
        );
        Some(self.td.scalar(&sql).await)
    }
}

/// Rows that are not claimable: finished, retrying in an hour, under another live claim
/// (claimer `b`'s). Returns that claim's request and the three rows.
async fn unclaimable_rows(td: &TestDb) -> (ClaimRequest, [i64; 3]) {
    let done = td.enqueue("log", "{}", None).await;
    let later = td.enqueue("hook", "{}", None).await;
    let held = td.enqueue("other", "{}", None).await;
    let (req, rows) = claim(&*td.store, 3, LONG, "b", None).await;
    assert_eq!(ids(&rows), [done, later, held]);
    let results = [
        completion(&req, done, Resolution::Delivered),
        completion(
            &req,
            later,
            Resolution::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
    ];
    assert_eq!(complete(&*td.store, &results).await, 2);
    (req, [done, later, held])
}

/// With the retry in an hour the next row due: PostgreSQL's read says so, and makes no
/// promise over more waiting rows than it looks at; elsewhere no read promises anything.
async fn assert_quiet_until_the_retry(p: &Poller<'_>, epoch: i64) {
    let left = p.quiet(&p.poll(epoch)).await;
    if p.td.db != Db::Postgres {
        assert_eq!(left, Duration::ZERO);
        return;
    }
    assert!(
        (Duration::from_secs(3590)..=Duration::from_secs(3600)).contains(&left),
        "{left:?}"
    );
    // A thousand rows waiting (scheduled sends): the read looks at no more than that
    // many to say when the next is due, and with more makes no promise.
    p.td.exec(
        "INSERT INTO {t} (channel, payload, status, next_attempt_at) \
         SELECT 'hook', '{}', 'RETRY', now() + interval '1 day' FROM generate_series(1, 1000)",
    )
    .await;
    assert_eq!(p.quiet(&p.poll(epoch)).await, Duration::ZERO);
    p.td.exec("DELETE FROM {t} WHERE next_attempt_at > now() + interval '2 hours'")
        .await;
}

per_db!(an_idle_poll_reads_before_it_claims);
/// `Queue::probe` (an idle relay's poll, which claims only when it says so): one plain read
/// when nothing is claimable, whatever the table holds that is not (a retry not yet due, a
/// live claim, a finished row); the claim after it fenced as ever. On PostgreSQL the read
/// also says how long until a waiting row comes due.
async fn an_idle_poll_reads_before_it_claims(db: Db) {
    let Some(td) = TestDb::open(db, "st_probe").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    let epoch = bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "a", Duration::from_secs(30)),
    )
    .await
    .expect("free lease is acquired");
    let p = Poller {
        td: &td,
        lease: lease.clone(),
    };
    let xmax = p.lease_xmax().await;
    let (n, rows) = p.statements_of(&p.poll(epoch)).await;
    assert!(rows.is_empty());
    assert_eq!(n, 1, "an empty table costs one read");
    let nothing_waits = match db {
        Db::Postgres => Duration::MAX,
        _ => Duration::ZERO,
    };
    assert_eq!(p.quiet(&p.poll(epoch)).await, nothing_waits);

    // Rows that are not claimable: finished, retrying later, under another live claim.
    let (req, [_, later, held]) = unclaimable_rows(&td).await;
    let (n, rows) = p.statements_of(&p.poll(epoch)).await;
    assert!(rows.is_empty(), "claimed {:?}", ids(&rows));
    // On MySQL and SQLite the read first asks an index whether any row is due at all (after
    // SQLite's first idle read, which reads the picks); the row due under a live claim says
    // "maybe", so the picks are read too.
    let reads = if db == Db::Postgres { 1 } else { 2 };
    assert_eq!(n, reads, "nothing claimable: the reads");
    if let Some(xmax) = xmax {
        assert_eq!(
            p.lease_xmax().await,
            Some(xmax),
            "an idle poll locked the lease row"
        );
    }
    assert!(row_is(&td, later, "claim_token IS NULL").await);
    // A row due but under a live claim: no promise. Given back for two hours, the retry in
    // one hour is the next row due.
    assert_eq!(p.quiet(&p.poll(epoch)).await, Duration::ZERO);
    let back = Resolution::Release {
        delay: Duration::from_secs(7200),
        error: None,
    };
    assert_eq!(complete(&*store, &[completion(&req, held, back)]).await, 1);
    assert_quiet_until_the_retry(&p, epoch).await;
    // Only rows waiting for a later time: one read (on MySQL and SQLite, of an index alone,
    // where the picks would read every waiting row; see `store::engines`, `store::idle`).
    let (n, rows) = p.statements_of(&p.poll(epoch)).await;
    assert!(rows.is_empty(), "claimed {:?}", ids(&rows));
    assert_eq!(n, 1, "rows waiting for later cost one read");

    // Something claimable in each pick: the claim goes on as without the read.
    let due = td.enqueue("hook", "{}", None).await;
    let stray = td.enqueue("unknown", "{}", None).await;
    let req = p.poll(epoch);
    let (n, rows) = p.statements_of(&req).await;
    assert_eq!(ids(&rows), [due, stray]);
    assert!(n >= 2, "the read, then the claim");
    if let Some(xmax) = xmax {
        let polled = p.lease_xmax().await;
        assert_ne!(polled, Some(xmax), "the claim's fence locked the lease row");
    }
    let token = req.token.to_string();
    assert!(row_is(&td, due, &format!("claim_token = '{token}'")).await);

    // The read is not fenced, the claim is: a stale epoch still claims nothing.
    let fresh = td.enqueue("log", "{}", None).await;
    let next = bounded("advance_epoch", store.advance_epoch(&lease, "c")).await;
    assert_eq!(next, epoch + 1);
    let (_, rows) = p.statements_of(&p.poll(epoch)).await;
    assert!(
        rows.is_empty(),
        "G2: a stale epoch claimed {:?}",
        ids(&rows)
    );
    assert!(row_is(&td, fresh, "claim_token IS NULL").await);
    td.drop_table().await;
}

per_db!(an_idle_read_that_finds_an_expired_claim_below_the_floor_leads_to_claiming_it);
/// A claim of an instance that died expires below this store's floor (the rows lie under
/// its picks' starting point): only a read that walks from the start finds them, at the
/// next full walk (at most `FULL_WALK_LONGEST`, 5 s, away; 500 ms here, where walks are
/// cheap). The idle read before it must leave that walk to the claim: when the
/// read took it, it said "claim", the claim with the floors found nothing, and so on at
/// every poll (a relay holding the lease and delivering nothing, in a chaos run).
async fn an_idle_read_that_finds_an_expired_claim_below_the_floor_leads_to_claiming_it(db: Db) {
    let Some(td) = TestDb::open(db, "st_probe_floor").await else {
        return;
    };
    let store = td.store.clone();
    let rows = td.enqueue_n("hook", "{}", 3).await;
    let poll = || ClaimRequest {
        tails: Vec::new(),
        trace: false,
        budgets: Some(Budgets {
            channels: vec![("hook".into(), 10)],
            others: None,
            starts: None,
        }),
        ..request(10, Duration::from_secs(1), "a", None)
    };
    // Claimed, and never finished (the instance died): the claim runs out at 1 s, and this
    // store's floor, learnt from the claim, is past them once the commit grace is over.
    let taken = bounded("claim", store.claim(&poll())).await;
    assert_eq!(ids(&taken), rows);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let req = poll();
    until_or(
        Duration::from_secs(6),
        async || bounded("probe", store.probe(&req)).await == Probe::Claimable,
        || "the idle reads never found the expired claims".into(),
    )
    .await;
    let again = bounded("claim", store.claim(&req)).await;
    assert_eq!(
        ids(&again),
        rows,
        "the read found the rows and the claim after it did not"
    );
    td.drop_table().await;
}
