//! The records' cases: claims, completions, leases, the sweep, resolutions,
//! purge, and how a record reads. One job: the cases, one function each.

use super::*;

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
/// reference it offered, and the earlier operation's reference still finds
/// the earlier operation (never the new operation's record).
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
    let earlier = store
        .lookup(&first.tenant, &first.reference)
        .await
        .unwrap()
        .expect("the earlier operation still reads by its reference");
    assert_eq!(
        (earlier.reference, earlier.attempt, earlier.state),
        (
            first.reference,
            first.attempt,
            RecordState::Completed {
                response: "1".into()
            }
        ),
        "the earlier operation's reference finds its own record, never the new one"
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
    assert!(
        matches!(
            record(store, &first).await.map(|r| r.state),
            Some(RecordState::NotPerformed { .. })
        ),
        "the earlier operation still reads as not performed"
    );
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

/// What a client key needs: its operation is held for the key's retention,
/// passed as the claim's `window` and far longer than a tool's window (24 h
/// by default). A completed record keeps the key, with its response and its
/// fingerprint, until then: a repeat with the same fingerprint finds the
/// response, one with another fingerprint finds the first record (the
/// executor answers a conflict) and changes nothing. A day-long window is
/// held as such (its expiry is a day after the claim), and a short one ends
/// when it ends: after it, either call is a new operation.
pub async fn a_long_held_key_answers_replays_and_conflicts_until_it_ends(
    store: &dyn IdempotencyStore,
) {
    let other_args = |req: &ClaimRequest| ClaimRequest {
        key: IdempotencyKey::from_parts(*req.key.as_bytes(), random32()),
        ..new_operation(req)
    };
    let day = Duration::from_secs(24 * 3600);
    let keyed = ClaimRequest {
        retention: 2 * day,
        ..fresh(day)
    };
    claimed(store, &keyed).await;
    store
        .complete(&keyed.key, keyed.attempt, "r1")
        .await
        .unwrap();
    let held = record(store, &keyed).await.unwrap();
    let hold = held
        .expires_at
        .duration_since(held.claimed_at)
        .unwrap_or_default();
    assert!(
        hold + Duration::from_secs(5) >= day,
        "a day-long window is held for a day, not {hold:?}"
    );
    let conflict = existing(store, &other_args(&keyed)).await;
    assert_eq!(conflict.reference, keyed.reference);
    assert_eq!(conflict.key.fingerprint(), keyed.key.fingerprint());
    let repeat = existing(store, &new_operation(&keyed)).await;
    assert_eq!(
        (repeat.reference, repeat.state),
        (
            keyed.reference,
            RecordState::Completed {
                response: "r1".into()
            }
        ),
        "the other arguments' claim changed nothing"
    );

    // The same in real time: a held key of 600 ms, past a (tool's) 200 ms.
    let short = ClaimRequest {
        retention: Duration::from_secs(3600),
        ..fresh(Duration::from_millis(600))
    };
    claimed(store, &short).await;
    store
        .complete(&short.key, short.attempt, "r2")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let conflict = existing(store, &other_args(&short)).await;
    assert_eq!(conflict.key.fingerprint(), short.key.fingerprint());
    let repeat = existing(store, &new_operation(&short)).await;
    assert_eq!(
        repeat.state,
        RecordState::Completed {
            response: "r2".into()
        }
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    let next = other_args(&short);
    assert_eq!(
        claimed(store, &next).await,
        next.reference,
        "past the held key, other arguments start a new operation"
    );
}

/// purge deletes COMPLETED records past their retention in batches and
/// keeps the others.
pub async fn purge_deletes_expired_in_batches(store: &dyn IdempotencyStore) {
    let short: Vec<ClaimRequest> = (0..5)
        .map(|_| ClaimRequest {
            retention: Duration::from_millis(100),
            ..fresh(Duration::from_millis(100))
        })
        .collect();
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
        .defer_check(&far.key, far.attempt, Duration::from_secs(3600), None)
        .await
        .unwrap();
    // `soon` is deferred by a second: long enough that the listing right
    // after it comes first on a loaded machine, and checked only if it did.
    let deferred = std::time::Instant::now();
    store
        .defer_check(&soon.key, soon.attempt, Duration::from_secs(1), None)
        .await
        .unwrap();
    let listed = store.list_unknown(100_000).await.unwrap();
    assert!(!listed.iter().any(|l| l.key == far.key));
    if deferred.elapsed() < Duration::from_millis(900) {
        assert!(!listed.iter().any(|l| l.key == soon.key), "deferred");
    }
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(deferred.elapsed())).await;
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
        store.defer_check(&live.key, live.attempt, W, None).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::InProgress
        })
    ));
    assert!(matches!(
        store
            .defer_check(&far.key, Attempt::random(), W, None)
            .await,
        Err(StoreError::Fenced)
    ));
}

