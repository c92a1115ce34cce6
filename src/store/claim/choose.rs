//! Which of the rows a claim read it takes (pure: the rule, without a database).
//!
//! The rule (docs/design.md, "Claims"): a row is taken when it is due, under no live claim,
//! and every earlier unfinished row of its ordering key is taken by this same claim (for the
//! first row of a key, there is none: it is the head). So a claim takes, per ordering key, a
//! *run*: the head and the rows right behind it, in id order, up to the run length and while
//! each is due and unclaimed; the relay sends a run's rows one after another, each only once
//! the one before it was accepted. A key read from behind its tail (a key part with `after`)
//! is taken the same way: its first row read is right behind the key's rows in flight, and the
//! database checks that the tail is still held (docs/design.md, "Ordering keys: chains").
//! Each channel's rows count against its budget: keys' first rows (the oldest of each key) up to
//! a keyed share of the budget, oldest first, then the oldest windows, then the other keys'
//! first rows, then the rest of the keys' runs, then the newest window's share, so that a
//! keyed backlog, of few keys with long runs or of many keys, does not slow the unkeyed rows
//! among it, and keys still move whatever else is waiting.
//!
//! What the claim learns for the floors: how far each oldest window looked with every row
//! settled (taken, or not claimable), so that the next claim reads on from there.

use super::fx::{Fast, Ids};
use super::plan::{Budget, KeyRef, Part};

/// One row a claim's read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i64,
    /// Its channel (`None`: NULL, or not text).
    pub channel: Option<String>,
    /// Its ordering key as text (`None`: no key).
    pub key: Option<String>,
    /// Due, and under no live claim.
    pub free: bool,
    /// No earlier unfinished row of its ordering key (every unkeyed row is a head).
    pub head: bool,
    /// A keyed head known to have no later unfinished row of its key either (where the
    /// database reads ahead, `ClaimSql::last_of_key`).
    pub last: bool,
}

impl Candidate {
    fn claimable(&self) -> bool {
        self.free && self.head
    }
}

/// What one oldest window found, for the floors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub channel: String,
    /// Where the window started (`None`: the lowest row).
    pub from: Option<i64>,
    /// The highest id up to which every row the window read was taken or not claimable
    /// (`None`: not even its first row).
    pub settled: Option<i64>,
    /// The window held fewer rows than it asked for: it reached the channel's newest row.
    pub reached_end: bool,
    /// It was a full walk's window.
    pub sweep: bool,
    /// Rows it took.
    pub took: usize,
    /// Of those, rows without an ordering key.
    pub unkeyed: usize,
    /// It read rows without an ordering key, claimable or not (another claimer's, or waiting
    /// for a retry).
    pub saw_unkeyed: bool,
    /// Rows it asked for.
    pub asked: u32,
    /// It read all the rows it asked for, every one settled, and its channel still has
    /// room: the claim reads on past it.
    pub wants_more: bool,
    /// What its channel's oldest share still had room for once every part was chosen from:
    /// the next window's size, when the claim reads on.
    pub room: u32,
}

/// What became of a key the claim read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFate {
    /// Rows of it were chosen: nothing more to do for it once the claim got them (a claim
    /// that got none of them, since the database found them taken or blocked meanwhile,
    /// leaves the key to be read again).
    Taken,
    /// Its head is not claimable (under a claim, waiting, behind a row this store does not
    /// know of): nothing more to do for it now.
    Done,
    /// Its head is claimable but its channel had no budget left: read it again next claim.
    Deferred,
}

/// A claim's choice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// The rows to claim.
    pub ids: Vec<i64>,
    /// The runs of two rows or more, each in id order: after the claim, a run that lost a
    /// row (someone else took it meanwhile) must not keep the rows behind the gap.
    pub runs: Vec<Vec<i64>>,
    pub seen: Vec<Seen>,
    pub keys: Vec<(KeyRef, KeyFate)>,
    /// The rows taken from newest windows (they count against the newest share).
    pub newest: Vec<i64>,
    /// Heads of keys new to this claimer that its oldest windows left for another claimer
    /// ([`Budget::fresh`]).
    pub left_heads: Vec<i64>,
    /// Per key read, the rows it read and did not take, right behind those it took (none:
    /// the part read the key behind a tail and found no row at all).
    pub ahead: Vec<Ahead>,
    /// The oldest windows took unkeyed rows, and left their channels' oldest shares no room:
    /// the next claim reads no more keys than the keyed share (see `keys::key_parts`).
    pub crowded: bool,
}

