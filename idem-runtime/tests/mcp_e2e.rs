//! `#[idempotent]` end to end through rmcp, in process: a server and a client
//! over a duplex pipe, counting stubs standing in for the processor.
//!
//! One job, over 700 lines: the in-process MCP cases, one function each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    audit_hints, current_reference, idempotent,
    mcp::{HintProblem, RESULT_META_KEY},
    Caller, Executor, IdempotentServer, MemoryStore, ToolError,
};
use rmcp::handler::server::router::tool::ToolRoute;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RunningService};
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
    amount_cents: u64,
    /// The reference the processor was given.
    processor_reference: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ShipmentArgs {
    order_id: String,
    address: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Shipment {
    shipment_id: String,
}

/// The far side: how many times each side effect really happened.
#[derive(Default)]
struct Processor {
    charges: AtomicUsize,
    shipments: AtomicUsize,
    notes: AtomicUsize,
    rotations: AtomicUsize,
    reservations: AtomicUsize,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Option<Caller>,
    processor: Arc<Processor>,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let reference = current_reference().expect("inside #[idempotent]");
        let n = self.processor.charges.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        Ok(Json(Receipt {
            charge_id: format!("ch_{n}_{}", args.card),
            amount_cents: args.amount_cents,
            processor_reference: reference.to_string(),
        }))
    }

    #[idempotent(business_key = "order_id", window = "48h")]
    #[tool(
        description = "Create a shipment",
        annotations(title = "Create shipment", destructive_hint = false)
    )]
    async fn create_shipment(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Json<Shipment>, ToolError> {
        let n = self.processor.shipments.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Shipment {
            shipment_id: format!("sh_{n}_{}", args.order_id),
        }))
    }

    #[idempotent(window = "90s")]
    #[tool(description = "Leave a note")]
    async fn leave_note(&self, Parameters(args): Parameters<ShipmentArgs>) -> CallToolResult {
        self.processor.notes.fetch_add(1, Ordering::SeqCst);
        CallToolResult::success(vec![ContentBlock::text(format!("noted {}", args.address))])
    }

    #[tool(description = "Count charges", annotations(read_only_hint = true))]
    async fn count_charges(&self) -> String {
        self.processor.charges.load(Ordering::SeqCst).to_string()
    }
}

/// The opt-out: a router without the status tool, for a server that brings
/// its own.
#[idem_runtime::tool_router(router = router_without_status, status_tool = false)]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Refund a charge")]
    async fn refund(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<String, ToolError> {
        Ok(args.card)
    }
}

// Serves `Shop::tool_router()`: the wrapped tools and their status tool.
#[tool_handler]
impl ServerHandler for Shop {}

/// Stands in for an auth layer in front of the shop: it puts the
/// authenticated caller into the request's extensions, directly or inside
/// the HTTP request parts (as rmcp's streamable HTTP service passes them on).
struct Gateway {
    shop: Shop,
    caller: Caller,
    via_http_parts: bool,
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        self.shop.get_info()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.shop.list_tools(request, context).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.via_http_parts {
            let (mut parts, ()) = http::Request::new(()).into_parts();
            parts.extensions.insert(self.caller.clone());
            context.extensions.insert(parts);
        } else {
            context.extensions.insert(self.caller.clone());
        }
        self.shop.call_tool(request, context).await
    }
}

type Client = RunningService<RoleClient, ()>;