/// Of the replicas that list one UNKNOWN record, one takes its check and
/// asks the processor: three takes at once, one wins; the record is not
/// listed while the check is held, and its check count does not grow. A
/// check held by a replica that never answers can be taken again once the
/// hold is over, and an answer's deferral ends the hold.
pub async fn a_check_is_taken_by_one_replica(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    let hold = Duration::from_secs(1);
    let take = || store.take_check(&req.key, req.attempt, hold);
    let taken = std::time::Instant::now();
    let (a, b, c) = tokio::join!(take(), take(), take());
    let won = [a.unwrap(), b.unwrap(), c.unwrap()];
    assert_eq!(won.iter().flatten().count(), 1, "{won:?}");
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.checks, 0, "a take is not a check");
    assert!(matches!(r.state, RecordState::Unknown { .. }));
    let listed = store.list_unknown(100_000).await.unwrap();
    if taken.elapsed() < Duration::from_millis(900) {
        assert!(!listed.iter().any(|l| l.key == req.key), "held");
        assert!(take().await.unwrap().is_none(), "held by another replica");
    }
    // The replica that took it never answered: another takes it after the
    // hold.
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(taken.elapsed())).await;
    assert!(store
        .list_unknown(100_000)
        .await
        .unwrap()
        .iter()
        .any(|l| l.key == req.key));
    let second = take().await.unwrap();
    assert!(second.is_some(), "due again once the hold is over");
    // The answer's deferral replaces the hold.
    assert!(store
        .defer_check(&req.key, req.attempt, Duration::ZERO, second)
        .await
        .unwrap());
    assert!(
        take().await.unwrap().is_some(),
        "due at once after a deferral of zero"
    );
    // Fenced, and only UNKNOWN records.
    assert!(matches!(
        store.take_check(&req.key, Attempt::random(), hold).await,
        Err(StoreError::Fenced)
    ));
    let live = fresh(W);
    claimed(store, &live).await;
    assert!(matches!(
        store.take_check(&live.key, live.attempt, hold).await,
        Err(StoreError::WrongState {
            found: RecordStateKind::InProgress
        })
    ));
}

