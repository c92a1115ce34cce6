//! A webhook receiver for chaos runs: HTTP/1.1 over plain TCP on 127.0.0.1, so that it can do
//! what a framework will not: drop a connection without answering (a reset: `SO_LINGER` 0). It
//! records every request compactly (row id, sending instance, arrival, answer, whether it was
//! accepted) for the run's checks, and answers according to the current [`Storm`]:
//!
//! - `Calm`: 200 after a short while (`calm`; the request is *accepted* when it arrives: a real
//!   receiver acts, then answers, and a relay killed in between delivers it again);
//! - `ServerErrors`: 503; `TooMany`: 429 with `Retry-After: 1`;
//! - `Resets`: the connection is reset after the request was read, with no answer;
//! - `Slow`: 503 after longer than the relay's sink timeout (the relay has given up by then).
//!
//! Only `Calm` answers accept, so every storm is transient and every row must end SUCCESS; a
//! row accepted twice is a duplicate the run must account for. The sending instance is the
//! `x-relay` header.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How the receiver answers at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Storm {
    Calm,
    ServerErrors,
    TooMany,
    Resets,
    Slow,
}

impl Storm {
    const ALL: [Storm; 5] = [
        Storm::Calm,
        Storm::ServerErrors,
        Storm::TooMany,
        Storm::Resets,
        Storm::Slow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Storm::Calm => "calm",
            Storm::ServerErrors => "storm: 503s",
            Storm::TooMany => "storm: 429 + Retry-After",
            Storm::Resets => "storm: connection resets",
            Storm::Slow => "storm: slower than the timeout",
        }
    }
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Hit {
    /// `webhook-id` as a row id.
    pub id: Option<i64>,
    /// The `x-relay` header's index in the receiver's sender names (`u8::MAX`: unknown).
    pub sender: u8,
    pub at: Instant,
    /// When the answer was decided (for an accepted request: when it was accepted); `None`
    /// while the request is still held (a slow answer).
    pub answered: Option<Instant>,
    /// Answered 200 (the receiver acted on it).
    pub accepted: bool,
    pub storm: Storm,
}

