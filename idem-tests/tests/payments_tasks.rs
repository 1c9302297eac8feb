//! MCP tasks (`io.modelcontextprotocol/tasks`) served by the payments example
//! as a child process over stdio, driven by rmcp's client with the extension
//! declared. The stub processor's ledger counts every charge request the
//! moment it arrives, so a second execution would show.
//!
//! The binary is the one `cargo test` builds with the examples
//! (`target/debug/examples/payments`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, CreateTaskResult, ErrorCode, GetTaskParams, GetTaskResult, Implementation,
    ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type TasksClient = RunningService<RoleClient, ClientConfig>;
type PlainClient = RunningService<RoleClient, ()>;

fn payments_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("payments"))
        .expect("a target directory");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples) \
         or build it first with `cargo build --example payments`",
        bin.display()
    );
    bin
}

fn command(extra: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(payments_binary());
    command.args(["--transport", "stdio"]);
    command.args(extra);
    command
}

/// A client that declares the tasks extension.
fn with_tasks() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("idem-tasks-test", "0"),
    )
}

/// The extension is defined from protocol 2026-07-28 on, which has no
/// `initialize`: the client discovers the server and sends its capabilities
/// in every request's `_meta`.
fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

async fn start(extra: &[&str]) -> TasksClient {
    let mut args = vec!["--store", "memory"];
    args.extend_from_slice(extra);
    let transport = TokioChildProcess::new(command(&args)).expect("the example starts");
    with_tasks()
        .serve_with_lifecycle(transport, modern())
        .await
        .expect("the client connects")
}

async fn start_plain(extra: &[&str]) -> PlainClient {
    let mut args = vec!["--store", "memory"];
    args.extend_from_slice(extra);
    let transport = TokioChildProcess::new(command(&args)).expect("the example starts");
    ().serve(transport).await.expect("the client connects")
}

/// A tasks client on a shared SQLite file, as `tenant/subject`.
async fn start_on(db: &Path, tenant: &str, extra: &[&str]) -> TasksClient {
    let store = format!("sqlite:{}", db.display());
    let mut args = vec!["--store", store.as_str(), "--tenant", tenant];
    args.extend_from_slice(extra);
    let transport = TokioChildProcess::new(command(&args)).expect("the example starts");
    with_tasks()
        .serve_with_lifecycle(transport, modern())
        .await
        .expect("the client connects")
}

fn params(tool: &'static str, args: Value) -> CallToolRequestParams {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    CallToolRequestParams::new(tool).with_arguments(args)
}

async fn call_once(client: &TasksClient, tool: &'static str, args: Value) -> CallToolResponse {
    client
        .call_tool_once(params(tool, args))
        .await
        .expect("tools/call answers")
}

fn task(response: CallToolResponse) -> CreateTaskResult {
    match response {
        CallToolResponse::Task(task) => task,
        other => panic!("expected a task, got {other:?}"),
    }
}

fn complete(response: CallToolResponse) -> CallToolResult {
    match response {
        CallToolResponse::Complete(result) => result,
        other => panic!("expected a result, got {other:?}"),
    }
}

async fn get(client: &TasksClient, task_id: &str) -> Result<GetTaskResult, ServiceError> {
    client.get_task(GetTaskParams::new(task_id)).await
}

/// Polls `tasks/get` until the task is terminal, as a client honouring
/// `pollIntervalMs` would (capped, so the test stays short).
async fn poll_until_terminal(client: &TasksClient, task_id: &str) -> GetTaskResult {
    for _ in 0..200 {
        let got = get(client, task_id).await.expect("tasks/get answers");
        if got.task.status().is_terminal() {
            return got;
        }
        let poll = got.task.task.poll_interval_ms.unwrap_or(100).min(200);
        tokio::time::sleep(Duration::from_millis(poll)).await;
    }
    panic!("task {task_id} never ended");
}

async fn ledger<S: rmcp::Service<RoleClient>>(client: &RunningService<RoleClient, S>) -> Value {
    client
        .call_tool(params("processor_ledger", json!({})))
        .await
        .expect("the ledger answers")
        .structured_content
        .expect("the ledger is structured")
}

fn completed_result(got: &GetTaskResult) -> &rmcp::model::JsonObject {
    match &got.task.payload {
        TaskPayload::Completed { result } => result,
        other => panic!("expected a completed task, got {other:?}"),
    }
}