async fn connect_gateway(gateway: Gateway) -> Client {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = gateway.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

async fn connect(shop: Shop) -> Client {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

fn shop(executor: &Executor, caller: Option<Caller>, processor: &Arc<Processor>) -> Shop {
    Shop {
        executor: executor.clone(),
        caller,
        processor: processor.clone(),
    }
}

fn setup() -> (Executor, Arc<Processor>) {
    (
        Executor::new(Arc::new(MemoryStore::new())),
        Arc::new(Processor::default()),
    )
}

fn alice() -> Option<Caller> {
    Some(Caller::new("acme", "alice"))
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

/// `_meta["idem/operation"]` of a result.
fn operation(result: &CallToolResult) -> &Value {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.get(RESULT_META_KEY))
        .expect("the result describes its operation")
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect()
}

#[tokio::test]
async fn tools_list_shows_the_hint_on_exactly_the_wrapped_tools() {
    let (executor, processor) = setup();
    let client = connect(shop(&executor, alice(), &processor)).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut hinted: Vec<&str> = tools
        .iter()
        .filter(|t| t.annotations.as_ref().and_then(|a| a.idempotent_hint) == Some(true))
        .map(|t| t.name.as_ref())
        .collect();
    hinted.sort_unstable();
    assert_eq!(hinted, ["charge_card", "create_shipment", "leave_note"]);

    let unhinted: Vec<&Tool> = tools
        .iter()
        .filter(|t| !hinted.contains(&t.name.as_ref()))
        .collect();
    assert_eq!(unhinted.len(), 2, "count_charges and the status tool");
    for tool in unhinted {
        assert_ne!(
            tool.annotations.as_ref().and_then(|a| a.idempotent_hint),
            Some(true)
        );
    }

    let by_name = |name: &str| tools.iter().find(|t| t.name == name).unwrap();
    // The user's annotations survive the merge.
    let shipment = by_name("create_shipment").annotations.clone().unwrap();
    assert_eq!(shipment.title.as_deref(), Some("Create shipment"));
    assert_eq!(shipment.destructive_hint, Some(false));
    // The Json<T> output schema survives the rewrite.
    let schema = by_name("charge_card")
        .output_schema
        .clone()
        .expect("output schema");
    assert!(
        schema["properties"]["processor_reference"].is_object(),
        "{schema:?}"
    );
    // The wrapper's marker describes the scope.
    let marker = by_name("create_shipment").meta.as_ref().unwrap()["idem/idempotent"].clone();
    assert_eq!(marker["businessKey"], json!(["order_id"]));
    assert_eq!(marker["retentionSeconds"], json!(172_800));
    assert_eq!(marker["statusTool"], json!("get_operation_status"));

    assert_eq!(audit_hints(&Shop::tool_router()), Ok(()));
}

#[tokio::test]
async fn concurrent_duplicates_run_once_and_a_repeat_replays_the_result() {
    let (executor, processor) = setup();
    let client = connect(shop(&executor, alice(), &processor)).await;
    let args = json!({ "card": "4242", "amount_cents": 1999 });

    let first = call(&client, "charge_card", args.clone());
    let second = async {
        // Let the first claim the operation.
        tokio::time::sleep(Duration::from_millis(200)).await;
        call(&client, "charge_card", args.clone()).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);

    assert_eq!(first.is_error, Some(false), "{first:?}");
    let reference = operation(&first)["reference"].as_str().unwrap().to_owned();
    assert!(reference.starts_with("idem_"), "{reference}");
    let receipt = first.structured_content.clone().unwrap();
    // The handler saw the same reference, to hand to its processor.
    assert_eq!(receipt["processor_reference"], json!(reference));

    assert_eq!(second.is_error, Some(true), "{second:?}");
    let in_flight = operation(&second);
    assert_eq!(in_flight["state"], json!("in_progress"));
    assert_eq!(in_flight["reference"], json!(reference));
    assert_eq!(in_flight["statusTool"], json!("get_operation_status"));
    assert!(in_flight["retryAfterSeconds"].as_u64().unwrap() >= 1);
    assert!(text(&second).contains(&reference), "{}", text(&second));
    assert!(text(&second).contains("get_operation_status"));

    let repeat = call(&client, "charge_card", args).await;
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
    assert_eq!(repeat.content, first.content);
    assert_eq!(repeat.structured_content, first.structured_content);
    assert_eq!(repeat.is_error, first.is_error);
    assert_eq!(operation(&repeat)["replayed"], json!(true));
    assert_eq!(operation(&first)["replayed"], json!(false));

    // The status tool answers from the record.
    let status = call(
        &client,
        "get_operation_status",
        json!({ "reference": reference }),
    )
    .await;
    let report = status.structured_content.expect("a status report");
    assert_eq!(report["state"], json!("COMPLETED"));
    assert_eq!(report["tool"], json!("charge_card"));
}

#[tokio::test]
async fn two_callers_with_identical_arguments_are_two_operations() {
    let (executor, processor) = setup();
    let alice_client = connect(shop(&executor, alice(), &processor)).await;
    let bob_client = connect(shop(
        &executor,
        Some(Caller::new("acme", "bob")),
        &processor,
    ))
    .await;
    let args = json!({ "card": "4242", "amount_cents": 500 });
    let (a, b) = tokio::join!(
        call(&alice_client, "charge_card", args.clone()),
        call(&bob_client, "charge_card", args.clone()),
    );
    assert_eq!(processor.charges.load(Ordering::SeqCst), 2);
    assert_eq!(a.is_error, Some(false));
    assert_eq!(b.is_error, Some(false));
    assert_ne!(operation(&a)["reference"], operation(&b)["reference"]);
}

#[tokio::test]
async fn the_caller_comes_from_the_request_extensions_or_the_http_parts() {
    let (executor, processor) = setup();
    // The shop itself has no default caller: without the gateway, refused.
    let direct = connect_gateway(Gateway {
        shop: shop(&executor, None, &processor),
        caller: Caller::new("acme", "alice"),
        via_http_parts: false,
    })
    .await;
    let via_http = connect_gateway(Gateway {
        shop: shop(&executor, None, &processor),
        caller: Caller::new("acme", "bob"),
        via_http_parts: true,
    })
    .await;
    let args = json!({ "card": "4242", "amount_cents": 700 });
    let a = call(&direct, "charge_card", args.clone()).await;
    let b = call(&via_http, "charge_card", args.clone()).await;
    assert_eq!(a.is_error, Some(false), "{a:?}");
    assert_eq!(b.is_error, Some(false), "{b:?}");
    // Two callers: two operations.
    assert_eq!(processor.charges.load(Ordering::SeqCst), 2);
    assert_ne!(operation(&a)["reference"], operation(&b)["reference"]);
    // The same caller again: replayed.
    let again = call(&via_http, "charge_card", args).await;
    assert_eq!(processor.charges.load(Ordering::SeqCst), 2);
    assert_eq!(operation(&again)["reference"], operation(&b)["reference"]);
    assert_eq!(operation(&again)["replayed"], json!(true));
}

#[tokio::test]
async fn a_business_key_reused_with_other_arguments_is_a_conflict() {
    let (executor, processor) = setup();
    let client = connect(shop(&executor, alice(), &processor)).await;
    let first = call(
        &client,
        "create_shipment",
        json!({ "order_id": "o-1", "address": "1 Main St" }),
    )
    .await;
    assert_eq!(first.is_error, Some(false), "{first:?}");

    let other = call(
        &client,
        "create_shipment",
        json!({ "order_id": "o-1", "address": "9 Elm St" }),
    )
    .await;
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 1);
    assert_eq!(other.is_error, Some(true));
    assert_eq!(operation(&other)["state"], json!("conflict"));
    assert_eq!(
        operation(&other)["reference"],
        operation(&first)["reference"]
    );
    assert!(text(&other).contains("Conflict"), "{}", text(&other));

    // The same business key from another subject of the tenant, same
    // arguments: the same operation, replayed.
    let bob = connect(shop(
        &executor,
        Some(Caller::new("acme", "bob")),
        &processor,
    ))
    .await;
    let again = call(
        &bob,
        "create_shipment",
        json!({ "order_id": "o-1", "address": "1 Main St" }),
    )
    .await;
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 1);
    assert_eq!(again.structured_content, first.structured_content);
}

