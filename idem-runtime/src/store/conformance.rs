//! The store conformance suite: every `IdempotencyStore` must pass every case.
//!
//! Each case is a plain async function over `&dyn IdempotencyStore` that uses
//! fresh random keys and tenants, so cases can share one store and run in
//! parallel. A backend's test file calls [`run_all`] or the cases one by one.
#![allow(dead_code)]

use std::time::Duration;

use futures::future::join_all;
use idem_runtime::{
    Attempt, Claim, ClaimRequest, IdempotencyKey, IdempotencyStore, Record, RecordState, StoreError,
};

fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&Attempt::random().0.to_le_bytes());
    }
    b
}

/// A claim request for a fresh key in a fresh tenant.
pub fn fresh(window: Duration) -> ClaimRequest {
    ClaimRequest {
        key: IdempotencyKey::from_parts(random32(), random32()),
        tenant: format!("tenant-{}", Attempt::random().0),
        tool: "charge_card".to_owned(),
        attempt: Attempt::random(),
        lease: Duration::from_secs(30),
        window,
        retention: Duration::from_secs(3600),
    }
}

fn again(req: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        attempt: Attempt::random(),
        ..req.clone()
    }
}

async fn record(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Option<Record> {
    store
        .lookup(&req.tenant, &req.key.reference())
        .await
        .expect("lookup")
}

async fn existing(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Record {
    match store.claim(req).await.expect("claim") {
        Claim::Existing { record, .. } => record,
        Claim::Claimed => panic!("expected the existing record, but the claim succeeded"),
    }
}

async fn claimed(store: &dyn IdempotencyStore, req: &ClaimRequest) {
    match store.claim(req).await.expect("claim") {
        Claim::Claimed => {}
        Claim::Existing { record, .. } => panic!("expected a claim, found {record:?}"),
    }
}

const W: Duration = Duration::from_secs(900);

/// A claim on an absent key creates an IN_PROGRESS record owned by its attempt.
pub async fn claim_creates_in_progress(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let r = record(store, &req).await.expect("the claimed record");
    assert_eq!(r.state, RecordState::InProgress);
    assert_eq!(r.attempt, req.attempt);
    assert_eq!(r.tenant, req.tenant);
    assert_eq!(r.tool, req.tool);
    assert_eq!(r.key, req.key);
    assert!(r.lease_until > r.claimed_at);
    assert!(r.expires_at > r.claimed_at);
    assert!(r.retain_until >= r.expires_at);
}

/// A second claim of a live key changes nothing and returns the first owner's record.
pub async fn claim_of_live_record_returns_it(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let second = again(&req);
    let r = existing(store, &second).await;
    assert_eq!(
        r.attempt, req.attempt,
        "the first claim still owns the record"
    );
    assert_eq!(r.state, RecordState::InProgress);
    // The loser cannot complete it.
    assert!(matches!(
        store.complete(&req.key, second.attempt, "{}").await,
        Err(StoreError::Fenced)
    ));
}

/// Of 32 concurrent claims of one key, exactly one succeeds.
pub async fn concurrent_claims_have_one_winner(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    let reqs: Vec<ClaimRequest> = (0..32).map(|_| again(&req)).collect();
    let outcomes = join_all(reqs.iter().map(|r| store.claim(r))).await;
    let winners: Vec<&ClaimRequest> = outcomes
        .iter()
        .zip(&reqs)
        .filter(|(o, _)| matches!(o, Ok(Claim::Claimed)))
        .map(|(_, r)| r)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one claim wins: {outcomes:?}");
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.attempt, winners[0].attempt);
}

/// complete stores the response byte for byte; later claims see COMPLETED.
pub async fn complete_then_claim_returns_response(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let response = r#"{"content":[{"type":"text","text":"charged \u00e9 5"}],"z":1,"a":[3,1]}"#;
    store
        .complete(&req.key, req.attempt, response)
        .await
        .unwrap();
    let r = existing(store, &again(&req)).await;
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: response.to_owned()
        }
    );
}

/// release deletes the record, so the next claim runs.
pub async fn release_lets_next_claim_run(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store.release(&req.key, req.attempt).await.unwrap();
    assert!(record(store, &req).await.is_none());
    claimed(store, &again(&req)).await;
}

