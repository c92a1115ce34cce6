//! The integration suite: one test binary (it links once) over one toolkit, [`support`],
//! which the benchmark shares. Every test talks to real services: PostgreSQL, MariaDB/MySQL,
//! SQLite, Redis (servers of its own where it kills or pauses them), HTTP receivers on
//! loopback, and the relay binary as a process.
//!
//! Modules by subject: the store and its SQL ([`store`], [`timezones`], [`pool`]), leases ([`lease`],
//! [`redis_lease`], [`redlock_lease`], the Java pollers' locks [`java_locks`]), delivery end to end ([`delivery`], [`claim_mode`],
//! [`bad_input`], [`memory`], [`idle`]), the vendors ([`fcm`], [`alimtalk`], [`nats`]), and operating it
//! ([`config`], [`admin`], [`http`], [`console`], which also drives a real browser), and
//! tracing: spans exported to a loopback OTLP collector ([`tracing`]).

#[macro_use]
mod support;

mod admin;
mod adopt;
mod alimtalk;
mod bad_input;
mod chaos;
mod claim_mode;
mod claim_rule;
mod config;
mod console;
mod delivery;
mod fcm;
mod fuzz_corpus;
mod http;
mod idle;
mod java_locks;
mod layering;
mod lease;
mod memory;
mod nats;
mod packaging;
mod pool;
mod redis_lease;
mod redlock_lease;
mod store;
mod timezones;
mod tracing;
