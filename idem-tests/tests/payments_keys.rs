//! Client keys against the payments example as a child process, driven by
//! rmcp's client over stdio (`_meta["idem/idempotency-key"]`) and over
//! streamable HTTP on the 2026-07-28 protocol (`_meta`, and the
//! `Idempotency-Key` header): a key repeated, reused after the tool's
//! window, reused with other arguments, invalid, sent by another caller,
//! and sent twice with two values. Every test counts the charges the
//! example's processor stub really made (`processor_ledger`).
//!
//! Where each path of client keys, confirmations and re-issues is driven
//! end to end against the example, by transport and client (rmcp's here
//! and in payments_confirm.rs and payments_reissue.rs; the Python SDK's
//! on the modern protocol in tests/python/test_client_keys.py,
//! test_confirm.py and test_reissue.py; the test names are the same
//! across files where they can be):
//!
//! ```text
//! path                        rmcp stdio    rmcp HTTP     Python stdio  Python HTTP
//! key in _meta                keys_in_meta  keys_in_meta  keys_in_meta  keys_in_meta
//! key as the header           -             key_header    -             key_header
//! key reused after the window after_window  after_window  after_window  after_window
//! same key, other arguments   keys_in_meta  keys_in_meta  keys_in_meta  keys_in_meta
//! invalid keys                keys_in_meta  both          keys_in_meta  both
//! another caller's same key   callers       callers       callers       callers
//! confirmation accepted       confirmed     confirmed     confirmed     confirmed
//!   declined                  decline       decline       decline       decline
//!   repeated, re-issued       confirmed     confirmed     by_hand       by_hand
//!   tampered                  tampered      tampered      by_hand       by_hand
//! by construction             nickname      nickname      nickname      nickname
//! re-issue, dropped stream    -             reissue       -             reissue
//! ```
//!
//! `keys_in_meta`, `key_header` (`the_idempotency_key_header`),
//! `after_window` (`a_key_reused_after_the_window_replays`), `callers`
//! (`another_callers_identical_key_is_its_own_charge`; over stdio, two
//! processes with their own `--subject` on one store file), `both` (in
//! `_meta` and as the header): this file and test_client_keys.py.
//! `confirmed`, `decline`, `tampered`, `nickname`, `by_hand`
//! (`test_rounds_driven_by_hand_repeated_reissued_and_tampered`):
//! payments_confirm.rs and test_confirm.py. `reissue`: payments_reissue.rs
//! and test_reissue.py. `-`: stdio has no headers, and no response stream
//! that breaks while the process lives.

mod durable;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    Implementation, ProtocolVersion, RequestMetaObject,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

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

/// Either client: rmcp's over stdio, or over HTTP.
enum Client {
    Stdio(RunningService<RoleClient, ()>),
    Http(RunningService<RoleClient, ClientConfig>),
}

impl Client {
    async fn call(&self, params: CallToolRequestParams) -> CallToolResult {
        match self {
            Client::Stdio(client) => client.call_tool(params).await,
            Client::Http(client) => client.call_tool(params).await,
        }
        .expect("tools/call answers")
    }
}

async fn stdio() -> Client {
    stdio_with(&["--store", "memory"]).await
}

/// The example over stdio with these flags (`--store` among them).
async fn stdio_with(flags: &[&str]) -> Client {
    let mut command = Command::new(payments_binary());
    command.args(["--transport", "stdio"]).args(flags);
    command.stderr(Stdio::null());
    let transport = TokioChildProcess::new(command).expect("the example starts");
    Client::Stdio(().serve(transport).await.expect("the client connects"))
}

/// One payments server over HTTP; killed when dropped.
struct Server {
    _child: Child,
    url: String,
}

async fn http_server() -> Server {
    http_server_with(&[]).await
}

