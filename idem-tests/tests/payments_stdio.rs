//! The payments example as a child process over stdio, driven by rmcp's
//! client: what a host that nobody on this team wrote would see.
//!
//! The binary is the one `cargo test` builds with the examples
//! (`target/debug/examples/payments`).

mod durable;

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
    &result.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY]
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
    assert_eq!(
        hinted,
        [
            "charge_card",
            "create_shipment",
            "set_card_nickname",
            "tap_to_pay"
        ]
    );
    let mut all: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    all.sort();
    assert_eq!(
        all,
        [
            "charge_card",
            "create_shipment",
            "get_operation_status",
            "processor_ledger",
            "set_card_nickname",
            "tap_to_pay"
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

/// A double tap is one payment; a tap after the 5 s window is a new
/// purchase, under a new reference: the stub processor, which keeps keys for
/// a day, charges it, and the stub mailer, which dedupes by the downstream
/// key, mails its receipt.
#[tokio::test]
async fn a_tap_after_the_window_is_a_new_purchase_under_its_own_reference() {
    let client = start(&[
        "--processor-delay-ms",
        "20",
        "--follow-on-interval-ms",
        "20",
    ])
    .await;
    let args = json!({ "card": "4242", "amount_cents": 450 });
    let first = call(&client, "tap_to_pay", args.clone()).await;
    let double = call(&client, "tap_to_pay", args.clone()).await;
    assert_eq!(operation(&first)["state"], json!("executed"), "{first:?}");
    assert_eq!(operation(&double)["state"], json!("replayed"), "{double:?}");
    assert_eq!(
        operation(&double)["reference"],
        operation(&first)["reference"]
    );

    tokio::time::sleep(Duration::from_millis(5500)).await;
    let later = call(&client, "tap_to_pay", args.clone()).await;
    assert_eq!(operation(&later)["state"], json!("executed"), "{later:?}");
    assert_ne!(
        operation(&later)["reference"],
        operation(&first)["reference"],
        "a new purchase must not carry the first one's reference"
    );
    let again = call(&client, "tap_to_pay", args).await;
    assert_eq!(
        operation(&again)["reference"],
        operation(&later)["reference"]
    );

    let started = std::time::Instant::now();
    let mut view = ledger(&client).await;
    while view["mailer_deliveries"] != json!(2) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the second receipt never went out: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        view = ledger(&client).await;
    }
    assert_eq!(view["processor_requests"], json!(2), "{view}");
    assert_eq!(view["processor_charges"], json!(2), "{view}");
    for result in [&first, &later] {
        let reference = operation(result)["reference"].as_str().unwrap();
        assert_eq!(
            view["processor"][reference],
            json!({ "requests": 1, "charges": 1 }),
            "{view}"
        );
        assert_eq!(
            view["mailer"][reference],
            json!({ "attempts": 1, "deliveries": 1 }),
            "{view}"
        );
    }
    client.cancel().await.ok();
}

/// The receipt goes through the follow-on dispatcher: a mailer that fails its first two
/// requests gets three, sends one receipt, and a replay of the charge adds
/// nothing, counted at the stub mailer by the downstream key.
#[tokio::test]
async fn a_receipt_is_delivered_once_across_retries_and_replays() {
    let client = start(&[
        "--mailer-failures",
        "2",
        "--follow-on-interval-ms",
        "20",
        "--follow-on-backoff-ms",
        "20",
    ])
    .await;
    let args = json!({ "card": "4242", "amount_cents": 3100 });
    let first = call(&client, "charge_card", args.clone()).await;
    assert_eq!(operation(&first)["state"], json!("executed"), "{first:?}");
    let reference = operation(&first)["reference"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    let mut view = ledger(&client).await;
    while view["mailer_deliveries"] != json!(1) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the receipt never went out: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        view = ledger(&client).await;
    }
    let replay = call(&client, "charge_card", args).await;
    assert_eq!(operation(&replay)["state"], json!("replayed"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let view = ledger(&client).await;
    assert_eq!(
        view["mailer"][&reference],
        json!({ "attempts": 3, "deliveries": 1 }),
        "{view}"
    );
    assert_eq!(view["mailer_attempts"], json!(3), "{view}");
    assert_eq!(view["processor_charges"], json!(1), "{view}");
    client.cancel().await.ok();
}

/// An operator resolves by hand, with the `idem` command line on the
/// server's own SQLite file, a charge whose outcome was unknown; the running
/// server's status tool then reports it COMPLETED with the operator's note,
/// and a repeat replays the response the operator gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_by_hand_with_the_cli_shows_in_the_status_tool() {
    let dir = std::env::temp_dir().join(format!(
        "idem-cli-e2e-{:016x}",
        idem_runtime::store::Attempt::random().get()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("payments.sqlite3");
    let url = format!("sqlite:{}", path.display());
    // The processor outlasts the tool's wait: the outcome is unknown. No
    // maintenance round after the first, so nobody but the operator resolves it.
    let client = {
        let mut command = tokio::process::Command::new(payments_binary());
        command.args(["--transport", "stdio", "--store", &url]);
        command.args([
            "--processor-delay-ms",
            "60000",
            "--processor-timeout-ms",
            "200",
        ]);
        command.args([
            "--settle-ms",
            "600000",
            "--maintenance-interval-ms",
            "600000",
        ]);
        let transport = TokioChildProcess::new(command).expect("the example starts");
        ().serve(transport).await.expect("the client connects")
    };
    let args = json!({ "card": "4242", "amount_cents": 4200 });
    let first = call(&client, "charge_card", args.clone()).await;
    assert_eq!(
        operation(&first)["state"],
        json!("failed_unknown"),
        "{first:?}"
    );
    let reference = operation(&first)["reference"].as_str().unwrap().to_owned();

    // As the README writes it: the value the tool returns (`Json<Receipt>`),
    // which the command line stores as that tool's result.
    let response = json!({ "charge_id": "ch_by_hand" }).to_string();
    let note = "ops: alice; the processor's dashboard shows ch_by_hand";
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv = [
        "idem",
        "--store",
        &url,
        "resolve",
        &reference,
        "--tenant",
        "local",
        "--completed",
        &response,
        "--note",
        note,
    ];
    let code = idem_cli::run(argv, &mut out, &mut err).await;
    assert_eq!(
        code,
        0,
        "{}{}",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );

    let status = call(
        &client,
        "get_operation_status",
        json!({ "reference": reference }),
    )
    .await;
    let report = status.structured_content.expect("a status report");
    assert_eq!(report["state"], json!("COMPLETED"), "{report}");
    assert_eq!(report["resolution"], json!(note), "{report}");
    assert_eq!(
        report["response"]["structuredContent"]["charge_id"],
        json!("ch_by_hand")
    );

    let repeat = call(&client, "charge_card", args).await;
    assert_eq!(operation(&repeat)["state"], json!("replayed"), "{repeat:?}");
    assert_eq!(
        repeat.structured_content,
        Some(json!({ "charge_id": "ch_by_hand" }))
    );
    client.cancel().await.ok();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--reconciler off`: nothing asks the processor, so no answer about the
/// unknown charge says it is being reconciled; the failed call, its repeat
/// and the status tool name the operator's `idem resolve` with the
/// reference, while maintenance sweeps and purges on. With the reconciler
/// on (the default), the same charge is being reconciled. The processor is
/// asked once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_reconciler_off_an_unknown_charge_names_idem_resolve() {
    for (reconciler, says, never) in [
        ("off", "stays unknown until an operator", "reconciled"),
        ("on", "being reconciled", "stays unknown until an operator"),
    ] {
        let client = start(&[
            "--reconciler",
            reconciler,
            "--processor-delay-ms",
            "60000",
            "--processor-timeout-ms",
            "200",
            "--maintenance-interval-ms",
            "100",
        ])
        .await;
        let args = json!({ "card": "4242", "amount_cents": 4300 });
        let first = call(&client, "charge_card", args.clone()).await;
        assert_eq!(
            operation(&first)["state"],
            json!("failed_unknown"),
            "{first:?}"
        );
        let reference = operation(&first)["reference"].as_str().unwrap().to_owned();
        // A few maintenance rounds: with the reconciler off, nothing changes.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let repeat = call(&client, "charge_card", args).await;
        assert_eq!(operation(&repeat)["state"], json!("unknown"), "{repeat:?}");
        let status = call(
            &client,
            "get_operation_status",
            json!({ "reference": reference }),
        )
        .await;
        let report = status.structured_content.expect("a status report");
        assert_eq!(report["state"], json!("UNKNOWN"), "{report}");
        let text = |result: &CallToolResult| {
            result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<String>()
        };
        let next_step = report["next_step"].as_str().unwrap().to_owned();
        for answer in [text(&first), text(&repeat), next_step] {
            assert!(answer.contains(says), "--reconciler {reconciler}: {answer}");
            assert!(
                !answer.contains(never),
                "--reconciler {reconciler}: {answer}"
            );
            assert!(
                answer.contains(&format!("`idem resolve {reference}`")),
                "--reconciler {reconciler}: {answer}"
            );
        }
        let ledger = ledger(&client).await;
        assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
        client.cancel().await.ok();
    }
}

/// The payments example behind PgBouncer in transaction mode, with its
/// tables in a schema of their own named in the URL (`?schema=`, which the
/// library's `open_store` takes): 120 charges, 40 at a time, then each
/// again. No error, one charge per operation at the stub processor, every
/// repeat replayed. Needs `IDEM_TEST_PGBOUNCER_URL` (`scripts/pgbouncer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_120_charges_40_at_a_time_make_no_store_error() {
    let Some(url) = durable::url_from(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    ) else {
        return;
    };
    let name = format!("t_{:016x}", idem_runtime::store::Attempt::random().get());
    // Dropped at the end; the example migrates it again (a no-op).
    let schema = durable::PgSchema::open(&url, &name).await;
    let store = format!("{url}?schema={name}");
    let client = start(&["--store", &store, "--processor-delay-ms", "20"]).await;
    let client = std::sync::Arc::new(client);
    for round in ["executed", "replayed"] {
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(40));
        let mut calls = Vec::new();
        for card in 0..120 {
            let (client, gate) = (client.clone(), gate.clone());
            calls.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let args = json!({ "card": format!("4{card:03}"), "amount_cents": 500 });
                call(&client, "charge_card", args).await
            }));
        }
        for call in calls {
            let result = call.await.unwrap();
            assert_eq!(result.is_error, Some(false), "{round}: {result:?}");
            assert_eq!(operation(&result)["state"], json!(round), "{result:?}");
        }
    }
    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_charges"], json!(120), "{ledger}");
    assert_eq!(ledger["processor_requests"], json!(120), "{ledger}");
    drop(schema);
}
