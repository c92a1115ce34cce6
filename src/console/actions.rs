//! The actions: requeue one row, requeue a confirmed selection, purge old FAILED rows.
//!
//! Each goes through the store's own verb, with the CLI's semantics (docs/design.md, "Admin
//! verbs"): a row is requeued only if it is still FAILED and under no live claim when the
//! UPDATE runs, and deleted only if it is still FAILED and old enough when the DELETE runs.
//! Bulk actions first show how many rows they would change (GET, changes nothing), then act on
//! a POST from that page; a selection is capped at the newest row the page counted, so rows
//! that fail after the operator looked are not swept in. Every action is logged at info.

use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::Console;
use super::auth::{Act, Viewer, Who};
use super::pages::{csrf_field, db_error, framed};
use super::queries::{Filter, Form, parse_age};
use super::view::{error_page, esc, local_path, with_query};
use crate::housekeeping;
use crate::store::{Finished, NO_AGE, Requeue};

/// The longest one purge request deletes for; the rest is left for another request (the
/// confirmation page counts what is left).
const PURGE_BUDGET: Duration = Duration::from_secs(60);

/// The result of an action, with links on.
fn done(c: &Console, who: &Who, title: &str, message: &str, links: &[(&str, String)]) -> Response {
    let links: String = links
        .iter()
        .map(|(text, href)| {
            format!(
                r#"<a class="button" href="{}">{}</a> "#,
                esc(href),
                esc(text)
            )
        })
        .collect();
    let body = format!(
        r#"<main><h1>{}</h1><p class="result" id="result">{}</p><p>{links}</p></main>"#,
        esc(title),
        esc(message)
    );
    framed(c, who, title, &body)
}

/// A path on this console from a form's `back` field (anything else: the failed list).
fn back(form: &Form) -> String {
    form.get("back")
        .and_then(local_path)
        .unwrap_or("/failed")
        .to_string()
}

/// `POST /row/{id}/requeue`.
pub(super) async fn requeue_row(
    State(c): State<Console>,
    Path(id): Path<String>,
    Act { who, form }: Act,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return error_page(StatusCode::BAD_REQUEST, "A row id is a number.");
    };
    let report = match c.inner.store.requeue(&Requeue::Ids(vec![id]), false).await {
        Ok(r) => r,
        Err(e) => return db_error(&e),
    };
    tracing::info!(who = %who, action = "requeue", id, requeued = report.requeued, "console action");
    let message = if report.requeued == 1 {
        format!(
            "Row {id} is PENDING again, with a fresh attempt budget: the relay will deliver it."
        )
    } else if let Some((_, status)) = report.not_failed.first() {
        format!("Row {id} is {status}, not FAILED: left unchanged.")
    } else if !report.missing.is_empty() {
        format!("There is no row {id} (it may have been purged).")
    } else {
        format!(
            "Row {id} was not requeued: it is under a live claim or changed meanwhile. Reload and look again."
        )
    };
    done(
        &c,
        &who,
        "Requeue",
        &message,
        &[("Back", back(&form)), ("See the row", format!("/row/{id}"))],
    )
}

/// `GET /requeue?<filter>`: how many FAILED rows the filter matches, and the button to
/// requeue them.
pub(super) async fn requeue_confirm(
    State(c): State<Console>,
    Viewer(who): Viewer,
    RawQuery(q): RawQuery,
) -> Response {
    let raw = q.unwrap_or_default();

    let filter = match Filter::from_form(&Form::parse(raw.as_bytes()), c.inner.filterable) {
        Ok(f) => f,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    let store = &c.inner.store;
    // The newest matching row first, then the count up to it: the count is exactly what the
    // confirmed POST may change (or fewer, if rows change meanwhile).
    let newest = match store.newest_failed(&filter.parsed).await {
        Ok(n) => n,
        Err(e) => return db_error(&e),
    };
    let mut capped = filter.parsed.clone();
    capped.max_id = newest;
    let count = match newest {
        None => 0,
        Some(_) => match store.requeue(&Requeue::Matching(capped), true).await {
            Ok(r) => r.requeued,
            Err(e) => return db_error(&e),
        },
    };
    let what = esc(&filter.describe());
    let list = with_query("/failed", &filter.query());
    let body = match newest {
        Some(max_id) if count > 0 => format!(
            r#"<main><h1>Requeue {count} row(s)?</h1>
<p class="confirm" id="confirm">{count} row(s) match: {what}.</p>
<p>They become PENDING with a fresh attempt budget and are delivered again. Rows that fail after this page was shown are not included; rows that change before you confirm (delivered, purged, claimed) are left alone.</p>
<form method="post" action="/requeue">{csrf}
<input type="hidden" name="channel" value="{}"><input type="hidden" name="error" value="{}">
<input type="hidden" name="from" value="{}"><input type="hidden" name="to" value="{}">
<input type="hidden" name="max_id" value="{max_id}"><input type="hidden" name="expected" value="{count}">
<button type="submit" class="danger" id="confirm-requeue">Requeue {count} row(s)</button> <a href="{}">Cancel</a>
</form></main>"#,
            esc(&filter.channel),
            esc(&filter.error),
            esc(&filter.from),
            esc(&filter.to),
            esc(&list),
            csrf = csrf_field(&c, &who),
        ),
        _ => format!(
            r#"<main><h1>Nothing to requeue</h1><p class="confirm" id="confirm">No rows match: {what}.</p><p><a href="{}">Back to the list</a></p></main>"#,
            esc(&list)
        ),
    };
    framed(&c, &who, "Requeue rows", &body)
}

/// `POST /requeue`: requeues the confirmed selection.
pub(super) async fn requeue_selection(
    State(c): State<Console>,
    Act { who, form }: Act,
) -> Response {
    let filter = match Filter::from_form(&form, c.inner.filterable) {
        Ok(f) => f,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    if filter.parsed.max_id.is_none() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "A selection is requeued from its confirmation page (GET /requeue), which counts it first.",
        );
    }
    let expected = form.get("expected").and_then(|v| v.parse::<u64>().ok());
    let report = match c
        .inner
        .store
        .requeue(&Requeue::Matching(filter.parsed.clone()), false)
        .await
    {
        Ok(r) => r,
        Err(e) => return db_error(&e),
    };
    tracing::info!(
        who = %who,
        action = "requeue-selection",
        filter = %filter.describe(),
        max_id = filter.parsed.max_id,
        expected,
        requeued = report.requeued,
        "console action"
    );
    let mut message = format!(
        "Requeued {} row(s) ({}).",
        report.requeued,
        filter.describe()
    );
    if let Some(e) = expected
        && e != report.requeued
    {
        message.push_str(&format!(
            " {e} were shown: the others changed meanwhile (delivered, purged or claimed) and were left alone."
        ));
    }
    let list = with_query("/failed", &filter.query());
    done(
        &c,
        &who,
        "Requeued",
        &message,
        &[("Back to the list", list), ("Overview", "/".into())],
    )
}

