//! [`SqlStore`]: the outbox table on one database, as the rest of the relay sees it. It holds
//! the [`Db`] handle, the database's [`Engine`], and the state that lives as long as the store
//! (the claims' floors and windows, the lease rows known to exist); every method hands the
//! work to the folder that does it. No SQL here.

use std::time::Duration;

use sqlx::AnyPool;

use crate::BoxFuture;
use crate::store::admin::{console, status, verbs};
use crate::store::claim::Claims;
use crate::store::db::{Db, Opening, open_side_by_side};
use crate::store::engine::{Engine, engine};
use crate::store::locks::lease_table::{Leases, lease_row};
use crate::store::locks::shedlock::{ShedLock, ShedLockTable};
use crate::store::locks::{Answer, Epoch, Hold, LeaseTable};
use crate::store::model::{
    ChannelCounts, ClaimRequest, ClaimedRow, Completion, FailedFilter, FailedRow, Finished,
    LeaseRow, NewRow, Probe, Requeue, RequeueReport, RowDetail, Sample, StatusReport,
};
use crate::store::mysql::get_lock::LockSession;
use crate::store::queue::arrivals::{self, NewestId};
use crate::store::queue::{Queue, WriteError, results};
use crate::store::schema::adopt::Plan as AdoptPlan;
use crate::store::schema::check::Problem;
use crate::store::schema::{adopt, check, live, migrate};
use crate::store::sql::{Columns, Dialect};

/// The outbox on a SQL database.
pub struct SqlStore {
    db: Db,
    engine: &'static dyn Engine,
    claims: Claims,
    leases: Leases,
    /// The lease table's own connection (see [`SqlStore::lease_db`]).
    lease_db: tokio::sync::OnceCell<Db>,
    /// What opening the lease table's connection needs (the URL is never logged).
    lease_opening: LeaseOpening,
}

/// How the lease table's own connection is opened.
struct LeaseOpening {
    url: String,
    connect_timeout: Duration,
}

impl SqlStore {
    /// Connects (without migrating), opening one connection. `table` must already be a
    /// validated identifier.
    pub async fn connect(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> anyhow::Result<SqlStore> {
        SqlStore::connect_opening(url, table, max_connections, connect_timeout, 1).await
    }

    /// Connects (without migrating), opening up to `open` connections side by side before
    /// anything else (at least one must open). The relay opens
    /// [`WARM_CONNECTIONS`](crate::store::db::WARM_CONNECTIONS) here, before its migration runs,
    /// so that opening them costs one connection's time before the first claim, not two
    /// (docs/design.md, "Connections").
    pub async fn connect_opening(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
        open: u32,
    ) -> anyhow::Result<SqlStore> {
        let dialect = Dialect::from_url(url)
            .ok_or_else(|| anyhow::anyhow!("unsupported database URL scheme"))?;
        let engine = engine(dialect);
        let db = Db::open(Opening {
            url,
            dialect,
            table,
            syntax: engine,
            connect: engine,
            max_connections,
            connect_timeout,
            open,
        })
        .await?;
        Ok(SqlStore {
            db,
            engine,
            claims: Claims::new(engine.claims()),
            leases: Leases::new(engine),
            lease_db: tokio::sync::OnceCell::new(),
            lease_opening: LeaseOpening {
                url: url.to_string(),
                connect_timeout,
            },
        })
    }

    /// Where the lease row is read and written: a connection of its own, opened on first
    /// use, so that a lease renewal never waits for a connection the claims, result writes
    /// or admin verbs hold, nor behind their statements (docs/design.md, "Leases and
    /// fencing"). A database that lives in one connection (in-memory SQLite) has no second
    /// one: there the store's own pool serves.
    async fn lease_db(&self) -> anyhow::Result<&Db> {
        if self.engine.one_connection(&self.lease_opening.url) {
            return Ok(&self.db);
        }
        self.lease_db
            .get_or_try_init(|| async {
                let o = &self.lease_opening;
                let db = Db::open(Opening {
                    url: &o.url,
                    dialect: self.db.dialect(),
                    table: self.db.table(),
                    syntax: self.engine,
                    connect: self.engine,
                    max_connections: 1,
                    connect_timeout: o.connect_timeout,
                    open: 1,
                })
                .await?;
                Ok::<Db, anyhow::Error>(db.with_columns(self.db.cols().clone()))
            })
            .await
    }

    /// Opens up to `n` connections side by side (at most the pool's maximum) and leaves
    /// them idle in the pool, so that the relay's first claims and result writes do
    /// not each wait for a connection of their own to be opened.
    pub async fn warm(&self, n: u32) -> anyhow::Result<()> {
        open_side_by_side(self.db.pool(), n).await
    }

    /// The same store on a table mapped by `[table]` (docs/adopting-a-table.md).
    pub fn with_columns(self, cols: Columns) -> SqlStore {
        SqlStore {
            db: self.db.with_columns(cols),
            ..self
        }
    }

    /// The table's mapping.
    pub fn columns(&self) -> &Columns {
        self.db.cols()
    }

    /// The pool, for tests and benchmarks that inspect the table directly.
    pub fn pool(&self) -> &AnyPool {
        self.db.pool()
    }

    /// Which database this is.
    pub fn dialect(&self) -> Dialect {
        self.db.dialect()
    }

    /// The database's current time as SQL, for tests that write times of their own.
    pub fn now_sql(&self) -> &'static str {
        self.db.syntax().now()
    }

