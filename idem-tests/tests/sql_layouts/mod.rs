//! SQL stores at an earlier layout, built from the shipped migration
//! files (which are never edited once shipped, so file `N` is exactly what
//! the version that shipped it applied), and what a layout looks like from
//! outside: for the tests of `idem migrate` and of rolling deploys.
#![allow(dead_code)]

/// The shipped SQLite migrations, in order: layout `N` is the first `N`.
pub const SQLITE: [&str; 8] = [
    include_str!("../../../idem-runtime/migrations/sqlite/0001_records.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0002_lifecycle.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0003_outbox.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0004_operations.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0005_delivered_jobs.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0006_superseded.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0007_redrives.sql"),
    include_str!("../../../idem-runtime/migrations/sqlite/0008_attempts_again.sql"),
];

/// The shipped PostgreSQL migrations, in order (`{schema}` stands for the
/// quoted schema).
pub const POSTGRES: [&str; 9] = [
    include_str!("../../../idem-runtime/migrations/postgres/0001_records.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0002_lifecycle.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0003_outbox.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0004_operations.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0005_delivered_jobs.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0006_superseded.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0007_redrives.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0008_attempts_again.sql"),
    include_str!("../../../idem-runtime/migrations/postgres/0009_functions.sql"),
];

/// This version's SQLite layout: how many migrations it ships.
pub const LATEST: usize = SQLITE.len();

/// This version's PostgreSQL layout (9: the claim and the completion as
/// functions, which SQLite has no use for).
pub const POSTGRES_LATEST: usize = POSTGRES.len();

/// A SQLite database file at `path` at layout `layout`, as the version
/// that shipped that migration left it: the migrations `1..=layout` in one
/// transaction, and `user_version` set to `layout`, as its writer thread
/// did (WAL mode, as its servers left it).
pub fn sqlite_at(path: &std::path::Path, layout: usize) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for sql in &SQLITE[..layout] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", layout as i64)
        .unwrap();
    conn.execute_batch("COMMIT").unwrap();
}

/// What a SQLite file's layout is, seen from outside: its `user_version`,
/// the DDL of every table and index, and each table's rows (as text), so
/// that a command that changed the layout, or a row, shows.
pub fn sqlite_layout(path: &std::path::Path) -> (i64, Vec<String>, Vec<String>) {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(path, flags).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let mut stmt = conn
        .prepare("SELECT type, name, coalesce(sql, '') FROM sqlite_master ORDER BY name")
        .unwrap();
    let ddl: Vec<(String, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut rows = Vec::new();
    for (kind, name, _) in &ddl {
        if kind != "table" {
            continue;
        }
        let mut stmt = conn.prepare(&format!("SELECT * FROM {name}")).unwrap();
        let columns = stmt.column_count();
        let mut found = stmt.query([]).unwrap();
        while let Some(row) = found.next().unwrap() {
            let cells: Vec<String> = (0..columns)
                .map(|i| format!("{:?}", row.get_ref(i).unwrap()))
                .collect();
            rows.push(format!("{name}: {}", cells.join(", ")));
        }
    }
    let ddl = ddl
        .into_iter()
        .map(|(kind, name, sql)| format!("{kind} {name}: {sql}"))
        .collect();
    (version, ddl, rows)
}

/// A fresh PostgreSQL schema name for one test.
pub fn schema_name(what: &str) -> String {
    format!(
        "t_{what}_{:016x}",
        idem_runtime::store::Attempt::random().get()
    )
}

/// The schema `name` at `url` at layout `layout`, as the version that
/// shipped that migration's `migrate()` left it: the schema, its
/// `idem_migrations`, and the migrations `1..=layout` each recorded.
pub async fn postgres_at(url: &str, name: &str, layout: usize) {
    let client = crate::durable::connect(url).await;
    client
        .batch_execute(&format!("CREATE SCHEMA \"{name}\""))
        .await
        .unwrap();
    postgres_tables_at(&client, name, layout).await;
}

/// [`postgres_at`] in the schema `name`, which exists: what that
/// version's `migrate()` created in it, as the role `client` logs in as
/// (which then owns the tables).
pub async fn postgres_tables_at(client: &tokio_postgres::Client, name: &str, layout: usize) {
    let schema = format!("\"{name}\"");
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.idem_migrations ( \
               version integer PRIMARY KEY, \
               applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await
        .unwrap();
    for (i, sql) in POSTGRES[..layout].iter().enumerate() {
        client
            .batch_execute(&format!(
                "{}; INSERT INTO {schema}.idem_migrations (version) VALUES ({})",
                sql.replace("{schema}", &schema),
                i + 1
            ))
            .await
            .unwrap();
    }
}

/// What the schema `name`'s layout is, seen from outside: the migrations
/// recorded, every column and index of its tables, and every function
/// (its arguments, and a digest of its body with the schema's name taken
/// out).
pub async fn postgres_layout(url: &str, name: &str) -> (Vec<i32>, Vec<String>) {
    let client = crate::durable::connect(url).await;
    let versions = client
        .query(
            &format!("SELECT version FROM \"{name}\".idem_migrations ORDER BY version"),
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    let columns = client
        .query(
            "SELECT table_name || '.' || column_name || ' ' || data_type \
             FROM information_schema.columns WHERE table_schema = $1 \
             UNION ALL \
             SELECT indexname || ': ' || replace(indexdef, $1 || '.', '') \
             FROM pg_indexes WHERE schemaname = $1 \
             UNION ALL \
             SELECT 'function ' || p.proname || '(' \
               || pg_get_function_identity_arguments(p.oid) || ') ' \
               || md5(replace(p.prosrc, '\"' || $1 || '\"', '')) \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 \
             ORDER BY 1",
            &[&name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (versions, columns)
}

/// Drops the PostgreSQL schema it names when dropped (after a panic too).
pub struct DropSchema(pub String, pub String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let (url, name) = (self.0.clone(), self.1.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// The statements of a file in `tests/data/sql_earlier`, by name: each
/// follows a line `-- statement: NAME`; the lines before the first are
/// the file's notes.
pub fn statements(text: &'static str) -> std::collections::HashMap<&'static str, &'static str> {
    let mut out = std::collections::HashMap::new();
    for part in text.split("-- statement: ").skip(1) {
        let (name, sql) = part.split_once('\n').expect("a name, then the statement");
        out.insert(name.trim(), sql.trim());
    }
    out
}
