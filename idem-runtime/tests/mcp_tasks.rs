//! `#[idempotent(task = "optional")]` in process: a server and rmcp's client
//! over a duplex pipe, a counting stub standing in for the processor. What
//! the handler sees when it runs as a task (its reference, a cancellation
//! signal, its other arguments) and when it runs inline (no signal).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    answer::Resolver, current_reference, idempotent, mcp::current_cancellation, Caller, Executor,
    IdempotentServer, MemoryStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, GetTaskResult, Implementation, ProtocolVersion, ServerCapabilities,
    ServerConfig, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::{tool, tool_handler, ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    reference: String,
    /// Whether the handler had a cancellation signal (it runs as a task).
    as_task: bool,
    /// The request id the handler's `RequestContext` argument carried.
    request_id: String,
}

/// The far side: charges made, by the reference given, deduplicated by it
/// from the moment a request arrives.
#[derive(Default)]
struct Processor {
    requests: AtomicUsize,
    seen: Mutex<Vec<String>>,
    /// How the handler ended when it saw `tasks/cancel`.
    cancelled: AtomicUsize,
    /// How many of the next requests time out (after the charge was made).
    timeouts: AtomicUsize,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    processor: Arc<Processor>,
    delay: Duration,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        static LOCAL: std::sync::OnceLock<Caller> = std::sync::OnceLock::new();
        Some(LOCAL.get_or_init(|| Caller::new("acme", "alice")))
    }
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m", task = "optional")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<Receipt>, ToolError> {
        self.charge(args, context).await
    }

    #[idempotent(window = "1s", task = "optional")]
    #[tool(description = "Tap a card at a till: the same tap after 1 s is a new purchase")]
    async fn tap_to_pay(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<Receipt>, ToolError> {
        self.charge(args, context).await
    }
}