    /// SQL statements built and sent by this store (BEGIN/COMMIT not counted): what the
    /// benchmark divides by delivered rows.
    pub fn statements(&self) -> u64 {
        self.db.statements() + self.lease_db.get().map_or(0, Db::statements)
    }

    /// Creates or upgrades the tables (idempotent, safe to run from several instances).
    pub async fn migrate(&self) -> anyhow::Result<()> {
        if self.db.cols().mapped {
            return migrate::lease_only(&self.db, self.engine).await;
        }
        let applied = migrate::run(&self.db, self.engine).await?;
        let table = self.db.table();
        if applied.is_empty() {
            tracing::info!(table, "schema is up to date");
        } else {
            tracing::info!(table, ?applied, "schema migrated");
        }
        Ok(())
    }

    /// A cheap round trip (readiness).
    pub async fn ping(&self) -> anyhow::Result<()> {
        self.db.sql("SELECT 1").execute(self.db.pool()).await?;
        Ok(())
    }

    /// Inserts a row and returns its id (the `enqueue` verb, tests and benchmarks).
    pub async fn enqueue(&self, row: &NewRow) -> anyhow::Result<i64> {
        verbs::enqueue(&self.db, self.engine, row, None).await
    }

    /// [`SqlStore::enqueue`] with the writer's trace context in the `traceparent` and
    /// `tracestate` columns (`enqueue --traceparent`, tests; docs/tracing.md).
    pub async fn enqueue_traced(
        &self,
        row: &NewRow,
        trace: &crate::sink::TraceContext,
    ) -> anyhow::Result<i64> {
        verbs::enqueue(&self.db, self.engine, row, Some(trace)).await
    }
}

/// The operator's queries (the CLI's verbs, retention, the table gauges, the console).
impl SqlStore {
    /// Counts and ages for `status`; `lease` names the lease row to show.
    pub async fn status(&self, lease: &str) -> anyhow::Result<StatusReport> {
        status::status(&self.db, self.engine, lease).await
    }

    /// Counts for the table gauges (SUCCESS rows only when `count_success`).
    pub async fn sample(&self, count_success: bool) -> anyhow::Result<Sample> {
        status::sample(&self.db, self.engine, count_success).await
    }

    /// The statements of the gauges that read the unfinished rows (the oldest row's age, the
    /// blocked keys), as `sample` runs them: tests check their plans.
    #[doc(hidden)]
    pub fn gauge_statements(&self) -> Vec<String> {
        status::gauge_statements(&self.db, self.engine)
    }

