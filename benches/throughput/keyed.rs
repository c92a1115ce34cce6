//! The leader section's keyed variations (issue 36, unkeyed rows among 200 keys, a key per
//! row, one hot key, and 200 keys written key by key): backlogs of ordering keys drained with
//! the defaults, each compared with unkeyed drains of as many rows, one right before each of its
//! own (and, printed beside, with the unkeyed main run). Rows take their keys round-robin, so
//! consecutive rows belong to different keys, and once the head of every key is in flight each
//! row left waits behind one (docs/performance.md, "Open"); the key-by-key case writes each
//! key's rows one after another.
//!
//! Why a drain of its own: the main run is minutes earlier, and this shared machine's speed
//! moves by a fifth within minutes; the same build's ratio against the main run moved from
//! 0.90x to 0.67x between two runs (docs/performance.md, "The latest runs").

use super::*;

/// One keyed backlog, and its target as a ratio to an unkeyed drain's rows/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KeyedCase {
    pub(crate) keys: usize,
    pub(crate) rows_per_key: usize,
    /// As many unkeyed rows again, one between each two keyed rows; the figure is then the
    /// unkeyed rows' rate, from the start until the last of them is sent.
    pub(crate) mixed: bool,
    /// Each key's rows one after another instead of round-robin ([`Rows::key_by_key`]).
    pub(crate) key_by_key: bool,
    /// The least ratio to an unkeyed drain's rows/s that meets the target.
    pub(crate) target: f64,
}

/// The cases of issue 36: 200 keys of 100 rows (at least 0.8x the unkeyed rate), 20 keys of
/// 1,000 rows (at least 0.3x), and unkeyed rows mixed into a backlog of 20 keys of 1,000 rows,
/// which should not slow them (taken as at least 0.9x).
pub(crate) const KEYED_CASES: [KeyedCase; 3] = [
    KeyedCase {
        keys: 200,
        rows_per_key: 100,
        mixed: false,
        key_by_key: false,
        target: 0.8,
    },
    KeyedCase {
        keys: 20,
        rows_per_key: 1000,
        mixed: false,
        key_by_key: false,
        target: 0.3,
    },
    KeyedCase {
        keys: 20,
        rows_per_key: 1000,
        mixed: true,
        key_by_key: false,
        target: 0.9,
    },
];

/// Beyond issue 36's cases: a key per row (a key per aggregate, most aggregates with one
/// event), against the target of many keys. No target table column; printed and summarised.
pub(crate) const KEY_PER_ROW: KeyedCase = KeyedCase {
    keys: 20_000,
    rows_per_key: 1,
    mixed: false,
    key_by_key: false,
    target: 0.8,
};

/// 200 keys of 100 rows written key by key (each key's events in one go), where the issue's
/// case writes them round-robin: windows then pass a key's whole backlog at a time, and a
/// key's rows lie on pages of their own. No target column of its own; printed and
/// summarised against the same target as its round-robin twin.
pub(crate) const KEY_BY_KEY: KeyedCase = KeyedCase {
    keys: 200,
    rows_per_key: 100,
    mixed: false,
    key_by_key: true,
    target: 0.8,
};

/// Unkeyed rows mixed one for one into 200 keys of 100 rows: a keyed backlog of many keys,
/// whose first rows alone could fill a claim (docs/design.md, "Ordering keys: a keyed
/// share"). The issue's "not slowed by it" as for 20 keys; printed beside that case.
pub(crate) const MIXED_AMONG_MANY: KeyedCase = KeyedCase {
    keys: 200,
    rows_per_key: 100,
    mixed: true,
    key_by_key: false,
    target: 0.9,
};

/// A hot key: every row of one ordering key, sent one after another (one chatty aggregate,
/// a key chosen too coarse). No target: a key goes at its receiver's one-request-at-a-time
/// rate at best; printed and summarised, to compare runs.
pub(crate) const ONE_KEY: KeyedCase = KeyedCase {
    keys: 1,
    rows_per_key: 5_000,
    mixed: false,
    key_by_key: false,
    target: 0.0,
};

impl KeyedCase {
    /// `(target >= 0.8x)`, or that there is none.
    pub(crate) fn target_text(&self) -> String {
        match self.target {
            t if t > 0.0 => format!("(target >= {t:.1}x)"),
            _ => "(no target)".to_string(),
        }
    }

