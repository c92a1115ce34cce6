//! The pages: the overview (with its live view), the failed-rows list and a row.
//!
//! Reads only: nothing here changes a row. Every value from the table is escaped; recipients
//! are masked and payloads hidden as configured.

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Console;
use super::auth::{Viewer, Who};
use super::queries::{Filter, Filterable, Form};
use super::view::{age, esc, mask, page, with_query};
use crate::config::{LeaseBackend, Mode};
use crate::store::LeaseRow;

/// Rows on one page of the failed list.
pub(super) const PAGE: u32 = 50;

/// What a page shows for a column a mapped table does not have (a NULL shows as "–").
const NOT_MAPPED: &str = r#"<span class="hint na">not mapped</span>"#;

/// An optional value of the table, escaped: `–` when NULL, [`NOT_MAPPED`] when the table has
/// no such column.
fn shown(mapped: bool, v: Option<&str>) -> String {
    match v {
        _ if !mapped => NOT_MAPPED.into(),
        Some(v) => esc(v),
        None => "–".into(),
    }
}

/// A database error as a page: the operator sees the driver's error (sqlx names no
/// credentials in it) and can retry.
pub(super) fn db_error(e: &anyhow::Error) -> Response {
    tracing::warn!(error = %e, "console: database query failed");
    super::view::error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("The database did not answer: {e}. Reload to try again."),
    )
}

/// The hidden CSRF field of this session's forms.
pub(super) fn csrf_field(c: &Console, who: &Who) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}">"#,
        esc(&c.inner.auth.csrf(who))
    )
}

/// A page with the frame, for `who`.
pub(super) fn framed(c: &Console, who: &Who, title: &str, body: &str) -> Response {
    let csrf = c.inner.auth.csrf(who);
    page(
        title,
        who.operator.as_deref(),
        who.session.is_some(),
        &csrf,
        body,
    )
}

/// `GET /`.
pub(super) async fn overview(State(c): State<Console>, Viewer(who): Viewer) -> Response {
    let i = &c.inner;
    let store = &i.store;
    let (channels, lease, claims) = match tokio::try_join!(
        store.overview(),
        store.lease(&i.lease_name),
        store.live_claims()
    ) {
        Ok(v) => v,
        Err(e) => return db_error(&e),
    };
    let channels = with_every_sink(&c, channels);
    let (rows, totals) = channel_rows(&c, &channels);
    let claim_rows = claim_rows(&claims);

    let body = format!(
        r#"<main>
<h1>Overview</h1>
<p class="meta">This instance: <b>{instance}</b> · {dialect} table <b>{table}</b>{mapped} · mode {mode} · <a href="/">refresh</a></p>
<table class="grid" id="channels">
<thead><tr><th>Channel</th><th>Pending</th><th>Retrying</th><th>Failed</th><th>Delivered (last hour)</th><th>Oldest pending</th><th>Sink</th></tr></thead>
<tbody>{rows}{totals}</tbody></table>
{stuck}<section class="cols">
<div><h2>Lease</h2><p id="lease">{lease}</p></div>
<div><h2>Live claims</h2><table class="grid" id="claims"><thead><tr><th>Instance</th><th>Rows claimed</th></tr></thead><tbody>{claim_rows}</tbody></table></div>
</section>
<h2>Live: this instance, last 10 s <span class="tick" id="live-tick"></span></h2>
<table class="grid" id="live"><thead><tr><th>Sink</th><th>Delivered / s</th><th>Errors / s</th><th>Delivered since start</th><th>Errors since start</th></tr></thead>
<tbody>{live}</tbody></table>
</main>"#,
        instance = esc(&i.instance_id),
        dialect = store.dialect().name(),
        table = esc(&i.table),
        mapped = if store.columns().mapped {
            r#" <span class="hint" id="mapped">(an existing table mapped by [table])</span>"#
        } else {
            ""
        },
        mode = match i.mode {
            Mode::Leader => "leader",
            Mode::Claim => "claim",
        },
        lease = esc(&lease_text(&c, lease.as_ref())),
        live = live_rows(&c),
        stuck = stuck_rows(&channels),
    );
    framed(&c, &who, "Overview", &body)
}