    /// Live claims per instance: (claimed_by, rows under a claim that has not run out).
    pub async fn live_claims(&self) -> anyhow::Result<Vec<(String, i64)>> {
        status::live_claims(&self.db).await
    }

    /// The lease row `name`, for the console (`None` before any acquisition).
    pub async fn lease(&self, name: &str) -> anyhow::Result<Option<LeaseRow>> {
        lease_row(&self.db, name).await
    }

    /// FAILED rows, newest first.
    pub async fn failed(
        &self,
        limit: u32,
        channel: Option<&str>,
    ) -> anyhow::Result<Vec<FailedRow>> {
        console::failed(&self.db, self.engine, limit, channel).await
    }

    /// Puts FAILED rows back to PENDING (attempts reset); other rows are left alone.
    pub async fn requeue(
        &self,
        selection: &Requeue,
        dry_run: bool,
    ) -> anyhow::Result<RequeueReport> {
        verbs::requeue(&self.db, self.engine, selection, dry_run).await
    }

    /// Deletes up to `batch` rows of `status` last updated more than `older_than` ago.
    pub async fn purge(
        &self,
        status: Finished,
        older_than: Duration,
        batch: u32,
    ) -> anyhow::Result<u64> {
        verbs::purge(&self.db, self.engine, status, older_than, batch).await
    }

    /// The console's overview: per channel counts and ages.
    pub async fn overview(&self) -> anyhow::Result<Vec<ChannelCounts>> {
        console::overview(&self.db, self.engine).await
    }

    /// Up to `limit` FAILED rows matching `f` below `before`, newest first.
    pub async fn failed_page(
        &self,
        f: &FailedFilter,
        before: Option<i64>,
        limit: u32,
    ) -> anyhow::Result<Vec<FailedRow>> {
        console::failed_page(&self.db, self.engine, f, before, limit).await
    }

    /// The newest FAILED row `f` matches.
    pub async fn newest_failed(&self, f: &FailedFilter) -> anyhow::Result<Option<i64>> {
        console::newest_failed(&self.db, self.engine, f).await
    }

    /// How many `status` rows `purge` would delete now.
    pub async fn count_older(&self, status: Finished, older_than: Duration) -> anyhow::Result<i64> {
        console::count_older(&self.db, status, older_than).await
    }

    /// Every column of row `id`, or `None` if there is no such row.
    pub async fn row(&self, id: i64) -> anyhow::Result<Option<RowDetail>> {
        console::row(&self.db, id).await
    }
}

/// A table mapped by `[table]` (docs/adopting-a-table.md).
impl SqlStore {
    /// The statements `migrate --adopt` would run now, in order (empty: nothing to do).
    /// Changes nothing; refuses a mapping the live check finds wrong.
    pub async fn adopt_plan(&self) -> anyhow::Result<AdoptPlan> {
        adopt::plan(&self.db, self.engine).await
    }

    /// Runs `plan` (from [`SqlStore::adopt_plan`]) and creates the lease table, all or
    /// nothing.
    pub async fn adopt(&self, plan: &AdoptPlan) -> anyhow::Result<()> {
        adopt::run(&self.db, self.engine, plan).await
    }

    /// Reads the mapped table's column types from the live table, so that each column is
    /// read as text in its type's format (docs/adopting-a-table.md, "Types"). A table that
    /// cannot be read is left to the live check to report.
    pub async fn read_live_types(self) -> SqlStore {
        if !self.db.cols().mapped {
            return self;
        }
        let types = match live::columns(&self.db, self.engine).await {
            Ok(Some(cols)) => live::text_types(&self.db, self.engine, &cols),
            _ => return self,
        };
        SqlStore {
            db: self.db.with_types(types),
            ..self
        }
    }

    /// Checks the mapping against the live table. Empty: the relay can run on it.
    pub async fn check_table(&self) -> anyhow::Result<Vec<Problem>> {
        check::check_table(&self.db, self.engine).await
    }
}

