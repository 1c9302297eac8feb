//! A chaos run with real processes: payments replicas over streamable HTTP
//! on one shared store, the processor and the mailer as services
//! (`src/bin/farside.rs`), a fleet of clients carrying out purchases and
//! retrying them as hosts and models do, a nemesis, and a checker at the
//! end.
//!
//! ```text
//! cargo build --bin chaos --bin farside --example payments --bin idem_cli
//! target/debug/chaos --store sqlite|postgres|redis|dynamodb [--duration-s N] [--seed N]
//!     [--clients N] [--bin-dir DIR] [--dir DIR] [--background-completions true|false]
//!     [--skew MS [--drift] [--faketime-lib PATH]]
//! ```
//!
//! `scripts/chaos` builds and runs it. `--bin-dir` is the cargo profile
//! directory whose `examples/payments` and `idem_cli` are run (default: the
//! one this binary is in): a patched build is checked by pointing there.
//! The far sides are always this binary's siblings.
//!
//! `--skew MS` runs each replica under a wall clock of its own, up to `MS`
//! off the machine's (one ahead by `MS`, one behind by as much), and with
//! `--drift` running fast or slow within that range (`clock.rs`); the
//! replicas' clocks are read back before the faults start.
//!
//! It prints one line per run, `chaos: <store>: N intents, F faults, V
//! violations`, each violation with its intent's whole history, and exits 1
//! on a violation.

mod checker;
mod clients;
mod clock;
mod nemesis;
mod procs;
mod proxy;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Mutex;

use procs::{free_port, Proc, StoreServer};
use proxy::Proxy;

/// The timings every replica runs with: short, so that a minute holds many
/// leases, settles and reconciliations. The settle period covers the
/// processor's timeout, its lookup lag and the proxies' longest delay.
const LEASE_MS: u64 = 2000;
const SETTLE_MS: u64 = 6000;
const PROCESSOR_TIMEOUT_MS: u64 = 1500;
const LOOKUP_LAG_MS: u64 = 1000;
/// How long after the faults stop every record must have settled.
const SETTLE_BOUND: Duration = Duration::from_secs(90);

const TENANTS: [(&str, &str); 3] = [
    ("acme", "tok-acme"),
    ("globex", "tok-globex"),
    ("initech", "tok-initech"),
];

/// The processes of one run.
pub struct Cluster {
    server: StoreServer,
    /// The store as the CLI reaches it: directly, not through a proxy.
    store_url: String,
    /// What the CLI and the replicas need in their environment to reach
    /// the store.
    store_env: Vec<(String, String)>,
    /// Each replica's clock.
    clocks: Vec<clock::Skew>,
    replicas: Vec<Proc>,
    store_proxies: Vec<Proxy>,
    processor_proxies: Vec<Proxy>,
    processor: Proc,
    processor_port: u16,
    mailer: Proc,
    mailer_port: u16,
}

struct Flags {
    store: String,
    duration: Duration,
    seed: u64,
    clients: usize,
    bin_dir: PathBuf,
    dir: PathBuf,
    /// Replicas answer before their completions are written.
    background_completions: bool,
    /// The most a replica's clock is off the machine's, in ms.
    skew_ms: u64,
    /// Whether the replicas' clocks also run fast or slow.
    drift: bool,
    /// libfaketime's preload.
    faketime_lib: PathBuf,
}

/// The cargo profile directory this binary was built into
/// (`target/<profile>/chaos`): where its far sides are, and the default
/// `--bin-dir`.
fn own_profile() -> PathBuf {
    let exe = std::env::current_exe().expect("the harness's own path");
    exe.parent().expect("target/<profile>/chaos").to_owned()
}

