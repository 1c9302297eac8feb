//! What the dispatcher does with the jobs: retries with backoff, the dead
//! letter and its re-drive, jobs nobody handles, two dispatchers on one
//! store, a run over its timeout, the store down meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    answer::{Answer, Recording},
    follow_on,
    follow_ons::{follow_on_fn, FollowOnDispatcher, FollowOnHandlers},
    store::{FollowOnFilter, FollowOnState},
    Executor, IdempotencyStore, MemoryStore, SqliteStore, ToolError,
};
use serde_json::json;

use crate::durable;
use crate::{alice, charge, config, jobs, memory, operation, wait_until, Mailer};

/// A failing mailer is retried with a growing backoff until it takes the
/// mail: three requests, one delivery, the same downstream key each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_job_is_retried_with_backoff_then_delivered() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let mailer = Mailer::new(Duration::ZERO, 2);
    let dispatcher = FollowOnDispatcher::spawn(store.clone(), mailer.handlers(), config())
        .expect("the store keeps follow-ons");
    wait_until("the receipt is delivered", Duration::from_secs(10), || {
        mailer.deliveries() == 1
    })
    .await;
    dispatcher.stop().await;
    let seen = mailer.seen();
    assert_eq!(seen.len(), 1, "one downstream key: {seen:?}");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempts, 3);
    assert_eq!(s.attempt_numbers, [1, 2, 3]);
    // Equal jitter keeps at least half of each pause: 100 ms, then 200 ms.
    let gaps: Vec<Duration> = s.arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(50), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(100), "{gaps:?}");
    assert!(jobs(&*store).await.is_empty());
}

/// After its last attempt a job goes to the dead letter, where it is listed
/// with its error and left alone; re-driven, it is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_then_redrive() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let mailer = Mailer::new(Duration::ZERO, usize::MAX);
    let config = config()
        .with_max_runs(2)
        .with_first_backoff(Duration::from_millis(10));
    let dispatcher = FollowOnDispatcher::spawn(store.clone(), mailer.handlers(), config.clone())
        .expect("the store keeps follow-ons");
    let dead = FollowOnFilter {
        states: vec![FollowOnState::Dead],
        limit: 10,
        ..FollowOnFilter::default()
    };
    let started = Instant::now();
    loop {
        if !store
            .follow_ons()
            .expect("the store keeps jobs")
            .list_follow_ons(&dead)
            .await
            .unwrap()
            .is_empty()
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never buried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let buried = store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_follow_ons(&dead)
        .await
        .unwrap();
    assert_eq!(buried[0].runs, 2);
    assert!(buried[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("mailer down"));
    // Buried means left alone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(mailer.seen().values().next().unwrap().attempts, 2);

    mailer.fail_first.store(0, Ordering::SeqCst);
    assert!(store
        .follow_ons()
        .expect("the store keeps jobs")
        .redrive_follow_on(&buried[0].id)
        .await
        .unwrap());
    wait_until(
        "the re-driven receipt is delivered",
        Duration::from_secs(10),
        || mailer.deliveries() == 1,
    )
    .await;
    dispatcher.stop().await;
    let s = mailer.seen().into_values().next().unwrap();
    assert_eq!(s.attempts, 3);
    assert_eq!(
        s.attempt_numbers,
        [1, 2, 1],
        "re-driven from its first attempt"
    );
    assert!(store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_follow_ons(&dead)
        .await
        .unwrap()
        .is_empty());
}

/// A job whose name no handler runs waits, reported each round, and is
/// delivered by a dispatcher that has the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_without_a_handler_waits_and_is_reported() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    let args = json!({"card": "4242"});
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async {
            follow_on("send_fax", &json!({"to": "+1 555"})).unwrap();
            follow_on("send_receipt", &json!({"to": "a@example.com"})).unwrap();
            Ok("charged".to_owned())
        })
        .await;
    assert!(matches!(answer, Answer::Executed { .. }));
    let mailer = Mailer::new(Duration::ZERO, 0);
    for _ in 0..3 {
        let report = FollowOnDispatcher::round(&*store, &mailer.handlers(), &config())
            .await
            .unwrap();
        assert_eq!(report.unhandled.get("send_fax"), Some(&1), "{report:?}");
    }
    assert_eq!(mailer.deliveries(), 1, "the receipt went out");
    let waiting = jobs(&*store).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].id.name.as_str(), waiting[0].runs),
        ("send_fax", 0)
    );

    let faxes = Arc::new(AtomicUsize::new(0));
    let counted = faxes.clone();
    let with_fax = FollowOnHandlers::new().on(
        "send_fax",
        follow_on_fn(move |_| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }),
    );
    let report = FollowOnDispatcher::round(&*store, &with_fax, &config())
        .await
        .unwrap();
    assert_eq!(report.delivered, 1);
    assert!(report.unhandled.is_empty());
    assert_eq!(faxes.load(Ordering::SeqCst), 1);
    assert!(jobs(&*store).await.is_empty());
}

