//! The store conformance suite: every [`IdempotencyStore`] must pass every
//! case, and a store of your own can run the same cases.
//!
//! Each case is a plain async function over `&dyn IdempotencyStore` that uses
//! fresh random keys and tenants, so cases can share one store and run in
//! parallel. Run them all with [`run_all`], or one test per case with
//! [`conformance_tests!`](crate::conformance_tests):
//!
//! ```ignore
//! // tests/my_store.rs, with idem-runtime's `conformance` feature on
//! idem_runtime::conformance_tests!(Some(my_store().await));
//! ```
//!
//! The expression is evaluated inside each test (it may `.await`) and gives
//! `Option<S>` where `S` derefs to a store (`Arc<MyStore>`, a guard that drops
//! a schema, ...); `None` skips the case, for a backend that is not
//! available here: say why on stderr, and fail instead under `CI=true`.
//!
//! The cases come in two lists: the records' ([`RECORD_CASES`]) and the
//! outbox's, for follow-on jobs ([`OUTBOX_CASES`]). A store that keeps no
//! follow-on jobs yet writes `conformance_tests!(make; outbox pending)`:
//! each outbox test then passes only while its case fails with
//! `Unsupported` (it says `PENDING` on stderr) and fails once the case
//! passes, so the mark goes when the work is done.
//!
//! Beside the cases: [`claim_request`] and [`again`] build requests, and
//! [`FaultyStore`] wraps a store to inject faults.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Attempt, Claim, ClaimRequest, FollowOn, FollowOnStore, IdempotencyStore, JobFilter, JobId,
    OutboxJob, Reading, Record, RecordFilter, RecordState, RecordStateKind, Resolution,
    StateCounts, StoreError,
};
use crate::key::{IdempotencyKey, Reference};

fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&Attempt::random().get().to_le_bytes());
    }
    b
}

/// Restarts this thread's sequence of attempts and reference tags from
/// `seed`, so that a simulation on a single-threaded runtime draws the same
/// tokens and references every time it replays a schedule. For tests only:
/// two threads seeded alike draw the same values.
pub fn seed_this_thread(seed: u64) {
    super::seed_this_thread(seed);
}

/// A claim request for a fresh random key in a fresh tenant, as the executor
/// makes one: a 30 s lease, `window`, and a retention of at least an hour.
pub fn claim_request(window: Duration) -> ClaimRequest {
    let key = IdempotencyKey::from_parts(random32(), random32());
    ClaimRequest {
        key,
        reference: Reference::new_operation(&key),
        tenant: format!("tenant-{}", Attempt::random().get()),
        tool: "charge_card".to_owned(),
        attempt: Attempt::random(),
        lease: Duration::from_secs(30),
        window,
        retention: window.max(Duration::from_secs(3600)),
    }
}

/// The same operation claimed again, with a new attempt. It offers the same
/// reference, so a lookup by `req.reference` finds the record whichever
/// claim holds it; [`new_operation`] offers another, as the executor does
/// for every call.
pub fn again(req: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        attempt: Attempt::random(),
        ..req.clone()
    }
}

/// The same key claimed again by another call: a new attempt offering a new
/// reference, as the executor's every claim does.
pub fn new_operation(req: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        attempt: Attempt::random(),
        reference: Reference::new_operation(&req.key),
        ..req.clone()
    }
}

fn fresh(window: Duration) -> ClaimRequest {
    claim_request(window)
}

/// Polls every future to completion on the current task, as
/// `futures::future::join_all` does (the cases borrow the store, so they
/// cannot be spawned).
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (fut, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|o| o.expect("polled to completion"))
        .collect()
}

