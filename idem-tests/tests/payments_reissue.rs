//! The protocol's own retry path (issue 47, part 4), against the payments
//! example over streamable HTTP on the 2026-07-28 protocol (stateless: no
//! session): a response stream broken mid-call, and the call re-issued
//! under a new request id, as the specification says a client MUST. rmcp
//! cancels the request's token when the client disconnects; the handler
//! runs on. The re-issue is told "in progress", then gets the stored
//! receipt, and the processor stub charged once.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::RoleClient;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

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

struct Server {
    _child: Child,
    url: String,
}

async fn serve(delay_ms: &str) -> Server {
    let mut command = Command::new(payments_binary());
    command
        .args(["--transport", "http", "--listen", "127.0.0.1:0"])
        .args(["--store", "memory", "--processor-delay-ms", delay_ms])
        .args(["--token", "tok-acme=acme/alice"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the example starts");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("stderr reads") {
            if let Some(url) = line.strip_prefix("payments: serving MCP on ") {
                return url.trim().to_owned();
            }
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example serves within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server { _child: child, url }
}

/// rmcp's HTTP client on the modern protocol (no session).
async fn connect(server: &Server) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()).auth_header("tok-acme"),
    );
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("idem-reissue-test", "0"),
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

const ARGS: fn() -> Value = || json!({ "card": "4242", "amount_cents": 5150 });

/// Sends `tools/call` by hand, as a 2026-07-28 client, and drops the
/// connection after `after`, before any answer: the broken stream.
async fn call_and_drop(server: &Server, after: Duration) {
    let body = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "charge_card",
            "arguments": ARGS(),
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": { "name": "dropped", "version": "0" },
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    });
    let http = reqwest::Client::new();
    let sent = http
        .post(&server.url)
        .header("Authorization", "Bearer tok-acme")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "charge_card")
        .body(body.to_string())
        .send();
    let read = async move {
        let response = sent.await.expect("the server takes the request");
        // Whatever comes, the stream is dropped before the answer: the
        // handler sleeps at the processor far longer than `after`.
        response.text().await.ok()
    };
    if let Ok(answer) = tokio::time::timeout(after, read).await {
        panic!("the call answered before the stream was dropped: {answer:?}");
    }
    // Dropped here: the connection closes.
}

async fn charge(client: &Client) -> CallToolResult {
    let Value::Object(args) = ARGS() else {
        unreachable!()
    };
    client
        .call_tool(CallToolRequestParams::new("charge_card").with_arguments(args))
        .await
        .expect("tools/call answers")
}

fn op(result: &CallToolResult) -> &Value {
    &result.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY]
}

async fn ledger(client: &Client) -> Value {
    client
        .call_tool(CallToolRequestParams::new("processor_ledger"))
        .await
        .expect("the ledger answers")
        .structured_content
        .expect("the ledger is structured")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_reissued_after_a_dropped_stream_charges_once() {
    let server = serve("2000").await;
    call_and_drop(&server, Duration::from_millis(500)).await;

    let client = connect(&server).await;
    let reissued = charge(&client).await;
    assert_eq!(op(&reissued)["state"], "in_progress", "{reissued:?}");
    let reference = op(&reissued)["reference"].clone();
    assert!(reissued.is_error == Some(true));

    // The handler ran on after the disconnect: its receipt is stored.
    let mut answer = reissued;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        answer = charge(&client).await;
        if op(&answer)["state"] != "in_progress" {
            break;
        }
    }
    assert_eq!(op(&answer)["state"], "replayed", "{answer:?}");
    assert_eq!(op(&answer)["reference"], reference);
    let receipt = answer.structured_content.as_ref().expect("a receipt");
    assert_eq!(receipt["reference"], reference);

    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], 1, "{ledger}");
    assert_eq!(ledger["processor_charges"], 1, "{ledger}");
}
