//! Client keys (issue 47, part 1): a key the host sends outside the
//! arguments, `params._meta["idem/idempotency-key"]`, names the operation
//! of a tool that opted in with `#[idempotent(client_key = "...")]`.
//!
//! What users are promised, per caller: the same key with the same
//! arguments is one operation for the key's retention, beyond the tool's
//! window; the same key with other arguments is a conflict and runs
//! nothing; another key is another operation, even inside the window and
//! even while the first runs (and it is counted); an invalid key runs
//! nothing; no key is today's behaviour; another caller's key is its own.
//! Every test counts the charges a processor stub really made.
//!
//! Over streamable HTTP, with the `Idempotency-Key` header: tests/payments_keys.rs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    idempotent,
    mcp::{RESULT_META_KEY, TOOL_META_KEY},
    Caller, Executor, IdempotentServer, MemoryStore, ToolError,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::{tool, tool_handler, RoleClient, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge: usize,
}

/// The processor stub: every charge it made, and how many ran at once.
#[derive(Default)]
struct Processor {
    charges: Mutex<Vec<(String, u64)>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

impl Processor {
    /// Charges after `delay`, as a processor that takes its time does.
    async fn charge(&self, args: &ChargeArgs, delay: Duration) -> usize {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        let mut charges = self.charges.lock().unwrap();
        charges.push((args.card.clone(), args.cents));
        charges.len()
    }

    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
    processor: Arc<Processor>,
    delay: Duration,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.caller)
    }
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "1s", client_key = "optional")]
    #[tool(description = "Charge a card")]
    async fn charge(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let charge = self.processor.charge(&args, self.delay).await;
        Ok(Json(Receipt { charge }))
    }

    #[idempotent(window = "15m", client_key = "required")]
    #[tool(description = "Charge a card; the host must send an idempotency key")]
    async fn charge_keyed(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let charge = self.processor.charge(&args, self.delay).await;
        Ok(Json(Receipt { charge }))
    }

    /// Did not opt in: a client key is ignored.
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card, keyed by its arguments")]
    async fn charge_plain(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let charge = self.processor.charge(&args, self.delay).await;
        Ok(Json(Receipt { charge }))
    }
}

#[tool_handler(router = Self::tool_router())]
impl ServerHandler for Shop {}

type Client = RunningService<RoleClient, ()>;

/// A client of a shop whose default caller is `caller`, on `executor`
/// (shared by the shops of one test, as replicas share a store).
async fn connect(
    executor: &Executor,
    caller: Caller,
    processor: &Arc<Processor>,
    delay: Duration,
) -> Client {
    let server = Shop {
        executor: executor.clone(),
        caller,
        processor: processor.clone(),
        delay,
    };
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn memory() -> Executor {
    Executor::new(Arc::new(MemoryStore::new()))
}

/// A `tools/call` of `tool` with `args`, and `key` in `_meta` (a string, or
/// any other JSON value to see it refused).
async fn call(
    client: &Client,
    tool: &'static str,
    args: Value,
    key: Option<Value>,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let mut params = CallToolRequestParams::new(tool).with_arguments(args);
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0.insert("idem/idempotency-key".to_owned(), key);
        params.meta = Some(meta);
    }
    client.call_tool(params).await.expect("tools/call answers")
}

fn op(result: &CallToolResult) -> &Value {
    &result.meta.as_ref().expect("_meta")[RESULT_META_KEY]
}

fn state(result: &CallToolResult) -> &str {
    op(result)["state"].as_str().unwrap()
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect()
}

fn card(cents: u64) -> Value {
    json!({"card": "4242", "cents": cents})
}

fn key(text: &str) -> Option<Value> {
    Some(json!(text))
}