/// A notice of the rows no claim takes and no count above shows: parked rows (the database
/// refused every result for them) and, on a mapped table, rows whose status is NULL or no
/// state's value. Empty when there are none.
fn stuck_rows(channels: &[crate::store::ChannelCounts]) -> String {
    let mut lines = String::new();
    for ch in channels.iter().filter(|c| c.parked > 0 || c.unknown > 0) {
        let _ = write!(
            lines,
            "<li><b>{}</b>: {} parked, {} with a NULL or unknown status</li>",
            esc(&ch.channel),
            ch.parked,
            ch.unknown
        );
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        r#"<div class="warn" id="stuck"><p>Rows no claim will take until someone acts (<code>outbox-relay status</code> explains each state; <code>requeue --id</code> brings a parked row back):</p><ul>{lines}</ul></div>
"#
    )
}

/// The channels with rows, and every configured sink without any (a line that says "nothing
/// waiting" is an answer too), by name.
fn with_every_sink(
    c: &Console,
    mut channels: Vec<crate::store::ChannelCounts>,
) -> Vec<crate::store::ChannelCounts> {
    for s in c.inner.sinks.iter() {
        if !channels.iter().any(|c| c.channel == s.name) {
            channels.push(crate::store::ChannelCounts {
                channel: s.name.clone(),
                ..Default::default()
            });
        }
    }
    channels.sort_by(|a, b| a.channel.cmp(&b.channel));
    channels
}