#[tokio::test]
async fn a_plain_call_tool_result_is_recorded_and_replayed() {
    let (executor, processor) = setup();
    let client = connect(shop(&executor, alice(), &processor)).await;
    let args = json!({ "order_id": "o-2", "address": "2 Side St" });
    let first = call(&client, "leave_note", args.clone()).await;
    let again = call(&client, "leave_note", args).await;
    assert_eq!(processor.notes.load(Ordering::SeqCst), 1);
    assert_eq!(text(&first), "noted 2 Side St");
    assert_eq!(again.content, first.content);
    assert_eq!(operation(&again)["replayed"], json!(true));
}

#[tokio::test]
async fn a_call_without_a_caller_is_refused_and_nothing_runs() {
    let (executor, processor) = setup();
    let client = connect(shop(&executor, None, &processor)).await;
    let result = call(
        &client,
        "create_shipment",
        json!({ "order_id": "o-3", "address": "3 Back St" }),
    )
    .await;
    assert_eq!(result.is_error, Some(true));
    assert_eq!(operation(&result)["state"], json!("no_caller"));
    assert!(text(&result).contains("no authenticated caller"));
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 0);
}

#[test]
fn the_audit_finds_a_hint_set_through_the_builder_api() {
    let unbacked = Tool::new(
        "refund",
        "Refund a charge",
        Arc::new(serde_json::Map::new()),
    )
    .annotate(ToolAnnotations::new().idempotent(true));
    let router = Shop::tool_router().with_route(ToolRoute::new_dyn(unbacked, |_context| {
        Box::pin(async { Ok(CallToolResult::success(vec![]).into()) })
    }));
    assert_eq!(
        audit_hints(&router),
        Err(vec![HintProblem::UnbackedHint {
            tool: "refund".to_owned()
        }])
    );
}

