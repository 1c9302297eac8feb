//! The README's server: its text is `examples/readme_server.rs` to the byte,
//! and that server, run as a child process over stdio and driven by rmcp's
//! client, works as the README says.

use std::path::PathBuf;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

const README: &str = include_str!("../README.md");
const EXAMPLE: &str = include_str!("../examples/readme_server.rs");
const OUTBOX_EXAMPLE: &str = include_str!("../examples/readme_outbox.rs");

/// The README's first ```rust block after "Add it to your rmcp server".
fn readme_server() -> &'static str {
    let section = README
        .split_once("## Add it to your rmcp server")
        .expect("the README has the section")
        .1;
    let block = section
        .split_once("```rust\n")
        .expect("the section has a rust block")
        .1;
    &block[..block.find("```").expect("the block ends")]
}

/// The README's ```rust block under "Follow-on work: the outbox".
fn readme_outbox() -> &'static str {
    let section = README
        .split_once("## Follow-on work: the outbox")
        .expect("the README has the section")
        .1;
    let block = section
        .split_once("```rust\n")
        .expect("the section has a rust block")
        .1;
    &block[..block.find("```").expect("the block ends")]
}

#[test]
fn the_readme_outbox_is_the_example_verbatim() {
    assert!(
        readme_outbox() == OUTBOX_EXAMPLE,
        "README.md's outbox snippet and examples/readme_outbox.rs differ: change both"
    );
}

#[test]
fn the_readme_server_is_the_example_verbatim() {
    assert!(
        readme_server() == EXAMPLE,
        "README.md's server and examples/readme_server.rs differ: change both"
    );
}

fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("readme_server"))
        .expect("a target directory");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples)",
        bin.display()
    );
    bin
}

type Client = RunningService<RoleClient, ()>;

async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .expect("tools/call answers")
}

fn operation(result: &CallToolResult) -> &Value {
    &result.meta.as_ref().expect("_meta")[idem_runtime::RESULT_META_KEY]
}

#[tokio::test]
async fn the_readme_server_works_over_stdio() {
    // It keeps its SQLite file in its working directory.
    let dir = std::env::temp_dir().join(format!("idem-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = tokio::process::Command::new(binary());
    command.current_dir(&dir);
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();

    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(names, ["charge_card", "get_operation_status"]);
    let charge = tools.iter().find(|t| t.name == "charge_card").unwrap();
    assert_eq!(
        charge.annotations.as_ref().and_then(|a| a.idempotent_hint),
        Some(true)
    );

    let args = json!({"card": "tok_visa", "amount_cents": 1999});
    let first = call(&client, "charge_card", args.clone()).await;
    assert_eq!(operation(&first)["state"], "executed", "{first:?}");
    let again = call(&client, "charge_card", args).await;
    assert_eq!(operation(&again)["state"], "replayed", "{again:?}");
    assert_eq!(again.structured_content, first.structured_content);

    let reference = operation(&first)["reference"].as_str().unwrap().to_owned();
    let status = call(
        &client,
        "get_operation_status",
        json!({ "reference": reference }),
    )
    .await;
    let report = status.structured_content.expect("a status report");
    assert_eq!(report["state"], "COMPLETED", "{report}");

    let declined = call(
        &client,
        "charge_card",
        json!({"card": "tok_visa", "amount_cents": 0}),
    )
    .await;
    assert_eq!(operation(&declined)["state"], "rejected");
    assert_eq!(declined.is_error, Some(true));

    client.cancel().await.unwrap();
    assert!(
        dir.join("idem.sqlite3").exists(),
        "the store is where the README says"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