/// Two dispatchers on one store, twenty jobs and a slow mailer: they work at
/// once (the mailer sees runs overlap, and each dispatcher delivers some),
/// yet no job ever runs in both at the same time, and each is delivered once.
async fn two_dispatchers_share_no_job(
    first: Arc<dyn IdempotencyStore>,
    second: Arc<dyn IdempotencyStore>,
) {
    let executor = Executor::new(first.clone());
    let charges = AtomicUsize::new(0);
    for i in 0..20 {
        let answer = charge(&executor, &json!({"card": "4242", "i": i}), &charges).await;
        assert!(matches!(
            answer,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ));
    }
    let mailer = Mailer::new(Duration::from_millis(40), 0);
    let by_dispatcher: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
    let handlers = |n: Arc<AtomicUsize>| {
        let mailer = mailer.clone();
        FollowOnHandlers::new().on(
            "send_receipt",
            follow_on_fn(move |job| {
                let (mailer, n) = (mailer.clone(), n.clone());
                async move {
                    mailer.send(job).await?;
                    n.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }),
        )
    };
    let config = config().with_batch(3);
    let a = FollowOnDispatcher::spawn(
        first.clone(),
        handlers(by_dispatcher[0].clone()),
        config.clone(),
    )
    .expect("the store keeps follow-ons");
    let b = FollowOnDispatcher::spawn(second, handlers(by_dispatcher[1].clone()), config)
        .expect("the store keeps follow-ons");
    wait_until(
        "every receipt is delivered",
        Duration::from_secs(20),
        || mailer.deliveries() == 20,
    )
    .await;
    a.stop().await;
    b.stop().await;
    let seen = mailer.seen();
    assert_eq!(seen.len(), 20);
    for (key, s) in &seen {
        assert_eq!(s.max_in_flight, 1, "{key} ran in two dispatchers at once");
        assert_eq!(s.attempts, 1, "{key} ran twice: {s:?}");
        assert_eq!(s.deliveries, 1);
    }
    assert!(
        mailer.max_in_flight.load(Ordering::SeqCst) >= 2,
        "the dispatchers never overlapped"
    );
    for (i, n) in by_dispatcher.iter().enumerate() {
        assert!(
            n.load(Ordering::SeqCst) > 0,
            "dispatcher {i} delivered nothing"
        );
    }
    assert!(jobs(&*first).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_one_memory_store() {
    let store = memory();
    two_dispatchers_share_no_job(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_one_sqlite_file() {
    let dir = durable::temp_dir("outbox-two");
    let path = dir.join("idem.sqlite3");
    let a: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let b: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    two_dispatchers_share_no_job(a, b).await;
}

/// A run that outlasts the timeout is cancelled and counts as failed; the
/// next run carries the same downstream key, and the mailer delivers once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_timeout_runs_again_with_the_same_key() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let slow = Mailer::new(Duration::from_millis(300), 0);
    let config = config()
        .with_timeout(Duration::from_millis(100))
        .with_first_backoff(Duration::from_millis(10));
    let report = FollowOnDispatcher::round(&*store, &slow.handlers(), &config)
        .await
        .unwrap();
    assert_eq!(report.retried, 1, "{report:?}");
    let left = jobs(&*store).await;
    assert!(
        left[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("longer than"),
        "{left:?}"
    );
    let quick = Mailer {
        delay: Duration::ZERO,
        ..slow.clone()
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = FollowOnDispatcher::round(&*store, &quick.handlers(), &config)
        .await
        .unwrap();
    assert_eq!(report.delivered, 1, "{report:?}");
    let seen = slow.seen();
    assert_eq!(seen.len(), 1, "one downstream key across both runs");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempt_numbers, [1, 2]);
    assert_eq!(s.deliveries, 1);
}

/// The store down during dispatch: nothing runs and nothing is lost while
/// it is down, and the job is delivered once when it is back. A finish whose
/// write never reached the store leaves the job leased; when the lease runs
/// out it runs again with the same downstream key, and the mailer's dedupe
/// keeps it to one delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_during_dispatch_loses_nothing() {
    use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
    use std::sync::atomic::AtomicBool;

    let inner = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let lost_finishes = Arc::new(AtomicUsize::new(0));
    let (is_down, finishes) = (down.clone(), lost_finishes.clone());
    let store: Arc<dyn IdempotencyStore> = Arc::new(FaultyStore::new(inner.clone(), move |call| {
        if is_down.load(Ordering::SeqCst) {
            return Fault::Unreachable;
        }
        match call {
            // The first finish never reaches the store.
            Call::FinishJob if finishes.fetch_add(1, Ordering::SeqCst) == 0 => Fault::Unreachable,
            _ => Fault::None,
        }
    }));
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    let answer = charge(&executor, &json!({"card": "4242"}), &charges).await;
    assert!(matches!(
        answer,
        Answer::Executed {
            recording: Recording::Stored,
            ..
        }
    ));

    down.store(true, Ordering::SeqCst);
    let mailer = Mailer::new(Duration::ZERO, 0);
    let config = config().with_timeout(Duration::from_millis(150));
    let dispatcher = FollowOnDispatcher::spawn(store.clone(), mailer.handlers(), config)
        .expect("the store keeps follow-ons");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        mailer.seen().is_empty(),
        "nothing ran while the store was down"
    );
    assert_eq!(jobs(&*inner).await.len(), 1, "the job is still there");

    down.store(false, Ordering::SeqCst);
    wait_until("the job is finished", Duration::from_secs(10), || {
        lost_finishes.load(Ordering::SeqCst) >= 2
    })
    .await;
    dispatcher.stop().await;
    assert!(jobs(&*inner).await.is_empty());
    let seen = mailer.seen();
    assert_eq!(seen.len(), 1, "one downstream key: {seen:?}");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempt_numbers, [1, 2], "run again after the lost finish");
    assert_eq!(s.deliveries, 1, "delivered once");
}
