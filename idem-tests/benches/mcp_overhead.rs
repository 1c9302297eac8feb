//! What a wrapped tool costs as an MCP client sees it: the same tool body,
//! wrapped by `#[idempotent]` and not, called through rmcp's client over an
//! in-process duplex transport and over streamable HTTP on loopback,
//! alternating call by call in one run, on MemoryStore and on SqliteStore.
//! Every wrapped call is a new operation (it runs, it is not a replay).
//!
//! `cargo bench --bench mcp_overhead`
//!
//! For a profiler: `IDEM_BENCH_ONLY=wrapped` (or `bare`) makes only that
//! tool's calls, on MemoryStore over the duplex transport,
//! `IDEM_BENCH_CALLS` of them (default 10,000) after 500 to warm up, so two
//! runs under `valgrind --tool=callgrind` give each call's instructions.
//! In that mode the server runs on a thread of its own, so that
//! `--separate-threads=yes` gives the server's instructions alone (the
//! thread whose profile holds `charge_card`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    idempotent, Caller, Executor, IdempotencyStore, IdempotentServer, MemoryStore, SqliteStore,
    ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, NumberOrString, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::transport::StreamableHttpClientTransport;
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

#[derive(Clone, Copy)]
enum Transport {
    /// rmcp over an in-process `tokio::io::duplex` pipe.
    Duplex,
    /// rmcp's streamable HTTP service (axum, stateful sessions, the
    /// defaults) on 127.0.0.1, and rmcp's reqwest client.
    Http,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Duplex => "duplex",
            Transport::Http => "streamable HTTP",
        }
    }
}

async fn connect(store: Arc<dyn IdempotencyStore>, transport: Transport) -> Client {
    let shop = Shop {
        executor: Executor::new(store),
        caller: Caller::new("acme", "alice"),
    };
    match transport {
        Transport::Duplex => {
            let (server_side, client_side) = tokio::io::duplex(1 << 20);
            tokio::spawn(async move {
                let running = shop.serve(server_side).await.expect("server starts");
                let _ = running.waiting().await;
            });
            ().serve(client_side).await.expect("client connects")
        }
        Transport::Http => {
            let service = StreamableHttpService::new(
                move || Ok(shop.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
            let app = axum::Router::new().nest_service("/mcp", service);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
            ().serve(transport).await.expect("client connects")
        }
    }
}

async fn call(client: &Client, tool: &'static str, n: u64) -> Duration {
    call_for(client, tool, n).await.0
}

async fn call_for(client: &Client, tool: &'static str, n: u64) -> (Duration, CallToolResult) {
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
    (elapsed, result)
}

/// What the two answers cost to encode (server) and decode (client) as
/// JSON-RPC messages, alternating, with rmcp's own types: the part of the
/// wrapped call's extra time that is its larger answer (`_meta`). Median
/// µs per message: (encode wrapped, encode bare, decode wrapped, decode bare).
fn codec(wrapped: CallToolResult, bare: CallToolResult) -> (f64, f64, f64, f64) {
    let message = |result| {
        ServerJsonRpcMessage::response(
            ServerResult::CallToolResult(result),
            NumberOrString::Number(1042),
        )
    };
    let (wrapped, bare) = (message(wrapped), message(bare));
    let text = |m: &ServerJsonRpcMessage| serde_json::to_string(m).unwrap();
    let (wrapped_text, bare_text) = (text(&wrapped), text(&bare));
    let mut times: [Vec<Duration>; 4] = Default::default();
    for _ in 0..20_000 {
        for (i, (m, t)) in [(&wrapped, &wrapped_text), (&bare, &bare_text)]
            .into_iter()
            .enumerate()
        {
            let started = Instant::now();
            std::hint::black_box(text(std::hint::black_box(m)));
            times[i].push(started.elapsed());
            let started = Instant::now();
            let decoded: ServerJsonRpcMessage =
                serde_json::from_str(std::hint::black_box(t)).unwrap();
            std::hint::black_box(decoded);
            times[2 + i].push(started.elapsed());
        }
    }
    let [a, b, c, d] = times.map(|mut t| common::median_p99(&mut t).0);
    (a, b, c, d)
}

async fn compare(name: &str, store: Arc<dyn IdempotencyStore>, transport: Transport, calls: u64) {
    let client = connect(store, transport).await;
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
        "| {name}, {} | {w50:.1} | {b50:.1} | {:.2}× | {w99:.1} | {b99:.1} | {:.2}× |",
        transport.name(),
        w50 / b50,
        w99 / b99
    );
}

/// One tool's calls only, for a profiler: `IDEM_BENCH_ONLY=wrapped|bare`.
async fn only(tool: &'static str) {
    let calls: u64 = std::env::var("IDEM_BENCH_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    // The server runs on a thread of its own (a current-thread runtime), so
    // that `valgrind --tool=callgrind --separate-threads=yes` counts its
    // instructions apart from the client's.
    let (server_side, client_side) = tokio::io::duplex(1 << 20);
    let shop = Shop {
        executor: Executor::new(Arc::new(MemoryStore::new())),
        caller: Caller::new("acme", "alice"),
    };
    std::thread::Builder::new()
        .name("mcp-server".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let running = shop.serve(server_side).await.expect("server starts");
                let _ = running.waiting().await;
            });
        })
        .unwrap();
    let client = ().serve(client_side).await.expect("client connects");
    for n in 0..500 {
        call(&client, tool, n).await;
    }
    let mut t = Vec::new();
    for n in 1000..1000 + calls {
        t.push(call(&client, tool, n).await);
    }
    let (p50, p99) = common::median_p99(&mut t);
    println!(
        "{tool} only, MemoryStore, duplex, {calls} calls: median {p50:.1} µs, p99 {p99:.1} µs"
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Ok(tool) = std::env::var("IDEM_BENCH_ONLY") {
        let tool = match tool.as_str() {
            "wrapped" => "wrapped",
            "bare" => "bare",
            other => panic!("IDEM_BENCH_ONLY is `wrapped` or `bare`, not `{other}`"),
        };
        return only(tool).await;
    }
    println!("load average at start: {}", common::load());
    let dir = std::env::temp_dir().join(format!("idem-mcp-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!("| store, transport | wrapped median µs | bare median µs | ratio | wrapped p99 µs | bare p99 µs | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (transport, memory_calls, sqlite_calls) in [
        (Transport::Duplex, 10_000, 3_000),
        (Transport::Http, 3_000, 2_000),
    ] {
        compare(
            "MemoryStore",
            Arc::new(MemoryStore::new()),
            transport,
            memory_calls,
        )
        .await;
        let path = dir.join(format!("o-{}.sqlite3", transport.name().replace(' ', "-")));
        let sqlite = SqliteStore::open(path).await.unwrap();
        compare("SqliteStore", Arc::new(sqlite), transport, sqlite_calls).await;
    }
    let client = connect(Arc::new(MemoryStore::new()), Transport::Duplex).await;
    let (_, wrapped) = call_for(&client, "wrapped", 7).await;
    let (_, bare) = call_for(&client, "bare", 7).await;
    let (ew, eb, dw, db) = codec(wrapped, bare);
    println!();
    println!("| the answer as a JSON-RPC message | wrapped µs | bare µs | added µs |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| encode (server) | {ew:.2} | {eb:.2} | {:.2} |", ew - eb);
    println!("| decode (client) | {dw:.2} | {db:.2} | {:.2} |", dw - db);
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average at end: {}", common::load());
}
