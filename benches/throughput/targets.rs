//! The table of the targets (issue 36): each figure of one run beside its target, as a
//! ratio where the machine's speed would move an absolute figure.

use super::*;

/// The share of the receiver's ceiling one instance with the defaults should reach.
fn share_target(db: Db) -> f64 {
    match db {
        Db::MySql => 0.40,
        Db::Postgres | Db::Sqlite => 0.50,
    }
}

/// The commit-to-arrival p99 the latency runs should stay within (NOTIFY on PostgreSQL, the
/// newest-id check elsewhere).
fn p99_target(db: Db) -> Duration {
    match db {
        Db::Postgres => Duration::from_millis(10),
        Db::MySql | Db::Sqlite => Duration::from_millis(100),
    }
}

/// At most this many of the relay's statements per delivered row.
const STATEMENTS_PER_ROW: f64 = 0.02;
/// The release binary's resident memory, idle and at its peak (bytes: 30 and 64 MB).
const RSS_IDLE: f64 = 30e6;
const RSS_PEAK: f64 = 64e6;

/// `figure, met` or `figure, NOT met`.
fn judged(figure: String, met: bool) -> String {
    format!("{figure}, {}", if met { "met" } else { "NOT met" })
}

/// Prints the targets table: one line per database of the leader section.
pub(crate) fn print_targets(
    sections: &[Section],
    latencies: &[(Db, Vec<Latency>, Option<UnderBacklog>)],
    memory: &[(Db, Rss)],
) {
    let [wide, narrow, mixed] = KEYED_CASES;
    println!();
    println!(
        "| database, against the targets | relay / receiver ceiling (target) | {} / unkeyed drains of as many rows beside it (>= {:.1}x); in brackets, written key by key | {} (>= {:.1}x) | {}: their rows/s / the unkeyed drains' (>= {:.1}x), then among 200 keys x 100; in brackets, every row's (keyed and unkeyed) | tracing on / off | statements / row (<= {STATEMENTS_PER_ROW}) | commit to arrival, worst p99 (<= 10 ms on PostgreSQL, 100 ms elsewhere) | RSS idle / peak (<= 30 / 64 MB) |",
        wide.label(),
        wide.target,
        narrow.label(),
        narrow.target,
        mixed.label(),
        mixed.target
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for s in sections.iter().filter(|s| s.skipped.is_none()) {
        let main = s.main.as_ref().map(|r| r.rows_per_sec);
        let share = match (main, s.ceiling) {
            (Some(r), Some(c)) if c > 0.0 => judged(
                format!("{:.0}% ({:.0}%)", r / c * 100.0, share_target(s.db) * 100.0),
                r / c >= share_target(s.db),
            ),
            _ => "-".into(),
        };
        let keyed = |case: KeyedCase| match (s.keyed.iter().find(|k| k.case == case), main) {
            (Some(k), Some(m)) if m > 0.0 => {
                judged(format!("{:.2}x", k.ratio(m)), k.ratio(m) >= case.target)
            }
            _ => "-".into(),
        };
        // The mixed table's drain as a whole: the unkeyed rows share the relay with keyed
        // rows as old as they are. Each case against the unkeyed drains made beside it
        // (`KeyedRun::ratio`), the main run only if those drains failed.
        let mixed_cell = match (s.keyed.iter().find(|k| k.case == mixed), main) {
            (Some(k), Some(m)) if m > 0.0 => {
                format!("{} ({:.2}x)", keyed(mixed), k.whole_ratio(m))
            }
            _ => keyed(mixed),
        };
        // The same among 200 keys of 100 rows, after it.
        let mixed_cell = match (s.keyed.iter().find(|k| k.case == MIXED_AMONG_MANY), main) {
            (Some(k), Some(m)) if m > 0.0 => format!(
                "{mixed_cell}; among 200 keys x 100: {} ({:.2}x)",
                keyed(MIXED_AMONG_MANY),
                k.whole_ratio(m)
            ),
            _ => mixed_cell,
        };
        // The wide case written key by key, against the same target, in brackets.
        let wide_cell = match (s.keyed.iter().find(|k| k.case == KEY_BY_KEY), main) {
            (Some(k), Some(m)) if m > 0.0 => {
                format!("{} ({:.2}x)", keyed(wide), k.ratio(m))
            }
            _ => keyed(wide),
        };
        let tracing = s
            .tracing
            .map_or("-".into(), |(off, on)| format!("{:.2}x", on / off));
        let stmts = s.main.as_ref().map_or("-".into(), |r| {
            let per_row = r.statements_per_row();
            judged(format!("{per_row:.3}"), per_row <= STATEMENTS_PER_ROW)
        });
        println!(
            "| {} | {share} | {} | {} | {} | {tracing} | {stmts} | {} | {} |",
            s.db.name(),
            wide_cell,
            keyed(narrow),
            mixed_cell,
            worst_p99(s.db, latencies),
            rss_cell(s.db, memory),
        );
    }
}

/// The worse p99 of the database's latency runs, judged; `-` without them (Node's receiver).
fn worst_p99(db: Db, latencies: &[(Db, Vec<Latency>, Option<UnderBacklog>)]) -> String {
    latencies
        .iter()
        .find(|(d, ..)| *d == db)
        .and_then(|(_, runs, _)| runs.iter().map(|l| l.p99).max())
        .map_or("-".into(), |p99| {
            judged(
                format!("{:.1} ms", p99.as_secs_f64() * 1000.0),
                p99 <= p99_target(db),
            )
        })
}

/// The binary's resident memory idle / at its peak (MiB), judged against 30 and 64 MB.
fn rss_cell(db: Db, memory: &[(Db, Rss)]) -> String {
    memory
        .iter()
        .find(|(d, _)| *d == db)
        .map_or("-".into(), |(_, r)| {
            let (idle, peak) = (r.idle_kib as f64 * 1024.0, r.peak_kib as f64 * 1024.0);
            judged(
                format!("{:.1} / {:.1} MiB", idle / 1048576.0, peak / 1048576.0),
                idle <= RSS_IDLE && peak <= RSS_PEAK,
            )
        })
}
