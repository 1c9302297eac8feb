//! The guide's servers: the README's stdio server and docs/serving.md's
//! HTTP server are `examples/readme_server.rs` and `examples/readme_http.rs`
//! to the byte (docs/follow-ons.md's follow-on example is
//! `examples/readme_follow_ons.rs`), and each, run as a child process (over
//! stdio, over streamable HTTP) and driven by rmcp's client, works as the
//! guide says.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

const README: &str = include_str!("../../README.md");
const SERVING: &str = include_str!("../../docs/serving.md");
const FOLLOW_ONS: &str = include_str!("../../docs/follow-ons.md");
const EXAMPLE: &str = include_str!("../examples/readme_server.rs");
const FOLLOW_ONS_EXAMPLE: &str = include_str!("../examples/readme_follow_ons.rs");
const HTTP_EXAMPLE: &str = include_str!("../examples/readme_http.rs");

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

/// The first ```rust block of `page` under the heading `heading`.
fn rust_block(page: &'static str, heading: &str) -> &'static str {
    let section = page
        .split_once(heading)
        .expect("the page has the section")
        .1;
    let block = section
        .split_once("```rust\n")
        .expect("the section has a rust block")
        .1;
    &block[..block.find("```").expect("the block ends")]
}

/// docs/follow-ons.md's ```rust block under "A complete example".
fn readme_follow_ons() -> &'static str {
    rust_block(FOLLOW_ONS, "## A complete example")
}

#[test]
fn the_readme_http_server_is_the_example_verbatim() {
    assert!(
        rust_block(SERVING, "## The server") == HTTP_EXAMPLE,
        "docs/serving.md's HTTP server and examples/readme_http.rs differ: change both"
    );
}

/// The dependency line's comment names every feature idem-runtime has.
#[test]
fn the_readme_names_every_feature() {
    let comment = README
        .lines()
        .find(|l| l.starts_with("idem-runtime = ") && l.contains("# features:"))
        .expect("the README's dependency line with its features");
    let manifest = include_str!("../../idem-runtime/Cargo.toml");
    let features = manifest
        .split_once("[features]\n")
        .expect("idem-runtime has features")
        .1;
    let features = &features[..features.find("\n[").unwrap_or(features.len())];
    let names: Vec<&str> = features
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(name, _)| name.trim()))
        .filter(|name| !name.starts_with('#'))
        .collect();
    assert!(names.len() >= 7, "{names:?}");
    for name in names.iter().filter(|n| **n != "default") {
        assert!(
            comment.contains(name),
            "README.md's dependency line does not name the feature `{name}`: {comment}"
        );
    }
}

#[test]
fn the_readme_follow_ons_are_the_example_verbatim() {
    assert!(
        readme_follow_ons() == FOLLOW_ONS_EXAMPLE,
        "docs/follow-ons.md's dispatcher example and examples/readme_follow_ons.rs differ: change both"
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
    example("readme_server")
}

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
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
    &result.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY]
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

/// docs/serving.md's HTTP server, as a child process on a free port, in a
/// directory of its own; killed when dropped. Its stdout (the receipts the
/// follow-ons sent) is collected in `receipts`.
struct HttpServer {
    _child: tokio::process::Child,
    url: String,
    receipts: Arc<Mutex<Vec<String>>>,
}

async fn serve_http(dir: &std::path::Path) -> HttpServer {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(example("readme_http"))
        .arg("127.0.0.1:0")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = stderr.next_line().await.expect("stderr reads") {
            if let Some(url) = line.strip_prefix("serving MCP on ") {
                return url.trim().to_owned();
            }
            eprintln!("{line}");
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example serves within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let receipts = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = receipts.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            seen.lock().unwrap().push(line);
        }
    });
    HttpServer {
        _child: child,
        url,
        receipts,
    }
}

async fn connect_http(url: &str, token: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token),
    );
    ().serve(transport).await.expect("the client connects")
}