/// Rows of a key a claim read and did not take, in id order, each free when read, right
/// behind the rows of it the claim took (or, if it took none, behind where the read
/// started): once the claim got those, the next claim may read these by id ([`Part::Known`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ahead {
    pub key: String,
    /// The rows of the key the claim took, in id order.
    pub took: Vec<i64>,
    /// Where the part read from (a tail in flight; `None`: the key's head).
    pub after: Option<i64>,
    pub rows: Vec<i64>,
}

/// A key part as the chooser sees it: the key, where it read from, the rows it read, the
/// rows known behind them that it did not read, and whether it read the key itself (a
/// [`Part::Key`]; a [`Part::Known`] reads rows by id).
type KeyRows<'a> = (&'a KeyRef, Option<i64>, &'a [Candidate], &'a [i64], bool);

/// A key's run as the chooser builds it: the key's own rows read, in id order, the ones taken,
/// and whether the run may still grow.
struct KeyRun<'a> {
    own: Vec<&'a Candidate>,
    ids: Vec<i64>,
    open: bool,
}

/// A channel's keyed share is this part of its budget (a sixteenth): the keys' first rows a
/// claim takes before its oldest windows while unkeyed rows wait (docs/design.md, "Ordering
/// keys: a keyed share", which says why not an eighth).
pub const KEYED_SHARE: u32 = 16;

/// The keyed share of a channel's budget of `total` rows: a sixteenth, at least one.
pub fn keyed_share(total: u32) -> u32 {
    (total / KEYED_SHARE).max(1)
}

/// Chooses from `found` (each part's rows, in the part's order: ascending ids, descending
/// for a newest window) within `budgets`, at most `run` rows per key; the [`Part::Others`]
/// parts share the budget each of them carries.
pub fn choose(found: &[(Part, Vec<Candidate>)], budgets: &[Budget], run: u32) -> Choice {
    let others = found.iter().find_map(|(p, _)| match p {
        Part::Others { rows, .. } => Some(*rows),
        _ => None,
    });
    let mut c = Chooser {
        others_left: others.unwrap_or(0),
        left: budgets
            .iter()
            .map(|b| (b.channel.clone(), b.total))
            .collect(),
        newest_left: budgets
            .iter()
            .map(|b| (b.channel.clone(), b.newest))
            .collect(),
        fresh_left: budgets
            .iter()
            .map(|b| (b.channel.clone(), b.fresh))
            .collect(),
        waited: budgets
            .iter()
            .flat_map(|b| b.waited.iter().copied())
            .collect(),
        taken: Ids::default(),
        choice: Choice::default(),
    };
    // Each key's first row (the oldest of its key), then the oldest windows, then the rest
    // of the keys' runs, then the newest windows.
    let keys: Vec<KeyRows> = found
        .iter()
        .filter_map(|(part, rows)| match part {
            Part::Key { key, after, .. } => Some((key, *after, rows.as_slice(), &[][..], true)),
            // The rows known behind those read count only if every row asked was read: one
            // missing (taken, finished or held meanwhile) may still be unfinished, and the
            // rows behind it are then no longer right behind what the claim took.
            Part::Known {
                key,
                after,
                ids,
                more,
            } => {
                let more = if rows.len() == ids.len() {
                    more.as_slice()
                } else {
                    &[][..]
                };
                Some((key, Some(*after), rows.as_slice(), more, false))
            }
            _ => None,
        })
        .collect();
    let mut runs = c.key_runs_read(&keys);
    let firsts = c.first_rows(&runs);
    let rest = c.key_heads(&mut runs, &firsts, Some(keyed_shares(found, budgets)));
    for (part, rows) in found {
        match part {
            Part::Window {
                channel,
                from,
                rows: asked,
                newest: false,
                sweep,
            } => c.oldest(channel, *from, *asked, *sweep, rows),
            Part::Others { .. } => c.others(rows),
            _ => {}
        }
    }
    // What the oldest windows left: a window that read unkeyed rows reads on into it, since
    // the next window's unkeyed rows go before the keys' rows that would take it now (and
    // where another claimer holds those it read, the free ones are likely right behind).
    let after_windows: Vec<u32> = c.choice.seen.iter().map(|s| c.room(&s.channel)).collect();
    let mut oldest = (c.choice.seen.iter().zip(&after_windows)).filter(|(s, _)| !s.sweep);
    c.choice.crowded = oldest.clone().any(|(s, _)| s.unkeyed > 0) && oldest.all(|(_, r)| *r == 0);
    c.key_heads(&mut runs, &rest, None);
    c.key_runs(&mut runs, run.max(1));
    c.key_fates(&keys, runs);
    for (part, rows) in found {
        if let Part::Window {
            channel,
            newest: true,
            ..
        } = part
        {
            c.newest(channel, rows);
        }
    }
    let rooms: Vec<u32> = (c.choice.seen.iter().zip(after_windows))
        .map(|(s, after)| {
            if s.saw_unkeyed {
                after
            } else {
                c.room(&s.channel)
            }
        })
        .collect();
    for (seen, room) in c.choice.seen.iter_mut().zip(rooms) {
        seen.wants_more &= room > 0;
        seen.room = room;
    }
    c.choice
}