#[test]
fn the_audit_finds_a_missing_status_tool() {
    // The router generated with `status_tool = false`, and one whose status
    // tool was taken out: each lacks the status tool its wrapped tools name.
    assert_eq!(
        audit_hints(&Shop::router_without_status()),
        Err(vec![HintProblem::MissingStatusTool {
            tool: "refund".to_owned(),
            status_tool: "get_operation_status".to_owned(),
        }])
    );
    let mut router = Shop::tool_router();
    router.remove_route("get_operation_status");
    let problems = audit_hints(&router).unwrap_err();
    let mut tools: Vec<String> = problems
        .iter()
        .map(|problem| match problem {
            HintProblem::MissingStatusTool { tool, status_tool } => {
                assert_eq!(status_tool, "get_operation_status");
                tool.clone()
            }
            other => panic!("unexpected {other}"),
        })
        .collect();
    tools.sort_unstable();
    assert_eq!(tools, ["charge_card", "create_shipment", "leave_note"]);
}

/// Arguments whose business key field is renamed on the wire: the model
/// sends `orderId`, the Rust field is `order_id`.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
struct OrderArgs {
    order_id: String,
    amount_cents: u64,
}

/// A business key of two fields, one renamed and one reached through a
/// nested struct whose field is renamed too.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ReserveArgs {
    #[serde(rename = "wh")]
    warehouse: String,
    customer: CustomerRef,
    quantity: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct CustomerRef {
    #[serde(rename = "customerId")]
    id: String,
}

/// A server whose `ServerHandler` the impl-level macro writes: what it
/// serves is exactly `Orders::tool_router()`.
#[derive(Clone)]
struct Orders {
    executor: Executor,
    processor: Arc<Processor>,
}

impl IdempotentServer for Orders {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        static LOCAL: std::sync::OnceLock<Caller> = std::sync::OnceLock::new();
        Some(LOCAL.get_or_init(|| Caller::new("acme", "alice")))
    }
}

