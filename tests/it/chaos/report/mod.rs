//! The chaos run's verdict, computed from the table (what the rows became) and the receiver's
//! record (what arrived, from which instance, when, and whether it was accepted), against the
//! faults injected: no row lost, none stuck, every duplicate caused by a kill or a pause of the
//! instance that had the row's earlier delivery in flight, per-key order, and the figures.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::support::storm::{Hit, Storm};

/// A fault the run injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Kill9,
    Pause,
    Graceful,
    RedisRestart,
    DbRestart,
    Storm(Storm),
}

impl Kind {
    pub fn name(self) -> String {
        match self {
            Kind::Kill9 => "kill -9 + restart".into(),
            Kind::Pause => "SIGSTOP past the ttl + SIGCONT".into(),
            Kind::Graceful => "SIGTERM + restart (graceful)".into(),
            Kind::RedisRestart => "redis-server killed + restarted".into(),
            Kind::DbRestart => "database stopped + restarted".into(),
            Kind::Storm(s) => s.name().into(),
        }
    }
}

/// One injected fault: `at` when it struck, `end` when it was over (the process restarted or
/// continued, the service back, the storm calm).
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: Kind,
    /// The instance hit (kill, pause, graceful stop).
    pub slot: Option<u8>,
    /// The instance hit was the lease holder (leader mode: the last one delivering).
    pub holder: bool,
    /// For a kill: once the process was reaped; for a pause: once SIGSTOP was sent.
    pub at: Instant,
    pub end: Instant,
}

/// A row as the table has it at the end.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub seq: u64,
    pub key: Option<String>,
    pub status: String,
}

/// A request the instance wrote just before a kill or a SIGSTOP may be read by the receiver a
/// moment after it (the toolkit's fault tests allow the same 50 ms).
const ON_THE_WIRE: Duration = Duration::from_millis(50);

/// Bytes the HTTP client had handed to its connection just before a SIGSTOP arrive when the
/// process continues: requests of the paused instance arriving this soon after SIGCONT were
/// sent before the pause (the chaos runs saw them up to 80 ms after it).
const WAKE_SLACK: Duration = Duration::from_millis(300);

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub rows: usize,
    pub keyed_rows: usize,
    pub requests: usize,
    pub accepted: usize,
    pub committed_missing: Vec<u64>,
    pub lost: Vec<i64>,
    pub stuck: usize,
    pub failed: usize,
    /// Duplicates (accepted deliveries after a row's first) by cause.
    pub duplicates: BTreeMap<String, usize>,
    pub unaccounted: Vec<String>,
    /// Duplicates per fault (its index).
    pub per_fault: Vec<(usize, usize)>,
    pub over_bound: Vec<String>,
    pub order_violations: Vec<String>,
    pub faults: BTreeMap<Kind, usize>,
    pub requests_by_storm: BTreeMap<Storm, usize>,
    /// Commit (as the inserter saw it) to first arrival, and to first acceptance.
    pub max_wait_arrival: Duration,
    pub max_wait_accepted: Duration,
    /// The row that waited longest for its first acceptance: (id, key, seconds into the run
    /// when it was committed).
    pub slowest_row: Option<(i64, Option<String>, f64)>,
    /// (fault kind, seconds into the run, failover time) for kills and pauses of the holder:
    /// until the next request by another instance (after a kill: by any, the restarted one
    /// included).
    pub failovers: Vec<(Kind, f64, Option<Duration>)>,
    pub elapsed: Duration,
}

/// Inputs of [`analyze`].
pub struct Evidence<'a> {
    pub scenario: String,
    pub seed: u64,
    pub leader: bool,
    pub max_in_flight: usize,
    pub senders: &'a [&'a str],
    pub rows: &'a [Row],
    pub hits: &'a [Hit],
    pub faults: &'a [Fault],
    /// seq -> when the inserter's COMMIT returned.
    pub commits: &'a HashMap<u64, Instant>,
    pub t0: Instant,
}