/// Per channel, how many keys' first rows go before its oldest windows: its keyed share where
/// those windows found unkeyed rows (the keys yield to them beyond it), all of them where they
/// found none. Unkeyed rows another claimer holds count: the claim reads on past them for the
/// free ones behind (docs/design.md, "Ordering keys: a keyed share among claimers").
fn keyed_shares(found: &[(Part, Vec<Candidate>)], budgets: &[Budget]) -> Fast<String, u32> {
    let unkeyed = |channel: &str| {
        found.iter().any(|(part, rows)| match part {
            Part::Window {
                channel: c,
                newest: false,
                ..
            } if c == channel => rows.iter().any(|r| r.key.is_none()),
            _ => false,
        })
    };
    (budgets.iter())
        .map(|b| {
            let share = match unkeyed(&b.channel) {
                true => keyed_share(b.total),
                false => u32::MAX,
            };
            (b.channel.clone(), share)
        })
        .collect()
}

struct Chooser {
    /// What the parts that read channels no sink serves may still take, together.
    others_left: u32,
    /// Per channel, the budget not yet taken.
    left: Fast<String, u32>,
    /// Per channel, what its newest window may still take.
    newest_left: Fast<String, u32>,
    /// Per channel, how many more heads of keys its windows may take (see [`Budget::fresh`]).
    fresh_left: Fast<String, u32>,
    /// Heads taken whatever that bound ([`Budget::waited`]).
    waited: Ids,
    taken: Ids,
    choice: Choice,
}

impl Chooser {
    /// What `channel`'s oldest share has left.
    fn room(&self, channel: &str) -> u32 {
        let left = self.left.get(channel).copied().unwrap_or(0);
        left.saturating_sub(self.newest_left.get(channel).copied().unwrap_or(0))
    }

    /// Takes `row` if its channel has budget left (of its oldest share when `oldest`).
    fn take(&mut self, row: &Candidate, oldest: bool) -> bool {
        if self.taken.contains(&row.id) {
            return true;
        }
        let Some(channel) = &row.channel else {
            return false;
        };
        let newest = self.newest_left.get(channel).copied().unwrap_or(0);
        let reserved = if oldest { newest } else { 0 };
        match self.left.get_mut(channel) {
            Some(left) if *left > reserved => *left -= 1,
            _ => return false,
        }
        self.taken.insert(row.id);
        self.choice.ids.push(row.id);
        true
    }

