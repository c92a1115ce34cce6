//! Text columns as the databases hand them back: text on PostgreSQL and SQLite, bytes where a
//! MySQL/MariaDB statement casts a column to `BINARY` (so that no connection character set
//! can change it on the way), and NULL.

use sqlx::any::{AnyRow, AnyTypeInfoKind};
use sqlx::{Row, ValueRef};

/// Whether column `i` of `row` holds bytes (a `BLOB`, or a cast to `BINARY`) rather than text
/// or NULL. Asked before decoding, so that a column is decoded once as what it holds: a
/// `try_get` of the other type fails by building an error with its message, and the claims
/// decode two such columns of every row (docs/performance-log.md, "Text columns decoded as
/// what they hold").
pub fn is_bytes(row: &AnyRow, i: usize) -> bool {
    row.try_get_raw(i)
        .is_ok_and(|v| !v.is_null() && v.type_info().kind() == AnyTypeInfoKind::Blob)
}

/// Whether column `i` of `row` holds a value other than NULL (a column that cannot be read
/// counts as holding one).
pub fn is_set(row: &AnyRow, i: usize) -> bool {
    row.try_get_raw(i).map_or(true, |v| !v.is_null())
}
