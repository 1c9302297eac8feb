//! The outbox: a completion with 0 against 2 follow-on jobs (same run,
//! interleaved rounds, as a ratio), and dispatch throughput with 1 and 2
//! dispatchers, on SQLite and MemoryStore. Each store is one function call
//! below, so a store of its own (PostgreSQL) adds one line.
//!
//! `cargo bench --bench outbox`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    job_fn, Claim, FollowOn, IdempotencyStore, JobFilter, JobHandlers, MemoryStore, Outbox,
    OutboxConfig, SqliteStore,
};

/// `calls` claims, each completed with `jobs`, 8 at a time: calls per second.
async fn completions(store: Arc<dyn IdempotencyStore>, jobs: &[FollowOn], calls: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, jobs) = (store.clone(), jobs.to_vec());
            tokio::spawn(async move {
                for _ in 0..calls / 8 {
                    let req = common::request();
                    assert_eq!(store.claim(&req).await.unwrap(), Claim::Claimed);
                    store
                        .complete_with_follow_ons(&req.key, req.attempt, common::RESPONSE, &jobs)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    calls as f64 / started.elapsed().as_secs_f64()
}

async fn live_jobs(store: &dyn IdempotencyStore) -> usize {
    store
        .list_jobs(&JobFilter {
            dead: Some(false),
            limit: usize::MAX >> 1,
            ..JobFilter::default()
        })
        .await
        .unwrap()
        .len()
}

/// Enqueues `jobs` jobs, then runs `dispatchers` dispatchers (a handler
/// that does nothing) until none is left: jobs per second.
async fn dispatch(stores: &[Arc<dyn IdempotencyStore>], dispatchers: usize, jobs: usize) -> f64 {
    let receipt =
        [FollowOn::new("send_receipt", &serde_json::json!({"to": "a@example.com"})).unwrap()];
    completions(stores[0].clone(), &receipt, jobs).await;
    let config = OutboxConfig {
        interval: Duration::from_millis(1),
        batch: 64,
        ..OutboxConfig::default()
    };
    let started = Instant::now();
    let running: Vec<Outbox> = (0..dispatchers)
        .map(|i| {
            let handlers = JobHandlers::new().on("send_receipt", job_fn(|_| async { Ok(()) }));
            Outbox::spawn(stores[i % stores.len()].clone(), handlers, config.clone())
        })
        .collect();
    while live_jobs(&*stores[0]).await > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    for outbox in running {
        outbox.stop().await;
    }
    rate
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Both figures for one store; `stores` are handles on it (one per
/// dispatcher process, for a file or a server).
async fn bench(name: &str, stores: Vec<Arc<dyn IdempotencyStore>>, calls: usize) {
    let two = [
        FollowOn::new("send_receipt", &serde_json::json!({"to": "a@example.com"})).unwrap(),
        FollowOn::new("notify_warehouse", &serde_json::json!({"order": "ord_1"})).unwrap(),
    ];
    completions(stores[0].clone(), &[], calls / 4).await; // warm up
    let (mut zero, mut with_two) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        zero.push(completions(stores[0].clone(), &[], calls).await);
        with_two.push(completions(stores[0].clone(), &two, calls).await);
    }
    // The jobs just written would be dispatched below: clear them first.
    let config = OutboxConfig {
        batch: 1000,
        ..OutboxConfig::default()
    };
    let drain = JobHandlers::new()
        .on("send_receipt", job_fn(|_| async { Ok(()) }))
        .on("notify_warehouse", job_fn(|_| async { Ok(()) }));
    while live_jobs(&*stores[0]).await > 0 {
        Outbox::round(&*stores[0], &drain, &config).await.unwrap();
    }
    let (z, t) = (median(zero), median(with_two));
    println!(
        "| {name} | completion, 0 follow-ons | {z:.0} calls/s | |\n\
         | {name} | completion, 2 follow-ons | {t:.0} calls/s | {:.2}× the time of 0 |",
        z / t
    );
    for dispatchers in [1, 2] {
        let rate = dispatch(&stores, dispatchers, calls).await;
        println!("| {name} | dispatch, {dispatchers} dispatcher(s) | {rate:.0} jobs/s | |");
    }
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    println!("| store | what | rate | ratio |");
    println!("| --- | --- | ---: | ---: |");
    let memory: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    bench("MemoryStore", vec![memory.clone(), memory], 8000).await;
    let dir = std::env::temp_dir().join(format!("idem-bench-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.sqlite3");
    let sqlite: Vec<Arc<dyn IdempotencyStore>> = vec![
        Arc::new(SqliteStore::open(&path).await.unwrap()),
        Arc::new(SqliteStore::open(&path).await.unwrap()),
    ];
    bench("SqliteStore (file, 2 handles)", sqlite, 2000).await;
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average at end: {}", common::load());
}
