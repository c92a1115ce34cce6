//! OAuth2 access tokens from a service-account key (the JWT-bearer grant, RFC 7523): an RS256
//! JWT (`iss` = client_email, `scope` = firebase.messaging, `aud` = token_uri, `exp` = iat +
//! 1 h) POSTed as a form to the key's `token_uri`, exchanged for a bearer token.
//!
//! Guarantees:
//! - one token serves every send until shortly before it expires ([`refresh_margin`]); the
//!   refresh is single-flight: however many sends need a token at once, one request goes to the
//!   token endpoint, and while a token that is due for refresh is still valid, the other sends
//!   keep using it instead of waiting;
//! - a token FCM rejected (401) is replaced once, whatever the number of sends that saw it
//!   rejected ([`TokenSource::replace`] compares generations);
//! - token-endpoint answers are classified: 4xx (`invalid_grant`, `invalid_client`, ...) is a
//!   configuration error, 5xx, 429 and transport failures are transient;
//! - neither the private key, the JWT nor the access token appears in an error or a log line.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::config::ServiceAccountKey;
use super::jwt::RsaSigner;
use super::snippet;
use crate::config::Secret;
use crate::sink::Outcome;
use crate::sink::{describe_send_error, read_capped};

/// The OAuth2 scope FCM HTTP v1 needs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
/// The JWT-bearer grant type, form-encoded.
const GRANT_TYPE: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";
/// The longest lifetime Google grants an assertion (and the one we ask for).
const JWT_LIFETIME: u64 = 3600;
/// Refresh this long before expiry (or a quarter of the lifetime for short-lived tokens).
const REFRESH_EARLY: Duration = Duration::from_secs(300);
/// Stop using a token this long before expiry (or a tenth of its lifetime): clock skew and the
/// time a request spends in flight.
const EXPIRY_SKEW: Duration = Duration::from_secs(30);

/// A bearer token and when it must be replaced.
#[derive(Clone)]
pub struct AccessToken {
    /// The `Authorization: Bearer` value.
    pub value: Secret,
    /// Counts refreshes; tells a 401 on an old token from one on the current token.
    pub generation: u64,
    /// From here on a refresh is attempted (the token is still used if it fails).
    refresh_at: Instant,
    /// From here on the token is not used at all.
    expires_at: Instant,
}

/// Why no token could be had, already phrased as the delivery's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenError {
    /// The credentials or the token endpoint are wrong: a configuration error.
    Config(String),
    /// The token endpoint failed transiently: retry later.
    Transient(String),
}

impl TokenError {
    /// The delivery outcome this failure leads to.
    pub fn into_outcome(self) -> Outcome {
        match self {
            TokenError::Config(reason) => Outcome::ConfigError { reason },
            TokenError::Transient(reason) => Outcome::Retry {
                after: None,
                reason,
            },
        }
    }
}

/// The JWT claim set (RFC 7523 section 3).
#[derive(Serialize)]
struct Claims<'a> {
    /// The service account's email.
    iss: &'a str,
    /// The scopes asked for (space-separated).
    scope: &'a str,
    /// The token endpoint.
    aud: &'a str,
    /// Issued at, Unix seconds.
    iat: u64,
    /// Expires at: `iat` + 1 h.
    exp: u64,
}

/// The token endpoint's success body.
#[derive(Deserialize)]
struct TokenResponse {
    /// The bearer token.
    access_token: Option<String>,
    /// Seconds; Google sends 3599 or 3600.
    expires_in: Option<u64>,
}

/// The token endpoint's error body (RFC 6749 section 5.2).
#[derive(Deserialize)]
struct TokenErrorBody {
    /// `invalid_grant`, `invalid_client`, ...
    error: Option<String>,
    /// Google's explanation ("Invalid JWT Signature.").
    error_description: Option<String>,
}

/// Mints, caches and refreshes access tokens for one service account.
pub struct TokenSource {
    /// The sink's HTTP client (shared connection pool).
    client: reqwest::Client,
    /// The parsed private key.
    key: RsaSigner,
    /// JWT `iss`.
    client_email: String,
    /// JWT header `kid`.
    key_id: Option<String>,
    /// Token endpoint, also the JWT `aud`.
    token_uri: String,
    /// The current token, if any; read without waiting.
    current: Mutex<Option<AccessToken>>,
    /// Held by the one task fetching a token (single flight).
    refreshing: tokio::sync::Mutex<()>,
}

/// How long before expiry a token of `lifetime` is refreshed.
pub fn refresh_margin(lifetime: Duration) -> Duration {
    REFRESH_EARLY.min(lifetime / 4)
}

