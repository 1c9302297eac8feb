//! What a model reads from a wrapped tool whose handler fails the way rmcp
//! handlers commonly do: rmcp's own `ErrorData`, an `Ok` error result, a
//! decline whose message has no full stop; and what the developer reads when
//! a call has no caller. Every test counts what the handler really did.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_runtime::{
    idempotent, Caller, Executor, IdempotentServer, MemoryStore, ToolError, RESULT_META_KEY,
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
        Self::tool_router().with_route(idem_runtime::status_tool::<Self>("get_operation_status"))
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
