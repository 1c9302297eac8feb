//! Replays with the replay cache off and on (`Executor::with_replay_cache`),
//! on each store, in one process: the latency of a repeat of a completed
//! call, and how many store calls it makes, counted by a wrapper around the
//! store. The two sides alternate repeat by repeat, so the ratio holds on a
//! noisy machine. Then a retry storm: 1,000 identical repeats at once on
//! the replica that answered the first call, and the store calls they make.
//!
//! `cargo bench --bench replay_cache` (memory and SQLite; PostgreSQL with
//! `IDEM_TEST_DATABASE_URL`, Redis with `IDEM_TEST_REDIS_URL`;
//! `IDEM_BENCH_REPEATS` sets the repeats per side, 2,000 by default).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use idem_runtime::store::conformance::{Fault, FaultyStore};
use idem_runtime::{answer::Answer, open_store, Caller, Executor, IdempotencyStore};

/// One call of `amount` through `exec`; whether it was replayed.
async fn call(exec: &Executor, caller: &Caller, amount: u64) -> bool {
    match common::charge(exec, caller, amount).await {
        Answer::Replayed { .. } => true,
        Answer::Executed { .. } => false,
        other => panic!("a call is executed or replayed: {other:?}"),
    }
}

/// `store`, with every call counted.
fn counted(store: Arc<dyn IdempotencyStore>) -> (Arc<dyn IdempotencyStore>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let store = FaultyStore::new(store, move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        Fault::None
    });
    (Arc::new(store), calls)
}

async fn run(name: &str, url: &str, repeats: usize) {
    let store = match open_store(url).await {
        Ok(store) => store,
        Err(e) => {
            println!("| {name} | could not open {url}: {e} | | | | |");
            return;
        }
    };
    let caller = Caller::new(format!("bench-{}", std::process::id()), "alice");
    let (off_store, off_calls) = counted(store.clone());
    let (on_store, on_calls) = counted(store.clone());
    let off = Executor::new(off_store);
    let on = Executor::new(on_store).with_replay_cache(16 << 20);
    // The completed operations: one per side, so each side's first repeat
    // finds its own (the cache side's first call fills its cache).
    let amount = std::process::id() as u64 * 1_000;
    assert!(!call(&off, &caller, amount).await);
    assert!(!call(&on, &caller, amount + 1).await);
    let (off_before, on_before) = (
        off_calls.load(Ordering::Relaxed),
        on_calls.load(Ordering::Relaxed),
    );
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let started = Instant::now();
        assert!(call(&off, &caller, amount).await);
        t_off.push(started.elapsed());
        let started = Instant::now();
        assert!(call(&on, &caller, amount + 1).await);
        t_on.push(started.elapsed());
    }
    let per = |calls: &AtomicUsize, before: usize| {
        (calls.load(Ordering::Relaxed) - before) as f64 / repeats as f64
    };
    let (off_per, on_per) = (per(&off_calls, off_before), per(&on_calls, on_before));
    let (off50, off99) = common::median_p99(&mut t_off);
    let (on50, on99) = common::median_p99(&mut t_on);
    println!(
        "| {name} | {off50:.1} / {off99:.1} | {on50:.1} / {on99:.1} | {:.1} | {off_per:.2} | {on_per:.2} |",
        off50 / on50
    );
    // The retry storm: 1,000 identical repeats at once.
    let before = on_calls.load(Ordering::Relaxed);
    let storm: Vec<_> = (0..1000)
        .map(|_| {
            let (on, caller) = (on.clone(), caller.clone());
            tokio::spawn(async move { call(&on, &caller, amount + 1).await })
        })
        .collect();
    for repeat in storm {
        assert!(repeat.await.expect("a repeat"), "replayed");
    }
    println!(
        "|   {name}, 1,000 repeats at once, cache on | | | | | {} store calls |",
        on_calls.load(Ordering::Relaxed) - before
    );
}

fn main() {
    let repeats = std::env::var("IDEM_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = std::env::temp_dir().join(format!("idem-replay-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let sqlite = format!("sqlite:{}", dir.join("replays.db").display());
    let mut stores = vec![
        ("memory".to_owned(), "memory".to_owned()),
        ("SQLite".to_owned(), sqlite),
    ];
    if let Ok(url) = std::env::var("IDEM_TEST_DATABASE_URL") {
        let sep = if url.contains('?') { '&' } else { '?' };
        stores.push(("PostgreSQL".to_owned(), format!("{url}{sep}migrate=true")));
    }
    if let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") {
        stores.push(("Redis".to_owned(), url));
    }
    println!("load: {}", common::load());
    println!("| store | replay, cache off: p50 / p99 µs | cache on: p50 / p99 µs | p50 off / on | store calls per replay, off | on |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    rt.block_on(async {
        for (name, url) in &stores {
            run(name, url, repeats).await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
