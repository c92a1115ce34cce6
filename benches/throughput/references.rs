//! The two references every relay figure is compared with, measured in the same run: the
//! naive loop (one due row selected, POSTed and marked SUCCESS at a time, as hand-written
//! pollers do); the receiver's ceiling has its own file (`ceiling.rs`).

use super::*;

/// The HTTP client the webhook sink builds, for the references.
pub(crate) fn sink_like_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(SINK_TIMEOUT)
        .connect_timeout(SINK_TIMEOUT.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// One POST shaped like the webhook sink's (same headers, body as stored, the URL parsed
/// once as the sink parses it); true on 2xx.
pub(crate) async fn post_like_sink(
    client: &reqwest::Client,
    url: &reqwest::Url,
    id: i64,
    payload: String,
) -> bool {
    if serde_json::from_str::<serde::de::IgnoredAny>(&payload).is_err() {
        return false;
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.as_secs())
        .unwrap_or(0);
    let id = id.to_string();
    let resp = client
        .post(url.clone())
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("idempotency-key", format!("\"{id}\""))
        .body(payload)
        .send()
        .await;
    matches!(resp, Ok(r) if r.status().is_success())
}

/// What the naive loop measured.
#[derive(Debug, Clone)]
pub(crate) struct NaiveRun {
    pub(crate) rows: usize,
    pub(crate) rows_per_sec: f64,
    pub(crate) statements: u64,
    pub(crate) xacts: Option<i64>,
    pub(crate) cpu: Option<CpuShares>,
}

/// One loop: SELECT one due row, POST it, UPDATE it to SUCCESS; until `n` rows or the limit.
pub(crate) async fn naive_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    n: usize,
) -> anyhow::Result<NaiveRun> {
    let table = unique_table("naive");
    let result = naive_run_on(db, url, &table, receiver, n).await;
    let dialect = match db {
        Db::Postgres => Some(Dialect::Postgres),
        _ => None,
    };
    drop_table(url, &table, dialect).await;
    result
}

pub(crate) async fn naive_run_on(
    db: Db,
    url: &str,
    table: &str,
    receiver: &Receiver,
    n: usize,
) -> anyhow::Result<NaiveRun> {
    prepare_table(url, table, n, true, Rows::default()).await?;
    let store = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;
    // The naive poller's own SQL: the payload as text, and its one placeholder.
    let (payload, placeholder) = match db {
        Db::Postgres => ("payload::text", "$1"),
        Db::MySql => ("CAST(payload AS CHAR)", "?"),
        Db::Sqlite => ("payload", "?"),
    };
    let now = store.now_sql();
    let select = format!(
        "SELECT id, {payload} FROM {table} WHERE status IN ('PENDING', 'RETRY')
           AND next_attempt_at <= {now} ORDER BY id LIMIT 1"
    );
    let update = format!(
        "UPDATE {table} SET status = 'SUCCESS', attempts = attempts + 1, sent_at = {now},
           updated_at = {now} WHERE id = {placeholder}"
    );
    let client = sink_like_client()?;
    let target = reqwest::Url::parse(&receiver.url)?;
    let pool = store.pool();
    // Warm the connection so connecting is not timed (the relay's pool is warm too).
    scalar(pool, "SELECT 1".to_string()).await?;

    let xacts_before = settled_xacts(db, url).await;
    let mut statements = 0u64;
    let mut done = 0usize;
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    while done < n && started.elapsed() < NAIVE_RUN_LIMIT {
        statements += 1;
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(select.clone()))
            .fetch_optional(pool)
            .await?
        else {
            break;
        };
        let id: i64 = row.try_get(0)?;
        let body: String = row.try_get(1)?;
        if !post_like_sink(&client, &target, id, body).await {
            bail!("naive loop: POST of row {id} failed");
        }
        statements += 1;
        sqlx::query(sqlx::AssertSqlSafe(update.clone()))
            .bind(id)
            .execute(pool)
            .await?;
        done += 1;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_before
        .zip(CpuSnap::take())
        .and_then(|(a, b)| a.since(b));
    pool.close().await;
    let xacts_after = settled_xacts(db, url).await;
    if done == 0 {
        bail!("naive loop delivered no row");
    }
    Ok(NaiveRun {
        rows: done,
        rows_per_sec: done as f64 / elapsed.as_secs_f64(),
        statements,
        xacts: match (xacts_before, xacts_after) {
            (Some(a), Some(b)) => Some(b - a - 1),
            _ => None,
        },
        cpu,
    })
}
