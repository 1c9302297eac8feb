//! The demo: the payments MCP server and an rmcp client in one process, with
//! an embedded SQLite store in a temporary file. Nothing to set up.
//!
//! `cargo run --example demo`
//!
//! It walks through what a host, a transport or a model may do to a tool
//! call, and prints each answer as the model sees it.

#[path = "../payments/shop.rs"]
mod shop;

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    answer::Resolver,
    follow_ons::{FollowOnConfig, FollowOnDispatcher},
    maintenance::{Maintenance, MaintenanceConfig, ReconcileConfig},
    Caller, Executor, IdempotencyStore, SqliteStore,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ElicitRequestParams, ElicitResult, ElicitationAction,
    ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{json, Value};
use shop::{Backends, Payments, ProcessorReconciler};

type Client = RunningService<RoleClient, ()>;

/// How many tools/call requests the demo sent, by tool.
static CALLS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    CALLS.lock().unwrap().push(tool);
    let Value::Object(args) = args else {
        unreachable!("arguments are objects")
    };
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .expect("the server answers")
}

/// A host on protocol 2026-07-28 whose user confirms what it is asked:
/// rmcp's `call_tool` shows it the question and sends the answer back.
#[derive(Clone, Default)]
struct ConfirmingUser;

impl ClientHandler for ConfirmingUser {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            println!("  the host asks the user: {message}");
            println!("  the user answers:       confirm = true");
        }
        let mut answer = ElicitResult::new(ElicitationAction::Accept);
        answer.content = Some(json!({ "confirm": true }));
        Ok(answer)
    }
}

/// Prints a result the way a model receives it: the error flag, the text,
/// and idem's `_meta`.
fn show(label: &str, result: &CallToolResult) {
    println!("  {label}:");
    println!("    isError: {}", result.is_error.unwrap_or(false));
    for block in &result.content {
        if let Some(text) = block.as_text() {
            println!("    text:    {}", text.text);
        }
    }
    if let Some(op) = result
        .meta
        .as_ref()
        .and_then(|m| m.get(idem_runtime::mcp::RESULT_META_KEY))
    {
        println!("    _meta:   {op}");
    }
}

