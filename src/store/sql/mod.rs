//! The shared part every statement is written with: the [`Dialect`] and its [`Syntax`] (the
//! text that differs between databases), the statement builder [`Sql`], identifiers, and
//! [`Columns`] (the table's column names and status values), and how text columns come back
//! (`decode`). Nothing here talks to a database.

pub mod builder;
pub mod columns;
pub mod decode;
pub mod dialect;
pub mod ident;
pub mod payload;
pub mod stmt;

pub use builder::Sql;
pub use columns::{Columns, Owned, State};
pub use dialect::{Dialect, Syntax};
pub use stmt::{AnyQuery, Stmt};
