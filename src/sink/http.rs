//! What every HTTP sink shares: the client, transport-error text, `Retry-After`, and reading
//! a response body without letting a receiver decide how much memory the relay uses.
//!
//! Guarantees: a response body is read only up to the cap the caller gives (chunk by chunk;
//! the rest is never read), so a receiver answering with hundreds of megabytes costs the relay
//! at most that cap per request in flight; a body that never ends is cut by the request's
//! timeout. Snippets kept for reasons are one line, without control characters, cut at a
//! character boundary.

use std::time::{Duration, SystemTime};

/// Most characters of a receiver's or vendor's text kept in a reason.
pub(crate) const SNIPPET_CHARS: usize = 200;

/// Most bytes of a vendor's answer read (FCM, NHN Cloud, Solapi): their answers are JSON of a
/// few hundred bytes; a longer one is cut and kept only as a snippet.
pub(crate) const ANSWER_BYTES: usize = 64 * 1024;

/// The longest `Retry-After` honoured; a larger value is clamped to it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The HTTP client every HTTP sink uses, built once per sink: `timeout` bounds a whole request;
/// connecting gets at most half of it (5 s at most), so a request that never connected is told
/// apart from one that was sent and then timed out (an unknown outcome for paid sends);
/// redirects are not followed (a moved endpoint is a configuration to fix, not to chase).
pub(crate) fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(client_builder(timeout).build()?)
}

/// [`http_client`] for one endpoint. Over cleartext `http://` every request is HTTP/1.1 (no
/// ALPN to offer HTTP/2), where reqwest's own retries, of requests an HTTP/2 server refused
/// unprocessed, never apply; its retry layer still copies each request's headers before
/// sending, in case. So such a client has none: 0.93x the relay's CPU a row and 1.08x the
/// rows/s draining into a loopback webhook on SQLite, PostgreSQL within the spread
/// (docs/performance-log.md, "reqwest's retry layer"). Over `https://` the layer stays.
pub(crate) fn http_client_for(
    url: &reqwest::Url,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    let builder = client_builder(timeout);
    let builder = match url.scheme() {
        "http" => builder.retry(reqwest::retry::never().max_retries_per_request(0)),
        _ => builder,
    };
    Ok(builder.build()?)
}

fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    crate::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout((timeout / 2).min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
}

/// A response's `Retry-After` header as text (parsed by each sink's classifier).
pub(crate) fn retry_after_header(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A transport error on one line, without the URL (a URL may carry an app key or a token):
/// "timed out: ...", "connection failed: ...", "request failed: ...".
pub(crate) fn describe_send_error(e: reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "request failed"
    };
    let e = e.without_url();
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A response as far as it was read: status, `Retry-After`, and the body up to a cap.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// The raw `Retry-After` header.
    pub retry_after: Option<String>,
    /// The body; a body longer than the cap is replaced by a note and its snippet.
    pub body: Vec<u8>,
}

/// Reads a response into a [`Reply`], at most `cap` bytes of its body. On a transport error
/// while reading the body, the status (which did arrive) comes back with the error.
pub(crate) async fn read_reply(
    resp: reqwest::Response,
    cap: usize,
) -> Result<Reply, (u16, reqwest::Error)> {
    let status = resp.status().as_u16();
    let retry_after = retry_after_header(&resp);
    let body = read_capped(resp, cap).await.map_err(|e| (status, e))?;
    let body = if body.truncated {
        format!(
            "(an answer of more than {cap} bytes, not read whole) {}",
            snippet(&String::from_utf8_lossy(&body.bytes))
        )
        .into_bytes()
    } else {
        body.bytes
    };
    Ok(Reply {
        status,
        retry_after,
        body,
    })
}

/// `Retry-After` as delta-seconds (`120`) or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`,
/// and the obsolete forms RFC 9110 asks recipients to accept), clamped to
/// [`MAX_RETRY_AFTER`]. A date in the past gives zero.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let d = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// A response body as far as it was read.
pub(crate) struct Body {
    /// At most the cap's worth of bytes.
    pub bytes: Vec<u8>,
    /// The body went on past the cap (the rest was not read).
    pub truncated: bool,
}

/// Reads at most `cap` bytes of `resp`'s body, chunk by chunk.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Body, reqwest::Error> {
    let mut bytes = Vec::with_capacity(cap.min(8 * 1024));
    while let Some(chunk) = resp.chunk().await? {
        let room = cap - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Body {
                bytes,
                truncated: true,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body {
        bytes,
        truncated: false,
    })
}

/// The start of a receiver's or vendor's text, on one line: trimmed, control characters
/// (NUL included) as spaces, at most [`SNIPPET_CHARS`] characters.
pub(crate) fn snippet(text: &str) -> String {
    let line: String = text
        .trim()
        .chars()
        .take(SNIPPET_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    line.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_every_form() {
        use std::time::UNIX_EPOCH;
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        let s = Duration::from_secs;
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(s(30))
        );
        // RFC 850 and asctime forms.
        assert_eq!(
            parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", now),
            Some(s(60))
        );
        assert_eq!(
            parse_retry_after("Wed Oct 21 07:28:05 2015", now),
            Some(s(5))
        );
        assert_eq!(parse_retry_after(" 120 ", now), Some(s(120)));
        assert_eq!(parse_retry_after("999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("Tue, 20 Oct 2015 07:28:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(
            parse_retry_after("Wed, 32 Oct 2015 07:28:00 GMT", now),
            None
        );
    }

    #[test]
    fn snippets_are_one_clean_line() {
        assert_eq!(snippet("  a\u{0}b\nc\u{1b}  "), "a b c");
        assert_eq!(snippet(&"한".repeat(500)).chars().count(), SNIPPET_CHARS);
    }

    #[tokio::test]
    async fn bodies_are_read_up_to_the_cap_only() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // A server that streams a chunked body that never ends.
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("{:x}\r\n{}\r\n", 1024, "x".repeat(1024));
            while s.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let client = http_client(Duration::from_secs(5)).expect("client");
        let resp = client
            .get(format!("http://{addr}/"))
            .send()
            .await
            .expect("response");
        let body = read_capped(resp, 10_000).await.expect("body");
        assert_eq!(body.bytes.len(), 10_000);
        assert!(body.truncated);
    }
}
