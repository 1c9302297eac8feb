//! Bytes per stored record on each durable store, and beside AWS Lambda
//! Powertools' Redis idempotency on the same Redis (issue 37).
//!
//! Each side makes `RECORDS` first calls, each a new operation completed by
//! a no-op handler, and the store's growth is divided by `RECORDS`. The
//! arguments and the response have the same shape on both sides of the
//! Redis comparison (`scripts/peer-redis-powertools.py`'s `fill` mode): a
//! card of `c_` and 32 hex digits, an amount and a currency; the response
//! `{"receipt": "r_<card>", "amount_cents": 1999}`.
//!
//! - SQLite: the database file (and its write-ahead log, if any) once the
//!   store is closed, against the same file freshly migrated.
//! - PostgreSQL (`IDEM_TEST_DATABASE_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/test`): `pg_total_relation_size`
//!   of the schema's tables (heap, TOAST and indexes) in a fresh schema, as
//!   written (with the completions' dead row versions not yet vacuumed) and
//!   after `VACUUM FULL`.
//! - Redis (`IDEM_BENCH_REDIS_URL`, then `IDEM_TEST_REDIS_URL`, then
//!   `redis://127.0.0.1:6379`): `used_memory` of `INFO memory` before and
//!   after, on a server nothing else writes to meanwhile: the keys, the
//!   sorted-set indexes and the server's dictionaries, everything a record
//!   costs. Powertools fills the same count the same way when
//!   `IDEM_PEER_PYTHON` and `IDEM_PEER_SCRIPT` name its side
//!   (`scripts/peer-redis` sets them).
//!
//! MemoryStore's heap per record is `cargo bench --bench memory`'s;
//! DynamoDB's item size is `scripts/peer-dynamodb`'s.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{Attempt, IdempotencyStore};
use idem_runtime::{
    executor::{Operation, ScopeSpec},
    Caller, Executor, PostgresStore, RedisStore, SqliteStore, ToolError,
};
use serde::{Deserialize, Serialize};

/// Records written per store.
const RECORDS: usize = 20_000;

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