/// mark_unknown keeps the record, UNKNOWN with its note; repeats see it.
pub async fn mark_unknown_keeps_record(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "processor timed out")
        .await
        .unwrap();
    let r = existing(store, &again(&req)).await;
    assert_eq!(
        r.state,
        RecordState::Unknown {
            note: "processor timed out".to_owned()
        }
    );
    let listed = store.list_unknown(10_000).await.unwrap();
    assert!(listed.iter().any(|l| l.key == req.key));
}

/// A stale attempt can neither complete, release, mark nor renew the record.
pub async fn stale_attempt_is_fenced(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let stale = Attempt::random();
    assert!(matches!(
        store.complete(&req.key, stale, "{}").await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.release(&req.key, stale).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.mark_unknown(&req.key, stale, "x").await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.heartbeat(&req.key, stale, W).await,
        Err(StoreError::Fenced)
    ));
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.state, RecordState::InProgress);
    assert_eq!(r.attempt, req.attempt);
    // And on a key that does not exist at all.
    let absent = fresh(W);
    assert!(matches!(
        store.complete(&absent.key, absent.attempt, "{}").await,
        Err(StoreError::Fenced)
    ));
}

/// complete by the current attempt is accepted from UNKNOWN (a slow handler's truth).
pub async fn complete_accepted_from_unknown(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "lease ran out")
        .await
        .unwrap();
    store
        .complete(&req.key, req.attempt, "\"late truth\"")
        .await
        .unwrap();
    let r = record(store, &req).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "\"late truth\"".to_owned()
        }
    );
}

/// A COMPLETED record can be neither completed again, released nor marked.
pub async fn completed_record_is_final(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store.complete(&req.key, req.attempt, "1").await.unwrap();
    assert!(matches!(
        store.complete(&req.key, req.attempt, "2").await,
        Err(StoreError::WrongState { .. })
    ));
    assert!(matches!(
        store.release(&req.key, req.attempt).await,
        Err(StoreError::WrongState { .. })
    ));
    assert!(matches!(
        store.mark_unknown(&req.key, req.attempt, "x").await,
        Err(StoreError::WrongState { .. })
    ));
    let r = record(store, &req).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "1".to_owned()
        }
    );
}

/// Once its window ends, a COMPLETED record is taken over by a new claim, and
/// the old attempt is fenced out.
pub async fn expired_completed_record_is_taken_over(store: &dyn IdempotencyStore) {
    let req = fresh(Duration::from_millis(300));
    claimed(store, &req).await;
    store.complete(&req.key, req.attempt, "1").await.unwrap();
    // Within the window: a repeat collides.
    let r = existing(store, &again(&req)).await;
    assert!(matches!(r.state, RecordState::Completed { .. }));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let next = again(&req);
    claimed(store, &next).await;
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.state, RecordState::InProgress);
    assert_eq!(r.attempt, next.attempt);
    assert!(matches!(
        store.release(&req.key, req.attempt).await,
        Err(StoreError::Fenced)
    ));
}

/// An UNKNOWN record is not taken over when its window ends: it must be
/// reconciled first (or its retention end).
pub async fn unknown_record_outlives_window(store: &dyn IdempotencyStore) {
    let req = fresh(Duration::from_millis(200));
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let r = existing(store, &again(&req)).await;
    assert!(matches!(r.state, RecordState::Unknown { .. }));
    store.purge_expired(100_000).await.unwrap();
    assert!(
        record(store, &req).await.is_some(),
        "purge kept the UNKNOWN record"
    );
}

/// An IN_PROGRESS record whose lease ran out is listed as lapsed and is not
/// taken over, even after its window.
pub async fn lapsed_lease_is_listed_not_taken_over(store: &dyn IdempotencyStore) {
    let mut req = fresh(Duration::from_millis(150));
    req.lease = Duration::from_millis(150);
    claimed(store, &req).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = existing(store, &again(&req)).await;
    assert_eq!(r.state, RecordState::InProgress);
    assert_eq!(r.attempt, req.attempt);
    let lapsed = store.list_lapsed(100_000).await.unwrap();
    assert!(lapsed.iter().any(|l| l.key == req.key));
    // The sweep's move: the owner's attempt (from the listed record) marks it.
    store
        .mark_unknown(&req.key, r.attempt, "lease ran out")
        .await
        .unwrap();
    let lapsed = store.list_lapsed(100_000).await.unwrap();
    assert!(!lapsed.iter().any(|l| l.key == req.key));
}

