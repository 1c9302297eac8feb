//! What a model reads from a wrapped tool whose handler fails the way rmcp
//! handlers commonly do: rmcp's own `ErrorData`, an `Ok` error result, a
//! decline whose message has no full stop; who it is told resolves an
//! unknown outcome; what it reads when the store fails; and what the
//! developer reads when a call has no caller, or maintenance runs without a
//! reconciler. Every test counts what the handler really did.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use idem_runtime::maintenance::{Maintenance, MaintenanceConfig, Reconciler, Reconciliation};
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, IdempotencyStore, Inspect, Record, RecordFilter, Resolution,
    StateCounts, StoreError, Upkeep,
};
use idem_runtime::{
    answer::Resolver,
    idempotent,
    key::{IdempotencyKey, Scope},
    mcp::RESULT_META_KEY,
    Caller, Executor, IdempotentServer, MemoryStore, Reference, ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RunningService;
use rmcp::{tool, tool_handler, ErrorData, RoleClient, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct RefundArgs {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Clone)]
struct Refunds {
    executor: Executor,
    caller: Option<Caller>,
    runs: Arc<AtomicUsize>,
}

impl IdempotentServer for Refunds {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }
}

#[idem_runtime::tool_router]
impl Refunds {
    /// rmcp's default signature: a refund above the charge is invalid
    /// params (nothing happened); a processor failure is an internal error.
    #[idempotent(window = "15m")]
    #[tool(description = "Refund a charge")]
    async fn refund(
        &self,
        Parameters(args): Parameters<RefundArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        match args.amount_cents {
            0..=1000 => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "refunded {}",
                args.charge_id
            ))])),
            1001..=5000 => Err(ErrorData::invalid_params(
                "the refund exceeds the charge",
                None,
            )),
            _ => Err(ErrorData::internal_error("the processor hung up", None)),
        }
    }

    /// A handler that reports its own failure as an `Ok` error result.
    #[idempotent(window = "15m")]
    #[tool(description = "Void a charge")]
    async fn void(
        &self,
        Parameters(args): Parameters<RefundArgs>,
    ) -> Result<CallToolResult, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "{} is already settled and cannot be voided",
            args.charge_id
        ))]))
    }

    /// A decline, in a message without a full stop.
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(_args): Parameters<RefundArgs>) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::rejected("insufficient funds"))
    }
}

impl Refunds {
    fn router() -> ToolRouter<Self> {
        Self::tool_router().with_route(idem_runtime::mcp::status_tool::<Self>(
            "get_operation_status",
        ))
    }
}

#[tool_handler(router = Self::router())]
impl ServerHandler for Refunds {}

type Client = RunningService<RoleClient, ()>;

async fn connect(caller: Option<Caller>) -> (Client, Arc<AtomicUsize>) {
    connect_to(Executor::new(Arc::new(MemoryStore::new())), caller).await
}

async fn connect_to(executor: Executor, caller: Option<Caller>) -> (Client, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Refunds {
        executor,
        caller,
        runs: runs.clone(),
    };
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    (().serve(client_side).await.expect("client connects"), runs)
}

async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .expect("tools/call answers")
}