impl TokenSource {
    /// Parses the key (checked at config load, so failure here is unexpected).
    pub fn new(client: reqwest::Client, key: &ServiceAccountKey) -> anyhow::Result<Self> {
        let encoding = RsaSigner::from_pem(key.private_key.expose()).ok_or_else(|| {
            anyhow::anyhow!("the service-account private_key is not an RSA PEM key")
        })?;
        Ok(TokenSource {
            client,
            key: encoding,
            client_email: key.client_email.clone(),
            key_id: key.private_key_id.clone(),
            token_uri: key.token_uri.trim().to_string(),
            current: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<AccessToken> {
        match self.current.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn store(&self, token: AccessToken) {
        match self.current.lock() {
            Ok(mut g) => *g = Some(token),
            Err(p) => *p.into_inner() = Some(token),
        }
    }

    /// A token valid now: the cached one, or a fresh one fetched before `deadline`.
    pub async fn token(&self, deadline: Instant) -> Result<AccessToken, TokenError> {
        let now = Instant::now();
        let cached = self.current();
        if let Some(t) = &cached {
            if now < t.refresh_at {
                return Ok(t.clone());
            }
            if now < t.expires_at {
                // Due for refresh but still good: one task refreshes, the others go on with it.
                let Ok(_guard) = self.refreshing.try_lock() else {
                    return Ok(t.clone());
                };
                if let Some(t2) = self.current().filter(|c| c.generation != t.generation) {
                    return Ok(t2);
                }
                return match self.fetch(deadline, t.generation + 1).await {
                    Ok(fresh) => Ok(fresh),
                    Err(e) => {
                        tracing::warn!(error = ?e, "early token refresh failed; using the current token until it expires");
                        Ok(t.clone())
                    }
                };
            }
        }
        let _guard = self.refreshing.lock().await;
        let generation = cached.as_ref().map_or(0, |t| t.generation);
        if let Some(t) = self.current().filter(|c| Instant::now() < c.expires_at)
            && (cached.is_none() || t.generation != generation)
        {
            return Ok(t);
        }
        self.fetch(deadline, generation + 1).await
    }

    /// Replaces `rejected` (FCM answered 401 to it): at most one fetch however many sends saw
    /// the same token rejected; a send that arrives after the replacement gets it at once.
    pub async fn replace(
        &self,
        rejected: &AccessToken,
        deadline: Instant,
    ) -> Result<AccessToken, TokenError> {
        let _guard = self.refreshing.lock().await;
        if let Some(t) = self.current()
            && t.generation != rejected.generation
            && Instant::now() < t.expires_at
        {
            return Ok(t);
        }
        self.fetch(deadline, rejected.generation + 1).await
    }

    /// Signs a JWT and exchanges it; stores and returns the token. Caller holds `refreshing`.
    async fn fetch(&self, deadline: Instant, generation: u64) -> Result<AccessToken, TokenError> {
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = Claims {
            iss: &self.client_email,
            scope: SCOPE,
            aud: &self.token_uri,
            iat,
            exp: iat + JWT_LIFETIME,
        };
        let assertion = self
            .key
            .sign(self.key_id.as_deref(), &claims)
            .ok_or_else(|| TokenError::Config("cannot sign the OAuth2 assertion".into()))?;
        // Every character of a JWT (base64url and '.') is form-safe: no escaping needed.
        let body = format!("grant_type={GRANT_TYPE}&assertion={assertion}");
        let sent = Instant::now();
        let Some(budget) = deadline
            .checked_duration_since(sent)
            .filter(|d| !d.is_zero())
        else {
            return Err(TokenError::Transient(
                "no time left to fetch an OAuth2 token".into(),
            ));
        };
        let resp = self
            .client
            .post(&self.token_uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .timeout(budget)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                TokenError::Transient(format!("token endpoint: {}", describe_send_error(e)))
            })?;
        let status = resp.status().as_u16();
        // A token answer is a small JSON object; never read more than 64 KiB of it.
        let bytes = read_capped(resp, 64 * 1024)
            .await
            .map_err(|e| {
                TokenError::Transient(format!("token endpoint: {}", describe_send_error(e)))
            })?
            .bytes;
        if !(200..300).contains(&status) {
            let detail = serde_json::from_slice::<TokenErrorBody>(&bytes)
                .ok()
                .map(|b| {
                    let mut s = b.error.unwrap_or_default();
                    if let Some(d) = b.error_description {
                        s = format!("{s}: {d}");
                    }
                    snippet(&s)
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| snippet(&String::from_utf8_lossy(&bytes)));
            let reason = format!("token endpoint answered HTTP {status}: {detail}");
            return Err(match status {
                429 | 500..=599 | 408 => TokenError::Transient(reason),
                _ => TokenError::Config(reason),
            });
        }
        let parsed: TokenResponse = serde_json::from_slice(&bytes).map_err(|_| {
            TokenError::Config(
                "token endpoint answered 2xx without a JSON token (is the key's token_uri right?)"
                    .into(),
            )
        })?;
        let Some(value) = parsed.access_token.filter(|t| !t.is_empty()) else {
            return Err(TokenError::Config(
                "token endpoint answered 2xx without an access_token".into(),
            ));
        };
        let lifetime = Duration::from_secs(parsed.expires_in.unwrap_or(JWT_LIFETIME));
        let token = AccessToken {
            value: Secret::new(value),
            generation,
            refresh_at: sent + lifetime.saturating_sub(refresh_margin(lifetime)),
            expires_at: sent + lifetime.saturating_sub(EXPIRY_SKEW.min(lifetime / 10)),
        };
        tracing::debug!(
            generation,
            expires_in_s = lifetime.as_secs(),
            "fetched an FCM access token"
        );
        self.store(token.clone());
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_margin_is_five_minutes_or_a_quarter() {
        assert_eq!(
            refresh_margin(Duration::from_secs(3600)),
            Duration::from_secs(300)
        );
        assert_eq!(
            refresh_margin(Duration::from_secs(4)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn token_errors_map_to_outcomes() {
        assert!(matches!(
            TokenError::Config("x".into()).into_outcome(),
            Outcome::ConfigError { .. }
        ));
        assert!(matches!(
            TokenError::Transient("x".into()).into_outcome(),
            Outcome::Retry { after: None, .. }
        ));
    }
}