#[idem_runtime::tool_router(server_handler)]
impl Orders {
    #[idempotent(business_key = "order_id")]
    #[tool(description = "Place an order")]
    async fn place_order(
        &self,
        Parameters(args): Parameters<OrderArgs>,
    ) -> Result<Json<Shipment>, ToolError> {
        let n = self.processor.shipments.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Shipment {
            shipment_id: format!("sh_{n}_{}_{}", args.order_id, args.amount_cents),
        }))
    }

    #[idempotent(business_key = ["warehouse", "customer.id"])]
    #[tool(description = "Reserve stock for a customer")]
    async fn reserve_stock(
        &self,
        Parameters(args): Parameters<ReserveArgs>,
    ) -> Result<String, ToolError> {
        let n = self.processor.reservations.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("rsv_{n}_{}", args.quantity))
    }

    /// A side effect without arguments: one rotation per caller per window.
    #[idempotent(window = "1s")]
    #[tool(description = "Rotate the API key")]
    async fn rotate_api_key(&self) -> Result<String, ToolError> {
        let n = self.processor.rotations.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("key_{n}"))
    }
}

fn orders(executor: &Executor, processor: &Arc<Processor>) -> Orders {
    Orders {
        executor: executor.clone(),
        processor: processor.clone(),
    }
}

async fn connect_orders(orders: Orders) -> Client {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = orders.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

#[tokio::test]
async fn the_router_the_impl_macro_generates_serves_the_status_tool() {
    let (executor, processor) = setup();
    let client = connect_orders(orders(&executor, &processor)).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "get_operation_status",
            "place_order",
            "reserve_stock",
            "rotate_api_key"
        ]
    );

    let placed = call(
        &client,
        "place_order",
        json!({ "orderId": "o-7", "amountCents": 300 }),
    )
    .await;
    assert_eq!(placed.is_error, Some(false), "{placed:?}");
    let reference = operation(&placed)["reference"].as_str().unwrap().to_owned();
    let status = call(
        &client,
        "get_operation_status",
        json!({ "reference": reference }),
    )
    .await;
    assert_eq!(status.is_error, Some(false), "{status:?}");
    let report = status.structured_content.expect("a status report");
    assert_eq!(report["state"], json!("COMPLETED"));
    assert_eq!(report["tool"], json!("place_order"));

    // The audited router is the served one: no `with_route` by hand.
    assert_eq!(audit_hints(&Orders::tool_router()), Ok(()));
}

#[tokio::test]
async fn a_business_key_field_renamed_by_serde_keys_the_operation() {
    let (executor, processor) = setup();
    let client = connect_orders(orders(&executor, &processor)).await;
    let args = json!({ "orderId": "o-8", "amountCents": 300 });
    let first = call(&client, "place_order", args.clone()).await;
    assert_eq!(first.is_error, Some(false), "{first:?}");
    let again = call(&client, "place_order", args).await;
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 1);
    assert_eq!(operation(&again)["replayed"], json!(true));
    assert_eq!(again.structured_content, first.structured_content);

    // Keyed on the order alone: another amount for it is a conflict.
    let other = call(
        &client,
        "place_order",
        json!({ "orderId": "o-8", "amountCents": 999 }),
    )
    .await;
    assert_eq!(operation(&other)["state"], json!("conflict"));
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 1);

    // An empty key is still refused, naming the field as written.
    let empty = call(
        &client,
        "place_order",
        json!({ "orderId": "", "amountCents": 1 }),
    )
    .await;
    assert_eq!(empty.is_error, Some(true));
    assert!(
        text(&empty).contains("`order_id` is empty"),
        "{}",
        text(&empty)
    );
    assert_eq!(processor.shipments.load(Ordering::SeqCst), 1);
}

#[test]
fn a_business_key_without_a_window_shows_the_default_retention() {
    let router = Orders::tool_router();
    let tool = router.get("place_order").expect("the tool");
    let marker = &tool.meta.as_ref().unwrap()["idem/idempotent"];
    assert_eq!(marker["businessKey"], json!(["order_id"]));
    assert_eq!(
        marker["retentionSeconds"],
        json!(idem_runtime::executor::DEFAULT_RETENTION.as_secs())
    );
}