fn state(result: &CallToolResult) -> String {
    result.meta.as_ref().unwrap()[RESULT_META_KEY]["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect()
}

fn alice() -> Option<Caller> {
    Some(Caller::new("acme", "alice"))
}

/// `Err(ErrorData::invalid_params(..))` means the call was refused as made:
/// the claim is released, and the same call (the amount corrected upstream,
/// say) can run; it is not told "it may have taken effect".
#[tokio::test]
async fn rmcps_invalid_params_releases_the_claim() {
    let (client, runs) = connect(alice()).await;
    let args = json!({"charge_id": "ch_1", "amount_cents": 2000});
    let first = call(&client, "refund", args.clone()).await;
    assert_eq!(state(&first), "rejected", "{first:?}");
    assert!(
        text(&first).contains("Nothing was executed"),
        "{}",
        text(&first)
    );
    assert!(!text(&first).contains("may have taken effect"));
    let again = call(&client, "refund", args).await;
    assert_eq!(state(&again), "rejected");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each call ran its check");
}

/// Any other `ErrorData` says nothing about the side effect: unknown, never
/// run again.
#[tokio::test]
async fn rmcps_internal_error_is_an_unknown_outcome() {
    let (client, runs) = connect(alice()).await;
    let args = json!({"charge_id": "ch_1", "amount_cents": 9000});
    let first = call(&client, "refund", args.clone()).await;
    assert_eq!(state(&first), "failed_unknown", "{first:?}");
    let again = call(&client, "refund", args).await;
    assert_eq!(state(&again), "unknown", "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `Ok(CallToolResult::error(..))` is the tool's own result: recorded and
/// replayed as it was, `isError: true` included, and never run again within
/// the window (the handler had an `Err` to say nothing happened).
#[tokio::test]
async fn an_ok_error_result_is_recorded_and_replayed() {
    let (client, runs) = connect(alice()).await;
    let args = json!({"charge_id": "ch_7", "amount_cents": 100});
    let first = call(&client, "void", args.clone()).await;
    assert_eq!(state(&first), "executed");
    assert_eq!(first.is_error, Some(true));
    let again = call(&client, "void", args).await;
    assert_eq!(state(&again), "replayed");
    assert_eq!(again.is_error, Some(true));
    assert_eq!(text(&again), text(&first));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// With background completions the first answer says its response is
/// still being stored (`recorded: false`, `recording: "pending"`); a repeat
/// replays it and nothing runs again.
#[tokio::test]
async fn a_background_completion_reads_as_pending_then_replays() {
    let executor = Executor::new(Arc::new(MemoryStore::new())).with_background_completions(true);
    let (client, runs) = connect_to(executor.clone(), alice()).await;
    let args = json!({"charge_id": "ch_9", "amount_cents": 100});
    let first = call(&client, "refund", args.clone()).await;
    assert_eq!(state(&first), "executed");
    let meta = &first.meta.as_ref().unwrap()[RESULT_META_KEY];
    assert_eq!(meta["recorded"], json!(false), "{meta}");
    assert_eq!(meta["recording"], json!("pending"), "{meta}");
    assert_eq!(executor.drain(std::time::Duration::from_secs(5)).await, 0);
    let again = call(&client, "refund", args).await;
    assert_eq!(state(&again), "replayed");
    assert_eq!(text(&again), text(&first));
    assert!(again.meta.as_ref().unwrap()[RESULT_META_KEY]
        .get("recording")
        .is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The handler's message and idem's next step read as two sentences.
#[tokio::test]
async fn a_decline_reads_as_two_sentences() {
    let (client, _) = connect(alice()).await;
    let result = call(
        &client,
        "charge",
        json!({"charge_id": "ch_1", "amount_cents": 100}),
    )
    .await;
    assert!(
        text(&result).starts_with("insufficient funds. Nothing was executed"),
        "{}",
        text(&result)
    );
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The first call refused for having no caller tells the developer, once,
/// what to configure; the model's answer is unchanged and nothing runs.
#[test]
fn a_missing_caller_is_logged_once_for_the_developer() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runs = rt.block_on(async {
        let (client, runs) = connect(None).await;
        for _ in 0..3 {
            let result = call(
                &client,
                "refund",
                json!({"charge_id": "ch_1", "amount_cents": 100}),
            )
            .await;
            assert_eq!(state(&result), "no_caller");
        }
        runs
    });
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        logged.matches("IdempotentServer::default_caller").count(),
        1,
        "{logged}"
    );
}

/// The reference of an answer, from its `_meta`.
fn reference_of(result: &CallToolResult) -> String {
    result.meta.as_ref().unwrap()[RESULT_META_KEY]["reference"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The status tool's answer for `reference`, as JSON.
async fn status(client: &Client, reference: &str) -> Value {
    let result = call(
        client,
        "get_operation_status",
        json!({ "reference": reference }),
    )
    .await;
    result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("a status report: {result:?}"))
}

/// Every answer a model reads about an unknown outcome, on a server whose
/// executor says `resolver`: the failed call's, the repeat's, and the status
/// tool's next step. The handler ran once.
async fn unknown_answers(resolver: Option<Resolver>) -> (String, Vec<String>) {
    let mut executor = Executor::new(Arc::new(MemoryStore::new()));
    if let Some(resolver) = resolver {
        executor = executor.with_resolver(resolver);
    }
    let (client, runs) = connect_to(executor, alice()).await;
    let args = json!({"charge_id": "ch_3", "amount_cents": 9000});
    let first = call(&client, "refund", args.clone()).await;
    assert_eq!(state(&first), "failed_unknown", "{first:?}");
    let reference = reference_of(&first);
    let again = call(&client, "refund", args).await;
    assert_eq!(state(&again), "unknown", "{again:?}");
    let report = status(&client, &reference).await;
    assert_eq!(report["state"], json!("UNKNOWN"), "{report}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let next_step = report["next_step"].as_str().unwrap().to_owned();
    (reference, vec![text(&first), text(&again), next_step])
}

/// With no reconciler (the executor's default), no answer says the outcome
/// is being reconciled: each names the command an operator resolves it
/// with, and the reference.
#[tokio::test]
async fn without_a_reconciler_an_unknown_outcome_names_idem_resolve() {
    for resolver in [None, Some(Resolver::Operator)] {
        let (reference, answers) = unknown_answers(resolver).await;
        for answer in answers {
            assert!(
                answer.contains(&format!("`idem resolve {reference}`")),
                "{answer}"
            );
            assert!(answer.contains("operator"), "{answer}");
            assert!(!answer.contains("reconciled"), "{answer}");
        }
    }
}

/// With a reconciler, the answers say it is being reconciled, and who
/// resolves what the reconciler cannot settle.
#[tokio::test]
async fn with_a_reconciler_an_unknown_outcome_is_being_reconciled() {
    let (reference, answers) = unknown_answers(Some(Resolver::Reconciler)).await;
    for answer in answers {
        assert!(
            answer.contains("being reconciled with the processor"),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("`idem resolve {reference}`")),
            "{answer}"
        );
    }
}

/// A call whose process died mid-call (its claim's lease ran out, not yet
/// swept) reads as unknown, and says who resolves it; nothing runs.
#[tokio::test]
async fn a_lapsed_claim_reads_as_unknown_and_names_who_resolves_it() {
    for (resolver, expected) in [
        (Resolver::Operator, "stays unknown until an operator"),
        (Resolver::Reconciler, "being reconciled"),
    ] {
        let store = Arc::new(MemoryStore::new());
        let args = json!({"charge_id": "ch_4", "amount_cents": 100});
        let caller = Caller::new("acme", "alice");
        let window = Duration::from_secs(15 * 60);
        let key = IdempotencyKey::derive(&caller, "refund", &args, &Scope::Window(window)).unwrap();
        // Another process claimed it, and died.
        let dead = ClaimRequest {
            key,
            reference: Reference::new_operation(&key),
            tenant: "acme".to_owned(),
            tool: "refund".to_owned(),
            attempt: Attempt::random(),
            lease: Duration::from_millis(50),
            window,
            retention: Duration::from_secs(48 * 3600),
        };
        assert!(matches!(
            store.claim(&dead).await.unwrap(),
            Claim::Claimed { .. }
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let executor = Executor::new(store).with_resolver(resolver);
        let (client, runs) = connect_to(executor, alice()).await;
        let repeat = call(&client, "refund", args).await;
        assert_eq!(state(&repeat), "unknown", "{repeat:?}");
        let reference = dead.reference.to_string();
        assert_eq!(reference_of(&repeat), reference);
        let report = status(&client, &reference).await;
        for answer in [text(&repeat), report["next_step"].to_string()] {
            assert!(answer.contains(expected), "{resolver:?}: {answer}");
            assert!(
                answer.contains(&format!("`idem resolve {reference}`")),
                "{answer}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    }
}

/// What a PostgreSQL driver says when a pooler drops its prepared
/// statements: the operator's to read, never the model's.
const DRIVER_TEXT: &str =
    "db error: ERROR: prepared statement \"s3\" does not exist (26000) at 10.0.0.7:6432";

/// A MemoryStore whose claims and lookups fail with `fail`'s error, which
/// carries [`DRIVER_TEXT`].
#[derive(Debug)]
struct Failing {
    inner: MemoryStore,
    fail: fn(String) -> StoreError,
}

#[idem_runtime::async_trait]
impl IdempotencyStore for Failing {
    async fn claim(&self, _req: &ClaimRequest) -> Result<Claim, StoreError> {
        Err((self.fail)(DRIVER_TEXT.to_owned()))
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.inner.complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.inner.release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.inner.mark_unknown(key, attempt, note).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        _tenant: &str,
        _reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        Err((self.fail)(DRIVER_TEXT.to_owned()))
    }
}

#[idem_runtime::async_trait]
impl Upkeep for Failing {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.inner.mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<std::time::SystemTime>,
    ) -> Result<bool, StoreError> {
        self.inner.defer_check(key, attempt, delay, taken).await
    }
    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<std::time::SystemTime>, StoreError> {
        self.inner.take_check(key, attempt, hold).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_unknown(limit).await
    }
}

#[idem_runtime::async_trait]
impl Inspect for Failing {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.inner.list_records(filter).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_records().await
    }
}

/// Runs `body` with the `tracing` output captured; returns what it
/// returned and what was logged.
fn logged<T>(body: impl std::future::Future<Output = T>) -> (T, String) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(body);
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    (out, logged)
}

/// A call and a status lookup against a store failing with `fail`: what
/// the model read, and what the operator's log holds. Nothing ran.
fn against_a_failing_store(fail: fn(String) -> StoreError) -> (CallToolResult, String, String) {
    let ((result, status_text), logs) = logged(async {
        let store = Failing {
            inner: MemoryStore::new(),
            fail,
        };
        let (client, runs) = connect_to(Executor::new(Arc::new(store)), alice()).await;
        let result = call(
            &client,
            "refund",
            json!({"charge_id": "ch_5", "amount_cents": 100}),
        )
        .await;
        let looked_up = call(
            &client,
            "get_operation_status",
            json!({ "reference": reference_of_any() }),
        )
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
        (result, text(&looked_up))
    });
    (result, status_text, logs)
}

/// A well-formed reference no store holds.
fn reference_of_any() -> String {
    let key = IdempotencyKey::derive(
        &Caller::new("acme", "alice"),
        "refund",
        &json!({}),
        &Scope::Window(Duration::from_secs(60)),
    )
    .unwrap();
    Reference::new_operation(&key).to_string()
}

/// An unreachable store: the model is told nothing ran and to call again
/// later, with how an unconfirmed claim it may meet is retracted; none of
/// the store's own words reach it, and all of them reach the log.
#[test]
fn an_unavailable_store_is_told_without_the_drivers_words() {
    let (result, status_text, logs) = against_a_failing_store(StoreError::Unavailable);
    assert_eq!(state(&result), "store_unavailable", "{result:?}");
    let answer = text(&result);
    assert!(answer.starts_with("Nothing was executed"), "{answer}");
    assert!(answer.contains("safe to call again"), "{answer}");
    assert!(answer.contains("in progress"), "{answer}");
    assert!(answer.contains("retracted"), "{answer}");
    assert!(status_text.contains("ask again shortly"), "{status_text}");
    for read in [&answer, &status_text] {
        assert!(!read.contains("prepared statement"), "{read}");
        assert!(!read.contains("26000"), "{read}");
    }
    assert!(
        logs.contains("claim failed; not running") && logs.contains(DRIVER_TEXT),
        "{logs}"
    );
    assert!(logs.contains("status lookup failed"), "{logs}");
}

/// A misconfigured store: its own answer state, nothing ran, and the model
/// is told that calling again will not help until the operator fixes it,
/// never "call again in a little while"; the log has the store's words.
#[test]
fn a_misconfigured_store_is_not_told_to_call_again() {
    let (result, status_text, logs) = against_a_failing_store(StoreError::Config);
    assert_eq!(state(&result), "store_misconfigured", "{result:?}");
    assert_eq!(result.is_error, Some(true));
    let answer = text(&result);
    assert!(answer.starts_with("Nothing was executed"), "{answer}");
    assert!(answer.contains("misconfigured"), "{answer}");
    assert!(answer.contains("will not help"), "{answer}");
    assert!(answer.contains("operator"), "{answer}");
    assert!(!answer.contains("safe to call again"), "{answer}");
    assert!(!answer.contains("in a little while"), "{answer}");
    assert!(status_text.contains("misconfigured"), "{status_text}");
    assert!(!status_text.contains("shortly"), "{status_text}");
    for read in [&answer, &status_text] {
        assert!(!read.contains("prepared statement"), "{read}");
        assert!(!read.contains("26000"), "{read}");
    }
    assert!(logs.contains(DRIVER_TEXT), "{logs}");
}

/// A reconciler that never settles anything.
#[derive(Debug)]
struct Undecided;

#[idem_runtime::async_trait]
impl Reconciler for Undecided {
    async fn reconcile(
        &self,
        _record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Reconciliation::StillUnknown)
    }
}

/// Maintenance without a reconciler says so once, at start, with what to
/// do; with one it says nothing of the kind. Its handle says which
/// resolver the answers should name.
#[test]
fn maintenance_without_a_reconciler_warns_once_at_start() {
    let (resolver, logs) = logged(async {
        let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
        let config = MaintenanceConfig::default().with_interval(Duration::from_millis(5));
        assert_eq!(config.resolver(), Resolver::Operator);
        let maintenance = Maintenance::spawn(store, config);
        // Several rounds: still one warning.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let resolver = maintenance.resolver();
        maintenance.stop().await;
        resolver
    });
    assert_eq!(resolver, Resolver::Operator);
    assert_eq!(logs.matches("without a reconciler").count(), 1, "{logs}");
    assert!(logs.contains("WARN"), "{logs}");
    for what_to_do in [
        "MaintenanceConfig::reconciler",
        "idem resolve REFERENCE",
        "idem list --state unknown",
    ] {
        assert!(logs.contains(what_to_do), "{what_to_do}: {logs}");
    }

    let (resolver, logs) = logged(async {
        let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
        let config = MaintenanceConfig::default()
            .with_interval(Duration::from_millis(5))
            .with_reconciler(Arc::new(Undecided));
        assert_eq!(config.resolver(), Resolver::Reconciler);
        let maintenance = Maintenance::spawn(store, config);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let resolver = maintenance.resolver();
        maintenance.stop().await;
        resolver
    });
    assert_eq!(resolver, Resolver::Reconciler);
    assert!(!logs.contains("without a reconciler"), "{logs}");
}
