//! SqliteStore: calls per second (one claim plus one completion per call) at
//! concurrency 1 and 8, on a file in the temporary directory.
//!
//! `cargo bench --bench store_sqlite`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{store::Claim, IdempotencyStore, SqliteStore};

async fn run(store: Arc<SqliteStore>, concurrency: usize, per_task: usize) -> (f64, f64, f64) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let req = common::request();
                    let t = Instant::now();
                    assert!(matches!(
                        store.claim(&req).await.unwrap(),
                        Claim::Claimed { .. }
                    ));
                    store
                        .complete(&req.key, req.attempt, common::RESPONSE)
                        .await
                        .unwrap();
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    let (median, p99) = common::median_p99(&mut lat);
    (rate, median, p99)
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Arc::new(SqliteStore::open(dir.join("bench.sqlite3")).await.unwrap());
    // Warm up: the file, the page cache, the statement cache.
    run(store.clone(), 8, 200).await;
    println!("SqliteStore, one claim + one completion per call (synchronous = FULL, WAL)");
    println!("| concurrency | calls | calls/s | median µs | p99 µs |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for (concurrency, per_task) in [(1, 3000), (8, 1500)] {
        let (rate, median, p99) = run(store.clone(), concurrency, per_task).await;
        println!(
            "| {concurrency} | {} | {rate:.0} | {median:.0} | {p99:.0} |",
            concurrency * per_task
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average at end: {}", common::load());
}
