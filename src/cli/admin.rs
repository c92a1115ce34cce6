//! The short-lived verbs: `migrate`, `enqueue`, `status`, `failed`, `check-config`.

use std::sync::Arc;

use super::{CliError, PurgeStatus, say};
use crate::config::{Settings, duration};
use crate::housekeeping;
use crate::sink::TraceContext;
use crate::sink::trace::TRACESTATE_MAX;
use crate::store::{self, Finished, NewRow, Requeue, SqlStore};

/// Opens the store. The embedded SQLite default is also migrated, so `enqueue` and `status`
/// work on a fresh checkout before `run` ever started.
pub(super) async fn open(settings: &Settings) -> Result<Arc<SqlStore>, CliError> {
    let store = connect(settings).await?;
    if store.dialect() == store::Dialect::Sqlite {
        store.migrate().await?;
    }
    Ok(store)
}

/// Opens the store without changing anything (`migrate --adopt`, which creates the lease
/// table itself, and only when it changes anything; with `--dry-run`, nothing).
async fn connect(settings: &Settings) -> Result<Arc<SqlStore>, CliError> {
    let db = &settings.database;
    let store = store::connect_mapped(
        db.url.expose(),
        &db.table,
        &settings.table,
        2,
        db.connect_timeout,
        1,
    )
    .await
    .map_err(|e| {
        CliError::Runtime(anyhow::anyhow!(
            "cannot connect to {}: {e}",
            settings.database_url_redacted()
        ))
    })?;
    Ok(store)
}