/// One charge, two tenants' tokens: the charge runs once per tenant, a
/// repeat is replayed, the follow-on dispatcher sends one receipt per operation, and
/// `/metrics` answers without a token while `/mcp` refuses a request
/// without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_http_server_works_over_http() {
    let dir = std::env::temp_dir().join(format!("idem-readme-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = serve_http(&dir).await;
    let http = reqwest::Client::new();

    // No token, or an unknown one: 401, and nothing reaches rmcp.
    for auth in [None, Some("Bearer nope")] {
        let mut request = http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let refused = request.send().await.unwrap();
        assert_eq!(refused.status().as_u16(), 401, "{auth:?}");
    }

    let alice = connect_http(&server.url, "secret-a").await;
    let bob = connect_http(&server.url, "secret-b").await;
    let args = json!({"card": "tok_visa", "amount_cents": 1999});
    let first = call(&alice, "charge_card", args.clone()).await;
    assert_eq!(operation(&first)["state"], "executed", "{first:?}");
    let again = call(&alice, "charge_card", args.clone()).await;
    assert_eq!(operation(&again)["state"], "replayed", "{again:?}");
    assert_eq!(again.structured_content, first.structured_content);
    // Another token is another caller, in another tenant: its own operation.
    let other = call(&bob, "charge_card", args).await;
    assert_eq!(operation(&other)["state"], "executed", "{other:?}");
    assert_ne!(
        operation(&other)["reference"],
        operation(&first)["reference"]
    );

    // The far side: one receipt per operation, each under its own key.
    let receipts = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let receipts = server.receipts.lock().unwrap().clone();
            if receipts.len() >= 2 {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                return server.receipts.lock().unwrap().clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the dispatcher sends the receipts");
    assert_eq!(receipts.len(), 2, "{receipts:?}");
    for reference in [&first, &other].map(|r| operation(r)["reference"].as_str().unwrap()) {
        assert_eq!(
            receipts
                .iter()
                .filter(|r| r.ends_with(&format!("key {reference}:send_receipt")))
                .count(),
            1,
            "{receipts:?}"
        );
    }

    // /metrics, with no token: the calls as counted.
    let metrics_url = server.url.replace("/mcp", "/metrics");
    let metrics = http.get(&metrics_url).send().await.unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let metrics = metrics.text().await.unwrap();
    let count = |state: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("idem_calls_total{")
                    && l.contains("tool=\"charge_card\"")
                    && l.contains(&format!("state=\"{state}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(count("executed").as_deref(), Some("2"), "{metrics}");
    assert_eq!(count("replayed").as_deref(), Some("1"), "{metrics}");

    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    drop(server);
    assert!(
        dir.join("idem.sqlite3").exists(),
        "the store is where docs/serving.md says"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's list of examples names every one in idem-tests/examples/
/// and examples/ (the Lambda server, a workspace member of its own), and
/// nothing that is not there.
#[test]
fn the_readme_lists_every_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("idem-tests sits in the workspace");
    let mut present: Vec<String> = Vec::new();
    for dir in ["idem-tests/examples", "examples"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            present.push(format!("{dir}/{name}"));
        }
    }
    present.sort();
    for path in &present {
        assert!(
            README.contains(&format!("[`{path}`]")),
            "README.md's list of examples lacks {path}"
        );
    }
    let listed: Vec<&str> = README
        .match_indices("[`")
        .map(|(at, _)| {
            let rest = &README[at + "[`".len()..];
            rest[..rest.find('`').unwrap()].trim_end_matches('/')
        })
        .filter(|path| path.starts_with("examples/") || path.starts_with("idem-tests/examples/"))
        .collect();
    assert!(listed.len() >= present.len(), "{listed:?}");
    for path in listed {
        assert!(
            present.iter().any(|p| p == path),
            "README.md names {path}, which does not exist"
        );
    }
}
