//! The integration suite: one test binary (it links once) over one toolkit, [`support`],
//! which the benchmark shares. Every test talks to real services: PostgreSQL, MariaDB/MySQL,
//! SQLite, Redis (servers of its own where it kills or pauses them), HTTP receivers on
//! loopback, and the relay binary as a process.
//!
//! Modules by subject: the store and its SQL ([`store`], [`timezones`]), leases ([`lease`],
//! [`redis_lease`], [`redlock_lease`]), delivery end to end ([`delivery`], [`claim_mode`],
//! [`bad_input`], [`memory`]), the vendors ([`fcm`], [`alimtalk`]), and operating it
//! ([`config`], [`admin`], [`http`]).

#[macro_use]
mod support;

mod admin;
mod alimtalk;
mod bad_input;
mod claim_mode;
mod config;
mod delivery;
mod fcm;
mod http;
mod layering;
mod lease;
mod memory;
mod redis_lease;
mod redlock_lease;
mod store;
mod timezones;