async fn record(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Option<Record> {
    store
        .lookup(&req.tenant, &req.reference)
        .await
        .expect("lookup")
}

async fn existing(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Record {
    match store.claim(req).await.expect("claim") {
        Claim::Existing { record, .. } => record,
        Claim::Claimed { .. } => panic!("expected the existing record, but the claim succeeded"),
    }
}

/// Claims `req`, which must win; the reference the operation runs under.
async fn claimed(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Reference {
    match store.claim(req).await.expect("claim") {
        Claim::Claimed { reference } => reference,
        Claim::Existing { record, .. } => panic!("expected a claim, found {record:?}"),
    }
}

/// The window of most cases.
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
        .filter(|(o, _)| matches!(o, Ok(Claim::Claimed { .. })))
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
        Err(StoreError::WrongState {
            found: RecordStateKind::Completed
        })
    ));
    assert!(matches!(
        store.release(&req.key, req.attempt).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::Completed
        })
    ));
    assert!(matches!(
        store.mark_unknown(&req.key, req.attempt, "x").await,
        Err(StoreError::WrongState {
            found: RecordStateKind::Completed
        })
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

/// A claim that creates the record runs under the reference it offered;
/// the record and every repeat answer with it, and a lookup finds it.
pub async fn claim_runs_under_the_offered_reference(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    assert_eq!(claimed(store, &req).await, req.reference);
    assert_eq!(record(store, &req).await.unwrap().reference, req.reference);
    // A repeat offers another reference and is answered with the first.
    let repeat = new_operation(&req);
    let r = existing(store, &repeat).await;
    assert_eq!(r.reference, req.reference);
    assert_eq!(
        store.lookup(&req.tenant, &repeat.reference).await.unwrap(),
        None,
        "a reference no operation ran under is not found"
    );
}

/// The same call after its window is a new operation: it runs under the new
/// reference it offered, and the earlier operation's reference no longer
/// finds anything (never the new operation's record).
pub async fn a_claim_after_the_window_is_a_new_operation(store: &dyn IdempotencyStore) {
    let first = fresh(Duration::from_millis(300));
    claimed(store, &first).await;
    store
        .complete(&first.key, first.attempt, "1")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let second = new_operation(&first);
    assert_eq!(
        claimed(store, &second).await,
        second.reference,
        "a new operation gets its own reference"
    );
    assert_ne!(second.reference, first.reference);
    let r = record(store, &second).await.unwrap();
    assert_eq!(r.reference, second.reference);
    assert_eq!(r.attempt, second.attempt);
    assert_eq!(
        store.lookup(&first.tenant, &first.reference).await.unwrap(),
        None,
        "the earlier operation's reference must not find the new one"
    );
    // A repeat within the new window is answered with the new reference.
    let r = existing(store, &new_operation(&first)).await;
    assert_eq!(r.reference, second.reference);
}

/// A NOT_PERFORMED record taken over within its window is the same
/// operation, tried again: it keeps its reference, so a processor still
/// dedupes a request of the first try that lands late.
pub async fn not_performed_within_the_window_keeps_its_reference(store: &dyn IdempotencyStore) {
    let first = fresh(W);
    claimed(store, &first).await;
    store
        .mark_unknown(&first.key, first.attempt, "timeout")
        .await
        .unwrap();
    let not_performed = Resolution::NotPerformed {
        note: "not at the processor",
        settle: Duration::ZERO,
    };
    store
        .resolve(&first.key, first.attempt, not_performed, None)
        .await
        .unwrap();
    let retry = new_operation(&first);
    assert_eq!(
        claimed(store, &retry).await,
        first.reference,
        "the takeover continues the first operation"
    );
    let r = record(store, &first).await.unwrap();
    assert_eq!(r.reference, first.reference);
    assert_eq!(r.attempt, retry.attempt);
    assert_eq!(r.state, RecordState::InProgress);
}

/// A NOT_PERFORMED record whose window has ended is taken over as a new
/// operation, under the new reference.
pub async fn not_performed_after_the_window_is_a_new_operation(store: &dyn IdempotencyStore) {
    let first = ClaimRequest {
        retention: Duration::from_secs(60),
        ..fresh(Duration::from_millis(200))
    };
    claimed(store, &first).await;
    store
        .mark_unknown(&first.key, first.attempt, "timeout")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let not_performed = Resolution::NotPerformed {
        note: "not at the processor",
        settle: Duration::ZERO,
    };
    store
        .resolve(&first.key, first.attempt, not_performed, None)
        .await
        .unwrap();
    let later = new_operation(&first);
    assert_eq!(claimed(store, &later).await, later.reference);
    assert_eq!(record(store, &later).await.unwrap().attempt, later.attempt);
}

/// A record read back reads to a caller by its state and its lease, judged
/// at the store's clock when it was read ([`Record::reading`]): running
/// while its lease holds, unknown once it lapsed, then as it was resolved.
pub async fn a_record_reads_by_its_state_and_lease(store: &dyn IdempotencyStore) {
    let mut req = fresh(W);
    req.lease = Duration::from_millis(200);
    claimed(store, &req).await;
    match record(store, &req).await.unwrap().reading() {
        Reading::Running { retry_after } => assert!(retry_after <= req.lease),
        other => panic!("a fresh claim reads as {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.state, RecordState::InProgress, "not swept yet");
    assert!(
        matches!(r.reading(), Reading::Unknown { lapsed: true, .. }),
        "a lapsed claim reads as unknown: {:?}",
        r.reading()
    );
    assert!(r.is_lapsed());
    store
        .complete(&req.key, req.attempt, "\"late\"")
        .await
        .unwrap();
    assert_eq!(
        record(store, &req).await.unwrap().reading(),
        Reading::Completed {
            response: "\"late\""
        }
    );

    let doubt = fresh(W);
    claimed(store, &doubt).await;
    store
        .mark_unknown(&doubt.key, doubt.attempt, "timeout")
        .await
        .unwrap();
    assert_eq!(
        record(store, &doubt).await.unwrap().reading(),
        Reading::Unknown {
            note: "timeout",
            lapsed: false
        }
    );
    let not_performed = Resolution::NotPerformed {
        note: "no such charge",
        settle: Duration::ZERO,
    };
    store
        .resolve(&doubt.key, doubt.attempt, not_performed, None)
        .await
        .unwrap();
    assert_eq!(
        record(store, &doubt).await.unwrap().reading(),
        Reading::NotPerformed {
            note: "no such charge"
        }
    );
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
        .lookup("some-other-tenant", &req.reference)
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

/// The sweep's mark re-checks the lease in the same step: a heartbeat that
/// lands between the listing and the mark keeps the record IN_PROGRESS.
pub async fn sweep_mark_rechecks_the_lease(store: &dyn IdempotencyStore) {
    let mut req = fresh(W);
    req.lease = Duration::from_millis(150);
    claimed(store, &req).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lapsed = store.list_lapsed(100_000).await.unwrap();
    assert!(lapsed.iter().any(|l| l.key == req.key), "listed as lapsed");
    // The live handler's heartbeat lands after the listing.
    store
        .heartbeat(&req.key, req.attempt, Duration::from_secs(30))
        .await
        .unwrap();
    let marked = store
        .mark_lapsed(&req.key, req.attempt, "lease ran out")
        .await
        .unwrap();
    assert!(!marked, "a renewed lease is not marked");
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.state, RecordState::InProgress);
    assert!(!r.is_lapsed());
    // Once the lease really ran out, the mark takes.
    store
        .heartbeat(&req.key, req.attempt, Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = record(store, &req).await.unwrap();
    assert!(r.is_lapsed(), "judged by the store's clock: {r:?}");
    assert!(store
        .mark_lapsed(&req.key, req.attempt, "lease ran out")
        .await
        .unwrap());
    let r = record(store, &req).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::Unknown {
            note: "lease ran out".into()
        }
    );
}

/// An UNKNOWN record is listed when its check is due, and a deferred one
/// only once its delay is over, so records nobody can resolve do not hide
/// the rest.
pub async fn unknown_records_are_listed_when_due(store: &dyn IdempotencyStore) {
    let (far, soon) = (fresh(W), fresh(W));
    for req in [&far, &soon] {
        claimed(store, req).await;
        store
            .mark_unknown(&req.key, req.attempt, "timeout")
            .await
            .unwrap();
    }
    let listed = store.list_unknown(100_000).await.unwrap();
    for req in [&far, &soon] {
        let r = listed
            .iter()
            .find(|l| l.key == req.key)
            .expect("due at once");
        assert_eq!(r.checks, 0);
    }
    store
        .defer_check(&far.key, far.attempt, Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .defer_check(&soon.key, soon.attempt, Duration::from_millis(150))
        .await
        .unwrap();
    let listed = store.list_unknown(100_000).await.unwrap();
    assert!(!listed.iter().any(|l| l.key == far.key || l.key == soon.key));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed = store.list_unknown(100_000).await.unwrap();
    assert!(!listed.iter().any(|l| l.key == far.key), "still deferred");
    let r = listed
        .iter()
        .find(|l| l.key == soon.key)
        .expect("due again");
    assert_eq!(r.checks, 1);
    // Only UNKNOWN records are deferred.
    let live = fresh(W);
    claimed(store, &live).await;
    assert!(matches!(
        store.defer_check(&live.key, live.attempt, W).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::InProgress
        })
    ));
    assert!(matches!(
        store.defer_check(&far.key, Attempt::random(), W).await,
        Err(StoreError::Fenced)
    ));
}

/// resolve turns an UNKNOWN record (and only one) COMPLETED, keeping the
/// note of who resolved it; repeats then replay the response.
pub async fn resolve_completed_from_unknown_only(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    let completed = Resolution::Completed {
        response: "\"found at the processor\"",
    };
    assert!(matches!(
        store.resolve(&req.key, req.attempt, completed, None).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::InProgress
        })
    ));
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    assert!(matches!(
        store
            .resolve(&req.key, Attempt::random(), completed, None)
            .await,
        Err(StoreError::Fenced)
    ));
    store
        .resolve(
            &req.key,
            req.attempt,
            completed,
            Some("ops/ana: checked the dashboard"),
        )
        .await
        .unwrap();
    let r = existing(store, &again(&req)).await;
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "\"found at the processor\"".into()
        }
    );
    assert_eq!(
        r.resolution.as_deref(),
        Some("ops/ana: checked the dashboard")
    );
    assert!(matches!(
        store.resolve(&req.key, req.attempt, completed, None).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::Completed
        })
    ));
}

