//! [`Config`]: a relay configuration built in code and written as TOML, so every test starts
//! from one base and states only what it is about (instead of each suite carrying its own
//! TOML template with `relay_extra` strings spliced in).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::ms;

/// A relay configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[relay]` keys, as TOML values.
    relay: Vec<(&'static str, String)>,
    /// `[retry]` keys.
    retry: Vec<(&'static str, String)>,
    /// `[lease]` keys.
    lease: Vec<(&'static str, String)>,
    /// `[console]` keys (the section is written only when it has some).
    console: Vec<(&'static str, String)>,
    sinks: Vec<Sink>,
    /// Further sections, as TOML text (`[table]` for a mapped table).
    sections: Vec<String>,
}

/// One `[sinks.NAME]` table.
#[derive(Debug, Clone)]
pub struct Sink {
    name: String,
    keys: Vec<(String, String)>,
    headers: Vec<(String, String)>,
}

/// A TOML string literal.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Sets `key` in `keys` (replacing an earlier value).
fn set<K: PartialEq + Clone>(keys: &mut Vec<(K, String)>, key: K, value: String) {
    keys.retain(|(k, _)| *k != key);
    keys.push((key, value));
}

impl Config {
    /// The base every test starts from: a 50 ms poll, info logs, one webhook sink `hook` at
    /// `url` with a 5 s timeout.
    pub fn webhook(url: &str) -> Config {
        Config {
            relay: vec![("poll_interval", quoted("50ms"))],
            retry: Vec::new(),
            lease: Vec::new(),
            console: Vec::new(),
            sinks: vec![Sink::webhook("hook", url).timeout(Duration::from_secs(5))],
            sections: Vec::new(),
        }
    }

    /// Appends sections written as TOML (e.g. a `[table]` mapping).
    pub fn sections(mut self, toml: &str) -> Config {
        self.sections.push(toml.to_string());
        self
    }

    /// No sink at all (the relay's built-in `log` sink).
    pub fn no_sinks(mut self) -> Config {
        self.sinks.clear();
        self
    }

    /// `relay.mode = "claim"`.
    pub fn claim_mode(mut self) -> Config {
        set(&mut self.relay, "mode", quoted("claim"));
        self
    }

    pub fn poll_interval(mut self, d: Duration) -> Config {
        set(&mut self.relay, "poll_interval", quoted(&ms(d)));
        self
    }

    pub fn claim_ttl(mut self, d: Duration) -> Config {
        set(&mut self.relay, "claim_ttl", quoted(&ms(d)));
        self
    }

    pub fn shutdown_timeout(mut self, d: Duration) -> Config {
        set(&mut self.relay, "shutdown_timeout", quoted(&ms(d)));
        self
    }

    /// `batch_size` and `max_in_flight` together.
    pub fn in_flight(self, n: u32) -> Config {
        self.batch_size(n).max_in_flight(n)
    }

    pub fn batch_size(mut self, n: u32) -> Config {
        set(&mut self.relay, "batch_size", n.to_string());
        self
    }

    pub fn max_in_flight(mut self, n: u32) -> Config {
        set(&mut self.relay, "max_in_flight", n.to_string());
        self
    }

    /// `[retry]`: backoff from `initial` to `max`, at most `attempts` attempts.
    pub fn retry(mut self, initial: Duration, max: Duration, attempts: u32) -> Config {
        set(&mut self.retry, "initial_backoff", quoted(&ms(initial)));
        set(&mut self.retry, "max_backoff", quoted(&ms(max)));
        set(&mut self.retry, "max_attempts", attempts.to_string());
        self
    }

    /// `[lease]`: the Redis backend at `url`.
    pub fn redis_lease(mut self, url: &str, ttl: Duration, renew_timeout: Duration) -> Config {
        set(&mut self.lease, "backend", quoted("redis"));
        set(&mut self.lease, "redis_url", quoted(url));
        self.lease_timing(ttl, renew_timeout)
    }

    /// `[lease]`: the Redlock backend over `urls`.
    pub fn redlock_lease(
        mut self,
        urls: &[String],
        ttl: Duration,
        renew_timeout: Duration,
    ) -> Config {
        set(&mut self.lease, "backend", quoted("redlock"));
        let list: Vec<String> = urls.iter().map(|u| quoted(u)).collect();
        set(
            &mut self.lease,
            "redlock_urls",
            format!("[{}]", list.join(", ")),
        );
        self.lease_timing(ttl, renew_timeout)
    }

    /// `[console]` on a free loopback port (the relay logs the address) with `token`.
    pub fn console(mut self, token: &str) -> Config {
        set(&mut self.console, "listen", quoted("127.0.0.1:0"));
        set(&mut self.console, "token", quoted(token));
        self
    }

    /// One more `[console]` key, its value as TOML (`"true"`, `"\"x\""`).
    pub fn console_key(mut self, key: &'static str, toml_value: &str) -> Config {
        set(&mut self.console, key, toml_value.to_string());
        self
    }

    /// `[lease]`: `backend` (e.g. the Java-compatible `redisson`, `shedlock`,
    /// `mysql-get-lock`) with its timing; other keys with [`Config::lease_key`].
    pub fn lease_backend(
        mut self,
        backend: &str,
        ttl: Duration,
        renew_timeout: Duration,
    ) -> Config {
        set(&mut self.lease, "backend", quoted(backend));
        self.lease_timing(ttl, renew_timeout)
    }

    /// One `[lease]` key with a string value (e.g. `redis_url`, `shedlock_table`).
    pub fn lease_key(mut self, key: &'static str, value: &str) -> Config {
        set(&mut self.lease, key, quoted(value));
        self
    }

    /// `lease.ttl` and `lease.renew_timeout`.
    pub fn lease_timing(mut self, ttl: Duration, renew_timeout: Duration) -> Config {
        set(&mut self.lease, "ttl", quoted(&ms(ttl)));
        set(&mut self.lease, "renew_timeout", quoted(&ms(renew_timeout)));
        self
    }

    /// `lease.backend = "none"`.
    pub fn no_lease(mut self) -> Config {
        set(&mut self.lease, "backend", quoted("none"));
        self
    }

    /// `lease.name` (by default a test's relays use its table's name).
    pub fn lease_name(mut self, name: &str) -> Config {
        set(&mut self.lease, "name", quoted(name));
        self
    }

    /// The `lease.name` set, if any: the environment (which wins over the file) must carry it
    /// too, since a test's relays get their table's name as the lease name by default.
    pub fn lease_name_set(&self) -> Option<String> {
        self.lease
            .iter()
            .find(|(k, _)| *k == "name")
            .map(|(_, v)| v.trim_matches('"').to_string())
    }

    /// Changes sink `name` (which must exist).
    pub fn sink(mut self, name: &str, change: impl FnOnce(Sink) -> Sink) -> Config {
        let i = self
            .sinks
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("no sink {name} in this config"));
        let s = self.sinks.remove(i);
        self.sinks.insert(i, change(s));
        self
    }

    /// Changes the sink `hook`.
    pub fn hook(self, change: impl FnOnce(Sink) -> Sink) -> Config {
        self.sink("hook", change)
    }

    /// Adds a sink.
    pub fn with_sink(mut self, sink: Sink) -> Config {
        self.sinks.retain(|s| s.name != sink.name);
        self.sinks.push(sink);
        self
    }

    /// The configuration as TOML.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        let mut section = |name: &str, keys: &[(&str, String)]| {
            out.push_str(&format!("[{name}]\n"));
            for (k, v) in keys {
                out.push_str(&format!("{k} = {v}\n"));
            }
            out.push('\n');
        };
        section("relay", &self.relay);
        section("retry", &self.retry);
        section("lease", &self.lease);
        section("log", &[("level", quoted("info"))]);
        if !self.console.is_empty() {
            section("console", &self.console);
        }
        for s in &self.sinks {
            out.push_str(&format!("[sinks.{}]\n", s.name));
            for (k, v) in &s.keys {
                out.push_str(&format!("{k} = {v}\n"));
            }
            if !s.headers.is_empty() {
                let h: Vec<String> = s
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{} = {}", quoted(k), quoted(v)))
                    .collect();
                out.push_str(&format!("headers = {{ {} }}\n", h.join(", ")));
            }
            out.push('\n');
        }
        for extra in &self.sections {
            out.push_str(extra);
            out.push('\n');
        }
        out
    }

    /// Writes the configuration to `dir/name`; returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.toml()).expect("write config");
        path
    }
}