struct Inner {
    senders: Vec<String>,
    storm: AtomicU8,
    slow: Duration,
    calm: Duration,
    hits: Mutex<Vec<Hit>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running receiver; stops accepting connections when dropped.
pub struct StormReceiver {
    pub addr: std::net::SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl StormReceiver {
    /// Starts a receiver that knows the instances `senders` (their `x-relay` values), answers
    /// `Calm` requests after `calm` and holds `Slow` answers back for `slow`.
    pub async fn start(senders: &[&str], calm: Duration, slow: Duration) -> StormReceiver {
        let inner = Arc::new(Inner {
            senders: senders.iter().map(|s| s.to_string()).collect(),
            storm: AtomicU8::new(0),
            slow,
            calm,
            hits: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind storm receiver");
        let addr = listener.local_addr().expect("receiver address");
        let shared = inner.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        StormReceiver { addr, inner, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn set_storm(&self, storm: Storm) {
        let i = Storm::ALL.iter().position(|s| *s == storm).expect("storm");
        self.inner.storm.store(i as u8, Ordering::SeqCst);
    }

    fn storm(&self) -> Storm {
        Storm::ALL[self.inner.storm.load(Ordering::SeqCst) as usize]
    }

    /// Every request so far, in arrival order.
    pub fn hits(&self) -> Vec<Hit> {
        lock(&self.inner.hits).clone()
    }

    /// How many requests have arrived.
    pub fn len(&self) -> usize {
        lock(&self.inner.hits).len()
    }

    /// The sender of the latest request that arrived after `since`, if any.
    pub fn latest_sender_since(&self, since: Instant) -> Option<u8> {
        lock(&self.inner.hits)
            .iter()
            .rev()
            .take_while(|h| h.at > since)
            .find(|h| h.sender != u8::MAX)
            .map(|h| h.sender)
    }

    /// Requests per storm (for the summary).
    pub fn by_storm(&self) -> HashMap<Storm, usize> {
        let mut out = HashMap::new();
        for h in lock(&self.inner.hits).iter() {
            *out.entry(h.storm).or_insert(0) += 1;
        }
        out
    }
}

impl Drop for StormReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The most a request head may take (the relay's are far smaller).
const MAX_HEAD: usize = 64 * 1024;
/// The most a body may take (the run's payloads are tiny).
const MAX_BODY: usize = 1024 * 1024;

/// Serves one connection: requests one after another (keep-alive) until the peer closes it,
/// a storm resets it, or it sends something that is not a small HTTP/1.1 request.
async fn serve(stream: TcpStream, inner: Arc<Inner>) {
    let _ = stream.set_nodelay(true);
    let mut conn = BufReader::new(stream);
    loop {
        let mut head = Vec::new();
        let mut content_length = 0usize;
        let mut id = None;
        let mut sender = u8::MAX;
        loop {
            let mut line = String::new();
            match conn.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            head.push(line.len());
            if head.iter().sum::<usize>() > MAX_HEAD {
                return;
            }
            if let Some((name, value)) = line.split_once(':') {
                let value = value.trim();
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => content_length = value.parse().unwrap_or(0),
                    "webhook-id" => id = value.parse::<i64>().ok(),
                    "x-relay" => {
                        sender = inner
                            .senders
                            .iter()
                            .position(|s| s == value)
                            .map_or(u8::MAX, |i| i as u8)
                    }
                    _ => {}
                }
            }
        }
        if content_length > MAX_BODY {
            return;
        }
        let mut body = vec![0u8; content_length];
        if conn.read_exact(&mut body).await.is_err() {
            return;
        }
        let at = Instant::now();
        let storm = Storm::ALL[inner.storm.load(Ordering::SeqCst) as usize];
        let index = {
            let mut hits = lock(&inner.hits);
            hits.push(Hit {
                id,
                sender,
                at,
                answered: None,
                accepted: false,
                storm,
            });
            hits.len() - 1
        };
        let answer = |accepted: bool| {
            let mut hits = lock(&inner.hits);
            hits[index].answered = Some(Instant::now());
            hits[index].accepted = accepted;
        };
        let reply: &[u8] = match storm {
            Storm::Calm => {
                // Accepted before the answer is written: a receiver acts, then answers.
                answer(true);
                tokio::time::sleep(inner.calm).await;
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
            }
            Storm::ServerErrors => {
                answer(false);
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
            }
            Storm::TooMany => {
                answer(false);
                b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n"
            }
            Storm::Resets => {
                answer(false);
                // SO_LINGER 0: the close sends RST, not FIN.
                let _ = conn.get_ref().set_zero_linger();
                return;
            }
            Storm::Slow => {
                tokio::time::sleep(inner.slow).await;
                answer(false);
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
            }
        };
        if conn.get_mut().write_all(reply).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn storms_answer_as_scripted_and_resets_drop_the_connection() {
    outbox_relay::install_crypto_provider();
    let rx = StormReceiver::start(&["a", "b"], Duration::ZERO, Duration::from_millis(300)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .expect("client");
    let post = |id: i64, who: &'static str| {
        client
            .post(rx.url())
            .header("webhook-id", id.to_string())
            .header("x-relay", who)
            .body(r#"{"n":1}"#)
            .send()
    };
    assert_eq!(post(1, "a").await.expect("calm").status().as_u16(), 200);
    rx.set_storm(Storm::ServerErrors);
    assert_eq!(post(2, "b").await.expect("5xx").status().as_u16(), 503);
    rx.set_storm(Storm::TooMany);
    let r = post(3, "a").await.expect("429");
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    rx.set_storm(Storm::Resets);
    assert!(post(4, "a").await.is_err(), "a reset is an error");
    rx.set_storm(Storm::Slow);
    assert!(
        post(5, "b").await.is_err(),
        "slower than the client's timeout"
    );
    rx.set_storm(Storm::Calm);
    assert_eq!(post(6, "zz").await.expect("calm").status().as_u16(), 200);
    assert_eq!(rx.storm(), Storm::Calm);
    let hits = rx.hits();
    let ids: Vec<_> = hits.iter().map(|h| h.id.expect("id")).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
    let accepted: Vec<_> = hits.iter().map(|h| h.accepted).collect();
    assert_eq!(accepted, [true, false, false, false, false, true]);
    let senders: Vec<_> = hits.iter().map(|h| h.sender).collect();
    assert_eq!(senders, [0, 1, 0, 0, 1, u8::MAX]);
    assert_eq!(rx.latest_sender_since(hits[3].at), Some(1));
    assert_eq!(rx.len(), 6);
    assert_eq!(rx.by_storm()[&Storm::Calm], 2);
}
