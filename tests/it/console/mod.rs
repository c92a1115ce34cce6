//! The operator console, through the relay binary against real PostgreSQL, MariaDB and SQLite:
//! no page or action without the token, cross-site POSTs refused, the overview's numbers are
//! the table's, filters and paging, recipients masked and payloads hidden, markup escaped, and
//! actions with the CLI's semantics (a requeued row is then delivered by the relay; a purge
//! deletes only old FAILED rows). Its configuration is checked through `check-config`.
//! [`browser`] drives the same console in a real headless Chromium; [`mapped`] runs it on
//! existing tables mapped by `[table]`.

mod browser;
mod filter;
mod mapped;
mod throttle;

use std::time::Duration;

use crate::support::console::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;

mod access;
mod actions;
mod pages;