pub fn analyze(ev: &Evidence) -> Report {
    let mut rep = Report {
        scenario: ev.scenario.clone(),
        seed: ev.seed,
        rows: ev.rows.len(),
        keyed_rows: ev.rows.iter().filter(|r| r.key.is_some()).count(),
        requests: ev.hits.len(),
        accepted: ev.hits.iter().filter(|h| h.accepted).count(),
        elapsed: ev.t0.elapsed(),
        ..Report::default()
    };
    for f in ev.faults {
        *rep.faults.entry(f.kind).or_insert(0) += 1;
    }
    for h in ev.hits {
        *rep.requests_by_storm.entry(h.storm).or_insert(0) += 1;
    }

    // Every row the inserter saw committed is in the table.
    let seqs: std::collections::HashSet<u64> = ev.rows.iter().map(|r| r.seq).collect();
    rep.committed_missing = ev
        .commits
        .keys()
        .filter(|s| !seqs.contains(s))
        .copied()
        .collect();
    rep.committed_missing.sort();

    let mut by_id: HashMap<i64, Vec<&Hit>> = HashMap::new();
    for h in ev.hits {
        if let Some(id) = h.id {
            by_id.entry(id).or_default().push(h);
        }
    }
    let mut dup_per_fault: HashMap<usize, usize> = HashMap::new();

    for row in ev.rows {
        match row.status.as_str() {
            "SUCCESS" => {}
            "PENDING" | "RETRY" => rep.stuck += 1,
            _ => rep.failed += 1,
        }
        let hits = by_id.get(&row.id).map(Vec::as_slice).unwrap_or(&[]);
        let accepted: Vec<&Hit> = hits.iter().copied().filter(|h| h.accepted).collect();
        if accepted.is_empty() || row.status != "SUCCESS" {
            rep.lost.push(row.id);
        }
        if let Some(commit) = ev.commits.get(&row.seq) {
            if let Some(first) = hits.first() {
                rep.max_wait_arrival = rep
                    .max_wait_arrival
                    .max(first.at.saturating_duration_since(*commit));
            }
            if let Some(first) = accepted.first() {
                let waited = first.at.saturating_duration_since(*commit);
                if waited >= rep.max_wait_accepted {
                    rep.max_wait_accepted = waited;
                    let at = commit.saturating_duration_since(ev.t0).as_secs_f64();
                    rep.slowest_row = Some((row.id, row.key.clone(), at));
                }
            }
        }
        note_duplicates(ev, row.id, &accepted, &mut rep, &mut dup_per_fault);
    }
    rep.lost.sort();

    check_duplicate_bounds(ev, dup_per_fault, &mut rep);

    check_key_order(ev, &by_id, &mut rep);

    if ev.leader {
        note_failovers(ev, &mut rep);
    }
    rep
}

/// The sender's name of slot `s`.
fn sender_name<'a>(ev: &Evidence<'a>, s: u8) -> &'a str {
    ev.senders.get(s as usize).copied().unwrap_or("?")
}

/// Each accepted delivery after the first is a duplicate: the earlier one (p) was acted
/// on but its result never written. Only the end of the process that sent p explains
/// that: the first kill, pause or graceful stop of p's instance after p (a restart is a
/// new process, which never knew p), and q must come after it. A kill or a pause is a
/// cause; a graceful stop writes its results, so it is not. Or q is a request the
/// paused instance had put on the wire before its pause, arriving when it continued.
fn note_duplicates(
    ev: &Evidence,
    row_id: i64,
    accepted: &[&Hit],
    rep: &mut Report,
    dup_per_fault: &mut HashMap<usize, usize>,
) {
    let name = |s: u8| sender_name(ev, s);
    for pair in accepted.windows(2) {
        let (p, q) = (pair[0], pair[1]);
        let ended = ev.faults.iter().enumerate().find(|(_, f)| {
            matches!(f.kind, Kind::Kill9 | Kind::Pause | Kind::Graceful)
                && f.slot == Some(p.sender)
                && p.at <= f.at + ON_THE_WIRE
        });
        let by_fault = ended.filter(|(_, f)| f.kind != Kind::Graceful && q.at >= f.at);
        // A request the paused instance's connection wrote when it woke (docs/design.md,
        // "Sending": what remains of a pause), whichever of the two it was: its own send
        // had timed out by then, so the row was given to the next holder too.
        let woke = |h: &Hit, f: &Fault| {
            f.slot == Some(h.sender) && h.at >= f.end && h.at <= f.end + WAKE_SLACK
        };
        let by_wake = ev
            .faults
            .iter()
            .enumerate()
            .find(|(_, f)| f.kind == Kind::Pause && (woke(q, f) || woke(p, f)));
        match by_fault.or(by_wake) {
            Some((i, f)) => {
                let cause = if by_fault.is_some() {
                    format!("{} (in flight at it)", f.kind.name())
                } else {
                    format!("{} (sent before it, arrived at SIGCONT)", f.kind.name())
                };
                *rep.duplicates.entry(cause).or_insert(0) += 1;
                *dup_per_fault.entry(i).or_insert(0) += 1;
            }
            None => rep.unaccounted.push(format!(
                "row {} accepted from {} at {:.3}s and again from {} at {:.3}s; {}",
                row_id,
                name(p.sender),
                (p.at - ev.t0).as_secs_f64(),
                name(q.sender),
                (q.at - ev.t0).as_secs_f64(),
                match ended {
                    Some((_, f)) if f.kind == Kind::Graceful => {
                        "its sender was then stopped gracefully"
                    }
                    Some(_) => "the second came before its sender was killed or paused",
                    None => "its sender was never killed or paused after it",
                }
            )),
        }
    }
}

