//! What the durable store tests share: fresh stores, keys, and the checks
//! specific to durable stores (the conformance suite covers the contract).
#![allow(dead_code)]

use std::time::Duration;

use idem_runtime::{
    Attempt, Claim, ClaimRequest, IdempotencyKey, IdempotencyStore, PostgresStore, RecordState,
    StoreError,
};
use sha2::{Digest, Sha256};

/// A key nobody else uses.
pub fn fresh_key() -> IdempotencyKey {
    let seed = Attempt::random().0.to_le_bytes();
    let key: [u8; 32] = Sha256::digest(seed).into();
    let fp: [u8; 32] = Sha256::digest(key).into();
    IdempotencyKey::from_parts(key, fp)
}

/// A claim of `key` with the given lease and window (retention = window).
pub fn request(key: IdempotencyKey, lease: Duration, window: Duration) -> ClaimRequest {
    ClaimRequest {
        key,
        tenant: "acme".into(),
        tool: "charge".into(),
        attempt: Attempt::random(),
        lease,
        window,
        retention: window,
    }
}

/// A fresh temporary directory, removed (with its files) when dropped.
#[derive(Debug)]
pub struct TempDir(std::path::PathBuf);

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{:016x}", Attempt::random().0));
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
        let name = format!("t_{:016x}", Attempt::random().0);
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

/// An expired record is taken over; lapsed and unknown records are listed;
/// purge deletes what is expired and nothing else.
pub async fn expiry_sweep_and_purge(store: &dyn IdempotencyStore) {
    let short = Duration::from_millis(200);
    let (done, lapsed, live) = (fresh_key(), fresh_key(), fresh_key());
    let d = request(done, short, short);
    store.claim(&d).await.unwrap();
    store.complete(&done, d.attempt, "1").await.unwrap();
    let l = request(lapsed, short, Duration::from_secs(60));
    store.claim(&l).await.unwrap();
    let v = request(live, Duration::from_secs(60), Duration::from_secs(60));
    store.claim(&v).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let listed = store.list_lapsed(1000).await.unwrap();
    assert!(listed.iter().any(|r| r.key == lapsed));
    assert!(!listed.iter().any(|r| r.key == live || r.key == done));
    store
        .mark_unknown(&lapsed, l.attempt, "lease ran out")
        .await
        .unwrap();
    let unknown = store.list_unknown(1000).await.unwrap();
    assert!(unknown.iter().any(|r| r.key == lapsed
        && r.state
            == RecordState::Unknown {
                note: "lease ran out".into()
            }));

    // The completed record's window ended: a new claim takes it over.
    let again = request(done, short, short);
    assert_eq!(store.claim(&again).await.unwrap(), Claim::Claimed);
    assert!(matches!(
        store.complete(&done, d.attempt, "stale").await,
        Err(StoreError::Fenced)
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Lease and window of the new claim ran out: IN_PROGRESS, expired.
    let mut purged = 0;
    loop {
        let n = store.purge_expired(1).await.unwrap();
        purged += n;
        if n < 1 {
            break;
        }
    }
    assert!(purged >= 1);
    assert_eq!(store.lookup("acme", &done.reference()).await.unwrap(), None);
    assert!(store
        .lookup("acme", &lapsed.reference())
        .await
        .unwrap()
        .is_some());
    assert!(store
        .lookup("acme", &live.reference())
        .await
        .unwrap()
        .is_some());
    store.release(&live, v.attempt).await.unwrap();
    assert_eq!(store.lookup("acme", &live.reference()).await.unwrap(), None);
}
