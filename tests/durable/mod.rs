//! What the durable store tests share: fresh stores, keys, and the checks
//! specific to durable stores (the conformance suite covers the contract).
#![allow(dead_code)]

use std::time::Duration;

use idem_runtime::conformance::claim_request;
use idem_runtime::{Attempt, ClaimRequest, PostgresStore};

/// A claim of a fresh key in a fresh tenant with this lease and window
/// (retention = window).
pub fn request(lease: Duration, window: Duration) -> ClaimRequest {
    ClaimRequest {
        lease,
        window,
        retention: window,
        ..claim_request(window)
    }
}

/// A PostgreSQL connection of the test's own, beside the store's pool.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(conn);
    client
}

/// A fresh temporary directory, removed (with its files) when dropped.
#[derive(Debug)]
pub struct TempDir(std::path::PathBuf);

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{:016x}", Attempt::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Postgres server the tests use, from `IDEM_TEST_DATABASE_URL`. `None`
/// (after saying so on stderr) when it is unset outside CI; under `CI=true` a
/// missing variable is a failure.
pub fn database_url() -> Option<String> {
    match std::env::var("IDEM_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "IDEM_TEST_DATABASE_URL is not set, and CI=true: the PostgresStore tests \
             need a server (e.g. postgres://postgres@127.0.0.1:5432/test)"
        ),
        _ => {
            // Straight to the process's stderr: the test harness captures
            // eprintln! of passing tests, and a skip must be seen.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the PostgresStore tests did not run: IDEM_TEST_DATABASE_URL is \
                     not set. Set it to a server the tests may create schemas in, e.g. \
                     IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
                );
            });
            None
        }
    }
}

/// A PostgresStore in a fresh schema of its own, migrated; the schema is
/// dropped when this is dropped (also when the test panicked).
#[derive(Debug)]
pub struct PgSchema {
    pub store: PostgresStore,
    pub url: String,
    pub name: String,
}

impl PgSchema {
    /// `None` when the tests are skipped (see [`database_url`]).
    pub async fn new() -> Option<PgSchema> {
        let url = database_url()?;
        let name = format!("t_{:016x}", Attempt::random().get());
        Some(Self::open(&url, &name).await)
    }

    /// A store on an existing (or new) schema, migrated.
    pub async fn open(url: &str, name: &str) -> PgSchema {
        let store = PostgresStore::builder(url)
            .unwrap()
            .schema(name)
            .build()
            .unwrap();
        if let Err(e) = store.migrate().await {
            panic!("the Postgres server at IDEM_TEST_DATABASE_URL={url} is not usable: {e}");
        }
        PgSchema {
            store,
            url: url.into(),
            name: name.into(),
        }
    }
}

impl std::ops::Deref for PgSchema {
    type Target = PostgresStore;

    fn deref(&self) -> &PostgresStore {
        &self.store
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // On a thread of its own: Drop may run inside a runtime, which must
        // not be blocked on, and also after a panic.
        let (url, name) = (self.url.clone(), self.name.clone());
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