pub(super) async fn migrate(
    settings: &Settings,
    adopt: bool,
    dry_run: bool,
) -> Result<(), CliError> {
    let mapped = settings.table.is_mapped();
    if adopt && !mapped {
        return Err(CliError::Usage(
            "migrate --adopt is for an existing table mapped by [table] (see \
             docs/adopting-a-table.md); plain `migrate` creates the relay's own table"
                .into(),
        ));
    }
    let table = &settings.database.table;
    if adopt {
        let store = connect(settings).await?;
        // A mapping the table does not fit is refused as `check-config` refuses it (exit 2),
        // before anything is planned or changed.
        let wrong: Vec<store::Problem> = store
            .check_table()
            .await?
            .into_iter()
            .filter(|p| !p.adopt)
            .collect();
        if !wrong.is_empty() {
            return Err(CliError::Usage(format!(
                "{}
nothing was changed",
                table_problems(table, &wrong)
            )));
        }
        let plan = store.adopt_plan().await?;
        if plan.is_empty() {
            say!("table {table} already has everything the relay needs; nothing to change");
        }
        for statement in plan.statements() {
            say!(
                "{};",
                statement.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
        if dry_run {
            say!("dry run: nothing was changed");
            return Ok(());
        }
        store.adopt(&plan).await?;
        say!(
            "table {table} adopted on {} ({}): {} statement(s) applied",
            settings.database_url_redacted(),
            store.dialect().name(),
            plan.len()
        );
        return Ok(());
    }
    let store = open(settings).await?;
    store.migrate().await?;
    ensure_shedlock_table(settings, &store).await?;
    if mapped {
        say!(
            "table {table} is mapped by [table]: only the lease table was created; run \
             `outbox-relay migrate --adopt` to add the relay's columns to it"
        );
    } else {
        say!(
            "schema of table {} is up to date on {} ({})",
            table,
            settings.database_url_redacted(),
            store.dialect().name()
        );
    }
    Ok(())
}

pub(super) async fn enqueue(
    settings: &Settings,
    row: NewRow,
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> Result<(), CliError> {
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&row.payload) {
        return Err(CliError::Usage(format!("--payload is not valid JSON: {e}")));
    }
    // A person typed it: refused here, where a relay would ignore it (docs/tracing.md).
    let trace = match &traceparent {
        Some(tp) => match TraceContext::parse(tp, tracestate.as_deref()) {
            Some(t) if tracestate.is_none() || t.state == tracestate => Some(t),
            Some(_) => {
                return Err(CliError::Usage(format!(
                    "--tracestate is not a W3C tracestate of at most {TRACESTATE_MAX} characters"
                )));
            }
            None => {
                return Err(CliError::Usage(
                    "--traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)".into(),
                ));
            }
        },
        None => None,
    };
    if !settings.sinks.contains_key(&row.channel) {
        eprintln!(
            "warning: no sink named \"{}\" is configured here; a relay with this \
             configuration would mark the row FAILED",
            row.channel
        );
    }
    let store = open(settings).await?;
    let id = match &trace {
        Some(t) => store.enqueue_traced(&row, t).await?,
        None => store.enqueue(&row).await?,
    };
    say!("enqueued row {id}");
    Ok(())
}

pub(super) async fn status(settings: &Settings) -> Result<(), CliError> {
    let store = open(settings).await?;
    let report = store.status(&settings.lease.name).await?;
    say!(
        "database {} ({}), table {}",
        settings.database_url_redacted(),
        store.dialect().name(),
        settings.database.table
    );
    if report.counts.is_empty() {
        say!("no rows");
    } else {
        say!("{:<8} {:<20} {:>10}", "STATUS", "CHANNEL", "ROWS");
        for (status, channel, n) in &report.counts {
            say!("{status:<8} {channel:<20} {n:>10}");
        }
        let any = |f: &dyn Fn(&str) -> bool| report.counts.iter().any(|(s, _, _)| f(s));
        if any(&|s| s == "PARKED") {
            say!(
                "PARKED: the database refused every result for these rows, so they are not \
                 claimed again (see the relay's log); fix the cause, then `outbox-relay requeue \
                 --id <id>` (docs/adopting-a-table.md)"
            );
        }
        if any(&|s| s == "NULL" || s.starts_with("UNKNOWN(")) {
            say!(
                "NULL, UNKNOWN(...): a status no state of [table.status] maps; the relay never \
                 claims these rows"
            );
        }
    }
    match report.oldest_pending {
        Some(age) => say!("oldest pending: {:.1}s", age.as_secs_f64()),
        None => say!("oldest pending: none"),
    }
    match &report.lease {
        Some(l) => match (&l.holder, l.remaining_ms) {
            (Some(h), Some(ms)) if ms > 0 => say!(
                "lease {}: held by {h}, epoch {}, expires in {:.1}s",
                settings.lease.name,
                l.epoch,
                ms as f64 / 1000.0
            ),
            // Redis (and Redlock) leases live in Redis: the row only records the epoch and
            // who took it last, with no expiry.
            (Some(h), None) => say!(
                "lease {}: epoch {} taken by {h} (the live lease is kept by the {} backend; \
                 this is the last holder recorded in the database)",
                settings.lease.name,
                l.epoch,
                match settings.lease.backend {
                    crate::config::LeaseBackend::Redis => "redis",
                    crate::config::LeaseBackend::Redlock => "redlock",
                    b @ (crate::config::LeaseBackend::Redisson
                    | crate::config::LeaseBackend::Shedlock
                    | crate::config::LeaseBackend::MysqlGetLock) =>
                        b.java_lock().unwrap_or_default(),
                    crate::config::LeaseBackend::Database => "database",
                    crate::config::LeaseBackend::None => "none",
                }
            ),
            _ => say!("lease {}: free (epoch {})", settings.lease.name, l.epoch),
        },
        None => say!("lease {}: never taken", settings.lease.name),
    }
    java_lock_status(settings, &store).await?;
    if report.claims.is_empty() {
        say!("live claims: none");
    }
    for (who, n) in &report.claims {
        say!("live claims: {who}: {n}");
    }
    Ok(())
}

pub(super) async fn failed(
    settings: &Settings,
    limit: u32,
    channel: Option<String>,
) -> Result<(), CliError> {
    let store = open(settings).await?;
    let rows = store.failed(limit, channel.as_deref()).await?;
    if rows.is_empty() {
        say!("no FAILED rows");
        return Ok(());
    }
    say!(
        "{:>10} {:<16} {:>8} {:<19} LAST ERROR",
        "ID",
        "CHANNEL",
        "ATTEMPTS",
        "UPDATED (UTC)"
    );
    for r in rows {
        say!(
            "{:>10} {:<16} {:>8} {:<19} {}",
            r.id,
            r.channel,
            r.attempts,
            r.updated_at.as_deref().unwrap_or("-"),
            r.last_error.unwrap_or_default()
        );
    }
    Ok(())
}

pub(super) async fn requeue(
    settings: &Settings,
    ids: Vec<i64>,
    all_failed: bool,
    channel: Option<String>,
    dry_run: bool,
) -> Result<(), CliError> {
    let store = open(settings).await?;
    let selection = if all_failed {
        Requeue::AllFailed { channel }
    } else {
        Requeue::Ids(ids)
    };
    let report = store.requeue(&selection, dry_run).await?;
    for (id, status) in &report.not_failed {
        say!("row {id} is {status}, not FAILED: left unchanged");
    }
    for id in &report.missing {
        say!("row {id} does not exist");
    }
    let verb = if dry_run { "would requeue" } else { "requeued" };
    say!("{verb} {} FAILED row(s)", report.requeued);
    Ok(())
}

pub(super) async fn purge(
    settings: &Settings,
    older_than: std::time::Duration,
    status: PurgeStatus,
) -> Result<(), CliError> {
    let store = open(settings).await?;
    let status = match status {
        PurgeStatus::Success => Finished::Success,
        PurgeStatus::Failed => Finished::Failed,
    };
    let deleted = housekeeping::purge_all(
        store.as_ref(),
        &[(status, older_than)],
        &tokio_util::sync::CancellationToken::new(),
        std::time::Duration::from_secs(24 * 3600),
    )
    .await?;
    say!(
        "deleted {deleted} {} row(s) last updated more than {} ago",
        status.as_str(),
        duration::format(older_than)
    );
    Ok(())
}

pub(super) async fn check_config(s: &Settings) -> Result<(), CliError> {
    let d = duration::format;
    match &s.source {
        Some(p) => say!("configuration OK ({} + environment)", p.display()),
        None => say!("configuration OK (built-in defaults + environment)"),
    }
    let r = &s.relay;
    say!(
        "relay: instance_id={} mode={:?} poll_interval={} batch_size={} max_in_flight={} claim_ttl={} shutdown_timeout={}",
        r.instance_id,
        r.mode,
        d(r.poll_interval),
        r.batch_size,
        r.max_in_flight,
        d(r.claim_ttl),
        d(r.shutdown_timeout)
    );
    say!(
        "database: url={} table={} max_connections={} listen={} migrate={}",
        s.database_url_redacted(),
        s.database.table,
        s.database.max_connections,
        s.database.listen,
        s.database.migrate
    );
    say!(
        "lease: backend={:?} name={} ttl={} renew_timeout={}",
        s.lease.backend,
        s.lease.name,
        d(s.lease.ttl),
        d(s.lease.renew_timeout)
    );
    if s.lease.backend == crate::config::LeaseBackend::Shedlock {
        say!(
            "lease: shedlock_table={} shedlock_time_zone={}",
            s.lease.shedlock_table,
            s.lease.shedlock_time_zone
        );
    }
    say!(
        "retry: initial_backoff={} max_backoff={} multiplier={} max_attempts={}",
        d(s.retry.initial_backoff),
        d(s.retry.max_backoff),
        s.retry.multiplier,
        s.retry.max_attempts
    );
    say!("http: listen={}", s.http.listen);
    match &s.console {
        Some(c) => say!(
            "console: listen={} token=*** show_payloads={} mask_recipients={}",
            c.listen,
            c.show_payloads,
            c.mask_recipients
        ),
        None => say!("console: off"),
    }
    // Without secrets: the endpoint's credentials masked, the headers by name.
    say!("{}", s.tracing.describe());
    for (name, spec) in &s.sinks {
        let retry = spec.common.retry_policy(&s.retry);
        say!(
            "sink {name}: kind={} timeout={} concurrency={} rate_per_sec={} max_attempts={}",
            spec.common.kind,
            d(spec.common.timeout),
            spec.common.concurrency,
            spec.common
                .rate_per_sec
                .map(|r| r.to_string())
                .unwrap_or_else(|| "unlimited".into()),
            retry.max_attempts
        );
    }
    // Checks a sink can make of its service (a nats sink's `stream`).
    for line in crate::sink::check_remote(s).await? {
        say!("{line}");
    }
    if s.table.is_mapped() {
        check_table(s).await?;
    }
    Ok(())
}

/// With `lease.backend = "shedlock"`: creates the ShedLock table with ShedLock's schema if it
/// is missing (a Java application's existing table is never altered).
pub(super) async fn ensure_shedlock_table(
    settings: &Settings,
    store: &SqlStore,
) -> anyhow::Result<()> {
    if settings.lease.backend != crate::config::LeaseBackend::Shedlock {
        return Ok(());
    }
    let table = &settings.lease.shedlock_table;
    if store
        .shedlock(&store::ShedLockTable::new(table, 0))
        .create_table()
        .await?
    {
        tracing::info!(table = %table, "created the ShedLock table (lease.shedlock_table)");
    }
    Ok(())
}

/// `status` with a lock shared with a Java poller: who holds it now (the relay's holders are
/// `<instance_id>#...`; anything else is the poller).
async fn java_lock_status(settings: &Settings, store: &SqlStore) -> Result<(), CliError> {
    let l = &settings.lease;
    match l.backend {
        crate::config::LeaseBackend::Shedlock => {
            let sl = store::ShedLockTable::new(
                &l.shedlock_table,
                l.shedlock_utc_offset_minutes().unwrap_or_default(),
            );
            match store.shedlock(&sl).holder(&l.name).await {
                Ok(Some((by, ms))) if ms > 0 => say!(
                    "shedlock {} row {}: held by {by} for {:.1}s more",
                    l.shedlock_table,
                    l.name,
                    ms as f64 / 1000.0
                ),
                Ok(Some((by, _))) => say!(
                    "shedlock {} row {}: free (last held by {by})",
                    l.shedlock_table,
                    l.name
                ),
                Ok(None) => say!("shedlock {} row {}: never taken", l.shedlock_table, l.name),
                // A missing table is worth a line, not a failed `status`.
                Err(e) => say!("shedlock {}: cannot read: {e}", l.shedlock_table),
            }
        }
        crate::config::LeaseBackend::MysqlGetLock => match store.get_lock_holder(&l.name).await {
            Ok(Some(id)) => say!("GET_LOCK {}: held by connection {id}", l.name),
            Ok(None) => say!("GET_LOCK {}: free", l.name),
            Err(e) => say!("GET_LOCK {}: cannot read: {e}", l.name),
        },
        crate::config::LeaseBackend::Redisson => say!(
            "redisson lock {}: kept in Redis (redis-cli HGETALL {} shows the holder's \
             <uuid>:<thread id>)",
            l.name,
            l.name
        ),
        _ => {}
    }
    Ok(())
}

/// `check-config` on a mapped table: the mapping against the live table, when the database
/// is reachable (a configuration can be checked without it).
async fn check_table(s: &Settings) -> Result<(), CliError> {
    let cols = store::Columns::from_settings(&s.table);
    say!("table: {} (mapped: {})", s.database.table, cols.describe());
    let db = &s.database;
    let connected = store::connect_mapped(
        db.url.expose(),
        &db.table,
        &s.table,
        1,
        db.connect_timeout,
        1,
    )
    .await;
    let store = match connected {
        Ok(store) => store,
        Err(e) => {
            say!(
                "table not checked: database {} unreachable ({e})",
                s.database_url_redacted()
            );
            return Ok(());
        }
    };
    let problems = store.check_table().await?;
    if problems.is_empty() {
        say!(
            "table {}: every mapped column is present and usable",
            db.table
        );
        return Ok(());
    }
    Err(CliError::Usage(table_problems(&db.table, &problems)))
}

/// The message for a table the relay cannot run on (`check-config`, and `run` refuses with it).
pub(super) fn table_problems(table: &str, problems: &[store::Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
    format!(
        "table {table} does not match the [table] mapping:\n{}",
        lines.join("\n")
    )
}