/// "Not performed" is accepted only for a record unchanged for the settle
/// period; then the next claim takes the record over and runs.
pub async fn not_performed_waits_for_settle(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    let early = Resolution::NotPerformed {
        note: "the processor has no such charge",
        settle: Duration::from_secs(3600),
    };
    match store.resolve(&req.key, req.attempt, early, None).await {
        Err(StoreError::NotSettled { until }) => {
            let r = record(store, &req).await.unwrap();
            assert!(
                until >= r.updated_at + Duration::from_secs(3599),
                "{until:?}"
            );
            assert!(matches!(r.state, RecordState::Unknown { .. }), "unchanged");
        }
        other => panic!("expected NotSettled, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let settled = Resolution::NotPerformed {
        note: "the processor has no such charge",
        settle: Duration::from_millis(100),
    };
    store
        .resolve(&req.key, req.attempt, settled, None)
        .await
        .unwrap();
    let r = record(store, &req).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::NotPerformed {
            note: "the processor has no such charge".into()
        }
    );
    assert!(!store
        .list_unknown(100_000)
        .await
        .unwrap()
        .iter()
        .any(|l| l.key == req.key));
    // The next claim runs, and the old attempt is fenced out.
    let next = again(&req);
    claimed(store, &next).await;
    assert!(matches!(
        store.complete(&req.key, req.attempt, "1").await,
        Err(StoreError::Fenced)
    ));
}

/// A late completion by the attempt that owns a NOT_PERFORMED record still
/// wins: the handler's truth is better than the reconciler's guess.
pub async fn late_completion_wins_over_not_performed(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    let settled = Resolution::NotPerformed {
        note: "not found",
        settle: Duration::ZERO,
    };
    store
        .resolve(&req.key, req.attempt, settled, None)
        .await
        .unwrap();
    store.complete(&req.key, req.attempt, "2").await.unwrap();
    let r = existing(store, &again(&req)).await;
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "2".into()
        }
    );
}

/// A completion or a resolution that arrives after the record's window (it
/// outlived it as UNKNOWN) answers repeats until its retention ends: it does
/// not expire the moment it is written, to be purged or taken over by the
/// next identical call.
pub async fn late_truth_outlives_the_window(store: &dyn IdempotencyStore) {
    for by_resolution in [true, false] {
        let mut req = fresh(Duration::from_millis(100));
        req.lease = Duration::from_millis(100);
        claimed(store, &req).await;
        store
            .mark_unknown(&req.key, req.attempt, "timeout")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        if by_resolution {
            let found = Resolution::Completed {
                response: "\"late\"",
            };
            store
                .resolve(&req.key, req.attempt, found, None)
                .await
                .unwrap();
        } else {
            store
                .complete(&req.key, req.attempt, "\"late\"")
                .await
                .unwrap();
        }
        store.purge_expired(100_000).await.unwrap();
        let r = existing(store, &again(&req)).await;
        assert_eq!(
            r.state,
            RecordState::Completed {
                response: "\"late\"".into()
            },
            "by_resolution: {by_resolution}"
        );
        assert!(r.expires_at >= r.retain_until);
    }
}

/// An expired record is taken over; lapsed and unknown records are listed;
/// purge deletes what is expired and nothing else.
pub async fn expiry_sweep_and_purge(store: &dyn IdempotencyStore) {
    let short = Duration::from_millis(200);
    let request = |lease: Duration, window: Duration| ClaimRequest {
        lease,
        window,
        retention: window,
        ..fresh(window)
    };
    let d = request(short, short);
    let l = ClaimRequest {
        tenant: d.tenant.clone(),
        ..request(short, Duration::from_secs(60))
    };
    let v = ClaimRequest {
        tenant: d.tenant.clone(),
        ..request(Duration::from_secs(60), Duration::from_secs(60))
    };
    let (done, lapsed, live) = (d.key, l.key, v.key);
    store.claim(&d).await.unwrap();
    store.complete(&done, d.attempt, "1").await.unwrap();
    store.claim(&l).await.unwrap();
    store.claim(&v).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let listed = store.list_lapsed(100_000).await.unwrap();
    assert!(listed.iter().any(|r| r.key == lapsed));
    assert!(!listed.iter().any(|r| r.key == live || r.key == done));
    store
        .mark_unknown(&lapsed, l.attempt, "lease ran out")
        .await
        .unwrap();
    let unknown = store.list_unknown(100_000).await.unwrap();
    assert!(unknown.iter().any(|r| r.key == lapsed
        && r.state
            == RecordState::Unknown {
                note: "lease ran out".into()
            }));

    // The completed record's window ended: a new claim takes it over.
    let again = again(&d);
    assert!(matches!(
        store.claim(&again).await.unwrap(),
        Claim::Claimed { .. }
    ));
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
    let tenant = &d.tenant;
    assert_eq!(store.lookup(tenant, &d.reference).await.unwrap(), None);
    assert!(store.lookup(tenant, &l.reference).await.unwrap().is_some());
    assert!(store.lookup(tenant, &v.reference).await.unwrap().is_some());
    store.release(&live, v.attempt).await.unwrap();
    assert_eq!(store.lookup(tenant, &v.reference).await.unwrap(), None);
}

