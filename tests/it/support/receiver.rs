//! A loopback webhook receiver for end-to-end tests: an axum server on `127.0.0.1:0` that
//! records every request (webhook-id, headers, body, arrival and answer times), verifies the
//! Standard Webhooks signature when it knows the secret, and answers from a per-test script.
//!
//! Scripting: [`Receiver::script`] queues replies for one row id, consumed one per attempt;
//! once a row's queue is empty (or it has none) the reply is 200. [`Receiver::set_delay`]
//! holds every answer back for a while (a slow receiver keeps requests in flight).
//!
//! The signature is checked with an implementation of its own (hmac/sha2/base64 directly), not
//! the relay's signing code, so a signing bug cannot verify itself.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::process::delta_ms;

/// How a request is answered.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// 200 with an empty body.
    pub fn ok() -> Reply {
        Reply::status(200)
    }

    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: &str) -> Reply {
        self.body = body.to_string();
        self
    }
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    /// `webhook-id` parsed as a row id (`None` if absent or not a number).
    pub id: Option<i64>,
    pub path: String,
    pub headers: HeaderMap,
    pub body: String,
    /// When the request (head and body) had arrived.
    pub at: Instant,
    /// When the handler produced its answer (after any delay); `None` while still pending.
    pub answered_at: Option<Instant>,
    /// The status answered.
    pub status: u16,
    /// `Some(true)` when the signature verified, `Some(false)` when it was missing or wrong,
    /// `None` when the receiver was started without a secret.
    pub signature_ok: Option<bool>,
}

impl Received {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

struct Script {
    per_id: HashMap<i64, VecDeque<Reply>>,
    default: Reply,
    delay: Duration,
}

struct Inner {
    key: Option<Vec<u8>>,
    requests: Mutex<Vec<Received>>,
    script: Mutex<Script>,
    arrived: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not hide the requests from the assertions after it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running receiver; stops serving when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts a receiver. With `secret` (`whsec_<base64>` or raw), every request's
    /// `webhook-signature` is verified and the result recorded.
    pub async fn start(secret: Option<&str>) -> Receiver {
        let key = secret.map(|s| match s.strip_prefix("whsec_") {
            Some(b64) => STANDARD.decode(b64).expect("whsec_ secret is base64"),
            None => s.as_bytes().to_vec(),
        });
        let inner = Arc::new(Inner {
            key,
            requests: Mutex::new(Vec::new()),
            script: Mutex::new(Script {
                per_id: HashMap::new(),
                default: Reply::ok(),
                delay: Duration::ZERO,
            }),
            arrived: tokio::sync::Notify::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("receiver address");
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, inner, task }
    }

    /// `http://127.0.0.1:PORT/hook`.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Queues replies for row `id`, one per attempt, before the default applies again.
    pub fn script(&self, id: i64, replies: Vec<Reply>) {
        lock(&self.inner.script)
            .per_id
            .entry(id)
            .or_default()
            .extend(replies);
    }

    /// Holds every answer back this long (applies to requests arriving from now on).
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.inner.script).delay = delay;
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Received> {
        lock(&self.inner.requests).clone()
    }

    /// How many requests have arrived.
    pub fn len(&self) -> usize {
        lock(&self.inner.requests).len()
    }

    /// The `webhook-id` of every request, in arrival order (requests without one are left out).
    pub fn received_ids(&self) -> Vec<i64> {
        lock(&self.inner.requests)
            .iter()
            .filter_map(|r| r.id)
            .collect()
    }

    /// Requests per `webhook-id`.
    pub fn count_by_id(&self) -> HashMap<i64, usize> {
        let mut out = HashMap::new();
        for id in self.received_ids() {
            *out.entry(id).or_insert(0) += 1;
        }
        out
    }

    /// The requests for one row id, in arrival order.
    pub fn requests_for(&self, id: i64) -> Vec<Received> {
        lock(&self.inner.requests)
            .iter()
            .filter(|r| r.id == Some(id))
            .cloned()
            .collect()
    }

