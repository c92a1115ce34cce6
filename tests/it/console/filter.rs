//! The failed rows' error-text filter against each database's own case folding
//! (docs/console.md, "Pages"): a row's own error text, typed back in any case the database
//! counts as the same (its `LOWER()` equal), finds the row, for non-ASCII text too (Greek with
//! its final sigma, Turkish dotted and dotless I, German ß, Cyrillic, emoji, combining
//! characters); LIKE's metacharacters (`%`, `_`, `!`, `\`) match only themselves. The cases
//! are made by the database (`LOWER`, `UPPER`, halves of each), never by Rust, whose folding
//! differs (`ΟΔΟΣ` is `οδος` in Rust, `οδοσ` in PostgreSQL; `İ` is `i̇` in Rust, `i` in
//! glibc): that difference made rows unfindable by their own text before.

use sqlx::Row;

use outbox_relay::store::FailedFilter;

use crate::support::console::*;
use crate::support::receiver::Receiver;
use crate::support::*;

/// Error texts; each is a FAILED row's `last_error`.
const CORPUS: &[&str] = &[
    "ΟΔΟΣ ΑΘΗΝΩΝ: σφάλμα αποστολής",
    "İSTANBUL şehri İzmir",
    "ıstanbul dotless ı",
    "Straße gesperrt: GROSS groß",
    "ẞ capital sharp",
    "Ошибка ДОСТАВКИ: ёлка Ё",
    "emoji 😀 failed 🚀 ✓",
    "Cafe\u{301} combining Ä\u{308}",
    "ǅemal ǈ titlecase",
    "HTTP 500: Plain ASCII Boom",
    "100% done_ok! path C:\\tmp\\x",
    "under_score and per%cent",
    "bang! and bang!! and !%",
];

/// A bind placeholder of `db`.
fn ph(db: Db, n: usize) -> String {
    match db {
        Db::Postgres => format!("${n}"),
        _ => "?".to_string(),
    }
}

/// Inserts a FAILED row with `error` (bound, never spliced); returns its id.
async fn failed_row(td: &TestDb, error: &str) -> i64 {
    let cast = if td.db == Db::Postgres { "::jsonb" } else { "" };
    let sql = format!(
        "INSERT INTO {} (channel, payload, status, last_error) VALUES ('hook', '{{}}'{cast}, \
         'FAILED', {})",
        td.table,
        ph(td.db, 1)
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(error.to_string())
        .execute(td.store.pool())
        .await
        .expect("insert");
    td.scalar("SELECT MAX(id) FROM {t}").await
}

/// Text from the database: `expr` over the bound `args` (`$1`/`?` placeholders by position).
async fn db_text(td: &TestDb, expr: &str, args: &[&str]) -> String {
    let mut sql = expr.to_string();
    for i in (1..=args.len()).rev() {
        sql = sql.replace(&format!("#{i}"), &ph(td.db, i));
    }
    let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {sql}")));
    for a in args {
        q = q.bind(a.to_string());
    }
    let row = q.fetch_one(td.store.pool()).await.expect("select");
    row.try_get::<String, _>(0).expect("text")
}

/// The ways `t` is typed back, as the database writes them: as stored, folded down, folded
/// up, and halves of each.
async fn cases(td: &TestDb, t: &str) -> Vec<String> {
    let chars: Vec<char> = t.chars().collect();
    let (a, b): (String, String) = (
        chars[..chars.len() / 2].iter().collect(),
        chars[chars.len() / 2..].iter().collect(),
    );
    let mut out = vec![t.to_string()];
    for expr in ["LOWER(#1)", "UPPER(#1)"] {
        out.push(db_text(td, expr, &[t]).await);
    }
    for (x, y) in [("LOWER", "UPPER"), ("UPPER", "LOWER")] {
        let first = db_text(td, &format!("{x}(#1)"), &[&a]).await;
        let second = db_text(td, &format!("{y}(#1)"), &[&b]).await;
        out.push(format!("{first}{second}"));
    }
    out.dedup();
    out
}

/// Whether the database counts `typed` and `stored` as the same text but for case: their
/// `LOWER()`s are equal as it compares them.
async fn same_but_case(td: &TestDb, typed: &str, stored: &str) -> bool {
    let expr = "CASE WHEN LOWER(#1) = LOWER(#2) THEN 'y' ELSE 'n' END";
    db_text(td, expr, &[typed, stored]).await == "y"
}

/// The ids the store's filter finds for `text` (the console's page and its requeue use it).
async fn found(td: &TestDb, text: &str) -> Vec<i64> {
    let f = FailedFilter {
        error_contains: Some(text.to_string()),
        ..FailedFilter::default()
    };
    let page = td.store.failed_page(&f, None, 200).await.expect("page");
    page.iter().map(|r| r.id).collect()
}

async fn a_row_is_found_by_its_own_text_in_any_case(db: Db) {
    let Some(td) = TestDb::open(db, "console_fold").await else {
        return;
    };
    let mut rows = Vec::new();
    for t in CORPUS {
        rows.push((failed_row(&td, t).await, *t));
    }
    let mut folded = 0;
    for (id, t) in &rows {
        for typed in cases(&td, t).await {
            if typed != *t && !same_but_case(&td, &typed, t).await {
                // Not the same text to this database (`ı` upper-cased is `I`, whose lower
                // case is `i`): nothing to find.
                continue;
            }
            folded += usize::from(typed != *t);
            assert!(
                found(&td, &typed).await.contains(id),
                "{}: row {id} {t:?} not found by {typed:?}",
                db.name()
            );
        }
    }
    // Every database folds ASCII at least: most texts had cases other than their own.
    assert!(folded >= CORPUS.len(), "{}: only {folded} cases", db.name());

    // LIKE's metacharacters match only themselves: exactly the rows that hold them.
    for needle in ["%", "_", "!", "\\", "0%", "!%", "!!", ":\\", "_o", "%c"] {
        let mut want: Vec<i64> = rows
            .iter()
            .filter(|(_, t)| t.to_ascii_lowercase().contains(needle))
            .map(|(id, _)| *id)
            .collect();
        want.reverse();
        assert_eq!(found(&td, needle).await, want, "{}: {needle:?}", db.name());
    }

    // Through the console's page as well.
    let rx = Receiver::start(None).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let c = ConsoleClient::new(&base);
    let bearer = format!("Bearer {TOKEN}");
    for (id, t) in rows.iter().take(2) {
        let q: String = form_urlencoded::byte_serialize(t.as_bytes()).collect();
        let page = c
            .send(
                "GET",
                &format!("/failed?error={q}"),
                None,
                &[("authorization", &bearer)],
            )
            .await;
        assert!(failed_ids(&page.body).contains(id), "{t}: {}", page.body);
    }
    td.drop_table().await;
}
per_db!(a_row_is_found_by_its_own_text_in_any_case);