/// `list_records` returns a tenant's records matching the state and tool
/// asked, the newest claims first, at most the limit, and never another
/// tenant's.
pub async fn records_are_listed_by_filter_newest_first(store: &dyn IdempotencyStore) {
    let first = fresh(W);
    let tenant = first.tenant.clone();
    let mut reqs = vec![first];
    for i in 0..3 {
        // Apart in time: claimed_at orders them on every store's clock.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut req = fresh(W);
        req.tenant = tenant.clone();
        if i == 2 {
            req.tool = "create_shipment".to_owned();
        }
        reqs.push(req);
    }
    for req in &reqs {
        claimed(store, req).await;
    }
    store
        .mark_unknown(&reqs[1].key, reqs[1].attempt, "timed out")
        .await
        .unwrap();
    let other = fresh(W);
    claimed(store, &other).await;

    let mine = |state, tool: Option<&str>, limit| RecordFilter {
        state,
        tenant: Some(tenant.clone()),
        tool: tool.map(str::to_owned),
        limit,
    };
    let keys = |records: Vec<Record>| records.iter().map(|r| r.key).collect::<Vec<_>>();
    let all = store.list_records(&mine(None, None, 10)).await.unwrap();
    assert_eq!(
        keys(all),
        reqs.iter().rev().map(|r| r.key).collect::<Vec<_>>(),
        "the tenant's records, newest claim first"
    );
    let two = store.list_records(&mine(None, None, 2)).await.unwrap();
    assert_eq!(keys(two), [reqs[3].key, reqs[2].key], "at most the limit");
    let unknown = store
        .list_records(&mine(Some(RecordStateKind::Unknown), None, 10))
        .await
        .unwrap();
    assert_eq!(keys(unknown), [reqs[1].key], "by state");
    let shipments = store
        .list_records(&mine(None, Some("create_shipment"), 10))
        .await
        .unwrap();
    assert_eq!(keys(shipments), [reqs[3].key], "by tool");
    let in_progress_charges = store
        .list_records(&mine(
            Some(RecordStateKind::InProgress),
            Some("charge_card"),
            10,
        ))
        .await
        .unwrap();
    assert_eq!(
        keys(in_progress_charges),
        [reqs[2].key, reqs[0].key],
        "all filters at once"
    );
    let any = store
        .list_records(&RecordFilter {
            limit: 100_000,
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert!(
        any.iter().any(|r| r.key == other.key),
        "no filter: every tenant"
    );
}

/// `count_records` counts each state (other cases may share the store and
/// change their records meanwhile, so only this case's own are certain).
pub async fn records_are_counted_by_state(store: &dyn IdempotencyStore) {
    let (running, done, doubt) = (fresh(W), fresh(W), fresh(W));
    for req in [&running, &done, &doubt] {
        claimed(store, req).await;
    }
    store.complete(&done.key, done.attempt, "1").await.unwrap();
    store
        .mark_unknown(&doubt.key, doubt.attempt, "timed out")
        .await
        .unwrap();
    let after: StateCounts = store.count_records().await.unwrap();
    for kind in [
        RecordStateKind::InProgress,
        RecordStateKind::Completed,
        RecordStateKind::Unknown,
    ] {
        assert!(after.get(kind) >= 1, "{kind} counted: {after:?}");
    }
    assert!(after.total() >= 3, "{after:?}");
    let mine = store
        .list_records(&RecordFilter {
            tenant: Some(doubt.tenant.clone()),
            limit: 10,
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
}

/// Every outbox case starts here: a store that does not keep follow-on
/// jobs fails it at once, with `Unsupported` in the message.
fn require_outbox(store: &dyn IdempotencyStore) -> &dyn FollowOnStore {
    store.follow_ons().unwrap_or_else(|| {
        panic!(
            "StoreError::Unsupported: the {} store does not keep follow-on jobs \
             (follow_ons() is None)",
            store.kind()
        )
    })
}

/// A job name of this case only: cases share a store, and a lease takes
/// every due job of the names it is given.
fn job_name(what: &str) -> String {
    format!("{what}_{}", Attempt::random().get())
}

fn follow_on(name: &str, payload: serde_json::Value) -> FollowOn {
    FollowOn::new(name, &payload).expect("a valid follow-on")
}

async fn jobs_of(store: &dyn FollowOnStore, req: &ClaimRequest) -> Vec<OutboxJob> {
    store
        .list_jobs(&JobFilter {
            tenant: Some(req.tenant.clone()),
            reference: Some(req.reference),
            limit: 100,
            ..JobFilter::default()
        })
        .await
        .expect("list_jobs")
}

fn job_id(req: &ClaimRequest, name: &str) -> JobId {
    JobId {
        tenant: req.tenant.clone(),
        reference: req.reference,
        name: name.to_owned(),
    }
}

/// A record completed with follow-ons and its jobs, due at once, not run.
async fn completed_with_jobs(store: &dyn FollowOnStore, names: &[&str]) -> ClaimRequest {
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs: Vec<FollowOn> = names
        .iter()
        .map(|n| follow_on(n, serde_json::json!({ "to": "a@example.com" })))
        .collect();
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &jobs)
        .await
        .expect("complete_with_follow_ons");
    req
}

/// The completion and its follow-on jobs are written together: the record is
/// COMPLETED and every job waits, due, unleased, with its payload.
pub async fn follow_ons_are_written_with_the_completion(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let (receipt, notify) = (job_name("receipt"), job_name("notify"));
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs = [
        follow_on(
            &receipt,
            serde_json::json!({"to": "a@example.com", "cents": 500}),
        ),
        follow_on(&notify, serde_json::json!(["w1"])),
    ];
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &jobs)
        .await
        .unwrap();
    let r = record(store, &req).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "\"paid\"".into()
        }
    );
    let mut written = jobs_of(store, &req).await;
    written.sort_by(|a, b| a.id.name.cmp(&b.id.name));
    let mut expected = jobs.to_vec();
    expected.sort_by(|a, b| a.name().cmp(b.name()));
    assert_eq!(written.len(), 2, "{written:?}");
    for (job, declared) in written.iter().zip(&expected) {
        assert_eq!(job.id, job_id(&req, declared.name()));
        let (got, want): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(&job.payload).unwrap(),
            serde_json::from_str(declared.payload()).unwrap(),
        );
        assert_eq!(got, want);
        assert_eq!(job.attempts, 0);
        assert_eq!(job.token, None);
        assert!(!job.dead);
        assert_eq!(job.last_error, None);
        assert!(job.next_run_at <= job.created_at + Duration::from_secs(1));
    }
    // The empty list is a plain completion, on any record.
    let plain = fresh(W);
    claimed(store, &plain).await;
    store
        .complete_with_follow_ons(&plain.key, plain.attempt, "1", &[])
        .await
        .unwrap();
    assert!(jobs_of(store, &plain).await.is_empty());
}

