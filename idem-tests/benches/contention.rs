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
//! machine, with no store at all), and of an unwrapped tool that answers at
//! once with a copy of idem's in-progress answer (the floor for that
//! answer: what rmcp costs to carry the message and `_meta` a model must
//! get, with no idem at all). All with 1 client and with 10 clients of 100
//! calls each (each its own transport and server session over one executor
//! and store: ten hosts).
//!
//! One burst's p99 is one draw, so every side runs once per round, in turn,
//! for `IDEM_BENCH_ROUNDS` rounds (default 5); the table gives the median of
//! the rounds' figures and each round's p99 over the floor's of the same
//! round.
//!
//! `cargo bench --bench contention` (PostgreSQL from `IDEM_TEST_DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema
//! dropped at the end).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use idem_runtime::{
    idempotent, store::Attempt, Caller, Executor, IdempotencyStore, IdempotentServer, MemoryStore,
    PostgresStore, SqliteStore, ToolError,
};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
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

    /// The floor for the in-progress answer: no store, no sleep, a copy of
    /// the answer idem gave a duplicate.
    #[tool(description = "Charge a card (unwrapped, answers at once as idem answers a duplicate)")]
    async fn bare_in_progress(&self, Parameters(_args): Parameters<ChargeArgs>) -> CallToolResult {
        IN_PROGRESS
            .get()
            .expect("captured before the bursts")
            .clone()
    }
}

/// The answer idem gave a duplicate, captured once (`capture_in_progress`).
static IN_PROGRESS: OnceLock<CallToolResult> = OnceLock::new();

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

/// 1,000 calls of the unwrapped tool that answers with a copy of idem's
/// in-progress answer: the floor for that answer.
async fn floor_in_progress(clients: usize) -> Burst {
    let setup = connect(Arc::new(MemoryStore::new()), Duration::ZERO, clients).await;
    burst(&setup, "bare_in_progress", "tok_same", |result| {
        assert_eq!(result.is_error, Some(true), "{result:?}")
    })
    .await
}

/// Keeps the answer idem gives a duplicate while the first call runs.
async fn capture_in_progress() {
    let setup = connect(Arc::new(MemoryStore::new()), Duration::from_secs(2), 1).await;
    let client = setup.clients[0].clone();
    let first =
        tokio::spawn(async move { client.call_tool(params("charge_card", "tok_capture")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let duplicate = setup.clients[0]
        .call_tool(params("charge_card", "tok_capture"))
        .await
        .unwrap();
    assert_eq!(duplicate.is_error, Some(true), "{duplicate:?}");
    IN_PROGRESS.set(duplicate).unwrap();
    first.await.unwrap().unwrap();
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

/// The three stores a burst runs on: a fresh MemoryStore, and the SQLite
/// file and PostgreSQL schema the rounds share.
fn stores(
    sqlite: &Arc<dyn IdempotencyStore>,
    postgres: &PostgresStore,
) -> [(&'static str, Arc<dyn IdempotencyStore>); 3] {
    [
        ("MemoryStore", Arc::new(MemoryStore::new())),
        ("SqliteStore", sqlite.clone()),
        ("PostgresStore", Arc::new(postgres.clone())),
    ]
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

    let rounds: usize = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    capture_in_progress().await;
    let sqlite: Vec<Arc<dyn IdempotencyStore>> = vec![
        Arc::new(SqliteStore::open(dir.join("c1.sqlite3")).await.unwrap()),
        Arc::new(SqliteStore::open(dir.join("c10.sqlite3")).await.unwrap()),
    ];
    // (side, clients) → one burst per round, in the order first run.
    let mut sides: Vec<((&str, usize), Vec<Burst>)> = Vec::new();
    let mut keep = |side: &'static str, clients: usize, burst: Burst| match sides
        .iter_mut()
        .find(|(k, _)| *k == (side, clients))
    {
        Some((_, bursts)) => bursts.push(burst),
        None => sides.push(((side, clients), vec![burst])),
    };
    for round in 0..rounds {
        for (c, clients) in [1usize, 10].into_iter().enumerate() {
            keep("unwrapped floor", clients, floor(clients).await);
            keep(
                "unwrapped, idem's in-progress answer",
                clients,
                floor_in_progress(clients).await,
            );
            for (name, store) in stores(&sqlite[c], &postgres) {
                // New to the store (PostgreSQL's schema and the SQLite file
                // are shared by the rounds).
                let card: &'static str =
                    Box::leak(format!("tok_same_{round}_{clients}").into_boxed_str());
                keep(name, clients, identical(store, clients, card).await);
            }
        }
    }

    println!(
        "999 duplicates while the first runs, {rounds} rounds (ms, the median of the rounds; \
         the goal is on the end-to-end p99):"
    );
    println!();
    println!("| side, clients | from the burst p50 | p99 | p99 ÷ the floor's, per round | from its call p50 | p99 | server p50 | p99 | wait to reach the server p50 | p99 |");
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for clients in [1usize, 10] {
        let floor_p99: Vec<f64> = sides
            .iter()
            .find(|(k, _)| *k == ("unwrapped floor", clients))
            .map(|(_, b)| b.iter().map(|b| b.from_burst.1).collect())
            .unwrap();
        for ((side, _), bursts) in sides.iter().filter(|((_, c), _)| *c == clients) {
            let pick = |f: fn(&Burst) -> f64| median(bursts.iter().map(f).collect());
            let mut ratios: Vec<f64> = bursts
                .iter()
                .zip(&floor_p99)
                .map(|(b, f)| b.from_burst.1 / f)
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "| {side}, {clients} | {:.2} | {:.2} | {:.2}–{:.2}× (median {:.2}×) | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} |",
                pick(|b| b.from_burst.0),
                pick(|b| b.from_burst.1),
                ratios[0],
                ratios[ratios.len() - 1],
                ratios[ratios.len() / 2],
                pick(|b| b.from_call.0),
                pick(|b| b.from_call.1),
                pick(|b| b.server.0),
                pick(|b| b.server.1),
                pick(|b| b.wait.0),
                pick(|b| b.wait.1),
            );
        }
    }

    let mut rates = Vec::new();
    for (c, clients) in [1usize, 10].into_iter().enumerate() {
        for (name, store) in stores(&sqlite[c], &postgres) {
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
