//! The payments example as a child process over stdio, driven by rmcp's
//! client: what a host that nobody on this team wrote would see.
//!
//! The binary is the one `cargo test` builds with the examples
//! (`target/debug/examples/payments`).

use std::path::PathBuf;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ()>;

fn payments_binary() -> PathBuf {
    // target/debug/deps/<this test> -> target/debug/examples/payments
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

async fn start(extra: &[&str]) -> Client {
    let mut command = tokio::process::Command::new(payments_binary());
    command.args(["--transport", "stdio", "--store", "memory"]);
    command.args(extra);
    let transport = TokioChildProcess::new(command).expect("the example starts");
    ().serve(transport).await.expect("the client connects")
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

async fn ledger(client: &Client) -> Value {
    call(client, "processor_ledger", json!({}))
        .await
        .structured_content
        .expect("the ledger is structured")
}

fn operation(result: &CallToolResult) -> &Value {
    &result.meta.as_ref().expect("_meta")[idem_runtime::RESULT_META_KEY]
}

#[tokio::test]
async fn the_hint_is_on_exactly_the_wrapped_tools() {
    let client = start(&[]).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut hinted: Vec<String> = tools
        .iter()
        .filter(|t| t.annotations.as_ref().and_then(|a| a.idempotent_hint) == Some(true))
        .map(|t| t.name.to_string())
        .collect();
    hinted.sort();
    assert_eq!(hinted, ["charge_card", "create_shipment"]);
    let mut all: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    all.sort();
    assert_eq!(
        all,
        [
            "charge_card",
            "create_shipment",
            "get_operation_status",
            "processor_ledger"
        ]
    );
    client.cancel().await.ok();
}

#[tokio::test]
async fn concurrent_duplicates_reach_the_processor_once() {
    let client = start(&["--processor-delay-ms", "1500"]).await;
    let args = json!({ "card": "4242", "amount_cents": 1999 });
    let (a, b) = tokio::join!(call(&client, "charge_card", args.clone()), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        call(&client, "charge_card", args.clone()).await
    });
    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
    assert_eq!(ledger["processor_charges"], json!(1), "{ledger}");

    let (done, in_flight) = if a.is_error == Some(true) {
        (b, a)
    } else {
        (a, b)
    };
    assert_eq!(done.is_error, Some(false), "{done:?}");
    assert_eq!(operation(&in_flight)["state"], json!("in_progress"));
    assert_eq!(
        operation(&in_flight)["reference"],
        operation(&done)["reference"]
    );
    let reference = operation(&done)["reference"].as_str().unwrap();
    assert_eq!(
        ledger["processor"][reference],
        json!({ "requests": 1, "charges": 1 })
    );
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_replay_is_byte_identical() {
    let client = start(&[]).await;
    let args = json!({ "order_id": "ord_77", "address": "1 Main St", "service_level": "express" });
    let first = call(&client, "create_shipment", args.clone()).await;
    let second = call(&client, "create_shipment", args).await;
    assert_eq!(operation(&second)["replayed"], json!(true));
    // Everything but idem's own _meta is the same, byte for byte.
    let bytes = |r: &CallToolResult| {
        let mut v = serde_json::to_value(r).unwrap();
        v.as_object_mut().unwrap().remove("_meta");
        serde_json::to_string(&v).unwrap()
    };
    assert_eq!(bytes(&first), bytes(&second));
    let ledger = ledger(&client).await;
    assert_eq!(ledger["carrier_requests"], json!(1), "{ledger}");
    assert_eq!(ledger["carrier_shipments"], json!(1), "{ledger}");
    client.cancel().await.ok();
}