/// `n` first calls through an executor over `store`, concurrently eight at
/// a time; every one must run its handler.
async fn fill(store: Arc<dyn IdempotencyStore>, n: usize) {
    let executor = Arc::new(Executor::new(store));
    let caller = Arc::new(Caller::new("acme", "alice"));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (executor, caller) = (executor.clone(), caller.clone());
            tokio::spawn(async move {
                for i in (t..n).step_by(8) {
                    let card = format!(
                        "c_{:032x}",
                        (Attempt::random().get() as u128) << 64 | i as u128
                    );
                    let args = Charge {
                        card: card.clone(),
                        amount_cents: 1999,
                        currency: "usd",
                    };
                    let answer = executor
                        .run(
                            Operation {
                                caller: &caller,
                                tool: "charge_card",
                                args: &args,
                                scope: ScopeSpec::Window(Duration::from_secs(900)),
                                status_tool: "get_operation_status",
                            },
                            |_| async move {
                                Ok::<_, ToolError>(Receipt {
                                    receipt: format!("r_{card}"),
                                    amount_cents: 1999,
                                })
                            },
                        )
                        .await;
                    assert_eq!(answer.name(), "executed", "{answer:?}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

fn per_record(before: u64, after: u64) -> f64 {
    after.saturating_sub(before) as f64 / RECORDS as f64
}

fn file_bytes(path: &std::path::Path) -> u64 {
    let len = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    len(path.to_path_buf()) + len(path.with_extension("sqlite3-wal"))
}

async fn sqlite() {
    let dir = std::env::temp_dir().join(format!("idem-bytes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bytes.sqlite3");
    drop(SqliteStore::open(&path).await.unwrap());
    let before = file_bytes(&path);
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    fill(store.clone(), RECORDS).await;
    drop(store);
    // The store's connections close on their own threads.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = file_bytes(&path);
    println!(
        "| SQLite (`SqliteStore`) | file, once closed | {:.0} |",
        per_record(before, after)
    );
    std::fs::remove_dir_all(&dir).ok();
}

async fn schema_bytes(url: &str, schema: &str) -> u64 {
    let rows = common::sql(
        url,
        &format!(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8 \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = '{schema}' AND c.relkind = 'r'"
        ),
    )
    .await;
    rows[0].get::<_, i64>(0) as u64
}

async fn postgres() {
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bytes_{:016x}", Attempt::random().get());
    let store = Arc::new(
        PostgresStore::builder(&url)
            .unwrap()
            .schema(&schema)
            .build()
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let before = schema_bytes(&url, &schema).await;
    fill(store.clone(), RECORDS).await;
    let written = schema_bytes(&url, &schema).await;
    for table in common::sql(
        &url,
        &format!("SELECT tablename::text FROM pg_tables WHERE schemaname = '{schema}'"),
    )
    .await
    {
        let table: String = table.get(0);
        common::sql(&url, &format!("VACUUM FULL {schema}.{table}")).await;
    }
    let packed = schema_bytes(&url, &schema).await;
    println!(
        "| PostgreSQL (`PostgresStore`) | tables, TOAST and indexes, as written | {:.0} |",
        per_record(before, written)
    );
    println!(
        "| PostgreSQL (`PostgresStore`) | the same after `VACUUM FULL` | {:.0} |",
        per_record(before, packed)
    );
    common::sql(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory")
}

/// Deletes every key matching `pattern`.
fn delete_matching(conn: &mut redis::Connection, pattern: &str) {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query(conn).unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

async fn redis_side() {
    let url = std::env::var("IDEM_BENCH_REDIS_URL")
        .or_else(|_| std::env::var("IDEM_TEST_REDIS_URL"))
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let prefix = format!("bytes-{:016x}", Attempt::random().get());
    let store = RedisStore::builder(&url)
        .unwrap()
        .prefix(&prefix)
        .build()
        .unwrap();
    let store: Arc<dyn IdempotencyStore> = Arc::new(store);
    // First, the library loaded and the index keys made.
    fill(store.clone(), 8).await;
    let before = used_memory(&mut conn);
    fill(store, RECORDS).await;
    let after = used_memory(&mut conn);
    println!(
        "| Redis (`RedisStore`) | `used_memory` | {:.0} |",
        per_record(before, after)
    );
    delete_matching(&mut conn, &format!("{prefix}:*"));

    let (Ok(python), Ok(script)) = (
        std::env::var("IDEM_PEER_PYTHON"),
        std::env::var("IDEM_PEER_SCRIPT"),
    ) else {
        println!("(Powertools' side left out: IDEM_PEER_PYTHON and IDEM_PEER_SCRIPT are not set; scripts/peer-redis sets them)");
        return;
    };
    let (host, port) = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        other => panic!("the peer run needs a TCP address, not {other:?}"),
    };
    let before = used_memory(&mut conn);
    let out = Command::new(python)
        .arg(script)
        .arg(&host)
        .arg(port.to_string())
        .arg(RECORDS.to_string())
        .arg("fill")
        .output()
        .expect("the Python side starts");
    assert!(
        out.status.success(),
        "the Python side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = used_memory(&mut conn);
    let filled: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the Python side prints JSON");
    assert_eq!(filled["handler_calls"], RECORDS, "{filled}");
    println!(
        "| Redis (Powertools {}) | `used_memory` | {:.0} |",
        filled["version"].as_str().unwrap_or("?"),
        per_record(before, after)
    );
    let pattern = filled["pattern"].as_str().expect("the keys' pattern");
    delete_matching(&mut conn, pattern);
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    println!("{RECORDS} COMPLETED records per store (15-minute window, 48-hour retention)");
    println!();
    println!("| store | measured | bytes per record |");
    println!("| --- | --- | ---: |");
    sqlite().await;
    postgres().await;
    redis_side().await;
}
