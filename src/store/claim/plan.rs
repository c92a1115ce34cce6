//! What a claim reads first (docs/design.md, "Claims"): per channel a window of its oldest
//! unfinished rows above the floor and, some claims, one of its newest; per ordering key this
//! store has just freed, the key's first unfinished rows; and the rows of channels no sink
//! serves. Every part is bounded: no read looks at more rows than a few times the budget, so
//! a claim's cost does not grow with the rows queued behind ordering keys.

use crate::store::model::ClaimRequest;

/// The share of a channel's budget taken newest first (one in eight, at least one row).
const NEWEST_SHARE: u32 = 8;

/// How many of a channel's newest unfinished rows a newest window reads, per row it may take.
pub const NEWEST_WINDOW: u32 = 4;

/// How many of a channel's oldest unfinished rows above its floor a window reads, per row it
/// may take: room for some rows that are not claimable (waiting, behind their key) without
/// a second read.
pub const OLDEST_WINDOW: u32 = 2;

/// A window reads at least this many rows, so that a channel with a small budget still
/// passes a run of rows that wait behind their keys quickly.
pub const MIN_WINDOW: u32 = 64;

/// How many of a channel's `budget` rows its newest window takes.
pub fn newest_share(budget: u32, newest: bool) -> u32 {
    if newest && budget >= 2 {
        (budget / NEWEST_SHARE).max(1)
    } else {
        0
    }
}

/// An ordering key this store learnt something about: its next rows may be claimable now.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef {
    /// The key as text.
    pub key: String,
    /// A row of the key (the one that finished or came due): databases that cannot compare
    /// a bound text with the key column's type find the key through it.
    pub row: i64,
}

/// What [`Part::Window`] asks a database to read (see `ClaimSql::channel_rows`).
pub struct ChannelRead<'a> {
    pub channel: &'a str,
    pub from: Option<i64>,
    pub rows: u32,
    pub newest: bool,
}

/// What [`Part::Others`] asks a database to read (see `ClaimSql::unserved_rows`).
pub struct GapRead<'a> {
    pub above: Option<&'a str>,
    pub below: Option<&'a str>,
    pub rows: u32,
}

/// One part of a claim's read.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Up to `rows` unfinished rows of `channel` in id order above `from` (all of them when
    /// `None`), or its newest `rows` (`newest`).
    Window {
        channel: String,
        from: Option<i64>,
        rows: u32,
        newest: bool,
        /// The part is a full walk's (it starts where the last full walk stopped).
        sweep: bool,
    },
    /// Up to `rows` first unfinished rows of an ordering key, in id order; with `after`,
    /// those above it (the key's tail in flight at this relay: the rows that may go right
    /// behind it).
    Key {
        key: KeyRef,
        after: Option<i64>,
        rows: u32,
    },
    /// Rows of an ordering key an earlier claim read right behind the key's tail in flight
    /// (`after`) and did not take, read again by id (docs/design.md, "Ordering keys: rows
    /// read ahead"): a key with rows ahead costs its claim no index walk of its own.
    Known {
        key: KeyRef,
        after: i64,
        /// The rows read now, in id order.
        ids: Vec<i64>,
        /// The rows known behind them, not read now (the claim's share of the key is
        /// smaller): still ahead after the claim if every row read stays free.
        more: Vec<i64>,
    },
    /// Up to `rows` claimable rows of the channels strictly between `above` and `below`
    /// (unbounded where `None`), oldest first within a channel: the gaps between the channels
    /// the sinks serve hold the rows of channels no sink serves (and, for a request without
    /// budgets, the gaps between the channels it excludes hold every other channel). All
    /// such parts of a claim share one budget.
    Others {
        above: Option<String>,
        below: Option<String>,
        rows: u32,
        /// Instead: the rows whose channel is NULL (a mapped channel column may hold it;
        /// no sink serves it, and the row is failed naming the column).
        nulls: bool,
    },
}

/// What the claim may take of each channel: its whole budget, of which `newest` from its
/// newest rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub channel: String,
    pub total: u32,
    pub newest: u32,
    /// How many heads of keys the channel's windows may take (`u32::MAX`: no bound). In claim
    /// mode, what its sink can start now ([`Budgets::starts`]): a key whose head a claimer
    /// takes stays that claimer's while it has rows in flight ("Ordering keys: chains"), so
    /// heads taken ahead of the sink's free slots would only wait in this claimer's queue
    /// while another claimer could send them (docs/design.md, "Ordering keys: keys among
    /// claimers").
    pub fresh: u32,
    /// Heads its windows take whatever `fresh`: heads this claimer left for another claimer
    /// long enough ago that no other claimer wants them (`Claims::claim`).
    pub waited: Vec<i64>,
}

/// The budgets of `req`, per channel.
pub fn budgets(req: &ClaimRequest) -> Vec<Budget> {
    match &req.budgets {
        Some(b) => b
            .channels
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| Budget {
                channel: c.clone(),
                total: *n,
                newest: newest_share(*n, req.newest),
                fresh: match (&b.starts, req.alone) {
                    (Some(starts), false) => {
                        (starts.iter()).find(|(s, _)| s == c).map_or(0, |(_, n)| *n)
                    }
                    _ => u32::MAX,
                },
                waited: Vec::new(),
            })
            .collect(),
        None => Vec::new(),
    }
}

/// The window size for an oldest share of `rows`.
pub fn oldest_window(rows: u32) -> u32 {
    rows.saturating_mul(OLDEST_WINDOW).max(MIN_WINDOW)
}

/// The parts that read the channels outside `known` (sorted here), `rows` in all.
pub fn gaps(known: &[String], rows: u32) -> Vec<Part> {
    let mut known: Vec<&String> = known.iter().collect();
    known.sort();
    known.dedup();
    let mut out = Vec::with_capacity(known.len() + 1);
    let mut above: Option<String> = None;
    for k in known {
        out.push(Part::Others {
            above: above.clone(),
            below: Some(k.clone()),
            rows,
            nulls: false,
        });
        above = Some(k.clone());
    }
    out.push(Part::Others {
        above,
        below: None,
        rows,
        nulls: false,
    });
    out.push(Part::Others {
        above: None,
        below: None,
        rows,
        nulls: true,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::Budgets;

    #[test]
    fn only_a_claim_mode_claim_bounds_the_heads_of_new_keys_by_what_its_sinks_start_now() {
        let mut req = super::super::fixtures::request();
        req.budgets = Some(Budgets {
            channels: vec![("a".into(), 100), ("b".into(), 50)],
            others: None,
            starts: Some(vec![("a".into(), 30)]),
        });
        let fresh = |req: &ClaimRequest| budgets(req).iter().map(|b| b.fresh).collect::<Vec<_>>();
        req.alone = false;
        assert_eq!(fresh(&req), [30, 0], "b can start nothing now");
        req.alone = true;
        assert_eq!(
            fresh(&req),
            [u32::MAX, u32::MAX],
            "a leader's claim is not bound"
        );
        req.alone = false;
        if let Some(b) = req.budgets.as_mut() {
            b.starts = None;
        }
        assert_eq!(fresh(&req), [u32::MAX, u32::MAX], "no bound asked");
    }
}
