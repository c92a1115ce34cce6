//! What every HTTP sink shares: the client, transport-error text, `Retry-After`, and reading
//! a response body without letting a receiver decide how much memory the relay uses.
//!
//! Guarantees: a response body is read only up to the cap the caller gives (chunk by chunk;
//! the rest is never read), so a receiver answering with hundreds of megabytes costs the relay
//! at most that cap per request in flight; a body that never ends is cut by the request's
//! timeout. Snippets kept for reasons are one line, without control characters, cut at a
//! character boundary.

use std::time::Duration;

/// Most characters of a receiver's or vendor's text kept in a reason.
pub(crate) const SNIPPET_CHARS: usize = 200;

/// The HTTP client every HTTP sink uses, built once per sink: `timeout` bounds a whole request;
/// connecting gets at most half of it (5 s at most), so a request that never connected is told
/// apart from one that was sent and then timed out (an unknown outcome for paid sends);
/// redirects are not followed (a moved endpoint is a configuration to fix, not to chase).
pub(crate) fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    crate::install_crypto_provider();
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout((timeout / 2).min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
        .build()?)
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
