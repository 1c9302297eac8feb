//! The shipped schema migrations and how they are applied: online, while
//! replicas serve from the tables they change.
//!
//! - A change that locks a live table (adding or renaming a column, a
//!   constraint, renaming an index) runs in a transaction whose
//!   `lock_timeout` is a quarter of the store's timeout: a writer queued
//!   behind it waits that long at most, and the change is tried again
//!   after a pause, until [`PostgresStoreBuilder::migrate_timeout`].
//! - An index on a live table is built with `CREATE INDEX CONCURRENTLY`
//!   (and dropped with `DROP INDEX CONCURRENTLY`), which block no writes and
//!   cannot run in a transaction block; a constraint is added `NOT VALID`
//!   and validated on its own (which blocks no writes either).
//! - Starters take turns on a transaction-scoped advisory lock held, for
//!   the whole migration, by a transaction left open on a connection of its
//!   own (a transaction pooler keeps it on one server connection for that
//!   long); the statements run on a second connection. The others try the
//!   lock every half second at most, each try a transaction they end at
//!   once: one that waited on the lock would hold a snapshot, which a
//!   concurrent index build waits for.
//! - A migration is recorded in `idem_migrations` once all of it has run;
//!   each of its steps can run again, so an interrupted one runs again from
//!   its start, and an index whose concurrent build was cut off (left
//!   INVALID) is dropped and built again.
//!
//! [`PostgresStoreBuilder::migrate_timeout`]: super::PostgresStoreBuilder::migrate_timeout

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::exec::{bounded, TimedOut};
use super::{classify, PostgresStore};
use crate::store::StoreError;

/// Opens a connection of a migration's own, outside the pool (the builder
/// keeps its configuration and TLS).
pub(super) type Connector = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Client, tokio_postgres::Error>> + Send>>
        + Send
        + Sync,
>;

/// The migrations, in order, as they are applied: `{schema}` is replaced
/// by the quoted schema name. A version, once shipped, is never edited: add
/// a new one. Where a shipped file (in `migrations/postgres/`) locks a
/// live table for longer than a statement may wait (an index built, a
/// constraint checked under an exclusive lock), a deployment that has not
/// applied it yet runs its online equivalent (`migrations/postgres/online/`),
/// which ends in the same schema (`tests/store_postgres/online.rs` compares
/// the two): the new columns may be added twice, the indexes built
/// concurrently.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_records.sql"),
    ),
    // The shipped file builds two indexes on idem_records in the
    // migration's transaction, blocking its writes meanwhile.
    (
        2,
        include_str!("../../../migrations/postgres/online/0002_lifecycle.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_outbox.sql"),
    ),
    // The shipped file checks the new constraint over idem_jobs under an
    // exclusive lock.
    (
        4,
        include_str!("../../../migrations/postgres/online/0004_operations.sql"),
    ),
    // The shipped file builds two indexes on idem_jobs in the transaction.
    (
        5,
        include_str!("../../../migrations/postgres/online/0005_delivered_jobs.sql"),
    ),
    // The superseded operations' table, and the purge's index on
    // retain_until (a COMPLETED record now lives until its retention, its
    // window only holds the key). Records written before it whose
    // expires_at a late completion or resolution moved to their
    // retain_until cannot be told apart from a business key's records
    // (whose window is their retention): they keep their key until their
    // retention ends. The shipped file builds the index on idem_records in
    // the transaction.
    (
        6,
        include_str!("../../../migrations/postgres/online/0006_superseded.sql"),
    ),
    // A job's runs and last error from before its last re-drive.
    (
        7,
        include_str!("../../../migrations/postgres/0007_redrives.sql"),
    ),
    // The column of a job's runs is `attempts` again, as the version
    // before 7 reads and writes it (7 renamed it, and so broke that
    // version's replicas during a rolling deploy).
    (
        8,
        include_str!("../../../migrations/postgres/0008_attempts_again.sql"),
    ),
    // The claim and the completion as functions: planned once per server
    // connection, behind a transaction pooler too.
    (
        9,
        include_str!("../../../migrations/postgres/0009_functions.sql"),
    ),
];

