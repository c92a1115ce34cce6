//! The one-table summary: every figure the performance targets are stated in, per database,
//! as markdown to paste into the README.

use super::*;

/// CPU microseconds per row: this process (relay, and receiver when in process) / the
/// database server / the rest (the Node receiver when used, other work), from a run's CPU
/// shares and rate.
fn cpu_per_row(cpu: Option<CpuShares>, rows_per_sec: f64, cores: usize) -> String {
    match cpu {
        Some(c) if rows_per_sec > 0.0 => {
            let us = |share: f64| share * cores as f64 * 1e6 / rows_per_sec;
            format!(
                "{:.0} / {:.0} / {:.0}",
                us(c.own),
                us(c.server),
                us(c.rest())
            )
        }
        _ => "-".into(),
    }
}

/// Prints the markdown summary: throughput against the receiver's ceiling, statements and
/// CPU per row, latency, and claim-mode scaling.
pub(crate) fn print_markdown(
    sections: &[Section],
    claims: &[ClaimSection],
    latencies: &[(Db, Vec<Latency>, Option<UnderBacklog>)],
    memory: &[(Db, Rss)],
    starts: &[(Db, Start)],
    idles: &[(Db, f64)],
    cores: usize,
) {
    println!();
    println!(
        "== markdown summary (defaults; share = relay rows/s / receiver ceiling measured in this run with no database (the header says by which client: wrk at the best of several connection counts when installed, else the bench's own client with the same sends at once), the mean of the ceilings measured right before and right after the main run (for the relay binary's columns: before its first and after its second run); CPU = microseconds per row of this process (relay, and receiver when in process) / of the database server / of the rest (the Node receiver when used, other work); latency = commit of a one-row transaction to its arrival at the receiver, p50 / p99 / max; under a backlog = rows committed one by one while the main run's backlog drains: the worst commit-to-arrival time and the most backlog rows sent between a row's commit and its arrival; RSS = the release binary run as its own process with the defaults, idle, and at its peak draining a backlog; started on a backlog = the release binary with the defaults and the database lease, started on a table already holding the main run's rows: spawn to first send, and rows/s from the spawn; then on five times as many rows of 20 ordering keys: rows/s from the spawn, and its ratio to the unkeyed start; idle = the release binary with the defaults on an empty table, statements per second as the database server counts them (PostgreSQL: transactions; MariaDB: Questions, BEGIN and COMMIT included; SQLite: no server))"
    );
    println!();
    println!(
        "| database | receiver ceiling (req/s; {}): before / after the main run; around the binary's runs (own client around the main run) | relay (rows/s) | share of ceiling | statements / row | CPU µs / row: bench process / database server / rest | latency at 100 rows/s (ms) | latency at 1,000 rows/s (ms) | a row committed under a backlog: worst wait, backlog rows sent first | relay binary as its own process (rows/s, share) | relay binary started on a backlog: first send (ms), rows/s (share); on a keyed backlog: rows/s, x the unkeyed | RSS of the relay binary, idle / peak (MiB) | idle relay binary: statements / s at the server |",
        CeilingClient::get().label()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for s in sections.iter().filter(|s| s.skipped.is_none()) {
        print_leader_line(s, latencies, memory, starts, idles, cores);
    }
    print_targets(sections, latencies, memory);
    if !claims.is_empty() {
        print_claim_table(claims);
    }
    println!();
}

/// One database's line of the leader table.
fn print_leader_line(
    s: &Section,
    latencies: &[(Db, Vec<Latency>, Option<UnderBacklog>)],
    memory: &[(Db, Rss)],
    starts: &[(Db, Start)],
    idles: &[(Db, f64)],
    cores: usize,
) {
    let latency = latencies.iter().find(|(db, ..)| *db == s.db);
    let lat = |rate: u32| {
        latency
            .and_then(|(_, runs, _)| runs.iter().find(|l| l.rate == rate))
            .map_or("-".to_string(), |l| l.cell())
    };
    let under_backlog = latency
        .and_then(|(.., u)| u.as_ref())
        .map_or("-".to_string(), |u| u.cell());
    let (rate, share, stmts, cpu) = match &s.main {
        Some(r) => (
            format!("{:.0}", r.rows_per_sec),
            s.ceiling.filter(|c| *c > 0.0).map_or("-".into(), |c| {
                format!("{:.0}%", r.rows_per_sec / c * 100.0)
            }),
            format!("{:.3}", r.statements_per_row()),
            cpu_per_row(r.cpu, r.rows_per_sec, cores),
        ),
        None => ("-".into(), "-".into(), "-".into(), "-".into()),
    };
    let of_ceiling = |rows_per_sec: f64, ceiling: Option<f64>| match ceiling
        .or(s.ceiling)
        .filter(|c| *c > 0.0)
    {
        Some(c) => format!("{rows_per_sec:.0} ({:.0}%)", rows_per_sec / c * 100.0),
        None => format!("{rows_per_sec:.0}"),
    };
    let fmt_ceiling = |c: Option<f64>| c.map_or("-".to_string(), |c| format!("{c:.0}"));
    let rss = memory.iter().find(|(db, _)| *db == s.db).map(|(_, r)| r);
    let own = match CeilingClient::get() {
        CeilingClient::Wrk => format!(" ({})", fmt_ceiling(s.own_ceiling)),
        CeilingClient::Own => String::new(),
    };
    let ceilings = format!(
        "{} / {}; {}{own}",
        fmt_ceiling(s.ceilings.0),
        fmt_ceiling(s.ceilings.1),
        fmt_ceiling(rss.and_then(|r| r.ceiling))
    );
    println!(
        "| {} | {ceilings} | {rate} | {share} | {stmts} | {cpu} | {} | {} | {under_backlog} | {} | {} | {} | {} |",
        s.db.name(),
        lat(100),
        lat(1000),
        rss.map_or("-".into(), |r| of_ceiling(r.rows_per_sec, r.ceiling)),
        starts
            .iter()
            .find(|(db, _)| *db == s.db)
            .map_or("-".into(), |(_, r)| format!(
                "{:.0}, {}{}",
                r.first_send.as_secs_f64() * 1000.0,
                of_ceiling(r.rows_per_sec, r.ceiling),
                r.keyed.map_or(String::new(), |(n, keyed)| format!(
                    "; {n} rows of {KEYED_START_KEYS} keys: {keyed:.0}, {:.2}x",
                    keyed / r.rows_per_sec
                ))
            )),
        rss.map_or("-".into(), |r| format!(
            "{:.1} / {:.1}",
            r.idle_kib as f64 / 1024.0,
            r.peak_kib as f64 / 1024.0
        )),
        idles
            .iter()
            .find(|(db, _)| *db == s.db)
            .map_or("-".into(), |(_, n)| format!("{n:.1}")),
    );
}

/// The claim-mode table: rows/s by instances, unkeyed and against a slow receiver; unkeyed rows
/// mixed into a keyed backlog, against unkeyed rows alone.
fn print_claim_table(claims: &[ClaimSection]) {
    println!();
    println!(
        "| database, claim mode | 1 instance (rows/s) | 2 instances | 3 instances | 3 / 1 | receiver answering after 20 ms: 1 instance | 3 instances | 3 / 1 | unkeyed rows mixed into 200 keys, x unkeyed alone (keyed rows sent first): 2 instances / 3 instances |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in claims {
        let at = |n: usize| c.unkeyed(n).map(|r| r.rows_per_sec);
        let cell = |n: usize| at(n).map_or("-".into(), |v| format!("{v:.0}"));
        let ratio = match (at(3), at(1)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let slow = |n: usize| {
            c.slow
                .iter()
                .find(|r| r.instances == n)
                .map(|r| r.rows_per_sec)
        };
        let slow_ratio = match (slow(3), slow(1)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let mixed = |n: usize| {
            c.mixed(n)
                .map_or("-".into(), |(x, first)| format!("{x:.2}x ({first})"))
        };
        println!(
            "| {} | {} | {} | {} | {ratio} | {} | {} | {slow_ratio} | {} / {} |",
            c.db.name(),
            cell(1),
            cell(2),
            cell(3),
            fmt(slow(1)),
            fmt(slow(3)),
            mixed(2),
            mixed(3),
        );
    }
}
