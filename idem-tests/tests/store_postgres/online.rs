//! Migrations run online: from every earlier layout they end in the schema
//! the shipped files make, an index whose concurrent build was cut off is
//! built again, no write waits behind a migration longer than the lock
//! timeout, and `migrate_timeout` bounds the whole.

use std::time::{Duration, Instant};

use idem_runtime::store::Attempt;
use idem_runtime::{PostgresStore, StoreError};

use crate::durable::{self, database_url};

/// The shipped migration files, in order, as this repository holds them.
fn shipped() -> Vec<(i32, String)> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../idem-runtime/migrations/postgres"
    );
    let mut files: Vec<(i32, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name()?.to_str()?.to_owned();
            let version = name.strip_suffix(".sql")?.split('_').next()?.parse().ok()?;
            Some((version, std::fs::read_to_string(&path).unwrap()))
        })
        .collect();
    files.sort();
    files
}

/// A schema of the test's own, dropped at the end, with a direct
/// connection to it (concurrent index builds and session locks need one).
struct Schema {
    url: String,
    name: String,
    client: tokio_postgres::Client,
}

impl Schema {
    async fn new(url: &str, prefix: &str) -> Schema {
        let name = format!("{prefix}_{:016x}", Attempt::random().get());
        Schema {
            url: url.to_owned(),
            client: durable::connect(url).await,
            name,
        }
    }

    fn quoted(&self) -> String {
        format!("\"{}\"", self.name)
    }

    /// Applies the shipped files up to `layout` as the versions that
    /// shipped them did: each in the transaction of the advisory lock,
    /// recorded in `idem_migrations`.
    async fn apply_shipped(&self, layout: i32) {
        let schema = self.quoted();
        for (version, sql) in shipped().into_iter().filter(|(v, _)| *v <= layout) {
            self.client
                .batch_execute(&format!(
                    "BEGIN; \
                     CREATE SCHEMA IF NOT EXISTS {schema}; \
                     CREATE TABLE IF NOT EXISTS {schema}.idem_migrations ( \
                       version integer PRIMARY KEY, \
                       applied_at timestamptz NOT NULL DEFAULT now()); \
                     {} ; \
                     INSERT INTO {schema}.idem_migrations (version) VALUES ({version}); \
                     COMMIT",
                    sql.replace("{schema}", &schema)
                ))
                .await
                .unwrap_or_else(|e| panic!("shipped migration {version}: {e}"));
        }
    }

    fn store(&self) -> idem_runtime::store::PostgresStoreBuilder {
        PostgresStore::builder(&self.url)
            .unwrap()
            .schema(&self.name)
    }

    /// The schema as the catalog describes it: columns, indexes (with
    /// whether each is valid) and constraints (with whether each is
    /// validated), the schema's name left out.
    async fn catalog(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sql in [
            "SELECT format('column %s.%s %s null=%s default=%s', table_name, column_name, \
               data_type, is_nullable, coalesce(column_default, '-')) \
             FROM information_schema.columns WHERE table_schema = $1 \
             ORDER BY table_name, ordinal_position",
            "SELECT format('index %s valid=%s', pg_get_indexdef(i.indexrelid), i.indisvalid) \
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 \
             ORDER BY c.relname",
            "SELECT format('constraint %s %s %s validated=%s', t.relname, k.conname, \
               pg_get_constraintdef(k.oid), k.convalidated) \
             FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = $1 \
             ORDER BY t.relname, k.conname",
        ] {
            for row in self.client.query(sql, &[&self.name]).await.unwrap() {
                let line: String = row.get(0);
                out.push(line.replace(&self.quoted(), "S").replace(&self.name, "S"));
            }
        }
        out
    }

    async fn versions(&self) -> Vec<i32> {
        self.client
            .query(
                &format!(
                    "SELECT version FROM {}.idem_migrations ORDER BY version",
                    self.quoted()
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// `n` records (every fifth IN_PROGRESS, every seventh UNKNOWN) and a
    /// job per tenth record, in the columns of layout 5 and later.
    async fn fill(&self, n: i64) {
        let schema = self.quoted();
        self.client
            .batch_execute(&format!(
                "INSERT INTO {schema}.idem_records (attempt, claimed_at, updated_at, \
                   lease_until, expires_at, retain_until, state, key, fingerprint, tenant, \
                   tool, body) \
                 SELECT i, now(), now(), now() + interval '30 s', now() + interval '1 h', \
                   now() + interval '2 h', CASE WHEN i % 5 = 0 THEN 0 WHEN i % 7 = 0 THEN 2 \
                   ELSE 1 END, sha256(int8send(i)), sha256(int8send(-i)), 't' || (i % 100), \
                   'charge', convert_to('{{\"ok\":true}}', 'UTF8') \
                 FROM generate_series(1, {n}) AS i; \
                 INSERT INTO {schema}.idem_jobs (next_run_at, created_at, updated_at, \
                   attempts, dead, reference, tenant, name, payload) \
                 SELECT now(), now(), now(), 0, false, substring(sha256(int8send(i)) FROM 1 \
                   FOR 8), 't' || (i % 100), 'receipt', '\\x00' \
                 FROM generate_series(10, {n}, 10) AS i"
            ))
            .await
            .unwrap();
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = durable::connect(&url).await;
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await;
            });
        })
        .join();
    }
}