/// A migration's statements in the order they run.
#[derive(Debug, PartialEq)]
enum Step {
    /// Statements that lock the tables they change, run together in one
    /// transaction under the lock timeout (and tried again).
    Locking(Vec<String>),
    /// A statement that cannot run in a transaction block (`CONCURRENTLY`),
    /// or that reads a whole table without blocking its writes
    /// (`VALIDATE CONSTRAINT`): alone, bounded by the migration's time.
    Alone(String),
}

/// `sql` (a migration's file, `{schema}` replaced) as steps: its
/// statements, comments (`--` lines) left out, split at each `;` outside a
/// function's body (`$$ … $$`; no literal in a migration holds one).
fn steps(sql: &str) -> Vec<Step> {
    let text: Vec<&str> = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    let text = text.join("\n");
    let mut statements = Vec::new();
    let (mut start, mut in_body) = (0, false);
    for (i, c) in text.char_indices() {
        if c == '$' && text[i..].starts_with("$$") && !text[..i].ends_with('$') {
            in_body = !in_body;
        } else if c == ';' && !in_body {
            statements.push(&text[start..i]);
            start = i + 1;
        }
    }
    statements.push(&text[start..]);
    let mut steps = Vec::new();
    for statement in statements.into_iter().map(str::trim) {
        if statement.is_empty() {
            continue;
        }
        let words: Vec<String> = statement
            .split_whitespace()
            .map(str::to_ascii_uppercase)
            .collect();
        let alone = words.iter().any(|w| w == "CONCURRENTLY")
            || words
                .windows(2)
                .any(|w| w[0] == "VALIDATE" && w[1] == "CONSTRAINT");
        if alone {
            steps.push(Step::Alone(statement.to_owned()));
        } else if let Some(Step::Locking(statements)) = steps.last_mut() {
            statements.push(statement.to_owned());
        } else {
            steps.push(Step::Locking(vec![statement.to_owned()]));
        }
    }
    steps
}

/// The longest pause between two tries of the starters' lock.
const LOCK_POLL: Duration = Duration::from_millis(500);

/// The longest pause between two tries of a change that did not get its
/// lock in time.
const MAX_PAUSE: Duration = Duration::from_secs(1);

