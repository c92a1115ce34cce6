//! [`SqlStore`]: the [`OutboxStore`] over sqlx's `Any` driver. One code path for the three
//! databases; what differs is the SQL text ([`Dialect`]) and the shape of the claim:
//! PostgreSQL and SQLite claim with one `UPDATE ... RETURNING`, MySQL/MariaDB (no UPDATE
//! RETURNING) with `SELECT ... FOR UPDATE SKIP LOCKED` then `UPDATE` in one transaction.
//!
//! Timestamps never cross the wire as values (the `Any` driver cannot decode them): every
//! comparison uses the database clock, and ages come back as integer milliseconds.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::any::{AnyArguments, AnyPoolOptions};
use sqlx::query::Query;
use sqlx::{Any, AnyPool, Executor, Row};

use super::claim::to_claimed;
use super::dialect::placeholders;
use super::{
    ClaimRequest, ClaimedRow, Completion, Dialect, FailedRow, Finished, Incomplete, NewRow,
    OutboxStore, Requeue, RequeueReport, Resolution, Sample, StatusReport, future_ms, migrate,
    mysql, sanitize_text,
};
use crate::BoxFuture;

/// Longest a statement waits for a row or table lock before failing (and being retried).
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Longest a statement may run on the server (migrations of large tables included).
const STATEMENT_TIME: Duration = Duration::from_secs(300);

/// Most rows in one result statement (keeps statements and their parameter lists bounded).
const RESULT_CHUNK: usize = 500;

/// The outbox on a SQL database.
pub struct SqlStore {
    pub(super) pool: AnyPool,
    pub(super) dialect: Dialect,
    /// The outbox table's name (validated as an identifier).
    pub(super) table: String,
    /// The lease names whose row has been inserted (saves a statement per acquire). Per name:
    /// one store may serve several leases, and each needs its own row.
    lease_rows_ready: Mutex<HashSet<String>>,
    /// SQL statements built and sent by this store (BEGIN/COMMIT not counted): what the
    /// benchmark divides by delivered rows.
    statements: AtomicU64,
}

pub(super) type AnyQuery<'q> = Query<'q, Any, AnyArguments>;

fn query(sql: String) -> AnyQuery<'static> {
    sqlx::query(sqlx::AssertSqlSafe(sql))
}