async fn http_server_with(extra: &[&str]) -> Server {
    let mut command = Command::new(payments_binary());
    command
        .args([
            "--transport",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory",
            "--token",
            "tok-alice=acme/alice",
            "--token",
            "tok-bob=acme/bob",
        ])
        .args(extra)
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

/// rmcp's HTTP client on the modern protocol, as the caller behind
/// `token`, sending `Idempotency-Key: header` on every request when given.
async fn http(server: &Server, token: &str, header: Option<&str>) -> Client {
    http_client(server, token, header, ClientCapabilities::default()).await
}

async fn http_client(
    server: &Server,
    token: &str,
    header: Option<&str>,
    capabilities: ClientCapabilities,
) -> Client {
    let mut headers = HashMap::new();
    if let Some(key) = header {
        headers.insert(
            http::HeaderName::from_static("idempotency-key"),
            http::HeaderValue::from_str(key).expect("a header value"),
        );
    }
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.clone())
            .auth_header(token)
            .custom_headers(headers),
    );
    let client = ClientConfig::new(capabilities, Implementation::new("idem-keys-test", "0"))
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("the client connects");
    Client::Http(client)
}

fn params(tool: &'static str, args: Value, key: Option<&str>) -> CallToolRequestParams {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let mut params = CallToolRequestParams::new(tool).with_arguments(args);
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0.insert("idem/idempotency-key".to_owned(), json!(key));
        params.meta = Some(meta);
    }
    params
}

async fn call(
    client: &Client,
    tool: &'static str,
    args: Value,
    key: Option<&str>,
) -> CallToolResult {
    client.call(params(tool, args, key)).await
}

/// The charges the processor stub really made.
async fn charges(client: &Client) -> u64 {
    let ledger = client
        .call(params("processor_ledger", json!({}), None))
        .await
        .structured_content
        .expect("the ledger is structured");
    ledger["processor_charges"].as_u64().expect("a count")
}

fn op(result: &CallToolResult) -> &Value {
    &result.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY]
}

fn state(result: &CallToolResult) -> &str {
    op(result)["state"].as_str().expect("a state")
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect()
}

fn charge(cents: u64) -> Value {
    json!({ "card": "4242", "amount_cents": cents })
}

/// What every transport must show for a key in `_meta`: a repeat replays,
/// other arguments conflict, another key charges again, invalid keys run
/// nothing, and the answers say `keyedBy`.
async fn keys_in_meta(client: &Client) {
    for tool in ["charge_card", "tap_to_pay"] {
        let before = charges(client).await;
        let first = call(client, tool, charge(1200), Some("order-1/step-1")).await;
        assert_eq!(state(&first), "executed", "{tool}: {first:?}");
        assert_eq!(op(&first)["keyedBy"], "clientKey");
        let again = call(client, tool, charge(1200), Some("order-1/step-1")).await;
        assert_eq!(state(&again), "replayed", "{tool}: {again:?}");
        assert_eq!(op(&again)["reference"], op(&first)["reference"]);
        assert_eq!(again.structured_content, first.structured_content);

        let other = call(client, tool, charge(9900), Some("order-1/step-1")).await;
        assert_eq!(state(&other), "conflict", "{tool}: {other:?}");
        assert!(
            text(&other).contains("new idempotency key"),
            "{}",
            text(&other)
        );

        let second = call(client, tool, charge(1200), Some("order-2/step-1")).await;
        assert_eq!(state(&second), "executed", "another key, another charge");
        assert_ne!(op(&second)["reference"], op(&first)["reference"]);

        for bad in ["", "has space", "caf\u{e9}", &"k".repeat(256)] {
            let refused = call(client, tool, charge(1300), Some(bad)).await;
            assert_eq!(state(&refused), "refused", "{tool} {bad:?}: {refused:?}");
            assert!(
                text(&refused).contains("1 to 255 visible ASCII"),
                "{}",
                text(&refused)
            );
        }
        let unkeyed = call(client, tool, charge(1400), None).await;
        assert_eq!(op(&unkeyed)["keyedBy"], "arguments");
        assert_eq!(
            charges(client).await - before,
            3,
            "{tool}: the first key once, the second key once, the unkeyed call once"
        );
    }
    // The shipment's business key is what names it.
    let shipped = call(
        client,
        "create_shipment",
        json!({"order_id": "o-1", "address": "1 Main St", "service_level": "standard"}),
        Some("ignored"),
    )
    .await;
    assert_eq!(op(&shipped)["keyedBy"], "businessKey", "{shipped:?}");
}

#[tokio::test]
async fn stdio_keys_in_meta() {
    keys_in_meta(&stdio().await).await;
}

