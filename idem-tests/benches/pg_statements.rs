//! What sending every statement unnamed costs PostgresStore (it works
//! behind a transaction pooler that way), against named statements
//! prepared once per connection (`PostgresStoreBuilder::direct_connection`),
//! on a direct connection; and the same unnamed statements through
//! PgBouncer in transaction mode, beside them. A wrapped call through the
//! executor with a no-op handler (claim, then completion), at concurrency 1
//! with the sides alternated call by call, and at concurrency 16 round by
//! round, all in one process.
//!
//! `cargo bench --bench pg_statements` (`IDEM_TEST_DIRECT_DATABASE_URL`,
//! default postgres://postgres@127.0.0.1:5432/test; `IDEM_TEST_PGBOUNCER_URL`,
//! default postgres://postgres@127.0.0.1:6432/test, `scripts/pgbouncer
//! start`; `IDEM_BENCH_ROUNDS`, default 5). Works in a fresh schema,
//! dropped at the end.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{answer::Answer, store::Attempt, Caller, Executor, PostgresStore};

/// One call through `exec` with a no-op handler: a new operation.
async fn wrapped(exec: &Executor, caller: &Caller, n: u64) {
    match common::charge(exec, caller, n).await {
        Answer::Executed { .. } => {}
        other => panic!("expected executed, got {other:?}"),
    }
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn main() {
    let direct = env_or(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let pooled = env_or(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    );
    let rounds: usize = env_or("IDEM_BENCH_ROUNDS", "5").parse().unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let schema = format!("bench_{:016x}", Attempt::random().get());
        let build = |url: &str, named: bool| {
            PostgresStore::builder(url)
                .unwrap()
                .schema(&schema)
                .pool_size(16)
                .direct_connection(named)
                .build()
                .unwrap()
        };
        let sides: Vec<(&str, PostgresStore)> = vec![
            ("direct, named (cached)", build(&direct, true)),
            ("direct, unnamed (default)", build(&direct, false)),
            ("PgBouncer, unnamed (default)", build(&pooled, false)),
        ];
        sides[0].1.migrate().await.expect("the direct server");
        if let Err(e) = sides[2].1.migrate().await {
            panic!("PgBouncer at {pooled}: {e} (scripts/pgbouncer start)");
        }
        let execs: Vec<Executor> = sides
            .iter()
            .map(|(_, s)| Executor::new(Arc::new(s.clone())))
            .collect();
        let caller = Caller::new("bench", "bench");
        let mut n = 0u64;
        // Warm every side's pool.
        for exec in &execs {
            for _ in 0..200 {
                n += 1;
                wrapped(exec, &caller, n).await;
            }
        }
        println!("pg_statements: {} (CPU: {})", common::load(), cpu_model());
        println!(
            "\nconcurrency 1, {rounds} rounds of 1000 calls per side, alternated call by call"
        );
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); sides.len()];
        for _ in 0..rounds {
            for _ in 0..1000 {
                for (i, exec) in execs.iter().enumerate() {
                    n += 1;
                    let t = Instant::now();
                    wrapped(exec, &caller, n).await;
                    samples[i].push(t.elapsed());
                }
            }
        }
        let base = common::median_p99(&mut samples[0].clone()).0;
        println!("| side | median µs | p99 µs | median ÷ named |");
        println!("| --- | --- | --- | --- |");
        for (i, (name, _)) in sides.iter().enumerate() {
            let (median, p99) = common::median_p99(&mut samples[i]);
            println!("| {name} | {median:.0} | {p99:.0} | {:.3} |", median / base);
        }

        println!(
            "\nconcurrency 16, {rounds} rounds of 4000 calls per side, alternated round by round"
        );
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
        for _ in 0..rounds {
            for (i, exec) in execs.iter().enumerate() {
                let start = Instant::now();
                let mut tasks = Vec::new();
                for t in 0..16u64 {
                    let exec = exec.clone();
                    let caller = caller.clone();
                    let first = n + 1 + t * 1_000_000;
                    tasks.push(tokio::spawn(async move {
                        for k in 0..250 {
                            wrapped(&exec, &caller, first + k).await;
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                n += 16 * 1_000_000;
                rates[i].push(4000.0 / start.elapsed().as_secs_f64());
            }
        }
        println!("| side | calls/s (median of rounds) | ÷ named |");
        println!("| --- | --- | --- |");
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let base = median(&mut rates[0].clone());
        for (i, (name, _)) in sides.iter().enumerate() {
            let m = median(&mut rates[i]);
            println!("| {name} | {m:.0} | {:.3} |", m / base);
        }
        let client = {
            let (client, conn) = tokio_postgres::connect(&direct, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
        };
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default()
}