/// Per fault: at most the rows the process could have had sent but not recorded (G3).
fn check_duplicate_bounds(ev: &Evidence, dup_per_fault: HashMap<usize, usize>, rep: &mut Report) {
    let name = |s: u8| sender_name(ev, s);
    let mut per_fault: Vec<(usize, usize)> = dup_per_fault.into_iter().collect();
    per_fault.sort();
    for &(i, d) in &per_fault {
        if d > ev.max_in_flight {
            let f = &ev.faults[i];
            rep.over_bound.push(format!(
                "{} of {} at {:.3}s: {d} duplicates, more than max_in_flight {}",
                f.kind.name(),
                f.slot.map_or("?", name),
                (f.at - ev.t0).as_secs_f64(),
                ev.max_in_flight
            ));
        }
    }
    rep.per_fault = per_fault;
}

/// Per key, in id order: row n+1 first arrives after row n was first accepted.
fn check_key_order(ev: &Evidence, by_id: &HashMap<i64, Vec<&Hit>>, rep: &mut Report) {
    let mut keys: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in ev.rows {
        if let Some(k) = &r.key {
            keys.entry(k).or_default().push(r);
        }
    }
    for (key, mut rows) in keys {
        rows.sort_by_key(|r| r.id);
        for pair in rows.windows(2) {
            let (n, next) = (pair[0], pair[1]);
            let accepted_n = by_id
                .get(&n.id)
                .and_then(|hs| hs.iter().find(|h| h.accepted))
                .and_then(|h| h.answered);
            let first_next = by_id.get(&next.id).and_then(|hs| hs.first()).map(|h| h.at);
            if let (Some(first_next), accepted_n) = (first_next, accepted_n)
                && accepted_n.is_none_or(|a| first_next < a)
            {
                rep.order_violations.push(format!(
                    "key {key}: row {} arrived at {:.3}s, before row {} was first accepted ({})",
                    next.id,
                    (first_next - ev.t0).as_secs_f64(),
                    n.id,
                    accepted_n.map_or("never".into(), |a| format!(
                        "{:.3}s",
                        (a - ev.t0).as_secs_f64()
                    ))
                ));
            }
        }
    }
}

/// Failovers (leader mode): a kill or pause of the holder to the next request by another.
fn note_failovers(ev: &Evidence, rep: &mut Report) {
    for f in ev.faults.iter().filter(|f| f.holder) {
        // After a kill the restarted instance may be the one that takes over; a paused
        // one only counts once another instance delivered.
        let next = ev
            .hits
            .iter()
            .find(|h| {
                h.at > f.at + ON_THE_WIRE && (f.kind == Kind::Kill9 || Some(h.sender) != f.slot)
            })
            .map(|h| h.at - f.at);
        rep.failovers
            .push((f.kind, (f.at - ev.t0).as_secs_f64(), next));
    }
}

