//! Completions written after the answer (`Executor::with_background_completions`):
//! what the caller, a repeat here, a repeat on another replica and the
//! sweep see while one is pending, and that a crash before it lands ends in
//! a reconcile, never a second charge. Every assertion is about how often
//! the processor stub charged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idem_runtime::maintenance::sweep;
use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::store::RecordStateKind;
use idem_runtime::{
    answer::{Answer, Recording},
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};
use serde::{Deserialize, Serialize};

const LEASE: Duration = Duration::from_secs(3);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
}

/// A card processor stand-in: it charges once per idempotency key (the
/// operation's reference) for 24 h, as a real one keeps keys, takes 10 ms
/// a charge, and counts the charges it made.
#[derive(Clone, Default)]
struct Processor {
    charges: Arc<AtomicUsize>,
    keys: Arc<Mutex<HashMap<String, (String, tokio::time::Instant)>>>,
}

impl Processor {
    fn count(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    async fn charge(&self, ctx: OperationContext) -> Result<Receipt, ToolError> {
        let now = tokio::time::Instant::now();
        let charge_id = {
            let mut keys = self.keys.lock().unwrap();
            keys.retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(24 * 3600));
            let charges = &self.charges;
            let (id, _) = keys.entry(ctx.reference().to_string()).or_insert_with(|| {
                let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                (format!("ch_{n}"), now)
            });
            id.clone()
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(Receipt { charge_id })
    }
}

async fn charge(
    exec: &Executor,
    window: Duration,
    processor: &Processor,
) -> Answer<Receipt, ToolError> {
    let caller = Caller::new("acme", "alice");
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &serde_json::json!({"card": "4242", "amount_cents": 500}),
        scope: ScopeSpec::Window(window),
        status_tool: "get_operation_status",
    };
    let p = processor.clone();
    exec.run(op, move |ctx| async move { p.charge(ctx).await })
        .await
}

/// A MemoryStore on tokio's (paused) clock.
fn memory() -> Arc<MemoryStore> {
    let (origin, base) = (tokio::time::Instant::now(), SystemTime::now());
    Arc::new(MemoryStore::with_clock(move || {
        base + (tokio::time::Instant::now() - origin)
    }))
}

/// `store` as one replica sees it: its completions take `complete_delay`,
/// and once `dead` is set it reaches the store no more (its process died).
fn replica(
    store: &Arc<MemoryStore>,
    complete_delay: Duration,
    dead: &Arc<AtomicBool>,
) -> Arc<dyn IdempotencyStore> {
    let dead = dead.clone();
    Arc::new(FaultyStore::new(store.clone(), move |call| {
        if dead.load(Ordering::SeqCst) {
            Fault::Unreachable
        } else if call == Call::Complete {
            Fault::Delay(complete_delay)
        } else {
            Fault::None
        }
    }))
}

async fn state(store: &MemoryStore, reference: &str) -> RecordStateKind {
    let reference = idem_runtime::Reference::parse(reference).unwrap();
    store
        .lookup("acme", &reference)
        .await
        .unwrap()
        .expect("the record exists")
        .state
        .kind()
}

#[tokio::test(start_paused = true)]
async fn the_answer_comes_first_and_repeats_never_charge_again() {
    let (store, alive) = (memory(), Arc::new(AtomicBool::new(false)));
    let here = Executor::new(replica(&store, Duration::from_millis(500), &alive))
        .with_lease(LEASE)
        .with_background_completions(true);
    let elsewhere = Executor::new(store.clone()).with_lease(LEASE);
    let processor = Processor::default();
    let window = Duration::from_secs(900);

    let started = tokio::time::Instant::now();
    let first = charge(&here, window, &processor).await;
    let Answer::Executed {
        value, recording, ..
    } = &first
    else {
        panic!("the first call runs: {first:?}");
    };
    assert_eq!(*recording, Recording::Pending);
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "answered before the 500 ms completion: {:?}",
        started.elapsed()
    );
    let reference = first.reference().unwrap().to_string();
    assert_eq!(state(&store, &reference).await, RecordStateKind::InProgress);
    assert_eq!(here.pending_completions(), 1);

    // A repeat here: the response, from memory.
    let again = charge(&here, window, &processor).await;
    assert!(
        matches!(&again, Answer::Replayed { value: v, .. } if v == value),
        "{again:?}"
    );
    // A repeat on another replica: in progress, from the store.
    let there = charge(&elsewhere, window, &processor).await;
    assert!(matches!(there, Answer::InProgress { .. }), "{there:?}");

    assert_eq!(here.drain(Duration::from_secs(5)).await, 0);
    assert_eq!(state(&store, &reference).await, RecordStateKind::Completed);
    let there = charge(&elsewhere, window, &processor).await;
    assert!(
        matches!(&there, Answer::Replayed { value: v, .. } if v == value),
        "{there:?}"
    );
    assert_eq!(processor.count(), 1, "charged once");
}

