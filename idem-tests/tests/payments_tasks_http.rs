//! MCP tasks over streamable HTTP, against the payments example as child
//! processes:
//!
//! - rmcp's HTTP client with the tasks extension, two server processes on
//!   one PostgreSQL database: `tools/call` on A, `tasks/get` on B; a kill -9
//!   of A mid-handler, and what B says once the lease has run out. These
//!   need `IDEM_TEST_DATABASE_URL` (see `durable::database_url`).
//! - raw JSON-RPC over HTTP, no MCP SDK in between, checking the wire shape
//!   against the extension's text (SEP-2663). This one runs on a memory
//!   store, always.

mod durable;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, CreateTaskResult,
    ErrorCode, GetTaskParams, GetTaskResult, Implementation, ProtocolVersion, TaskPayload,
    TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::RoleClient;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use durable::database_url;

type Client = RunningService<RoleClient, ClientConfig>;

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

/// One payments server over HTTP; killed (SIGKILL) when dropped.
struct Server {
    child: Child,
    url: String,
}

/// Starts the payments example on a free port with two tenants' tokens.
async fn serve(store: &str, extra: &[&str]) -> Server {
    let mut command = Command::new(payments_binary());
    command
        .args([
            "--transport",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--store",
            store,
        ])
        .args([
            "--token",
            "tok-acme=acme/alice",
            "--token",
            "tok-globex=globex/bob",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the example starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("stderr reads") {
            if let Some(url) = line.strip_prefix("payments: serving MCP on ") {
                return url.trim().to_owned();
            }
            eprintln!("{line}");
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example serves within 30 s");
    // Keep draining stderr so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server { child, url }
}

/// rmcp's HTTP client, tasks declared, as the caller behind `token`.
async fn connect(server: &Server, token: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()).auth_header(token),
    );
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("idem-tasks-http-test", "0"),
    )
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("the client connects")
}

fn params(tool: &'static str, args: Value) -> CallToolRequestParams {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    CallToolRequestParams::new(tool).with_arguments(args)
}