impl Report {
    /// Everything that breaks a guarantee, one line each.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.committed_missing.is_empty() {
            out.push(format!(
                "{} committed rows are not in the table: {:?}",
                self.committed_missing.len(),
                &self.committed_missing[..self.committed_missing.len().min(20)]
            ));
        }
        if !self.lost.is_empty() {
            out.push(format!(
                "{} rows lost (never accepted, or not SUCCESS): {:?}",
                self.lost.len(),
                &self.lost[..self.lost.len().min(20)]
            ));
        }
        if self.stuck > 0 {
            out.push(format!("{} rows left PENDING/RETRY", self.stuck));
        }
        if self.failed > 0 {
            out.push(format!(
                "{} rows FAILED (every storm is transient)",
                self.failed
            ));
        }
        let list = |what: &str, v: &[String]| {
            format!(
                "{} {what}:\n  {}",
                v.len(),
                v.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
            )
        };
        if !self.unaccounted.is_empty() {
            out.push(list(
                "duplicates no kill or pause accounts for",
                &self.unaccounted,
            ));
        }
        if !self.over_bound.is_empty() {
            out.push(list("faults over the duplicate bound", &self.over_bound));
        }
        if !self.order_violations.is_empty() {
            out.push(list("per-key order violations", &self.order_violations));
        }
        out
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n==== chaos run: {} (seed {}, OUTBOX_RELAY_CHAOS_SEED={} to repeat) ====",
            self.scenario, self.seed, self.seed
        );
        line(
            &mut s,
            "run time",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
        );
        line(&mut s, "rows", self.rows);
        line(&mut s, "  with an ordering key", self.keyed_rows);
        line(&mut s, "requests received", self.requests);
        for (storm, n) in &self.requests_by_storm {
            line(&mut s, format!("  answered {}", storm.name()), n);
        }
        line(&mut s, "requests accepted (200)", self.accepted);
        let _ = writeln!(s, "faults injected:");
        for (k, n) in &self.faults {
            line(&mut s, format!("  {}", k.name()), n);
        }
        line(
            &mut s,
            "rows lost",
            self.lost.len() + self.committed_missing.len(),
        );
        line(&mut s, "rows left PENDING/RETRY", self.stuck);
        line(&mut s, "rows FAILED", self.failed);
        self.duplicate_lines(&mut s);
        line(
            &mut s,
            "per-key order violations",
            self.order_violations.len(),
        );
        line(
            &mut s,
            "max wait, commit to first arrival",
            ms(self.max_wait_arrival),
        );
        line(
            &mut s,
            "max wait, commit to first acceptance",
            ms(self.max_wait_accepted),
        );
        if let Some((id, key, at)) = &self.slowest_row {
            let key = key.as_deref().unwrap_or("none");
            let _ = writeln!(
                s,
                "  (row {id}, ordering key {key}, committed at {at:.1} s)"
            );
        }
        self.failover_lines(&mut s);
        s
    }

    /// The table's duplicates: the total, by cause, those no fault accounts for, and the most
    /// from one fault.
    fn duplicate_lines(&self, s: &mut String) {
        let dups: usize = self.duplicates.values().sum::<usize>() + self.unaccounted.len();
        line(s, "duplicates (accepted more than once)", dups);
        for (cause, n) in &self.duplicates {
            line(s, format!("  {cause}"), n);
        }
        line(s, "  not accounted for by a fault", self.unaccounted.len());
        let worst = self.per_fault.iter().map(|&(_, d)| d).max().unwrap_or(0);
        line(s, "  most from one fault", worst);
    }

    /// The table's failovers, each and the slowest; nothing when there were none.
    fn failover_lines(&self, s: &mut String) {
        if self.failovers.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "failovers (holder killed or paused -> next delivery by another process):"
        );
        for (k, at, d) in &self.failovers {
            line(
                s,
                format!("  {} at {at:.1} s", k.name()),
                d.map_or("none".into(), ms),
            );
        }
        let slowest = self.failovers.iter().filter_map(|f| f.2).max();
        line(s, "  slowest", slowest.map_or("-".into(), ms));
    }
}

/// One line of the summary table: the label left in 48 columns, the value right in 12.
fn line(s: &mut String, label: impl std::fmt::Display, value: impl std::fmt::Display) {
    let _ = writeln!(s, "{label:<48} {value:>12}");
}

/// A duration in whole milliseconds, as the table shows it.
fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests;