impl Sink {
    /// A webhook sink `name` posting to `url`.
    pub fn webhook(name: &str, url: &str) -> Sink {
        Sink {
            name: name.to_string(),
            keys: vec![
                ("kind".into(), quoted("webhook")),
                ("url".into(), quoted(url)),
            ],
            headers: Vec::new(),
        }
    }

    /// A sink of `kind` with no keys of its own (`log`).
    pub fn of_kind(name: &str, kind: &str) -> Sink {
        Sink {
            name: name.to_string(),
            keys: vec![("kind".into(), quoted(kind))],
            headers: Vec::new(),
        }
    }

    pub fn timeout(mut self, d: Duration) -> Sink {
        set(&mut self.keys, "timeout".into(), quoted(&ms(d)));
        self
    }

    pub fn concurrency(mut self, n: u32) -> Sink {
        set(&mut self.keys, "concurrency".into(), n.to_string());
        self
    }

    pub fn rate_per_sec(mut self, r: f64) -> Sink {
        set(&mut self.keys, "rate_per_sec".into(), format!("{r:?}"));
        self
    }

    /// The Standard Webhooks signing secret.
    pub fn secret(mut self, secret: &str) -> Sink {
        set(&mut self.keys, "secret".into(), quoted(secret));
        self
    }

    pub fn max_body_bytes(mut self, n: usize) -> Sink {
        set(&mut self.keys, "max_body_bytes".into(), n.to_string());
        self
    }

