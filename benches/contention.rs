//! A thousand identical calls at once, through rmcp over in-process duplex
//! transports, while the one that runs sleeps 2 s: exactly one execution
//! (asserted), and how fast the 999 duplicates are answered. Then a thousand
//! distinct calls at once: their throughput. On MemoryStore, SqliteStore and
//! PostgresStore.
//!
//! Where a duplicate's time goes, in four clocks, all per call:
//! - end to end from the burst: from the moment all the calls were fired
//!   (before their tasks were spawned) to each answer;
//! - end to end from its call: from the client's `call_tool` (its task
//!   started) to its answer (what the last session measured);
//! - on the server: from rmcp's `call_tool` entry (the request parsed and
//!   its task started) to the tool's answer, before it is encoded;
//! - the wait to reach the server: from the moment the burst was sent to
//!   that entry (queueing in the client's transport, the pipe and the
//!   server's read loop).
//!
//! The same burst is made of an unwrapped tool that answers at once (the
//! floor: what rmcp and the transport cost for 1,000 calls at once on this
//! machine, with no store at all), and with 1 client and with 10 clients of
//! 100 calls each (each its own transport and server session over one
//! executor and store: ten hosts).
//!
//! `cargo bench --bench contention` (PostgreSQL from `IDEM_TEST_DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema
//! dropped at the end).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    idempotent, store::Attempt, Caller, Executor, IdempotencyStore, IdempotentServer, MemoryStore,
    PostgresStore, SqliteStore, ToolError,
};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{tool, ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
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

/// Each call's (entry, answer) on the server, as rmcp hands it to the
/// handler and as the handler gives the answer back.
type ServerTimes = Arc<Mutex<Vec<(Instant, Instant)>>>;

#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
    runs: Arc<AtomicUsize>,
    sleep: Duration,
    times: ServerTimes,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.caller)
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
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.sleep).await;
        Ok(Json(Receipt {
            charge_id: format!("ch_{n}_{}", args.card),
        }))
    }

    /// The floor: no store, no sleep.
    #[tool(description = "Charge a card (unwrapped, answers at once)")]
    async fn bare(&self, Parameters(args): Parameters<ChargeArgs>) -> Json<Receipt> {
        Json(Receipt {
            charge_id: format!("ch_{}", args.card),
        })
    }
}

impl Shop {
    fn served() -> &'static rmcp::handler::server::router::tool::ToolRouter<Self> {
        static ROUTER: std::sync::OnceLock<rmcp::handler::server::router::tool::ToolRouter<Shop>> =
            std::sync::OnceLock::new();
        ROUTER.get_or_init(Self::tool_router)
    }
}

/// What `#[idem_runtime::tool_router(server_handler)]` writes (the router
/// built once), with the server-side clock around the call.
#[rmcp::tool_handler(router = Self::served())]
impl ServerHandler for Shop {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let entry = Instant::now();
        let tcc = ToolCallContext::new(self, request, context);
        let answer = Self::served().call(tcc).await;
        self.times.lock().unwrap().push((entry, Instant::now()));
        answer
    }
}

type Client = RunningService<RoleClient, ()>;

struct Setup {
    clients: Vec<Arc<Client>>,
    runs: Arc<AtomicUsize>,
    times: ServerTimes,
}

/// `clients` clients, each over its own duplex transport to its own server
/// session, all over one executor (one store).
async fn connect(store: Arc<dyn IdempotencyStore>, sleep: Duration, clients: usize) -> Setup {
    let runs = Arc::new(AtomicUsize::new(0));
    let times = ServerTimes::default();
    let shop = Shop {
        executor: Executor::new(store),
        caller: Caller::new("acme", "alice"),
        runs: runs.clone(),
        sleep,
        times: times.clone(),
    };
    let mut connected = Vec::new();
    for _ in 0..clients {
        let (server_side, client_side) = tokio::io::duplex(1 << 20);
        let shop = shop.clone();
        tokio::spawn(async move {
            let running = shop.serve(server_side).await.expect("server starts");
            let _ = running.waiting().await;
        });
        connected.push(Arc::new(
            ().serve(client_side).await.expect("client connects"),
        ));
    }
    Setup {
        clients: connected,
        runs,
        times,
    }
}

fn params(tool: &'static str, card: &str) -> CallToolRequestParams {
    let serde_json::Value::Object(args) = serde_json::json!({"card": card, "amount_cents": 500})
    else {
        unreachable!("an object literal")
    };
    CallToolRequestParams::new(tool).with_arguments(args)
}

/// p50 and p99 in milliseconds.
fn ms(samples: &mut [Duration]) -> (f64, f64) {
    let (p50, p99) = common::median_p99(samples);
    (p50 / 1000.0, p99 / 1000.0)
}

/// The clocks of a burst, in milliseconds (p50, p99).
struct Burst {
    /// From the moment the burst was sent to each answer.
    from_burst: (f64, f64),
    /// From each call's own `call_tool` (its task started) to its answer.
    from_call: (f64, f64),
    /// On the server, from rmcp's `call_tool` entry to the answer.
    server: (f64, f64),
    /// From the moment the burst was sent to the server's `call_tool` entry.
    wait: (f64, f64),
}

