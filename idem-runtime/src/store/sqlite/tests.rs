//! The writer's batches: their durability, and all or nothing.

use super::*;
use crate::store::conformance::{again, claim_request};

/// `PRAGMA synchronous` as the batch that runs this probe sees it (1
/// NORMAL, 2 FULL); the probe itself is relaxed, so it leaves the batch's
/// durability to the others.
async fn probe(store: &SqliteStore) -> i64 {
    store
        .run_as(true, false, |conn, _| {
            conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
                .map_err(|e| unavailable(&e))
        })
        .await
        .unwrap()
}

/// Holds the writer, then sends `first` and `second` (each may be
/// `None`) and the probe, which then share one batch: the probe's answer.
async fn batch_of(
    store: &SqliteStore,
    claim: Option<&ClaimRequest>,
    complete: Option<&ClaimRequest>,
) -> i64 {
    let blocker = store.run(|_, _| {
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    });
    let (_, _, _, seen) = tokio::join!(
        blocker,
        async {
            if let Some(req) = claim {
                tokio::time::sleep(Duration::from_millis(30)).await;
                store.claim(req).await.unwrap();
            }
        },
        async {
            if let Some(req) = complete {
                tokio::time::sleep(Duration::from_millis(60)).await;
                store
                    .complete(&req.key, req.attempt, "\"ok\"")
                    .await
                    .unwrap();
            }
        },
        async {
            tokio::time::sleep(Duration::from_millis(90)).await;
            probe(store).await
        },
    );
    seen
}

/// A batch of completions only commits with NORMAL; one claim in the
/// batch makes it FULL; and without relaxed completions every batch is
/// FULL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_batch_of_completions_is_relaxed() {
    const NORMAL: i64 = 1;
    const FULL: i64 = 2;
    let dir = std::env::temp_dir().join(format!("idem-sync-{}", Attempt::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    for relaxed in [true, false] {
        let store = SqliteStore::builder()
            .relaxed_completions(relaxed)
            .open(dir.join(format!("{relaxed}.sqlite3")))
            .await
            .unwrap();
        let claimed = |req: &ClaimRequest| {
            let (store, req) = (store.clone(), req.clone());
            async move {
                assert!(matches!(
                    store.claim(&req).await.unwrap(),
                    Claim::Claimed { .. }
                ))
            }
        };
        let (a, b, c) = (
            claim_request(Duration::from_secs(900)),
            claim_request(Duration::from_secs(900)),
            claim_request(Duration::from_secs(900)),
        );
        claimed(&a).await;
        claimed(&b).await;
        assert_eq!(probe(&store).await, NORMAL, "a probe alone is relaxed");
        let completions = batch_of(&store, None, Some(&a)).await;
        let mixed = batch_of(&store, Some(&c), Some(&b)).await;
        assert_eq!(mixed, FULL, "a claim beside a completion commits with FULL");
        if relaxed {
            assert_eq!(completions, NORMAL, "completions alone commit with NORMAL");
        } else {
            assert_eq!(completions, FULL, "relaxed_completions(false): FULL");
        }
        // A claim alone after that: FULL again.
        let d = claim_request(Duration::from_secs(900));
        let after = batch_of(&store, Some(&d), None).await;
        assert_eq!(
            after, FULL,
            "a claim after a relaxed batch commits with FULL"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A batch in which SQLite fails one statement (here: the database is
/// full) writes nothing, and every item of it is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_all_or_nothing() {
    let dir = std::env::temp_dir().join(format!("idem-batch-{}", Attempt::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
    let held = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&held).await.unwrap(),
        Claim::Claimed { .. }
    ));
    // No room for a large response: the database may not grow any more.
    store
        .run(|conn, _| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(|e| unavailable(&e))?;
            conn.pragma_update(None, "max_page_count", pages + 2)
                .map_err(|e| unavailable(&e))
        })
        .await
        .unwrap();

    // Hold the writer so that the next three jobs form one batch.
    let blocker = store.run(|_, _| {
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    });
    let (first, big, last) = (
        claim_request(Duration::from_secs(900)),
        "x".repeat(1 << 20),
        claim_request(Duration::from_secs(900)),
    );
    let (_, a, b, c) = tokio::join!(
        blocker,
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store.claim(&first).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.complete(&held.key, held.attempt, &big).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            store.claim(&last).await
        },
    );
    assert!(matches!(b, Err(StoreError::Unavailable(_))), "{b:?}");
    assert!(matches!(a, Err(StoreError::Unavailable(_))), "{a:?}");
    assert!(matches!(c, Err(StoreError::Unavailable(_))), "{c:?}");
    for req in [&first, &last] {
        assert_eq!(
            store.lookup(&req.tenant, &req.reference).await.unwrap(),
            None,
            "nothing of the failed batch was written"
        );
    }
    let kept = store
        .lookup(&held.tenant, &held.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.state, crate::store::RecordState::InProgress);
    // The store goes on serving once the statement fits.
    assert!(matches!(
        store.claim(&again(&first)).await.unwrap(),
        Claim::Claimed { .. }
    ));
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
