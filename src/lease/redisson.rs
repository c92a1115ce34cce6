//! The `redisson` lease: the very Redis hash a Redisson `RLock` named `lease.name` uses, so a
//! Spring poller guarded by `redissonClient.getLock(name)` and the relay exclude each other
//! while both run, and either takes over from the other when it lets go.
//!
//! The format and scripts are Redisson's own (checked against redisson/redisson,
//! `RedissonLock.tryLockInnerAsync`, `RedissonBaseLock.renewExpirationAsync` and
//! `RedissonLock.unlockInnerAsync`, Redisson 3.x: `RedissonLock.java` at commit 4339c99
//! (copyright 2013-2019) and `RedissonBaseLock.java` at 00d758e (copyright 2013-2022); newer
//! versions fold tryLock's two branches into one `exists == 0 or hexists == 1` test, as here;
//! the hash layout, channel and unlock message are the same in all of them):
//! - the key `<name>` is a hash with one field `<uuid>:<threadId>` holding the re-entry count;
//!   the relay uses a fresh UUID per acquisition and the thread id `1`, so its count is 1;
//! - acquire (tryLock): if the key is absent or holds our field, `HINCRBY field 1` and
//!   `PEXPIRE ttl`, reply nil; otherwise reply the key's `PTTL`;
//! - renew (the watchdog's renewExpiration): `PEXPIRE` only while `HEXISTS field`, 1 or 0;
//!   it never re-creates a key that expired or that someone else holds;
//! - release (unlock): only if our field exists; decrement it, and at 0 `DEL` the key and
//!   `PUBLISH redisson_lock__channel:{<name>} 0` (`LockPubSub.UNLOCK_MESSAGE = 0L`), which
//!   wakes Redisson's waiting threads at once. A hold that is not ours is never touched.
//!   (Redisson 3.2x also sets an "unlock latch" key to make its own retried unlocks
//!   idempotent; the relay sends every command once, so it needs none, and the latch is no
//!   part of the lock's state.)
//! - standbys subscribe to that channel and try at once on a message (a Java holder's unlock),
//!   and otherwise when the key's `PTTL` runs out (an expiry publishes nothing).
//!
//! Redisson's own lease time is its `lockWatchdogTimeout` (30 s by default); the relay's is
//! `lease.ttl`, renewed every ttl/3 by the keeper like every backend, and every acquisition
//! also bumps the fencing epoch in `outbox_relay_lease` (a Java poller knows nothing of it, so
//! fencing protects against other relays, and the lock itself against the poller).

use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::redis::{Connections, next_reconnection, wait_for_turn};
use super::{Grant, Lease, Tenure};
use crate::BoxFuture;

/// Redisson's tryLock script (`tryLockInnerAsync`): KEYS[1] = name, ARGV[1] = lease ms,
/// ARGV[2] = the field. nil when taken, else the key's PTTL.
const TRY_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) \
    or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return nil; \
    end; \
    return redis.call('pttl', KEYS[1]);";

/// Redisson's watchdog renewal (`renewExpirationAsync`): ARGV[1] = lease ms, ARGV[2] = field.
const RENEW: &str = "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return 1; \
    end; \
    return 0;";

/// Redisson's unlock (`unlockInnerAsync`): KEYS[2] = the channel, ARGV[1] = the unlock
/// message, ARGV[2] = lease ms, ARGV[3] = field. nil when not ours, 0 still held (re-entered),
/// 1 released and published.
const UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
    return nil; \
    end; \
    local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
    if (counter > 0) then \
    redis.call('pexpire', KEYS[1], ARGV[2]); \
    return 0; \
    else \
    redis.call('del', KEYS[1]); \
    redis.call('publish', KEYS[2], ARGV[1]); \
    return 1; \
    end; \
    return nil;";

/// `LockPubSub.UNLOCK_MESSAGE`.
pub const UNLOCK_MESSAGE: &str = "0";

/// The thread id of every relay hold: Redisson ties a hold to `<client uuid>:<thread id>`;
/// the relay has one holder per process and a fresh UUID per acquisition.
const THREAD_ID: u64 = 1;

