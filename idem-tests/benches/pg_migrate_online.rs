//! A PostgreSQL migration over a large table, online (issue 46): how long
//! it takes, and how long a write waited on it at most.
//!
//! A fresh schema at layout 5 (migrations 1 to 5 applied from the shipped
//! files, as 0.1.0 applied them), filled with `IDEM_BENCH_ROWS` records
//! (1,000,000 by default: COMPLETED, with every fifth IN_PROGRESS and every
//! seventh UNKNOWN) and a follow-on per tenth record. Two writers run
//! throughout, one call at a time each: claims of fresh keys through a
//! `PostgresStore` (idem_records, which migration 6 indexes), and updates
//! of a job row (idem_jobs, which migration 7 alters). After 5 s,
//! `migrate()` brings the schema to the latest layout; the writers go on
//! 3 s after it.
//!
//! With `IDEM_BENCH_SHIPPED=1`, the migration is the shipped files of
//! migrations 6 and 7 in one transaction, as earlier versions applied
//! them, for comparison.
//!
//! Prints the migration's duration, and for each writer its longest write
//! before and during the migration.
//!
//! `cargo bench --bench pg_migrate_online` (PostgreSQL from
//! `IDEM_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`;
//! the schema is dropped at the end).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::store::{Attempt, Claim};
use idem_runtime::{IdempotencyStore, PostgresStore};

const SHIPPED: &[&str] = &[
    include_str!("../../idem-runtime/migrations/postgres/0001_records.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0002_lifecycle.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0003_outbox.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0004_operations.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0005_delivered_jobs.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0006_superseded.sql"),
    include_str!("../../idem-runtime/migrations/postgres/0007_redrives.sql"),
];

