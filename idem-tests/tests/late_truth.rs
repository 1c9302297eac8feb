//! The late truth never swallows a purchase: an operation whose outcome was
//! unknown and was found completed later holds its key only for its window.
//! The same call after the window is a new operation, under a new
//! reference, with a charge of its own; the first operation's reference
//! still reads as completed, with its own charge, for its whole retention.
//!
//! Through `Executor::run` as a user calls it, on every store, by each of
//! the four ways a truth arrives late: the reconciler finds the charge, the
//! handler's own completion lands after the sweep marked the record UNKNOWN
//! (its heartbeats failed), a background completion lands after a store
//! outage longer than the lease, and an operator resolves it by hand. Every
//! assertion on effects is about what the processor stub charged.

mod durable;
mod dynamodb_emulator;
mod redis_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::maintenance::{reconcile, sweep, ReconcileConfig, Reconciler, Reconciliation};
use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::store::{Record, RecordStateKind};
use idem_runtime::{
    answer::{Answer, Disposition},
    async_trait,
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, IdempotencyStore, MemoryStore, Reference, SqliteStore, ToolError,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

const STATUS_TOOL: &str = "get_operation_status";

/// How long the processor stub keeps an idempotency key, as Stripe does.
const KEPT: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
}

/// A card processor stand-in: idempotent by the key it is given (the
/// operation's reference), from the request's arrival and for [`KEPT`]. A
/// request whose key it holds gets the first charge back, not a new one.
/// It can time out after charging (`timeouts`), as a real one does.
#[derive(Clone, Debug, Default)]
struct Processor {
    charges: Arc<Mutex<Vec<String>>>,
    keys: Arc<Mutex<HashMap<String, (String, Instant)>>>,
    /// How many of the next requests time out after the charge was made.
    timeouts: Arc<AtomicUsize>,
    /// How long a charge takes.
    takes: Arc<Mutex<Duration>>,
}

impl Processor {
    fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    /// The charge made under `key`, if any (the reconciler's lookup).
    fn charge_by_key(&self, key: &str) -> Option<String> {
        let keys = self.keys.lock().unwrap();
        keys.get(key)
            .filter(|(_, at)| at.elapsed() < KEPT)
            .map(|(id, _)| id.clone())
    }

    async fn charge(&self, ctx: OperationContext) -> Result<Receipt, ToolError> {
        let key = ctx.reference().to_string();
        let charge_id = {
            let mut keys = self.keys.lock().unwrap();
            let fresh = keys.get(&key).is_none_or(|(_, at)| at.elapsed() >= KEPT);
            if fresh {
                let mut charges = self.charges.lock().unwrap();
                charges.push(key.clone());
                keys.insert(
                    key.clone(),
                    (format!("ch_{}", charges.len()), Instant::now()),
                );
            }
            keys[&key].0.clone()
        };
        let takes = *self.takes.lock().unwrap();
        tokio::time::sleep(takes).await;
        let timed_out = self
            .timeouts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if timed_out {
            return Err(ToolError::unknown("the processor timed out"));
        }
        Ok(Receipt { charge_id })
    }
}

/// The reconciler a user writes: the processor, asked by reference.
#[async_trait]
impl Reconciler for Processor {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match self.charge_by_key(&record.reference.to_string()) {
            Some(charge_id) => {
                Reconciliation::completed(serde_json::to_string(&Receipt { charge_id })?)
            }
            None => Reconciliation::not_performed(),
        })
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// Alice taps to pay for a coffee: the same call every time.
async fn tap(
    executor: &Executor,
    processor: &Processor,
    window: Duration,
) -> Answer<Receipt, ToolError> {
    let caller = alice();
    let args = json!({"card": "tok_visa", "amount_cents": 450, "merchant": "cafe"});
    let op = Operation {
        caller: &caller,
        tool: "tap_to_pay",
        args: &args,
        scope: ScopeSpec::Window(window),
        status_tool: STATUS_TOOL,
    };
    executor
        .run(op, |ctx| async move { processor.charge(ctx).await })
        .await
}

