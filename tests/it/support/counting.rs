//! A receiver for throughput runs: answers 204 at once and only counts, so that it costs the
//! relay as little as a receiver can. `/hook` serves single relays and the references; the
//! claim section gives each instance its own path (`/hook/a`, `/hook/b`, `/hook/c`), counted
//! apart, and notes `webhook-id`s seen twice. (The recording [`super::receiver::Receiver`]
//! is for tests that inspect requests.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio_util::sync::CancellationToken;

/// The per-instance paths, in order.
pub const INSTANCE_PATHS: [&str; 3] = ["a", "b", "c"];

/// How long `/slow/...` takes to answer: a receiver that does some work.
pub const SLOW_REPLY: std::time::Duration = std::time::Duration::from_millis(20);

/// The loopback receiver: answers 204 at once and counts requests. `/hook` serves the leader
/// section and the references; the claim section gives each instance its own path
/// (`/hook/a`, `/hook/b`, `/hook/c`), counted apart, and notes `webhook-id`s seen twice there.
pub struct Receiver {
    pub url: String,
    count: Arc<AtomicU64>,
    /// Requests per instance path, in [`INSTANCE_PATHS`] order.
    per_instance: Arc<Vec<AtomicU64>>,
    /// `webhook-id`s seen on the instance paths since the last [`Receiver::reset_seen`], and
    /// how many arrived again.
    seen: Arc<Mutex<HashSet<String>>>,
    repeats: Arc<AtomicU64>,
    /// First arrival of each row on `/hook/timed`, by id.
    arrivals: Arc<Mutex<HashMap<i64, Instant>>>,
    stop: CancellationToken,
}

/// `/hook/a` ...: counted per instance, repeats (by `webhook-id`) noted; `/slow/a` ...: the
/// same, answering after SLOW_REPLY (a receiver with latency).
fn instance_routes(
    mut app: axum::Router,
    count: &Arc<AtomicU64>,
    per_instance: &Arc<Vec<AtomicU64>>,
    (seen, repeats): (&Arc<Mutex<HashSet<String>>>, &Arc<AtomicU64>),
) -> axum::Router {
    for (prefix, delay) in [("hook", Duration::ZERO), ("slow", SLOW_REPLY)] {
        for (i, path) in INSTANCE_PATHS.iter().enumerate() {
            let (counter, per_instance) = (count.clone(), per_instance.clone());
            let (seen, repeats) = (seen.clone(), repeats.clone());
            app = app.route(
                &format!("/{prefix}/{path}"),
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
                        let (counter, per_instance) = (counter.clone(), per_instance.clone());
                        let (seen, repeats) = (seen.clone(), repeats.clone());
                        async move {
                            if !delay.is_zero() {
                                // The slow receiver's reply delay.
                                tokio::time::sleep(delay).await;
                            }
                            counter.fetch_add(1, Ordering::Relaxed);
                            per_instance[i].fetch_add(1, Ordering::Relaxed);
                            let id = headers
                                .get("webhook-id")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let fresh = seen.lock().map(|mut s| s.insert(id)).unwrap_or(true);
                            if !fresh {
                                repeats.fetch_add(1, Ordering::Relaxed);
                            }
                            StatusCode::NO_CONTENT
                        }
                    },
                ),
            );
        }
    }
    app
}