    /// A header sent with every request (`x-relay` tells instances apart).
    pub fn header(mut self, name: &str, value: &str) -> Sink {
        self.headers.retain(|(k, _)| k != name);
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

#[test]
fn the_builder_writes_a_configuration_the_relay_accepts() {
    let none = Config::webhook("http://127.0.0.1:1/hook").no_lease().toml();
    assert!(none.contains("backend = \"none\""), "{none}");
    let cfg = Config::webhook("http://127.0.0.1:1/hook")
        .claim_mode()
        .in_flight(8)
        .claim_ttl(Duration::from_secs(11))
        .retry(Duration::from_millis(200), Duration::from_secs(1), 20)
        .redlock_lease(
            &[
                "redis://127.0.0.1:1".into(),
                "redis://127.0.0.1:2".into(),
                "redis://127.0.0.1:3".into(),
            ],
            Duration::from_secs(1),
            Duration::from_millis(300),
        )
        .hook(|s| s.concurrency(4).header("x-relay", "a \"quoted\" \\ b"))
        .with_sink(Sink::of_kind("log", "log").timeout(Duration::from_secs(1)));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = cfg.write(dir.path(), "relay.toml");
    let s = outbox_relay::config::Settings::load_with_env(Some(&path), Some(Default::default()))
        .unwrap_or_else(|e| panic!("{e}\n{}", cfg.toml()));
    assert_eq!(s.relay.mode, outbox_relay::config::Mode::Claim);
    assert_eq!(s.relay.max_in_flight, 8);
    assert_eq!(s.lease.redlock_urls.len(), 3);
    assert_eq!(s.sinks["hook"].common.concurrency, 4);
    assert!(s.sinks.contains_key("log"));
    let specs = outbox_relay::sink::SinkSpec::all(&s).expect("sinks parse");
    assert_eq!(specs.len(), 2);
    match &specs.iter().find(|s| s.name == "hook").expect("hook").kind {
        outbox_relay::sink::SinkKind::Webhook(w) => assert_eq!(
            w.headers.get("x-relay").map(|v| v.expose()),
            Some("a \"quoted\" \\ b")
        ),
        other => panic!("not a webhook: {other:?}"),
    }
}