/// The same key and arguments: one charge, the repeat replays the receipt
/// under the same reference, and the answer says the client key named it.
#[tokio::test]
async fn the_same_key_and_arguments_are_one_charge() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), key("step-1")).await;
    let again = call(&client, "charge", card(500), key("step-1")).await;
    assert_eq!(state(&first), "executed", "{first:?}");
    assert_eq!(op(&first)["keyedBy"], "clientKey");
    assert_eq!(state(&again), "replayed", "{again:?}");
    assert_eq!(op(&again)["keyedBy"], "clientKey");
    assert_eq!(op(&first)["reference"], op(&again)["reference"]);
    assert_eq!(first.structured_content, again.structured_content);
    assert_eq!(processor.count(), 1);
}

/// The key holds for its own retention, not the tool's window (1 s here):
/// an engine retrying after the window replays, where the same call without
/// a key after the window is a new charge.
#[tokio::test]
async fn a_key_reused_after_the_window_replays() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), key("engine-step-7")).await;
    let unkeyed = call(&client, "charge", card(700), None).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(state(&unkeyed), "executed");
    assert_eq!(op(&unkeyed)["keyedBy"], "arguments");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let later = call(&client, "charge", card(500), key("engine-step-7")).await;
    assert_eq!(state(&later), "replayed", "{later:?}");
    assert_eq!(op(&later)["reference"], op(&first)["reference"]);
    let unkeyed_later = call(&client, "charge", card(700), None).await;
    assert_eq!(state(&unkeyed_later), "executed", "the window has ended");
    assert_eq!(processor.count(), 3, "500 once, 700 twice");
}

/// The key's retention is configurable: past it, the same key runs anew.
#[tokio::test]
async fn past_the_keys_retention_the_key_is_free_again() {
    let processor = Arc::default();
    let executor = memory().with_client_key_retention(Duration::from_secs(2));
    let client = connect(&executor, alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), key("k")).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let inside = call(&client, "charge", card(500), key("k")).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = call(&client, "charge", card(500), key("k")).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(
        state(&inside),
        "replayed",
        "past the window, inside the retention"
    );
    assert_eq!(state(&after), "executed", "past the retention: {after:?}");
    assert_ne!(op(&after)["reference"], op(&first)["reference"]);
    assert_eq!(processor.count(), 2);
}

/// The same key with other arguments is a conflict: nothing runs, the
/// message says what to do, and the first operation still replays.
#[tokio::test]
async fn the_same_key_with_other_arguments_is_a_conflict() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), key("order-9")).await;
    let other = call(&client, "charge", card(900), key("order-9")).await;
    assert_eq!(state(&other), "conflict", "{other:?}");
    assert_eq!(other.is_error, Some(true));
    assert_eq!(op(&other)["keyedBy"], "clientKey");
    assert_eq!(op(&other)["reference"], op(&first)["reference"]);
    let message = text(&other);
    assert!(message.contains("idempotency key"), "{message}");
    assert!(message.contains("Nothing was executed"), "{message}");
    assert!(message.contains("get_operation_status"), "{message}");
    assert!(message.contains("new idempotency key"), "{message}");
    let again = call(&client, "charge", card(500), key("order-9")).await;
    assert_eq!(
        state(&again),
        "replayed",
        "the first operation is untouched"
    );
    assert_eq!(processor.count(), 1);
}

