//! What a wrapped tool costs as an MCP client sees it: the same tool body,
//! wrapped by `#[idempotent]` and not, called through rmcp's client over an
//! in-process duplex transport, alternating call by call in one run, on
//! MemoryStore and on SqliteStore. Every wrapped call is a new operation (it
//! runs, it is not a replay).
//!
//! `cargo bench --bench mcp_overhead`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    idempotent, Caller, Executor, IdempotencyStore, IdempotentServer, MemoryStore, SqliteStore,
    ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{tool, RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
    currency: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.caller)
    }
}

fn receipt(args: &ChargeArgs) -> Receipt {
    Receipt {
        charge_id: format!("ch_{}", args.card),
        amount_cents: args.amount_cents,
    }
}

#[idem_runtime::tool_router(server_handler)]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card (wrapped)")]
    async fn wrapped(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(receipt(&args)))
    }

    #[tool(description = "Charge a card (bare)")]
    async fn bare(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, String> {
        Ok(Json(receipt(&args)))
    }
}

type Client = RunningService<RoleClient, ()>;

async fn connect(store: Arc<dyn IdempotencyStore>) -> Client {
    let shop = Shop {
        executor: Executor::new(store),
        caller: Caller::new("acme", "alice"),
    };
    let (server_side, client_side) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    ().serve(client_side).await.expect("client connects")
}

async fn call(client: &Client, tool: &'static str, n: u64) -> Duration {
    let serde_json::Value::Object(args) = serde_json::json!({
        "card": format!("tok_{n}"),
        "amount_cents": 1999,
        "currency": "usd",
    }) else {
        unreachable!("an object literal")
    };
    let t = Instant::now();
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .unwrap();
    let elapsed = t.elapsed();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    elapsed
}

async fn compare(name: &str, store: Arc<dyn IdempotencyStore>, calls: u64) {
    let client = connect(store).await;
    for n in 0..500 {
        call(&client, "wrapped", n).await;
        call(&client, "bare", n).await;
    }
    let (mut w, mut b) = (Vec::new(), Vec::new());
    for n in 1000..1000 + calls {
        w.push(call(&client, "wrapped", n).await);
        b.push(call(&client, "bare", n).await);
    }
    let (w50, w99) = common::median_p99(&mut w);
    let (b50, b99) = common::median_p99(&mut b);
    println!(
        "| {name}, duplex | {w50:.1} | {b50:.1} | {:.2}× | {w99:.1} | {b99:.1} | {:.2}× |",
        w50 / b50,
        w99 / b99
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("load average at start: {}", common::load());
    let dir = std::env::temp_dir().join(format!("idem-mcp-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!("| store, transport | wrapped median µs | bare median µs | ratio | wrapped p99 µs | bare p99 µs | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    compare("MemoryStore", Arc::new(MemoryStore::new()), 10_000).await;
    let sqlite = SqliteStore::open(dir.join("o.sqlite3")).await.unwrap();
    compare("SqliteStore", Arc::new(sqlite), 3_000).await;
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average at end: {}", common::load());
}
