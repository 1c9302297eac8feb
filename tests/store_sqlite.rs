//! SqliteStore: the conformance suite, and what only a durable file store has.

mod conformance;
mod durable;

use std::time::Duration;

use durable::{fresh_key, request, temp_dir};
use idem_runtime::{Claim, IdempotencyStore, RecordState, SqliteStore};

/// A store on a file in a directory of its own, removed after the test.
struct TempSqlite {
    store: SqliteStore,
    _dir: durable::TempDir,
}

impl std::ops::Deref for TempSqlite {
    type Target = SqliteStore;

    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

async fn store() -> TempSqlite {
    let dir = temp_dir("sqlite");
    let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
    TempSqlite { store, _dir: dir }
}

conformance_tests!(Some(store().await));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    conformance::run_all(&*store().await).await;
}

#[tokio::test]
async fn expiry_sweep_and_purge() {
    durable::expiry_sweep_and_purge(&*store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_passes_too() {
    conformance::run_all(&SqliteStore::open_in_memory().await.unwrap()).await;
}

/// A record outlives the store that wrote it: reopen the file and find it.
#[tokio::test]
async fn records_survive_reopening() {
    let dir = temp_dir("reopen");
    let path = dir.join("idem.sqlite3");
    let key = fresh_key();
    let req = request(key, Duration::from_secs(30), Duration::from_secs(60));
    {
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.claim(&req).await.unwrap(), Claim::Claimed);
        store.complete(&key, req.attempt, "\"paid\"").await.unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    match store
        .claim(&request(
            key,
            Duration::from_secs(30),
            Duration::from_secs(60),
        ))
        .await
    {
        Ok(Claim::Existing { record, .. }) => assert_eq!(
            record.state,
            RecordState::Completed {
                response: "\"paid\"".into()
            }
        ),
        other => panic!("{other:?}"),
    }
}

/// Two stores (two writer threads, as two processes would have) on one file
/// still let exactly one claim win.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_yield_one_winner() {
    let dir = temp_dir("two");
    let path = dir.join("idem.sqlite3");
    let (a, b) = (
        SqliteStore::open(&path).await.unwrap(),
        SqliteStore::open(&path).await.unwrap(),
    );
    for _ in 0..20 {
        let key = fresh_key();
        let (ra, rb) = (
            request(key, Duration::from_secs(30), Duration::from_secs(60)),
            request(key, Duration::from_secs(30), Duration::from_secs(60)),
        );
        let (x, y) = tokio::join!(a.claim(&ra), b.claim(&rb));
        let won = [x.unwrap(), y.unwrap()]
            .iter()
            .filter(|c| **c == Claim::Claimed)
            .count();
        assert_eq!(won, 1);
    }
}