#[tokio::test(start_paused = true)]
async fn a_pending_completion_keeps_its_lease_until_it_lands() {
    let (store, alive) = (memory(), Arc::new(AtomicBool::new(false)));
    // The completion takes three leases to land.
    let here = Executor::new(replica(&store, LEASE * 3, &alive))
        .with_lease(LEASE)
        .with_background_completions(true);
    let processor = Processor::default();
    let first = charge(&here, Duration::from_secs(900), &processor).await;
    let reference = first.reference().unwrap().to_string();
    for _ in 0..8 {
        tokio::time::sleep(LEASE / 3).await;
        assert_eq!(
            sweep(&*store, 100).await.unwrap(),
            0,
            "the heartbeat keeps the lease of a pending completion"
        );
    }
    assert_eq!(here.drain(LEASE * 3).await, 0);
    assert_eq!(state(&store, &reference).await, RecordStateKind::Completed);
    assert_eq!(processor.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_store_is_retried_until_the_completion_lands() {
    let store = memory();
    let failures = Arc::new(AtomicUsize::new(0));
    let flaky: Arc<dyn IdempotencyStore> = {
        let failures = failures.clone();
        Arc::new(FaultyStore::new(store.clone(), move |call| {
            if call == Call::Complete && failures.fetch_add(1, Ordering::SeqCst) < 4 {
                Fault::Unreachable
            } else {
                Fault::None
            }
        }))
    };
    let here = Executor::new(flaky)
        .with_lease(LEASE)
        .with_background_completions(true);
    let processor = Processor::default();
    let first = charge(&here, Duration::from_secs(900), &processor).await;
    assert!(matches!(
        first,
        Answer::Executed {
            recording: Recording::Pending,
            ..
        }
    ));
    assert_eq!(here.drain(Duration::from_secs(30)).await, 0);
    assert_eq!(
        failures.load(Ordering::SeqCst),
        5,
        "four failures, then it landed"
    );
    let reference = first.reference().unwrap().to_string();
    assert_eq!(state(&store, &reference).await, RecordStateKind::Completed);
    assert_eq!(processor.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_crash_before_the_completion_lands_ends_unknown_never_charged_twice() {
    let (store, dead) = (memory(), Arc::new(AtomicBool::new(false)));
    let here = Executor::new(replica(&store, Duration::from_millis(500), &dead))
        .with_lease(LEASE)
        .with_background_completions(true);
    let elsewhere = Executor::new(store.clone()).with_lease(LEASE);
    let processor = Processor::default();
    let window = Duration::from_secs(900);
    let first = charge(&here, window, &processor).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    // The process dies with its completion unwritten.
    dead.store(true, Ordering::SeqCst);
    let reference = first.reference().unwrap().to_string();
    assert_eq!(here.drain(LEASE / 3).await, 1, "it cannot land");

    // Another replica is told "in progress" while the lease runs...
    let there = charge(&elsewhere, window, &processor).await;
    assert!(matches!(there, Answer::InProgress { .. }), "{there:?}");
    // ...then the sweep marks it UNKNOWN, and a repeat is told so.
    tokio::time::sleep(LEASE).await;
    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    assert_eq!(state(&store, &reference).await, RecordStateKind::Unknown);
    let there = charge(&elsewhere, window, &processor).await;
    assert!(matches!(there, Answer::Unknown { .. }), "{there:?}");
    assert_eq!(processor.count(), 1, "never charged again");
}

#[tokio::test(start_paused = true)]
async fn a_response_in_memory_answers_no_longer_than_the_window() {
    let (store, alive) = (memory(), Arc::new(AtomicBool::new(false)));
    let window = Duration::from_secs(1);
    // The completion lands only after the window would have ended.
    let here = Executor::new(replica(&store, Duration::from_secs(2), &alive))
        .with_lease(LEASE)
        .with_background_completions(true);
    let processor = Processor::default();
    let first = charge(&here, window, &processor).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Past the window the table does not answer: the store does, and its
    // record is still in progress.
    let again = charge(&here, window, &processor).await;
    assert!(matches!(again, Answer::InProgress { .. }), "{again:?}");
    assert_eq!(processor.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_background_completions_off_the_completion_is_written_before_the_answer() {
    let (store, alive) = (memory(), Arc::new(AtomicBool::new(false)));
    let here = Executor::new(replica(&store, Duration::from_millis(500), &alive)).with_lease(LEASE);
    let processor = Processor::default();
    let first = charge(&here, Duration::from_secs(900), &processor).await;
    assert!(matches!(
        first,
        Answer::Executed {
            recording: Recording::Stored,
            ..
        }
    ));
    let reference = first.reference().unwrap().to_string();
    assert_eq!(state(&store, &reference).await, RecordStateKind::Completed);
    assert_eq!(here.pending_completions(), 0);
}