/// While the first call runs, the same key with other arguments is a
/// conflict too, not "in progress".
#[tokio::test]
async fn a_conflict_while_the_first_call_runs() {
    let processor = Arc::<Processor>::default();
    let client =
        Arc::new(connect(&memory(), alice(), &processor, Duration::from_millis(400)).await);
    let running = tokio::spawn({
        let client = client.clone();
        async move { call(&client, "charge", card(500), key("k")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = call(&client, "charge", card(900), key("k")).await;
    let same = call(&client, "charge", card(500), key("k")).await;
    assert_eq!(state(&other), "conflict", "{other:?}");
    assert_eq!(state(&same), "in_progress", "{same:?}");
    assert_eq!(state(&running.await.unwrap()), "executed");
    assert_eq!(processor.count(), 1);
}

/// Another key with the same arguments is another operation, inside the
/// window too: the host said so.
#[tokio::test]
async fn another_key_with_the_same_arguments_is_another_charge() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), key("purchase-1")).await;
    let second = call(&client, "charge", card(500), key("purchase-2")).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(state(&second), "executed", "{second:?}");
    assert_ne!(op(&first)["reference"], op(&second)["reference"]);
    assert_eq!(processor.count(), 2);
}

/// The decision for a call in flight: an identical call under another key
/// runs at once, beside the first (they overlap at the processor); it is
/// not answered "in progress" by the first.
#[tokio::test]
async fn an_identical_call_in_flight_under_another_key_runs_beside_it() {
    let processor = Arc::<Processor>::default();
    let client =
        Arc::new(connect(&memory(), alice(), &processor, Duration::from_millis(400)).await);
    let calls = ["a", "b"].map(|k| {
        let client = client.clone();
        tokio::spawn(async move { call(&client, "charge", card(500), key(k)).await })
    });
    let mut states = Vec::new();
    for call in calls {
        states.push(state(&call.await.unwrap()).to_owned());
    }
    assert_eq!(states, ["executed", "executed"]);
    assert_eq!(processor.count(), 2);
    assert_eq!(
        processor.most_at_once.load(Ordering::SeqCst),
        2,
        "both in flight at once"
    );
}

/// Invalid keys are refused with a clear error, and nothing runs; the same
/// call with a valid key then runs.
#[tokio::test]
async fn invalid_keys_are_refused_and_run_nothing() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    for bad in [
        json!(""),
        json!("two words"),
        json!("tab\there"),
        json!("clé"),
        json!("k".repeat(256)),
        json!(42),
        json!(null),
    ] {
        let answer = call(&client, "charge", card(500), Some(bad.clone())).await;
        assert_eq!(state(&answer), "refused", "{bad}: {answer:?}");
        assert_eq!(answer.is_error, Some(true));
        assert_eq!(op(&answer)["keyedBy"], "clientKey");
        let message = text(&answer);
        assert!(
            message.contains("1 to 255 visible ASCII"),
            "{bad}: {message}"
        );
    }
    assert_eq!(processor.count(), 0);
    let longest = call(&client, "charge", card(500), key(&"k".repeat(255))).await;
    assert_eq!(state(&longest), "executed", "{longest:?}");
    assert_eq!(processor.count(), 1);
}

/// Without a key, a tool that accepts one behaves as it always did: the
/// window decides.
#[tokio::test]
async fn no_key_is_todays_behaviour() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge", card(500), None).await;
    let again = call(&client, "charge", card(500), None).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(state(&again), "replayed");
    assert_eq!(op(&again)["keyedBy"], "arguments");
    // A keyed call is never the unkeyed one's operation.
    let keyed = call(&client, "charge", card(500), key("k")).await;
    assert_eq!(state(&keyed), "executed");
    assert_eq!(processor.count(), 2);
}

/// `client_key = "required"`: a call without a key is refused, nothing runs.
#[tokio::test]
async fn a_required_key_refuses_a_call_without_one() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let without = call(&client, "charge_keyed", card(500), None).await;
    assert_eq!(state(&without), "refused", "{without:?}");
    let message = text(&without);
    assert!(message.contains("requires an idempotency key"), "{message}");
    assert!(message.contains("idem/idempotency-key"), "{message}");
    assert_eq!(processor.count(), 0);
    let with = call(&client, "charge_keyed", card(500), key("k")).await;
    assert_eq!(state(&with), "executed");
    assert_eq!(processor.count(), 1);
}

/// Another caller's identical key is that caller's own operation.
#[tokio::test]
async fn another_callers_identical_key_is_its_own_operation() {
    let processor = Arc::default();
    let executor = memory();
    let alice = connect(&executor, alice(), &processor, Duration::ZERO).await;
    let bob = connect(
        &executor,
        Caller::new("acme", "bob"),
        &processor,
        Duration::ZERO,
    )
    .await;
    let other_tenant = connect(
        &executor,
        Caller::new("globex", "alice"),
        &processor,
        Duration::ZERO,
    )
    .await;
    let a = call(&alice, "charge", card(500), key("k")).await;
    let b = call(&bob, "charge", card(500), key("k")).await;
    let c = call(&other_tenant, "charge", card(900), key("k")).await;
    assert_eq!([state(&a), state(&b), state(&c)], ["executed"; 3]);
    assert_eq!(processor.count(), 3);
    // And each replays its own.
    let b_again = call(&bob, "charge", card(500), key("k")).await;
    assert_eq!(state(&b_again), "replayed");
    assert_eq!(op(&b_again)["reference"], op(&b)["reference"]);
}