#[tokio::test]
async fn http_keys_in_meta() {
    let server = http_server().await;
    keys_in_meta(&http(&server, "tok-alice", None).await).await;
}

/// `tap_to_pay`'s window is 5 s: a key reused after it replays (the key's
/// retention is 24 h), where the same tap without a key charges again.
async fn a_key_reused_after_the_window(client: &Client) {
    let first = call(client, "tap_to_pay", charge(450), Some("till-7/sale-31")).await;
    let unkeyed = call(client, "tap_to_pay", charge(460), None).await;
    assert_eq!([state(&first), state(&unkeyed)], ["executed", "executed"]);
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let later = call(client, "tap_to_pay", charge(450), Some("till-7/sale-31")).await;
    assert_eq!(state(&later), "replayed", "{later:?}");
    assert_eq!(op(&later)["reference"], op(&first)["reference"]);
    let unkeyed_later = call(client, "tap_to_pay", charge(460), None).await;
    assert_eq!(
        state(&unkeyed_later),
        "executed",
        "past the window, a new tap"
    );
    assert_eq!(charges(client).await, 3);
}

#[tokio::test]
async fn stdio_a_key_reused_after_the_window_replays() {
    a_key_reused_after_the_window(&stdio().await).await;
}

#[tokio::test]
async fn http_a_key_reused_after_the_window_replays() {
    let server = http_server().await;
    a_key_reused_after_the_window(&http(&server, "tok-alice", None).await).await;
}

/// Over HTTP the key may come as the `Idempotency-Key` header: the same
/// header is one charge; the header and `_meta` agreeing is fine;
/// disagreeing is refused and runs nothing; an invalid header is refused.
#[tokio::test]
async fn http_the_idempotency_key_header() {
    let server = http_server().await;
    let keyed = http(&server, "tok-alice", Some("gateway-req-1")).await;
    let first = call(&keyed, "charge_card", charge(2500), None).await;
    assert_eq!(state(&first), "executed", "{first:?}");
    assert_eq!(op(&first)["keyedBy"], "clientKey");
    let again = call(&keyed, "charge_card", charge(2500), None).await;
    assert_eq!(state(&again), "replayed", "{again:?}");
    let same = call(&keyed, "charge_card", charge(2500), Some("gateway-req-1")).await;
    assert_eq!(state(&same), "replayed", "header and _meta agree: {same:?}");
    let both = call(&keyed, "charge_card", charge(2600), Some("another-key")).await;
    assert_eq!(state(&both), "refused", "{both:?}");
    let message = text(&both);
    assert!(
        message.contains("two different idempotency keys"),
        "{message}"
    );
    // The same key from the header and from `_meta` of another client is
    // one operation: where it came from does not matter.
    let plain = http(&server, "tok-alice", None).await;
    let via_meta = call(&plain, "charge_card", charge(2500), Some("gateway-req-1")).await;
    assert_eq!(state(&via_meta), "replayed", "{via_meta:?}");
    assert_eq!(charges(&plain).await, 1);

    let invalid = http(&server, "tok-alice", Some("two words")).await;
    let refused = call(&invalid, "charge_card", charge(2700), None).await;
    assert_eq!(state(&refused), "refused", "{refused:?}");
    assert_eq!(charges(&plain).await, 1, "nothing ran");
}

/// Another caller's identical key is that caller's own operation, with
/// its own charge; each caller's repeat replays its own.
#[tokio::test]
async fn http_another_callers_identical_key_is_its_own_charge() {
    let server = http_server().await;
    let alice = http(&server, "tok-alice", None).await;
    let bob = http(&server, "tok-bob", None).await;
    let a = call(&alice, "charge_card", charge(3000), Some("k-1")).await;
    let b = call(&bob, "charge_card", charge(3000), Some("k-1")).await;
    assert_eq!([state(&a), state(&b)], ["executed", "executed"]);
    assert_ne!(op(&a)["reference"], op(&b)["reference"]);
    let b_again = call(&bob, "charge_card", charge(3000), Some("k-1")).await;
    assert_eq!(op(&b_again)["reference"], op(&b)["reference"]);
    assert_eq!(charges(&alice).await, 2);
}