fn reference(result: &CallToolResult) -> String {
    result.meta.as_ref().unwrap()[idem_runtime::mcp::RESULT_META_KEY]["reference"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn step(n: u32, title: &str) {
    println!("\n{n}. {title}");
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let store: Arc<dyn IdempotencyStore> = Arc::new(
        SqliteStore::open(dir.join("demo.sqlite3"))
            .await
            .expect("the embedded store opens"),
    );
    let backends = Backends::new(Duration::from_millis(300));
    let server = Payments::new(
        // The maintenance rounds below run a reconciler: the answers say so.
        Executor::new(store.clone()).with_resolver(Resolver::Reconciler),
        Some(Caller::new("demo", "you")),
        backends.clone(),
        Duration::from_millis(1000),
    );
    // A second connection, for the host on the newest protocol (step 9).
    let modern_server = server.clone();
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_io).await.expect("the server starts");
        let _ = running.waiting().await;
    });
    let client: Client = ().serve(client_io).await.expect("the client connects");
    println!(
        "idem demo: the payments server and a client in one process (store: SQLite in {})",
        dir.display()
    );

    let charge = json!({ "card": "4242", "amount_cents": 1999, "currency": "usd" });
    step(1, "A charge.");
    show(
        "charge_card",
        &call(&client, "charge_card", charge.clone()).await,
    );

    step(
        2,
        "The host times out and sends the same charge again while the first still runs.",
    );
    let order = json!({ "card": "4242", "amount_cents": 2500 });
    let (first, repeat) = tokio::join!(call(&client, "charge_card", order.clone()), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        call(&client, "charge_card", order.clone()).await
    });
    show("the repeat, while the first is in flight", &repeat);
    show("the first call", &first);

    step(
        3,
        "The same charge once more, after it finished: a replay, not a charge.",
    );
    show(
        "charge_card",
        &call(&client, "charge_card", order.clone()).await,
    );

    step(
        4,
        "The processor is slow (2 s) and the tool stops waiting after 1 s.",
    );
    backends.set_processor_delay(Duration::from_millis(2000));
    let slow_charge = json!({ "card": "5555", "amount_cents": 7000 });
    let slow = call(&client, "charge_card", slow_charge.clone()).await;
    show("charge_card", &slow);
    let slow_ref = reference(&slow);
    // A server runs these rounds in the background (`Maintenance::spawn`);
    // the demo runs them by hand, and asks about an unresolved record again
    // at once instead of after a backoff.
    let maintenance = MaintenanceConfig::default()
        .with_reconciler(Arc::new(ProcessorReconciler {
            backends: backends.clone(),
        }))
        .with_reconcile(ReconcileConfig::default().with_first_backoff(Duration::ZERO));
    println!(
        "  ... a maintenance round: the reconciler asks the processor about {slow_ref}, \
         which is still charging it."
    );
    Maintenance::round(&*store, &maintenance).await;
    show(
        "get_operation_status: still unknown, not released",
        &call(
            &client,
            "get_operation_status",
            json!({ "reference": slow_ref }),
        )
        .await,
    );
    show(
        "the model calls charge_card again anyway: nothing runs",
        &call(&client, "charge_card", slow_charge.clone()).await,
    );
    println!("  ... the processor finishes the charge; the next round asks again.");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    backends.set_processor_delay(Duration::from_millis(300));
    Maintenance::round(&*store, &maintenance).await;
    show(
        "get_operation_status",
        &call(
            &client,
            "get_operation_status",
            json!({ "reference": slow_ref }),
        )
        .await,
    );
    show(
        "charge_card once more: the reconciled receipt, replayed",
        &call(&client, "charge_card", slow_charge).await,
    );

    step(
        5,
        "A tap at the till times out; the reconciler finds it charged; 5 s later the same tap \
         is a new purchase.",
    );
    backends.set_processor_delay(Duration::from_millis(2000));
    let coffee = json!({ "card": "4000", "amount_cents": 450 });
    let tapped_at = std::time::Instant::now();
    let tap = call(&client, "tap_to_pay", coffee.clone()).await;
    show("tap_to_pay", &tap);
    let tap_ref = reference(&tap);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    backends.set_processor_delay(Duration::from_millis(300));
    Maintenance::round(&*store, &maintenance).await;
    show(
        "a double tap, inside its 5 s window: the reconciled charge, replayed",
        &call(&client, "tap_to_pay", coffee.clone()).await,
    );
    tokio::time::sleep(Duration::from_millis(5200).saturating_sub(tapped_at.elapsed())).await;
    let again = call(&client, "tap_to_pay", coffee).await;
    show(
        "the same tap after the window: a new purchase, charged, with its own reference",
        &again,
    );
    show(
        "get_operation_status of the first tap: still its own charge",
        &call(
            &client,
            "get_operation_status",
            json!({ "reference": tap_ref }),
        )
        .await,
    );

    step(6, "A shipment, retried with the same order id.");
    let shipment = json!({ "order_id": "ord_1001", "address": "1 Main St, Springfield", "service_level": "standard" });
    show(
        "create_shipment",
        &call(&client, "create_shipment", shipment.clone()).await,
    );
    show(
        "create_shipment again",
        &call(&client, "create_shipment", shipment).await,
    );

    step(7, "The same order id with another address.");
    show(
        "create_shipment",
        &call(
            &client,
            "create_shipment",
            json!({ "order_id": "ord_1001", "address": "9 Elm St, Shelbyville", "service_level": "standard" }),
        )
        .await,
    );

    step(
        8,
        "A large charge (1,500.00): the server asks the user to confirm before anything \
         happens, through a host on protocol 2026-07-28.",
    );
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = modern_server
            .serve(server_io)
            .await
            .expect("the server starts");
        let _ = running.waiting().await;
    });
    let host = ConfirmingUser
        .serve_with_lifecycle(
            client_io,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("the host connects");
    let large = json!({ "card": "4242", "amount_cents": 150_000, "currency": "usd" });
    let Value::Object(large) = large else {
        unreachable!()
    };
    let confirm = || CallToolRequestParams::new("charge_card").with_arguments(large.clone());
    CALLS.lock().unwrap().extend(["charge_card", "charge_card"]);
    let confirmed = host.call_tool(confirm()).await.expect("the server answers");
    show(
        "charge_card, answered after the user confirmed (two rounds, one operation)",
        &confirmed,
    );
    CALLS.lock().unwrap().push("charge_card");
    let again = host.call_tool(confirm()).await.expect("the server answers");
    show(
        "charge_card again: the stored receipt; the user is not asked twice",
        &again,
    );
    let _ = host.cancel().await;

    step(
        9,
        "Follow-ons: each charge queued a receipt and the shipment a warehouse notice, \
         written with the completion; a dispatcher sends them.",
    );
    // A server runs the dispatcher in the background (`FollowOnDispatcher::spawn`); the
    // demo runs its rounds by hand, and retries a failed follow-on at once instead
    // of after a backoff.
    let handlers = backends.job_handlers();
    let dispatcher = FollowOnConfig::default().with_first_backoff(Duration::ZERO);
    let drained = FollowOnDispatcher::round(&*store, &handlers, &dispatcher)
        .await
        .expect("the store answers");
    println!(
        "  a dispatch round: {} follow-on(s) leased, {} delivered",
        drained.leased, drained.delivered
    );
    println!("  ... the mailer goes down for its next two requests; a new charge:");
    backends.set_mailer_failures(2);
    let flaky = json!({ "card": "3782", "amount_cents": 1200 });
    let charged = call(&client, "charge_card", flaky.clone()).await;
    show("charge_card", &charged);
    let flaky_ref = reference(&charged);
    for round in 1..=3 {
        let report = FollowOnDispatcher::round(&*store, &handlers, &dispatcher)
            .await
            .expect("the store answers");
        println!(
            "  dispatch round {round}: {} leased, {} delivered, {} to retry",
            report.leased, report.delivered, report.retried
        );
    }
    show(
        "the same charge again: a replay, which queues nothing",
        &call(&client, "charge_card", flaky).await,
    );
    let after = FollowOnDispatcher::round(&*store, &handlers, &dispatcher)
        .await
        .expect("the store answers");
    println!(
        "  dispatch round 4: {} leased (the replay queued no second receipt)",
        after.leased
    );

    step(
        10,
        "The ledger: what the processor, the carrier, the mailer and the warehouse were \
         really asked to do.",
    );
    let ledger = call(&client, "processor_ledger", json!({})).await;
    let view: shop::LedgerView =
        serde_json::from_value(ledger.structured_content.clone().unwrap_or_default())
            .expect("the ledger's shape");
    for (reference, counts) in &view.processor {
        println!(
            "  processor {reference}: {} request(s), {} charge(s)",
            counts.requests, counts.charges
        );
    }
    for (reference, counts) in &view.carrier {
        println!(
            "  carrier   {reference}: {} request(s), {} shipment(s)",
            counts.requests, counts.shipments
        );
    }
    for (reference, counts) in &view.mailer {
        let mark = if *reference == flaky_ref {
            "  <- failed twice, then sent"
        } else {
            ""
        };
        println!(
            "  mailer    {reference}: {} request(s), {} receipt(s) sent{mark}",
            counts.attempts, counts.deliveries
        );
    }
    for (reference, counts) in &view.warehouse {
        println!(
            "  warehouse {reference}: {} request(s), {} notice(s) delivered",
            counts.attempts, counts.deliveries
        );
    }
    let sent = |tool: &str| CALLS.lock().unwrap().iter().filter(|t| **t == tool).count();
    println!(
        "\n{} charge_card calls, {} tap_to_pay calls and {} create_shipment calls reached the \
         server; the processor received {} request(s) and made {} charge(s), the carrier \
         received {} request(s) and booked {} shipment(s): once per operation.",
        sent("charge_card"),
        sent("tap_to_pay"),
        sent("create_shipment"),
        view.processor_requests,
        view.processor_charges,
        view.carrier_requests,
        view.carrier_shipments,
    );
    println!(
        "The mailer received {} request(s) and sent {} receipt(s), one per charge; the warehouse \
         received {} notice(s) for {} shipment(s).",
        view.mailer_attempts,
        view.mailer_deliveries,
        view.warehouse_attempts,
        view.warehouse_deliveries,
    );

    let _ = client.cancel().await;
    let _ = std::fs::remove_dir_all(&dir);
}