impl SqlStore {
    /// Connects (without migrating). `table` must already be a validated identifier.
    pub async fn connect(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> anyhow::Result<SqlStore> {
        sqlx::any::install_default_drivers();
        let mut dialect = Dialect::from_url(url)
            .ok_or_else(|| anyhow::anyhow!("unsupported database URL scheme"))?;
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let options = AnyPoolOptions::new()
            .max_connections(if in_memory { 1 } else { max_connections })
            .acquire_timeout(connect_timeout);
        // An in-memory SQLite database lives and dies with its one connection.
        let options = if in_memory {
            options.idle_timeout(None).max_lifetime(None)
        } else {
            options
        };
        // A relay paused inside a transaction (SIGSTOP, a stall) must not keep its locks for
        // as long as it is stopped: the server ends such a session after IDLE_TX_TIMEOUT.
        // (MySQL 8 has no such setting; only its claim and migrations use transactions.)
        // Every statement waits at most LOCK_WAIT for a lock and runs at most STATEMENT_TIME
        // on the server: a table locked by another session (a migration, a long transaction
        // of the application's) makes a claim fail and retry instead of hanging, so readiness
        // tells the truth and shutdown is never held up by the database.
        let options = match dialect {
            Dialect::MySql { .. } => options.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {lock}, lock_wait_timeout = {lock}",
                        lock = LOCK_WAIT.as_secs()
                    )))
                    .await?;
                    // MariaDB only; MySQL refuses the unknown variables, which is harmless
                    // (there, max_execution_time bounds SELECTs only).
                    let _ = conn
                        .execute("SET SESSION idle_transaction_timeout = 5")
                        .await;
                    let _ = conn
                        .execute(sqlx::AssertSqlSafe(format!(
                            "SET SESSION max_statement_time = {}",
                            STATEMENT_TIME.as_secs()
                        )))
                        .await;
                    Ok(())
                })
            }),
            Dialect::Postgres => options.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "SET idle_in_transaction_session_timeout = '5s'; SET lock_timeout = '{}ms'; SET statement_timeout = '{}ms'",
                        LOCK_WAIT.as_millis(),
                        STATEMENT_TIME.as_millis()
                    )))
                    .await?;
                    Ok(())
                })
            }),
            Dialect::Sqlite => options,
        };
        let pool = options.connect(url).await?;
        match dialect {
            Dialect::MySql { .. } => {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&pool)
                    .await?;
                let (mariadb, skip_locked) = mysql::capabilities(&version);
                if !skip_locked {
                    tracing::warn!(
                        %version,
                        "server has no FOR UPDATE SKIP LOCKED; claims will wait on each other"
                    );
                }
                dialect = Dialect::MySql {
                    mariadb,
                    skip_locked,
                };
            }
            Dialect::Sqlite if !in_memory => {
                pool.execute("PRAGMA journal_mode=WAL").await?;
            }
            _ => {}
        }
        Ok(SqlStore {
            pool,
            dialect,
            table: table.to_string(),
            lease_rows_ready: Mutex::new(HashSet::new()),
            statements: AtomicU64::new(0),
        })
    }

    /// The pool, for tests and benchmarks that inspect the table directly.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Statements sent so far (see the field).
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    pub(super) fn sql(&self, text: &str) -> AnyQuery<'static> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        query(self.dialect.finalize(text))
    }

    /// One result statement for rows of the same kind and claim token.
    fn result_statement(&self, kind: Kind, token: &str, rows: &[&Completion]) -> AnyQuery<'static> {
        let t = &self.table;
        let d = self.dialect;
        let now = d.now();
        let clear = "claimed_by = NULL, claim_token = NULL, claimed_until = NULL";
        let case_delay = || {
            let mut s = String::from("CASE id");
            for _ in rows {
                s.push_str(" WHEN ? THEN ");
                s.push_str(d.now_plus_ms());
            }
            s.push_str(" END");
            s
        };
        let case_error = || {
            let mut s = String::from("CASE id");
            for _ in rows {
                s.push_str(" WHEN ? THEN ?");
            }
            s.push_str(" END");
            s
        };
        let set = match kind {
            Kind::Delivered => format!(
                "status = 'SUCCESS', attempts = attempts + 1, sent_at = {now}, last_error = NULL"
            ),
            Kind::Retry => format!(
                "status = 'RETRY', attempts = attempts + 1, next_attempt_at = {}, last_error = {}",
                case_delay(),
                case_error()
            ),
            Kind::Failed => format!(
                "status = 'FAILED', attempts = attempts + 1, last_error = {}",
                case_error()
            ),
            Kind::Release => format!(
                "next_attempt_at = {}, last_error = COALESCE({}, last_error)",
                case_delay(),
                case_error()
            ),
        };
        let sql = format!(
            "UPDATE {t} SET {set}, {clear}, updated_at = {now}
             WHERE claim_token = ? AND id IN ({ids})",
            ids = placeholders(rows.len())
        );
        let mut q = self.sql(&sql);
        // Bind in the order the placeholders appear: delays, then errors, then the guard.
        if matches!(kind, Kind::Retry | Kind::Release) {
            for c in rows {
                let delay = match &c.resolution {
                    Resolution::Retry { delay, .. } | Resolution::Release { delay, .. } => *delay,
                    _ => Duration::ZERO,
                };
                q = q.bind(c.id).bind(future_ms(delay));
            }
        }
        if matches!(kind, Kind::Retry | Kind::Failed | Kind::Release) {
            for c in rows {
                let error = match &c.resolution {
                    Resolution::Retry { error, .. } | Resolution::Failed { error } => {
                        Some(sanitize_text(error))
                    }
                    Resolution::Release { error, .. } => error.as_deref().map(sanitize_text),
                    Resolution::Delivered => None,
                };
                q = q.bind(c.id).bind(error);
            }
        }
        q = q.bind(token.to_string());
        for c in rows {
            q = q.bind(c.id);
        }
        q
    }

    /// `UPDATE outbox_relay_lease SET {set}, epoch = epoch + 1 WHERE {filter}` and the new
    /// epoch, in ONE statement: a relay paused mid-transaction would otherwise hold the lease
    /// row's lock, and every fenced claim waits on that lock. PostgreSQL and SQLite return the
    /// epoch with RETURNING; MySQL reports it as the statement's LAST_INSERT_ID.
    async fn bump_epoch(
        &self,
        set: &str,
        filter: &str,
        binds: impl FnOnce(AnyQuery<'static>) -> AnyQuery<'static>,
    ) -> anyhow::Result<Option<i64>> {
        match self.dialect {
            Dialect::MySql { .. } => {
                let r = binds(self.sql(&format!(
                    "UPDATE outbox_relay_lease SET {set}, epoch = LAST_INSERT_ID(epoch + 1)
                     WHERE {filter}"
                )))
                .execute(&self.pool)
                .await?;
                if r.rows_affected() == 0 {
                    return Ok(None);
                }
                let epoch = r
                    .last_insert_id()
                    .ok_or_else(|| anyhow::anyhow!("the server did not report the new epoch"))?;
                Ok(Some(epoch))
            }
            _ => {
                let row = binds(self.sql(&format!(
                    "UPDATE outbox_relay_lease SET {set}, epoch = epoch + 1 WHERE {filter}
                     RETURNING epoch"
                )))
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
            }
        }
    }

    async fn ensure_lease_row(&self, name: &str) -> anyhow::Result<()> {
        if self.lease_rows_ready.lock().is_ok_and(|s| s.contains(name)) {
            return Ok(());
        }
        let sql = match self.dialect {
            Dialect::MySql { .. } => {
                "INSERT IGNORE INTO outbox_relay_lease (name, epoch) VALUES (?, 0)"
            }
            _ => {
                "INSERT INTO outbox_relay_lease (name, epoch) VALUES (?, 0) ON CONFLICT (name) DO NOTHING"
            }
        };
        self.sql(sql)
            .bind(name.to_string())
            .execute(&self.pool)
            .await?;
        if let Ok(mut set) = self.lease_rows_ready.lock() {
            set.insert(name.to_string());
        }
        Ok(())
    }
}

