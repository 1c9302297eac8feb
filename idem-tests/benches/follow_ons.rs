//! The follow-ons' cost: a completion with 0 against 2 follow-ons on
//! PostgreSQL and on SQLite, alternating call by call in the same run (only
//! the completion is timed; each call claims a fresh operation first); then
//! dispatch throughput with 1 and with 2 dispatchers on PostgreSQL, each
//! dispatcher a `FollowOnDispatcher` with its own store and pool, draining a backlog,
//! alternated round by round.
//!
//! `IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench --bench follow_ons`
//! (the variable defaults to that address). Works in a fresh schema, dropped
//! at the end, and a SQLite file in the temporary directory.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    follow_ons::{
        follow_on_fn, FollowOn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers, FollowOnRun,
    },
    store::{Attempt, Claim, FollowOnStore},
    IdempotencyStore, PostgresStore, SqliteStore,
};

/// Calls per side in the completion comparison.
const CALLS: usize = 1500;

/// One claim, then the timed completion with `jobs`.
async fn completion(store: &dyn IdempotencyStore, jobs: &[FollowOn]) -> Duration {
    let req = common::request();
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let t = Instant::now();
    store
        .follow_ons()
        .expect("the store keeps jobs")
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            common::RESPONSE,
            idem_runtime::store::FollowOns::new(jobs).unwrap(),
        )
        .await
        .unwrap();
    t.elapsed()
}

/// The two follow-ons of a charge: a receipt and a warehouse notice.
fn two_jobs() -> Vec<FollowOn> {
    vec![
        FollowOn::new(
            "send_receipt",
            &serde_json::json!({ "to": "alice@example.com", "amount_cents": 1999 }),
        )
        .unwrap(),
        FollowOn::new(
            "notify_warehouse",
            &serde_json::json!({ "order": "ord_3f9a0c1d", "items": 3 }),
        )
        .unwrap(),
    ]
}

/// 0 against 2 follow-ons, alternating call by call; prints a table row.
async fn compare(name: &str, store: &dyn IdempotencyStore, calls: usize) {
    let jobs = two_jobs();
    // Warm-up: the statements prepared, the pool filled.
    for _ in 0..50 {
        completion(store, &[]).await;
        completion(store, &jobs).await;
    }
    let (mut none, mut two) = (Vec::new(), Vec::new());
    for i in 0..calls * 2 {
        // Alternate which goes first in each pair as well.
        if (i / 2) % 2 == i % 2 {
            none.push(completion(store, &[]).await);
        } else {
            two.push(completion(store, &jobs).await);
        }
    }
    let (n50, n99) = common::median_p99(&mut none);
    let (t50, t99) = common::median_p99(&mut two);
    println!(
        "| {name} | {} | {n50:.1} | {t50:.1} | {:.2}× | {n99:.1} | {t99:.1} | {:.2}× |",
        none.len(),
        t50 / n50,
        t99 / n99
    );
}

/// Writes `n` due jobs named `send_receipt` (one per operation).
async fn backlog(store: &dyn IdempotencyStore, n: usize) {
    let job = [FollowOn::new(
        "send_receipt",
        &serde_json::json!({ "to": "a@example.com" }),
    )
    .unwrap()];
    for _ in 0..n {
        let req = common::request();
        store.claim(&req).await.unwrap();
        store
            .follow_ons()
            .expect("the store keeps jobs")
            .complete_with_follow_ons(
                &req.key,
                req.attempt,
                common::RESPONSE,
                idem_runtime::store::FollowOns::new(&job).unwrap(),
            )
            .await
            .unwrap();
    }
}

/// Drains a backlog of `n` jobs with `dispatchers` follow-on dispatchers, each
/// on a store (and pool) of its own, whose handler waits `work` (the
/// mailer's latency); returns jobs per second.
async fn drain(url: &str, dispatchers: usize, n: usize, work: Duration) -> f64 {
    // A schema of its own: only this round's jobs.
    let schema = format!("bench_{:016x}", Attempt::random().get());
    let schema = schema.as_str();
    let seed = store(url, schema);
    seed.migrate().await.unwrap();
    backlog(&seed, n).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let config = FollowOnConfig::default()
        .with_interval(Duration::from_millis(10))
        .with_batch(32);
    let started = Instant::now();
    let dispatchers: Vec<FollowOnDispatcher> = (0..dispatchers)
        .map(|_| {
            let ran = ran.clone();
            let handlers = FollowOnHandlers::new().on(
                "send_receipt",
                follow_on_fn(move |_job: FollowOnRun| {
                    let ran = ran.clone();
                    async move {
                        if !work.is_zero() {
                            tokio::time::sleep(work).await;
                        }
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                }),
            );
            FollowOnDispatcher::spawn(Arc::new(store(url, schema)), handlers, config.clone())
                .expect("the store keeps follow-ons")
        })
        .collect();
    while ran.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    for dispatcher in dispatchers {
        dispatcher.stop().await;
    }
    // Every job finished (none left to run again).
    let left = seed.count_due_follow_ons().await.unwrap();
    assert!(left.is_empty(), "jobs left: {left:?}");
    drop_schema(url, seed.schema()).await;
    n as f64 / took.as_secs_f64()
}

fn store(url: &str, schema: &str) -> PostgresStore {
    PostgresStore::builder(url)
        .unwrap()
        .schema(schema)
        .build()
        .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("load average at start: {}", common::load());
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{:016x}", Attempt::random().get());
    let pg = store(&url, &schema);
    pg.migrate().await.unwrap();
    let dir = std::env::temp_dir().join(format!("idem-bench-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = SqliteStore::open(dir.join("bench.sqlite3")).await.unwrap();

    println!();
    println!(
        "Completion with 0 against 2 follow-ons, alternating call by call (µs, the completion only)"
    );
    println!("| store | calls per side | 0 jobs median | 2 jobs median | ratio | 0 jobs p99 | 2 jobs p99 | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    compare("PostgresStore", &pg, CALLS).await;
    compare("SqliteStore", &sqlite, CALLS / 3).await;

    println!();
    println!("Dispatch throughput on PostgreSQL: a backlog drained by 1 or 2 follow-on dispatchers (batch 32), each on its own pool; jobs/s, the median of 3 rounds alternated");
    println!("| handler | backlog | 1 dispatcher | 2 dispatchers | 2 vs 1 |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (label, work, n) in [
        ("no-op", Duration::ZERO, 3000),
        ("5 ms (a mailer's latency)", Duration::from_millis(5), 2000),
    ] {
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for round in 0..6 {
            let dispatchers = if round % 2 == 0 { 1 } else { 2 };
            let rate = drain(&url, dispatchers, n, work).await;
            if dispatchers == 1 { &mut one } else { &mut two }.push(rate);
        }
        let (one, two) = (median(one), median(two));
        println!(
            "| {label} | {n} | {one:.0} | {two:.0} | {:.2}× |",
            two / one
        );
    }
    println!();
    println!("load average at end: {}", common::load());

    drop_schema(&url, pg.schema()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn drop_schema(url: &str, schema: &str) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
