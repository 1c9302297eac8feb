//! The follow-ons' cases: follow-ons written with a completion, leased,
//! retried, buried, re-driven and listed. One follow-on: the cases, one function
//! each.

use super::*;

/// Every follow-on case starts here: a store that does not keep follow-on
/// follow-ons fails it at once, with `Unsupported` in the message.
fn require_follow_ons(store: &dyn IdempotencyStore) -> &dyn FollowOnStore {
    store.follow_ons().unwrap_or_else(|| {
        panic!(
            "StoreError::Unsupported: the {} store does not keep follow-ons \
             (follow_ons() is None)",
            store.backend()
        )
    })
}

/// A follow-on name of this case only: cases share a store, and a lease takes
/// every due follow-on of the names it is given.
fn job_name(what: &str) -> String {
    format!("{what}_{}", Attempt::random().get())
}

fn follow_on(name: &str, payload: serde_json::Value) -> FollowOn {
    FollowOn::new(name, &payload).expect("a valid follow-on")
}

async fn jobs_of(store: &dyn FollowOnStore, req: &ClaimRequest) -> Vec<FollowOnRecord> {
    store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            reference: Some(req.reference),
            limit: 100,
            ..FollowOnFilter::default()
        })
        .await
        .expect("list_jobs")
}

fn job_id(req: &ClaimRequest, name: &str) -> FollowOnId {
    FollowOnId {
        tenant: req.tenant.clone(),
        reference: req.reference,
        name: name.to_owned(),
    }
}

/// Completes `req` with `response` and the follow-ons `jobs`.
async fn complete_with(
    store: &dyn FollowOnStore,
    req: &ClaimRequest,
    response: &str,
    jobs: &[FollowOn],
) {
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            response,
            FollowOns::new(jobs).unwrap(),
        )
        .await
        .expect("complete_with_follow_ons");
}

/// A record completed with follow-ons and its follow-ons, due at once, not run.
async fn completed_with_jobs(store: &dyn FollowOnStore, names: &[&str]) -> ClaimRequest {
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs: Vec<FollowOn> = names
        .iter()
        .map(|n| follow_on(n, serde_json::json!({ "to": "a@example.com" })))
        .collect();
    complete_with(store, &req, "\"paid\"", &jobs).await;
    req
}

/// The completion and its follow-ons are written together: the record is
/// COMPLETED and every follow-on waits, due, unleased, with its payload.
pub async fn follow_ons_are_written_with_the_completion(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
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
    complete_with(store, &req, "\"paid\"", &jobs).await;
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
        assert_eq!(job.runs, 0);
        assert_eq!(job.attempt, None);
        assert!(!job.dead);
        assert_eq!(job.last_error, None);
        assert!(job.next_run_at <= job.created_at + Duration::from_secs(1));
    }
    // The empty list is a plain completion, on any record.
    let plain = fresh(W);
    claimed(store, &plain).await;
    store
        .complete_with_follow_ons(&plain.key, plain.attempt, "1", FollowOns::new(&[]).unwrap())
        .await
        .unwrap();
    assert!(jobs_of(store, &plain).await.is_empty());
}