async fn start_task(client: &Client, args: Value) -> CreateTaskResult {
    match client
        .call_tool_once(params("charge_card", args))
        .await
        .expect("tools/call answers")
    {
        CallToolResponse::Task(task) => task,
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn get(client: &Client, task_id: &str) -> Result<GetTaskResult, ServiceError> {
    client.get_task(GetTaskParams::new(task_id)).await
}

async fn ledger(client: &Client) -> Value {
    client
        .call_tool(params("processor_ledger", json!({})))
        .await
        .expect("the ledger answers")
        .structured_content
        .expect("the ledger is structured")
}

/// A database of its own, dropped at the end (the example uses the default
/// schema).
struct Database {
    url: String,
    name: String,
    admin_url: String,
}

impl Database {
    async fn create(admin_url: &str) -> Database {
        let name = format!(
            "idem_tasks_{:016x}",
            idem_runtime::store::Attempt::random().get()
        );
        let admin = durable::connect(admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let (base, _) = admin_url.rsplit_once('/').unwrap();
        Database {
            url: format!("{base}/{name}"),
            name,
            admin_url: admin_url.to_owned(),
        }
    }

    async fn drop_it(self) {
        let admin = durable::connect(&self.admin_url).await;
        let _ = admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_on_one_replica_is_polled_and_repeated_on_another() {
    let Some(admin) = database_url() else { return };
    let db = Database::create(&admin).await;
    let a = serve(&db.url, &["--processor-delay-ms", "1500"]).await;
    let b = serve(&db.url, &[]).await;
    let on_a = connect(&a, "tok-acme").await;
    let on_b = connect(&b, "tok-acme").await;

    let args = json!({ "card": "4242", "amount_cents": 5000 });
    let created = start_task(&on_a, args.clone()).await;
    let task_id = created.task.task_id.clone();

    // B reads the record A claimed: the task is there at once.
    let seen = get(&on_b, &task_id).await.expect("B finds A's task");
    assert_eq!(seen.task.status(), TaskStatus::Working, "{seen:?}");
    // A repeat on B, while A runs it: the same task, nothing runs on B.
    let repeat = start_task(&on_b, args.clone()).await;
    assert_eq!(repeat.task.task_id, task_id);

    // Another tenant on B: not found.
    let globex = connect(&b, "tok-globex").await;
    match get(&globex, &task_id).await {
        Err(ServiceError::McpError(e)) => assert_eq!(e.code, ErrorCode::INVALID_PARAMS),
        other => panic!("another tenant's task must be not found, got {other:?}"),
    }

    // Polled on B until A's handler finishes: the receipt, from the store.
    let mut done = None;
    for _ in 0..100 {
        let got = get(&on_b, &task_id).await.expect("tasks/get on B");
        if got.task.status().is_terminal() {
            done = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = done.expect("the task ends");
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("expected completed, got {done:?}");
    };
    assert_eq!(result["structuredContent"]["amount_cents"], json!(5000));
    assert_eq!(result["structuredContent"]["reference"], json!(task_id));

    // A call refused before any effect, made on A: B reads it as failed,
    // with the handler's message, from the record kept for it.
    let refused = start_task(&on_a, json!({ "card": "4242", "amount_cents": 0 })).await;
    let mut failed = None;
    for _ in 0..100 {
        let got = get(&on_b, &refused.task.task_id)
            .await
            .expect("tasks/get on B");
        if got.task.status().is_terminal() {
            failed = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed = failed.expect("the refused task ends");
    let TaskPayload::Failed { error } = &failed.task.payload else {
        panic!("expected failed, got {failed:?}");
    };
    assert_eq!(error["code"], json!(ErrorCode::INVALID_PARAMS.0));
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("at least 1 cent"),
        "{error:?}"
    );

    // One charge request reached A's processor, none B's.
    let ledger_a = ledger(&on_a).await;
    let ledger_b = ledger(&on_b).await;
    assert_eq!(ledger_a["processor_requests"], json!(1), "{ledger_a}");
    assert_eq!(ledger_a["processor_charges"], json!(1), "{ledger_a}");
    assert_eq!(ledger_b["processor_requests"], json!(0), "{ledger_b}");

    for client in [on_a, on_b, globex] {
        client.cancel().await.ok();
    }
    drop((a, b));
    db.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_mid_handler_another_replica_reports_the_outcome_as_unknown() {
    let Some(admin) = database_url() else { return };
    let db = Database::create(&admin).await;
    let lease = ["--lease-ms", "1500"];
    let mut a = serve(
        &db.url,
        &["--processor-delay-ms", "20000", "--lease-ms", "1500"],
    )
    .await;
    let b = serve(&db.url, &lease).await;
    let on_a = connect(&a, "tok-acme").await;
    let on_b = connect(&b, "tok-acme").await;

    let args = json!({ "card": "4242", "amount_cents": 6100 });
    let created = start_task(&on_a, args.clone()).await;
    let task_id = created.task.task_id.clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let running = get(&on_b, &task_id).await.expect("B finds it");
    assert_eq!(running.task.status(), TaskStatus::Working);
    assert!(
        running
            .task
            .task
            .status_message
            .as_deref()
            .unwrap_or_default()
            .contains("still running"),
        "{running:?}"
    );

    // A dies mid-charge, with no chance to say anything.
    a.child.start_kill().expect("SIGKILL");
    a.child.wait().await.expect("A is gone");
    drop(on_a);

    // Once the lease has run out, B says what is true: the charge may or
    // may not have happened, and it is being reconciled. Not completed, not
    // failed, not gone.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let after = get(&on_b, &task_id).await.expect("the record outlives A");
    assert_eq!(after.task.status(), TaskStatus::Working, "{after:?}");
    let message = after.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("not known"), "{message}");
    assert!(message.contains("reconciled"), "{message}");
    // The TTL now covers the retention of an unknown outcome (48 h).
    assert_eq!(after.task.task.ttl_ms, Some(48 * 3600 * 1000));

    // A repeat on B does not run it again: the same task.
    let repeat = start_task(&on_b, args).await;
    assert_eq!(repeat.task.task_id, task_id);
    let ledger_b = ledger(&on_b).await;
    assert_eq!(ledger_b["processor_requests"], json!(0), "{ledger_b}");

    on_b.cancel().await.ok();
    drop(b);
    db.drop_it().await;
}

/// One JSON-RPC request over HTTP, by hand: the headers SEP-2243 asks of a
/// 2026-07-28 client, and the answer read from JSON or from an SSE stream.
async fn raw(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    name: &str,
    params: Value,
) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let response = http
        .post(url)
        .header("Authorization", "Bearer tok-acme")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let text = response.text().await.expect("a body");
    let message = std::iter::once(text.as_str())
        .chain(text.lines().filter_map(|l| l.strip_prefix("data:")))
        .filter_map(|candidate| serde_json::from_str::<Value>(candidate.trim()).ok())
        .find(|message| message["id"] == json!(id))
        .unwrap_or_else(|| panic!("no JSON-RPC answer to {method} in HTTP {status}: {text}"));
    // A result comes with 200; an error may come with a 4xx (rmcp answers
    // a missing capability with 400), its body still the JSON-RPC error.
    if message.get("result").is_some() {
        assert!(status.is_success(), "{method}: HTTP {status}: {text}");
    }
    message
}

/// The per-request `_meta` of a 2026-07-28 client; `tasks` declares the
/// extension.
fn meta(tasks: bool) -> Value {
    let extensions = if tasks {
        json!({ "io.modelcontextprotocol/tasks": {} })
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "raw-json-rpc", "version": "0" },
        "io.modelcontextprotocol/clientCapabilities": { "extensions": extensions },
    })
}

fn is_iso8601(value: &Value) -> bool {
    value.as_str().is_some_and(|s| {
        s.len() >= 20 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T' && s.ends_with('Z')
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_shape_matches_the_tasks_extension() {
    let server = serve("memory", &["--processor-delay-ms", "800"]).await;
    let http = reqwest::Client::new();
    let url = server.url.as_str();
    let charge = |amount: u64, tasks: bool| {
        json!({
            "name": "charge_card",
            "arguments": { "card": "4242", "amount_cents": amount },
            "_meta": meta(tasks),
        })
    };

    // Declared: a CreateTaskResult, `resultType: "task"`, the Task fields
    // flattened beside it, and no result/error/inputRequests.
    let created = raw(
        &http,
        url,
        1,
        "tools/call",
        "charge_card",
        charge(4200, true),
    )
    .await;
    let task = &created["result"];
    assert_eq!(task["resultType"], json!("task"), "{created}");
    let task_id = task["taskId"]
        .as_str()
        .expect("taskId is a string")
        .to_owned();
    assert!(task_id.starts_with("idem_"), "{task_id}");
    assert_eq!(task["status"], json!("working"));
    assert!(is_iso8601(&task["createdAt"]), "{task}");
    assert!(is_iso8601(&task["lastUpdatedAt"]), "{task}");
    assert_eq!(task["ttlMs"], json!(15 * 60 * 1000));
    assert!(task["pollIntervalMs"].is_u64(), "{task}");
    for absent in ["result", "error", "inputRequests", "content", "isError"] {
        assert!(task.get(absent).is_none(), "{absent} in {task}");
    }

    // tasks/get with `Mcp-Name: <taskId>`: `resultType: "complete"`, a
    // working task, then a completed one with the CallToolResult inline.
    let get_params = json!({ "taskId": task_id, "_meta": meta(true) });
    let working = raw(&http, url, 2, "tasks/get", &task_id, get_params.clone()).await;
    assert_eq!(
        working["result"]["resultType"],
        json!("complete"),
        "{working}"
    );
    assert_eq!(working["result"]["taskId"], json!(task_id));
    assert_eq!(working["result"]["status"], json!("working"));
    assert!(working["result"].get("result").is_none());

    let mut completed = Value::Null;
    for id in 3..60 {
        let got = raw(&http, url, id, "tasks/get", &task_id, get_params.clone()).await;
        if got["result"]["status"] == json!("completed") {
            completed = got;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let completed = &completed["result"];
    assert_eq!(completed["resultType"], json!("complete"), "{completed}");
    assert_eq!(completed["taskId"], json!(task_id));
    assert!(completed.get("error").is_none());
    let result = &completed["result"];
    assert_eq!(result["isError"], json!(false), "{completed}");
    assert_eq!(result["structuredContent"]["amount_cents"], json!(4200));
    assert_eq!(result["content"][0]["type"], json!("text"));

    // tasks/cancel: an empty acknowledgement, `resultType: "complete"`.
    let cancel = raw(&http, url, 70, "tasks/cancel", &task_id, get_params.clone()).await;
    let ack = cancel["result"].as_object().expect("a result");
    assert_eq!(ack.get("resultType"), Some(&json!("complete")), "{cancel}");
    assert!(
        ack.keys().all(|k| k == "resultType" || k == "_meta"),
        "{cancel}"
    );

    // An unknown task id: -32602 (Invalid params).
    let unknown = raw(
        &http,
        url,
        71,
        "tasks/get",
        "idem_0000000000000000",
        json!({ "taskId": "idem_0000000000000000", "_meta": meta(true) }),
    )
    .await;
    assert_eq!(unknown["error"]["code"], json!(-32602), "{unknown}");

    // tasks/get from a client that did not declare the extension: -32021.
    let undeclared = raw(
        &http,
        url,
        72,
        "tasks/get",
        &task_id,
        json!({ "taskId": task_id, "_meta": meta(false) }),
    )
    .await;
    assert_eq!(undeclared["error"]["code"], json!(-32021), "{undeclared}");

    // Not declared: today's answer, the CallToolResult inline.
    let inline = raw(
        &http,
        url,
        73,
        "tools/call",
        "charge_card",
        charge(4300, false),
    )
    .await;
    let result = &inline["result"];
    assert!(result.get("taskId").is_none(), "{inline}");
    assert_ne!(result["resultType"], json!("task"), "{inline}");
    assert_eq!(result["isError"], json!(false), "{inline}");
    assert_eq!(result["structuredContent"]["amount_cents"], json!(4300));

    // The server advertises the extension in server/discover.
    let discovered = raw(
        &http,
        url,
        74,
        "server/discover",
        "",
        json!({ "_meta": meta(false) }),
    )
    .await;
    assert!(
        discovered["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"]
            .is_object(),
        "{discovered}"
    );
    drop(server);
}