fn failed_error(got: &GetTaskResult) -> &rmcp::model::JsonObject {
    match &got.task.payload {
        TaskPayload::Failed { error } => error,
        other => panic!("expected a failed task, got {other:?}"),
    }
}

fn not_found(result: Result<GetTaskResult, ServiceError>) -> rmcp::ErrorData {
    match result {
        Err(ServiceError::McpError(error)) => error,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_slow_charge_returns_a_task_and_polling_ends_completed_with_the_receipt() {
    let client = start(&["--processor-delay-ms", "1500"]).await;
    let args = json!({ "card": "4242", "amount_cents": 1999 });
    let created = task(call_once(&client, "charge_card", args).await);
    let task_id = created.task.task_id.clone();
    assert!(task_id.starts_with("idem_"), "{task_id}");
    assert_eq!(created.task.status, TaskStatus::Working);
    // The window (15 min) is how long the completed task answers; the
    // default 30 s lease gives a 3 s poll interval.
    assert_eq!(created.task.ttl_ms, Some(15 * 60 * 1000));
    assert_eq!(created.task.poll_interval_ms, Some(3000));

    // Answered before the processor finished: nothing charged yet.
    let first = get(&client, &task_id).await.expect("tasks/get answers");
    assert_eq!(first.task.status(), TaskStatus::Working, "{first:?}");
    assert_eq!(ledger(&client).await["processor_charges"], json!(0));

    let done = poll_until_terminal(&client, &task_id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    let result = completed_result(&done);
    assert_eq!(result["isError"], json!(false), "{result:?}");
    let receipt = &result["structuredContent"];
    assert_eq!(receipt["amount_cents"], json!(1999));
    // The processor was given the task id as its idempotency reference.
    assert_eq!(receipt["reference"], json!(task_id));
    assert_eq!(
        result["_meta"][idem_runtime::mcp::RESULT_META_KEY]["reference"],
        json!(task_id)
    );

    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
    assert_eq!(ledger["processor_charges"], json!(1), "{ledger}");
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_repeat_while_working_gets_the_same_task_and_the_processor_charges_once() {
    let client = start(&["--processor-delay-ms", "1500"]).await;
    let args = json!({ "card": "4242", "amount_cents": 2500 });
    // Two calls in flight at once, then one more while the first runs.
    let (a, b) = tokio::join!(
        call_once(&client, "charge_card", args.clone()),
        call_once(&client, "charge_card", args.clone())
    );
    let (a, b) = (task(a), task(b));
    assert_eq!(a.task.task_id, b.task.task_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = task(call_once(&client, "charge_card", args.clone()).await);
    assert_eq!(again.task.task_id, a.task.task_id);
    assert_eq!(again.task.status, TaskStatus::Working);

    let done = poll_until_terminal(&client, &a.task.task_id).await;
    let receipt = completed_result(&done)["structuredContent"].clone();

    // A repeat of the completed operation gets its stored result at once
    // (docs/tasks.md): the same receipt, marked replayed, no new charge.
    let replay = complete(call_once(&client, "charge_card", args).await);
    assert_eq!(replay.is_error, Some(false));
    assert_eq!(replay.structured_content, Some(receipt));
    let meta = &replay.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY];
    assert_eq!(meta["state"], json!("replayed"));
    assert_eq!(meta["reference"], json!(a.task.task_id));

    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
    assert_eq!(ledger["processor_charges"], json!(1), "{ledger}");
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_client_without_the_extension_gets_the_result_inline() {
    let client = start_plain(&["--processor-delay-ms", "300"]).await;
    let result = client
        .call_tool(params(
            "charge_card",
            json!({ "card": "4242", "amount_cents": 700 }),
        ))
        .await
        .expect("tools/call answers with a result, not a task");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["amount_cents"],
        json!(700)
    );
    let meta = &result.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY];
    assert_eq!(meta["state"], json!("executed"));
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_rejected_task_fails_with_the_handlers_message_and_stays_failed() {
    // On SQLite: the record kept for the rejection goes through a durable
    // store's statements, not only the memory store's.
    let dir = std::env::temp_dir().join(format!("idem-tasks-rejected-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("rejected.sqlite3");
    let _ = std::fs::remove_file(&db);
    let client = start_on(&db, "acme", &[]).await;
    let args = json!({ "card": "4242", "amount_cents": 0 });
    let created = task(call_once(&client, "charge_card", args.clone()).await);
    let task_id = created.task.task_id;
    let failed = poll_until_terminal(&client, &task_id).await;
    assert_eq!(failed.task.status(), TaskStatus::Failed, "{failed:?}");
    let error = failed_error(&failed);
    assert_eq!(error["code"], json!(ErrorCode::INVALID_PARAMS.0));
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("at least 1 cent"), "{message}");
    // Durable: asked again, the same answer.
    let again = get(&client, &task_id).await.unwrap();
    assert_eq!(again.task.status(), TaskStatus::Failed);

    // Nothing happened, so the same call may run again: under the same task
    // id (the id names the operation), and it is refused again.
    let retried = task(call_once(&client, "charge_card", args).await);
    assert_eq!(retried.task.task_id, task_id);
    let failed = poll_until_terminal(&client, &task_id).await;
    assert_eq!(failed.task.status(), TaskStatus::Failed);

    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(0), "{ledger}");
    client.cancel().await.ok();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn another_tenants_task_is_not_found_and_the_same_tenant_reads_it_from_another_process() {
    let dir = std::env::temp_dir().join(format!("idem-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("tenants.sqlite3");
    let _ = std::fs::remove_file(&db);

    let acme = start_on(&db, "acme", &["--processor-delay-ms", "200"]).await;
    let created = task(
        call_once(
            &acme,
            "charge_card",
            json!({ "card": "4242", "amount_cents": 1234 }),
        )
        .await,
    );
    let task_id = created.task.task_id;
    let done = poll_until_terminal(&acme, &task_id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);

    // Another process, same tenant: the record is the task.
    let acme_again = start_on(&db, "acme", &[]).await;
    let read = get(&acme_again, &task_id).await.expect("found");
    assert_eq!(read.task.status(), TaskStatus::Completed);
    assert_eq!(
        completed_result(&read)["structuredContent"],
        completed_result(&done)["structuredContent"]
    );

    // Another tenant: not found, exactly as an id that never existed.
    let globex = start_on(&db, "globex", &[]).await;
    let theirs = not_found(get(&globex, &task_id).await);
    let nobody = not_found(get(&globex, "idem_0000000000000000").await);
    assert_eq!(theirs.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(nobody.code, theirs.code);
    assert_eq!(
        theirs.message.replace(&task_id, "ID"),
        nobody.message.replace("idem_0000000000000000", "ID")
    );
    let cancel = globex
        .cancel_task(CancelTaskParams::new(task_id.clone()))
        .await;
    assert!(
        matches!(cancel, Err(ServiceError::McpError(ref e)) if e.code == ErrorCode::INVALID_PARAMS),
        "{cancel:?}"
    );

    for client in [acme, acme_again, globex] {
        client.cancel().await.ok();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn tasks_cancel_signals_the_handler_and_never_releases_the_record() {
    let client = start(&["--processor-delay-ms", "3000"]).await;
    let args = json!({ "card": "4242", "amount_cents": 4100 });
    let created = task(call_once(&client, "charge_card", args.clone()).await);
    let task_id = created.task.task_id;
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .cancel_task(CancelTaskParams::new(task_id.clone()))
        .await
        .expect("tasks/cancel is acknowledged");

    // The handler stopped waiting: the charge may have gone through, so
    // the task stays working, saying it is being reconciled, not failed
    // and not gone.
    let mut status = None;
    for _ in 0..40 {
        let got = get(&client, &task_id).await.expect("the record is kept");
        let message = got.task.task.status_message.clone().unwrap_or_default();
        if message.contains("reconciled") {
            status = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("the cancelled handler's outcome shows as unknown");
    assert_eq!(status.task.status(), TaskStatus::Working);
    let message = status.task.task.status_message.unwrap();
    assert!(message.contains("cancelled"), "{message}");

    // A repeat answers with the same task and runs nothing.
    let repeat = task(call_once(&client, "charge_card", args).await);
    assert_eq!(repeat.task.task_id, task_id);
    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
    client.cancel().await.ok();
}