    /// `200 keys x 100 rows`, `unkeyed among 20 keys x 1000 rows`, `200 keys x 100 rows, key
    /// by key`.
    pub(crate) fn label(&self) -> String {
        let noun = if self.keys == 1 { "key" } else { "keys" };
        let keyed = format!("{} {noun} x {} rows", self.keys, self.rows_per_key);
        match (self.mixed, self.key_by_key) {
            (true, _) => format!("unkeyed among {keyed}"),
            (false, true) => format!("{keyed}, key by key"),
            (false, false) => keyed,
        }
    }

    /// The keyed rows, and as many unkeyed when mixed.
    fn rows(&self) -> usize {
        let keyed = self.keyed_rows();
        if self.mixed { 2 * keyed } else { keyed }
    }

    /// The keyed rows alone: as many as the case's figure counts, and its baseline drains.
    fn keyed_rows(&self) -> usize {
        self.keys * self.rows_per_key
    }
}

/// What one keyed variation measured: the means over its [`PAIRS`] pairs of drains.
#[derive(Debug, Clone)]
pub(crate) struct KeyedRun {
    pub(crate) case: KeyedCase,
    /// The whole table's last drain.
    pub(crate) run: RelayRun,
    /// The case's figure: rows/s of every row, or of the unkeyed rows when mixed.
    pub(crate) rows_per_sec: f64,
    /// The whole table's rows/s (keyed and unkeyed when mixed).
    pub(crate) whole_per_sec: f64,
    /// Mixed: the keyed rows sent by the time the last unkeyed row was (the last drain).
    pub(crate) keyed_meanwhile: Option<i64>,
    /// Rows/s of the unkeyed drains of as many rows as the figure counts, one right before
    /// each of the case's drains (`None` if they failed).
    pub(crate) baseline: Option<f64>,
}

impl KeyedRun {
    /// The figure against the unkeyed drains made beside it, or against `main` (the main
    /// run's rows/s) without them.
    pub(crate) fn ratio(&self, main: f64) -> f64 {
        self.rows_per_sec / self.baseline.unwrap_or(main)
    }

    /// The whole table's rows/s (keyed and unkeyed when mixed) against the same baseline.
    pub(crate) fn whole_ratio(&self, main: f64) -> f64 {
        self.whole_per_sec / self.baseline.unwrap_or(main)
    }
}

/// Pairs of drains (an unkeyed one, then the case's) for a case with a target: one drain's
/// rows/s moves by up to a sixth between drains a minute apart on these machines, and the
/// ratio of two means by less. The other cases (a key per row, one key) get one pair.
const PAIRS: usize = 2;

/// Runs every case of [`KEYED_CASES`] on `db`, prints each, and keeps them in the section.
pub(crate) async fn keyed_variations(s: &mut Section, url: &str, receiver: &Receiver) {
    let db = s.db;
    let (batch, in_flight) = relay_defaults();
    for case in KEYED_CASES
        .into_iter()
        .chain([MIXED_AMONG_MANY, KEY_BY_KEY, KEY_PER_ROW, ONE_KEY])
    {
        let pairs = if KEYED_CASES.contains(&case) || case == MIXED_AMONG_MANY {
            PAIRS
        } else {
            1
        };
        let (mut baselines, mut runs) = (Vec::new(), Vec::new());
        for _ in 0..pairs {
            // An unkeyed drain of as many rows, with the defaults, as the main run's.
            let unkeyed = RunConfig {
                sink_concurrency: None,
                ..RunConfig::new(batch, in_flight)
            };
            match relay_run(db, url, receiver, case.keyed_rows(), unkeyed).await {
                Ok(run) => {
                    print_relay(db, "keyed", &run);
                    baselines.push(run.rows_per_sec);
                }
                Err(e) => {
                    let what = format!("unkeyed baseline of {}", case.label());
                    run_failed(db, "keyed", &what, &e, &mut s.errors);
                }
            }
            match keyed_run(db, url, receiver, case).await {
                Ok(k) => {
                    print_relay(db, "keyed", &k.run);
                    runs.push(k);
                }
                Err(e) => run_failed(db, "keyed", &case.label(), &e, &mut s.errors),
            }
        }
        let figures: Vec<f64> = runs.iter().map(|r| r.rows_per_sec).collect();
        let wholes: Vec<f64> = runs.iter().map(|r| r.whole_per_sec).collect();
        let (Some(mut k), Some(figure), Some(whole)) =
            (runs.last().cloned(), mean(&figures), mean(&wholes))
        else {
            continue;
        };
        (k.rows_per_sec, k.whole_per_sec) = (figure, whole);
        k.baseline = mean(&baselines);
        let main = s.main.as_ref().map(|m| m.rows_per_sec);
        println!("{}", keyed_line(db, &k, runs.len(), main));
        s.keyed.push(k);
    }
}