/// Redisson's channel for lock `name` (`prefixName("redisson_lock__channel", name)`): the name
/// in braces, unless it already holds a brace (then it is its own hash tag).
pub fn channel_name(name: &str) -> String {
    if name.contains('{') {
        format!("redisson_lock__channel:{name}")
    } else {
        format!("redisson_lock__channel:{{{name}}}")
    }
}

/// A random (version 4) UUID in its usual text form, as Redisson's client ids are.
fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A Redisson-compatible lock on one Redis server.
pub struct RedissonLease {
    conns: Connections,
    /// `redisson_lock__channel:{<name>}`.
    channel: String,
    /// The lock name (the hash's key), the ttl, and our hash field (`<uuid>:1`) while we
    /// believe we hold the lock.
    tenure: Tenure,
    try_lock: Script,
    renew: Script,
    unlock: Script,
}

impl RedissonLease {
    /// Connects to `url` (`lease.redis_url`) in the background, as `Connections::open`
    /// does, subscribed to the lock's channel: a Redis that is down at start is retried, and
    /// the keeper simply fails to acquire until it is back.
    pub fn connect(
        url: &str,
        tenure: Tenure,
        command_timeout: Duration,
    ) -> anyhow::Result<RedissonLease> {
        let channel = channel_name(tenure.name());
        let timeouts = (command_timeout, command_timeout);
        let conns = Connections::open(url, "lease.redis_url", timeouts, &channel)?;
        Ok(RedissonLease {
            conns,
            channel,
            tenure,
            try_lock: Script::from_lua(TRY_LOCK),
            renew: Script::from_lua(RENEW),
            unlock: Script::from_lua(UNLOCK),
        })
    }

    /// The hash's key: the lock name.
    fn key(&self) -> &str {
        self.tenure.name()
    }

    fn ttl_ms(&self) -> String {
        self.ttl().as_millis().to_string()
    }
}

impl Lease for RedissonLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// `<instance_id>#<field>`: the Redis field is what a Java operator sees in the hash.
    fn holder(&self) -> String {
        let id = self.tenure.instance_id();
        match self.tenure.hold() {
            Some(hold) => format!("{id}#{}", hold.token),
            None => id.to_string(),
        }
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        // A fresh field per attempt: a retried acquire can never count twice.
        let field = format!("{}:{THREAD_ID}", uuid());
        Box::pin(self.tenure.acquire_as(field, move |field| async move {
            let pttl: Option<i64> = self
                .try_lock
                .evalsha_with_reload(
                    &self.conns.client,
                    vec![self.key()],
                    vec![self.ttl_ms(), field],
                )
                .await?;
            // nil: taken; otherwise the holder's PTTL.
            Ok(pttl.is_none())
        }))
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(self.tenure.renew(move |hold| async move {
            let n: i64 = self
                .renew
                .evalsha_with_reload(
                    &self.conns.client,
                    vec![self.key()],
                    vec![self.ttl_ms(), hold.token],
                )
                .await?;
            Ok(n == 1)
        }))
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.tenure.release(move |hold| async move {
            let r: Option<i64> = self
                .unlock
                .evalsha_with_reload(
                    &self.conns.client,
                    vec![self.key(), self.channel.as_str()],
                    vec![UNLOCK_MESSAGE.to_string(), self.ttl_ms(), hold.token],
                )
                .await?;
            if r.is_none() {
                tracing::info!(lease = %self.key(), "lock was no longer ours at release (expired); left as it is");
            }
            Ok(())
        }))
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        // Any message on the lock's channel means "try now": Redisson publishes the unlock
        // message (0) when a holder lets go.
        let rx = self.conns.subscriber.message_rx();
        Box::pin(wait_for_turn(
            rx,
            async move { Ok(self.conns.client.pttl::<i64, _>(self.key()).await?) },
            &self.channel,
            max,
        ))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let _: String = self.conns.client.ping(None).await?;
            Ok(())
        })
    }

    fn reconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(next_reconnection(&self.conns.reconnections))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_and_field_follow_redisson() {
        assert_eq!(channel_name("outbox"), "redisson_lock__channel:{outbox}");
        assert_eq!(channel_name("a{b}"), "redisson_lock__channel:a{b}");
        let u = uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
        assert_eq!(&u[14..15], "4");
        assert_ne!(uuid(), u);
    }
}