/// A heartbeat extends the lease, so a live handler is not listed as lapsed.
pub async fn heartbeat_extends_lease(store: &dyn IdempotencyStore) {
    let mut req = fresh(W);
    req.lease = Duration::from_millis(200);
    claimed(store, &req).await;
    store
        .heartbeat(&req.key, req.attempt, Duration::from_secs(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let lapsed = store.list_lapsed(100_000).await.unwrap();
    assert!(!lapsed.iter().any(|l| l.key == req.key));
    let r = record(store, &req).await.unwrap();
    assert!(r.lease_until > r.claimed_at + Duration::from_secs(20));
    // A heartbeat on a finished record is refused.
    store.complete(&req.key, req.attempt, "1").await.unwrap();
    assert!(matches!(
        store.heartbeat(&req.key, req.attempt, W).await,
        Err(StoreError::WrongState { .. })
    ));
}

/// A reference is found only in its own tenant.
pub async fn lookup_is_scoped_to_tenant(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    assert!(record(store, &req).await.is_some());
    let other = store
        .lookup("some-other-tenant", &req.key.reference())
        .await
        .unwrap();
    assert!(other.is_none(), "another tenant's reference is not found");
}

/// The store returns the first claim's fingerprint, so the executor can see a
/// business key reused with other arguments.
pub async fn existing_record_keeps_its_fingerprint(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let other_args = ClaimRequest {
        key: IdempotencyKey::from_parts(*req.key.as_bytes(), random32()),
        ..again(&req)
    };
    let r = existing(store, &other_args).await;
    assert_eq!(r.key.fingerprint(), req.key.fingerprint());
    assert_ne!(r.key.fingerprint(), other_args.key.fingerprint());
}

/// purge deletes expired COMPLETED records in batches and keeps live ones.
pub async fn purge_deletes_expired_in_batches(store: &dyn IdempotencyStore) {
    let short: Vec<ClaimRequest> = (0..5).map(|_| fresh(Duration::from_millis(100))).collect();
    let live = fresh(W);
    for req in &short {
        claimed(store, req).await;
        store.complete(&req.key, req.attempt, "1").await.unwrap();
    }
    claimed(store, &live).await;
    store.complete(&live.key, live.attempt, "1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Other cases may share the store: purge until ours are gone, in batches of 2.
    let mut rounds = 0;
    loop {
        let n = store.purge_expired(2).await.unwrap();
        assert!(n <= 2, "a batch never exceeds its size");
        rounds += 1;
        if n < 2 || rounds > 10_000 {
            break;
        }
    }
    for req in &short {
        assert!(record(store, req).await.is_none(), "expired record purged");
    }
    assert!(record(store, &live).await.is_some(), "live record kept");
}

/// Runs every case, one after the other.
pub async fn run_all(store: &dyn IdempotencyStore) {
    claim_creates_in_progress(store).await;
    claim_of_live_record_returns_it(store).await;
    concurrent_claims_have_one_winner(store).await;
    complete_then_claim_returns_response(store).await;
    release_lets_next_claim_run(store).await;
    mark_unknown_keeps_record(store).await;
    stale_attempt_is_fenced(store).await;
    complete_accepted_from_unknown(store).await;
    completed_record_is_final(store).await;
    expired_completed_record_is_taken_over(store).await;
    unknown_record_outlives_window(store).await;
    lapsed_lease_is_listed_not_taken_over(store).await;
    heartbeat_extends_lease(store).await;
    lookup_is_scoped_to_tenant(store).await;
    existing_record_keeps_its_fingerprint(store).await;
    purge_deletes_expired_in_batches(store).await;
}

/// Declares one `#[tokio::test]` per case. `$make` is an expression, evaluated
/// inside the async test (it may `.await`), giving `Option<impl Deref<Target =
/// impl IdempotencyStore>>`: `None` when the backend is not available here and
/// the backend's test file has already said why.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            claim_creates_in_progress,
            claim_of_live_record_returns_it,
            concurrent_claims_have_one_winner,
            complete_then_claim_returns_response,
            release_lets_next_claim_run,
            mark_unknown_keeps_record,
            stale_attempt_is_fenced,
            complete_accepted_from_unknown,
            completed_record_is_final,
            expired_completed_record_is_taken_over,
            unknown_record_outlives_window,
            lapsed_lease_is_listed_not_taken_over,
            heartbeat_extends_lease,
            lookup_is_scoped_to_tenant,
            existing_record_keeps_its_fingerprint,
            purge_deletes_expired_in_batches,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(store) = $make else { return };
                conformance::$case(&*store).await;
            }
        )*
    };
}