/// A completion that is refused (another attempt owns the record, or it is
/// already COMPLETED) writes none of its follow-ons.
pub async fn refused_completion_writes_no_follow_ons(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs = [follow_on(&name, serde_json::json!(1))];
    let stale = again(&req).attempt;
    assert!(matches!(
        store
            .complete_with_follow_ons(&req.key, stale, "\"x\"", FollowOns::new(&jobs).unwrap())
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
            .complete_with_follow_ons(
                &req.key,
                req.attempt,
                "\"again\"",
                FollowOns::new(&jobs).unwrap()
            )
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

/// Two follow-ons with one name in one completion are refused where the list is
/// built (`FollowOns::new`), before any store is asked, and nothing is
/// written: the record stays IN_PROGRESS and no follow-on exists.
pub async fn repeated_follow_on_name_writes_nothing(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = fresh(W);
    claimed(store, &req).await;
    let jobs = [
        follow_on(&name, serde_json::json!(1)),
        follow_on(&name, serde_json::json!(2)),
    ];
    match FollowOns::new(&jobs) {
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
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let jobs = [follow_on(&name, serde_json::json!({"late": true}))];
    let running = fresh(W);
    claimed(store, &running).await;
    assert!(matches!(
        store
            .resolve_with_follow_ons(
                &running.key,
                running.attempt,
                "1",
                None,
                FollowOns::new(&jobs).unwrap()
            )
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
            FollowOns::new(&jobs).unwrap(),
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

/// Of 16 concurrent leases, exactly one gets a due follow-on; it carries that
/// lease's attempt and its first attempt, and no later lease returns it while
/// the lease holds.
pub async fn concurrent_leases_share_no_follow_on(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let tokens: Vec<Attempt> = (0..16).map(|_| Attempt::random()).collect();
    let names = [name.as_str()];
    let leases = join_all(
        tokens
            .iter()
            .map(|t| store.lease_follow_ons(&names, 10, Duration::from_secs(60), *t)),
    )
    .await;
    let mut winners = Vec::new();
    for (lease, attempt) in leases.into_iter().zip(&tokens) {
        for job in lease.expect("lease_jobs") {
            winners.push((job, *attempt));
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one lease gets the job: {winners:?}"
    );
    let (job, attempt) = &winners[0];
    assert_eq!(job.id, job_id(&req, &name));
    assert_eq!(job.attempt, Some(*attempt));
    assert_eq!(job.runs, 1);
    assert!(job.next_run_at > job.created_at, "leased until later");
    let later = store
        .lease_follow_ons(&names, 10, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert!(
        later.is_empty(),
        "a held lease is not leased again: {later:?}"
    );
}

/// A lease returns only due follow-ons whose names it handles; a follow-on of another
/// name waits, counted by `count_due_follow_ons`, and is leased by a dispatcher
/// that handles it.
pub async fn lease_takes_only_its_names(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let (mine, other) = (job_name("receipt"), job_name("nobody_handles"));
    let req = completed_with_jobs(store, &[&mine, &other]).await;
    let leased = store
        .lease_follow_ons(
            &[mine.as_str()],
            10,
            Duration::from_secs(60),
            Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].id, job_id(&req, &mine));
    let due = store.count_due_follow_ons().await.unwrap();
    assert_eq!(
        due.get(&other),
        Some(&1),
        "the waiting job is counted: {due:?}"
    );
    assert_eq!(due.get(&mine), None, "a leased job is not due: {due:?}");
    let waiting = jobs_of(store, &req).await;
    let unleased = waiting.iter().find(|j| j.id.name == other).unwrap();
    assert_eq!((unleased.runs, unleased.attempt), (0, None));
    let taken = store
        .lease_follow_ons(
            &[other.as_str()],
            10,
            Duration::from_secs(60),
            Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(store
        .lease_follow_ons(&[], 10, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap()
        .is_empty());
}

/// `limit` bounds a lease, and the longest due go first.
pub async fn lease_respects_its_limit(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let mut reqs = Vec::new();
    for _ in 0..3 {
        reqs.push(completed_with_jobs(store, &[&name]).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let names = [name.as_str()];
    let first = store
        .lease_follow_ons(&names, 2, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].id.reference, reqs[0].reference, "oldest first");
    let rest = store
        .lease_follow_ons(&names, 2, Duration::from_secs(60), Attempt::random())
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id.reference, reqs[2].reference);
}

/// finish, retry and bury act only for the attempt that holds the lease; a
/// finished follow-on is delivered, and finishing it again is fenced.
pub async fn follow_on_changes_are_fenced_by_the_token(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let attempt = Attempt::random();
    let leased = store
        .lease_follow_ons(&[name.as_str()], 1, Duration::from_secs(60), attempt)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    let stranger = Attempt::random();
    assert!(matches!(
        store.finish_follow_on(&id, stranger).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store
            .retry_follow_on(&id, stranger, Duration::ZERO, "boom")
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.bury_follow_on(&id, stranger, "boom").await,
        Err(StoreError::Fenced)
    ));
    let still = jobs_of(store, &req).await;
    assert_eq!(
        still[0].attempt,
        Some(attempt),
        "the stranger changed nothing"
    );
    assert!(!still[0].dead);
    store.finish_follow_on(&id, attempt).await.unwrap();
    let states: Vec<FollowOnState> = jobs_of(store, &req)
        .await
        .iter()
        .map(FollowOnRecord::state)
        .collect();
    assert_eq!(
        states,
        [FollowOnState::Delivered],
        "a finished job is delivered"
    );
    assert!(matches!(
        store.finish_follow_on(&id, attempt).await,
        Err(StoreError::Fenced)
    ));
    let missing = job_id(&req, "never_declared");
    assert!(matches!(
        store.finish_follow_on(&missing, attempt).await,
        Err(StoreError::Fenced)
    ));
}

/// A retried follow-on gives up its lease, keeps its error, waits its delay, and
/// is then leased again with its next attempt; the old attempt is fenced.
pub async fn retried_follow_on_runs_again_after_its_delay(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    let first = Attempt::random();
    store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), first)
        .await
        .unwrap();
    // The delay is judged on the store's clock from the retry's write, which
    // comes after `retried`: a lease that returned before `retried + delay`
    // ran before the delay was over. An emulator on a loaded machine can
    // take longer than that; the early check is then not judged.
    let delay = Duration::from_secs(1);
    let retried = std::time::Instant::now();
    store
        .retry_follow_on(&id, first, delay, "mailer down")
        .await
        .unwrap();
    let waiting = jobs_of(store, &req).await;
    assert_eq!(waiting[0].attempt, None);
    assert_eq!(waiting[0].last_error.as_deref(), Some("mailer down"));
    let early_attempt = Attempt::random();
    let early = store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), early_attempt)
        .await
        .unwrap();
    if retried.elapsed() < delay {
        assert!(early.is_empty(), "not before its delay");
    }
    assert!(
        matches!(
            store.finish_follow_on(&id, first).await,
            Err(StoreError::Fenced)
        ),
        "a retry gives the lease up"
    );
    let (again, second) = if early.is_empty() {
        tokio::time::sleep((delay + Duration::from_millis(200)).saturating_sub(retried.elapsed()))
            .await;
        let second = Attempt::random();
        let again = store
            .lease_follow_ons(&names, 1, Duration::from_secs(60), second)
            .await
            .unwrap();
        (again, second)
    } else {
        (early, early_attempt)
    };
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].runs, 2);
    assert_eq!(again[0].last_error.as_deref(), Some("mailer down"));
    store.finish_follow_on(&id, second).await.unwrap();
}

/// A lease that ran out (its dispatcher died) lets another dispatcher take
/// the follow-on; the first one's attempt is then fenced.
pub async fn lapsed_follow_on_lease_is_taken_over(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    let dead = Attempt::random();
    store
        .lease_follow_ons(&names, 1, Duration::from_millis(100), dead)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.count_due_follow_ons().await.unwrap().get(&name),
        Some(&1)
    );
    let live = Attempt::random();
    let taken = store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), live)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].runs, 2);
    assert!(matches!(
        store.finish_follow_on(&id, dead).await,
        Err(StoreError::Fenced)
    ));
    store.finish_follow_on(&id, live).await.unwrap();
}

