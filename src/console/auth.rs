//! Who may use the console: the token, login sessions, CSRF tokens and the cross-site check.
//!
//! The cookie carries `<session id>.<issued>.<operator>.<MAC>` under a key drawn at start, so
//! it is not the token, cannot be forged, and every session ends when the process does. A
//! session also ends on logout (the id is forgotten) and after [`SESSION_TTL`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::Console;
use super::queries::Form;
use super::throttle::Throttle;
use super::view::{self, esc};

/// The session cookie's name.
const COOKIE: &str = "outbox_console";
/// How long a login lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions remembered at once (each login adds one; expired ones are dropped first).
const MAX_SESSIONS: usize = 10_000;

/// The console's keys and live sessions.
pub(super) struct Auth {
    /// HMAC under a key drawn at start; cloned for each use.
    mac: Hmac<Sha256>,
    /// The token's MAC: a presented token is compared by its MAC, in constant time.
    token_mac: Vec<u8>,
    /// Live session ids and when each expires (seconds since the epoch).
    sessions: Mutex<HashMap<String, u64>>,
    /// How long wrong tokens are answered late, across every connection.
    throttle: Throttle,
}

/// The answer to a request that may not go on (boxed: a response is large).
pub(super) type Refusal = Box<Response>;

/// Who made a request, for the logs and the page header.
#[derive(Debug, Clone)]
pub(super) struct Who {
    /// The session id (`None` for `Authorization: Bearer`).
    pub session: Option<String>,
    pub operator: Option<String>,
    pub peer: SocketAddr,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.session {
            // Half of the id is enough to tell sessions apart and useless to anyone reading logs.
            Some(s) => write!(f, "session {}", s.chars().take(8).collect::<String>())?,
            None => f.write_str("bearer token")?,
        }
        if let Some(op) = &self.operator {
            write!(f, " operator {op:?}")?;
        }
        write!(f, " from {}", self.peer)
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

impl Auth {
    pub(super) fn new(token: &str) -> Auth {
        let key: [u8; 32] = rand::random();
        // HMAC-SHA256 takes a key of any length: this cannot fail.
        let mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(&key) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts any key length"),
        };
        let mut m = mac.clone();
        m.update(b"token|");
        m.update(token.as_bytes());
        Auth {
            token_mac: m.finalize().into_bytes().to_vec(),
            mac,
            sessions: Mutex::new(HashMap::new()),
            throttle: Throttle::new(),
        }
    }

    fn sign(&self, parts: &[&str]) -> String {
        let mut m = self.mac.clone();
        for p in parts {
            m.update(p.as_bytes());
            m.update(b"|");
        }
        hex(&m.finalize().into_bytes())
    }

    /// True if `signature` (hex) is the MAC of `parts`, compared in constant time.
    fn verify(&self, parts: &[&str], signature: &str) -> bool {
        let Some(sig) = unhex(signature) else {
            return false;
        };
        let mut m = self.mac.clone();
        for p in parts {
            m.update(p.as_bytes());
            m.update(b"|");
        }
        m.verify_slice(&sig).is_ok()
    }

    /// True if `presented` is the token (compared by MAC, in constant time).
    fn token_ok(&self, presented: &str) -> bool {
        let mut m = self.mac.clone();
        m.update(b"token|");
        m.update(presented.as_bytes());
        m.verify_slice(&self.token_mac).is_ok()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        match self.sessions.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Starts a session; returns the cookie value.
    fn open(&self, operator: &str) -> String {
        let sid = crate::random_token();
        let issued = now_secs().to_string();
        let op = URL_SAFE_NO_PAD.encode(operator.as_bytes());
        let sig = self.sign(&["session", &sid, &issued, &op]);
        let mut sessions = self.sessions();
        let now = now_secs();
        sessions.retain(|_, until| *until > now);
        if sessions.len() >= MAX_SESSIONS {
            // Full of live sessions: drop the one closest to its end rather than refuse.
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, u)| **u)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(sid.clone(), now + SESSION_TTL.as_secs());
        format!("{sid}.{issued}.{op}.{sig}")
    }

    /// The session a cookie value names, if it is genuine, live and not logged out.
    fn session(&self, value: &str) -> Option<(String, Option<String>)> {
        let mut parts = value.split('.');
        let (sid, issued, op, sig) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !self.verify(&["session", sid, issued, op], sig) {
            return None;
        }
        let until = *self.sessions().get(sid)?;
        if until <= now_secs() {
            return None;
        }
        let operator = URL_SAFE_NO_PAD
            .decode(op)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|s| !s.is_empty());
        Some((sid.to_string(), operator))
    }

    /// The CSRF token of a session: forms of that session carry it, no other page knows it.
    pub(super) fn csrf(&self, who: &Who) -> String {
        match &who.session {
            Some(sid) => self.sign(&["csrf", sid]),
            None => String::new(),
        }
    }
}

/// The session cookie's value in the request, if any.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// What a request's credentials say.
enum Identity {
    /// The token, or a live session.
    Known(Who),
    /// `Authorization: Bearer` with another token.
    WrongToken,
    /// No token and no live session.
    Unknown,
}

