//! The cases of a call's steps ([`IdempotencyStore`]): claims, heartbeats,
//! completions, releases, marks of UNKNOWN, and how a record reads by its
//! reference ([`lookup`](IdempotencyStore::lookup)). A case may set a record
//! up with an upkeep step (a resolution, a purge) or read it back with a
//! listing; what it holds is the call's steps. One follow-on: the cases, one
//! function each.

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