impl Receiver {
    pub async fn start() -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        let mut app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |_body: axum::body::Bytes| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    StatusCode::NO_CONTENT
                }
            }),
        );
        let per_instance: Arc<Vec<AtomicU64>> =
            Arc::new(INSTANCE_PATHS.iter().map(|_| AtomicU64::new(0)).collect());
        let seen = Arc::new(Mutex::new(HashSet::new()));
        let repeats = Arc::new(AtomicU64::new(0));
        app = instance_routes(app, &count, &per_instance, (&seen, &repeats));
        // `/hook/timed`: notes when each row (by `webhook-id`) first arrived, for latency.
        let arrivals: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
        let noted = arrivals.clone();
        app = app.route(
            "/hook/timed",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
                    let noted = noted.clone();
                    async move {
                        let at = Instant::now();
                        let id = headers
                            .get("webhook-id")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<i64>().ok());
                        if let (Some(id), Ok(mut m)) = (id, noted.lock()) {
                            m.entry(id).or_insert(at);
                        }
                        StatusCode::NO_CONTENT
                    }
                },
            ),
        );
        // `GET /count`: the count, as an external receiver serves it (see `external`).
        let served = count.clone();
        app = app.route(
            "/count",
            axum::routing::get(move || {
                let served = served.clone();
                async move { served.load(Ordering::Relaxed).to_string() }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
            if let Err(e) = served {
                eprintln!("receiver stopped: {e}");
            }
        });
        Ok(Receiver {
            url: format!("http://{addr}/hook"),
            count,
            per_instance,
            seen,
            repeats,
            arrivals,
            stop,
        })
    }

    /// A receiver running elsewhere (another process) at `base` (`http://host:port`): rows
    /// go to `{base}/hook`, and the count is read from `GET {base}/count` every 2 ms. It
    /// counts nothing per instance and notes no arrivals (the claim and latency sections need
    /// [`Receiver::start`]).
    pub fn external(base: &str) -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (counter, stopped) = (count.clone(), stop.clone());
        let client = reqwest::Client::builder().no_proxy().build()?;
        let count_url = format!("{base}/count");
        tokio::spawn(async move {
            while !stopped.is_cancelled() {
                if let Ok(r) = client.get(&count_url).send().await
                    && let Ok(text) = r.text().await
                    && let Ok(n) = text.trim().parse::<u64>()
                {
                    counter.store(n, Ordering::Relaxed);
                }
                // The poller's period: the count it mirrors is at most 2 ms old.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Ok(Receiver {
            url: format!("{base}/hook"),
            count,
            per_instance: Arc::new(INSTANCE_PATHS.iter().map(|_| AtomicU64::new(0)).collect()),
            seen: Arc::new(Mutex::new(HashSet::new())),
            repeats: Arc::new(AtomicU64::new(0)),
            arrivals: Arc::new(Mutex::new(HashMap::new())),
            stop,
        })
    }

    /// The URL of instance `i` on a receiver answering after [`SLOW_REPLY`].
    pub fn slow_instance_url(&self, i: usize) -> String {
        format!(
            "{}/{}",
            self.url.replace("/hook", "/slow"),
            INSTANCE_PATHS[i]
        )
    }

    /// The URL whose requests are timed ([`Receiver::take_arrivals`]).
    pub fn timed_url(&self) -> String {
        format!("{}/timed", self.url)
    }

    /// When each row first arrived on [`Receiver::timed_url`], by id; and forgets them.
    pub fn take_arrivals(&self) -> HashMap<i64, Instant> {
        self.arrivals
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The sink URL of claim-section instance `i`.
    pub fn instance_url(&self, i: usize) -> String {
        format!("{}/{}", self.url, INSTANCE_PATHS[i])
    }

    pub fn instance_counts(&self) -> Vec<u64> {
        self.per_instance
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Forgets the ids seen (each run's table numbers its rows from 1) and returns the repeat
    /// counter's value, to subtract.
    pub fn reset_seen(&self) -> u64 {
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
        self.repeats.load(Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[tokio::test]
async fn counts_per_instance_and_notes_repeats() {
    let rx = Receiver::start().await.expect("receiver");
    outbox_relay::install_crypto_provider();
    let client = reqwest::Client::new();
    let post = |url: String, id: &'static str| {
        let client = client.clone();
        async move {
            let r = client
                .post(url)
                .header("webhook-id", id)
                .body("{}")
                .send()
                .await
                .expect("post");
            assert_eq!(r.status().as_u16(), 204);
        }
    };
    post(rx.url.clone(), "1").await;
    post(rx.instance_url(0), "1").await;
    post(rx.instance_url(2), "2").await;
    let slow = Instant::now();
    post(rx.slow_instance_url(1), "3").await;
    assert!(slow.elapsed() >= SLOW_REPLY, "the slow path answers late");
    post(rx.instance_url(2), "1").await;
    assert_eq!(rx.count(), 5);
    assert_eq!(rx.instance_counts(), vec![1, 1, 2]);
    assert_eq!(
        rx.reset_seen(),
        1,
        "id 1 arrived twice on the instance paths"
    );
    post(rx.instance_url(1), "1").await;
    assert_eq!(rx.reset_seen(), 1, "forgotten ids are fresh again");
    let before = Instant::now();
    post(rx.timed_url(), "7").await;
    post(rx.timed_url(), "7").await;
    let arrived = rx.take_arrivals();
    assert_eq!(arrived.len(), 1);
    assert!(arrived[&7] >= before, "the first arrival is kept");
    assert!(rx.take_arrivals().is_empty(), "taken");
    assert_eq!(INSTANCE_PATHS.len(), 3);
}

#[tokio::test]
async fn an_external_receiver_is_counted_from_its_count_endpoint() {
    let rx = Receiver::start().await.expect("receiver");
    outbox_relay::install_crypto_provider();
    let base = rx.url.trim_end_matches("/hook").to_string();
    let external = Receiver::external(&base).expect("external");
    assert_eq!(external.url, rx.url);
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client.post(&rx.url).body("{}").send().await.expect("post");
        assert_eq!(r.status().as_u16(), 204);
    }
    super::wait::holds_within(Duration::from_secs(5), async || external.count() == 3).await;
    assert_eq!(external.count(), 3, "read from GET /count");
}
