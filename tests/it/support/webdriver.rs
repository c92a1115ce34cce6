//! A small WebDriver client (W3C WebDriver: JSON over HTTP) driving a headless Chromium from
//! Debian's packages through `chromedriver`, for the console's browser test.
//!
//! [`Browser::start`] returns `None` (the test is skipped with a message) when `chromium` or
//! `chromedriver` is missing, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1`, which makes it fail:
//! CI installs both (`.ci/run`). The driver is killed and the browser's profile directory
//! removed when the [`Browser`] is dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::process::free_port;
use super::services_required;

/// The binaries of Debian's `chromium` and `chromium-driver` packages.
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session closes Chromium; killing the driver then ends anything left.
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    let c = reqwest::Client::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), c.delete(url).send()).await;
                });
            }
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a fresh profile.
    pub async fn start() -> Option<Browser> {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            if !Path::new(bin).exists() {
                if services_required() {
                    panic!(
                        "{bin} is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but missing: \
                         apt-get install chromium chromium-driver"
                    );
                }
                eprintln!("SKIPPED: {bin} missing (apt-get install chromium chromium-driver)");
                return None;
            }
        }
        outbox_relay::install_crypto_provider();
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        super::wait::until_or(
            Duration::from_secs(20),
            async || {
                let r = http.get(format!("{base}/status")).send().await;
                r.is_ok_and(|r| r.status().is_success())
            },
            || "chromedriver did not start within 20s".into(),
        )
        .await;
        let profile = tempfile::tempdir().expect("profile dir");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let mut b = Browser {
            driver,
            base,
            session: String::new(),
            http,
            _profile: profile,
        };
        let v = b.call("POST", "/session", Some(caps)).await;
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {v}"))
            .to_string();
        // Finding an element waits up to 5 s for it: a page may still be loading after a click.
        b.call("POST", "/timeouts", Some(json!({"implicit": 5000})))
            .await;
        Some(b)
    }

    /// One WebDriver command; returns its `value`, panicking on a WebDriver error.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("webdriver {path}: {e}"));
        let text = resp
            .text()
            .await
            .unwrap_or_else(|e| panic!("webdriver {path}: {e}"));
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("webdriver {path}: {e}: {text}"));
        if v["value"]["error"].is_string() {
            panic!("webdriver {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    pub async fn url(&self) -> String {
        self.call("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The page's HTML as the browser has it now.
    pub async fn source(&self) -> String {
        self.call("GET", "/source", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The element `css` selects; panics if there is none.
    pub async fn find(&self, css: &str) -> String {
        let v = self
            .call(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// Types `text` into the element `css` selects.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.call("POST", &format!("/element/{e}/clear"), Some(json!({})))
            .await;
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Clicks the element `css` selects.
    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.call("POST", &format!("/element/{e}/click"), Some(json!({})))
            .await;
    }

    /// The visible text of the element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let e = self.find(css).await;
        self.call("GET", &format!("/element/{e}/text"), None)
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The text of the open `confirm()` dialog, dismissed (Cancel).
    pub async fn dismiss_dialog(&self) -> String {
        let text = self.call("GET", "/alert/text", None).await;
        self.call("POST", "/alert/dismiss", Some(json!({}))).await;
        text.as_str().unwrap_or("").to_string()
    }

    /// Runs `script` in the page and returns its result.
    pub async fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Waits until `script` (a JavaScript expression) is true in the page; panics after 10 s.
    pub async fn wait_for(&self, what: &str, expr: &str) {
        let script = format!("return !!({expr});");
        super::wait::until_or(
            Duration::from_secs(10),
            async || self.script(&script).await == Value::Bool(true),
            || format!("timed out waiting for {what}"),
        )
        .await;
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let v = self.call("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or(""))
            .expect("screenshot is base64");
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Resizes the window (screenshots show what fits in it).
    pub async fn resize(&self, width: u32, height: u32) {
        self.call(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }
}
