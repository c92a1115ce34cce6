//! [`Arrivals`]: what tells the relay loop that rows may have arrived. Noticing new rows on
//! databases without NOTIFY (MySQL/MariaDB, SQLite, and PostgreSQL with
//! `database.listen = false`): the newest id is read every [`NEW_ROWS_CHECK`] and the relay
//! loop is woken when it grows, so a committed row waits about that long instead of up to
//! `relay.poll_interval`.
//!
//! Cost: one `SELECT MAX(id)` per check, answered from the end of the primary key (one index
//! probe, whatever the table holds), 15.6 per second, idle or not. With the idle poll's
//! read (`Queue::probe`, two a second) and the lease's renewals, an idle relay
//! stays under 20 statements a second in all (docs/design.md, "Idle cost"). It is only a hint,
//! like NOTIFY: the poll stays the source of truth. A row that commits after a row with a
//! higher id (MySQL allocates ids before commit) does not move the maximum; it is found by
//! the next claim or poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use sqlx::Row;

use crate::BoxFuture;
use crate::store::db::Db;

/// What the table's watchers (PostgreSQL's NOTIFY listener, the newest-id check) tell the
/// relay loop: rows may have arrived. It wakes the loop and marks the arrival, so that under
/// a backlog the next claim also takes each channel's newest rows and a row just committed is
/// claimed in the next claim round, not behind the backlog (docs/design.md, "Oldest first, but
/// not only").
pub struct Arrivals {
    /// The relay loop's wake-up, shared with the deliveries and the recorder.
    wake: Arc<Notify>,
    /// Rows arrived since the loop last looked.
    fresh: AtomicBool,
    /// Every committed insert is signalled: PostgreSQL's listener is connected (and was when
    /// the loop last read the table). The newest-id check is not enough: a row that commits
    /// after a higher id does not move it.
    announced: AtomicBool,
}

impl Arrivals {
    /// Arrivals that wake `wake`.
    pub fn new(wake: Arc<Notify>) -> Arc<Arrivals> {
        Arc::new(Arrivals {
            wake,
            fresh: AtomicBool::new(false),
            announced: AtomicBool::new(false),
        })
    }

    /// The listener is connected (`true`) or lost (`false`). A reconnection is followed by a
    /// [`Arrivals::signal`]: rows may have arrived unannounced meanwhile.
    pub fn set_announced(&self, on: bool) {
        self.announced.store(on, Ordering::Release);
    }

    /// Whether every committed insert is signalled now: then an idle relay need not look at
    /// the table for new rows, only for rows whose time comes (docs/design.md, "Idle cost").
    pub fn announced(&self) -> bool {
        self.announced.load(Ordering::Acquire)
    }

    /// Rows may have arrived: mark it and wake the loop.
    pub fn signal(&self) {
        self.fresh.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Whether rows arrived since the last [`Arrivals::take`] (and remember it).
    pub fn pending(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    /// Whether rows arrived since the last call (and forget it).
    pub fn take(&self) -> bool {
        self.fresh.swap(false, Ordering::AcqRel)
    }
}

/// How often the newest id is read: a new row waits at most this long before the claim
/// that takes it starts (32 ms on average). At 50 ms the checks alone were 20 a second, all
/// an idle relay may cost the database (docs/design.md, "Idle cost").
pub const NEW_ROWS_CHECK: Duration = Duration::from_millis(64);

/// The highest id in the table, if any row exists: one probe of the end of the primary key.
pub async fn newest_id(db: &Db) -> anyhow::Result<Option<i64>> {
    let row = db
        .sql(&format!("SELECT MAX({}) FROM {}", db.cols().id, db.table()))
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get::<Option<i64>, _>(0)?)
}

/// A table whose newest id can be read (`SqlStore`).
pub trait NewestId: Send + Sync {
    /// The highest id in the table, if any row exists.
    fn newest_id(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>>;
}

/// Signals `arrivals` whenever the newest id grows, until `stop`. Errors are left to the relay
/// loop (its claims fail and report them); the check just tries again next time.
pub async fn watch_new_rows<S: NewestId + ?Sized>(
    store: Arc<S>,
    arrivals: Arc<Arrivals>,
    stop: CancellationToken,
) {
    // `None` until the first successful read; then the newest id seen (`None` in it: empty).
    let mut newest: Option<Option<i64>> = None;
    let mut tick = tokio::time::interval(NEW_ROWS_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Ok(now) = store.newest_id().await {
            match newest {
                Some(seen) if now > seen => {
                    arrivals.signal();
                    newest = Some(now);
                }
                Some(_) => {}
                None => newest = Some(now),
            }
        }
    }
}
