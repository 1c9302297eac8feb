//! The side-by-side run against AWS Lambda Powertools' Redis idempotency, on
//! one machine, against the same Redis, in one run (`scripts/peer-redis`
//! installs Powertools and runs this):
//!
//! - the raw Redis round trip: one `SET key value PX …` through the redis
//!   crate's reconnecting connection, the client RedisStore uses. A first
//!   call through idem needs two (the claim and the completion), so two raw
//!   round trips are its floor;
//! - the round trip of a script that does nothing (`return 1`, one key, one
//!   argument): a store whose every transition is one script can do no
//!   better than two of these;
//! - the least claim and completion scripts the issue's rules allow (the
//!   time from the server's `TIME`, an atomic check, the lapsed-lease index;
//!   `FLOOR_CLAIM`, `FLOOR_COMPLETE`), one after the other: the first call
//!   of any store with one script per transition, minus everything idem
//!   does besides; and the same two as a Redis Functions library, called
//!   with `FCALL` as idem's are;
//! - idem: `Executor::run` over `RedisStore` with a no-op handler, a first
//!   call (fresh arguments: claim, run, complete) and a replay (the same
//!   arguments again: one claim that finds the completed record);
//! - Powertools: `idempotent_function` with its Redis layer, a first call
//!   and a replay, in a Python process (`scripts/peer-redis-powertools.py`).
//!
//! The Rust measures alternate call by call, each on two tokio
//! runtimes (multi-thread, as `#[tokio::main]` builds, and current-thread);
//! the Powertools rounds run between the Rust rounds, so drift on this shared
//! machine hits every side.
//!
//! `IDEM_BENCH_REDIS_URL` (default `IDEM_TEST_REDIS_URL`, then
//! `redis://127.0.0.1:6379`); `IDEM_PEER_PYTHON` and `IDEM_PEER_SCRIPT`
//! name the Python side (without them, the Powertools rows are left out).
//! The keys are written under a fresh prefix and deleted at the end
//! (Powertools' expire with its 15-minute window).

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    executor::{Operation, ScopeSpec},
    store::Attempt,
    Caller, Executor, RedisStore, ToolError,
};
use serde::{Deserialize, Serialize};

/// Calls of each kind per round and runtime, and rounds.
const CALLS: usize = 2000;
const ROUNDS: usize = 3;

#[derive(Serialize)]
struct Charge {
    card: String,
    amount_cents: u64,
    currency: &'static str,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    receipt: String,
    amount_cents: u64,
}

struct Idem {
    executor: Executor,
    caller: Caller,
    runs: AtomicUsize,
}

impl Idem {
    /// One call through `Executor::run` with a no-op handler.
    async fn call(&self, card: &str) -> Duration {
        let args = Charge {
            card: card.to_owned(),
            amount_cents: 1999,
            currency: "usd",
        };
        let t = Instant::now();
        let answer = self
            .executor
            .run(
                Operation {
                    caller: &self.caller,
                    tool: "charge_card",
                    args: &args,
                    scope: ScopeSpec::Window(Duration::from_secs(900)),
                    status_tool: "get_operation_status",
                },
                |_| async {
                    self.runs.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ToolError>(Receipt {
                        receipt: format!("r_{card}"),
                        amount_cents: 1999,
                    })
                },
            )
            .await;
        let took = t.elapsed();
        assert!(
            ["executed", "replayed"].contains(&answer.name()),
            "{answer:?}"
        );
        took
    }
}

/// One raw round trip: a SET of a fresh key, expiring in a minute.
async fn raw(conn: &mut redis::aio::ConnectionManager, prefix: &str, i: usize) -> Duration {
    let key = format!("{prefix}:raw:{i}");
    let t = Instant::now();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(common::RESPONSE)
        .arg("PX")
        .arg(60_000)
        .query_async(conn)
        .await
        .unwrap();
    t.elapsed()
}

/// A script in the server's cache: what `EVALSHA` names it by.
struct Script(String);

impl Script {
    /// Loads `code` into the server's script cache (`SCRIPT LOAD`).
    async fn load(conn: &mut redis::aio::ConnectionManager, code: &str) -> Script {
        Script(
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(code)
                .query_async(conn)
                .await
                .unwrap(),
        )
    }

    /// An `EVALSHA` of the script over `keys`; the caller adds the arguments.
    fn call(&self, keys: &[&str]) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.0).arg(keys.len()).arg(keys);
        cmd
    }
}

