//! HTML: escaping, the page frame, masking, and the headers every answer carries.
//!
//! Every value that comes from the table or a request goes through [`esc`] before it is put in
//! a page; the frame links only this console's own style sheet and script.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

/// `s` with the five HTML-special characters escaped (safe in text and in quoted attributes).
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A recipient with all but its last 4 characters hidden (a phone number, a device token).
/// Values of 6 characters or fewer are hidden whole: their last 4 would give away most.
pub(super) fn mask(recipient: &str) -> String {
    let chars: Vec<char> = recipient.chars().collect();
    if chars.len() <= 6 {
        return "••••".to_string();
    }
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("••••{tail}")
}

/// A duration as an operator reads it: `850ms`, `42s`, `3m 20s`, `5h 02m`, `2d 03h`.
pub(super) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A page with the navigation bar, for a logged-in operator (named, if they gave a name); a
/// login session (rather than a bearer token) gets a logout button.
pub(super) fn page(
    title: &str,
    operator: Option<&str>,
    session: bool,
    csrf: &str,
    body: &str,
) -> Response {
    let operator = operator
        .map(|o| format!("<span class=\"who\">{}</span>", esc(o)))
        .unwrap_or_default();
    let logout = if session {
        format!(
            r#"<form method="post" action="/logout" class="logout"><input type="hidden" name="csrf" value="{}"><button type="submit">Log out</button></form>"#,
            esc(csrf)
        )
    } else {
        String::new()
    };
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · outbox-relay</title><link rel="stylesheet" href="/console.css"><script src="/console.js" defer></script></head>
<body><header><nav><span class="brand">outbox-relay</span><a href="/">Overview</a><a href="/failed">Failed rows</a><a href="/purge">Purge</a></nav><div class="session">{operator}{logout}</div></header>
{body}
</body></html>"#,
        title = esc(title),
    );
    Html(html).into_response()
}

/// A page without navigation (login, errors), with `status`.
pub(super) fn bare_page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · outbox-relay</title><link rel="stylesheet" href="/console.css"></head>
<body>{body}</body></html>"#,
        title = esc(title)
    );
    (status, Html(html)).into_response()
}

/// An error page: the status and one sentence saying what to do.
pub(super) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = format!(
        r#"<main class="login"><h1>{} {}</h1><p class="error" id="error">{}</p><p><a href="/">Back to the overview</a></p></main>"#,
        status.as_u16(),
        esc(status.canonical_reason().unwrap_or("")),
        esc(message)
    );
    bare_page(status, status.canonical_reason().unwrap_or("Error"), &body)
}

/// `path?query`, or `path` when the query is empty.
pub(super) fn with_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

/// `path` if it is a path on this console, never another site: it starts with one `/`, and
/// holds only visible ASCII (browsers drop tabs and newlines from URLs, so `/<TAB>/evil`
/// would become `//evil`, another host) and no backslash (read as `/` by browsers).
pub(super) fn local_path(path: &str) -> Option<&str> {
    let ok = path.starts_with('/')
        && !path.starts_with("//")
        && path.chars().all(|c| c.is_ascii_graphic() && c != '\\');
    ok.then_some(path)
}

/// 303 See Other to `to` (a path on this console).
pub(super) fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Headers on every answer: nothing but this console's own files may load or run, no other
/// site may frame it, no page is cached (they show rows), no referrer leaves it for another site.
pub(super) async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, "x-frame-options", "DENY");
    set(h, "x-content-type-options", "nosniff");
    // Not `no-referrer`: under it a browser sends `Origin: null` with the console's own form
    // posts, which the cross-site check must refuse.
    set(h, "referrer-policy", "same-origin");
    set(h, "cache-control", "no-store");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_masks_recipients() {
        assert_eq!(
            esc(r#"<script>"x" & 'y'</script>"#),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
        assert_eq!(mask("+821012345678"), "••••5678");
        assert_eq!(mask("12345"), "••••");
        assert_eq!(mask("한국어전화번호입니다"), "••••호입니다");
        assert_eq!(age(Duration::from_millis(1500)), "1s");
        assert_eq!(age(Duration::from_secs(3725)), "1h 02m");
    }

    #[test]
    fn only_paths_of_this_console_are_followed() {
        assert_eq!(local_path("/failed?channel=a"), Some("/failed?channel=a"));
        for other in [
            "//evil.example",
            "https://evil.example",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/ /evil.example",
            "",
        ] {
            assert_eq!(local_path(other), None, "{other:?}");
        }
    }
}
