//! The leader section's `tracing` variation (issue 38; docs/tracing.md, "Overhead"): the main
//! configuration drained with `[tracing]` off and on, alternately, in the same run, the spans
//! going to a loopback OTLP collector the bench starts (`support::otlp`, which decodes them as
//! a collector would). Every row has no writer's context, so each attempt starts a trace:
//! the most spans tracing makes.

use super::*;

/// Alternate drains per setting: the machine's drift between runs falls on both.
const PAIRS: usize = 2;

/// Runs [`PAIRS`] pairs of drains of half the main run's rows (at least 1,000), off then on,
/// prints each and the ratio of the means, and keeps them with the section's variations.
pub(crate) async fn tracing_overhead(
    s: &mut Section,
    url: &str,
    receiver: &Receiver,
    main_rows: usize,
) {
    let db = s.db;
    let (batch, in_flight) = relay_defaults();
    let rows = (main_rows / 2).max(1000);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        for tracing in [false, true] {
            let config = RunConfig {
                sink_concurrency: None,
                tracing,
                ..RunConfig::new(batch, in_flight)
            };
            match relay_run(db, url, receiver, rows, config).await {
                Ok(r) => {
                    print_relay(db, "variation", &r);
                    if tracing { &mut on } else { &mut off }.push(r.rows_per_sec);
                    s.variations.push(r);
                }
                Err(e) => run_failed(db, "variation", "tracing", &e, &mut s.errors),
            }
        }
    }
    if let (Some(off), Some(on)) = (mean(&off), mean(&on)) {
        s.tracing = Some((off, on));
        println!(
            "  {:<8} tracing   {rows} rows, {PAIRS} alternate drains each: off {off:.0} rows/s, on {on:.0} rows/s ({:.2}x)",
            db.name(),
            on / off
        );
    }
}