/// Whether the caller was told the outcome is unknown: by the handler's
/// own unknown error, or by a repeat that found the record UNKNOWN.
fn unknown<T>(answer: &Answer<T, ToolError>) -> bool {
    matches!(
        answer,
        Answer::Unknown { .. }
            | Answer::Failed {
                disposition: Disposition::Unknown,
                ..
            }
    )
}

fn reference(answer: &Answer<Receipt, ToolError>) -> Reference {
    answer.reference().expect("an answer with a reference")
}

/// After the first operation (`first`) was found completed late: the same
/// tap after its window runs as a new operation with its own reference and
/// charge, and `first` still reads as completed with its own charge.
async fn after_the_window(
    executor: &Executor,
    processor: &Processor,
    window: Duration,
    first: Reference,
    since_claim: Instant,
) {
    let wait = (window + Duration::from_millis(150)).saturating_sub(since_claim.elapsed());
    tokio::time::sleep(wait).await;
    let later = tap(executor, processor, window).await;
    assert!(
        matches!(later, Answer::Executed { .. }),
        "the same tap after the window is an operation the user wanted: {later:?}"
    );
    assert_ne!(reference(&later), first, "a new operation, a new reference");
    assert_eq!(
        processor.charges(),
        2,
        "the second tap must be charged: the late truth swallowed it"
    );
    let old = executor
        .status(&alice(), &first.to_string())
        .await
        .unwrap()
        .expect("the first operation still reads by its reference");
    assert_eq!(old.reference, first.to_string());
    assert_eq!(old.state, RecordStateKind::Completed);
    assert_eq!(
        old.response,
        Some(json!({"charge_id": "ch_1"})),
        "the first reference reads as its own charge"
    );
    // A background completion lands before the new one is read.
    executor.drain(Duration::from_secs(10)).await;
    let new = executor
        .status(&alice(), &reference(&later).to_string())
        .await
        .unwrap()
        .expect("the new operation reads by its reference");
    assert_eq!(new.response, Some(json!({"charge_id": "ch_2"})));
}

/// Path 1: the processor times out after charging (UNKNOWN); the reconciler
/// finds the charge, inside the window or after it.
async fn reconciled(store: Arc<dyn IdempotencyStore>, inside_the_window: bool) {
    let window = Duration::from_millis(1200);
    let executor = Executor::new(store.clone());
    let processor = Processor::default();
    processor.timeouts.store(1, Ordering::SeqCst);
    let claimed = Instant::now();
    let first = tap(&executor, &processor, window).await;
    assert!(unknown(&first), "{first:?}");
    let first = reference(&first);
    if !inside_the_window {
        tokio::time::sleep(window + Duration::from_millis(100)).await;
        let still = tap(&executor, &processor, window).await;
        assert!(
            unknown(&still),
            "an UNKNOWN charge holds its key past the window until resolved: {still:?}"
        );
    }
    let config = ReconcileConfig::default()
        .with_settle(Duration::ZERO)
        .with_batch(100_000);
    reconcile(&*store, &processor, &config).await.unwrap();
    let read = executor
        .status(&alice(), &first.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.state, RecordStateKind::Completed, "reconciled");
    if inside_the_window {
        let repeat = tap(&executor, &processor, window).await;
        assert!(
            matches!(&repeat, Answer::Replayed { value, .. } if value.charge_id == "ch_1"),
            "a repeat inside the window replays the reconciled charge: {repeat:?}"
        );
    }
    assert_eq!(processor.charges(), 1);
    after_the_window(&executor, &processor, window, first, claimed).await;
}