impl PostgresStore {
    /// Creates the schema and applies the shipped migrations not applied yet,
    /// recording each in `idem_migrations`, within
    /// [`migrate_timeout`](super::PostgresStoreBuilder::migrate_timeout)
    /// (10 minutes by default). Idempotent, and safe when several processes
    /// migrate at once: they take turns on an advisory lock, and the later
    /// ones find nothing left to do.
    ///
    /// Online: replicas go on serving (from the same tables) while it runs.
    /// No write waits behind it for longer than a quarter of the store's
    /// [`timeout`](super::PostgresStoreBuilder::timeout): indexes are built
    /// with `CREATE INDEX CONCURRENTLY`, and a change that locks a table
    /// gives way after that long, and is tried again.
    ///
    /// When every migration is applied already it only reads
    /// `idem_migrations`, so a role that serves (docs/deploying.md,
    /// "Grants") may call it; applying one needs the role that owns the
    /// schema and its tables.
    ///
    /// Errors: `Unavailable` (the time ran out: what was applied stays
    /// applied, and the next `migrate` goes on from there), and `Config`
    /// for what only configuration fixes (a role without the privilege to
    /// create or change the schema's tables, a refused login).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.migrate_timeout;
        if self
            .applied()
            .await?
            .is_some_and(|applied| pending(&applied).is_empty())
        {
            return Ok(());
        }
        let mut lock = self.migration_client(deadline).await?;
        let mut work = self.migration_client(deadline).await?;
        let out = self.migrate_on(&mut lock, &mut work, deadline).await;
        // Ends the lock's transaction (closing the connection would too).
        let _ = tokio::time::timeout(self.timeout, lock.batch_execute("ROLLBACK")).await;
        out
    }

    /// The versions `idem_migrations` records, read through the pool;
    /// `None` when the schema or the table is not there yet.
    async fn applied(&self) -> Result<Option<Vec<i32>>, StoreError> {
        let sql = format!("SELECT version FROM {}.idem_migrations", self.sql.schema);
        self.with(async |db, _| match db.query(&sql, &[]).await {
            Ok(rows) => Ok(Some(rows.iter().map(|r| r.get(0)).collect())),
            Err(e)
                if e.code() == Some(&SqlState::UNDEFINED_TABLE)
                    || e.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        })
        .await
    }

    /// A connection of the migration's own, within the time left.
    async fn migration_client(&self, deadline: Instant) -> Result<Client, StoreError> {
        match tokio::time::timeout_at(deadline, (self.migrations)()).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(self.migration_error(&e)),
            Err(_) => Err(self.out_of_time(None)),
        }
    }

    async fn migrate_on(
        &self,
        lock: &mut Client,
        work: &mut Client,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let schema = self.sql.schema.clone();
        let name = schema.trim_matches('"').to_owned();
        // Other starters wait here, for as long as this one migrates. They
        // try the lock in a transaction they end at once when it is taken:
        // a transaction that waited on it would hold a snapshot, and
        // `CREATE INDEX CONCURRENTLY` waits for every transaction holding
        // an older snapshot to end (the holder's, idle, holds none).
        let id = lock_id(&schema);
        let mut pause = Duration::from_millis(20);
        loop {
            let taken = self
                .run(lock, deadline, async |lock| {
                    // The simple query protocol: the extended one's
                    // unnamed portal would keep its snapshot until the
                    // next statement, and the transaction sends none.
                    let answer = lock
                        .simple_query(&format!("BEGIN; SELECT pg_try_advisory_xact_lock({id})"))
                        .await?;
                    let taken = answer.iter().any(
                        |m| matches!(m, SimpleQueryMessage::Row(row) if row.get(0) == Some("t")),
                    );
                    if !taken {
                        lock.batch_execute("ROLLBACK").await?;
                    }
                    Ok(taken)
                })
                .await?;
            if taken {
                break;
            }
            if Instant::now() + pause >= deadline {
                return Err(self.out_of_time(None));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LOCK_POLL);
        }

        // Each only when missing: the role that migrates may own the schema
        // without the right to create schemas in the database.
        let exists = self
            .run(work, deadline, async |work| {
                let table = format!("{schema}.idem_migrations");
                let rows = work
                    .query_typed(
                        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1), \
                                to_regclass($2) IS NOT NULL",
                        &[(&name, Type::TEXT), (&table, Type::TEXT)],
                    )
                    .await?;
                Ok((rows[0].get::<_, bool>(0), rows[0].get::<_, bool>(1)))
            })
            .await?;
        if !exists.0 {
            self.run(work, deadline, async |work| {
                work.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                    .await
            })
            .await?;
        }
        if !exists.1 {
            self.run(work, deadline, async |work| {
                work.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {schema}.idem_migrations ( \
                       version integer PRIMARY KEY, \
                       applied_at timestamptz NOT NULL DEFAULT now())"
                ))
                .await
            })
            .await?;
        }
        let applied: Vec<i32> = self
            .run(work, deadline, async |work| {
                let rows = work
                    .query_typed(
                        &format!("SELECT version FROM {schema}.idem_migrations"),
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await?;
        let pending = pending(&applied);
        if pending.is_empty() {
            return Ok(());
        }

        // An index whose concurrent build was cut off is left INVALID:
        // `CREATE INDEX CONCURRENTLY IF NOT EXISTS` would take it as built.
        let invalid: Vec<String> = self
            .run(work, deadline, async |work| {
                let rows = work
                    .query_typed(
                        "SELECT c.relname::text FROM pg_index i \
                         JOIN pg_class c ON c.oid = i.indexrelid \
                         JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE n.nspname = $1 AND NOT i.indisvalid \
                           AND c.relname LIKE 'idem\\_%'",
                        &[(&name, Type::TEXT)],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await?;
        for index in invalid {
            tracing::warn!(schema = %name, %index, "dropping an index whose concurrent build was cut off, to build it again");
            let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.\"{index}\"");
            self.run(work, deadline, async |work| work.batch_execute(&drop).await)
                .await?;
        }

        let record = format!("INSERT INTO {schema}.idem_migrations (version) VALUES ($1)");
        for (version, sql) in pending {
            let started = Instant::now();
            let steps = steps(&sql.replace("{schema}", &schema));
            let last = steps.len() - 1;
            for (i, step) in steps.iter().enumerate() {
                if lock.is_closed() {
                    return Err(StoreError::Unavailable(format!(
                        "PostgreSQL: the connection holding the migration lock of {schema} \
                         closed during migration {version}; what was applied stays applied: \
                         run migrate() again"
                    )));
                }
                match step {
                    Step::Alone(statement) => {
                        self.run(work, deadline, async |work| {
                            work.batch_execute(statement).await
                        })
                        .await?;
                    }
                    Step::Locking(statements) => {
                        let then_record = (i == last).then_some(&record);
                        self.locking(work, deadline, statements, version, then_record)
                            .await?;
                    }
                }
            }
            if matches!(steps[last], Step::Alone(_)) {
                self.run(work, deadline, async |work| {
                    work.execute_typed(&record, &[(&version, Type::INT4)]).await
                })
                .await?;
            }
            tracing::info!(schema = %name, version, elapsed = ?started.elapsed(), "applied a PostgreSQL migration");
        }
        Ok(())
    }

    /// `statements` in one transaction whose lock waits end at the lock
    /// timeout, tried again (after a pause, up to [`MAX_PAUSE`]) while the
    /// migration has time; with the migration's record when `record`.
    async fn locking(
        &self,
        work: &mut Client,
        deadline: Instant,
        statements: &[String],
        version: i32,
        record: Option<&String>,
    ) -> Result<(), StoreError> {
        let set = format!(
            "SET LOCAL lock_timeout = '{}ms'",
            self.lock_timeout.as_millis()
        );
        let batch = statements.join(";\n");
        let mut pause = Duration::from_millis(50);
        loop {
            let token = work.cancel_token();
            let left = deadline.saturating_duration_since(Instant::now());
            let out = bounded(&self.cancel, || token, left, async {
                let tx = work.transaction().await?;
                tx.batch_execute(&set).await?;
                tx.batch_execute(&batch).await?;
                if let Some(record) = record {
                    tx.execute_typed(record, &[(&version, Type::INT4)]).await?;
                }
                tx.commit().await
            })
            .await;
            match out {
                Ok(Err(e))
                    if (e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                        || e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED))
                        && Instant::now() + pause < deadline =>
                {
                    tracing::debug!(version, "a migration's change gave way to the writes waiting for its table; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => return Err(self.migration_error(&e)),
                Err(timed_out) => return Err(self.out_of_time(Some(timed_out))),
            }
        }
    }

    /// `work` on `client` within the time left to the migration; a
    /// statement still running then is cancelled on the server.
    async fn run<T, F>(
        &self,
        client: &mut Client,
        deadline: Instant,
        work: F,
    ) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Client) -> Result<T, tokio_postgres::Error>,
    {
        let token = client.cancel_token();
        let left = deadline.saturating_duration_since(Instant::now());
        match bounded(&self.cancel, || token, left, work(client)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.migration_error(&e)),
            Err(timed_out) => Err(self.out_of_time(Some(timed_out))),
        }
    }

    /// A migration's error: a missing privilege names the role that
    /// migrates.
    fn migration_error(&self, e: &tokio_postgres::Error) -> StoreError {
        let schema = &self.sql.schema;
        match e.as_db_error() {
            Some(db) if db.code() == &SqlState::INSUFFICIENT_PRIVILEGE => {
                StoreError::Config(format!(
                    "PostgreSQL: {} (42501); migrating needs the role that owns the schema \
                     {schema} and its tables, or, for a schema not created yet, CREATE on \
                     the database (docs/deploying.md, \"Grants\": the migrating role): run \
                     migrate() (or migrate=true on the store URL) as that role",
                    db.message()
                ))
            }
            _ => classify(e, schema),
        }
    }

    fn out_of_time(&self, timed_out: Option<TimedOut>) -> StoreError {
        let cancelled = match timed_out {
            Some(TimedOut { ended: false }) => {
                " (a cancel request for its last statement could not be confirmed)"
            }
            _ => "",
        };
        StoreError::Unavailable(format!(
            "PostgreSQL: migrating the schema {} did not finish within {:?}{cancelled}; the \
             migrations it finished stay applied: run migrate() again to go on, with a longer \
             PostgresStoreBuilder::migrate_timeout (migrate_timeout=SECONDS on the store URL) \
             for a large table",
            self.sql.schema, self.migrate_timeout
        ))
    }
}

/// The migrations `applied` lacks, in order.
fn pending(applied: &[i32]) -> Vec<(i32, &'static str)> {
    MIGRATIONS
        .iter()
        .filter(|(version, _)| !applied.contains(version))
        .copied()
        .collect()
}

impl PostgresStore {
    /// Checks that every shipped migration has been applied to the store's
    /// schema, changing nothing: what a server that does not migrate at
    /// start (`open_store` without `migrate=true`) and the `idem` command
    /// line do before they serve. A schema migrated further, by a later
    /// version, is served as it is: each migration only adds what the
    /// version before it does not know (docs/deploying.md, "Upgrading").
    /// Errors: `Config` for a schema not migrated, or migrated only to an
    /// earlier layout, naming what to run; `Unavailable`.
    pub async fn check_layout(&self) -> Result<(), StoreError> {
        let schema = self.sql.schema.clone();
        let applied: Vec<i32> = self
            .with(async |db, _| {
                let rows = db
                    .query(
                        &format!("SELECT version FROM {schema}.idem_migrations"),
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await?;
        let missing: Vec<String> = MIGRATIONS
            .iter()
            .filter(|(version, _)| !applied.contains(version))
            .map(|(version, _)| version.to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(StoreError::Config(format!(
            "the PostgreSQL schema {schema} lacks this version's migrations {}: run `idem \
             migrate --store URL` (with the URL's schema), PostgresStore::migrate(), or \
             open the store with migrate=true, as a role that may change the schema; \
             replicas of the version before keep serving the schema meanwhile, and this \
             one serves it once migrated",
            missing.join(", ")
        )))
    }
}

/// The advisory lock migrations of one schema take turns on.
fn lock_id(schema: &str) -> i64 {
    // FNV-1a: stable across builds and processes, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "idem-migrate:".bytes().chain(schema.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_statements_run_alone_and_the_rest_together() {
        let sql = "-- a comment; with a semicolon\n\
                   ALTER TABLE t ADD COLUMN IF NOT EXISTS a int;\n\
                   ALTER TABLE t ADD COLUMN IF NOT EXISTS b int;\n\
                   CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (a);\n\
                   ALTER TABLE t VALIDATE CONSTRAINT c;\n\
                   ALTER INDEX IF EXISTS i RENAME TO j;\n";
        assert_eq!(
            steps(sql),
            [
                Step::Locking(vec![
                    "ALTER TABLE t ADD COLUMN IF NOT EXISTS a int".into(),
                    "ALTER TABLE t ADD COLUMN IF NOT EXISTS b int".into(),
                ]),
                Step::Alone("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (a)".into()),
                Step::Alone("ALTER TABLE t VALIDATE CONSTRAINT c".into()),
                Step::Locking(vec!["ALTER INDEX IF EXISTS i RENAME TO j".into()]),
            ]
        );
    }

    #[test]
    fn a_function_body_is_one_statement() {
        let sql = "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\n\
                   BEGIN\n\
                     PERFORM 1;\n\
                     RETURN 2;\n\
                   END\n\
                   $$;\n\
                   CREATE FUNCTION g() RETURNS int LANGUAGE sql AS $$ SELECT 3 $$;\n";
        let Step::Locking(statements) = &steps(sql)[0] else {
            panic!("a function is created in a transaction");
        };
        assert_eq!(statements.len(), 2, "{statements:?}");
        assert!(statements[0].contains("PERFORM 1;") && statements[0].ends_with("$$"));
        assert_eq!(
            statements[1],
            "CREATE FUNCTION g() RETURNS int LANGUAGE sql AS $$ SELECT 3 $$"
        );
    }

    #[test]
    fn every_migration_has_steps() {
        for (version, sql) in MIGRATIONS {
            assert!(!steps(sql).is_empty(), "migration {version}");
        }
    }
}
