//! A thousand identical calls at once, through rmcp over an in-process
//! duplex transport, while the one that runs sleeps 2 s: exactly one
//! execution (asserted), and how fast the 999 duplicates are answered. Then a
//! thousand distinct calls at once: their throughput. On MemoryStore,
//! SqliteStore and PostgresStore.
//!
//! `cargo bench --bench contention` (PostgreSQL from `IDEM_TEST_DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema
//! dropped at the end).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    idempotent, Attempt, Caller, Executor, IdempotencyStore, IdempotentServer, MemoryStore,
    PostgresStore, SqliteStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{tool, RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};

const CALLS: usize = 1000;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
    runs: Arc<AtomicUsize>,
    sleep: Duration,
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
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.sleep).await;
        Ok(Json(Receipt {
            charge_id: format!("ch_{n}_{}", args.card),
        }))
    }
}

type Client = RunningService<RoleClient, ()>;

async fn connect(store: Arc<dyn IdempotencyStore>, sleep: Duration) -> (Client, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let shop = Shop {
        executor: Executor::new(store),
        caller: Caller::new("acme", "alice"),
        runs: runs.clone(),
        sleep,
    };
    let (server_side, client_side) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    (().serve(client_side).await.expect("client connects"), runs)
}

fn params(card: &str) -> CallToolRequestParams {
    let serde_json::Value::Object(args) = serde_json::json!({"card": card, "amount_cents": 500})
    else {
        unreachable!("an object literal")
    };
    CallToolRequestParams::new("charge_card").with_arguments(args)
}

/// 1,000 identical calls at once: the duplicates' latencies (µs), after
/// checking exactly one ran.
async fn identical(store: Arc<dyn IdempotencyStore>) -> (f64, f64) {
    let (client, runs) = connect(store, Duration::from_secs(2)).await;
    let client = Arc::new(client);
    // The first claims; the rest arrive while it sleeps.
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool(params("tok_same")).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dups: Vec<_> = (1..CALLS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let result = client.call_tool(params("tok_same")).await.unwrap();
                assert_eq!(
                    result.is_error,
                    Some(true),
                    "a duplicate is answered in progress"
                );
                t.elapsed()
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(CALLS);
    for d in dups {
        lat.push(d.await.unwrap());
    }
    first.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly one execution");
    common::median_p99(&mut lat)
}

/// 1,000 distinct calls at once (no sleep): calls per second.
async fn distinct(store: Arc<dyn IdempotencyStore>) -> f64 {
    let (client, runs) = connect(store, Duration::ZERO).await;
    let client = Arc::new(client);
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.call_tool(params(&format!("tok_{i}"))).await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    let rate = CALLS as f64 / started.elapsed().as_secs_f64();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        CALLS,
        "each distinct call ran once"
    );
    rate
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("load average at start: {}", common::load());
    let dir = std::env::temp_dir().join(format!("idem-contention-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{:016x}", Attempt::random().get());
    let postgres = PostgresStore::builder(&url)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    postgres.migrate().await.unwrap();

    println!(
        "| store | duplicates p50 (ms) | duplicates p99 (ms) | goal p99 | 1,000 distinct calls/s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    let stores: Vec<(&str, Arc<dyn IdempotencyStore>, f64)> = vec![
        ("MemoryStore", Arc::new(MemoryStore::new()), 5.0),
        (
            "SqliteStore",
            Arc::new(SqliteStore::open(dir.join("c.sqlite3")).await.unwrap()),
            50.0,
        ),
        ("PostgresStore", Arc::new(postgres.clone()), 50.0),
    ];
    for (name, store, goal) in stores {
        let (p50, p99) = identical(store.clone()).await;
        let rate = distinct(store).await;
        println!(
            "| {name} | {:.2} | {:.2} | {goal} ms | {rate:.0} |",
            p50 / 1000.0,
            p99 / 1000.0
        );
    }
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average at end: {}", common::load());
}