impl Burst {
    fn row(&self, what: &str) -> String {
        format!(
            "| {what} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} |",
            self.from_burst.0,
            self.from_burst.1,
            self.from_call.0,
            self.from_call.1,
            self.server.0,
            self.server.1,
            self.wait.0,
            self.wait.1
        )
    }
}

/// 999 calls of `tool` with `card` at once over `setup`'s clients (round
/// robin), each answer checked with `check`.
async fn burst(
    setup: &Setup,
    tool: &'static str,
    card: &'static str,
    check: fn(&rmcp::model::CallToolResult),
) -> Burst {
    let sent = Instant::now();
    let calls: Vec<_> = (1..CALLS)
        .map(|i| {
            let client = setup.clients[i % setup.clients.len()].clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let result = client.call_tool(params(tool, card)).await.unwrap();
                check(&result);
                (t, Instant::now())
            })
        })
        .collect();
    let (mut from_burst, mut from_call) = (Vec::new(), Vec::new());
    for c in calls {
        let (called, answered) = c.await.unwrap();
        from_burst.push(answered - sent);
        from_call.push(answered - called);
    }
    // Only the burst's own calls, not the one that runs (it entered before).
    let times: Vec<_> = setup
        .times
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|(entry, _)| *entry >= sent)
        .collect();
    assert_eq!(times.len(), CALLS - 1, "every call of the burst was timed");
    let mut server: Vec<_> = times.iter().map(|(entry, exit)| *exit - *entry).collect();
    let mut wait: Vec<_> = times.iter().map(|(entry, _)| *entry - sent).collect();
    Burst {
        from_burst: ms(&mut from_burst),
        from_call: ms(&mut from_call),
        server: ms(&mut server),
        wait: ms(&mut wait),
    }
}

/// 1,000 identical calls at once: the duplicates' clocks, after checking
/// exactly one ran.
/// `card` is new to the store (PostgreSQL's schema is shared by the runs).
async fn identical(store: Arc<dyn IdempotencyStore>, clients: usize, card: &'static str) -> Burst {
    let setup = connect(store, Duration::from_secs(2), clients).await;
    // The first claims; the rest arrive while it sleeps.
    let first = {
        let client = setup.clients[0].clone();
        tokio::spawn(async move { client.call_tool(params("charge_card", card)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(setup.runs.load(Ordering::SeqCst), 1, "the first call runs");
    let burst = burst(&setup, "charge_card", card, |result| {
        assert_eq!(
            result.is_error,
            Some(true),
            "a duplicate is answered in progress"
        )
    })
    .await;
    let first = first.await.unwrap();
    assert_ne!(first.is_error, Some(true), "{first:?}");
    assert_eq!(
        setup.runs.load(Ordering::SeqCst),
        1,
        "exactly one execution"
    );
    burst
}

/// 1,000 calls of the unwrapped tool at once: the floor.
async fn floor(clients: usize) -> Burst {
    let setup = connect(Arc::new(MemoryStore::new()), Duration::ZERO, clients).await;
    burst(&setup, "bare", "tok_same", |result| {
        assert_ne!(result.is_error, Some(true), "{result:?}")
    })
    .await
}

/// 1,000 distinct calls at once (no sleep): calls per second.
async fn distinct(store: Arc<dyn IdempotencyStore>, clients: usize) -> f64 {
    let setup = connect(store, Duration::ZERO, clients).await;
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let client = setup.clients[i % clients].clone();
            tokio::spawn(async move {
                client
                    .call_tool(params("charge_card", &format!("tok_{clients}_{i}")))
                    .await
            })
        })
        .collect();
    for c in calls {
        let result = c.await.unwrap().unwrap();
        assert_ne!(result.is_error, Some(true), "{result:?}");
    }
    let rate = CALLS as f64 / started.elapsed().as_secs_f64();
    assert_eq!(
        setup.runs.load(Ordering::SeqCst),
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

    println!("999 duplicates while the first runs (ms; the goal is on the end-to-end p99):");
    println!();
    println!("| store, clients | from the burst p50 | p99 | from its call p50 | p99 | server p50 | p99 | wait to reach the server p50 | p99 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for clients in [1, 10] {
        let floor = floor(clients).await;
        println!("{}", floor.row(&format!("unwrapped floor, {clients}")));
    }
    let mut rates = Vec::new();
    for clients in [1, 10] {
        let stores: Vec<(&str, Arc<dyn IdempotencyStore>)> = vec![
            ("MemoryStore", Arc::new(MemoryStore::new())),
            (
                "SqliteStore",
                Arc::new(
                    SqliteStore::open(dir.join(format!("c{clients}.sqlite3")))
                        .await
                        .unwrap(),
                ),
            ),
            ("PostgresStore", Arc::new(postgres.clone())),
        ];
        for (name, store) in stores {
            let card = if clients == 1 {
                "tok_same_1"
            } else {
                "tok_same_10"
            };
            let burst = identical(store.clone(), clients, card).await;
            println!("{}", burst.row(&format!("{name}, {clients}")));
            rates.push((name, clients, distinct(store, clients).await));
        }
    }
    println!();
    println!("| store, clients | 1,000 distinct calls/s |");
    println!("| --- | ---: |");
    for (name, clients, rate) in rates {
        println!("| {name}, {clients} | {rate:.0} |");
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