/// Over stdio the caller is the process's `--tenant`/`--subject`: three
/// processes on one store file, Alice twice and Bob once. Bob's identical
/// key is his own charge, made by his process's processor; Alice's second
/// process, on the same store, replays her first charge and charges
/// nothing (so the store is shared, and Bob's charge is not a store of his
/// own).
#[tokio::test]
async fn stdio_another_callers_identical_key_is_its_own_charge() {
    let dir = durable::temp_dir("keys-callers");
    let store = format!("sqlite:{}", dir.join("payments.sqlite3").display());
    let as_caller = |subject: &'static str| {
        let store = store.clone();
        async move { stdio_with(&["--store", &store, "--tenant", "acme", "--subject", subject]).await }
    };
    let alice = as_caller("alice").await;
    let a = call(&alice, "charge_card", charge(3000), Some("k-1")).await;
    let bob = as_caller("bob").await;
    let b = call(&bob, "charge_card", charge(3000), Some("k-1")).await;
    assert_eq!([state(&a), state(&b)], ["executed", "executed"], "{b:?}");
    assert_ne!(op(&a)["reference"], op(&b)["reference"]);
    let b_again = call(&bob, "charge_card", charge(3000), Some("k-1")).await;
    assert_eq!(state(&b_again), "replayed", "{b_again:?}");
    assert_eq!(op(&b_again)["reference"], op(&b)["reference"]);
    assert_eq!([charges(&alice).await, charges(&bob).await], [1, 1]);

    let alice_again = as_caller("alice").await;
    let a_again = call(&alice_again, "charge_card", charge(3000), Some("k-1")).await;
    assert_eq!(state(&a_again), "replayed", "{a_again:?}");
    assert_eq!(op(&a_again)["reference"], op(&a)["reference"]);
    assert_eq!(charges(&alice_again).await, 0);
}

/// The listing says which tools accept a key.
#[tokio::test]
async fn stdio_the_listing_says_clientkey() {
    let Client::Stdio(client) = stdio().await else {
        unreachable!()
    };
    let tools = client.list_all_tools().await.unwrap();
    for tool in tools {
        let marker = tool
            .meta
            .as_ref()
            .and_then(|meta| meta.get(idem_runtime::mcp::TOOL_META_KEY));
        let expected = match &*tool.name {
            "charge_card" | "tap_to_pay" => Some(json!("optional")),
            _ => None,
        };
        assert_eq!(
            marker.and_then(|m| m.get("clientKey")).cloned(),
            expected,
            "{}",
            tool.name
        );
    }
}

/// `charge_card` answers with MCP tasks when the client declares the
/// extension: under a client key, a repeat gets the same task (the same
/// operation, still running), other arguments a conflict, and the task's
/// result is the one charge.
#[tokio::test]
async fn http_a_keyed_task_is_one_operation() {
    let server = http_server_with(&["--processor-delay-ms", "800"]).await;
    let client = http_client(
        &server,
        "tok-alice",
        None,
        ClientCapabilities::builder().enable_tasks().build(),
    )
    .await;
    let Client::Http(tasks) = &client else {
        unreachable!()
    };
    let start =
        |args: Value, key: &str| tasks.call_tool_once(params("charge_card", args, Some(key)));
    let first = match start(charge(6100), "engine/step-9").await.expect("answers") {
        CallToolResponse::Task(task) => task,
        other => panic!("expected a task, got {other:?}"),
    };
    match start(charge(6100), "engine/step-9").await.expect("answers") {
        CallToolResponse::Task(again) => assert_eq!(again.task.task_id, first.task.task_id),
        other => panic!("expected the same task, got {other:?}"),
    }
    match start(charge(6200), "engine/step-9").await.expect("answers") {
        CallToolResponse::Complete(conflict) => {
            assert_eq!(state(&conflict), "conflict", "{conflict:?}");
            assert_eq!(op(&conflict)["keyedBy"], "clientKey");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match start(charge(6100), "engine/step-9").await.expect("answers") {
        CallToolResponse::Complete(done) => {
            assert_eq!(state(&done), "replayed", "{done:?}");
            assert_eq!(op(&done)["reference"], json!(first.task.task_id));
        }
        other => panic!("expected the stored result, got {other:?}"),
    }
    assert_eq!(charges(&client).await, 1);
}