/// `  mysql    keyed     200 keys x 100 rows: 11686 rows/s, 0.78x unkeyed drains of as many
/// rows beside it (14982 rows/s), 0.61x the main run (target >= 0.8x); means of 2 drains`.
fn keyed_line(db: Db, k: &KeyedRun, drains: usize, main: Option<f64>) -> String {
    let meanwhile = k
        .keyed_meanwhile
        .map(|n| format!(" ({n} keyed rows sent meanwhile)"))
        .unwrap_or_default();
    let baseline = k.baseline.map_or("-".into(), |b| {
        format!(
            "{:.2}x unkeyed drains of as many rows beside it ({b:.0} rows/s)",
            k.rows_per_sec / b
        )
    });
    let main = main.map_or("-".into(), |m| format!("{:.2}x", k.rows_per_sec / m));
    let drains = match drains {
        1 => "one drain each".to_string(),
        n => format!("means of {n} drains"),
    };
    format!(
        "  {:<8} keyed     {}: {:.0} rows/s{meanwhile}, {baseline}, {main} the main run {}; \
         {drains}",
        db.name(),
        k.case.label(),
        k.rows_per_sec,
        k.case.target_text()
    )
}

/// One case on its own table: the relay with the defaults (as the main run) drains it.
async fn keyed_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    case: KeyedCase,
) -> anyhow::Result<KeyedRun> {
    let (batch, in_flight) = relay_defaults();
    let config = RunConfig {
        sink_concurrency: None,
        rows: Rows {
            keys: case.keys,
            mixed: case.mixed,
            key_by_key: case.key_by_key,
            ..Rows::default()
        },
        ..RunConfig::new(batch, in_flight)
    };
    let n = case.rows();
    on_own_table(db, url, "keyed", async |table| {
        let run = relay_run_on(db, url, table, receiver, n, config).await?;
        if !case.mixed {
            let rows_per_sec = run.rows_per_sec;
            return Ok(KeyedRun {
                case,
                run,
                rows_per_sec,
                whole_per_sec: rows_per_sec,
                keyed_meanwhile: None,
                baseline: None,
            });
        }
        let (rows_per_sec, meanwhile) = unkeyed_rate(db, url, table, n, run.rows_per_sec).await?;
        Ok(KeyedRun {
            case,
            rows_per_sec,
            whole_per_sec: run.rows_per_sec,
            run,
            keyed_meanwhile: Some(meanwhile),
            baseline: None,
        })
    })
    .await
}

/// On a drained mixed table of `n` rows, half of them unkeyed, that drained at
/// `rows_per_sec`: the unkeyed rows' rate (the run's time less the time from the last unkeyed
/// row's send to the last row's, both by the database's clock, `sent_at`), and how many keyed
/// rows were sent by the last unkeyed one.
pub(crate) async fn unkeyed_rate(
    db: Db,
    url: &str,
    table: &str,
    n: usize,
    rows_per_sec: f64,
) -> anyhow::Result<(f64, i64)> {
    let (after_last, meanwhile) = after_last_unkeyed(db, url, table).await?;
    let elapsed = (n as f64 / rows_per_sec - after_last.max(0.0)).max(1e-6);
    Ok(((n / 2) as f64 / elapsed, meanwhile))
}

/// On a drained mixed table: the seconds from the last unkeyed row's `sent_at` to the last
/// row's, and how many keyed rows were sent by then.
async fn after_last_unkeyed(db: Db, url: &str, table: &str) -> anyhow::Result<(f64, i64)> {
    let epoch = |t: &str| match db {
        Db::Postgres => format!("EXTRACT(EPOCH FROM {t})::float8"),
        Db::MySql => format!("(UNIX_TIMESTAMP({t}) * 1e0)"),
        Db::Sqlite => format!("((julianday({t}) - 2440587.5) * 86400.0)"),
    };
    let last_unkeyed = format!("(SELECT MAX(sent_at) FROM {table} WHERE ordering_key IS NULL)");
    let sql = format!(
        "SELECT {} - {}, COUNT(CASE WHEN ordering_key IS NOT NULL AND sent_at <= {last_unkeyed} THEN 1 END) FROM {table}",
        epoch("MAX(sent_at)"),
        epoch(&last_unkeyed),
    );
    let store = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(store.pool())
        .await;
    store.pool().close().await;
    let row = row.context("the mixed table's send times")?;
    Ok((row.try_get::<f64, _>(0)?, row.try_get::<i64, _>(1)?))
}
