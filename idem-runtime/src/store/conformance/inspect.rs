//! The cases of an operator's reads ([`Inspect`]): `list_records`,
//! `find_by_reference`, `count_records`. One follow-on: the cases, one function
//! each.

use super::*;

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