    /// Waits until `pred` holds over the requests so far; false if `timeout` passed first.
    /// `pred` runs under the receiver's lock: it must not call the receiver's methods.
    pub async fn wait_until(&self, pred: impl Fn(&[Received]) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before checking, so an arrival in between is not missed.
            let notified = self.inner.arrived.notified();
            if pred(&lock(&self.inner.requests)) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            // Answers (answered_at) do not notify: poll now and then as well.
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The first request that satisfies `pred`, once one has arrived; after `timeout` panics
    /// with `what` (what did not happen) and the last requests.
    pub async fn first_where(
        &self,
        pred: impl Fn(&Received) -> bool,
        timeout: Duration,
        what: &str,
    ) -> Received {
        let came = self
            .wait_until(|reqs| reqs.iter().any(&pred), timeout)
            .await;
        let reqs = self.requests();
        let t0 = Instant::now()
            .checked_sub(timeout)
            .unwrap_or_else(Instant::now);
        assert!(came, "{what}\n{}", timeline(&reqs, t0));
        reqs.into_iter().find(|r| pred(r)).expect("the request")
    }

    /// The one relay that sends the requests arriving after `since`, watched for `window`
    /// (exclusivity over a stretch of deliveries is the subject, so the window is a fixed
    /// time); panics naming `what` when they come from more than one.
    pub async fn only_sender_for(&self, since: Instant, window: Duration, what: &str) -> String {
        tokio::time::sleep(window).await;
        let after: Vec<Received> = self
            .requests()
            .into_iter()
            .filter(|r| r.at > since)
            .collect();
        only_sender(&after, since, what)
    }

    /// Waits until at least `n` requests have arrived; panics with `what` after `timeout`.
    pub async fn expect_requests(&self, n: usize, timeout: Duration, what: &str) {
        if !self.wait_until(|r| r.len() >= n, timeout).await {
            panic!(
                "{what}: expected at least {n} requests within {timeout:?}, got {}",
                self.len()
            );
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Which relay sent a request: its `x-relay` header, which the suites with several relays set
/// to the instance name (`?` when absent).
pub fn sender(r: &Received) -> &str {
    r.header("x-relay").unwrap_or("?")
}

/// The relays that sent `reqs` (see [`sender`]).
pub fn senders<'a>(reqs: impl IntoIterator<Item = &'a Received>) -> BTreeSet<String> {
    reqs.into_iter().map(|r| sender(r).to_string()).collect()
}

/// The last 40 of `reqs`, for failure messages: arrival relative to `t0`, sender, row.
pub fn timeline(reqs: &[Received], t0: Instant) -> String {
    let skip = reqs.len().saturating_sub(40);
    reqs.iter()
        .skip(skip)
        .map(|r| {
            format!(
                "  {:>8.1} ms  from {}  row {:?}\n",
                delta_ms(t0, r.at),
                sender(r),
                r.id
            )
        })
        .collect()
}

/// The only sender of `reqs`; panics (naming `what`, with the timeline from `t0`) if there
/// were several or none.
pub fn only_sender(reqs: &[Received], t0: Instant, what: &str) -> String {
    let s = senders(reqs);
    assert_eq!(
        s.len(),
        1,
        "{what}: expected exactly one relay delivering, saw {s:?}\n{}",
        timeline(reqs, t0)
    );
    s.into_iter().next().expect("one sender")
}

/// Standard Webhooks: `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, possibly
/// several space-separated signatures (key rotation), any of which may match.
fn verify(key: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return false;
    };
    // The timestamp must be current (receivers reject replays older than a few minutes).
    let Ok(ts_secs) = ts.parse::<u64>() else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if now.abs_diff(ts_secs) > 300 {
        return false;
    }
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("hmac key");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    sigs.split_whitespace().any(|s| s == expected)
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Instant::now();
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let signature_ok = inner.key.as_deref().map(|k| verify(k, &headers, &body));
    let (reply, delay) = {
        let mut script = lock(&inner.script);
        let scripted = id.and_then(|id| script.per_id.get_mut(&id).and_then(|q| q.pop_front()));
        (
            scripted.unwrap_or_else(|| script.default.clone()),
            script.delay,
        )
    };
    let index = {
        let mut reqs = lock(&inner.requests);
        reqs.push(Received {
            id,
            path: uri.path().to_string(),
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            at,
            answered_at: None,
            status: reply.status,
            signature_ok,
        });
        reqs.len() - 1
    };
    inner.arrived.notify_waiters();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    lock(&inner.requests)[index].answered_at = Some(Instant::now());
    let mut out_headers = HeaderMap::new();
    for (k, v) in &reply.headers {
        out_headers.insert(
            HeaderName::from_bytes(k.as_bytes()).expect("scripted header name"),
            HeaderValue::from_str(v).expect("scripted header value"),
        );
    }
    let status = StatusCode::from_u16(reply.status).expect("scripted status");
    (status, out_headers, reply.body).into_response()
}
