//! The `fcm` sink against loopback fakes of FCM HTTP v1 and Google's OAuth2 token endpoint.
//!
//! The fake token endpoint verifies every assertion as Google would: the form's grant type,
//! the RS256 signature (checked by the `openssl` CLI against the public half of a key made for
//! this run, so the relay's signer cannot vouch for itself) and the claims (`iss`, `scope`,
//! `aud` = token_uri, `exp` = `iat` + 3600). Sinks are built from TOML through the public
//! configuration API; the last test runs the relay binary.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::vendors::*;
use crate::support::wait::*;
use outbox_relay::sink::{Outcome, SinkHandle};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

mod errors;
mod relay;
mod tokens;

const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const EMAIL: &str = "relay@demo.iam.gserviceaccount.com";
const SEND_PATH: &str = "/v1/projects/demo/messages:send";
/// Part of every access token the fake issues: looked for in the relay's log.
const TOKEN_MARK: &str = "SECRET-ACCESS-TOKEN-7f3a9c";

/// What the fake token endpoint knows and has done.
struct TokenState {
    /// The key assertions must verify with.
    public_pem: String,
    /// The expected `aud`.
    token_uri: String,
    /// `expires_in` of the tokens it issues.
    expires_in: AtomicUsize,
    /// Tokens issued so far.
    issued: AtomicUsize,
    /// Assertions refused, with why.
    refused: Mutex<Vec<String>>,
    /// When set, every request gets this answer instead.
    forced: Mutex<Option<ResponseTemplate>>,
}

impl TokenState {
    fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }

    fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }

    fn answer(&self, req: &Request) -> ResponseTemplate {
        if let Some(r) = self.forced.lock().unwrap().clone() {
            return r;
        }
        match self.check(req) {
            Ok(()) => {
                let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
                ResponseTemplate::new(200).set_body_json(json!({
                    "access_token": token(n),
                    "expires_in": self.expires_in.load(Ordering::SeqCst),
                    "token_type": "Bearer",
                }))
            }
            Err(why) => {
                self.refused.lock().unwrap().push(why.clone());
                ResponseTemplate::new(400)
                    .set_body_json(json!({"error": "invalid_grant", "error_description": why}))
            }
        }
    }

    /// Google's checks of a JWT-bearer token request.
    fn check(&self, req: &Request) -> Result<(), String> {
        let ct = req
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct != "application/x-www-form-urlencoded" {
            return Err(format!("content-type {ct}"));
        }
        let body = String::from_utf8_lossy(&req.body).into_owned();
        let form: Vec<(&str, &str)> = body.split('&').filter_map(|p| p.split_once('=')).collect();
        let field = |k: &str| form.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let grant = field("grant_type").unwrap_or("").replace("%3A", ":");
        if grant != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
            return Err(format!("grant_type {grant}"));
        }
        let jwt = field("assertion").ok_or("no assertion")?;
        let (header, claims) = verify_rs256(jwt, &self.public_pem)?;
        let expect = |what: &str, got: &Value, want: Value| {
            if *got == want {
                Ok(())
            } else {
                Err(format!("{what} is {got}, expected {want}"))
            }
        };
        expect("alg", &header["alg"], json!("RS256"))?;
        expect("typ", &header["typ"], json!("JWT"))?;
        expect("kid", &header["kid"], json!("kid-1"))?;
        expect("iss", &claims["iss"], json!(EMAIL))?;
        expect("scope", &claims["scope"], json!(SCOPE))?;
        expect("aud", &claims["aud"], json!(self.token_uri))?;
        let iat = claims["iat"].as_u64().ok_or("no iat")?;
        let exp = claims["exp"].as_u64().ok_or("no exp")?;
        if exp != iat + 3600 {
            return Err(format!("exp - iat = {}", exp as i64 - iat as i64));
        }
        if iat.abs_diff(unix_now()) > 60 {
            return Err(format!("iat {iat} is not now"));
        }
        Ok(())
    }
}

/// The n-th access token the fake issues.
fn token(n: usize) -> String {
    format!("ya29.{TOKEN_MARK}-{n}")
}

/// Which token (by number) a request carried, 0 if none of the fake's.
fn token_number(seen: &Seen) -> usize {
    seen.header("authorization")
        .and_then(|a| a.strip_prefix(&format!("Bearer ya29.{TOKEN_MARK}-")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How the fake FCM answers: given the request and its number (1-based).
type Script = Arc<dyn Fn(&Seen, usize) -> ResponseTemplate + Send + Sync>;

/// A loopback FCM with its token endpoint.
struct Fake {
    server: MockServer,
    tokens: Arc<TokenState>,
    fcm: Log,
}

impl Fake {
    async fn start(script: Script) -> Fake {
        let server = MockServer::start().await;
        let tokens = Arc::new(TokenState {
            public_pem: service_key().public_pem.clone(),
            token_uri: format!("{}/token", server.uri()),
            expires_in: AtomicUsize::new(3600),
            issued: AtomicUsize::new(0),
            refused: Mutex::new(Vec::new()),
            forced: Mutex::new(None),
        });
        let t = tokens.clone();
        Mock::given(method("POST"))
            .and(path("/token"))
            .respond_with(move |req: &Request| t.answer(req))
            .mount(&server)
            .await;
        let fcm = Log::default();
        let log = fcm.clone();
        Mock::given(method("POST"))
            .and(path(SEND_PATH))
            .respond_with(move |req: &Request| {
                let seen = Seen::from(req);
                let n = log.push(seen.clone());
                script(&seen, n)
            })
            .mount(&server)
            .await;
        Fake {
            server,
            tokens,
            fcm,
        }
    }

    /// The service-account key file's JSON, signing with `key`.
    fn credentials(&self, key: &KeyPair) -> String {
        json!({
            "type": "service_account",
            "project_id": "demo",
            "private_key_id": "kid-1",
            "private_key": key.private_pem,
            "client_email": EMAIL,
            "client_id": "1",
            "token_uri": self.tokens.token_uri,
        })
        .to_string()
    }

    /// A config with the sink `push` pointing at this fake; `extra` goes into the sink table.
    fn toml(&self, key: &KeyPair, endpoint: &str, extra: &str) -> String {
        format!(
            "[lease]\nbackend = \"none\"\n\n[sinks.push]\nkind = \"fcm\"\n\
             credentials_json = '''{}'''\nendpoint = \"{endpoint}\"\ntimeout = \"2s\"\n{extra}\n",
            self.credentials(key)
        )
    }

    fn sink(&self, extra: &str) -> Arc<SinkHandle> {
        sink_from_toml(&self.toml(service_key(), &self.server.uri(), extra), "push")
    }
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"name": "projects/demo/messages/0:1"}))
}

fn fcm_error(status: u16, canonical: &str, code: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({"error": {
        "code": status, "message": format!("{code} happened"), "status": canonical,
        "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]
    }}))
}

async fn deliver(sink: &SinkHandle, recipient: &str, payload: &str) -> Outcome {
    sink.sink
        .deliver(&delivery(1, Some(recipient), payload, 0))
        .await
}

const NOTE: &str =
    r##"{"notification":{"title":"Order shipped","body":"#1234"},"data":{"order":"1234"}}"##;
