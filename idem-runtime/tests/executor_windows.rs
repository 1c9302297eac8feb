//! A tool's window set at start-up (`Executor::with_window`), served and
//! listed, and a test clock (`MemoryStore::on_tokio_time` under tokio's
//! paused time) that takes a wrapped tool past its window without waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    idempotent,
    mcp::{RESULT_META_KEY, TOOL_META_KEY},
    Caller, Executor, IdempotentServer, MemoryStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{tool, RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct BookArgs {
    order_id: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge: usize,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
    /// The processor stub: how many charges it made.
    charges: Arc<AtomicUsize>,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.caller)
    }
}

#[idem_runtime::tool_router(server_handler)]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(_args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let charge = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Receipt { charge }))
    }

    #[idempotent(business_key = "order_id", window = "7d")]
    #[tool(description = "Book an order")]
    async fn book(
        &self,
        Parameters(_args): Parameters<BookArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let charge = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Receipt { charge }))
    }
}

type Client = RunningService<RoleClient, ()>;

async fn connect(executor: Executor, charges: &Arc<AtomicUsize>) -> Client {
    let server = Shop {
        executor,
        caller: Caller::new("acme", "alice"),
        charges: charges.clone(),
    };
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

async fn charge(client: &Client) -> CallToolResult {
    let Value::Object(args) = json!({"card": "4242", "cents": 500}) else {
        unreachable!()
    };
    client
        .call_tool(CallToolRequestParams::new("charge_card").with_arguments(args))
        .await
        .expect("tools/call answers")
}

fn state(result: &CallToolResult) -> String {
    result.meta.as_ref().expect("_meta")[RESULT_META_KEY]["state"]
        .as_str()
        .expect("a state")
        .to_owned()
}

/// On the attribute's 15-minute window and a clock the test moves: a
/// repeat 14 minutes later is the same charge, one 16 minutes after the
/// first is a new one. Nothing sleeps.
#[tokio::test(start_paused = true)]
async fn a_wrapped_tool_goes_past_its_window_on_a_controlled_clock() {
    let charges = Arc::default();
    let executor = Executor::new(Arc::new(MemoryStore::on_tokio_time())).with_replay_cache(1 << 20);
    let client = connect(executor, &charges).await;
    let started = std::time::Instant::now();

    assert_eq!(state(&charge(&client).await), "executed");
    tokio::time::advance(Duration::from_secs(14 * 60)).await;
    assert_eq!(state(&charge(&client).await), "replayed");
    assert_eq!(charges.load(Ordering::SeqCst), 1, "inside the window");

    tokio::time::advance(Duration::from_secs(2 * 60)).await;
    assert_eq!(state(&charge(&client).await), "executed");
    assert_eq!(charges.load(Ordering::SeqCst), 2, "past the window");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "nothing waited"
    );
}

/// A window set at start-up replaces the attribute's: what is served (a
/// repeat after 61 s is a new charge) and what is listed agree.
#[tokio::test(start_paused = true)]
async fn a_window_set_at_start_up_is_served_and_listed() {
    let charges = Arc::default();
    let executor = Executor::new(Arc::new(MemoryStore::on_tokio_time()))
        .with_window("charge_card", Duration::from_secs(60))
        .expect("a sane window")
        .with_business_key_retention("book", Duration::from_secs(3600))
        .expect("a sane retention");
    let client = connect(executor, &charges).await;

    let tools = client.list_all_tools().await.unwrap();
    let marker = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).expect("listed");
        tool.meta.as_ref().expect("_meta")[TOOL_META_KEY].clone()
    };
    assert_eq!(marker("charge_card")["windowSeconds"], 60);
    assert_eq!(marker("book")["retentionSeconds"], 3600);

    assert_eq!(state(&charge(&client).await), "executed");
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(state(&charge(&client).await), "replayed");
    assert_eq!(charges.load(Ordering::SeqCst), 1, "inside the 60 s window");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(state(&charge(&client).await), "executed");
    assert_eq!(
        charges.load(Ordering::SeqCst),
        2,
        "past the 60 s window, though the attribute says 15 minutes"
    );
}

/// Without a setting, the listing says the attribute's window and
/// retention.
#[tokio::test]
async fn without_a_setting_the_attributes_window_is_listed() {
    let charges = Arc::default();
    let client = connect(Executor::new(Arc::new(MemoryStore::new())), &charges).await;
    let tools = client.list_all_tools().await.unwrap();
    let marker = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).expect("listed");
        tool.meta.as_ref().expect("_meta")[TOOL_META_KEY].clone()
    };
    assert_eq!(marker("charge_card")["windowSeconds"], 900);
    assert_eq!(marker("book")["retentionSeconds"], 7 * 24 * 3600);
}

/// A zero, fractional or absurd window is refused at start-up, saying what
/// to pass.
#[test]
fn a_zero_or_absurd_window_is_refused_at_start_up() {
    let executor = || Executor::new(Arc::new(MemoryStore::new()));
    let zero = executor()
        .with_window("charge_card", Duration::ZERO)
        .unwrap_err()
        .to_string();
    assert!(
        zero.contains("charge_card") && zero.contains("at least 1 s"),
        "{zero}"
    );
    let absurd = executor()
        .with_window("charge_card", Duration::from_secs(900_000_000))
        .unwrap_err()
        .to_string();
    assert!(absurd.contains("unit mistake"), "{absurd}");
    let retention = executor()
        .with_business_key_retention("book", Duration::from_millis(500))
        .unwrap_err()
        .to_string();
    assert!(retention.contains("book"), "{retention}");
}