/// A completion that is refused (another attempt owns the record, or it is
/// already COMPLETED) writes none of its jobs.
pub async fn refused_completion_writes_no_follow_ons(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs = [follow_on(&name, serde_json::json!(1))];
    let stale = again(&req).attempt;
    assert!(matches!(
        store
            .complete_with_follow_ons(&req.key, stale, "\"x\"", &jobs)
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(
        jobs_of(store, &req).await.is_empty(),
        "a fenced completion wrote jobs"
    );
    assert_eq!(
        record(store, &req).await.unwrap().state,
        RecordState::InProgress
    );

    store
        .complete(&req.key, req.attempt, "\"done\"")
        .await
        .unwrap();
    assert!(matches!(
        store
            .complete_with_follow_ons(&req.key, req.attempt, "\"again\"", &jobs)
            .await,
        Err(StoreError::WrongState {
            found: RecordStateKind::Completed
        })
    ));
    assert!(
        jobs_of(store, &req).await.is_empty(),
        "a second completion wrote jobs"
    );
}

/// Two jobs with one name in one completion are refused, and nothing is
/// written: the record stays IN_PROGRESS and no job exists.
pub async fn repeated_follow_on_name_writes_nothing(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs = [
        follow_on(&name, serde_json::json!(1)),
        follow_on(&name, serde_json::json!(2)),
    ];
    match store
        .complete_with_follow_ons(&req.key, req.attempt, "\"x\"", &jobs)
        .await
    {
        Err(StoreError::Invalid(message)) => assert!(message.contains(&name), "{message}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(
        record(store, &req).await.unwrap().state,
        RecordState::InProgress
    );
    assert!(jobs_of(store, &req).await.is_empty());
}

/// A COMPLETED resolution of an UNKNOWN record writes its follow-ons with it
/// (and keeps the note); on a record that is not UNKNOWN it writes nothing.
pub async fn resolution_writes_its_follow_ons(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let jobs = [follow_on(&name, serde_json::json!({"late": true}))];
    let running = fresh(W);
    claimed(store, &running).await;
    assert!(matches!(
        store
            .resolve_with_follow_ons(&running.key, running.attempt, "1", None, &jobs)
            .await,
        Err(StoreError::WrongState {
            found: RecordStateKind::InProgress
        })
    ));
    assert!(jobs_of(store, &running).await.is_empty());

    let doubt = fresh(W);
    claimed(store, &doubt).await;
    store
        .mark_unknown(&doubt.key, doubt.attempt, "timed out")
        .await
        .unwrap();
    store
        .resolve_with_follow_ons(
            &doubt.key,
            doubt.attempt,
            "\"found\"",
            Some("ops: seen"),
            &jobs,
        )
        .await
        .unwrap();
    let r = record(store, &doubt).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "\"found\"".into()
        }
    );
    assert_eq!(r.resolution.as_deref(), Some("ops: seen"));
    let written = jobs_of(store, &doubt).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].id, job_id(&doubt, &name));
}