fn parse_flags() -> Flags {
    let profile = own_profile();
    let mut flags = Flags {
        store: String::new(),
        duration: Duration::from_secs(60),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
        clients: 8,
        background_completions: false,
        bin_dir: profile,
        dir: std::env::temp_dir().join(format!("idem-chaos-{}", std::process::id())),
        skew_ms: 0,
        drift: false,
        faketime_lib: PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--drift" {
            flags.drift = true;
            continue;
        }
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let int = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| usage(&format!("{flag} takes a number, not {value:?}")))
        };
        match flag.as_str() {
            "--store" => flags.store = value.clone(),
            "--duration-s" => flags.duration = Duration::from_secs(int()),
            "--seed" => flags.seed = int(),
            "--clients" => flags.clients = int() as usize,
            "--bin-dir" => flags.bin_dir = PathBuf::from(&value),
            "--background-completions" => {
                flags.background_completions = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => usage("--background-completions takes true or false"),
                }
            }
            "--dir" => flags.dir = PathBuf::from(&value),
            "--skew" => flags.skew_ms = int(),
            "--faketime-lib" => flags.faketime_lib = PathBuf::from(&value),
            other => usage(&format!("unknown flag {other:?}")),
        }
    }
    if !matches!(
        flags.store.as_str(),
        "sqlite" | "postgres" | "redis" | "dynamodb"
    ) {
        usage("--store is sqlite, postgres, redis or dynamodb");
    }
    if flags.drift && flags.skew_ms == 0 {
        usage("--drift needs --skew MS: the range the clocks drift in");
    }
    if flags.skew_ms > 0 && !flags.faketime_lib.exists() {
        fatal(&format!(
            "--skew needs libfaketime at {} (scripts/libfaketime install; or --faketime-lib PATH)",
            flags.faketime_lib.display()
        ));
    }
    flags
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "chaos: {problem}\nusage: chaos --store sqlite|postgres|redis|dynamodb [--duration-s N] \
         [--seed N] [--clients N] [--bin-dir DIR] [--dir DIR] \
         [--background-completions true|false] [--skew MS [--drift] [--faketime-lib PATH]]"
    );
    std::process::exit(2)
}

async fn farside(bin: &Path, dir: &Path, kind: &str, port: u16, seed: u64) -> Proc {
    let mut args: Vec<String> = vec![
        kind.into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--db".into(),
        dir.join(format!("{kind}.sqlite3")).display().to_string(),
        "--seed".into(),
        seed.to_string(),
    ];
    if kind == "processor" {
        for (flag, value) in [
            ("--latency-ms", "100".to_owned()),
            ("--jitter-ms", "300".to_owned()),
            ("--lookup-lag-ms", LOOKUP_LAG_MS.to_string()),
            ("--lookup-latency-ms", "200".to_owned()),
            ("--failure-rate", "0.03".to_owned()),
            ("--stall-rate", "0.03".to_owned()),
            ("--stall-ms", "3000".to_owned()),
        ] {
            args.extend([flag.to_owned(), value]);
        }
    } else {
        args.extend([
            "--latency-ms".into(),
            "20".into(),
            "--failure-rate".into(),
            "0.1".into(),
        ]);
    }
    Proc::start(
        bin.join("farside"),
        args,
        Vec::new(),
        "farside: serving",
        dir.join(format!("{kind}.log")),
    )
    .await
    .unwrap_or_else(|e| fatal(&e))
}

fn fatal(problem: &str) -> ! {
    eprintln!("chaos: {problem}");
    std::process::exit(2)
}