/// Who this request comes from: the token (checked first, in constant time, so the right one
/// is never held by the throttle) or a live session.
fn identify(c: &Console, headers: &HeaderMap, peer: SocketAddr) -> Identity {
    let auth = &c.inner.auth;
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        if !auth.token_ok(bearer.trim()) {
            return Identity::WrongToken;
        }
        auth.throttle.right(peer.ip());
        return Identity::Known(Who {
            session: None,
            operator: None,
            peer,
        });
    }
    match cookie(headers).and_then(|v| auth.session(v)) {
        Some((sid, operator)) => Identity::Known(Who {
            session: Some(sid),
            operator,
            peer,
        }),
        None => Identity::Unknown,
    }
}

/// Holds the answer to a wrong token (at a login or as a bearer) as long as the process-wide
/// limiter says (`throttle`), or until the console stops, and logs it (at most one line per
/// answer, so the log is throttled too). True when the answer is 429: too many wrong tokens.
async fn wrong_token(c: &Console, peer: SocketAddr, via: &'static str) -> bool {
    let hold = c.inner.auth.throttle.wrong(peer.ip());
    tokio::select! {
        _ = tokio::time::sleep(hold.wait) => {}
        _ = c.inner.stop.cancelled() => {}
    }
    tracing::warn!(
        %peer,
        via,
        held_ms = hold.wait.as_millis() as u64,
        too_many = hold.too_many,
        "console: wrong token (answer throttled)"
    );
    hold.too_many
}

/// The answer to a wrong bearer token, once held.
async fn wrong_bearer(c: &Console, peer: SocketAddr) -> Refusal {
    Box::new(if wrong_token(c, peer, "bearer").await {
        too_many()
    } else {
        unauthorized()
    })
}

/// 429: too many wrong tokens lately.
fn too_many() -> Response {
    let mut r = view::error_page(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many wrong tokens lately: try again in a minute.",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
    r
}

/// The identity of a page request, or the answer to give without one: a browser (asking for
/// HTML) is sent to the login page, anything else gets 401 (a wrong bearer token, late).
async fn page(
    c: &Console,
    headers: &HeaderMap,
    peer: SocketAddr,
    path: &str,
) -> Result<Who, Refusal> {
    match identify(c, headers, peer) {
        Identity::Known(who) => return Ok(who),
        Identity::WrongToken => return Err(wrong_bearer(c, peer).await),
        Identity::Unknown => {}
    }
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if wants_html {
        let next: String = form_urlencoded::byte_serialize(path.as_bytes()).collect();
        Err(Box::new(view::redirect(&format!("/login?next={next}"))))
    } else {
        Err(Box::new(unauthorized()))
    }
}

fn unauthorized() -> Response {
    let mut r = view::error_page(
        StatusCode::UNAUTHORIZED,
        "The console needs its token: log in at /login, or send Authorization: Bearer <token>.",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"outbox-relay console\""),
    );
    r
}

/// Why a state-changing request comes from another site, if it does: a browser says so in
/// `Sec-Fetch-Site`, and its `Origin` must be this console's own.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    // A browser's own word, which no page can forge: when present, it decides.
    if let Some(site) = get("sec-fetch-site") {
        return (site != "same-origin" && site != "none")
            .then(|| format!("Sec-Fetch-Site is {site}"));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = get("host").unwrap_or("");
        let own = |scheme: &str| format!("{scheme}://{host}");
        if host.is_empty() || (origin != own("http") && origin != own("https")) {
            return Some(format!("Origin {origin:?} is not this console"));
        }
    }
    None
}

/// The identity behind an action (a POST), or the refusal: 403 when cross-site or without the
/// session's CSRF token, 401 without the token (a wrong bearer token, late).
async fn action(
    c: &Console,
    headers: &HeaderMap,
    peer: SocketAddr,
    form: &Form,
) -> Result<Who, Refusal> {
    if let Some(why) = cross_site(headers) {
        tracing::warn!(%peer, reason = %why, "console: cross-site request refused");
        return Err(Box::new(view::error_page(
            StatusCode::FORBIDDEN,
            &format!("Refused: a cross-site request ({why}). Use the console's own pages."),
        )));
    }
    let who = match identify(c, headers, peer) {
        Identity::Known(who) => who,
        Identity::WrongToken => return Err(wrong_bearer(c, peer).await),
        Identity::Unknown => return Err(Box::new(unauthorized())),
    };
    if who.session.is_some() {
        let sent = form.get("csrf").unwrap_or("");
        let sid = who.session.as_deref().unwrap_or("");
        if !c.inner.auth.verify(&["csrf", sid], sent) {
            tracing::warn!(who = %who, "console: request without a valid CSRF token refused");
            return Err(Box::new(view::error_page(
                StatusCode::FORBIDDEN,
                "Refused: the form's security token is missing or out of date. Reload the page \
                 and try again.",
            )));
        }
    }
    Ok(who)
}

/// Most bytes of a form body the console reads (its forms hold a few short fields).
const MAX_FORM: usize = 64 * 1024;

