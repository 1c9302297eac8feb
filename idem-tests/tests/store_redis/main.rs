//! RedisStore: the conformance suite, what only Redis has (server time,
//! native expiry, the key layout), the durability option, races between
//! separate clients, and faults on servers of the tests' own: a restart
//! mid-run, CLIENT PAUSE, connections killed. The shared-server cases need
//! `IDEM_TEST_REDIS_URL`; the fault cases start `redis-server` themselves.
//!
//! One test binary: here the conformance suite, configuration, separate
//! clients racing and what the cases share; `records` holds what only Redis
//! has, `faults` the durability option and the servers' faults, `library`
//! the Functions library's loading, `upgrades` what earlier versions left,
//! `by_reference` a reference found in any tenant, `late_claims` a claim
//! the server applies after the store gave up on it.

#[path = "../durable/mod.rs"]
mod durable;
#[path = "../redis_server/mod.rs"]
mod redis_server;
#[path = "../rolling/mod.rs"]
mod rolling;

mod by_reference;
mod earlier;
mod faults;
mod late_claims;
mod library;
mod records;
#[path = "rolling.rs"]
mod rolling_deploy;
mod upgrades;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    key::IdempotencyKey,
    store::conformance,
    Caller, Executor, RedisStore, StoreError, ToolError,
};
use redis_server::{command, Prefixed};

// Each case under a fresh key prefix of its own, deleted at the end.
idem_runtime::conformance_tests!(Prefixed::new().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    conformance::run_all(&redis.store).await;
}

/// Configuration mistakes are `Config`, and never echo a password.
#[test]
fn bad_configuration_is_refused() {
    let err = RedisStore::builder("http://user:secret@host").unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
    let err = RedisStore::builder("redis://127.0.0.1")
        .unwrap()
        .prefix("a{b}")
        .build()
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    let no_nodes: [&str; 0] = [];
    assert!(matches!(
        RedisStore::cluster_builder(no_nodes),
        Err(StoreError::Config(_))
    ));
}

/// Four clients (a connection each), eight tasks on each, one operation at
/// once: the handler runs once; the other calls are told it is in progress,
/// or replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_clients_racing_charge_once() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let executors: Vec<Executor> = (0..4)
        .map(|_| {
            let store = RedisStore::builder(&redis.store_url)
                .unwrap()
                .prefix(&redis.prefix)
                .build()
                .unwrap();
            Executor::new(Arc::new(store))
        })
        .collect();
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (executor, runs) = (executors[i % 4].clone(), runs.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start).await;
                charge(&executor, 1999, &runs).await.name()
            })
        })
        .collect();
    let mut kinds = Vec::new();
    for t in tasks {
        kinds.push(t.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "executed").count(), 1);
    assert!(
        kinds
            .iter()
            .all(|k| ["executed", "in_progress", "replayed"].contains(k)),
        "{kinds:?}"
    );
}

/// The server's clock in microseconds.
async fn server_time(url: &str) -> SystemTime {
    let (secs, micros): (u64, u64) = command(url, &redis::cmd("TIME")).await;
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// The record's key, as the store names it (see the layout's table).
fn record_key(prefix: &str, key: &IdempotencyKey) -> String {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    // Under the key's first eight bytes, which every reference of it starts
    // with.
    let prefix8 = &key.as_bytes()[..8];
    format!("{prefix}:{{{:02x}}}:r:{}", prefix8[0] % 64, hex(prefix8))
}

/// When Redis will delete a key, in ms since the epoch.
async fn expire_time(url: &str, key: &str) -> i64 {
    command(url, redis::cmd("PEXPIRETIME").arg(key)).await
}

fn ms_ceil(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
        .div_ceil(1000) as i64
}

/// The libraries a server holds, by name (`FUNCTION LIST`).
async fn libraries(url: &str) -> Vec<String> {
    let listed: Vec<redis::Value> = command(url, redis::cmd("FUNCTION").arg("LIST")).await;
    listed
        .iter()
        .filter_map(|library| match library {
            // RESP2: a flat list of field names and values.
            redis::Value::Array(fields) => fields
                .chunks(2)
                .find(|kv| matches!(&kv[0], redis::Value::BulkString(k) if k == b"library_name"))
                .and_then(|kv| match &kv[1] {
                    redis::Value::BulkString(name) => String::from_utf8(name.clone()).ok(),
                    _ => None,
                }),
            _ => None,
        })
        .collect()
}

/// The operation of the executor tests: a charge with a counting handler.
async fn charge(
    executor: &Executor,
    amount_cents: u64,
    runs: &AtomicUsize,
) -> Answer<u64, ToolError> {
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({ "card": "tok_visa", "amount_cents": amount_cents });
    executor
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(amount_cents)
            },
        )
        .await
}

/// Repeats `charge` until it executes (answers in between must say the
/// store is away, or, for a claim that landed but never ran, that it is in
/// progress until released), within `within`.
async fn until_executed(
    executor: &Executor,
    amount_cents: u64,
    runs: &AtomicUsize,
    within: Duration,
) {
    let started = Instant::now();
    loop {
        let answer = charge(executor, amount_cents, runs).await;
        match answer.name() {
            "executed" => return,
            "store_unavailable" | "in_progress" => {}
            _ => panic!("{answer:?}"),
        }
        assert!(
            started.elapsed() < within,
            "still {answer:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