#[tokio::test]
async fn a_business_key_is_derived_as_before_from_the_typed_field() {
    // Records written before the key came from the typed field keep their
    // keys: one field is keyed by its value, as the executor always did.
    let (executor, processor) = setup();
    let client = connect(shop(&executor, alice(), &processor)).await;
    let args = json!({ "order_id": "o-9", "address": "9 Elm St" });
    let result = call(&client, "create_shipment", args.clone()).await;
    let expected = idem_runtime::key::IdempotencyKey::derive(
        &Caller::new("acme", "alice"),
        "create_shipment",
        &args,
        &idem_runtime::key::Scope::BusinessKey(json!("o-9")),
    )
    .unwrap();
    let reference = idem_runtime::Reference::parse(
        operation(&result)["reference"]
            .as_str()
            .expect("a reference"),
    )
    .expect("a well-formed reference");
    assert!(reference.is_of(&expected), "{reference} names another key");
}

#[tokio::test]
async fn a_tool_without_arguments_runs_once_per_window() {
    let (executor, processor) = setup();
    let client = connect_orders(orders(&executor, &processor)).await;
    let first = call(&client, "rotate_api_key", json!({})).await;
    let again = call(&client, "rotate_api_key", json!({})).await;
    assert_eq!(processor.rotations.load(Ordering::SeqCst), 1);
    assert_eq!(first.is_error, Some(false), "{first:?}");
    assert_eq!(text(&first), "key_1");
    assert_eq!(again.content, first.content);
    assert_eq!(operation(&again)["replayed"], json!(true));

    // After the window, the same call is a new operation.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = call(&client, "rotate_api_key", json!({})).await;
    assert_eq!(processor.rotations.load(Ordering::SeqCst), 2);
    assert_eq!(text(&later), "key_2");
    assert_eq!(operation(&later)["replayed"], json!(false));
    // Under a reference of its own: a processor that keeps idempotency keys
    // for a day must not take it for the first.
    assert_eq!(
        operation(&again)["reference"],
        operation(&first)["reference"]
    );
    assert_ne!(
        operation(&later)["reference"],
        operation(&first)["reference"]
    );
}

#[tokio::test]
async fn a_business_key_reaches_renamed_and_nested_fields() {
    let (executor, processor) = setup();
    let client = connect_orders(orders(&executor, &processor)).await;
    let args = json!({ "wh": "w1", "customer": { "customerId": "c-1" }, "quantity": 3 });
    let first = call(&client, "reserve_stock", args.clone()).await;
    assert_eq!(first.is_error, Some(false), "{first:?}");
    let again = call(&client, "reserve_stock", args).await;
    assert_eq!(processor.reservations.load(Ordering::SeqCst), 1);
    assert_eq!(operation(&again)["replayed"], json!(true));

    // Several fields are keyed by an object of them, under the names the
    // attribute gives.
    let expected = idem_runtime::key::IdempotencyKey::derive(
        &Caller::new("acme", "alice"),
        "reserve_stock",
        &json!({}),
        &idem_runtime::key::Scope::BusinessKey(json!({ "warehouse": "w1", "customer.id": "c-1" })),
    )
    .unwrap();
    let reference = idem_runtime::Reference::parse(
        operation(&first)["reference"]
            .as_str()
            .expect("a reference"),
    )
    .expect("a well-formed reference");
    assert!(reference.is_of(&expected), "{reference} names another key");

    // Another customer in the same warehouse: another operation.
    let other = call(
        &client,
        "reserve_stock",
        json!({ "wh": "w1", "customer": { "customerId": "c-2" }, "quantity": 3 }),
    )
    .await;
    assert_eq!(other.is_error, Some(false), "{other:?}");
    assert_eq!(processor.reservations.load(Ordering::SeqCst), 2);
}