/// The deferral that answers a check applies only while that check is the
/// record's: once its hold ran out and another replica took the next one, a
/// late answer to the first changes nothing, so the record does not fall
/// due under the second replica's lookup.
pub async fn a_late_answer_leaves_the_next_check_alone(store: &dyn IdempotencyStore) {
    let req = fresh(W);
    claimed(store, &req).await;
    store
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    let hold = Duration::from_millis(300);
    let take = || store.take_check(&req.key, req.attempt, hold);
    let first = take().await.unwrap().expect("due at once");
    // The first replica's lookup outlives its hold; a second replica takes
    // the next check, for an hour.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let second = store
        .take_check(&req.key, req.attempt, Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("due again once the hold is over");
    assert_ne!(first, second);
    // The first replica's answer comes late, with a deferral of zero.
    assert!(
        !store
            .defer_check(&req.key, req.attempt, Duration::ZERO, Some(first))
            .await
            .unwrap(),
        "a late answer to a check taken since is held back"
    );
    let r = record(store, &req).await.unwrap();
    assert_eq!(r.checks, 0, "the late answer is not counted");
    assert!(matches!(r.state, RecordState::Unknown { .. }));
    assert!(
        !store
            .list_unknown(100_000)
            .await
            .unwrap()
            .iter()
            .any(|l| l.key == req.key),
        "the second replica still holds the check"
    );
    assert!(take().await.unwrap().is_none(), "not due: held");
    // The second replica's answer applies.
    assert!(store
        .defer_check(&req.key, req.attempt, Duration::ZERO, Some(second))
        .await
        .unwrap());
    assert_eq!(record(store, &req).await.unwrap().checks, 1);
    assert!(take().await.unwrap().is_some(), "due after its answer");
    // Still fenced by the attempt, and only UNKNOWN records.
    assert!(matches!(
        store
            .defer_check(&req.key, Attempt::random(), W, Some(second))
            .await,
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
/// outlived it as UNKNOWN) does not stretch the window: the key is free at
/// once, and the same call is a new operation under a new reference. The
/// late operation still reads by its own reference, as completed, until its
/// retention ends, purge or no purge.
pub async fn late_truth_frees_the_key_after_the_window(store: &dyn IdempotencyStore) {
    for by_resolution in [true, false] {
        let mut req = fresh(Duration::from_millis(100));
        req.lease = Duration::from_millis(100);
        claimed(store, &req).await;
        store
            .mark_unknown(&req.key, req.attempt, "timeout")
            .await
            .unwrap();
        // UNKNOWN holds the key past its window.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = existing(store, &new_operation(&req)).await;
        assert_eq!(r.reference, req.reference);
        let window_end = r.expires_at;
        settle_late(store, &req, by_resolution).await;
        store.purge_expired(100_000).await.unwrap();
        let later = new_operation(&req);
        assert_eq!(
            claimed(store, &later).await,
            later.reference,
            "by_resolution: {by_resolution}: the same call after the window is a new operation"
        );
        let first = record(store, &req).await.expect("the late operation reads");
        assert_eq!(first.reference, req.reference);
        assert_eq!(
            first.state,
            RecordState::Completed {
                response: "\"late\"".into()
            },
            "by_resolution: {by_resolution}"
        );
        assert_eq!(
            first.expires_at, window_end,
            "a late truth never moves the window"
        );
        let second = record(store, &later)
            .await
            .expect("the new operation reads");
        assert_eq!(second.state, RecordState::InProgress);
        assert_eq!(second.attempt, later.attempt);
    }
}

/// An operation settled late but inside its window holds its key for the
/// rest of the window, and not after: a repeat inside it replays, the same
/// call after it runs as a new operation.
pub async fn late_truth_inside_the_window_holds_until_the_window_ends(
    store: &dyn IdempotencyStore,
) {
    for by_resolution in [true, false] {
        let req = fresh(Duration::from_millis(400));
        claimed(store, &req).await;
        store
            .mark_unknown(&req.key, req.attempt, "timeout")
            .await
            .unwrap();
        settle_late(store, &req, by_resolution).await;
        let r = existing(store, &new_operation(&req)).await;
        assert_eq!(r.reference, req.reference, "by_resolution: {by_resolution}");
        assert!(matches!(r.state, RecordState::Completed { .. }));
        tokio::time::sleep(Duration::from_millis(550)).await;
        let later = new_operation(&req);
        assert_eq!(claimed(store, &later).await, later.reference);
        assert!(matches!(
            record(store, &req).await.map(|r| r.state),
            Some(RecordState::Completed { .. })
        ));
    }
}

/// A superseded operation (its key taken by a later one) reads by its own
/// reference, in its own tenant only, and is listed and counted, until its
/// retention ends; then purge deletes it and leaves the later one.
pub async fn a_superseded_operation_reads_until_its_retention_ends(store: &dyn IdempotencyStore) {
    // A retention long enough for the checks below on a loaded machine;
    // the wait for its end is counted from when the claim had answered.
    let retention = Duration::from_secs(2);
    let first = ClaimRequest {
        retention,
        ..fresh(Duration::from_millis(200))
    };
    claimed(store, &first).await;
    let retained_by = std::time::Instant::now() + retention;
    store
        .complete(&first.key, first.attempt, "\"first\"")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = new_operation(&first);
    assert_eq!(claimed(store, &second).await, second.reference);
    store.purge_expired(100_000).await.unwrap();
    let r = record(store, &first).await.expect("superseded, still kept");
    assert_eq!(r.reference, first.reference);
    assert_eq!(
        r.state,
        RecordState::Completed {
            response: "\"first\"".into()
        }
    );
    assert_eq!(
        store
            .lookup("another-tenant", &first.reference)
            .await
            .unwrap(),
        None,
        "another tenant's reference is not found"
    );
    let listed = store
        .list_records(&RecordFilter {
            tenant: Some(first.tenant.clone()),
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    let mut refs: Vec<_> = listed.iter().map(|r| r.reference).collect();
    refs.sort();
    let mut want = vec![first.reference, second.reference];
    want.sort();
    assert_eq!(refs, want, "both operations are listed");
    assert_eq!(
        listed[0].reference, second.reference,
        "the newest claim first"
    );
    // The superseded one's fencing is gone: its attempt owns nothing.
    assert!(matches!(
        store.complete(&first.key, first.attempt, "1").await,
        Err(StoreError::Fenced)
    ));
    // Its retention ends: purged, and the later operation stays.
    tokio::time::sleep_until((retained_by + Duration::from_millis(100)).into()).await;
    let mut rounds = 0;
    while store.purge_expired(1_000).await.unwrap() == 1_000 && rounds < 10_000 {
        rounds += 1;
    }
    assert_eq!(
        record(store, &first).await,
        None,
        "purged after its retention"
    );
    let r = record(store, &second)
        .await
        .expect("the later operation stays");
    assert_eq!(r.attempt, second.attempt);
}

/// [`Inspect::find_by_reference`] finds every record with the
/// reference, whatever its tenant, among the keys' current records and the
/// superseded operations, the newest claim first, exactly as its default
/// (every record listed, those with the reference kept) finds them; and no
/// record of another operation of the same key, or of another key that
/// starts with the same eight bytes.
pub async fn a_reference_is_found_in_every_tenant(store: &dyn IdempotencyStore) {
    // An operation whose key a later one took: kept, superseded.
    let first = ClaimRequest {
        retention: Duration::from_secs(3600),
        ..fresh(Duration::from_millis(150))
    };
    claimed(store, &first).await;
    store
        .complete(&first.key, first.attempt, "\"first\"")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = new_operation(&first);
    assert_eq!(claimed(store, &second).await, second.reference);
    // Keys that start with the first's eight bytes: another tenant's
    // record under the first's reference (a deliberate copy), and an
    // operation of the first's tenant under a reference of its own.
    let sibling = |tail: [u8; 32]| {
        let mut key = tail;
        key[..8].copy_from_slice(&first.reference.key_prefix());
        IdempotencyKey::from_parts(key, random32())
    };
    let copy_key = sibling(random32());
    let copy = ClaimRequest {
        key: copy_key,
        reference: Reference::with_tag(&copy_key, first.reference.tag()),
        tenant: format!("{}-copy", first.tenant),
        attempt: Attempt::random(),
        ..first.clone()
    };
    assert_eq!(copy.reference, first.reference);
    assert_eq!(claimed(store, &copy).await, first.reference);
    let neighbour_key = sibling(random32());
    let neighbour = ClaimRequest {
        key: neighbour_key,
        reference: Reference::new_operation(&neighbour_key),
        attempt: Attempt::random(),
        ..first.clone()
    };
    claimed(store, &neighbour).await;

    let every = store
        .list_records(&RecordFilter {
            limit: usize::MAX,
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    let seen = |records: &[Record]| -> Vec<(String, Attempt, Reference)> {
        records
            .iter()
            .map(|r| (r.tenant.clone(), r.attempt, r.reference))
            .collect()
    };
    for (reference, want) in [
        (
            first.reference,
            vec![
                (copy.tenant.clone(), copy.attempt, first.reference),
                (first.tenant.clone(), first.attempt, first.reference),
            ],
        ),
        (
            second.reference,
            vec![(second.tenant.clone(), second.attempt, second.reference)],
        ),
        (
            neighbour.reference,
            vec![(first.tenant.clone(), neighbour.attempt, neighbour.reference)],
        ),
        (Reference::new_operation(&sibling(random32())), vec![]),
    ] {
        let found = store.find_by_reference(&reference).await.unwrap();
        assert_eq!(seen(&found), want, "{reference}: the newest claim first");
        let by_default: Vec<Record> = every
            .iter()
            .filter(|r| r.reference == reference)
            .cloned()
            .collect();
        assert_eq!(
            seen(&found),
            seen(&by_default),
            "{reference}: as the default finds it"
        );
    }
    let superseded = store.find_by_reference(&first.reference).await.unwrap();
    assert_eq!(
        superseded[1].state,
        RecordState::Completed {
            response: "\"first\"".into()
        }
    );
}

async fn settle_late(store: &dyn IdempotencyStore, req: &ClaimRequest, by_resolution: bool) {
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
