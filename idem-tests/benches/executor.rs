//! What idem adds to a call: a full call on MemoryStore (key, claim, no-op
//! handler, complete) beside the bare no-op handler, in the same run; and
//! throughput with one task against two, beside the same for the bare call
//! (the floor: what a second worker gives on this machine).
//!
//! `cargo bench --bench executor`
//!
//! For instruction counts, which do not move with the machine's load:
//! `IDEM_BENCH_ONLY=bare|wrapped IDEM_BENCH_CALLS=N` runs N calls of one
//! side on a current-thread runtime instead of criterion, so that
//! `valgrind --tool=callgrind target/release/deps/executor-<hash>` of each
//! side, subtracted and divided by N, gives what idem adds per call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, Criterion, Throughput};
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    Caller, Executor, MemoryStore, ToolError,
};
use serde::Serialize;

#[derive(Serialize)]
struct ChargeArgs<'a> {
    card: &'a str,
    amount_cents: u64,
    currency: &'a str,
    note: &'a str,
}

fn args(n: u64) -> ChargeArgs<'static> {
    ChargeArgs {
        card: "4242424242424242",
        amount_cents: n,
        currency: "usd",
        note: "order 1234, two items",
    }
}

async fn noop(n: u64) -> Result<u64, ToolError> {
    Ok(black_box(n))
}

async fn full_call(exec: &Executor, caller: &Caller, n: u64) -> u64 {
    let a = args(n);
    let op = Operation {
        caller,
        tool: "charge_card",
        args: &a,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    match exec.run(op, move |_| noop(n)).await {
        Answer::Executed { value, .. } => value,
        other => panic!("every call is a new operation: {other:?}"),
    }
}

async fn bare_call(n: u64) -> u64 {
    // The same argument value is built and serialized, as a tool would.
    let v = serde_json::to_value(args(n)).unwrap();
    black_box(&v);
    noop(n).await.unwrap()
}

/// Spawns `tasks` tasks, task `t` being `task(t)`, on a 2-worker runtime
/// and returns the wall time until all have ended.
fn on_tasks<F, Fut>(rt: &tokio::runtime::Runtime, tasks: u64, task: F) -> Duration
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(task(t))).collect();
        for h in handles {
            h.await.unwrap();
        }
        start.elapsed()
    })
}

/// Runs `iters` bare calls split over `tasks` tasks: the floor of the
/// scaling, what two workers give a call that shares nothing (the 2 cores
/// may be one core's two hardware threads).
fn bare_calls_on_tasks(rt: &tokio::runtime::Runtime, tasks: u64, iters: u64) -> Duration {
    on_tasks(rt, tasks, |t| async move {
        let mut i = t;
        while i < iters {
            black_box(bare_call(i).await);
            i += tasks;
        }
    })
}

/// Runs `iters` calls split over `tasks` tasks, on a fresh store.
fn calls_on_tasks(rt: &tokio::runtime::Runtime, tasks: u64, iters: u64) -> Duration {
    let exec = Executor::new(Arc::new(MemoryStore::new()));
    let caller = Caller::new("acme", "alice");
    on_tasks(rt, tasks, |t| {
        let (exec, caller) = (exec.clone(), caller.clone());
        async move {
            let mut i = t;
            while i < iters {
                full_call(&exec, &caller, i).await;
                i += tasks;
            }
        }
    })
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("call");
    // Both loops run inside one `block_on`, so neither pays the runtime's
    // entry per call.
    g.bench_function("bare_noop_handler", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                for n in 0..iters {
                    black_box(bare_call(n).await);
                }
            });
            start.elapsed()
        })
    });
    g.bench_function("idem_memory_store", |b| {
        // A fresh store per sample keeps the map's size (and so the cost of a
        // claim) the same from sample to sample; every call is a new key.
        b.iter_custom(|iters| {
            let exec = Executor::new(Arc::new(MemoryStore::new()));
            let caller = Caller::new("acme", "alice");
            let start = Instant::now();
            rt.block_on(async {
                for n in 0..iters {
                    full_call(&exec, &caller, n).await;
                }
            });
            start.elapsed()
        })
    });
    g.finish();
}

fn scaling(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("throughput");
    g.throughput(Throughput::Elements(1));
    for tasks in [1u64, 2] {
        g.bench_function(format!("{tasks}_task"), |b| {
            b.iter_custom(|iters| calls_on_tasks(&rt, tasks, iters))
        });
        g.bench_function(format!("bare_{tasks}_task"), |b| {
            b.iter_custom(|iters| bare_calls_on_tasks(&rt, tasks, iters))
        });
    }
    g.finish();
}

/// `IDEM_BENCH_ONLY=bare|wrapped IDEM_BENCH_CALLS=N`: N calls of one side,
/// for callgrind. Returns false when the variables are not set.
fn instructions_only() -> bool {
    let (Ok(only), Ok(calls)) = (
        std::env::var("IDEM_BENCH_ONLY"),
        std::env::var("IDEM_BENCH_CALLS"),
    ) else {
        return false;
    };
    let calls: u64 = calls
        .parse()
        .expect("IDEM_BENCH_CALLS is a number of calls");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let exec = Executor::new(Arc::new(MemoryStore::new()));
    let caller = Caller::new("acme", "alice");
    rt.block_on(async {
        match only.as_str() {
            "bare" => {
                for n in 0..calls {
                    black_box(bare_call(n).await);
                }
            }
            "wrapped" => {
                for n in 0..calls {
                    black_box(full_call(&exec, &caller, n).await);
                }
            }
            other => panic!("IDEM_BENCH_ONLY is bare or wrapped, not {other:?}"),
        }
    });
    println!("{calls} {only} calls");
    true
}

criterion_group!(benches, overhead, scaling);

fn main() {
    if instructions_only() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