/// A tool that did not opt in ignores a key: its answer is keyed by the
/// arguments, and two keys for one call are still one charge.
#[tokio::test]
async fn a_tool_that_did_not_opt_in_ignores_the_key() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let first = call(&client, "charge_plain", card(500), key("a")).await;
    let second = call(&client, "charge_plain", card(500), key("b")).await;
    let invalid = call(&client, "charge_plain", card(500), Some(json!(42))).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(op(&first)["keyedBy"], "arguments");
    assert_eq!(state(&second), "replayed");
    assert_eq!(state(&invalid), "replayed", "never read, so never refused");
    assert_eq!(processor.count(), 1);
}

/// The listing says which tools accept a key, and whether they require one.
#[tokio::test]
async fn the_listing_says_clientkey() {
    let processor = Arc::default();
    let client = connect(&memory(), alice(), &processor, Duration::ZERO).await;
    let tools = client.list_all_tools().await.unwrap();
    let marker = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        tool.meta.as_ref().unwrap()[TOOL_META_KEY].clone()
    };
    assert_eq!(marker("charge")["clientKey"], "optional");
    assert_eq!(marker("charge")["windowSeconds"], 1);
    assert_eq!(marker("charge_keyed")["clientKey"], "required");
    assert!(marker("charge_plain").get("clientKey").is_none());
}

/// A host that sends a fresh key on each retry runs every retry: the
/// executor counts identical arguments under another key inside the window
/// (`idem_client_key_new_key_repeats_total`), and only then.
#[test]
fn identical_arguments_under_a_new_key_inside_the_window_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let charges = AtomicUsize::new(0);
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let executor = memory();
            let caller = alice();
            let run = |key: &'static str, cents: u64, window: u64| {
                let executor = &executor;
                let caller = &caller;
                let charges = &charges;
                async move {
                    let args = json!({"cents": cents});
                    let answer: Answer<u64, ToolError> = executor
                        .run(
                            Operation {
                                caller,
                                tool: "charge",
                                args: &args,
                                scope: ScopeSpec::ClientKey {
                                    key,
                                    window: Duration::from_secs(window),
                                },
                                status_tool: "get_operation_status",
                            },
                            |_| async move { Ok(charges.fetch_add(1, Ordering::SeqCst) as u64) },
                        )
                        .await;
                    answer.state().as_str()
                }
            };
            assert_eq!(run("a", 5, 60).await, "executed");
            assert_eq!(run("a", 5, 60).await, "replayed");
            assert_eq!(run("b", 5, 60).await, "executed"); // counted
            assert_eq!(run("c", 6, 60).await, "executed"); // other arguments
            assert_eq!(run("c", 6, 60).await, "replayed");
            assert_eq!(run("e", 7, 0).await, "executed"); // no window
            assert_eq!(run("d", 7, 0).await, "executed"); // not counted
            assert_eq!(run("", 7, 0).await, "refused");
        })
    });
    assert_eq!(charges.load(Ordering::SeqCst), 5);
    let seen = snapshotter.snapshot().into_vec();
    let counted: Vec<_> = seen
        .iter()
        .filter(|(key, ..)| key.key().name() == "idem_client_key_new_key_repeats_total")
        .map(|(key, _, _, value)| {
            let labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (labels, matches!(value, DebugValue::Counter(1)))
        })
        .collect();
    assert_eq!(
        counted,
        vec![(vec![("tool".to_owned(), "charge".to_owned())], true)],
        "one count, for the new key inside the window"
    );
}