/// The peer address of a request (served with connect info; unknown otherwise).
fn peer_of(parts: &Parts) -> SocketAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// Extracts who asks for a page; without the token the handler never runs (login redirect or
/// 401).
pub(super) struct Viewer(pub Who);

impl FromRequestParts<Console> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Response> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        page(c, &parts.headers, peer_of(parts), path)
            .await
            .map(Viewer)
            .map_err(|r| *r)
    }
}

/// Extracts an action (a POST) and its form; a cross-site request, one without the token, or
/// a session's form without its CSRF token never reaches the handler.
pub(super) struct Act {
    pub who: Who,
    pub form: Form,
}

impl FromRequest<Console> for Act {
    type Rejection = Response;

    async fn from_request(req: Request, c: &Console) -> Result<Self, Response> {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
            return Err(view::error_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                "That form is larger than any of the console's.",
            ));
        };
        let form = Form::parse(&bytes);
        let who = action(c, &parts.headers, peer_of(&parts), &form)
            .await
            .map_err(|r| *r)?;
        Ok(Act { who, form })
    }
}

/// `GET /login`.
pub(super) async fn login_page(axum::extract::RawQuery(q): axum::extract::RawQuery) -> Response {
    let q = Form::parse(q.as_deref().unwrap_or("").as_bytes());
    login_form(StatusCode::OK, q.get("next").unwrap_or("/"), None)
}

fn login_form(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let error = error
        .map(|e| format!(r#"<p class="error" id="login-error">{}</p>"#, esc(e)))
        .unwrap_or_default();
    let body = format!(
        r#"<main class="login">
<h1>outbox-relay console</h1>
{error}
<form method="post" action="/login">
<input type="hidden" name="next" value="{next}">
<label>Token <input type="password" name="token" id="token" autocomplete="current-password" required autofocus></label>
<label>Your name (optional, written to the log with every action) <input type="text" name="operator" id="operator" maxlength="64"></label>
<button type="submit" id="login">Log in</button>
</form>
<p class="hint">The token is <code>console.token</code> of the relay's configuration.</p>
</main>"#,
        next = esc(next),
    );
    view::bare_page(status, "Log in", &body)
}

/// `POST /login`.
pub(super) async fn login(
    State(c): State<Console>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form = Form::parse(&body);
    if let Some(why) = cross_site(&headers) {
        tracing::warn!(%peer, reason = %why, "console: cross-site login refused");
        return view::error_page(StatusCode::FORBIDDEN, &format!("Refused: {why}."));
    }
    let next = view::local_path(form.get("next").unwrap_or("/"))
        .unwrap_or("/")
        .to_string();
    // The token first, in constant time: the right one is never held by the throttle.
    if !c.inner.auth.token_ok(form.get("token").unwrap_or("")) {
        if wrong_token(&c, peer, "login").await {
            return too_many();
        }
        return login_form(StatusCode::UNAUTHORIZED, &next, Some("Wrong token."));
    }
    c.inner.auth.throttle.right(peer.ip());
    // A name for the logs: printable, at most 64 characters.
    let operator: String = form
        .get("operator")
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect::<String>()
        .trim()
        .to_string();
    let value = c.inner.auth.open(&operator);
    tracing::info!(%peer, operator = %operator, "console: logged in");
    let mut r = view::redirect(&next);
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `POST /logout`: forgets the session and clears the cookie.
pub(super) async fn logout(State(c): State<Console>, Act { who, .. }: Act) -> Response {
    if let Some(sid) = &who.session {
        c.inner.auth.sessions().remove(sid);
    }
    tracing::info!(who = %who, "console: logged out");
    let mut r = view::redirect("/login");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("outbox_console=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_signed_and_end_at_logout() {
        let a = Auth::new("0123456789abcdef");
        assert!(a.token_ok("0123456789abcdef"));
        assert!(!a.token_ok("0123456789abcdeF"));
        assert!(!a.token_ok(""));
        let value = a.open("alice");
        assert!(!value.contains("0123456789abcdef"));
        let (sid, op) = a.session(&value).expect("a live session");
        assert_eq!(op.as_deref(), Some("alice"));
        // Another operator name under the same MAC is refused.
        let forged = value.replacen(
            &URL_SAFE_NO_PAD.encode("alice"),
            &URL_SAFE_NO_PAD.encode("bob"),
            1,
        );
        assert!(a.session(&forged).is_none());
        // Another process (another key) does not accept it.
        assert!(Auth::new("0123456789abcdef").session(&value).is_none());
        a.sessions().remove(&sid);
        assert!(a.session(&value).is_none());
    }

    #[test]
    fn cross_site_requests_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:9091"));
        assert!(cross_site(&h).is_none());
        h.insert("origin", HeaderValue::from_static("http://127.0.0.1:9091"));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(cross_site(&h).is_none());
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&h).is_some());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(cross_site(&h).is_some());
        h.remove("sec-fetch-site");
        h.insert("origin", HeaderValue::from_static("http://evil.example"));
        assert!(cross_site(&h).is_some());
        h.insert("origin", HeaderValue::from_static("null"));
        assert!(cross_site(&h).is_some());
    }
}