/// One round trip of a script that does nothing (`return 1`, one key, one
/// argument): what any store that makes each transition one script pays
/// at the least, so two of them are the floor of such a design.
async fn noop(
    conn: &mut redis::aio::ConnectionManager,
    script: &Script,
    prefix: &str,
    i: usize,
) -> Duration {
    let key = format!("{prefix}:noop:{i}");
    let t = Instant::now();
    let _: i64 = script
        .call(&[&key])
        .arg(common::RESPONSE)
        .query_async(conn)
        .await
        .unwrap();
    t.elapsed()
}

/// The least a claim can do under the issue's rules (one script, the time
/// from the server's `TIME`, a lapsed-lease index): `TIME`, `SET … NX PXAT`,
/// `ZADD`. No fingerprint check, no takeover, no UNKNOWN index.
const FLOOR_CLAIM: &str = r#"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2], 'NX', 'PXAT', now + 60000) then
  redis.call('ZADD', KEYS[2], now + 30000, KEYS[1])
  return 1
end
return 0
"#;

/// The least a completion can do: `GET` (fenced by the attempt), `TIME`,
/// `SET … PXAT`, `ZREM`.
const FLOOR_COMPLETE: &str = r#"
local rec = redis.call('GET', KEYS[1])
if not rec or string.sub(rec, 1, 16) ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2], 'PXAT', now + 60000)
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
"#;

/// The least scripts above as a Redis Functions library (`floor_claim`,
/// `floor_complete`), as idem's own scripts run since they became one: the
/// same code, called with `FCALL`.
async fn load_floor_functions(conn: &mut redis::aio::ConnectionManager) {
    let function = |name: &str, code: &str| {
        let code = code.replace("KEYS[", "keys[").replace("ARGV[", "args[");
        format!("redis.register_function('{name}', function(keys, args)\n{code}\nend)\n")
    };
    let library = format!(
        "#!lua name=idem_bench_floor\n{}{}",
        function("floor_claim", FLOOR_CLAIM),
        function("floor_complete", FLOOR_COMPLETE)
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query_async(conn)
        .await
        .unwrap();
}

/// [`floor`] with the least scripts as functions (`load_floor_functions`).
async fn floor_functions(
    conn: &mut redis::aio::ConnectionManager,
    prefix: &str,
    i: usize,
) -> Duration {
    let key = format!("{prefix}:floorfn:{i}");
    let index = format!("{prefix}:floorfn:lapsed");
    let attempt = format!("{:016x}", Attempt::random().get());
    let fcall = |name: &str, value: &str| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(name)
            .arg(2)
            .arg(&key)
            .arg(&index)
            .arg(&attempt)
            .arg(value);
        cmd
    };
    let (claim, complete) = (
        fcall("floor_claim", "IN_PROGRESS"),
        fcall("floor_complete", common::RESPONSE),
    );
    let t = Instant::now();
    let claimed: i64 = claim.query_async(conn).await.unwrap();
    let completed: i64 = complete.query_async(conn).await.unwrap();
    let elapsed = t.elapsed();
    assert_eq!(
        (claimed, completed),
        (1, 1),
        "the floor's functions did their work"
    );
    elapsed
}

/// A claim and a completion of the least scripts the issue's rules allow
/// (above), one after the other: the floor of a first call for any store
/// whose transitions are one server-side script each, idem's or another's.
async fn floor(
    conn: &mut redis::aio::ConnectionManager,
    scripts: &(Script, Script),
    prefix: &str,
    i: usize,
) -> Duration {
    let key = format!("{prefix}:floor:{i}");
    let index = format!("{prefix}:floor:lapsed");
    let attempt = format!("{:016x}", Attempt::random().get());
    let t = Instant::now();
    let claimed: i64 = scripts
        .0
        .call(&[&key, &index])
        .arg(&attempt)
        .arg("IN_PROGRESS")
        .query_async(conn)
        .await
        .unwrap();
    let completed: i64 = scripts
        .1
        .call(&[&key, &index])
        .arg(&attempt)
        .arg(common::RESPONSE)
        .query_async(conn)
        .await
        .unwrap();
    let elapsed = t.elapsed();
    assert_eq!(
        (claimed, completed),
        (1, 1),
        "the floor's scripts did their work"
    );
    elapsed
}

#[derive(Deserialize)]
struct Peer {
    first: Vec<f64>,
    replay: Vec<f64>,
    handler_calls: usize,
    version: String,
}

