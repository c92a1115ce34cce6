//! The `redis` lease: one Redis key holding a random holder token, Redisson-style but fenced.
//!
//! - acquire: `SET key token NX PX ttl` (a plain string, so a Redlock client in another
//!   language that locks the same key excludes the relay, and the relay excludes it);
//! - renew (the keeper's watchdog, every ttl/3): a compare-and-`PEXPIRE` script, so a renewal
//!   never re-creates a key that expired or belongs to someone else;
//! - release: a compare-and-`DEL` script that also `PUBLISH`es `<key>:released`, after the
//!   keeper has stopped the watchdog;
//! - standbys wait on that channel (re-subscribed after reconnects) and otherwise retry when the
//!   key's `PTTL` runs out.
//!
//! Every command is bounded by `lease.renew_timeout` and sent at most once: fred's default of
//! re-sending a command after a reconnect could apply a lease operation twice, so it is off.

use std::sync::Mutex;
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::time::Instant;

use super::{Grant, Lease};
use crate::BoxFuture;

/// Extends the key only if it still holds our token. Returns 1 or 0.
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// Deletes the key only if it still holds our token, and tells standbys. Returns 1 or 0.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('DEL', KEYS[1]); redis.call('PUBLISH', KEYS[1] .. ':released', ARGV[1]); \
    return 1 else return 0 end";

/// A lease on one Redis server.
pub struct RedisLease {
    client: Client,
    subscriber: SubscriberClient,
    /// The Redis key (the lease name).
    key: String,
    /// `<key>:released`, published on release.
    channel: String,
    instance_id: String,
    ttl: Duration,
    renew: Script,
    release: Script,
    /// Our holder token while we believe we hold the key.
    held: Mutex<Option<String>>,
}

impl RedisLease {
    /// Builds the clients and starts connecting in the background (a Redis that is down at
    /// start is retried; the keeper simply fails to acquire until it is back).
    pub fn connect(
        url: &str,
        name: &str,
        instance_id: &str,
        ttl: Duration,
        command_timeout: Duration,
    ) -> anyhow::Result<RedisLease> {
        let config = Config::from_url(url).map_err(|e| anyhow::anyhow!("lease.redis_url: {e}"))?;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = command_timeout;
                c.internal_command_timeout = command_timeout;
                // Never re-send a lease command on reconnect: it may already have run.
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| p.default_command_timeout = command_timeout)
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2));
        let client = builder.build()?;
        let subscriber = builder.build_subscriber_client()?;
        client.on_error(|(e, server)| async move {
            tracing::warn!(server = ?server, error = %e, "redis connection error");
            Ok(())
        });
        client.connect();
        subscriber.connect();
        let _resubscribe = subscriber.manage_subscriptions();
        let channel = format!("{name}:released");
        let sub = subscriber.clone();
        let ch = channel.clone();
        tokio::spawn(async move {
            // Subscribe once connected; manage_subscriptions re-subscribes after reconnects.
            loop {
                match sub.subscribe(ch.as_str()).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "subscribing to the release channel failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(RedisLease {
            client,
            subscriber,
            key: name.to_string(),
            channel,
            instance_id: instance_id.to_string(),
            ttl,
            renew: Script::from_lua(RENEW),
            release: Script::from_lua(RELEASE),
            held: Mutex::new(None),
        })
    }

    fn held(&self) -> Option<String> {
        match self.held.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_held(&self, v: Option<String>) {
        match self.held.lock() {
            Ok(mut g) => *g = v,
            Err(p) => *p.into_inner() = v,
        }
    }
}

impl Lease for RedisLease {
    fn name(&self) -> &str {
        &self.key
    }

    fn holder(&self) -> String {
        self.held().unwrap_or_else(|| self.instance_id.clone())
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            let token = format!("{}#{}", self.instance_id, crate::random_token());
            let sent_at = Instant::now();
            let reply: Option<String> = self
                .client
                .set(
                    self.key.as_str(),
                    token.as_str(),
                    Some(Expiration::PX(self.ttl.as_millis() as i64)),
                    Some(SetOptions::NX),
                    false,
                )
                .await?;
            if reply.is_some() {
                self.set_held(Some(token));
                Ok(Some(Grant {
                    epoch: None,
                    sent_at,
                }))
            } else {
                Ok(None)
            }
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            let Some(token) = self.held() else {
                return Ok(false);
            };
            let n: i64 = self
                .renew
                .evalsha_with_reload(
                    &self.client,
                    vec![self.key.as_str()],
                    vec![token, self.ttl.as_millis().to_string()],
                )
                .await?;
            if n != 1 {
                self.set_held(None);
            }
            Ok(n == 1)
        })
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if let Some(token) = self.held() {
                self.set_held(None);
                let _: i64 = self
                    .release
                    .evalsha_with_reload(&self.client, vec![self.key.as_str()], vec![token])
                    .await?;
            }
            Ok(())
        })
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // Listen first, then look: a release between the two is still seen.
            let mut rx = self.subscriber.message_rx();
            let pttl: i64 = match self.client.pttl(self.key.as_str()).await {
                Ok(ms) => ms,
                Err(e) => {
                    tracing::debug!(error = %e, "PTTL failed");
                    tokio::time::sleep(max.min(Duration::from_millis(500))).await;
                    return;
                }
            };
            let wait = match pttl {
                -2 => return, // no key: try at once
                -1 => max,    // a key without expiry (a foreign client): poll
                ms => Duration::from_millis(ms.max(0) as u64 + 1).min(max),
            };
            let until = Instant::now() + wait;
            loop {
                tokio::select! {
                    m = rx.recv() => match m {
                        Ok(m) if *m.channel == *self.channel => return,
                        Ok(_) => {}
                        Err(_) => return,
                    },
                    _ = tokio::time::sleep_until(until) => return,
                }
            }
        })
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let _: String = self.client.ping(None).await?;
            Ok(())
        })
    }
}