/// A buried follow-on is dead: listed, never leased, until re-driven, after which
/// it runs again from its first attempt. Its history stays readable: the
/// runs before each re-drive add up, the error it died of is kept apart,
/// and no error from before a re-drive reads as a run's since. Re-driving a
/// live or absent follow-on changes nothing.
pub async fn buried_follow_on_is_listed_and_redriven(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    assert!(
        !store.redrive_follow_on(&id).await.unwrap(),
        "a live job is not re-driven"
    );
    // Two runs: one retried, one buried.
    let first = Attempt::random();
    store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), first)
        .await
        .unwrap();
    store
        .retry_follow_on(&id, first, Duration::ZERO, "timed out")
        .await
        .unwrap();
    let attempt = Attempt::random();
    let leased = store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), attempt)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "a retried job is due again");
    store.bury_follow_on(&id, attempt, "bounced").await.unwrap();
    let dead = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![FollowOnState::Dead],
            limit: 10,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert!(dead[0].dead);
    assert_eq!(dead[0].attempt, None);
    assert_eq!(dead[0].last_error.as_deref(), Some("bounced"));
    assert_eq!((dead[0].runs, dead[0].earlier_runs), (2, 0));
    assert_eq!(dead[0].error_before_redrive, None);
    let live = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![FollowOnState::Waiting, FollowOnState::Running],
            limit: 10,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert!(live.is_empty());
    assert!(
        store
            .lease_follow_ons(&names, 1, Duration::from_secs(60), Attempt::random())
            .await
            .unwrap()
            .is_empty(),
        "a dead job is not leased"
    );
    assert_eq!(store.count_due_follow_ons().await.unwrap().get(&name), None);
    assert!(
        matches!(
            store.finish_follow_on(&id, attempt).await,
            Err(StoreError::Fenced)
        ),
        "burial gives the lease up"
    );

    assert!(store.redrive_follow_on(&id).await.unwrap());
    assert!(!store.redrive_follow_on(&id).await.unwrap(), "already live");
    let redriven = only_job(store, &id).await;
    assert_eq!(redriven.state(), FollowOnState::Waiting);
    assert_eq!(
        (redriven.runs, redriven.earlier_runs, redriven.all_runs()),
        (0, 2, 2),
        "the runs before the re-drive are kept apart"
    );
    assert_eq!(
        redriven.last_error, None,
        "no run since the re-drive failed"
    );
    assert_eq!(redriven.error_before_redrive.as_deref(), Some("bounced"));
    let again = Attempt::random();
    let back = store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), again)
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].runs, 1, "re-driven from its first attempt");
    assert_eq!(back[0].all_runs(), 3);
    assert!(!back[0].dead);

    // Buried and re-driven again: the earlier runs add up, and the error
    // kept is the latest death's.
    store
        .bury_follow_on(&id, again, "bounced again")
        .await
        .unwrap();
    assert!(store.redrive_follow_on(&id).await.unwrap());
    let twice = only_job(store, &id).await;
    assert_eq!((twice.runs, twice.earlier_runs), (0, 3));
    assert_eq!(twice.last_error, None);
    assert_eq!(twice.error_before_redrive.as_deref(), Some("bounced again"));
    let last = Attempt::random();
    store
        .lease_follow_ons(&names, 1, Duration::from_secs(60), last)
        .await
        .unwrap();
    store.finish_follow_on(&id, last).await.unwrap();
    let delivered = only_job(store, &id).await;
    assert_eq!(delivered.state(), FollowOnState::Delivered);
    assert_eq!(
        delivered.all_runs(),
        4,
        "delivered by its fourth run in all"
    );
    assert_eq!(delivered.last_error, None);
    let absent = job_id(&req, "never_declared");
    assert!(!store.redrive_follow_on(&absent).await.unwrap());
}