/// Path 2: the heartbeats fail, the sweep marks the live handler UNKNOWN,
/// and the handler's own completion lands after that.
async fn completed_after_the_sweep(store: Arc<dyn IdempotencyStore>) {
    let window = Duration::from_millis(1500);
    let lease = Duration::from_millis(300);
    let faulty: Arc<dyn IdempotencyStore> =
        Arc::new(FaultyStore::new(store.clone(), |call| match call {
            Call::Heartbeat => Fault::Unreachable,
            _ => Fault::None,
        }));
    let executor = Executor::new(faulty).with_lease(lease);
    let processor = Processor::default();
    *processor.takes.lock().unwrap() = Duration::from_millis(900);
    let claimed = Instant::now();
    let sweeper = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(550)).await;
            sweep(&*store, 100_000).await.unwrap()
        })
    };
    let first = tap(&executor, &processor, window).await;
    assert_eq!(
        sweeper.await.unwrap(),
        1,
        "the sweep marked the live handler"
    );
    let first_ref = reference(&first);
    let read = executor
        .status(&alice(), &first_ref.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read.state,
        RecordStateKind::Completed,
        "the handler's truth landed"
    );
    after_the_window(&executor, &processor, window, first_ref, claimed).await;
}

/// Path 3: background completions, and a store outage (completions and
/// heartbeats refused) longer than the lease; the sweep marks the record
/// UNKNOWN, then the outage ends and the pending completion lands.
async fn background_completion_after_an_outage(store: Arc<dyn IdempotencyStore>) {
    let window = Duration::from_millis(1800);
    let lease = Duration::from_millis(300);
    let down = Arc::new(AtomicBool::new(true));
    let outage = down.clone();
    let faulty: Arc<dyn IdempotencyStore> =
        Arc::new(FaultyStore::new(store.clone(), move |call| match call {
            Call::Heartbeat | Call::Complete | Call::CompleteWithFollowOns
                if outage.load(Ordering::SeqCst) =>
            {
                Fault::Unreachable
            }
            _ => Fault::None,
        }));
    let executor = Executor::new(faulty)
        .with_lease(lease)
        .with_background_completions(true);
    let processor = Processor::default();
    let claimed = Instant::now();
    let first = tap(&executor, &processor, window).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    let first_ref = reference(&first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sweep(&*store, 100_000).await.unwrap(),
        1,
        "the lease ran out"
    );
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        executor.drain(Duration::from_secs(10)).await,
        0,
        "it landed"
    );
    let read = executor
        .status(&alice(), &first_ref.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.state, RecordStateKind::Completed);
    after_the_window(&executor, &processor, window, first_ref, claimed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_reconciled_after_the_window() {
    reconciled(Arc::new(MemoryStore::new()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_reconciled_inside_the_window() {
    reconciled(Arc::new(MemoryStore::new()), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_completed_after_the_sweep() {
    completed_after_the_sweep(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_background_completion_after_an_outage() {
    background_completion_after_an_outage(Arc::new(MemoryStore::new())).await;
}

async fn sqlite(dir: &durable::TempDir) -> Arc<dyn IdempotencyStore> {
    Arc::new(SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reconciled_after_the_window() {
    let dir = durable::temp_dir("late-truth");
    reconciled(sqlite(&dir).await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reconciled_inside_the_window() {
    let dir = durable::temp_dir("late-truth");
    reconciled(sqlite(&dir).await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_completed_after_the_sweep() {
    let dir = durable::temp_dir("late-truth");
    completed_after_the_sweep(sqlite(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_background_completion_after_an_outage() {
    let dir = durable::temp_dir("late-truth");
    background_completion_after_an_outage(sqlite(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reconciled_after_the_window() {
    let Some(pg) = durable::PgSchema::new().await else {
        return;
    };
    reconciled(Arc::new(pg.store.clone()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reconciled_inside_the_window() {
    let Some(pg) = durable::PgSchema::new().await else {
        return;
    };
    reconciled(Arc::new(pg.store.clone()), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_completed_after_the_sweep() {
    let Some(pg) = durable::PgSchema::new().await else {
        return;
    };
    completed_after_the_sweep(Arc::new(pg.store.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reconciled_after_the_window() {
    let Some(redis) = redis_server::Prefixed::new().await else {
        return;
    };
    reconciled(Arc::new(redis.store.clone()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reconciled_inside_the_window() {
    let Some(redis) = redis_server::Prefixed::new().await else {
        return;
    };
    reconciled(Arc::new(redis.store.clone()), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_completed_after_the_sweep() {
    let Some(redis) = redis_server::Prefixed::new().await else {
        return;
    };
    completed_after_the_sweep(Arc::new(redis.store.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_reconciled_after_the_window() {
    let Some(table) = dynamodb_emulator::Table::new().await else {
        return;
    };
    reconciled(Arc::new(table.store.clone()), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_completed_after_the_sweep() {
    let Some(table) = dynamodb_emulator::Table::new().await else {
        return;
    };
    completed_after_the_sweep(Arc::new(table.store.clone())).await;
}

/// Path 4: an operator resolves the UNKNOWN charge by hand with the command
/// line (`idem resolve --completed`), on a SQLite file; after the window
/// the same call runs again, and `idem show` still reads the first
/// reference as the resolution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_resolved_by_hand_then_the_same_call_after_the_window() {
    let dir = durable::temp_dir("late-truth-cli");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let executor = Executor::new(store);
    let window = Duration::from_millis(1200);
    let runs = AtomicUsize::new(0);
    let call = |timeout: bool| {
        let (executor, runs, caller) = (&executor, &runs, alice());
        async move {
            let args = json!({"card": "tok_visa", "amount_cents": 450});
            let op = Operation {
                caller: &caller,
                tool: "tap_to_pay",
                args: &args,
                scope: ScopeSpec::Window(window),
                status_tool: STATUS_TOOL,
            };
            executor
                .run(op, |_| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    if timeout {
                        return Err(ToolError::unknown("the processor timed out"));
                    }
                    let result = rmcp::model::CallToolResult::structured(
                        json!({"charge_id": format!("ch_{n}")}),
                    );
                    Ok::<_, ToolError>(result)
                })
                .await
        }
    };
    let claimed = Instant::now();
    let first = call(true).await;
    assert!(unknown(&first), "{first:?}");
    let first = first.reference().unwrap().to_string();
    let resolved = idem(
        &url,
        &[
            "resolve",
            &first,
            "--tenant",
            "acme",
            "--completed",
            r#"{"charge_id":"ch_1"}"#,
            "--note",
            "alice: the dashboard shows ch_1",
        ],
    )
    .await;
    assert_eq!(resolved.0, 0, "{resolved:?}");
    let repeat = call(false).await;
    assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "inside the window: replayed"
    );

    tokio::time::sleep((window + Duration::from_millis(150)).saturating_sub(claimed.elapsed()))
        .await;
    let later = call(false).await;
    assert!(matches!(later, Answer::Executed { .. }), "{later:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the same call after the window ran"
    );
    let later = later.reference().unwrap().to_string();
    assert_ne!(later, first);

    let shown = idem(&url, &["show", &first, "--tenant", "acme", "--json"]).await;
    assert_eq!(shown.0, 0, "{shown:?}");
    let shown: serde_json::Value = serde_json::from_str(&shown.1).unwrap();
    assert_eq!(shown["state"], "COMPLETED", "{shown}");
    assert_eq!(shown["reference"], first.as_str(), "{shown}");
    assert!(
        shown.to_string().contains("ch_1") && !shown.to_string().contains("ch_2"),
        "the first reference reads as its own resolution: {shown}"
    );
}

/// One run of the command line: exit code, standard output, standard error.
async fn idem(store: &str, args: &[&str]) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv: Vec<&str> = ["idem", "--store", store]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let code = idem_cli::run(argv, &mut out, &mut err).await;
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}