/// The overview's line per channel, and the line of totals.
fn channel_rows(c: &Console, channels: &[crate::store::ChannelCounts]) -> (String, String) {
    // A mapped table without created_at: no row's age is known.
    let no_created = c.inner.store.columns().created_at.is_none();
    let mut rows = String::new();
    let (mut tp, mut tr, mut tf, mut td) = (0, 0, 0, 0);
    for ch in channels {
        tp += ch.pending;
        tr += ch.retry;
        tf += ch.failed;
        td += ch.delivered_last_hour;
        let failed = if ch.failed > 0 {
            let q: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("channel", &ch.channel)
                .finish();
            format!(r#"<a href="/failed?{}">{}</a>"#, esc(&q), ch.failed)
        } else {
            "0".to_string()
        };
        let _ = write!(
            rows,
            r#"<tr data-channel="{name}"><th scope="row">{name}</th><td data-k="pending">{}</td><td data-k="retry">{}</td><td data-k="failed" class="{}">{failed}</td><td data-k="delivered">{}</td><td data-k="oldest">{}</td><td data-k="sink">{}</td></tr>"#,
            ch.pending,
            ch.retry,
            if ch.failed > 0 { "bad" } else { "" },
            ch.delivered_last_hour,
            match ch.oldest_pending {
                Some(d) => age(d),
                None if no_created => NOT_MAPPED.into(),
                None => "–".into(),
            },
            sink_state(c, &ch.channel),
            name = esc(&ch.channel),
        );
    }
    if channels.is_empty() {
        rows.push_str(r#"<tr><td colspan="7" class="empty">No rows and no sinks.</td></tr>"#);
    }
    let totals = format!(
        r#"<tr class="total" data-channel=""><th scope="row">all channels</th><td data-k="pending">{tp}</td><td data-k="retry">{tr}</td><td data-k="failed">{tf}</td><td data-k="delivered">{td}</td><td></td><td></td></tr>"#
    );
    (rows, totals)
}

/// The live claims' lines: rows claimed per instance.
fn claim_rows(claims: &[(String, i64)]) -> String {
    let mut claim_rows = String::new();
    for (instance, n) in claims {
        let _ = write!(
            claim_rows,
            r#"<tr><td>{}</td><td data-k="claims">{n}</td></tr>"#,
            esc(instance)
        );
    }
    if claims.is_empty() {
        claim_rows.push_str(r#"<tr><td colspan="2" class="empty">No live claims.</td></tr>"#);
    }
    claim_rows
}

/// A sink's state as the relay knows it: sending, or paused (how long, why).
fn sink_state(c: &Console, channel: &str) -> String {
    match c.inner.sinks.get(channel) {
        None => r#"<span class="bad">no sink of this name here: its rows fail</span>"#.into(),
        Some(s) => match s.pause.state() {
            Some((left, reason)) => format!(
                r#"<span class="warn">paused {} more: {}</span>"#,
                age(left),
                esc(&reason)
            ),
            None => r#"<span class="ok">sending</span>"#.into(),
        },
    }
}

/// The lease row in words.
fn lease_text(c: &Console, lease: Option<&LeaseRow>) -> String {
    let i = &c.inner;
    if i.mode == Mode::Claim {
        return "claim mode: no leader; every instance claims its own batches.".into();
    }
    if i.lease_backend == LeaseBackend::None {
        return "lease.backend = none: a single instance, no lease.".into();
    }
    let name = &i.lease_name;
    match lease {
        None => format!("{name}: never taken."),
        Some(l) => match (&l.holder, l.remaining_ms) {
            (Some(h), Some(ms)) if ms > 0 => format!(
                "{name}: held by {}, epoch {}, expires in {:.1} s (renewed every ttl/3).",
                holder(h),
                l.epoch,
                ms as f64 / 1000.0
            ),
            (Some(h), None) => format!(
                "{name}: epoch {}, taken last by {} (the live lease is kept in Redis; the table \
                 records the last holder).",
                l.epoch,
                holder(h)
            ),
            _ => format!("{name}: free (epoch {}).", l.epoch),
        },
    }
}

/// A lease holder as `instance` (its token cut to a few characters: enough to tell two
/// grants apart, not to act as the holder).
fn holder(h: &str) -> String {
    match h.split_once('#') {
        Some((instance, token)) => {
            let short: String = token.chars().take(6).collect();
            format!("{instance} (grant {short}…)")
        }
        None => h.to_string(),
    }
}

/// The live view's rows (also sent as JSON to the page's script).
fn live_rows(c: &Console) -> String {
    let rates = c.inner.live.rates();
    if rates.is_empty() {
        return r#"<tr><td colspan="5" class="empty">No deliveries by this instance yet.</td></tr>"#
            .into();
    }
    rates
        .iter()
        .map(|r| {
            format!(
                r#"<tr><td>{}</td><td>{:.1}</td><td class="{}">{:.1}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&r.sink),
                r.delivered_per_sec,
                if r.errors_per_sec > 0.0 { "bad" } else { "" },
                r.errors_per_sec,
                r.delivered_total,
                r.errors_total
            )
        })
        .collect()
}

/// `GET /live.json`: the live view's rows, for the overview's script.
pub(super) async fn live_json(State(c): State<Console>, Viewer(_): Viewer) -> Response {
    let body = serde_json::json!({ "rows": live_rows(&c) }).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /failed`: FAILED rows newest first, filtered, 50 a page by keyset on id.
pub(super) async fn failed(
    State(c): State<Console>,
    Viewer(who): Viewer,
    RawQuery(q): RawQuery,
) -> Response {
    let raw = q.unwrap_or_default();
    let path = with_query("/failed", &raw);

    let form = Form::parse(raw.as_bytes());
    let can = c.inner.filterable;
    let (filter, problem) = match Filter::from_form(&form, can) {
        Ok(f) => (f, None),
        Err(e) => (Filter::default(), Some(e)),
    };
    let before = form.get("before").and_then(|b| b.parse::<i64>().ok());
    let (list, status) = match &problem {
        Some(p) => (
            format!(r#"<p class="error" id="filter-error">{}</p>"#, esc(p)),
            StatusCode::BAD_REQUEST,
        ),
        None => match failed_list(&c, &who, &filter, before, &path).await {
            Ok(list) => (list, StatusCode::OK),
            Err(page) => return page,
        },
    };
    let body = format!(
        r#"<main>
<h1>Failed rows</h1>
{}
{list}
</main>"#,
        filter_form(&c, &filter, can)
    );
    let mut r = framed(&c, &who, "Failed rows", &body);
    *r.status_mut() = status;
    r
}

/// The failed page's rows matching `filter` older than `before` (a page of them, with
/// links to the newest and the next older page), or the database error as a page.
async fn failed_list(
    c: &Console,
    who: &Who,
    filter: &Filter,
    before: Option<i64>,
    path: &str,
) -> Result<String, Response> {
    let rows = c
        .inner
        .store
        .failed_page(&filter.parsed, before, PAGE + 1)
        .await
        .map_err(|e| db_error(&e))?;
    let more = rows.len() > PAGE as usize;
    let csrf = csrf_field(c, who);
    let back = esc(path);
    let mut trs = String::new();
    for r in rows.iter().take(PAGE as usize) {
        failed_row(&mut trs, c, r, &csrf, &back);
    }
    if rows.is_empty() {
        trs.push_str(r#"<tr><td colspan="7" class="empty">No FAILED rows match.</td></tr>"#);
    }
    let fq = filter.query();
    let amp = if fq.is_empty() { "" } else { "&" };
    let mut nav = String::new();
    if before.is_some() {
        let _ = write!(nav, r#"<a href="/failed?{}">« Newest</a>"#, esc(&fq));
    }
    if more && let Some(last) = rows.get(PAGE as usize - 1) {
        let _ = write!(
            nav,
            r#"<a href="/failed?{}{amp}before={}" id="older">Older rows »</a>"#,
            esc(&fq),
            last.id
        );
    }
    Ok(format!(
        r#"<div class="actions"><a class="button" href="/requeue?{}" id="requeue-matching">Requeue all matching rows…</a></div>
<table class="grid" id="failed"><thead><tr><th>Id</th><th>Channel</th><th>Attempts</th><th>Created (UTC)</th><th>Failed at (UTC)</th><th>Last error</th><th></th></tr></thead><tbody>{trs}</tbody></table>
<p class="pager">{nav}</p>"#,
        esc(&fq)
    ))
}

/// One failed row's line, with its requeue button (coming `back` to this page).
fn failed_row(trs: &mut String, c: &Console, r: &crate::store::FailedRow, csrf: &str, back: &str) {
    let can = c.inner.filterable;
    let cols = c.inner.store.columns();
    let err = r.last_error.as_deref().unwrap_or("");
    let short: String = err.chars().take(160).collect();
    let ellipsis = if short.len() < err.len() { "…" } else { "" };
    let error = if cols.last_error.is_none() {
        NOT_MAPPED.to_string()
    } else {
        format!("{}{ellipsis}", esc(&short))
    };
    let _ = write!(
        trs,
        r#"<tr data-id="{id}"><td><a href="/row/{id}">{id}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="err" title="{}">{error}</td><td><form method="post" action="/row/{id}/requeue" data-confirm="Requeue row {id} ({ch})? It will be sent again.">{csrf}<input type="hidden" name="back" value="{back}"><button type="submit" class="small" id="requeue-{id}">Requeue</button></form></td></tr>"#,
        esc(&r.channel),
        r.attempts,
        shown(can.created, r.created_at.as_deref()),
        shown(cols.updated_at.is_some(), r.updated_at.as_deref()),
        esc(err),
        id = r.id,
        ch = esc(&r.channel),
    );
}

/// The failed page's filter: the fields the table's mapping allows, and a hint on them.
fn filter_form(c: &Console, filter: &Filter, can: Filterable) -> String {
    format!(
        r#"<form method="get" action="/failed" class="filter" id="filter">
<label>Channel <input name="channel" id="f-channel" value="{}" list="channels"></label>
{error_input}{time_inputs}<button type="submit" id="apply">Filter</button> <a href="/failed">Clear</a>
<datalist id="channels">{options}</datalist>
</form>
<p class="hint">{hint}Newest first.</p>"#,
        esc(&filter.channel),
        error_input = if can.error {
            format!(
                r#"<label>Last error contains <input name="error" id="f-error" value="{}"></label>
"#,
                esc(&filter.error)
            )
        } else {
            String::new()
        },
        time_inputs = if can.created {
            format!(
                r#"<label>Created from <input name="from" id="f-from" value="{}" placeholder="2026-11-24 13:00 or 2h"></label>
<label>Created before <input name="to" id="f-to" value="{}" placeholder="UTC time or 30m"></label>
"#,
                esc(&filter.from),
                esc(&filter.to)
            )
        } else {
            String::new()
        },
        hint = match (can.error, can.created) {
            (true, true) =>
                "Times are UTC (2026-11-24 13:00) or an age (30m, 2h, 7d: that long ago). ",
            (false, true) =>
                "This table maps no table.columns.last_error: no filter by error text. Times are UTC (2026-11-24 13:00) or an age (30m, 2h, 7d: that long ago). ",
            (true, false) =>
                "This table maps no table.columns.created_at: no filter by creation time. ",
            (false, false) =>
                "This table maps no table.columns.last_error or table.columns.created_at: filter by channel only. ",
        },
        options = c
            .inner
            .sinks
            .iter()
            .map(|s| format!(r#"<option value="{}">"#, esc(&s.name)))
            .collect::<String>(),
    )
}

/// `GET /row/{id}`.
pub(super) async fn row(
    State(c): State<Console>,
    Viewer(who): Viewer,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return super::view::error_page(StatusCode::BAD_REQUEST, "A row id is a number.");
    };
    let row = match c.inner.store.row(id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return super::view::error_page(
                StatusCode::NOT_FOUND,
                &format!("There is no row {id} (it may have been purged)."),
            );
        }
        Err(e) => return db_error(&e),
    };
    let cols = c.inner.store.columns();
    let (recipient, payload) = (recipient(&c, &row), payload(&c, &row));
    let claim = match (&row.claimed_by, row.claim_left_ms) {
        (Some(by), Some(ms)) => format!(
            "claimed by {} for {} more",
            esc(by),
            age(Duration::from_millis(ms.max(0) as u64))
        ),
        _ => "no live claim".to_string(),
    };
    let action = if row.status == "FAILED" {
        format!(
            r#"<form method="post" action="/row/{id}/requeue">{}<input type="hidden" name="back" value="/row/{id}"><button type="submit" id="requeue">Requeue this row</button></form>"#,
            csrf_field(&c, &who)
        )
    } else {
        format!(
            r#"<p class="hint">Only FAILED rows can be requeued; this one is {}.</p>"#,
            esc(&row.status)
        )
    };
    // Times: UTC, "–" when NULL (a mapped table's rows have no next attempt until retried).
    let time = |mapped: bool, v: &Option<String>| match v {
        Some(t) if mapped => format!("{} UTC", esc(t)),
        _ => shown(mapped, None),
    };
    let body = format!(
        r#"<main>
<h1>Row {id} <span class="status s-{status}" id="status">{status}</span></h1>
<dl class="row">
<dt>Channel</dt><dd id="channel">{channel}</dd>
<dt>Recipient</dt><dd id="recipient">{recipient}</dd>
<dt>Ordering key</dt><dd id="ordering-key">{key}</dd>
<dt>Attempts</dt><dd id="attempts">{attempts}</dd>
<dt>Next attempt at</dt><dd id="next-attempt">{next}</dd>
<dt>Last error</dt><dd id="last-error" class="err">{err}</dd>
<dt>Created</dt><dd id="created">{created}</dd>
<dt>Updated</dt><dd id="updated">{updated}</dd>
<dt>Sent</dt><dd id="sent">{sent}</dd>
<dt>Claim</dt><dd>{claim}</dd>
</dl>
<p class="hint">History: the table keeps the number of attempts and the last error; retries and failures are in the relay's log with <code>id={id}</code> (retries at debug level).</p>
<h2>Payload</h2>
{payload}
{action}
</main>"#,
        status = esc(&row.status),
        channel = esc(&row.channel),
        key = shown(cols.ordering_key.is_some(), row.ordering_key.as_deref()),
        attempts = row.attempts,
        next = time(true, &row.next_attempt_at),
        err = shown(cols.last_error.is_some(), row.last_error.as_deref()),
        created = time(cols.created_at.is_some(), &row.created_at),
        updated = time(cols.updated_at.is_some(), &row.updated_at),
        sent = time(true, &row.sent_at),
    );
    framed(&c, &who, &format!("Row {id}"), &body)
}

/// A row's recipient, masked if `console.mask_recipients` says so.
fn recipient(c: &Console, row: &crate::store::RowDetail) -> String {
    let s = &c.inner.settings;
    match &row.recipient {
        None => shown(c.inner.store.columns().recipient.is_some(), None),
        Some(r) if s.mask_recipients => format!(
            r#"{} <span class="hint">(masked: console.mask_recipients)</span>"#,
            esc(&mask(r))
        ),
        Some(r) => esc(r),
    }
}

/// A row's payload, pretty-printed, or hidden unless `console.show_payloads` is on. On a
/// mapped table the payload is the one the sink gets: its column, or the object the
/// database builds from the row's columns (`table.payload_object`).
fn payload(c: &Console, row: &crate::store::RowDetail) -> String {
    match &row.payload {
        None => r#"<p id="payload" class="hint">None: the payload is NULL.</p>"#.to_string(),
        Some(p) if c.inner.settings.show_payloads => {
            let pretty = serde_json::from_str::<serde_json::Value>(p)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or_else(|| p.clone());
            format!(r#"<pre id="payload">{}</pre>"#, esc(&pretty))
        }
        Some(p) => format!(
            r#"<p id="payload" class="hint">Hidden ({} bytes): payloads are shown only with <code>console.show_payloads = true</code>.</p>"#,
            p.len()
        ),
    }
}
