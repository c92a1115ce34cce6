//! The relay's seam, [`Queue`] (claim, complete, probe), and what runs behind it besides the
//! claims themselves: writing results (`results.rs`), noticing new rows (`arrivals.rs`), and
//! the database thread the relay's calls run on (`db_thread.rs`).

pub mod arrivals;
pub mod db_thread;
pub mod results;

use std::fmt;

use crate::BoxFuture;
use crate::store::fault::is_transient;
use crate::store::model::{ClaimRequest, ClaimedRow, Completion, Probe};

/// The relay's seam: claiming rows and writing their results back. `SqlStore` is the
/// implementation; the relay's unit tests use an in-memory one.
pub trait Queue: Send + Sync {
    /// Claims due rows, in id order: at most `req.limit`, or each budget's worth with
    /// [`ClaimRequest::budgets`].
    fn claim<'a>(&'a self, req: &'a ClaimRequest)
    -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>>;
    /// Writes results back, guarded by each row's claim token. Returns the rows changed; a
    /// result whose claim is no longer live changes nothing. A failure says which results
    /// were written before it and whether the rest may be retried as they are
    /// ([`WriteError`]).
    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, Result<u64, WriteError>>;
    /// Whether anything is claimable for `req` now: one plain read (no lock, no fence, no
    /// write, no transaction). An idle relay's poll asks it before it claims: on MySQL/MariaDB
    /// a claim that finds nothing is still four statements (`BEGIN`, the fence, the locking
    /// picks, `COMMIT`), and on PostgreSQL its shared lock on the lease row takes a
    /// transaction id and writes WAL (docs/design.md, "Idle cost").
    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>>;
    /// Whether the last claim stopped at its bound on reads with rows beyond what it read,
    /// none of what it read claimable by it: claim again at once, not after a poll
    /// (docs/design.md, "When the loop claims").
    fn more_behind(&self) -> bool {
        false
    }
}

/// Why a result write stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The moment, not the data (a lost connection, a lock or statement timeout, a deadlock,
    /// a server shutting down): the same write can succeed later.
    Transient,
    /// The database refused the data (a value it rejects, a trigger, a constraint): the same
    /// write fails again; the row at fault must be isolated.
    Refused,
}

/// A result write that did not write everything (docs/design.md, "Results").
#[derive(Debug)]
pub struct WriteError {
    /// Positions (in the slice given to [`Queue::complete`]) of the results written before
    /// the failure: not to be written again (their claim token is cleared, so a second write
    /// would change nothing and be miscounted).
    pub handled: Vec<usize>,
    /// Rows changed by what was written.
    pub changed: u64,
    pub failure: Failure,
    pub source: anyhow::Error,
}

impl WriteError {
    /// A write that failed before anything was written, classified by its cause.
    pub fn nothing_written(source: anyhow::Error) -> WriteError {
        WriteError::after(Vec::new(), 0, source)
    }

    /// A write that failed after `handled` results were written, classified by its cause.
    pub fn after(handled: Vec<usize>, changed: u64, source: anyhow::Error) -> WriteError {
        let failure = match is_transient(&source) {
            true => Failure::Transient,
            false => Failure::Refused,
        };
        WriteError {
            handled,
            changed,
            failure,
            source,
        }
    }
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.handled.len() {
            0 => write!(f, "writing results failed: {:#}", self.source),
            n => write!(
                f,
                "writing results failed after {n} of them were written: {:#}",
                self.source
            ),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_error_is_classified_by_its_cause() {
        let lost = WriteError::nothing_written(anyhow::Error::new(sqlx::Error::PoolTimedOut));
        assert_eq!(lost.failure, Failure::Transient);
        let refused = WriteError::after(vec![0], 1, anyhow::Error::new(sqlx::Error::RowNotFound));
        assert_eq!(refused.failure, Failure::Refused);
        assert_eq!(refused.handled, [0]);
        assert!(refused.to_string().contains("after 1 of them"), "{refused}");
    }
}