impl Cluster {
    async fn start(flags: &Flags) -> Cluster {
        let dir = &flags.dir;
        std::fs::create_dir_all(dir).unwrap_or_else(|e| fatal(&format!("{}: {e}", dir.display())));
        // The far sides are the harness's own build, always.
        let own = own_profile();
        let (processor_port, mailer_port) = (free_port(), free_port());
        let processor = farside(&own, dir, "processor", processor_port, flags.seed).await;
        let mailer = farside(&own, dir, "mailer", mailer_port, flags.seed + 1).await;
        let (server, replicas_n) = match flags.store.as_str() {
            "postgres" => (
                StoreServer::postgres(dir, free_port())
                    .await
                    .unwrap_or_else(|e| fatal(&e)),
                3,
            ),
            "redis" => (
                StoreServer::redis(dir, free_port())
                    .await
                    .unwrap_or_else(|e| fatal(&e)),
                3,
            ),
            "dynamodb" => (
                StoreServer::dynamodb(dir, free_port(), "chaos")
                    .await
                    .unwrap_or_else(|e| fatal(&e)),
                3,
            ),
            // Two processes on one SQLite file.
            _ => (StoreServer::None, 2),
        };
        let server_port = server_port_of(&server);
        let sqlite = format!("sqlite:{}", dir.join("store.sqlite3").display());
        let store_url = if server_port == 0 {
            sqlite.clone()
        } else {
            server.url(server_port)
        };
        // Every process's life, for the drift's range: the faults, the
        // settling after them, and the start and the clients' last intents.
        let lifetime = flags.duration + SETTLE_BOUND + Duration::from_secs(60);
        let clocks = clock::draw(replicas_n, flags.skew_ms, flags.drift, lifetime, flags.seed);
        let mut cluster = Cluster {
            store_env: server.client_env(),
            server,
            store_url,
            clocks,
            replicas: Vec::new(),
            store_proxies: Vec::new(),
            processor_proxies: Vec::new(),
            processor,
            processor_port,
            mailer,
            mailer_port,
        };
        for r in 0..replicas_n {
            let replica_store = if server_port == 0 {
                sqlite.clone()
            } else {
                // PostgreSQL through PgBouncer (transaction mode); the proxy
                // the nemesis cuts sits between the replica and the pooler.
                let proxy = Proxy::start(cluster.server.client_port(server_port)).await;
                let url = cluster.server.url(proxy.port);
                cluster.store_proxies.push(proxy);
                url
            };
            let to_processor = Proxy::start(processor_port).await;
            let mut args: Vec<String> = ["--transport", "http", "--listen"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.push(format!("127.0.0.1:{}", free_port()));
            args.extend(["--store".into(), replica_store]);
            args.extend([
                "--processor-url".into(),
                format!("http://127.0.0.1:{}", to_processor.port),
                "--mailer-url".into(),
                format!("http://127.0.0.1:{mailer_port}"),
            ]);
            for (tenant, token) in TENANTS {
                args.extend(["--token".into(), format!("{token}={tenant}/user")]);
            }
            for (flag, ms) in [
                ("--lease-ms", LEASE_MS),
                ("--settle-ms", SETTLE_MS),
                ("--processor-timeout-ms", PROCESSOR_TIMEOUT_MS),
                ("--maintenance-interval-ms", 500),
                ("--reconcile-backoff-ms", 500),
                ("--follow-on-interval-ms", 300),
                ("--follow-on-backoff-ms", 200),
            ] {
                args.extend([flag.to_owned(), ms.to_string()]);
            }
            if flags.background_completions {
                args.push("--background-completions".into());
            }
            cluster.processor_proxies.push(to_processor);
            let mut env = cluster.store_env.clone();
            if flags.skew_ms > 0 {
                env.extend(cluster.clocks[r].env(&flags.faketime_lib));
            }
            let replica = Proc::start(
                flags.bin_dir.join("examples").join("payments"),
                args,
                env,
                "payments: serving MCP on ",
                dir.join(format!("replica-{r}.log")),
            )
            .await
            .unwrap_or_else(|e| fatal(&e));
            cluster.replicas.push(replica);
        }
        cluster
    }

    /// Reads every replica's clock from outside and compares it with the
    /// skew it was given: a preload that did not take ends the run (exit
    /// 2), as a run with no skew would pass for one with it. Returns the
    /// clocks, given and seen, printed before the chaos line.
    async fn check_clocks(&self, store: &str) -> String {
        let seen = futures::future::join_all(
            self.replicas
                .iter()
                .map(|r| clock::observe(format!("http://{}", r.arg_after("--listen")))),
        )
        .await;
        let mut shown = Vec::new();
        for (r, (given, seen)) in self.clocks.iter().zip(seen).enumerate() {
            let seen = seen.unwrap_or_else(|e| fatal(&format!("replica {r}'s clock: {e}")));
            // 50 ms for the time between the process's start and the read,
            // drift included, and the load of a shared machine.
            if (seen.offset_ms - given.offset_ms as f64).abs() > 50.0 + seen.within_ms {
                fatal(&format!(
                    "{store}: replica {r} runs {:+.0} ms (±{:.0}) off this clock, not the {:+} ms \
                     it was given: libfaketime's preload did not take",
                    seen.offset_ms, seen.within_ms, given.offset_ms
                ));
            }
            shown.push(format!(
                "replica {r} {:+} ms{} (seen {:+.0} ±{:.0} ms)",
                given.offset_ms,
                if given.drift_ppm != 0 {
                    format!(" drifting {:+} ppm", given.drift_ppm)
                } else {
                    String::new()
                },
                seen.offset_ms,
                seen.within_ms
            ));
        }
        format!("clocks {}", shown.join(", "))
    }

    /// Every replica's MCP endpoint (fixed for the run: a restart listens
    /// on the same port).
    fn endpoints(&self) -> Vec<String> {
        self.replicas
            .iter()
            .map(|r| format!("http://{}/mcp", r.arg_after("--listen")))
            .collect()
    }

    /// Sets the processor's injected failures and stalls.
    async fn quiet_processor(&self, quiet: bool) {
        let rates = if quiet { 0.0 } else { 0.03 };
        let _ = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/faults", self.processor_port))
            .body(json!({ "failure_rate": rates, "stall_rate": rates }).to_string())
            .send()
            .await;
        let _ = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/faults", self.mailer_port))
            .body(json!({ "failure_rate": if quiet { 0.0 } else { 0.1 } }).to_string())
            .send()
            .await;
    }

    /// Undoes every fault: everything up, thawed, passing.
    async fn heal(&mut self) {
        for p in self.store_proxies.iter().chain(&self.processor_proxies) {
            p.set(proxy::Mode::Pass);
        }
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if r.stopped {
                r.thaw();
            }
            if !r.is_up() {
                if let Err(e) = r.restart().await {
                    eprintln!("chaos: replica {i} did not come back: {e}");
                }
            }
        }
        self.quiet_processor(true).await;
    }