/// The server itself (a concurrent index build behind the pooler works too,
/// but the test's own session lock needs one connection).
fn direct_url() -> Option<String> {
    let url = database_url()?;
    Some(
        std::env::var("IDEM_TEST_DIRECT_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or(url),
    )
}

/// From every earlier layout (none, and each shipped migration), with
/// records in it and three starters at once, `migrate` ends in the schema
/// the shipped files make, every migration recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_migrations_end_in_the_shipped_schema_from_every_layout() {
    let Some(url) = database_url() else { return };
    let shipped = shipped();
    let latest = shipped.last().unwrap().0;
    let reference = Schema::new(&url, "shipped").await;
    reference.apply_shipped(latest).await;
    let expected = reference.catalog().await;
    let all: Vec<i32> = shipped.iter().map(|(v, _)| *v).collect();
    for layout in std::iter::once(0).chain(all.iter().copied().filter(|v| *v < latest)) {
        let schema = Schema::new(&url, "online").await;
        schema.apply_shipped(layout).await;
        if layout == 5 || layout == 6 {
            schema.fill(1000).await;
        }
        let starters: Vec<_> = (0..3)
            .map(|_| {
                let store = schema.store().build().unwrap();
                tokio::spawn(async move { store.migrate().await })
            })
            .collect();
        for starter in starters {
            starter.await.unwrap().unwrap();
        }
        assert_eq!(
            schema.catalog().await,
            expected,
            "migrated online from layout {layout}"
        );
        assert_eq!(schema.versions().await, all, "from layout {layout}");
    }
}

/// A concurrent index build cut off leaves an INVALID index under the
/// migration's name; the next `migrate` drops it and builds the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_build_cut_off_is_built_again() {
    let Some(url) = direct_url() else { return };
    let shipped = shipped();
    let latest = shipped.last().unwrap().0;
    let reference = Schema::new(&url, "shipped").await;
    reference.apply_shipped(latest).await;

    let schema = Schema::new(&url, "cutoff").await;
    schema.apply_shipped(5).await;
    schema.fill(1000).await;
    // As a build cut off would leave it: a concurrent build that failed
    // (here on duplicate tenants) keeps its INVALID index.
    let failed = schema
        .client
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY idem_records_retain_until ON {}.idem_records \
             (tenant)",
            schema.quoted()
        ))
        .await;
    assert!(failed.is_err());
    assert!(schema
        .catalog()
        .await
        .iter()
        .any(|l| l.contains("idem_records_retain_until") && l.contains("valid=f")));

    schema.store().build().unwrap().migrate().await.unwrap();
    assert_eq!(schema.catalog().await, reference.catalog().await);
}

/// Holds an ACCESS SHARE lock on a table (a long report, a `pg_dump`) in a
/// transaction of its own until dropped.
async fn hold_a_reader(url: &str, table: &str) -> tokio_postgres::Client {
    let reader = durable::connect(url).await;
    reader
        .batch_execute(&format!("BEGIN; SELECT count(*) FROM {table}"))
        .await
        .unwrap();
    reader
}

/// A migration's change that waits for a table's lock (here behind a long
/// reader of idem_jobs) gives way to the writes queued behind it within the
/// lock timeout, a quarter of the store's timeout, and is tried again until
/// it gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_waits_behind_a_migration_longer_than_the_lock_timeout() {
    let Some(url) = direct_url() else { return };
    // Migration 7 changes idem_jobs (a column added, one renamed).
    let schema = Schema::new(&url, "locks").await;
    schema.apply_shipped(6).await;
    schema.fill(1000).await;
    let jobs = format!("{}.idem_jobs", schema.quoted());
    let reader = hold_a_reader(&url, &jobs).await;

    // Timeout 2 s: the lock timeout is 500 ms. (A migration that took
    // its lock and held the writes behind it would end at 30 s.)
    let store = schema
        .store()
        .timeout(Duration::from_secs(2))
        .migrate_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let started = Instant::now();
    let migrating = tokio::spawn(async move { store.migrate().await });
    let writer = durable::connect(&url).await;
    let mut longest = Duration::ZERO;
    let mut writes = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let write = Instant::now();
        writer
            .execute(
                &format!(
                    "INSERT INTO {jobs} (next_run_at, created_at, updated_at, attempts, dead, \
                     reference, tenant, name, payload) \
                     VALUES (now(), now(), now(), 0, false, '\\x0102030405060708', 'w', $1, \
                     '\\x00')"
                ),
                &[&format!("write-{writes}")],
            )
            .await
            .unwrap();
        longest = longest.max(write.elapsed());
        writes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !migrating.is_finished(),
        "the reader holds the migration off"
    );
    drop(reader);
    migrating.await.unwrap().unwrap();
    assert!(
        longest < Duration::from_millis(1500),
        "a write waited {longest:?} behind the migration ({writes} writes)"
    );
    assert!(writes > 20, "{writes} writes in 4 s");
    assert!(schema.versions().await.contains(&7));
}

/// `migrate_timeout` bounds the whole migration, the waits for a lock
/// included; what runs out is `Unavailable`, says what to do, and the next
/// `migrate` finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_timeout_bounds_the_migration() {
    let Some(url) = direct_url() else { return };
    let schema = Schema::new(&url, "bounded").await;
    schema.apply_shipped(6).await;
    let reader = hold_a_reader(&url, &format!("{}.idem_jobs", schema.quoted())).await;
    let store = schema
        .store()
        .timeout(Duration::from_secs(2))
        .migrate_timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = store.migrate().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("migrate_timeout")
            && m.contains("run migrate() again")),
        "{err}"
    );

    // The store URL's migrate_timeout= is the builder's.
    let url_of = format!(
        "{}{}schema={}&migrate=true&migrate_timeout=0.5",
        url,
        if url.contains('?') { '&' } else { '?' },
        schema.name
    );
    let started = Instant::now();
    let err = idem_runtime::open_store(&url_of).await.err().unwrap();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1400));
    assert_eq!(schema.versions().await.last(), Some(&6));

    drop(reader);
    store.migrate().await.unwrap();
    assert!(schema.versions().await.contains(&7));
}