/// A follow-on belongs to its operation: the same call completed again after its
/// window writes its follow-ons under its own reference, and never replaces,
/// re-dues or revives the earlier operation's follow-ons, dead or running. Each
/// keeps its own downstream key.
pub async fn a_later_operation_never_touches_an_earlier_operations_follow_ons(
    store: &dyn IdempotencyStore,
) {
    let store = require_follow_ons(store);
    let (dead_name, running_name) = (job_name("receipt"), job_name("ship"));
    let names = [dead_name.as_str(), running_name.as_str()];
    let first = fresh(Duration::from_millis(300));
    claimed(store, &first).await;
    let jobs = [
        follow_on(&dead_name, serde_json::json!({"n": 1})),
        follow_on(&running_name, serde_json::json!({"n": 1})),
    ];
    complete_with(store, &first, "\"one\"", &jobs).await;
    // The first operation's receipt goes to the dead letter; its shipment
    // is leased and still running.
    let attempt = Attempt::random();
    let leased = store
        .lease_follow_ons(&names, 10, Duration::from_secs(60), attempt)
        .await
        .unwrap();
    assert_eq!(leased.len(), 2, "{leased:?}");
    store
        .bury_follow_on(&job_id(&first, &dead_name), attempt, "mailbox full")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(450)).await;
    let second = new_operation(&first);
    assert_eq!(claimed(store, &second).await, second.reference);
    let jobs = [
        follow_on(&dead_name, serde_json::json!({"n": 2})),
        follow_on(&running_name, serde_json::json!({"n": 2})),
    ];
    complete_with(store, &second, "\"two\"", &jobs).await;

    // Only the second operation's follow-ons are due: the running one of the first
    // is not handed to a second dispatcher under the same key.
    let other = Attempt::random();
    let due = store
        .lease_follow_ons(&names, 10, Duration::from_secs(60), other)
        .await
        .unwrap();
    assert_eq!(due.len(), 2, "{due:?}");
    assert!(due.iter().all(|j| j.id.reference == second.reference));
    assert!(due.iter().all(|j| j.payload.contains('2')));
    // The first operation's follow-ons are as they were: the dead one dead (and
    // re-drivable), the running one still held by its lease.
    let kept = jobs_of(store, &first).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    let dead = kept.iter().find(|j| j.id.name == dead_name).unwrap();
    assert!(dead.dead);
    assert_eq!(dead.last_error.as_deref(), Some("mailbox full"));
    assert!(dead.payload.contains('1'));
    let running = kept.iter().find(|j| j.id.name == running_name).unwrap();
    assert_eq!(running.attempt, Some(attempt));
    assert!(!running.dead);
    store
        .finish_follow_on(&job_id(&first, &running_name), attempt)
        .await
        .expect("the first operation's lease still holds its job");
    assert!(store
        .redrive_follow_on(&job_id(&first, &dead_name))
        .await
        .unwrap());
    assert_ne!(
        job_id(&first, &dead_name).downstream_key(),
        job_id(&second, &dead_name).downstream_key(),
        "each operation's job has its own downstream key"
    );
}