    async fn ledger(&self, port: u16) -> Value {
        for _ in 0..20 {
            if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/ledger")).await {
                if let Ok(v) = r.json::<Value>().await {
                    return v;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        fatal("a far side's ledger cannot be read")
    }

    async fn shut_down(&mut self) {
        for r in &mut self.replicas {
            r.kill().await;
        }
        self.processor.kill().await;
        self.mailer.kill().await;
        self.server.shut_down().await;
    }
}

fn server_port_of(server: &StoreServer) -> u16 {
    match server {
        StoreServer::Redis(p) => p.arg_after("--port").parse().expect("a port"),
        StoreServer::Postgres { port, .. } | StoreServer::DynamoDb { port, .. } => *port,
        StoreServer::None => 0,
    }
}

/// The records now, through the operator's CLI: `None` if the store does
/// not answer.
async fn list_records(cli: &Path, store: &str, env: &[(String, String)]) -> Option<Vec<Value>> {
    let out = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::process::Command::new(cli)
            .args(["--store", store, "list", "--json", "--limit", "10000000"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()?
        .as_array()
        .cloned()
}

/// Each reference's states in order, and its record as last seen.
#[derive(Default)]
struct History {
    states: BTreeMap<String, Vec<(u64, u64, String)>>,
    last_seen: BTreeMap<String, Value>,
}

/// Notes what a list read between `t_ms` and `end_ms` (run time) showed.
fn note_states(history: &mut History, records: &[Value], t_ms: u64, end_ms: u64) {
    for r in records {
        if let Some(reference) = r["reference"].as_str() {
            history.last_seen.insert(reference.to_owned(), r.clone());
        }
        if let (Some(reference), Some(state)) = (r["reference"].as_str(), r["state"].as_str()) {
            let states = history.states.entry(reference.to_owned()).or_default();
            if states.last().is_none_or(|(_, _, s)| s != state) {
                states.push((t_ms, end_ms, state.to_owned()));
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let flags = parse_flags();
    let cli = flags.bin_dir.join("idem_cli");
    if !cli.exists() || !flags.bin_dir.join("examples/payments").exists() {
        fatal(&format!(
            "{} needs examples/payments and idem_cli: cargo build --example payments --bin idem_cli",
            flags.bin_dir.display()
        ));
    }
    let started = Instant::now();
    let start_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let cluster = Cluster::start(&flags).await;
    let fleet = Arc::new(clients::Fleet {
        replicas: cluster.endpoints(),
        tenants: TENANTS
            .iter()
            .map(|(t, k)| (t.to_string(), k.to_string()))
            .collect(),
        start: started,
        running: AtomicBool::new(true),
        done: StdMutex::new(Vec::new()),
        seen: StdMutex::new(Vec::new()),
        next_id: AtomicU64::new(1),
    });
    let store_url = cluster.store_url.clone();
    let store_env = cluster.store_env.clone();
    let clocks = if flags.skew_ms > 0 {
        cluster.check_clocks(&flags.store).await
    } else {
        String::new()
    };
    let cluster = Arc::new(Mutex::new(cluster));

    // The records' states, every second, for check 6.
    let history = Arc::new(StdMutex::new(History::default()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (history, watching, cli, store, env) = (
            history.clone(),
            watching.clone(),
            cli.clone(),
            store_url.clone(),
            store_env.clone(),
        );
        tokio::spawn(async move {
            while watching.load(Ordering::SeqCst) {
                // Read before the list: a state it shows held at this time
                // or later.
                let t = started.elapsed().as_millis() as u64;
                if let Some(records) = list_records(&cli, &store, &env).await {
                    let end = started.elapsed().as_millis() as u64;
                    note_states(&mut history.lock().unwrap(), &records, t, end);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    let clients: Vec<_> = (0..flags.clients)
        .map(|n| tokio::spawn(clients::run_client(fleet.clone(), n, flags.seed)))
        .collect();
    let faulting = Arc::new(AtomicBool::new(true));
    let nemesis = tokio::spawn(nemesis::run(
        cluster.clone(),
        faulting.clone(),
        flags.seed,
        LEASE_MS,
        800,
    ));

    tokio::time::sleep(flags.duration).await;
    // The faults stop; the clients finish the intents they started.
    faulting.store(false, Ordering::SeqCst);
    fleet.running.store(false, Ordering::SeqCst);
    let faults = nemesis.await.expect("the nemesis ends");
    cluster.lock().await.heal().await;
    let healed = Instant::now();
    for c in clients {
        let _ = c.await;
    }

    // Maintenance settles what is left: every record COMPLETED or
    // NOT_PERFORMED, every receipt of a completed charge delivered.
    let mut settled = false;
    let mut records = Vec::new();
    while healed.elapsed() < SETTLE_BOUND {
        let t = started.elapsed().as_millis() as u64;
        if let Some(now) = list_records(&cli, &store_url, &store_env).await {
            let end = started.elapsed().as_millis() as u64;
            note_states(&mut history.lock().unwrap(), &now, t, end);
            let open = now
                .iter()
                .any(|r| !matches!(r["state"].as_str(), Some("COMPLETED" | "NOT_PERFORMED")));
            let jobs = tokio::process::Command::new(&cli)
                .args([
                    "--store", &store_url, "jobs", "--json", "--limit", "1000000",
                ])
                .envs(store_env.iter().map(|(k, v)| (k, v)))
                .output()
                .await
                .ok()
                .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
                .and_then(|v| v.as_array().map(Vec::len));
            records = now;
            if !open && jobs == Some(0) {
                settled = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settle_s = healed.elapsed().as_secs_f64();
    watching.store(false, Ordering::SeqCst);
    let _ = watcher.await;

    let mut cluster = cluster.lock().await;
    let processor = cluster.ledger(cluster.processor_port).await;
    let mailer = cluster.ledger(cluster.mailer_port).await;
    cluster.shut_down().await;
    let intents = std::mem::take(&mut *fleet.done.lock().unwrap());
    let history = std::mem::take(&mut *history.lock().unwrap());
    let evidence = checker::Evidence {
        intents: &intents,
        records: &records,
        history: &history.states,
        last_seen: &history.last_seen,
        start_unix_ms,
        processor: &processor,
        mailer: &mailer,
        settled,
    };
    let violations = checker::check(&evidence);

    let purchases = intents.iter().filter(|i| i.kind != "probe").count();
    let fault_total: u32 = faults.values().sum();
    let answers =
        intents
            .iter()
            .flat_map(|i| &i.obs)
            .fold(BTreeMap::<String, u32>::new(), |mut m, o| {
                let kind = o.outcome.split(':').next().unwrap_or("").to_owned();
                *m.entry(format!("{}:{kind}", o.via)).or_default() += 1;
                m
            });
    if !clocks.is_empty() {
        println!("chaos: {}: {clocks}", flags.store);
    }
    println!(
        "chaos: {}: {purchases} intents, {fault_total} faults, {} violations",
        flags.store,
        violations.len()
    );
    println!(
        "chaos: {}: {:.0} s of faults, seed {}{}; faults {faults:?}; settled in {settle_s:.1} s \
         (bound {} s); processor {} requests, {} charges; mailer {} requests, {} receipts",
        flags.store,
        flags.duration.as_secs_f64(),
        flags.seed,
        if flags.background_completions {
            ", background completions"
        } else {
            ""
        },
        SETTLE_BOUND.as_secs(),
        processor["requests"],
        processor["effects"],
        mailer["requests"],
        mailer["effects"],
    );
    println!("chaos: {}: answers {answers:?}", flags.store);
    let (lookups, looked_up, most, once) = checker::lookups(&processor);
    println!(
        "chaos: {}: the processor was asked {lookups} times about {looked_up} references \
         ({once} once, at most {most}), {} overlapping, {} within one check",
        flags.store, processor["lookup_overlaps"], processor["lookups_within_a_check"]
    );
    for v in &violations {
        println!(
            "VIOLATION (check {}): {} [reference {:?}, intent {:?}]",
            v.check, v.what, v.reference, v.intent
        );
        let story = checker::history_of(&evidence, v.intent, v.reference.as_deref());
        println!(
            "{}",
            serde_json::to_string_pretty(&story).unwrap_or_default()
        );
    }
    let report = json!({
        "store": flags.store,
        "seed": flags.seed,
        "skew_ms": flags.skew_ms,
        "drift": flags.drift,
        "clocks": clocks,
        "intents": purchases,
        "faults": faults,
        "violations": violations,
        "settled_s": settle_s,
        "lookups": lookups,
        "looked_up": looked_up,
        "looked_up_once": once,
        "lookup_overlaps": processor["lookup_overlaps"],
        "lookups_within_a_check": processor["lookups_within_a_check"],
    });
    let _ = std::fs::write(flags.dir.join("report.json"), report.to_string());
    // Everything the checker read, to read again.
    let evidence_json = json!({
        "intents": intents,
        "records": records,
        "history": history.states,
        "last_seen": history.last_seen,
        "settled": settled,
        "processor": processor,
        "mailer": mailer,
        "start_unix_ms": start_unix_ms,
    });
    let _ = std::fs::write(flags.dir.join("evidence.json"), evidence_json.to_string());
    if violations.is_empty() {
        let _ = std::fs::remove_dir_all(&flags.dir);
    } else {
        eprintln!(
            "chaos: the run's logs and data are in {}",
            flags.dir.display()
        );
        std::process::exit(1);
    }
}