    /// Takes `row`, a claimable row a window met, as [`Chooser::take`] does; a keyed one (a
    /// head of a key the claim did not read as a key) only while its channel may take more
    /// such heads ([`Budget::fresh`]).
    fn take_fresh(&mut self, row: &Candidate, oldest: bool) -> bool {
        if !self.fresh_allowed(row) {
            return false;
        }
        let fresh = row.key.is_some() && !self.taken.contains(&row.id);
        let channel = row.channel.as_deref().unwrap_or_default();
        let took = self.take(row, oldest);
        if let (true, Some(n)) = (took && fresh, self.fresh_left.get_mut(channel)) {
            *n = n.saturating_sub(1);
        }
        took
    }

    /// Whether `row` is not a head of a key beyond its channel's bound on such heads.
    fn fresh_allowed(&self, row: &Candidate) -> bool {
        let channel = row.channel.as_deref().unwrap_or_default();
        row.key.is_none()
            || self.taken.contains(&row.id)
            || self.waited.contains(&row.id)
            || self.fresh_left.get(channel).is_none_or(|n| *n > 0)
    }

    /// Each key's own rows read, none taken yet.
    fn key_runs_read<'a>(&self, keys: &[KeyRows<'a>]) -> Vec<KeyRun<'a>> {
        keys.iter()
            .map(|(key, _, rows, _, _)| KeyRun {
                own: rows
                    .iter()
                    .filter(|r| r.key.as_deref() == Some(key.key.as_str()))
                    .collect(),
                ids: Vec::new(),
                open: false,
            })
            .collect()
    }

    /// The keys whose first row read (their head, or the row right behind their tail) is
    /// claimable, oldest row first: the key that waited longest moves first.
    fn first_rows(&self, runs: &[KeyRun]) -> Vec<usize> {
        let mut firsts: Vec<(i64, usize)> = (runs.iter().enumerate())
            .filter_map(|(i, r)| r.own.first().filter(|h| h.claimable()).map(|h| (h.id, i)))
            .collect();
        firsts.sort_unstable();
        firsts.into_iter().map(|(_, i)| i).collect()
    }

    /// Takes the first row of each key of `firsts` (in their order) while its channel has
    /// budget, and with `shares` no more of each channel's than its keyed share; returns the
    /// keys left. Before the windows, the keyed share: keys move at least that much a claim
    /// whatever else is waiting; after them, the rest: every key moves a row a claim unless
    /// the oldest windows' rows took the budget (docs/design.md, "Ordering keys: a keyed
    /// share").
    fn key_heads(
        &mut self,
        runs: &mut [KeyRun],
        firsts: &[usize],
        mut shares: Option<Fast<String, u32>>,
    ) -> Vec<usize> {
        let mut left = Vec::new();
        for &i in firsts {
            let run = &mut runs[i];
            let Some(head) = run.own.first().copied() else {
                continue;
            };
            let share = match &mut shares {
                Some(shares) => match head.channel.as_ref().and_then(|ch| shares.get_mut(ch)) {
                    Some(n) if *n > 0 => Some(n),
                    _ => {
                        left.push(i);
                        continue;
                    }
                },
                None => None,
            };
            if self.take(head, true) {
                run.ids.push(head.id);
                run.open = true;
                if let Some(n) = share {
                    *n -= 1;
                }
            }
        }
        left
    }

    /// The rest of each key's run, after the windows: the rows behind each key's first row
    /// while each is free, taken breadth first (every key's second row, then every key's
    /// third, ...) so that a budget smaller than the keys' rows is shared among the keys. They
    /// come after the windows' rows, the unkeyed rows and other keys' heads among them, so a
    /// backlog of few keys with many rows each cannot take the budget those need
    /// (docs/design.md, "Ordering keys: a keyed share").
    fn key_runs(&mut self, runs: &mut [KeyRun], run: u32) {
        for pos in 1..run as usize {
            for r in runs.iter_mut().filter(|r| r.open) {
                match r.own.get(pos) {
                    Some(row) if row.free && self.take(row, true) => r.ids.push(row.id),
                    _ => r.open = false,
                }
            }
        }
    }

    /// What became of each key, and what the claim read of it and did not take.
    fn key_fates(&mut self, keys: &[KeyRows], runs: Vec<KeyRun>) {
        for ((key, after, _, more, whole), KeyRun { own, ids, .. }) in keys.iter().zip(runs) {
            let fate = match (own.first(), ids.len()) {
                (_, 1..) => KeyFate::Taken,
                (Some(head), 0) if head.claimable() => KeyFate::Deferred,
                _ => KeyFate::Done,
            };
            let rest = &own[ids.len()..];
            let mut ahead: Vec<i64> = rest.iter().take_while(|r| r.free).map(|r| r.id).collect();
            if ahead.len() == rest.len() {
                ahead.extend_from_slice(more);
            }
            // Nothing at all behind a tail: the key is known to be empty there, which spares
            // the next claims that read (see `keys::ReadAhead::empty_behind`).
            let empty_behind = *whole && own.is_empty() && after.is_some();
            if !ahead.is_empty() || empty_behind {
                self.choice.ahead.push(Ahead {
                    key: key.key.clone(),
                    took: ids.clone(),
                    after: *after,
                    rows: ahead,
                });
            }
            if ids.len() > 1 {
                self.choice.runs.push(ids);
            }
            self.choice.keys.push(((*key).clone(), fate));
        }
    }

    /// An oldest window: its claimable rows in id order while the channel's oldest share
    /// lasts, and how far it looked with every row settled.
    fn oldest(
        &mut self,
        channel: &str,
        from: Option<i64>,
        asked: u32,
        sweep: bool,
        rows: &[Candidate],
    ) {
        let rows: Vec<&Candidate> = rows
            .iter()
            .filter(|r| r.channel.as_deref() == Some(channel))
            .collect();
        let mut settled = from;
        let (mut took, mut unkeyed) = (0, 0);
        // `open`: the budget lasts; `settling`: every row so far was taken or not claimable
        // (a head left for another claimer stops it, not the rows taken behind it).
        let (mut open, mut settling) = (true, true);
        for row in &rows {
            if row.claimable() {
                if !self.fresh_allowed(row) {
                    settling = false;
                    self.choice.left_heads.push(row.id);
                    continue;
                }
                if !open || !self.take_fresh(row, true) {
                    open = false;
                    continue;
                }
                self.alone(row);
                took += 1;
                unkeyed += usize::from(row.key.is_none());
            }
            if open && settling {
                settled = Some(row.id);
            }
        }
        let reached_end = rows.len() < asked as usize;
        self.choice.seen.push(Seen {
            channel: channel.to_string(),
            from,
            settled,
            reached_end,
            sweep,
            took,
            unkeyed,
            saw_unkeyed: rows.iter().any(|r| r.key.is_none()),
            asked,
            // Decided once every part is chosen from (see `choose`).
            wants_more: open && settling && !reached_end && !sweep,
            room: 0,
        });
    }

    /// A newest window: its claimable rows, newest first, while the channel's newest share
    /// lasts.
    fn newest(&mut self, channel: &str, rows: &[Candidate]) {
        for row in rows
            .iter()
            .filter(|r| r.channel.as_deref() == Some(channel))
        {
            if self.newest_left.get(channel).copied().unwrap_or(0) == 0 {
                return;
            }
            if row.claimable() && !self.taken.contains(&row.id) && self.take_fresh(row, false) {
                self.alone(row);
                if let Some(n) = self.newest_left.get_mut(channel) {
                    *n -= 1;
                }
                self.choice.newest.push(row.id);
            }
        }
    }

    /// A row taken that is the only unfinished row of its key: its key is known to be empty
    /// behind it (an [`Ahead`] with no rows), and need not be read there while it is in
    /// flight.
    fn alone(&mut self, row: &Candidate) {
        if let (true, Some(key)) = (row.last, &row.key) {
            self.choice.ahead.push(Ahead {
                key: key.clone(),
                took: vec![row.id],
                after: None,
                rows: Vec::new(),
            });
        }
    }

    /// The rows of channels no sink serves (read claimable already), within their budget.
    fn others(&mut self, rows: &[Candidate]) {
        for row in rows.iter().filter(|r| r.claimable()) {
            if self.others_left == 0 {
                return;
            }
            if self.taken.insert(row.id) {
                self.choice.ids.push(row.id);
                self.others_left -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
