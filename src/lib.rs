//! outbox-relay: delivers the rows of a transactional-outbox table to webhooks, FCM and
//! Kakao Alimtalk, coordinating several instances through a fenced lease or row claims.
//!
//! The crate is split along the seams of the design (docs/design.md, which also defines the
//! guarantees G1-G7 that comments refer to):
//! - [`store`]: the outbox table and its claims ([`store::Queue`], [`store::LeaseTable`]);
//! - [`lease`]: who may claim in leader mode ([`lease::Lease`]) and the watchdog keeping it;
//! - [`sink`]: where a row goes ([`sink::Sink`]) and how each answer is classified;
//! - [`relay`]: the loop tying them together;
//! - [`config`], [`cli`], [`telemetry`]: how it is configured, driven and observed;
//! - [`console`]: the operator's web pages over the table, served by the relay itself.

pub mod cli;
pub mod config;
pub mod console;
#[doc(hidden)]
pub mod fuzzing;
pub mod housekeeping;
pub mod lease;
pub mod metric;
pub mod relay;
pub mod runtime;
pub mod shutdown;
pub mod sink;
pub mod store;
pub mod telemetry;

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future: what the object-safe traits at the seams return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fresh random token: 128 bits as 32 hex digits (claim batches, lease holders).
pub fn random_token() -> String {
    let a: u64 = rand::random();
    let b: u64 = rand::random();
    format!("{a:016x}{b:016x}")
}

/// Installs the process-wide rustls crypto provider (ring) that every TLS client here uses
/// (reqwest, fred). Idempotent; called by `main` and before any HTTP client is built, so the
/// library is safe to use on its own (tests, benchmarks).
pub fn install_crypto_provider() {
    // An error only means a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