/// Result statements are grouped by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Delivered,
    Retry,
    Failed,
    Release,
}

fn kind_of(r: &Resolution) -> Kind {
    match r {
        Resolution::Delivered => Kind::Delivered,
        Resolution::Retry { .. } => Kind::Retry,
        Resolution::Failed { .. } => Kind::Failed,
        Resolution::Release { .. } => Kind::Release,
    }
}

impl OutboxStore for SqlStore {
    fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn migrate(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let applied = migrate::run(&self.pool, self.dialect, &self.table).await?;
            if applied.is_empty() {
                tracing::info!(table = %self.table, "schema is up to date");
            } else {
                tracing::info!(table = %self.table, ?applied, "schema migrated");
            }
            Ok(())
        })
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.pool.execute("SELECT 1").await?;
            Ok(())
        })
    }

    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>> {
        Box::pin(async move {
            // Nothing asked for: no statement (an empty set of picks is not valid SQL).
            if req.budgets.as_ref().is_some_and(|b| b.total() == 0) || req.limit == 0 {
                return Ok(Vec::new());
            }
            let rows = match self.dialect {
                Dialect::MySql { skip_locked, .. } => self.claim_select(req, skip_locked).await?,
                _ => self.claim_returning(req).await?,
            };
            let mut claimed = Vec::with_capacity(rows.len());
            for row in &rows {
                match to_claimed(row, req) {
                    Ok(r) => claimed.push(r),
                    // Cannot happen with a BIGINT primary key; if it does, the row's claim
                    // expires and the others are still delivered.
                    Err(e) => tracing::error!(error = %e, "a claimed row could not be read"),
                }
            }
            // RETURNING gives no order; delivery order within a batch is id order.
            claimed.sort_by_key(|r| r.delivery.id);
            Ok(claimed)
        })
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, anyhow::Result<u64>> {
        Box::pin(async move {
            if done.is_empty() {
                return Ok(0);
            }
            let mut groups: BTreeMap<(Kind, &str), Vec<(usize, &Completion)>> = BTreeMap::new();
            for (i, c) in done.iter().enumerate() {
                groups
                    .entry((kind_of(&c.resolution), &c.token))
                    .or_default()
                    .push((i, c));
            }
            // Each statement commits on its own (no transaction around them): a relay paused
            // between statements (SIGSTOP, a stall) must not hold row locks that keep every
            // other instance from re-claiming those rows, and then commit stale results when
            // it wakes. The statements are independent and idempotent (guarded by the claim
            // token, which they clear). When one fails, the error says which completions were
            // already written ([`Incomplete`]), so the caller retries only the rest.
            let mut changed = 0;
            let mut handled = Vec::new();
            for ((kind, token), rows) in &groups {
                for chunk in rows.chunks(RESULT_CHUNK) {
                    let refs: Vec<&Completion> = chunk.iter().map(|(_, c)| *c).collect();
                    let q = self.result_statement(*kind, token, &refs);
                    match q.execute(&self.pool).await {
                        Ok(r) => {
                            changed += r.rows_affected();
                            handled.extend(chunk.iter().map(|(i, _)| *i));
                        }
                        Err(e) if handled.is_empty() => return Err(e.into()),
                        Err(e) => {
                            return Err(Incomplete {
                                handled,
                                changed,
                                source: e.into(),
                            }
                            .into());
                        }
                    }
                }
            }
            Ok(changed)
        })
    }

    fn enqueue<'a>(&'a self, row: &'a NewRow) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async move {
            let t = &self.table;
            let payload = self.dialect.payload_param();
            let insert = format!(
                "INSERT INTO {t} (channel, recipient, payload, ordering_key) VALUES (?, ?, {payload}, ?)"
            );
            let bind = |q: AnyQuery<'static>| {
                q.bind(row.channel.clone())
                    .bind(row.recipient.clone())
                    .bind(row.payload.clone())
                    .bind(row.ordering_key.clone())
            };
            match self.dialect {
                Dialect::MySql { .. } => {
                    let r = bind(self.sql(&insert)).execute(&self.pool).await?;
                    r.last_insert_id()
                        .ok_or_else(|| anyhow::anyhow!("the database returned no id"))
                }
                _ => {
                    let sql = format!("{insert} RETURNING id");
                    let r = bind(self.sql(&sql)).fetch_one(&self.pool).await?;
                    Ok(r.try_get::<i64, _>(0)?)
                }
            }
        })
    }

    fn status<'a>(&'a self, lease: &'a str) -> BoxFuture<'a, anyhow::Result<StatusReport>> {
        Box::pin(self.status_report(lease))
    }

    fn failed<'a>(
        &'a self,
        limit: u32,
        channel: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<Vec<FailedRow>>> {
        Box::pin(self.failed_rows(limit, channel))
    }

    fn requeue<'a>(
        &'a self,
        selection: &'a Requeue,
        dry_run: bool,
    ) -> BoxFuture<'a, anyhow::Result<RequeueReport>> {
        Box::pin(self.requeue_rows(selection, dry_run))
    }

    fn purge<'a>(
        &'a self,
        status: Finished,
        older_than: Duration,
        batch: u32,
    ) -> BoxFuture<'a, anyhow::Result<u64>> {
        Box::pin(self.purge_batch(status, older_than, batch))
    }

    fn sample(&self) -> BoxFuture<'_, anyhow::Result<Sample>> {
        Box::pin(self.sample_table())
    }

    fn lease_acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, anyhow::Result<Option<i64>>> {
        Box::pin(async move {
            self.ensure_lease_row(name).await?;
            let d = self.dialect;
            let set = format!("holder = ?, lease_until = {plus}", plus = d.now_plus_ms());
            let filter = format!(
                "name = ? AND (holder IS NULL OR lease_until IS NULL OR lease_until < {now})",
                now = d.now()
            );
            let binds = |q: AnyQuery<'static>| {
                q.bind(holder.to_string())
                    .bind(future_ms(ttl))
                    .bind(name.to_string())
            };
            self.bump_epoch(&set, &filter, binds).await
        })
    }

    fn lease_renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        epoch: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let n = self
                .sql(&format!(
                    "UPDATE outbox_relay_lease SET lease_until = {plus}
                     WHERE name = ? AND holder = ? AND epoch = ?",
                    plus = self.dialect.now_plus_ms()
                ))
                .bind(future_ms(ttl))
                .bind(name.to_string())
                .bind(holder.to_string())
                .bind(epoch)
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(n == 1)
        })
    }

    fn lease_release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        epoch: i64,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            self.sql(
                "UPDATE outbox_relay_lease SET holder = NULL, lease_until = NULL
                 WHERE name = ? AND holder = ? AND epoch = ?",
            )
            .bind(name.to_string())
            .bind(holder.to_string())
            .bind(epoch)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn advance_epoch<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async move {
            self.ensure_lease_row(name).await?;
            let binds = |q: AnyQuery<'static>| q.bind(holder.to_string()).bind(name.to_string());
            self.bump_epoch("holder = ?, lease_until = NULL", "name = ?", binds)
                .await?
                .ok_or_else(|| anyhow::anyhow!("lease row {name} vanished"))
        })
    }
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("dialect", &self.dialect)
            .field("table", &self.table)
            .finish()
    }
}
