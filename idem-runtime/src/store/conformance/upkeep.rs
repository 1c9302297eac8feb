//! The cases of upkeep ([`Upkeep`]): the sweep of lapsed leases
//! (`list_lapsed`, `mark_lapsed`), the reconcilers' checks (`list_unknown`,
//! `take_check`, `defer_check`) and resolutions (`resolve`), and the purge
//! (`purge_expired`). One follow-on: the cases, one function each.

use super::*;

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