/// `list_follow_ons` filters by tenant, reference, name and dead, the oldest
/// first, at most `limit`; another tenant's follow-ons are not listed under it.
pub async fn follow_ons_are_listed_by_filter(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let (a, b) = (job_name("a"), job_name("b"));
    let first = completed_with_jobs(store, &[&a, &b]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = completed_with_jobs(store, &[&a]).await;
    let by_name = store
        .list_follow_ons(&FollowOnFilter {
            name: Some(a.clone()),
            limit: 10,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        by_name.iter().map(|j| j.id.reference).collect::<Vec<_>>(),
        [first.reference, second.reference],
        "oldest first"
    );
    let one = store
        .list_follow_ons(&FollowOnFilter {
            name: Some(a.clone()),
            limit: 1,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let of_first = jobs_of(store, &first).await;
    assert_eq!(of_first.len(), 2);
    let elsewhere = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(second.tenant.clone()),
            reference: Some(first.reference),
            limit: 10,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert!(elsewhere.is_empty(), "another tenant's jobs: {elsewhere:?}");
}

/// A default filter lists a page of follow-ons, not none: the dead-letter listing
/// `FollowOnFilter { states: vec![FollowOnState::Dead], ..FollowOnFilter::default() }` finds a buried
/// follow-on, and the default filter a live one.
pub async fn default_follow_on_filter_lists_a_page(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let (dead_name, live_name) = (job_name("bounced"), job_name("receipt"));
    let req = completed_with_jobs(store, &[&dead_name, &live_name]).await;
    let attempt = Attempt::random();
    let leased = store
        .lease_follow_ons(&[dead_name.as_str()], 1, Duration::from_secs(60), attempt)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    store
        .bury_follow_on(&job_id(&req, &dead_name), attempt, "bounced")
        .await
        .unwrap();
    let dead = store
        .list_follow_ons(&FollowOnFilter {
            states: vec![FollowOnState::Dead],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert!(!dead.is_empty(), "the default filter lists no dead job");
    let dead_here = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![FollowOnState::Dead],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        dead_here.iter().map(|j| &j.id).collect::<Vec<_>>(),
        [&job_id(&req, &dead_name)]
    );
    let all_here = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(all_here.len(), 2, "{all_here:?}");
}

/// A finished follow-on is kept as delivered: listed in that state with when and
/// by which run, never leased again (not even once its lease's time has
/// passed), not counted as due, and left alone by a retry, a burial or a
/// re-drive.
pub async fn finished_follow_on_is_kept_as_delivered(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let name = job_name("receipt");
    let req = completed_with_jobs(store, &[&name]).await;
    let id = job_id(&req, &name);
    let names = [name.as_str()];
    let first = Attempt::random();
    store
        .lease_follow_ons(&names, 1, Duration::from_millis(100), first)
        .await
        .unwrap();
    store
        .retry_follow_on(&id, first, Duration::ZERO, "mailer down")
        .await
        .unwrap();
    let second = Attempt::random();
    let leased = store
        .lease_follow_ons(&names, 1, Duration::from_millis(100), second)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(
        leased[0].delivered_at, None,
        "a leased job is not delivered"
    );
    store.finish_follow_on(&id, second).await.unwrap();
    let record = existing(store, &req).await;

    let delivered = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![FollowOnState::Delivered],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    let job = &delivered[0];
    assert_eq!(job.id, id);
    assert_eq!(job.state(), FollowOnState::Delivered);
    assert_eq!(job.runs, 2, "delivered by its second run");
    assert_eq!(job.attempt, None, "a delivered job is leased by nobody");
    assert!(!job.dead);
    assert_eq!(job.last_error.as_deref(), Some("mailer down"));
    let at = job.delivered_at.expect("delivered_at");
    assert!(at >= job.created_at, "delivered after it was written");
    assert_eq!(job.updated_at, at);
    assert_eq!(
        job.kept_until,
        Some(record.retain_until),
        "kept as long as its record"
    );
    let not_delivered = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![
                FollowOnState::Waiting,
                FollowOnState::Running,
                FollowOnState::Dead,
            ],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert!(not_delivered.is_empty(), "{not_delivered:?}");

    // Past the end of the lease that delivered it: still never due.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        store
            .lease_follow_ons(&names, 10, Duration::from_secs(60), Attempt::random())
            .await
            .unwrap()
            .is_empty(),
        "a delivered job is never leased again"
    );
    assert_eq!(
        store.count_due_follow_ons().await.unwrap().get(&name),
        None,
        "a delivered job is not due"
    );
    assert!(matches!(
        store
            .retry_follow_on(&id, second, Duration::ZERO, "late")
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.bury_follow_on(&id, second, "late").await,
        Err(StoreError::Fenced)
    ));
    assert!(
        !store.redrive_follow_on(&id).await.unwrap(),
        "a delivered job is not re-driven"
    );
    assert_eq!(
        jobs_of(store, &req).await,
        delivered,
        "nothing changed the delivered job"
    );
}

/// A delivered follow-on lives as long as its operation's record: every purge
/// before the record expires keeps it, and the purge that deletes the
/// record deletes it too. A follow-on not delivered is never purged.
pub async fn delivered_follow_on_is_purged_with_its_record(store: &dyn IdempotencyStore) {
    let store = require_follow_ons(store);
    let (sent, waiting) = (job_name("receipt"), job_name("ship"));
    let req = ClaimRequest {
        retention: Duration::from_millis(1500),
        ..fresh(Duration::from_millis(1500))
    };
    claimed(store, &req).await;
    let jobs = [
        follow_on(&sent, serde_json::json!({ "to": "a@example.com" })),
        follow_on(&waiting, serde_json::json!({ "sku": "42" })),
    ];
    complete_with(store, &req, "\"paid\"", &jobs).await;
    let attempt = Attempt::random();
    store
        .lease_follow_ons(&[sent.as_str()], 1, Duration::from_secs(60), attempt)
        .await
        .unwrap();
    store
        .finish_follow_on(&job_id(&req, &sent), attempt)
        .await
        .unwrap();

    let purge_all = || async {
        for _ in 0..10_000 {
            if store.purge_expired(1000).await.unwrap() < 1000 {
                break;
            }
        }
    };
    purge_all().await;
    assert!(record(store, &req).await.is_some(), "the record is live");
    let mut states: Vec<(String, FollowOnState)> = jobs_of(store, &req)
        .await
        .iter()
        .map(|j| (j.id.name.clone(), j.state()))
        .collect();
    states.sort();
    let mut expected = vec![
        (sent.clone(), FollowOnState::Delivered),
        (waiting.clone(), FollowOnState::Waiting),
    ];
    expected.sort();
    assert_eq!(states, expected, "kept while its record lives");

    tokio::time::sleep(Duration::from_millis(1700)).await;
    purge_all().await;
    assert!(record(store, &req).await.is_none(), "the record is purged");
    let left: Vec<String> = jobs_of(store, &req)
        .await
        .into_iter()
        .map(|j| j.id.name)
        .collect();
    assert_eq!(
        left,
        [waiting],
        "the delivered job went with its record; the waiting one stays"
    );
    assert!(store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![FollowOnState::Delivered],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap()
        .is_empty());
}

/// The one follow-on with `id`, read through `list_follow_ons`.
async fn only_job(store: &dyn FollowOnStore, id: &FollowOnId) -> FollowOnRecord {
    let found = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(id.tenant.clone()),
            reference: Some(id.reference),
            name: Some(id.name.clone()),
            limit: 10,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "one job with id {id}: {found:?}");
    found.into_iter().next().unwrap()
}
