//! Repeats of a call this executor is running are answered "in progress"
//! from its own table of running claims, without a store round trip; the
//! store stays the truth for everything else. A processor stub counts its
//! invocations and dedupes by the idempotency reference it is given, from
//! the moment a request arrives; a store wrapper counts the claims that
//! reached the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::{
    answer::Answer,
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, MemoryStore, ToolError,
};
use serde_json::{json, Value};

const STATUS_TOOL: &str = "get_operation_status";

/// A processor stand-in: every request it receives, by the reference it was
/// given; it takes `delay` per request, and `panics` after it if told to.
#[derive(Clone, Default)]
struct Processor {
    received: Arc<Mutex<HashMap<String, usize>>>,
    delay: Duration,
    panics: bool,
}

impl Processor {
    fn sleeping(delay: Duration) -> Self {
        Processor {
            delay,
            ..Processor::default()
        }
    }

    fn requests(&self) -> usize {
        self.received.lock().unwrap().values().sum()
    }

    /// How many distinct operations it performed (one per reference).
    fn performed(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    async fn charge(&self, ctx: OperationContext) -> Result<Value, ToolError> {
        *self
            .received
            .lock()
            .unwrap()
            .entry(ctx.reference().to_string())
            .or_default() += 1;
        tokio::time::sleep(self.delay).await;
        assert!(!self.panics, "the processor's client panicked");
        Ok(json!({ "charge_id": format!("ch_{}", ctx.reference()) }))
    }
}

/// MemoryStore, counting the claims that reach it.
fn counted() -> (Executor, Arc<AtomicUsize>) {
    let claims = Arc::new(AtomicUsize::new(0));
    let seen = claims.clone();
    let store = FaultyStore::new(MemoryStore::new(), move |call| {
        if call == Call::Claim {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        Fault::None
    });
    (Executor::new(Arc::new(store)), claims)
}

async fn charge(
    exec: &Executor,
    scope: ScopeSpec<'static>,
    args: &Value,
    processor: &Processor,
) -> Answer<Value, ToolError> {
    let caller = Caller::new("acme", "alice");
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args,
        scope,
        status_tool: STATUS_TOOL,
    };
    let p = processor.clone();
    exec.run(op, move |ctx| async move { p.charge(ctx).await })
        .await
}

const WINDOW: ScopeSpec<'static> = ScopeSpec::Window(Duration::from_secs(900));

fn spawn(
    exec: &Executor,
    scope: ScopeSpec<'static>,
    args: Value,
    processor: &Processor,
) -> tokio::task::JoinHandle<Answer<Value, ToolError>> {
    let (exec, processor) = (exec.clone(), processor.clone());
    tokio::spawn(async move { charge(&exec, scope, &args, &processor).await })
}

/// Another operation running beside the test's, for as long as the test
/// lasts, so the table is never empty: an entry left behind would be found.
async fn beside(exec: &Executor) -> tokio::task::JoinHandle<Answer<Value, ToolError>> {
    let processor = Processor::sleeping(Duration::from_secs(30));
    let running = spawn(exec, WINDOW, json!({"card": "beside"}), &processor);
    received(&processor, 1).await;
    running
}

/// Waits (bounded) until the processor has received `n` requests.
async fn received(processor: &Processor, n: usize) {
    for _ in 0..500 {
        if processor.requests() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the processor never received {n} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_of_a_running_call_are_answered_in_progress_without_the_store() {
    let (exec, claims) = counted();
    let other = beside(&exec).await;
    let processor = Processor::sleeping(Duration::from_millis(400));
    let args = json!({"card": "4242", "amount_cents": 500});
    let first = spawn(&exec, WINDOW, args.clone(), &processor);
    received(&processor, 1).await;
    assert_eq!(claims.load(Ordering::SeqCst), 2);

    // A hundred repeats at once, on other tasks (and clones of the executor),
    // while the first is inside the processor.
    let repeats: Vec<_> = (0..100)
        .map(|_| spawn(&exec.clone(), WINDOW, args.clone(), &processor))
        .collect();
    for repeat in repeats {
        let answer = repeat.await.unwrap();
        match &answer {
            Answer::InProgress {
                status_tool,
                retry_after,
                ..
            } => {
                assert_eq!(status_tool, STATUS_TOOL);
                // At once into a tool with no history: the shortest hint.
                assert_eq!(*retry_after, Duration::from_secs(1));
            }
            other => panic!("a repeat while it runs is in progress, not {other:?}"),
        }
    }
    assert_eq!(
        claims.load(Ordering::SeqCst),
        2,
        "no repeat reached the store"
    );

    let first = first.await.unwrap();
    assert_eq!(first.name(), "executed", "{first:?}");
    let reference = first.reference().unwrap();
    assert_eq!(processor.requests(), 1, "the processor was called once");
    assert_eq!(processor.performed(), 1);

    // Once it is done, the store answers: a replay of the recorded result.
    let after = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(after.name(), "replayed", "{after:?}");
    assert_eq!(after.reference(), Some(reference));
    assert_eq!(
        claims.load(Ordering::SeqCst),
        3,
        "the repeat asked the store"
    );
    assert_eq!(processor.requests(), 1);
    other.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_arguments_under_a_running_business_key_are_a_conflict_from_the_store() {
    let (exec, claims) = counted();
    let processor = Processor::sleeping(Duration::from_millis(300));
    let scope = ScopeSpec::BusinessKey {
        fields: &["order_id"],
        retention: None,
    };
    let first = spawn(
        &exec,
        scope,
        json!({"order_id": "o-1", "amount_cents": 500}),
        &processor,
    );
    received(&processor, 1).await;
    let other = charge(
        &exec,
        scope,
        &json!({"order_id": "o-1", "amount_cents": 900}),
        &processor,
    )
    .await;
    assert_eq!(other.name(), "conflict", "{other:?}");
    assert_eq!(
        claims.load(Ordering::SeqCst),
        2,
        "the conflict came from the store"
    );
    assert_eq!(first.await.unwrap().name(), "executed");
    assert_eq!(processor.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_the_table_and_the_store_answers_its_repeat() {
    let (exec, claims) = counted();
    let other = beside(&exec).await;
    let processor = Processor::sleeping(Duration::from_secs(30));
    let args = json!({"card": "4242", "amount_cents": 500});
    let first = spawn(&exec, WINDOW, args.clone(), &processor);
    received(&processor, 1).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    let repeat = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(
        claims.load(Ordering::SeqCst),
        3,
        "the repeat asked the store"
    );
    // The call was dropped inside the processor: its outcome is unknown, and
    // it never runs again.
    assert!(
        matches!(repeat.name(), "unknown" | "in_progress"),
        "{repeat:?}"
    );
    assert_eq!(processor.requests(), 1);
    other.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_leaves_the_table_and_the_store_answers_its_repeat() {
    let (exec, claims) = counted();
    let other = beside(&exec).await;
    let processor = Processor {
        panics: true,
        ..Processor::sleeping(Duration::from_millis(50))
    };
    let args = json!({"card": "4242", "amount_cents": 500});
    let first = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(first.name(), "unknown", "{first:?}");
    let repeat = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(repeat.name(), "unknown", "{repeat:?}");
    assert_eq!(
        claims.load(Ordering::SeqCst),
        3,
        "the repeat asked the store"
    );
    assert_eq!(processor.requests(), 1);
    other.abort();
}
