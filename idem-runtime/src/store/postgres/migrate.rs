//! The shipped schema migrations and how they are applied.

use tokio_postgres::types::Type;

use super::exec::bounded;
use super::PostgresStore;
use crate::store::StoreError;

/// The shipped migrations, in order; `{schema}` is replaced by the quoted
/// schema name. A version, once shipped, is never edited: add a new one.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_records.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_lifecycle.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_outbox.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_operations.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_delivered_jobs.sql"),
    ),
    // The superseded operations' table, and the purge's index on
    // retain_until (a COMPLETED record now lives until its retention, its
    // window only holds the key). Records written before it whose
    // expires_at a late completion or resolution moved to their
    // retain_until cannot be told apart from a business key's records
    // (whose window is their retention): they keep their key until their
    // retention ends.
    (
        6,
        include_str!("../../../migrations/postgres/0006_superseded.sql"),
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
];

impl PostgresStore {
    /// Creates the schema and applies the shipped migrations not applied yet,
    /// recording each in `idem_migrations`. Idempotent, and safe when several
    /// processes migrate at once: they take turns on an advisory lock, and the
    /// later ones find nothing left to do. Errors: `Unavailable`, and
    /// `Config` for what only configuration fixes (a role without the
    /// privilege to create the schema or its tables, a refused login).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let schema = self.sql.schema.clone();
        // Read before the transaction borrows the connection; sent only if
        // the migration does not answer in time.
        let token = client.cancel_token();
        let out = bounded(&self.cancel, move || token, self.timeout * 4, async {
            let tx = client.transaction().await?;
            // Unnamed statements (`*_typed`), as every statement of the
            // store: nothing outlives the transaction, behind a pooler too.
            let lock = lock_id(&schema);
            tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &[(&lock, Type::INT8)])
                .await?;
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; \
                 CREATE TABLE IF NOT EXISTS {schema}.idem_migrations ( \
                   version integer PRIMARY KEY, \
                   applied_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await?;
            let applied: Vec<i32> = tx
                .query_typed(
                    &format!("SELECT version FROM {schema}.idem_migrations"),
                    &[],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            for (version, sql) in MIGRATIONS {
                if applied.contains(version) {
                    continue;
                }
                tx.batch_execute(&sql.replace("{schema}", &schema)).await?;
                tx.execute_typed(
                    &format!("INSERT INTO {schema}.idem_migrations (version) VALUES ($1)"),
                    &[(version, Type::INT4)],
                )
                .await?;
            }
            tx.commit().await
        })
        .await;
        self.settle(client, out)
    }
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
