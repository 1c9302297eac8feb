//! A child process for the fault tests (`tests/store_faults.rs`): it runs one
//! charge operation through the [`Executor`] on a durable store, with a
//! processor stub that appends one line per invocation to a file (`O_APPEND`,
//! fsync'd), so the parent can count invocations across processes and kills.
//!
//! ```text
//! store_worker race  <store> <invocations-file> <start-at-unix-ms> <calls>
//! store_worker hang  <store> <invocations-file>
//! ```
//!
//! `<store>` is `sqlite:<path>` or `postgres:<schema>:<url>`. `race` waits
//! until the start instant, fires `<calls>` concurrent calls and prints one
//! line per call: the answer's kind and reference. `hang` claims the call,
//! records the invocation, prints `IN_HANDLER <reference>` and sleeps until
//! it is killed.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, IdempotencyStore, PostgresStore, SqliteStore, ToolError,
};
use serde::{Deserialize, Serialize};

/// The charge every worker submits: the same operation in every process.
#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    card: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    processor_reference: String,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (role, store, file) = (args[1].as_str(), open(&args[2]).await, args[3].clone());
    let executor = Executor::new(store).with_lease(lease());
    match role {
        "race" => {
            let start: u64 = args[4].parse().unwrap();
            let calls: usize = args[5].parse().unwrap();
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            tokio::time::sleep(Duration::from_millis(start).saturating_sub(now)).await;
            let tasks: Vec<_> = (0..calls)
                .map(|_| {
                    let (executor, file) = (executor.clone(), file.clone());
                    tokio::spawn(async move {
                        charge(&executor, move |ctx| async move {
                            record_invocation(&file, &ctx);
                            // Long enough for every other call to find it running.
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            Ok(receipt(&ctx))
                        })
                        .await
                    })
                })
                .collect();
            let mut out = std::io::stdout().lock();
            for task in tasks {
                writeln!(out, "{}", task.await.unwrap()).unwrap();
            }
        }
        "hang" => {
            charge(&executor, move |ctx| async move {
                record_invocation(&file, &ctx);
                println!("IN_HANDLER {}", ctx.reference());
                std::io::stdout().flush().unwrap();
                std::future::pending::<()>().await;
                Ok(receipt(&ctx))
            })
            .await;
            unreachable!("the hanging handler returned");
        }
        other => panic!("unknown role {other}"),
    }
}

/// The lease the workers' executor uses (`IDEM_WORKER_LEASE_MS`, default 30 s).
fn lease() -> Duration {
    let ms = std::env::var("IDEM_WORKER_LEASE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    Duration::from_millis(ms)
}

async fn open(spec: &str) -> Arc<dyn IdempotencyStore> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        Arc::new(SqliteStore::open(path).await.unwrap())
    } else if let Some(rest) = spec.strip_prefix("postgres:") {
        let (schema, url) = rest.split_once(':').unwrap();
        let store = PostgresStore::builder(url)
            .unwrap()
            .schema(schema)
            .build()
            .unwrap();
        Arc::new(store)
    } else {
        panic!("unknown store {spec}")
    }
}

/// The one operation: alice charges 1999 cents to one card.
async fn charge<F, Fut>(executor: &Executor, handler: F) -> String
where
    F: FnOnce(OperationContext) -> Fut,
    Fut: std::future::Future<Output = Result<Receipt, ToolError>>,
{
    let caller = Caller::new("acme", "alice");
    let args = Charge {
        card: "tok_visa".into(),
        amount_cents: 1999,
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
            handler,
        )
        .await;
    let reference = answer
        .reference()
        .map(|r| r.to_string())
        .unwrap_or_default();
    format!("{} {reference}", answer.name())
}

/// The processor's own durable log: one line per charge, appended and synced
/// before the charge "happens", so a kill cannot lose it.
fn record_invocation(file: &str, ctx: &OperationContext) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(file)
        .unwrap();
    writeln!(f, "{} {}", ctx.reference(), std::process::id()).unwrap();
    f.sync_all().unwrap();
}

fn receipt(ctx: &OperationContext) -> Receipt {
    Receipt {
        charge_id: format!("ch_{}", std::process::id()),
        processor_reference: ctx.reference().to_string(),
    }
}
