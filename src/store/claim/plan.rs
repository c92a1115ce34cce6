//! Which picks a claim makes: per channel budget one pick from its oldest due rows and a share
//! from its newest, and one for the rows of channels no sink serves (docs/design.md, "Budgets"
//! and "Oldest first, but not only").

use crate::store::model::ClaimRequest;

/// The share of a channel's budget taken newest first (one in eight, at least one row).
const NEWEST_SHARE: u32 = 8;

/// How many of a channel's newest unfinished rows the newest pick looks at, per row it takes.
pub const NEWEST_WINDOW: u32 = 4;

/// Which end of a channel's due rows a pick starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Oldest,
    Newest,
    /// Whichever rows the index gives first: for a read that only asks whether any row is
    /// claimable.
    Any,
}

/// Which channels one pick takes.
#[derive(Clone, Copy, Debug)]
pub enum Filter<'a> {
    Channel(&'a str),
    /// Every channel but these (none: every channel).
    NotIn(&'a [String]),
}

/// One pick: which channels, how many rows at most, from which end.
pub type Pick<'a> = (Filter<'a>, u32, Order);

/// How many of a channel's `budget` rows its newest pick takes.
pub fn newest_share(budget: u32, newest: bool) -> u32 {
    if newest && budget >= 2 {
        (budget / NEWEST_SHARE).max(1)
    } else {
        0
    }
}

/// The picks of a claim, in the order the statement makes them.
pub fn plan(req: &ClaimRequest) -> Vec<Pick<'_>> {
    // Each channel's budget is taken oldest first, but for a share taken newest first:
    // under a backlog, a row just committed is sent within one claim instead of after
    // the whole backlog (the order of a channel's rows is not a promise; an ordering
    // key's is, and only the head of a key is ever claimable). The two picks can meet
    // when the channel has fewer rows due than its budget; the claim takes such a row once.
    match &req.budgets {
        Some(b) => b
            .channels
            .iter()
            .flat_map(|(c, n)| {
                let newest = newest_share(*n, req.newest);
                [
                    (Filter::Channel(c), n - newest, Order::Oldest),
                    (Filter::Channel(c), newest, Order::Newest),
                ]
            })
            .filter(|(_, n, _)| *n > 0)
            .chain(
                b.others
                    .iter()
                    .map(|(known, n)| (Filter::NotIn(known), *n, Order::Oldest)),
            )
            .collect(),
        None => vec![(
            Filter::NotIn(&req.exclude_channels),
            req.limit,
            Order::Oldest,
        )],
    }
}
