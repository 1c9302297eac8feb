//! idem's side of the DynamoDB peer run (scripts/peer-dynamodb): the
//! executor on a DynamoDbStore, through the run's counting proxy, making
//! the calls Powertools makes on the other side, and reporting what each
//! cost in requests by the proxy's count.
//!
//!   peer_dynamodb ENDPOINT COUNTS_URL TABLE CALLS [CACHE_BYTES]
//!
//! Prints one JSON object: for each path (`first`, `replay`, `in_progress`
//! from another executor, `in_progress_same` from the executor whose
//! handler runs), the requests of each call by operation and the capacity
//! units the proxy counted for them (`WCU`, `RCU`), and `handler_runs`.
//! With `CACHE_BYTES` above 0 the executors have a replay cache of that
//! size ([`Executor::with_replay_cache`]). The run's instrument, not an
//! example.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    Caller, DynamoDbStore, Executor, ToolError,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    receipt: String,
    amount_cents: u64,
}

/// The proxy's counts so far, by operation.
fn counts(url: &str) -> Map<String, Value> {
    let rest = url.strip_prefix("http://").expect("an http:// counts URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut conn = std::net::TcpStream::connect(host).expect("the proxy answers");
    write!(
        conn,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    let body = reply.split_once("\r\n\r\n").expect("a body").1;
    match serde_json::from_str(body).expect("JSON counts") {
        Value::Object(map) => map,
        other => panic!("counts: {other}"),
    }
}

/// What was sent between two snapshots (requests are counted in whole
/// numbers, capacity units in halves).
fn diff(before: &Map<String, Value>, after: &Map<String, Value>) -> Value {
    let n = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    Value::Object(
        after
            .keys()
            .filter(|k| n(after, k) != n(before, k))
            .map(|k| (k.clone(), json!(n(after, k) - n(before, k))))
            .collect(),
    )
}

/// The requests `work` sent, which must answer `expect`.
async fn measured(
    counts_url: &str,
    work: impl std::future::Future<Output = Answer<Receipt, ToolError>>,
    expect: &str,
) -> Value {
    let before = counts(counts_url);
    let answer = work.await;
    assert_eq!(answer.name(), expect, "{answer:?}");
    diff(&before, &counts(counts_url))
}

fn client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "peer"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

fn fresh() -> Value {
    json!({
        "card": format!("c_{:016x}{:016x}", rand(), rand()),
        "amount_cents": 1999,
        "currency": "usd",
    })
}

fn rand() -> u64 {
    idem_runtime::store::Attempt::random().get()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let (endpoint, counts_url, table, calls, cache) = match argv.as_slice() {
        [_, e, u, t, c] => (e, u, t, c, "0"),
        [_, e, u, t, c, b] => (e, u, t, c, b.as_str()),
        _ => {
            eprintln!("usage: peer_dynamodb ENDPOINT COUNTS_URL TABLE CALLS [CACHE_BYTES]");
            std::process::exit(2);
        }
    };
    let calls: usize = calls.parse().expect("CALLS is a number");
    let cache: usize = cache.parse().expect("CACHE_BYTES is a number");
    let store = DynamoDbStore::builder(client(endpoint), table.as_str())
        .build()
        .unwrap();
    store.create_table().await.unwrap();
    let store = Arc::new(store);
    // Two instances on one table, as two Lambdas would be.
    let executor = || {
        let executor = Executor::new(store.clone());
        if cache > 0 {
            executor.with_replay_cache(cache)
        } else {
            executor
        }
    };
    let (one, other) = (executor(), executor());
    let caller = Caller::new("acme", "alice");
    let runs = Arc::new(AtomicUsize::new(0));
    let hold = Arc::new(tokio::sync::Notify::new());

    let run = |executor: Executor, args: Value, held: bool| {
        let (caller, runs, hold) = (caller.clone(), runs.clone(), hold.clone());
        let receipt = format!("r_{}", args["card"].as_str().unwrap_or_default());
        async move {
            executor
                .run(
                    Operation {
                        caller: &caller,
                        tool: "charge",
                        args: &args,
                        scope: ScopeSpec::Window(Duration::from_secs(900)),
                        status_tool: "get_operation_status",
                    },
                    |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        if held {
                            hold.notified().await;
                        }
                        Ok::<_, ToolError>(Receipt {
                            receipt,
                            amount_cents: 1999,
                        })
                    },
                )
                .await
        }
    };
    // The client's first connection, not measured.
    run(one.clone(), fresh(), false).await;
    let args: Vec<Value> = (0..calls).map(|_| fresh()).collect();
    let (mut first, mut replay) = (Vec::new(), Vec::new());
    for a in &args {
        first.push(measured(counts_url, run(one.clone(), a.clone(), false), "executed").await);
    }
    for a in &args {
        replay.push(measured(counts_url, run(one.clone(), a.clone(), false), "replayed").await);
    }
    let (mut in_progress, mut in_progress_same) = (Vec::new(), Vec::new());
    for _ in 0..calls.min(20) {
        let held = fresh();
        let running = tokio::spawn(run(one.clone(), held.clone(), true));
        tokio::time::sleep(Duration::from_millis(200)).await;
        in_progress.push(
            measured(
                counts_url,
                run(other.clone(), held.clone(), false),
                "in_progress",
            )
            .await,
        );
        in_progress_same.push(
            measured(
                counts_url,
                run(one.clone(), held.clone(), false),
                "in_progress",
            )
            .await,
        );
        hold.notify_one();
        assert_eq!(running.await.unwrap().name(), "executed");
    }
    // What the calls leave to maintenance, once their leases ended: one
    // round of the sweep and of the purge, per record written.
    tokio::time::sleep(idem_runtime::executor::DEFAULT_LEASE + Duration::from_secs(1)).await;
    let records = (calls + calls.min(20) + 1) as f64;
    let before = counts(counts_url);
    let swept = idem_runtime::maintenance::sweep(&*store, 10_000)
        .await
        .unwrap();
    let purged = idem_runtime::store::Upkeep::purge_expired(&*store, 1_000)
        .await
        .unwrap();
    assert_eq!(
        (swept, purged),
        (0, 0),
        "every call completed, in its retention"
    );
    let maintenance: Map<String, Value> = match diff(&before, &counts(counts_url)) {
        Value::Object(spent) => spent
            .into_iter()
            .map(|(k, v)| (k, json!(v.as_f64().unwrap_or(0.0) / records)))
            .collect(),
        _ => Map::new(),
    };
    println!(
        "{}",
        json!({
            "maintenance": maintenance,
            "first": first,
            "replay": replay,
            "in_progress": in_progress,
            "in_progress_same": in_progress_same,
            "handler_runs": runs.load(Ordering::SeqCst),
        })
    );
}