/// What a purge's age is measured from, in words (`purge` goes by `updated_at`, else by
/// `created_at`); `None` when a mapped table has neither, and nothing can be purged.
fn age_column(c: &Console) -> Option<&'static str> {
    let cols = c.inner.store.columns();
    match (&cols.updated_at, &cols.created_at) {
        (Some(_), _) => Some("last updated"),
        (None, Some(_)) => Some("created"),
        (None, None) => None,
    }
}

/// `GET /purge[?older_than=7d]`: the form, then how many FAILED rows the purge would delete.
pub(super) async fn purge_confirm(
    State(c): State<Console>,
    Viewer(who): Viewer,
    RawQuery(q): RawQuery,
) -> Response {
    let raw = q.unwrap_or_default();

    let Some(changed) = age_column(&c) else {
        let body = format!(
            r#"<main><h1>Purge FAILED rows</h1><p class="error" id="purge-error">Not available on this table: {}.</p></main>"#,
            esc(NO_AGE)
        );
        return framed(&c, &who, "Purge", &body);
    };
    let form = Form::parse(raw.as_bytes());
    let ask = |error: &str, value: &str| {
        let error = if error.is_empty() {
            String::new()
        } else {
            format!(r#"<p class="error" id="purge-error">{}</p>"#, esc(error))
        };
        format!(
            r#"<main><h1>Purge FAILED rows</h1>{error}
<p>Deletes FAILED rows {changed} longer ago than the age you give. Only FAILED rows: nothing waiting or delivered is touched. The next page shows how many rows that is before anything is deleted.</p>
<form method="get" action="/purge"><label>Older than <input name="older_than" id="older-than" value="{}" placeholder="7d"></label> <button type="submit" id="count">Count them</button></form></main>"#,
            esc(value)
        )
    };
    let Some(text) = form.get("older_than") else {
        return framed(&c, &who, "Purge", &ask("", ""));
    };
    let older_than = match parse_age(text) {
        Ok(d) => d,
        Err(e) => {
            let mut r = framed(&c, &who, "Purge", &ask(&e, text));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            return r;
        }
    };
    let count = match c
        .inner
        .store
        .count_older(Finished::Failed, older_than)
        .await
    {
        Ok(n) => n,
        Err(e) => return db_error(&e),
    };
    let body = if count == 0 {
        format!(
            r#"<main><h1>Nothing to purge</h1><p class="confirm" id="confirm">No FAILED row was {changed} more than {} ago.</p><p><a href="/purge">Back</a></p></main>"#,
            esc(text)
        )
    } else {
        format!(
            r#"<main><h1>Delete {count} FAILED row(s)?</h1>
<p class="confirm" id="confirm">{count} FAILED row(s) were {changed} more than {age} ago. Deleting them cannot be undone.</p>
<form method="post" action="/purge">{csrf}<input type="hidden" name="older_than" value="{age}"><input type="hidden" name="expected" value="{count}">
<button type="submit" class="danger" id="confirm-purge">Delete {count} row(s)</button> <a href="/failed">Cancel</a></form></main>"#,
            age = esc(text),
            csrf = csrf_field(&c, &who),
        )
    };
    framed(&c, &who, "Purge", &body)
}

/// `POST /purge`: deletes FAILED rows older than `older_than`, as `outbox-relay purge` does.
pub(super) async fn purge(State(c): State<Console>, Act { who, form }: Act) -> Response {
    let Some(changed) = age_column(&c) else {
        return error_page(StatusCode::BAD_REQUEST, NO_AGE);
    };
    let text = form.get("older_than").unwrap_or("");
    let older_than = match parse_age(text) {
        Ok(d) => d,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &format!("older_than: {e}")),
    };
    let deleted = match housekeeping::purge_all(
        &c.inner.store,
        &[(Finished::Failed, older_than)],
        &c.inner.stop,
        PURGE_BUDGET,
    )
    .await
    {
        Ok(n) => n,
        Err(e) => return db_error(&e),
    };
    tracing::info!(who = %who, action = "purge", status = "FAILED", older_than = %text, deleted, "console action");
    done(
        &c,
        &who,
        "Purged",
        &format!("Deleted {deleted} FAILED row(s) {changed} more than {text} ago."),
        &[
            (
                "Purge page",
                format!(
                    "/purge?older_than={}",
                    form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>()
                ),
            ),
            ("Overview", "/".into()),
        ],
    )
}
