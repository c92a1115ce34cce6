//! The console's side of the toolkit: a relay started with `[console]`, a table seeded with
//! rows in every state the console shows, and an HTTP client that logs in like a browser
//! (cookie, CSRF field) or sends the token as a bearer.

use std::time::Duration;

use super::config::Config;
use super::process::RelayProc;
use super::receiver::Receiver;
use super::{Db, TestDb, db_time};

/// The console token the tests configure.
pub const TOKEN: &str = "console-test-token-0123456789";
/// Recipients and payloads that must never appear in a page unmasked / unless configured.
pub const PHONE: &str = "+821012345678";
pub const SECRET_PAYLOAD: &str = "payload-body-xyz";

/// A relay with the console on, delivering channel `hook` to `rx`, on `td`'s table.
pub async fn start_relay(
    td: &TestDb,
    rx: &Receiver,
    extra: impl FnOnce(Config) -> Config,
) -> (RelayProc, String) {
    let cfg = extra(Config::webhook(&rx.url()).console(TOKEN).retry(
        Duration::from_millis(100),
        Duration::from_millis(200),
        1,
    ));
    let relay = RelayProc::start(td, &cfg, "relay-console");
    let addr = relay.console_addr().await;
    (relay, format!("http://{addr}"))
}

/// The ids of the seeded rows.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// FAILED `hook` rows whose error contains "boom", oldest first.
    pub boom: Vec<i64>,
    /// A FAILED `hook` row whose error is a timeout.
    pub timeout: i64,
    /// A FAILED row of channel `other` (no sink), last updated two days ago, whose error is
    /// markup.
    pub old_other: i64,
}

/// Seeds `td`'s table: 3 FAILED "boom" hook rows (recipient [`PHONE`], payload with
/// [`SECRET_PAYLOAD`]), 1 FAILED timeout hook row, 1 old FAILED `other` row with markup in its
/// error, 2 PENDING and 1 RETRY hook rows due only in an hour (so the relay leaves them).
pub async fn seed(td: &TestDb) -> Seeded {
    let db = td.db;
    let cast = if db == Db::Postgres { "::jsonb" } else { "" };
    let later = db_time(db, 3600);
    let old = db_time(db, -2 * 86_400);
    let insert = |channel: &str, status: &str, error: &str, next: &str, updated: Option<&str>| {
        let updated = updated.map(|u| format!(", {u}")).unwrap_or_default();
        let col = if updated.is_empty() {
            ""
        } else {
            ", updated_at"
        };
        format!(
            "INSERT INTO {{t}} (channel, recipient, payload, status, attempts, last_error, next_attempt_at{col})
             VALUES ('{channel}', '{PHONE}', '{{\"text\":\"{SECRET_PAYLOAD}\"}}'{cast}, '{status}', 3, {error}, {next}{updated})"
        )
    };
    let now = db_time(db, 0);
    let statements = [
        insert("hook", "FAILED", "'HTTP 500: boom 1'", &now, None),
        insert("hook", "FAILED", "'HTTP 500: boom 2'", &now, None),
        insert("hook", "FAILED", "'HTTP 500: BOOM 3'", &now, None),
        insert("hook", "FAILED", "'timeout after 5s'", &now, None),
        insert(
            "other",
            "FAILED",
            "'<script>alert(1)</script>'",
            &now,
            Some(&old),
        ),
        insert("hook", "PENDING", "NULL", &later, None),
        insert("hook", "PENDING", "NULL", &later, None),
        insert("hook", "RETRY", "'HTTP 503'", &later, None),
    ];
    for s in statements {
        td.exec(&s).await;
    }
    let id = |cond: &str| format!("SELECT MIN(id) FROM {{t}} WHERE {cond}");
    Seeded {
        boom: vec![
            td.scalar(&id("last_error = 'HTTP 500: boom 1'")).await,
            td.scalar(&id("last_error = 'HTTP 500: boom 2'")).await,
            td.scalar(&id("last_error = 'HTTP 500: BOOM 3'")).await,
        ],
        timeout: td.scalar(&id("last_error = 'timeout after 5s'")).await,
        old_other: td.scalar(&id("channel = 'other'")).await,
    }
}

/// The status of row `id`.
pub async fn status_of(td: &TestDb, id: i64) -> String {
    use sqlx::Row;
    let sql = format!("SELECT status FROM {} WHERE id = {id}", td.table);
    match sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_optional(td.store.pool())
        .await
        .expect("status")
    {
        Some(r) => r.try_get::<String, _>(0).expect("text"),
        None => "MISSING".into(),
    }
}

/// An answer: status, `Location`, `Set-Cookie`, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookie: Option<String>,
    pub body: String,
}

/// An HTTP client of the console that never follows redirects.
pub struct ConsoleClient {
    pub base: String,
    http: reqwest::Client,
    /// `outbox_console=...` once logged in.
    cookie: Option<String>,
}

impl ConsoleClient {
    pub fn new(base: &str) -> ConsoleClient {
        outbox_relay::install_crypto_provider();
        ConsoleClient {
            base: base.to_string(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
            cookie: None,
        }
    }

    /// Sends a request; `headers` are added as given (the cookie too, once logged in).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", c);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/x-www-form-urlencoded")
                .body(b.to_string());
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (status, location, set_cookie) = (
            resp.status().as_u16(),
            header("location"),
            header("set-cookie"),
        );
        Answer {
            status,
            location,
            set_cookie,
            body: resp.text().await.unwrap_or_default(),
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None, &[("accept", "text/html")])
            .await
    }

    /// A form POST as a browser on the console's own page sends it.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let body = form(fields);
        let origin = self.base.clone();
        self.send(
            "POST",
            path,
            Some(&body),
            &[("origin", &origin), ("sec-fetch-site", "same-origin")],
        )
        .await
    }

    /// Logs in with `token` as `operator`; returns the answer (the cookie is kept on success).
    pub async fn login(&mut self, token: &str, operator: &str) -> Answer {
        let a = self
            .post(
                "/login",
                &[("token", token), ("operator", operator), ("next", "/")],
            )
            .await;
        if a.status == 303
            && let Some(c) = &a.set_cookie
        {
            self.cookie = c.split(';').next().map(str::to_string);
        }
        a
    }

    /// The CSRF field of a page of this session.
    pub async fn csrf(&self) -> String {
        let page = self.get("/").await;
        field(&page.body, "csrf").expect("a csrf field on the overview")
    }
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        s.append_pair(k, v);
    }
    s.finish()
}

/// The value of the first `<input name="NAME" value="...">` in `html`.
pub fn field(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!(r#"name="{name}" value=""#))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].replace("&amp;", "&"))
}

/// The number in `<tr data-channel="CHANNEL">...<td data-k="KEY">N</td>` (links inside too).
pub fn cell(html: &str, channel: &str, key: &str) -> Option<i64> {
    let row = &html[html.find(&format!(r#"<tr data-channel="{channel}">"#))?..];
    let row = &row[..row.find("</tr>")?];
    let cell = &row[row.find(&format!(r#"data-k="{key}""#))?..];
    let text = &cell[cell.find('>')? + 1..cell.find("</td>")?];
    let digits: String = text
        .split('>')
        .filter_map(|p| p.split('<').next())
        .collect::<String>()
        .chars()
        .filter(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The row ids of a failed-rows page, in page order.
pub fn failed_ids(html: &str) -> Vec<i64> {
    html.split(r#"<tr data-id=""#)
        .skip(1)
        .filter_map(|s| s.split('"').next()?.parse().ok())
        .collect()
}
