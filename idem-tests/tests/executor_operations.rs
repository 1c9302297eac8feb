//! One reference per operation, on every store, through `Executor::run` as a
//! user calls it: a repeat within the window answers with the operation's
//! reference, and the same call after the window is a new operation under a
//! new reference, so a processor that keeps idempotency keys for a day (as
//! Stripe does) charges it, and a mailer that dedupes by the downstream key
//! sends its receipt. Every assertion is about what the processor or the
//! mailer stub saw.

mod durable;
mod redis_server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    answer::Answer,
    executor::{Operation, OperationContext, ScopeSpec},
    follow_on,
    follow_ons::{follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers, FollowOnRun},
    Caller, Executor, IdempotencyStore, MemoryStore, Reference, SqliteStore, ToolError,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

const STATUS_TOOL: &str = "get_operation_status";

/// How long the processor stub keeps an idempotency key, as Stripe does.
const KEPT: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
    idempotency_key: String,
}

/// A card processor stand-in: idempotent by the key it is given, from the
/// moment a request arrives and for [`KEPT`]; a request whose key it holds
/// gets the first charge back, not a new one.
#[derive(Clone, Default)]
struct Processor {
    inner: Arc<Mutex<Ledger>>,
}

#[derive(Default)]
struct Ledger {
    /// Every charge made, in order: the key it was made under.
    charges: Vec<String>,
    /// key -> (the charge's index, when the key was first seen).
    keys: HashMap<String, (usize, Instant)>,
    requests: usize,
}

