//! Windows read ahead (docs/design.md, "Claims: windows read ahead"). A channel's oldest
//! window reads twice the rows its claim may take, so that rows that are not claimable
//! (waiting for a retry, behind their key) do not cost a second read. Under a backlog of
//! rows without a key most of them are claimable, and the claim leaves the second half
//! unread by anything but itself. The store keeps that half, and the next claim, if it would
//! read nothing but the same windows from where these rows start, takes its rows from them
//! instead of reading: one statement fewer for every other claim of a backlog (on
//! MySQL/MariaDB a claim is otherwise three, elsewhere two).
//!
//! Guarantees: kept rows are only candidates, as any read's; the claim statement checks every
//! row it takes as it always does (unfinished, due, under no live claim; a keyed row's
//! earlier rows), so a kept row that changed meanwhile is simply not taken. They are used
//! only in leader mode (one claimer), only by the claim right after the one that read them,
//! only while each channel's floor is still where they start (a row given back, a retry that
//! came due or a full walk moves it, and the claim reads), only when the claim reads no key,
//! no newest rows, no full walk and no channel no sink serves, only when they hold each
//! channel's whole budget, and never after [`KEPT_FOR`]. Rows with an ordering key are never
//! kept: whether one is claimable depends on rows the claim took.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::choose::{Candidate, Choice};
use super::cursor::Planned;
use super::plan::{Budget, Part};
use crate::store::model::ClaimRequest;

/// Kept rows older than this are dropped: the claim reads again.
pub const KEPT_FOR: Duration = Duration::from_millis(500);

/// What one claim read of its channels' oldest windows and did not take, per channel.
#[derive(Default)]
pub struct WindowsAhead(Mutex<HashMap<String, Kept>>);

/// A channel's rows read ahead.
#[derive(Debug, Clone)]
struct Kept {
    /// The row they lie above: the window's settled row, which its claim made the floor.
    above: Option<i64>,
    /// In id order, as the window read them.
    rows: Vec<Candidate>,
    at: Instant,
}

/// A claim's read: each part and the rows it found.
pub type Found = Vec<(Part, Vec<Candidate>)>;

impl WindowsAhead {
    /// The read to use instead of reading `planned` for `req`, made of the rows kept (see the
    /// module's guarantees); `None`: read. Whatever was kept is dropped either way.
    pub fn instead_of(
        &self,
        planned: &Planned,
        req: &ClaimRequest,
        budgets: &[Budget],
    ) -> Option<Found> {
        let mut kept = std::mem::take(&mut *self.lock());
        if !req.alone || planned.full_walk.is_some() || planned.parts.is_empty() {
            return None;
        }
        let mut found = Vec::with_capacity(planned.parts.len());
        for part in &planned.parts {
            let (channel, from) = oldest_window(part)?;
            let k = kept.remove(channel)?;
            let share = budgets.iter().find(|b| &b.channel == channel)?.total as usize;
            let claimable = k.rows.iter().filter(|r| r.free && r.head).count();
            if k.above != from || k.at.elapsed() > KEPT_FOR || claimable < share {
                return None;
            }
            let window = Part::Window {
                channel: channel.clone(),
                from,
                // As many as it holds: it did not reach the channel's newest row (a window
                // that did is not kept).
                rows: u32::try_from(k.rows.len()).unwrap_or(u32::MAX),
                newest: false,
                sweep: false,
            };
            found.push((window, k.rows));
        }
        Some(found)
    }

    /// After a claim whose read was `found` and whose first choice, `choice`, it got whole:
    /// keeps each oldest window's rows above where the floor now stands, when the read was
    /// nothing but one oldest window per channel.
    pub fn learn(&self, found: Found, choice: &Choice) {
        let mut kept: HashMap<String, Kept> = HashMap::new();
        let mut windows = HashSet::new();
        for (part, rows) in found {
            let Some((channel, from)) = oldest_window(&part) else {
                return;
            };
            if !windows.insert(channel.clone()) {
                // Read on past a window: not one window a channel.
                return;
            }
            let Some(seen) = choice
                .seen
                .iter()
                .find(|s| &s.channel == channel && s.from == from && !s.sweep)
            else {
                return;
            };
            if seen.reached_end || seen.took == 0 {
                continue;
            }
            let above = seen.settled;
            let rest: Vec<Candidate> = rows
                .into_iter()
                .filter(|r| above.is_none_or(|s| r.id > s))
                .filter(|r| r.channel.as_deref() == Some(channel.as_str()))
                .collect();
            if rest.is_empty() || rest.iter().any(|r| r.key.is_some()) {
                continue;
            }
            let at = Instant::now();
            kept.insert(
                channel.clone(),
                Kept {
                    above,
                    rows: rest,
                    at,
                },
            );
        }
        *self.lock() = kept;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        // Replaced whole under the lock: a poisoned lock still holds a valid map.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The channel and floor of an oldest window that is not a full walk's; `None` for any other
/// part.
fn oldest_window(part: &Part) -> Option<(&String, Option<i64>)> {
    match part {
        Part::Window {
            channel,
            from,
            newest: false,
            sweep: false,
            ..
        } => Some((channel, *from)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
