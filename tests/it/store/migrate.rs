//! Migrations: idempotent, and a table dropped by hand is built again.

use super::*;

per_db!(migrate_is_idempotent);
async fn migrate_is_idempotent(db: Db) {
    let Some(td) = TestDb::open(db, "st_migrate").await else {
        return;
    };
    let id = td.enqueue("log", r#"{"n":1}"#, None).await;
    bounded("migrate again", td.store.migrate()).await;
    bounded("migrate a third time", td.store.migrate()).await;
    // A second instance starting on the same table migrates too.
    let other = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("second store");
    bounded("migrate from a second store", other.migrate()).await;
    assert_eq!(td.scalar("SELECT COUNT(*) FROM {t}").await, 1);
    assert!(row_is(&td, id, "status = 'PENDING'").await);
    assert_eq!(
        td.scalar(&format!(
            "SELECT COUNT(*) FROM outbox_relay_schema WHERE target = '{}'",
            td.table
        ))
        .await,
        1,
        "one schema-version row per table"
    );
    // The table still works after re-migration.
    let id2 = bounded(
        "enqueue",
        other.enqueue(&NewRow {
            channel: "log".into(),
            payload: "{}".into(),
            ..NewRow::default()
        }),
    )
    .await;
    assert!(id2 > id);
    td.drop_table().await;
}

per_db!(migrate_rebuilds_a_table_dropped_by_hand);
/// A table dropped by hand leaves its schema version behind; migrating again builds the
/// table (with every version's indexes) instead of calling it up to date.
async fn migrate_rebuilds_a_table_dropped_by_hand(db: Db) {
    let Some(td) = TestDb::open(db, "st_redrop").await else {
        return;
    };
    let version_sql = format!(
        "SELECT version FROM outbox_relay_schema WHERE target = '{}'",
        td.table
    );
    let version = td.scalar(&version_sql).await;
    let before = index_count(&td, db).await;
    assert!(
        before > 1,
        "{}: {before} indexes after the first migration",
        db.name()
    );
    td.drop_table().await;
    bounded("migrate after the drop", td.store.migrate()).await;
    assert_eq!(index_count(&td, db).await, before, "{}", db.name());
    let id = td.enqueue("log", r#"{"n":1}"#, None).await;
    assert!(row_is(&td, id, "status = 'PENDING'").await);
    assert_eq!(td.scalar(&version_sql).await, version, "{}", db.name());
    td.drop_table().await;
}

/// How many indexes `td`'s table has.
async fn index_count(td: &TestDb, db: Db) -> i64 {
    let t = &td.table;
    td.scalar(&match db {
        Db::Postgres => format!("SELECT COUNT(*) FROM pg_indexes WHERE tablename = '{t}'"),
        Db::MySql => format!(
            "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}'"
        ),
        Db::Sqlite => {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '{t}'")
        }
    })
    .await
}