impl Processor {
    async fn charge(&self, ctx: OperationContext) -> Result<Receipt, ToolError> {
        let key = ctx.reference().to_string();
        let id = {
            let mut l = self.inner.lock().unwrap();
            l.requests += 1;
            let now = Instant::now();
            match l.keys.get(&key) {
                Some(&(i, seen)) if now.duration_since(seen) < KEPT => i,
                _ => {
                    l.charges.push(key.clone());
                    let i = l.charges.len() - 1;
                    l.keys.insert(key.clone(), (i, now));
                    i
                }
            }
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(Receipt {
            charge_id: format!("ch_{}", id + 1),
            idempotency_key: key,
        })
    }

    fn charges(&self) -> usize {
        self.inner.lock().unwrap().charges.len()
    }

    fn requests(&self) -> usize {
        self.inner.lock().unwrap().requests
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// Alice buys the same thing: a window-scoped charge that declares a
/// receipt e-mail.
async fn buy(
    executor: &Executor,
    processor: &Processor,
    window: Duration,
) -> Answer<Receipt, ToolError> {
    let caller = alice();
    let args = json!({"card": "tok_visa", "amount_cents": 1200, "sku": "coffee"});
    let op = Operation {
        caller: &caller,
        tool: "buy",
        args: &args,
        scope: ScopeSpec::Window(window),
        status_tool: STATUS_TOOL,
    };
    executor
        .run(op, |ctx| async move {
            let receipt = processor.charge(ctx).await?;
            follow_on("send_receipt", &json!({"charge_id": receipt.charge_id}))
                .map_err(|e| ToolError::unknown(e.to_string()))?;
            Ok(receipt)
        })
        .await
}

fn reference(answer: &Answer<Receipt, ToolError>) -> Reference {
    answer.reference().expect("an answer with a reference")
}

fn receipt(answer: &Answer<Receipt, ToolError>) -> &Receipt {
    match answer {
        Answer::Executed { value, .. } | Answer::Replayed { value, .. } => value,
        other => panic!("expected a receipt, got {other:?}"),
    }
}

/// The scenario of the report, on one store: call, repeat at once, then the
/// same call after the window. Two operations, two references, two charges;
/// each repeat is answered with its own operation's reference, and the
/// status tool finds each operation by its own reference only.
async fn repeat_purchase_after_the_window(store: Arc<dyn IdempotencyStore>) {
    let window = Duration::from_millis(400);
    let executor = Executor::new(store);
    let processor = Processor::default();

    let first = buy(&executor, &processor, window).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    let repeat = buy(&executor, &processor, window).await;
    assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
    assert_eq!(reference(&repeat), reference(&first));
    assert_eq!(processor.requests(), 1, "a repeat reaches no processor");

    tokio::time::sleep(Duration::from_millis(700)).await;
    let later = buy(&executor, &processor, window).await;
    assert!(matches!(later, Answer::Executed { .. }), "{later:?}");
    assert_ne!(
        reference(&later),
        reference(&first),
        "a new operation must not carry the first one's reference"
    );
    assert_eq!(
        processor.charges(),
        2,
        "the purchase the user wanted after the window was swallowed by the processor"
    );
    assert_eq!(receipt(&later).charge_id, "ch_2");
    assert_eq!(
        receipt(&later).idempotency_key,
        reference(&later).to_string()
    );
    let repeat = buy(&executor, &processor, window).await;
    assert_eq!(reference(&repeat), reference(&later));
    assert_eq!(receipt(&repeat).charge_id, "ch_2");

    // The status tool: the new operation by its reference, and the first
    // one by its own, as itself (its charge), never as the new one.
    let now = executor
        .status(&alice(), &reference(&later).to_string())
        .await
        .unwrap()
        .expect("the new operation is found");
    assert_eq!(now.reference, reference(&later).to_string());
    let old = executor
        .status(&alice(), &reference(&first).to_string())
        .await
        .unwrap()
        .expect("the first operation still reads by its reference");
    assert_eq!(old.reference, reference(&first).to_string());
    assert_eq!(
        old.response.as_ref().map(|r| r["charge_id"].clone()),
        Some(json!("ch_1")),
        "the first operation read as {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_repeat_purchase_after_the_window_is_charged_under_its_own_reference() {
    repeat_purchase_after_the_window(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_repeat_purchase_after_the_window_is_charged_under_its_own_reference() {
    let dir = durable::temp_dir("operations");
    let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
    repeat_purchase_after_the_window(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_repeat_purchase_after_the_window_is_charged_under_its_own_reference() {
    let Some(pg) = durable::PgSchema::new().await else {
        return;
    };
    repeat_purchase_after_the_window(Arc::new(pg.store.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_repeat_purchase_after_the_window_is_charged_under_its_own_reference() {
    let Some(redis) = redis_server::Prefixed::new().await else {
        return;
    };
    repeat_purchase_after_the_window(Arc::new(redis.store.clone())).await;
}

/// A mailer stand-in that dedupes by the downstream key, as the README says
/// to build one: a key it has seen is acknowledged and not sent again.
#[derive(Clone, Default)]
struct Mailer {
    sent: Arc<Mutex<Vec<String>>>,
    keys: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Mailer {
    async fn send(
        &self,
        job: FollowOnRun,
    ) -> Result<(), idem_runtime::follow_ons::FollowOnHandlerError> {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap();
        let fresh = keys
            .get(&job.downstream_key)
            .is_none_or(|seen| now.duration_since(*seen) >= KEPT);
        if fresh {
            keys.insert(job.downstream_key.clone(), now);
            self.sent.lock().unwrap().push(job.payload.clone());
        }
        Ok(())
    }

    fn handlers(&self) -> FollowOnHandlers {
        let mailer = self.clone();
        FollowOnHandlers::new().on(
            "send_receipt",
            follow_on_fn(move |job| {
                let mailer = mailer.clone();
                async move { mailer.send(job).await }
            }),
        )
    }
}

/// A repeat purchase after the window sends a second receipt through the
/// dedupe-by-key mailer: its job has its own downstream key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_purchase_after_the_window_sends_its_own_receipt() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let executor = Executor::new(store.clone());
    let (processor, mailer) = (Processor::default(), Mailer::default());
    let window = Duration::from_millis(300);
    let config = FollowOnConfig::default();
    buy(&executor, &processor, window).await;
    FollowOnDispatcher::round(&*store, &mailer.handlers(), &config)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    buy(&executor, &processor, window).await;
    FollowOnDispatcher::round(&*store, &mailer.handlers(), &config)
        .await
        .unwrap();
    let sent = mailer.sent.lock().unwrap().clone();
    let sent: Vec<Value> = sent
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert_eq!(
        sent,
        [json!({"charge_id": "ch_1"}), json!({"charge_id": "ch_2"})],
        "the second purchase's receipt was dropped by the mailer"
    );
}

/// With a business key, the key names the operation: every repeat within
/// its retention answers with one reference.
#[tokio::test]
async fn a_business_key_keeps_its_reference_for_its_retention() {
    let executor = Executor::new(Arc::new(MemoryStore::new()));
    let processor = Processor::default();
    let caller = alice();
    let ship = |args: Value| {
        let (executor, processor, caller) = (&executor, &processor, &caller);
        async move {
            let op = Operation {
                caller,
                tool: "ship",
                args: &args,
                scope: ScopeSpec::BusinessKey {
                    fields: &["order_id"],
                    retention: None,
                },
                status_tool: STATUS_TOOL,
            };
            executor
                .run(op, |ctx| async move { processor.charge(ctx).await })
                .await
        }
    };
    let first = ship(json!({"order_id": "o-1", "address": "1 Main St"})).await;
    let again = ship(json!({"order_id": "o-1", "address": "1 Main St"})).await;
    let other_args = ship(json!({"order_id": "o-1", "address": "2 Elm St"})).await;
    assert_eq!(reference(&again), reference(&first));
    assert!(
        matches!(other_args, Answer::Conflict { .. }),
        "{other_args:?}"
    );
    assert_eq!(reference(&other_args), reference(&first));
    assert_eq!(processor.charges(), 1);
}