/// The writes' latencies, each with when it started.
type Writes = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// The longest write that started in `from..to`, and how many did.
fn longest(writes: &Writes, from: Instant, to: Instant) -> (Duration, usize) {
    let writes = writes.lock().unwrap();
    let within: Vec<Duration> = writes
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, took)| *took)
        .collect();
    (
        within.iter().max().copied().unwrap_or_default(),
        within.len(),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rows: i64 = std::env::var("IDEM_BENCH_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let name = format!("bench_migrate_{:016x}", Attempt::random().get());
    let schema = format!("\"{name}\"");
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);

    // Layout 5, as the versions that shipped it applied it.
    let fill_started = Instant::now();
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.idem_migrations ( \
               version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await
        .unwrap();
    for (i, sql) in SHIPPED.iter().enumerate().take(5) {
        admin
            .batch_execute(&format!(
                "BEGIN; {}; INSERT INTO {schema}.idem_migrations (version) VALUES ({}); COMMIT",
                sql.replace("{schema}", &schema),
                i + 1
            ))
            .await
            .unwrap();
    }
    let chunk = 100_000;
    let mut from = 1;
    while from <= rows {
        let to = (from + chunk - 1).min(rows);
        admin
            .batch_execute(&format!(
                "INSERT INTO {schema}.idem_records (attempt, claimed_at, updated_at, \
                   lease_until, expires_at, retain_until, state, key, fingerprint, tenant, \
                   tool, body, operation) \
                 SELECT i, now(), now(), now() + interval '30 s', now() + interval '1 h', \
                   now() + interval '48 h', CASE WHEN i % 5 = 0 THEN 0 WHEN i % 7 = 0 THEN 2 \
                   ELSE 1 END, sha256(int8send(i)), sha256(int8send(-i)), 't' || (i % 1000), \
                   'charge_card', convert_to('{}', 'UTF8'), i \
                 FROM generate_series({from}, {to}) AS i; \
                 INSERT INTO {schema}.idem_jobs (next_run_at, created_at, updated_at, \
                   attempts, dead, reference, tenant, name, payload) \
                 SELECT now(), now(), now(), 0, false, \
                   substring(sha256(int8send(i)) FROM 1 FOR 8) || int8send(i), \
                   't' || (i % 1000), 'receipt', '\\x00' \
                 FROM generate_series({from}, {to}) AS i WHERE i % 10 = 0",
                common::RESPONSE
            ))
            .await
            .unwrap();
        from = to + 1;
    }
    for table in ["idem_records", "idem_jobs"] {
        admin
            .batch_execute(&format!("VACUUM ANALYZE {schema}.{table}"))
            .await
            .unwrap();
    }
    println!(
        "layout 5 with {rows} records and {} jobs, filled in {:.1?}; PostgreSQL {version}; \
         load {}",
        rows / 10,
        fill_started.elapsed(),
        common::load()
    );

    let store: Arc<dyn IdempotencyStore> = Arc::new(
        PostgresStore::builder(&url)
            .unwrap()
            .schema(&name)
            .build()
            .unwrap(),
    );
    let migrating = PostgresStore::builder(&url)
        .unwrap()
        .schema(&name)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (claims, jobs): (Writes, Writes) = Default::default();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let claimer = {
        let (store, stop, claims, errors) =
            (store.clone(), stop.clone(), claims.clone(), errors.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = common::request();
                let at = Instant::now();
                match store.claim(&req).await {
                    Ok(Claim::Claimed { .. }) => {}
                    Ok(other) => errors.lock().unwrap().push(format!("claim: {other:?}")),
                    Err(e) => errors.lock().unwrap().push(format!("claim: {e}")),
                }
                claims.lock().unwrap().push((at, at.elapsed()));
            }
        })
    };
    let job_writer = {
        let (url, schema, stop, jobs, errors) = (
            url.clone(),
            schema.clone(),
            stop.clone(),
            jobs.clone(),
            errors.clone(),
        );
        tokio::spawn(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let update = format!(
                "UPDATE {schema}.idem_jobs SET updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = 'receipt'"
            );
            let mut i: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 7919) % (rows / 10).max(1);
                let n = (i + 1) * 10;
                let tenant = format!("t{}", n % 1000);
                let reference: Vec<u8> = {
                    let row = client
                        .query_one(
                            "SELECT substring(sha256(int8send($1::int8)) FROM 1 FOR 8) \
                             || int8send($1::int8)",
                            &[&n],
                        )
                        .await
                        .unwrap();
                    row.get(0)
                };
                let at = Instant::now();
                match client.execute(&update, &[&tenant, &reference]).await {
                    Ok(1) => {}
                    Ok(n) => errors.lock().unwrap().push(format!("job update: {n} rows")),
                    Err(e) => errors.lock().unwrap().push(format!("job update: {e}")),
                }
                jobs.lock().unwrap().push((at, at.elapsed()));
            }
        })
    };

    let before = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    let migrated = if std::env::var("IDEM_BENCH_SHIPPED").as_deref() == Ok("1") {
        let mut sql = String::from("BEGIN;");
        for (i, file) in SHIPPED.iter().enumerate().skip(5) {
            sql.push_str(&file.replace("{schema}", &schema));
            sql.push_str(&format!(
                "; INSERT INTO {schema}.idem_migrations (version) VALUES ({});",
                i + 1
            ));
        }
        sql.push_str("COMMIT");
        admin.batch_execute(&sql).await.map_err(|e| e.to_string())
    } else {
        migrating.migrate().await.map_err(|e| e.to_string())
    };
    let ended = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    claimer.await.unwrap();
    job_writer.await.unwrap();
    migrated.unwrap();

    let layout: i32 = admin
        .query_one(
            &format!("SELECT max(version) FROM {schema}.idem_migrations"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    println!(
        "migrated from layout 5 to {layout} in {:.2?}",
        ended - started
    );
    for (writer, writes) in [("claims", &claims), ("job updates", &jobs)] {
        let (calm, n_calm) = longest(writes, before, started);
        let (during, n_during) = longest(writes, started, ended);
        println!(
            "{writer}: longest {during:.1?} during the migration ({n_during} writes), \
             {calm:.1?} in the 5 s before ({n_calm} writes)"
        );
    }
    {
        let errors = errors.lock().unwrap();
        println!("write errors: {}", errors.len());
        for e in errors.iter().take(5) {
            println!("  {e}");
        }
    }
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