/// One round of the Python side, or `None` when it is not configured.
fn powertools(host: &str, port: u16, calls: usize) -> Option<Peer> {
    let python = std::env::var("IDEM_PEER_PYTHON").ok()?;
    let script = std::env::var("IDEM_PEER_SCRIPT").ok()?;
    let out = Command::new(python)
        .arg(script)
        .arg(host)
        .arg(port.to_string())
        .arg(calls.to_string())
        .output()
        .expect("the Python side starts");
    assert!(
        out.status.success(),
        "the Python side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("the Python side prints JSON"))
}

fn micros(v: &[f64]) -> Vec<Duration> {
    v.iter()
        .map(|us| Duration::from_secs_f64(us / 1e6))
        .collect()
}

async fn delete_prefix(conn: &mut redis::aio::ConnectionManager, prefix: &str) {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(conn)
                .await
                .unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// The Rust side's samples on one kind of tokio runtime.
#[derive(Default)]
struct Samples {
    raw: Vec<Duration>,
    noop: Vec<Duration>,
    floor: Vec<Duration>,
    floor_functions: Vec<Duration>,
    first: Vec<Duration>,
    replay: Vec<Duration>,
}

/// One round on a runtime: a store and a raw connection of its own (a
/// connection's driver task lives on the runtime that opened it), a
/// warm-up, then `CALLS` of each measure, alternating call by call. Every
/// key it wrote is deleted at the end.
async fn round(url: &str, round: usize, into: &mut Samples) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    let prefix = format!("bench-{:016x}", Attempt::random().get());
    let store = RedisStore::builder(url)
        .unwrap()
        .prefix(&prefix)
        .build()
        .unwrap();
    let idem = Idem {
        executor: Executor::new(Arc::new(store)),
        caller: Caller::new("acme", "alice"),
        runs: AtomicUsize::new(0),
    };
    let nothing = Script::load(&mut conn, "return 1").await;
    let least = (
        Script::load(&mut conn, FLOOR_CLAIM).await,
        Script::load(&mut conn, FLOOR_COMPLETE).await,
    );
    load_floor_functions(&mut conn).await;
    // Warm-up: connections, scripts loaded, caches; the replayed operation.
    for i in 0..300 {
        raw(&mut conn, &prefix, i).await;
        noop(&mut conn, &nothing, &prefix, i).await;
        floor(&mut conn, &least, &prefix, i).await;
        floor_functions(&mut conn, &prefix, i).await;
        idem.call(&format!("warm_{i}")).await;
        idem.call("same").await;
    }
    for i in 0..CALLS {
        into.raw.push(raw(&mut conn, &prefix, 300 + i).await);
        into.noop
            .push(noop(&mut conn, &nothing, &prefix, 300 + i).await);
        into.floor
            .push(floor(&mut conn, &least, &prefix, 300 + i).await);
        into.floor_functions
            .push(floor_functions(&mut conn, &prefix, 300 + i).await);
        into.first.push(idem.call(&format!("c_{round}_{i}")).await);
        into.replay.push(idem.call("same").await);
    }
    assert_eq!(
        idem.runs.load(Ordering::Relaxed),
        300 + 1 + CALLS,
        "idem ran each first call once, and no replay"
    );
    delete_prefix(&mut conn, &prefix).await;
}

fn main() {
    let url = std::env::var("IDEM_BENCH_REDIS_URL")
        .or_else(|_| std::env::var("IDEM_TEST_REDIS_URL"))
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str()).unwrap();
    let (host, port) = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        other => panic!("the peer run needs a TCP address, not {other:?}"),
    };
    let mut conn = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_owned();
    println!("load average at start: {}", common::load());

    // The runtime an rmcp server's #[tokio::main] builds (a worker per core:
    // a reply wakes the caller on another thread), and a current-thread one
    // (the caller and the connection's driver on one thread).
    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut m, mut c) = (Samples::default(), Samples::default());
    let (mut pt_first, mut pt_replay, mut pt_version) = (Vec::new(), Vec::new(), None);
    for r in 0..ROUNDS {
        multi.block_on(round(&url, r, &mut m));
        single.block_on(round(&url, r, &mut c));
        if let Some(peer) = powertools(&host, port, CALLS) {
            assert_eq!(
                peer.handler_calls,
                300 + 1 + CALLS,
                "Powertools ran each first call once, and no replay"
            );
            pt_first.extend(micros(&peer.first));
            pt_replay.extend(micros(&peer.replay));
            pt_version = Some(peer.version);
        }
    }

    let stats = |s: &mut Samples| {
        let (r50, r99) = common::median_p99(&mut s.raw);
        let (n50, n99) = common::median_p99(&mut s.noop);
        let (l50, l99) = common::median_p99(&mut s.floor);
        let (g50, g99) = common::median_p99(&mut s.floor_functions);
        let (f50, f99) = common::median_p99(&mut s.first);
        let (p50, p99) = common::median_p99(&mut s.replay);
        [r50, r99, n50, n99, l50, l99, g50, g99, f50, f99, p50, p99]
    };
    let [mr50, mr99, mn50, mn99, ml50, ml99, mg50, mg99, mf50, mf99, mp50, mp99] = stats(&mut m);
    let [cr50, cr99, cn50, cn99, cl50, cl99, cg50, cg99, cf50, cf99, cp50, cp99] = stats(&mut c);
    println!(
        "Redis {version} on {host}:{port}; {} calls of each kind per runtime, in {ROUNDS} rounds",
        ROUNDS * CALLS
    );
    println!();
    println!("| measure | multi-thread runtime: median µs | p99 µs | current-thread runtime: median µs | p99 µs |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!("| raw Redis round trip (`SET … PX`, redis crate) | {mr50:.0} | {mr99:.0} | {cr50:.0} | {cr99:.0} |");
    println!("| no-op script round trip (`EVALSHA` of `return 1`, one key, one argument) | {mn50:.0} | {mn99:.0} | {cn50:.0} | {cn99:.0} |");
    println!("| the least claim and completion scripts the rules allow, one after the other | {ml50:.0} | {ml99:.0} | {cl50:.0} | {cl99:.0} |");
    println!("| the same least scripts as functions (`FCALL`) | {mg50:.0} | {mg99:.0} | {cg50:.0} | {cg99:.0} |");
    println!("| idem first call (`Executor::run` on RedisStore: claim, no-op handler, complete) | {mf50:.0} | {mf99:.0} | {cf50:.0} | {cf99:.0} |");
    println!("| idem replay (one claim that finds the completed record) | {mp50:.0} | {mp99:.0} | {cp50:.0} | {cp99:.0} |");
    let peer = if pt_first.is_empty() {
        println!("(Powertools left out: IDEM_PEER_PYTHON and IDEM_PEER_SCRIPT are not set; run scripts/peer-redis)");
        None
    } else {
        let (q50, q99) = common::median_p99(&mut pt_first);
        let (s50, s99) = common::median_p99(&mut pt_replay);
        let v = pt_version.unwrap_or_default();
        println!("| Powertools {v} first call (`idempotent_function`, Redis layer; Python, no runtime) | {q50:.0} | {q99:.0} | | |");
        println!("| Powertools {v} replay | {s50:.0} | {s99:.0} | | |");
        Some((q50, q99, s50, s99))
    };
    println!();
    println!("| ratio | multi-thread: median | p99 | current-thread: median | p99 | goal |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    println!(
        "| idem first call / (2 × raw round trip) | {:.2} | {:.2} | {:.2} | {:.2} | |",
        mf50 / (2.0 * mr50),
        mf99 / (2.0 * mr99),
        cf50 / (2.0 * cr50),
        cf99 / (2.0 * cr99)
    );
    println!(
        "| idem first call / (2 × no-op script round trip): the floor of one script per transition | {:.2} | {:.2} | {:.2} | {:.2} | |",
        mf50 / (2.0 * mn50),
        mf99 / (2.0 * mn99),
        cf50 / (2.0 * cn50),
        cf99 / (2.0 * cn99)
    );
    println!(
        "| the least scripts / (2 × raw round trip): the goal's reach for any design with one script per transition | {:.2} | {:.2} | {:.2} | {:.2} | |",
        ml50 / (2.0 * mr50),
        ml99 / (2.0 * mr99),
        cl50 / (2.0 * cr50),
        cl99 / (2.0 * cr99)
    );
    println!(
        "| idem first call / the least scripts: what idem adds over that floor | {:.2} | {:.2} | {:.2} | {:.2} | ≤ 1.10 |",
        mf50 / ml50,
        mf99 / ml99,
        cf50 / cl50,
        cf99 / cl99
    );
    println!(
        "| idem first call / the least scripts as functions | {:.2} | {:.2} | {:.2} | {:.2} | |",
        mf50 / mg50,
        mf99 / mg99,
        cf50 / cg50,
        cf99 / cg99
    );
    if let Some((q50, q99, s50, s99)) = peer {
        println!(
            "| Powertools first call / idem first call | {:.2} | {:.2} | {:.2} | {:.2} | ≥ 1.8 |",
            q50 / mf50,
            q99 / mf99,
            q50 / cf50,
            q99 / cf99
        );
        println!(
            "| Powertools replay / idem replay | {:.2} | {:.2} | {:.2} | {:.2} | ≥ 3.5 |",
            s50 / mp50,
            s99 / mp99,
            s50 / cp50,
            s99 / cp99
        );
    }
    println!("load average at end: {}", common::load());
}