/// The Java schedulers' locks (docs/migrating-from-java.md).
impl SqlStore {
    /// A dedicated session for the `GET_LOCK` lock `name` (MySQL/MariaDB only).
    pub async fn lock_session(&self, name: &str) -> anyhow::Result<LockSession> {
        LockSession::open(&self.db, name).await
    }

    /// The connection id holding the `GET_LOCK` lock `name`, if any (for `status`).
    pub async fn get_lock_holder(&self, name: &str) -> anyhow::Result<Option<i64>> {
        LockSession::holder(&self.db, name).await
    }

    /// ShedLock's statements on this database, for the `shedlock` lease and `status`.
    pub fn shedlock<'a>(&'a self, table: &'a ShedLockTable) -> ShedLock<'a> {
        ShedLock {
            db: &self.db,
            sql: self.engine,
            table,
        }
    }
}

/// Hooks for tests.
impl SqlStore {
    /// Makes the next periodic full walk of the floors `period` away, as after a walk that
    /// took a twentieth of it (a walk past many rows waiting for later). Walks planned for
    /// this store's own retries still happen when they come due.
    #[doc(hidden)]
    pub fn hold_full_walks(&self, period: Duration) {
        self.claims.hold_full_walks(period);
    }

    /// SQLite's plans of a claim of `ids` for `req` and of a read of the unserved channels
    /// below `below` (`EXPLAIN QUERY PLAN`'s details); `None` on the other databases.
    #[doc(hidden)]
    pub async fn sqlite_plans(
        &self,
        req: &ClaimRequest,
        ids: &[i64],
        below: &str,
    ) -> anyhow::Result<Option<[Vec<String>; 2]>> {
        self.claims.plans(&self.db, req, ids, below).await
    }
}

impl Queue for SqlStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>> {
        Box::pin(self.claims.claim(&self.db, req))
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, Result<u64, WriteError>> {
        Box::pin(async move {
            if done.is_empty() {
                return Ok(0);
            }
            let written = {
                let _writing = self.db.writing().await;
                results::write(&self.db, self.engine, done).await
            };
            self.claims.completed(done);
            written
        })
    }

    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(self.claims.probe(&self.db, req))
    }

    fn more_behind(&self) -> bool {
        self.claims.more_behind()
    }
}

impl LeaseTable for SqlStore {
    fn lease_acquire<'a>(&'a self, name: &'a str, holder: &'a str, ttl: Duration) -> Epoch<'a> {
        Box::pin(async move {
            let db = self.lease_db().await?;
            self.leases.acquire(db, name, holder, ttl).await
        })
    }

    fn lease_renew<'a>(&'a self, hold: Hold<'a>, ttl: Duration) -> Answer<'a, bool> {
        Box::pin(async move { self.leases.renew(self.lease_db().await?, hold, ttl).await })
    }

    fn lease_release<'a>(&'a self, hold: Hold<'a>) -> Answer<'a, ()> {
        Box::pin(async move { self.leases.release(self.lease_db().await?, hold).await })
    }

    fn advance_epoch<'a>(&'a self, name: &'a str, holder: &'a str) -> Answer<'a, i64> {
        Box::pin(async move {
            let db = self.lease_db().await?;
            self.leases.advance_epoch(db, name, holder).await
        })
    }

    /// Readiness of the lease backend: a round trip on the lease's own connection.
    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let db = self.lease_db().await?;
            db.sql("SELECT 1").execute(db.pool()).await?;
            Ok(())
        })
    }
}

impl NewestId for SqlStore {
    fn newest_id(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(arrivals::newest_id(&self.db))
    }
}

impl SqlStore {
    /// The highest id in the table, if any row exists.
    pub async fn newest_id(&self) -> anyhow::Result<Option<i64>> {
        arrivals::newest_id(&self.db).await
    }
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore").field("db", &self.db).finish()
    }
}