/// Of 16 concurrent leases, exactly one gets a due job; it carries that
/// lease's token and its first attempt, and no later lease returns it while
/// the lease holds.
pub async fn concurrent_leases_share_no_job(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let tokens: Vec<Attempt> = (0..16).map(|_| Attempt::random()).collect();
    let names = [name.as_str()];
    let leases = join_all(
        tokens
            .iter()
            .map(|t| store.lease_jobs(&names, 10, Duration::from_secs(60), *t)),
    )
    .await;
    let mut winners = Vec::new();
    for (lease, token) in leases.into_iter().zip(&tokens) {
        for job in lease.expect("lease_jobs") {
            winners.push((job, *token));
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one lease gets the job: {winners:?}"
    );
    let (job, token) = &winners[0];
    assert_eq!(job.id, job_id(&req, &name));
    assert_eq!(job.token, Some(*token));
    assert_eq!(job.attempts, 1);
    assert!(job.next_run_at > job.created_at, "leased until later");
    let later = store
        .lease_jobs(&names, 10, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert!(
        later.is_empty(),
        "a held lease is not leased again: {later:?}"
    );
}

/// A lease returns only due jobs whose names it handles; a job of another
/// name waits, counted by `count_due_jobs`, and is leased by a dispatcher
/// that handles it.
pub async fn lease_takes_only_its_names(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let (mine, other) = (job_name("receipt"), job_name("nobody_handles"));
    let req = completed_with_jobs(store, &[&mine, &other]).await;
    let leased = store
        .lease_jobs(
            &[mine.as_str()],
            10,
            Duration::from_secs(60),
            Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].id, job_id(&req, &mine));
    let due = store.count_due_jobs().await.unwrap();
    assert_eq!(
        due.get(&other),
        Some(&1),
        "the waiting job is counted: {due:?}"
    );
    assert_eq!(due.get(&mine), None, "a leased job is not due: {due:?}");
    let waiting = jobs_of(store, &req).await;
    let unleased = waiting.iter().find(|j| j.id.name == other).unwrap();
    assert_eq!((unleased.attempts, unleased.token), (0, None));
    let taken = store
        .lease_jobs(
            &[other.as_str()],
            10,
            Duration::from_secs(60),
            Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(store
        .lease_jobs(&[], 10, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap()
        .is_empty());
}

/// `limit` bounds a lease, and the longest due go first.
pub async fn lease_respects_its_limit(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let mut reqs = Vec::new();
    for _ in 0..3 {
        reqs.push(completed_with_jobs(store, &[&name]).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let names = [name.as_str()];
    let first = store
        .lease_jobs(&names, 2, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].id.reference, reqs[0].reference, "oldest first");
    let rest = store
        .lease_jobs(&names, 2, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id.reference, reqs[2].reference);
}

/// finish, retry and bury act only for the token that holds the lease; a
/// finished job is gone.
pub async fn job_changes_are_fenced_by_the_token(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let token = Attempt::random();
    let leased = store
        .lease_jobs(&[name.as_str()], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    let stranger = Attempt::random();
    assert!(matches!(
        store.finish_job(&id, stranger).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.retry_job(&id, stranger, Duration::ZERO, "boom").await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.bury_job(&id, stranger, "boom").await,
        Err(StoreError::Fenced)
    ));
    let still = jobs_of(store, &req).await;
    assert_eq!(still[0].token, Some(token), "the stranger changed nothing");
    assert!(!still[0].dead);
    store.finish_job(&id, token).await.unwrap();
    assert!(
        jobs_of(store, &req).await.is_empty(),
        "a finished job is gone"
    );
    assert!(matches!(
        store.finish_job(&id, token).await,
        Err(StoreError::Fenced)
    ));
    let missing = job_id(&req, "never_declared");
    assert!(matches!(
        store.finish_job(&missing, token).await,
        Err(StoreError::Fenced)
    ));
}

/// A retried job gives up its lease, keeps its error, waits its delay, and
/// is then leased again with its next attempt; the old token is fenced.
pub async fn retried_job_runs_again_after_its_delay(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    let first = Attempt::random();
    store
        .lease_jobs(&names, 1, Duration::from_secs(60), first)
        .await
        .unwrap();
    store
        .retry_job(&id, first, Duration::from_millis(300), "mailer down")
        .await
        .unwrap();
    let waiting = jobs_of(store, &req).await;
    assert_eq!(waiting[0].token, None);
    assert_eq!(waiting[0].last_error.as_deref(), Some("mailer down"));
    assert!(
        store
            .lease_jobs(&names, 1, Duration::from_secs(60), Attempt::random())
            .await
            .unwrap()
            .is_empty(),
        "not before its delay"
    );
    assert!(
        matches!(store.finish_job(&id, first).await, Err(StoreError::Fenced)),
        "a retry gives the lease up"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = Attempt::random();
    let again = store
        .lease_jobs(&names, 1, Duration::from_secs(60), second)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(again[0].last_error.as_deref(), Some("mailer down"));
    store.finish_job(&id, second).await.unwrap();
}

/// A lease that ran out (its dispatcher died) lets another dispatcher take
/// the job; the first one's token is then fenced.
pub async fn lapsed_job_lease_is_taken_over(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    let dead = Attempt::random();
    store
        .lease_jobs(&names, 1, Duration::from_millis(100), dead)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.count_due_jobs().await.unwrap().get(&name), Some(&1));
    let live = Attempt::random();
    let taken = store
        .lease_jobs(&names, 1, Duration::from_secs(60), live)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].attempts, 2);
    assert!(matches!(
        store.finish_job(&id, dead).await,
        Err(StoreError::Fenced)
    ));
    store.finish_job(&id, live).await.unwrap();
}

/// A buried job is dead: listed, never leased, until re-driven, after which
/// it runs again from its first attempt. Re-driving a live or absent job
/// changes nothing.
pub async fn buried_job_is_listed_and_redriven(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    assert!(
        !store.redrive_job(&id).await.unwrap(),
        "a live job is not re-driven"
    );
    let token = Attempt::random();
    store
        .lease_jobs(&names, 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store.bury_job(&id, token, "bounced").await.unwrap();
    let dead = store
        .list_jobs(&JobFilter {
            tenant: Some(req.tenant.clone()),
            dead: Some(true),
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert!(dead[0].dead);
    assert_eq!(dead[0].token, None);
    assert_eq!(dead[0].last_error.as_deref(), Some("bounced"));
    let live = store
        .list_jobs(&JobFilter {
            tenant: Some(req.tenant.clone()),
            dead: Some(false),
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert!(live.is_empty());
    assert!(
        store
            .lease_jobs(&names, 1, Duration::from_secs(60), Attempt::random())
            .await
            .unwrap()
            .is_empty(),
        "a dead job is not leased"
    );
    assert_eq!(store.count_due_jobs().await.unwrap().get(&name), None);
    assert!(
        matches!(store.finish_job(&id, token).await, Err(StoreError::Fenced)),
        "burial gives the lease up"
    );

    assert!(store.redrive_job(&id).await.unwrap());
    assert!(!store.redrive_job(&id).await.unwrap(), "already live");
    let back = store
        .lease_jobs(&names, 1, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].attempts, 1, "re-driven from its first attempt");
    assert!(!back[0].dead);
    let absent = job_id(&req, "never_declared");
    assert!(!store.redrive_job(&absent).await.unwrap());
}

/// A job belongs to its operation: the same call completed again after its
/// window writes its jobs under its own reference, and never replaces,
/// re-dues or revives the earlier operation's jobs, dead or running. Each
/// keeps its own downstream key.
pub async fn a_later_operation_never_touches_an_earlier_operations_jobs(
    store: &dyn IdempotencyStore,
) {
    let store = require_outbox(store);
    let (dead_name, running_name) = (job_name("receipt"), job_name("ship"));
    let names = [dead_name.as_str(), running_name.as_str()];
    let first = fresh(Duration::from_millis(300));
    claimed(store, &first).await;
    let jobs = [
        follow_on(&dead_name, serde_json::json!({"n": 1})),
        follow_on(&running_name, serde_json::json!({"n": 1})),
    ];
    store
        .complete_with_follow_ons(&first.key, first.attempt, "\"one\"", &jobs)
        .await
        .unwrap();
    // The first operation's receipt goes to the dead letter; its shipment
    // is leased and still running.
    let token = Attempt::random();
    let leased = store
        .lease_jobs(&names, 10, Duration::from_secs(60), token)
        .await
        .unwrap();
    assert_eq!(leased.len(), 2, "{leased:?}");
    store
        .bury_job(&job_id(&first, &dead_name), token, "mailbox full")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(450)).await;
    let second = new_operation(&first);
    assert_eq!(claimed(store, &second).await, second.reference);
    let jobs = [
        follow_on(&dead_name, serde_json::json!({"n": 2})),
        follow_on(&running_name, serde_json::json!({"n": 2})),
    ];
    store
        .complete_with_follow_ons(&second.key, second.attempt, "\"two\"", &jobs)
        .await
        .unwrap();

    // Only the second operation's jobs are due: the running one of the first
    // is not handed to a second dispatcher under the same key.
    let other = Attempt::random();
    let due = store
        .lease_jobs(&names, 10, Duration::from_secs(60), other)
        .await
        .unwrap();
    assert_eq!(due.len(), 2, "{due:?}");
    assert!(due.iter().all(|j| j.id.reference == second.reference));
    assert!(due.iter().all(|j| j.payload.contains('2')));
    // The first operation's jobs are as they were: the dead one dead (and
    // re-drivable), the running one still held by its lease.
    let kept = jobs_of(store, &first).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    let dead = kept.iter().find(|j| j.id.name == dead_name).unwrap();
    assert!(dead.dead);
    assert_eq!(dead.last_error.as_deref(), Some("mailbox full"));
    assert!(dead.payload.contains('1'));
    let running = kept.iter().find(|j| j.id.name == running_name).unwrap();
    assert_eq!(running.token, Some(token));
    assert!(!running.dead);
    store
        .finish_job(&job_id(&first, &running_name), token)
        .await
        .expect("the first operation's lease still holds its job");
    assert!(store
        .redrive_job(&job_id(&first, &dead_name))
        .await
        .unwrap());
    assert_ne!(
        job_id(&first, &dead_name).downstream_key(),
        job_id(&second, &dead_name).downstream_key(),
        "each operation's job has its own downstream key"
    );
}

/// `list_jobs` filters by tenant, reference, name and dead, the oldest
/// first, at most `limit`; another tenant's jobs are not listed under it.
pub async fn jobs_are_listed_by_filter(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let (a, b) = (job_name("a"), job_name("b"));
    let first = completed_with_jobs(store, &[&a, &b]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = completed_with_jobs(store, &[&a]).await;
    let by_name = store
        .list_jobs(&JobFilter {
            name: Some(a.clone()),
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        by_name.iter().map(|j| j.id.reference).collect::<Vec<_>>(),
        [first.reference, second.reference],
        "oldest first"
    );
    let one = store
        .list_jobs(&JobFilter {
            name: Some(a.clone()),
            limit: 1,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let of_first = jobs_of(store, &first).await;
    assert_eq!(of_first.len(), 2);
    let elsewhere = store
        .list_jobs(&JobFilter {
            tenant: Some(second.tenant.clone()),
            reference: Some(first.reference),
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert!(elsewhere.is_empty(), "another tenant's jobs: {elsewhere:?}");
}

/// A default filter lists a page of jobs, not none: the dead-letter listing
/// `JobFilter { dead: Some(true), ..JobFilter::default() }` finds a buried
/// job, and the default filter a live one.
pub async fn default_job_filter_lists_a_page(store: &dyn IdempotencyStore) {
    let store = require_outbox(store);
    let (dead_name, live_name) = (job_name("bounced"), job_name("receipt"));
    let req = completed_with_jobs(store, &[&dead_name, &live_name]).await;
    let token = Attempt::random();
    let leased = store
        .lease_jobs(&[dead_name.as_str()], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    store
        .bury_job(&job_id(&req, &dead_name), token, "bounced")
        .await
        .unwrap();
    let dead = store
        .list_jobs(&JobFilter {
            dead: Some(true),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert!(!dead.is_empty(), "the default filter lists no dead job");
    let dead_here = store
        .list_jobs(&JobFilter {
            tenant: Some(req.tenant.clone()),
            dead: Some(true),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        dead_here.iter().map(|j| &j.id).collect::<Vec<_>>(),
        [&job_id(&req, &dead_name)]
    );
    let all_here = store
        .list_jobs(&JobFilter {
            tenant: Some(req.tenant.clone()),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(all_here.len(), 2, "{all_here:?}");
}

/// A default filter lists a page of records, not none.
pub async fn default_record_filter_lists_a_page(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    assert!(
        !store
            .list_records(&RecordFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "the default filter lists no record"
    );
    let mine = store
        .list_records(&RecordFilter {
            tenant: Some(req.tenant.clone()),
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(mine.iter().map(|r| r.key).collect::<Vec<_>>(), [req.key]);
}

/// One conformance case: a function over a borrowed store.
pub type Case =
    for<'a> fn(&'a dyn IdempotencyStore) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The list of cases, written once; `$callback` is a `#[macro_export]`ed
/// macro of this crate, called with its arguments followed by the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_cases {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback!($($args)*
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
            claim_runs_under_the_offered_reference,
            a_claim_after_the_window_is_a_new_operation,
            not_performed_within_the_window_keeps_its_reference,
            not_performed_after_the_window_is_a_new_operation,
            a_record_reads_by_its_state_and_lease,
            unknown_record_outlives_window,
            lapsed_lease_is_listed_not_taken_over,
            heartbeat_extends_lease,
            lookup_is_scoped_to_tenant,
            existing_record_keeps_its_fingerprint,
            purge_deletes_expired_in_batches,
            expiry_sweep_and_purge,
            sweep_mark_rechecks_the_lease,
            unknown_records_are_listed_when_due,
            resolve_completed_from_unknown_only,
            not_performed_waits_for_settle,
            late_completion_wins_over_not_performed,
            records_are_listed_by_filter_newest_first,
            records_are_counted_by_state,
            default_record_filter_lists_a_page,
        );
    };
}

/// The outbox's cases (follow-on jobs), written once, as
/// [`__idem_conformance_cases`] writes the records' cases: a store whose
/// follow-on jobs are still to come declares them pending
/// (`conformance_tests!(make; outbox pending)`).
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_outbox_cases {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback!($($args)*
            follow_ons_are_written_with_the_completion,
            refused_completion_writes_no_follow_ons,
            repeated_follow_on_name_writes_nothing,
            resolution_writes_its_follow_ons,
            concurrent_leases_share_no_job,
            lease_takes_only_its_names,
            lease_respects_its_limit,
            job_changes_are_fenced_by_the_token,
            retried_job_runs_again_after_its_delay,
            lapsed_job_lease_is_taken_over,
            buried_job_is_listed_and_redriven,
            jobs_are_listed_by_filter,
            a_later_operation_never_touches_an_earlier_operations_jobs,
            default_job_filter_lists_a_page,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_array {
    ($(#[$doc:meta])* $name:ident; $($case:ident),* $(,)?) => {
        $(#[$doc])*
        pub const $name: &[(&str, Case)] = &[
            $((stringify!($case), |store| Box::pin($case(store))),)*
        ];
    };
}

__idem_conformance_cases!(__idem_conformance_array!(
    /// The records' cases, by name, in the order [`run_all`] runs them.
    RECORD_CASES;
));
__idem_outbox_cases!(__idem_conformance_array!(
    /// The outbox's cases (follow-on jobs), by name, in the order
    /// [`run_all`] runs them after [`RECORD_CASES`].
    OUTBOX_CASES;
));

/// Every case, records' then outbox's, by name.
pub fn cases() -> impl Iterator<Item = &'static (&'static str, Case)> {
    RECORD_CASES.iter().chain(OUTBOX_CASES)
}

/// Runs every case, one after the other, on one store.
pub async fn run_all(store: &dyn IdempotencyStore) {
    for (_, case) in cases() {
        case(store).await;
    }
}

/// Runs the records' cases only, for a store whose follow-on jobs are still
/// to come; its test file declares the outbox's cases pending with
/// `conformance_tests!(make; outbox pending)`, which checks that they still
/// fail with `Unsupported`.
pub async fn run_all_but_outbox(store: &dyn IdempotencyStore) {
    for (_, case) in RECORD_CASES {
        case(store).await;
    }
}

/// Declares one `#[test]` per conformance case, each on a two-worker tokio
/// runtime. `$make` is an expression, evaluated inside the test (it may
/// `.await`), giving `Option<S>` where `S: Deref<Target = impl
/// IdempotencyStore>`: `None` when the backend is not available here and the
/// caller has already said why.
///
/// ```ignore
/// idem_runtime::conformance_tests!(Some(std::sync::Arc::new(idem_runtime::MemoryStore::new())));
/// ```
///
/// A store that does not keep follow-on jobs yet declares the outbox's cases
/// pending: `conformance_tests!(make; outbox pending)`. Each such test
/// passes only while its case fails with `StoreError::Unsupported` (and
/// says so on stderr), and fails once the case passes, so the store's author
/// removes `; outbox pending` when its outbox is done.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::__idem_conformance_cases!(__idem_conformance_test_fns!($make;));
        $crate::__idem_outbox_cases!(__idem_conformance_test_fns!($make;));
    };
    ($make:expr; outbox pending) => {
        $crate::__idem_conformance_cases!(__idem_conformance_test_fns!($make;));
        $crate::__idem_outbox_cases!(__idem_conformance_pending_fns!($make;));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_pending_fns {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let ran = ::std::panic::catch_unwind(|| {
                    $crate::conformance::block_on(async {
                        let Some(store) = $make else { return false };
                        $crate::conformance::$case(&*store).await;
                        true
                    })
                });
                $crate::conformance::pending(stringify!($case), ran);
            }
        )*
    };
}

/// The verdict on a case declared pending: it must still fail with
/// `Unsupported` (then it is reported pending on stderr); a case that passes
/// fails the test, so the pending mark is removed; any other failure is the
/// failure it is.
pub fn pending(case: &str, ran: std::thread::Result<bool>) {
    match ran {
        Ok(false) => {}
        Ok(true) => panic!(
            "conformance case `{case}` now passes on this store: remove `; outbox pending` from \
             its conformance_tests! call"
        ),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            if message.contains("Unsupported") {
                // To the process's stderr, past the test harness's capture:
                // a pending case must show in the log of a passing run.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "PENDING: conformance case `{case}`: this store does not keep follow-on jobs \
                     yet (StoreError::Unsupported)"
                );
            } else {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_test_fns {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::block_on(async {
                    let Some(store) = $make else { return };
                    $crate::conformance::$case(&*store).await;
                });
            }
        )*
    };
}

/// Runs `work` on a fresh two-worker tokio runtime (what each generated test
/// does).
pub fn block_on<F: Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(work)
}

/// A store call, as [`FaultyStore`]'s plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// [`IdempotencyStore::claim`].
    Claim,
    /// [`IdempotencyStore::complete`].
    Complete,
    /// [`IdempotencyStore::release`].
    Release,
    /// [`IdempotencyStore::mark_unknown`].
    MarkUnknown,
    /// [`IdempotencyStore::mark_lapsed`].
    MarkLapsed,
    /// [`IdempotencyStore::resolve`].
    Resolve,
    /// [`IdempotencyStore::defer_check`].
    DeferCheck,
    /// [`IdempotencyStore::heartbeat`].
    Heartbeat,
    /// [`IdempotencyStore::lookup`].
    Lookup,
    /// [`IdempotencyStore::purge_expired`].
    Purge,
    /// [`IdempotencyStore::list_lapsed`].
    ListLapsed,
    /// [`IdempotencyStore::list_unknown`].
    ListUnknown,
    /// [`IdempotencyStore::list_records`].
    ListRecords,
    /// [`IdempotencyStore::count_records`].
    CountRecords,
    /// [`IdempotencyStore::complete_with_follow_ons`] (with jobs; with none
    /// it is [`Call::Complete`]).
    CompleteWithFollowOns,
    /// [`IdempotencyStore::resolve_with_follow_ons`] (with jobs).
    ResolveWithFollowOns,
    /// [`IdempotencyStore::lease_jobs`].
    LeaseJobs,
    /// [`IdempotencyStore::finish_job`].
    FinishJob,
    /// [`IdempotencyStore::retry_job`].
    RetryJob,
    /// [`IdempotencyStore::bury_job`].
    BuryJob,
    /// [`IdempotencyStore::list_jobs`].
    ListJobs,
    /// [`IdempotencyStore::redrive_job`].
    RedriveJob,
    /// [`IdempotencyStore::count_due_jobs`].
    CountDueJobs,
}

/// What [`FaultyStore`] does to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Pass it through.
    None,
    /// Fail with `Unavailable` before reaching the store: nothing changed.
    Unreachable,
    /// Run it, then fail with `Unavailable` anyway: the change took effect
    /// but its answer was lost (a timeout after the commit).
    AnswerLost,
    /// Wait this long, then pass it through.
    Delay(Duration),
    /// Pass it through, then wait this long before answering: the change
    /// took effect while the caller still waits (and may give up).
    SlowAnswer(Duration),
}

/// Decides the fault of each call.
pub type FaultPlan = Arc<dyn Fn(Call) -> Fault + Send + Sync>;

/// A store that forwards to `inner`, with faults injected by a plan: the one
/// fault-injecting wrapper of the tests, the benches and the simulation.
#[derive(Clone)]
pub struct FaultyStore<S> {
    inner: S,
    plan: FaultPlan,
}

impl<S> std::fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore> FaultyStore<S> {
    /// `inner` with the faults `plan` picks for each call.
    pub fn new(inner: S, plan: impl Fn(Call) -> Fault + Send + Sync + 'static) -> Self {
        FaultyStore {
            inner,
            plan: Arc::new(plan),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn run<T>(
        &self,
        call: Call,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match (self.plan)(call) {
            Fault::None => work.await,
            Fault::Unreachable => Err(StoreError::Unavailable(format!(
                "injected: {call:?} did not reach the store"
            ))),
            Fault::AnswerLost => {
                let _ = work.await;
                Err(StoreError::Unavailable(format!(
                    "injected: the answer to {call:?} was lost after it took effect"
                )))
            }
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                work.await
            }
            Fault::SlowAnswer(d) => {
                let out = work.await;
                tokio::time::sleep(d).await;
                out
            }
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for FaultyStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.run(Call::Claim, self.inner.claim(req)).await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.run(Call::Complete, self.inner.complete(key, attempt, response))
            .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.run(Call::Release, self.inner.release(key, attempt))
            .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.run(
            Call::MarkUnknown,
            self.inner.mark_unknown(key, attempt, note),
        )
        .await
    }

    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.run(Call::MarkLapsed, self.inner.mark_lapsed(key, attempt, note))
            .await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.run(
            Call::Resolve,
            self.inner.resolve(key, attempt, resolution, note),
        )
        .await
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        self.run(
            Call::DeferCheck,
            self.inner.defer_check(key, attempt, delay),
        )
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.run(Call::Heartbeat, self.inner.heartbeat(key, attempt, lease))
            .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.run(Call::Lookup, self.inner.lookup(tenant, reference))
            .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.run(Call::Purge, self.inner.purge_expired(batch)).await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListLapsed, self.inner.list_lapsed(limit))
            .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListUnknown, self.inner.list_unknown(limit))
            .await
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListRecords, self.inner.list_records(filter))
            .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.run(Call::CountRecords, self.inner.count_records())
            .await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        // Faults reach the jobs too, when the store keeps them.
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }
}

impl<S: IdempotencyStore> FaultyStore<S> {
    /// The wrapped store's jobs: only reached once `follow_ons()` said
    /// there are some.
    fn jobs(&self) -> &dyn FollowOnStore {
        self.inner
            .follow_ons()
            .expect("FaultyStore::follow_ons() is Some only when the store keeps jobs")
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> FollowOnStore for FaultyStore<S> {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        let call = if jobs.is_empty() {
            Call::Complete
        } else {
            Call::CompleteWithFollowOns
        };
        self.run(
            call,
            self.jobs()
                .complete_with_follow_ons(key, attempt, response, jobs),
        )
        .await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        let call = if jobs.is_empty() {
            Call::Resolve
        } else {
            Call::ResolveWithFollowOns
        };
        self.run(
            call,
            self.jobs()
                .resolve_with_follow_ons(key, attempt, response, note, jobs),
        )
        .await
    }

    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<OutboxJob>, StoreError> {
        self.run(
            Call::LeaseJobs,
            self.jobs().lease_jobs(names, limit, lease, token),
        )
        .await
    }

    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        self.run(Call::FinishJob, self.jobs().finish_job(id, token))
            .await
    }

    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.run(
            Call::RetryJob,
            self.jobs().retry_job(id, token, delay, error),
        )
        .await
    }

    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        self.run(Call::BuryJob, self.jobs().bury_job(id, token, error))
            .await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<OutboxJob>, StoreError> {
        self.run(Call::ListJobs, self.jobs().list_jobs(filter))
            .await
    }

    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        self.run(Call::RedriveJob, self.jobs().redrive_job(id))
            .await
    }

    async fn count_due_jobs(&self) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        self.run(Call::CountDueJobs, self.jobs().count_due_jobs())
            .await
    }
}