impl Shop {
    async fn charge(
        &self,
        args: ChargeArgs,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<Receipt>, ToolError> {
        let reference = current_reference()
            .expect("inside #[idempotent]")
            .to_string();
        let cancellation = current_cancellation();
        self.processor.requests.fetch_add(1, Ordering::SeqCst);
        if args.amount_cents >= 1_000_000 {
            return Err(ToolError::unknown(
                "the processor timed out; the charge may have gone through",
            ));
        }
        {
            let mut seen = self.processor.seen.lock().unwrap();
            if !seen.contains(&reference) {
                seen.push(reference.clone());
            }
        }
        let timed_out = self
            .processor
            .timeouts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if timed_out {
            return Err(ToolError::unknown(
                "the processor timed out; the charge may have gone through",
            ));
        }
        let charged = tokio::time::sleep(self.delay);
        match &cancellation {
            Some(signal) => tokio::select! {
                () = charged => {}
                () = signal.cancelled() => {
                    self.processor.cancelled.fetch_add(1, Ordering::SeqCst);
                    return Err(ToolError::rejected("cancelled before the charge was sent"));
                }
            },
            None => charged.await,
        }
        Ok(Json(Receipt {
            charge_id: format!("ch_{}", args.card),
            reference,
            as_task: cancellation.is_some(),
            request_id: format!("{:?}", context.id),
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        idem_runtime::mcp::tasks::get_task(self, request, context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        idem_runtime::mcp::tasks::cancel_task(self, request, context).await
    }
}

fn shop(delay: Duration) -> (Shop, Arc<Processor>) {
    shop_with(Executor::new(Arc::new(MemoryStore::new())), delay)
}

fn shop_with(executor: Executor, delay: Duration) -> (Shop, Arc<Processor>) {
    let processor = Arc::new(Processor::default());
    let shop = Shop {
        executor,
        processor: processor.clone(),
        delay,
        tool_router: Shop::tool_router(),
    };
    (shop, processor)
}

async fn connect<C: rmcp::Service<RoleClient>>(
    shop: Shop,
    client: C,
    lifecycle: ClientLifecycleMode,
) -> RunningService<RoleClient, C> {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    client
        .serve_with_lifecycle(client_side, lifecycle)
        .await
        .expect("client connects")
}

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

fn with_tasks() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("idem-tasks-e2e", "0"),
    )
}

fn without_tasks() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("idem-tasks-e2e", "0"),
    )
}

fn charge(amount: u64) -> CallToolRequestParams {
    let Value::Object(args) = json!({ "card": "4242", "amount_cents": amount }) else {
        unreachable!()
    };
    CallToolRequestParams::new("charge_card").with_arguments(args)
}

async fn poll<C: rmcp::Service<RoleClient>>(
    client: &RunningService<RoleClient, C>,
    task_id: &str,
) -> GetTaskResult {
    for _ in 0..200 {
        let got = client
            .get_task(GetTaskParams::new(task_id))
            .await
            .expect("tasks/get");
        if got.task.status().is_terminal() {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("task {task_id} never ended");
}

#[tokio::test]
async fn a_task_handler_sees_its_reference_its_signal_and_its_other_arguments() {
    let (shop, processor) = shop(Duration::from_millis(300));
    let client = connect(shop, with_tasks(), modern()).await;
    let CallToolResponse::Task(created) = client.call_tool_once(charge(100)).await.unwrap() else {
        panic!("a declared request gets a task");
    };
    let task_id = created.task.task_id;
    let done = poll(&client, &task_id).await;
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("completed expected, got {done:?}");
    };
    let receipt = &result["structuredContent"];
    assert_eq!(receipt["reference"], json!(task_id));
    assert_eq!(receipt["as_task"], json!(true));
    assert!(
        receipt["request_id"].as_str().unwrap().contains("Number"),
        "{receipt}"
    );
    assert_eq!(processor.requests.load(Ordering::SeqCst), 1);
    client.cancel().await.ok();
}

#[tokio::test]
async fn without_the_extension_the_handler_runs_inline_with_no_signal() {
    let (shop, processor) = shop(Duration::from_millis(50));
    // A 2026-07-28 client that declares nothing, and a 2025-11-25 one that
    // declares the extension (not defined under that version).
    let modern_plain = connect(shop.clone(), without_tasks(), modern()).await;
    let legacy = connect(shop, with_tasks(), ClientLifecycleMode::Initialize).await;
    for (client_result, amount) in [
        (modern_plain.call_tool_once(charge(200)).await, 200),
        (legacy.call_tool_once(charge(300)).await, 300),
    ] {
        let CallToolResponse::Complete(result) = client_result.unwrap() else {
            panic!("no task without the extension ({amount})");
        };
        let receipt = result.structured_content.expect("the receipt");
        assert_eq!(receipt["as_task"], json!(false));
    }
    assert_eq!(processor.requests.load(Ordering::SeqCst), 2);
    modern_plain.cancel().await.ok();
    legacy.cancel().await.ok();
}

#[tokio::test]
async fn concurrent_declared_calls_make_one_task_and_one_request() {
    let (shop, processor) = shop(Duration::from_millis(400));
    let client = connect(shop, with_tasks(), modern()).await;
    let calls = futures::future::join_all((0..5).map(|_| client.call_tool_once(charge(500)))).await;
    let ids: Vec<String> = calls
        .into_iter()
        .map(|r| match r.unwrap() {
            CallToolResponse::Task(t) => t.task.task_id,
            other => panic!("a task while it runs, got {other:?}"),
        })
        .collect();
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let done = poll(&client, &ids[0]).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    assert_eq!(processor.requests.load(Ordering::SeqCst), 1);
    assert_eq!(processor.seen.lock().unwrap().len(), 1);
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_cancelled_handler_ends_as_it_says_and_the_task_reports_it() {
    let (shop, processor) = shop(Duration::from_secs(30));
    let client = connect(shop, with_tasks(), modern()).await;
    let CallToolResponse::Task(created) = client.call_tool_once(charge(900)).await.unwrap() else {
        panic!("a task");
    };
    let task_id = created.task.task_id;
    tokio::time::sleep(Duration::from_millis(100)).await;
    client
        .cancel_task(CancelTaskParams::new(task_id.clone()))
        .await
        .expect("acknowledged");
    // The handler said nothing was sent: a rejection, kept, so the task
    // fails with its message.
    let done = poll(&client, &task_id).await;
    assert_eq!(done.task.status(), TaskStatus::Failed, "{done:?}");
    let TaskPayload::Failed { error } = &done.task.payload else {
        unreachable!()
    };
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("cancelled before the charge"),
        "{error:?}"
    );
    assert_eq!(processor.cancelled.load(Ordering::SeqCst), 1);
    client.cancel().await.ok();
}

/// The status message of a task once its outcome is unknown (it stays
/// working throughout).
async fn unknown_task_message<C: rmcp::Service<RoleClient>>(
    client: &RunningService<RoleClient, C>,
    task_id: &str,
) -> String {
    for _ in 0..100 {
        let got = client.get_task(GetTaskParams::new(task_id)).await.unwrap();
        assert_eq!(got.task.status(), TaskStatus::Working, "{got:?}");
        let message = got.task.task.status_message.unwrap_or_default();
        if message.contains("not known") {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {task_id} never read as unknown");
}

/// With a reconciler configured, an unknown task says it is being
/// reconciled, and who resolves what the reconciler cannot.
#[tokio::test]
async fn an_unknown_task_is_being_reconciled_where_a_reconciler_runs() {
    let executor = Executor::new(Arc::new(MemoryStore::new())).with_resolver(Resolver::Reconciler);
    let (shop, processor) = shop_with(executor, Duration::from_millis(10));
    let client = connect(shop, with_tasks(), modern()).await;
    let CallToolResponse::Task(created) = client.call_tool_once(charge(3_000_000)).await.unwrap()
    else {
        panic!("a task");
    };
    let task_id = created.task.task_id;
    let message = unknown_task_message(&client, &task_id).await;
    assert!(message.contains("being reconciled"), "{message}");
    assert!(
        message.contains(&format!("`idem resolve {task_id}`")),
        "{message}"
    );
    assert_eq!(processor.requests.load(Ordering::SeqCst), 1);
    client.cancel().await.ok();
}

#[tokio::test]
async fn an_unknown_outcome_stays_working_until_resolved_then_completes_or_fails() {
    let (shop, _processor) = shop(Duration::from_millis(10));
    let store = shop.executor.store().clone();
    let client = connect(shop, with_tasks(), modern()).await;
    let mut tasks = Vec::new();
    for amount in [1_000_000, 2_000_000] {
        let CallToolResponse::Task(created) = client.call_tool_once(charge(amount)).await.unwrap()
        else {
            panic!("a task");
        };
        tasks.push(created.task.task_id);
    }
    // Outcome unknown: not terminal, and, with no reconciler, it names the
    // command an operator resolves it with, never "being reconciled".
    for task_id in &tasks {
        let message = unknown_task_message(&client, task_id).await;
        assert!(message.contains("timed out"), "{message}");
        assert!(
            message.contains(&format!("`idem resolve {task_id}`")),
            "{message}"
        );
        assert!(!message.contains("reconciled"), "{message}");
    }

    // An operator finds the first was charged, the second not.
    let reference = |id: &str| idem_runtime::Reference::parse(id).unwrap();
    let response = json!({
        "content": [{ "type": "text", "text": "ch_by_hand" }],
        "structuredContent": { "charge_id": "ch_by_hand" },
        "isError": false,
    })
    .to_string();
    idem_runtime::maintenance::resolve_by_hand(
        &*store,
        "acme",
        &reference(&tasks[0]),
        &idem_runtime::maintenance::Outcome::completed(response),
        "ops: the processor shows ch_by_hand",
    )
    .await
    .unwrap();
    idem_runtime::maintenance::resolve_by_hand(
        &*store,
        "acme",
        &reference(&tasks[1]),
        &idem_runtime::maintenance::Outcome::NotPerformed,
        "ops: the processor has no such charge",
    )
    .await
    .unwrap();

    let completed = poll(&client, &tasks[0]).await;
    let TaskPayload::Completed { result } = &completed.task.payload else {
        panic!("completed expected, got {completed:?}");
    };
    assert_eq!(
        result["structuredContent"]["charge_id"],
        json!("ch_by_hand")
    );
    let failed = poll(&client, &tasks[1]).await;
    let TaskPayload::Failed { error } = &failed.task.payload else {
        panic!("failed expected, got {failed:?}");
    };
    // Not a rejection by the handler: an internal error, saying it did not
    // take effect and may be called again.
    assert_eq!(error["code"], json!(-32603), "{error:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("did not take effect"),
        "{error:?}"
    );
    client.cancel().await.ok();
}

/// A task's claim confirmed only after its lease ran out starts no handler:
/// the request is answered at once with "nothing was executed" (no task),
/// the claim is released, and the next request makes the task that runs.
#[tokio::test]
async fn a_task_claim_confirmed_after_its_lease_ran_out_starts_nothing() {
    use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
    let claims = Arc::new(AtomicUsize::new(0));
    let store = {
        let claims = claims.clone();
        FaultyStore::new(MemoryStore::new(), move |call| match call {
            Call::Claim if claims.fetch_add(1, Ordering::SeqCst) == 0 => {
                Fault::SlowAnswer(Duration::from_millis(500))
            }
            _ => Fault::None,
        })
    };
    let processor = Arc::new(Processor::default());
    let shop = Shop {
        executor: Executor::new(Arc::new(store)).with_lease(Duration::from_millis(300)),
        processor: processor.clone(),
        delay: Duration::from_millis(50),
        tool_router: Shop::tool_router(),
    };
    let client = connect(shop, with_tasks(), modern()).await;
    let CallToolResponse::Complete(refused) = client.call_tool_once(charge(100)).await.unwrap()
    else {
        panic!("a late claim makes no task");
    };
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let text = format!("{:?}", refused.content);
    assert!(text.contains("Nothing was executed"), "{text}");
    assert_eq!(processor.requests.load(Ordering::SeqCst), 0);

    // The release runs in the background; then the next request runs.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let CallToolResponse::Task(created) = client.call_tool_once(charge(100)).await.unwrap() else {
        panic!("the next request gets a task");
    };
    let done = poll(&client, &created.task.task_id).await;
    assert!(
        matches!(done.task.payload, TaskPayload::Completed { .. }),
        "{done:?}"
    );
    assert_eq!(processor.requests.load(Ordering::SeqCst), 1);
    client.cancel().await.ok();
}

/// A task whose outcome was unknown and was resolved completed late: its
/// task id reads completed with the resolution through `tasks/get`, and
/// still does after the same call, made after the window, ran as a new
/// task of its own.
#[tokio::test]
async fn an_old_task_reads_as_its_own_resolution_after_the_same_call_ran_again() {
    let (shop, processor) = shop(Duration::from_millis(50));
    let store = shop.executor.store().clone();
    processor.timeouts.store(1, Ordering::SeqCst);
    let client = connect(shop, with_tasks(), modern()).await;
    let tap = || {
        let Value::Object(args) = json!({ "card": "4000", "amount_cents": 450 }) else {
            unreachable!()
        };
        CallToolRequestParams::new("tap_to_pay").with_arguments(args)
    };
    let CallToolResponse::Task(first) = client.call_tool_once(tap()).await.unwrap() else {
        panic!("a declared request gets a task");
    };
    let first = first.task.task_id;
    // The processor timed out: the record is UNKNOWN, the task working.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = client.get_task(GetTaskParams::new(&first)).await.unwrap();
    assert_eq!(got.task.status(), TaskStatus::Working, "{got:?}");
    // The reconciler (here, by hand) finds the charge.
    let reference = idem_runtime::Reference::parse(&first).unwrap();
    let record = store.lookup("acme", &reference).await.unwrap().unwrap();
    let found =
        idem_runtime::mcp::stored_response(Json(json!({ "charge_id": "ch_found" }))).unwrap();
    store
        .resolve(
            &record.key,
            record.attempt,
            idem_runtime::store::Resolution::Completed { response: &found },
            None,
        )
        .await
        .unwrap();
    // After the window, the same tap is a new task, charged.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let CallToolResponse::Task(second) = client.call_tool_once(tap()).await.unwrap() else {
        panic!("the same tap after the window gets a task");
    };
    let second = second.task.task_id;
    assert_ne!(second, first, "a new operation, a new task");
    let done = poll(&client, &second).await;
    assert!(
        matches!(done.task.payload, TaskPayload::Completed { .. }),
        "{done:?}"
    );
    assert_eq!(
        processor.seen.lock().unwrap().clone(),
        [first.clone(), second.clone()],
        "the second tap reached the processor under its own reference: charged again"
    );
    let old = poll(&client, &first).await;
    let TaskPayload::Completed { result } = &old.task.payload else {
        panic!("the first task reads completed, got {old:?}");
    };
    assert_eq!(
        result["structuredContent"],
        json!({ "charge_id": "ch_found" })
    );
    client.cancel().await.ok();
}
