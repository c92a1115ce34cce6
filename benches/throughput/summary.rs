//! The plain-text summaries printed before the markdown tables.

use super::*;

/// The plain-text summaries of the leader and claim sections; `false` when a run failed.
pub(crate) fn print_summary(plan: &Plan, figures: &Figures, bench_started: Instant) -> bool {
    let sections = &figures.sections;
    if !sections.is_empty() {
        println!(
            "== summary (leader section {:.0}s, bench total {:.0}s; relay = rows/s until all SUCCESS in the database; naive = select-one/POST/update-one loop on the same database over fewer rows; ceiling = POSTs alone, no database: {}; own = the bench's own client, {DEFAULT_SINK_CONCURRENCY} POSTs at once)",
            figures.leader_secs,
            bench_started.elapsed().as_secs_f64(),
            CeilingClient::get().label()
        );
    }
    let mut ok = true;
    for s in sections {
        ok &= print_section_summary(s);
    }
    if !sections.is_empty() {
        println!(
            "* sink concurrency left at its default ({DEFAULT_SINK_CONCURRENCY}): the sends at once, with up to as many rows claimed ahead while relay slots are free; elsewhere it is set to max_in_flight."
        );
    }
    if !figures.claim_sections.is_empty() {
        println!(
            "== claim summary ({:.0}s; rows/s until all SUCCESS; N inst = N claim-mode relays in this process, each with its own pool, sinks, instance id and receiver path; (x) = ratio to 1 inst in this run; shares = requests per instance a/b/c; ordering = rows with {ORDERING_KEYS} ordering keys round-robin vs unkeyed rows, same instance count)",
            figures.claim_secs
        );
        for s in &figures.claim_sections {
            ok &= print_claim_summary(s);
        }
        println!(
            "note: the claim-mode instances share this machine's {} CPU(s) with each other, the database server and the receiver: 2 and 3 instances add contention on the SQL claim path and its locks, not CPUs, so the ratios show how the claim path scales (or degrades) under concurrency, not what more machines would give.",
            plan.cores
        );
    }
    ok
}

/// One database's leader-section summary; `false` when a run failed.
fn print_section_summary(s: &Section) -> bool {
    if let Some(why) = &s.skipped {
        println!("{:<9} skipped: {why}", s.db.name());
        return true;
    }
    let relay = s.main.as_ref().map(|r| r.rows_per_sec);
    let fmt_rate = |r: Option<f64>| r.map(|v| format!("{v:.0}")).unwrap_or("-".into());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    let naive = s.naive.as_ref().map(|r| r.rows_per_sec);
    let stmts = s
        .main
        .as_ref()
        .map(|r| format!("{:.4}", r.statements_per_row()))
        .unwrap_or("-".into());
    println!(
        "{:<9} relay {} rows/s  naive {} rows/s  relay/naive {}  ceiling {} rows/s (own {})  relay/ceiling {}  statements/row {stmts}{}",
        s.db.name(),
        fmt_rate(relay),
        fmt_rate(naive),
        ratio(relay, naive),
        fmt_rate(s.ceiling),
        fmt_rate(s.own_ceiling),
        ratio(relay, s.ceiling),
        xacts_per_row(s.main.as_ref()),
    );
    for v in &s.variations {
        println!(
            "{:<9}   {}: {:>6.0} rows/s  statements/row {:.4}{}",
            "",
            relay_config(v),
            v.rows_per_sec,
            v.statements_per_row(),
            xacts_per_row(Some(v)),
        );
    }
    for k in &s.keyed {
        let baseline = k.baseline.map_or("-".into(), |b| {
            format!("{:.2}x unkeyed drains of as many rows", k.rows_per_sec / b)
        });
        println!(
            "{:<9}   {}: {:>6.0} rows/s, {baseline}, {} the main run {}",
            "",
            k.case.label(),
            k.rows_per_sec,
            ratio(Some(k.rows_per_sec), relay),
            k.case.target_text()
        );
    }
    let keyed = s.keyed.iter().map(|k| &k.run);
    for r in s.main.iter().chain(&s.variations).chain(keyed) {
        if r.received != r.rows as u64 {
            println!(
                "{:<9}   NOTE: receiver counted {} requests for {} rows ({})",
                "",
                r.received,
                r.rows,
                relay_config(r)
            );
        }
    }
    for e in &s.errors {
        println!("{:<9}   ERROR {e}", s.db.name());
    }
    s.errors.is_empty()
}

/// `  xacts/row N` for a run that has the figure (PostgreSQL), else nothing.
fn xacts_per_row(r: Option<&RelayRun>) -> String {
    r.and_then(|r| r.xacts_per_row())
        .map(|x| format!("  xacts/row {x:.4}"))
        .unwrap_or_default()
}
