//! How a claim's cost grows with the records stored (issue 37): claim p99
//! on PostgreSQL and SQLite with 10 million COMPLETED records stored,
//! against 10 thousand, in the same run.
//!
//! Each store is set up twice side by side, a small one and a big one,
//! filled by one `INSERT … SELECT` each (COMPLETED records inside their
//! window and retention, random keys, a typical response) and then
//! analyzed. The claims of fresh keys alternate between the two call by
//! call, at concurrency 1, so drift on this shared machine hits both alike.
//!
//! `IDEM_GROWTH_RECORDS` sets the big store's count (default 10,000,000);
//! PostgreSQL from `IDEM_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in fresh schemas dropped at
//! the end; SQLite in files under the temporary directory, removed at the
//! end. The big PostgreSQL schema takes about 3 GB while it runs, the big
//! SQLite file about 2 GB.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::store::{Attempt, Claim, IdempotencyStore};
use idem_runtime::{PostgresStore, SqliteStore};

/// The small store's records.
const SMALL: u64 = 10_000;
/// Claims measured on each store.
const CLAIMS: usize = 5_000;

fn big() -> u64 {
    std::env::var("IDEM_GROWTH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

/// One claim of a fresh key; its time.
async fn claim(store: &dyn IdempotencyStore) -> Duration {
    let req = common::request();
    let t = Instant::now();
    let claim = store.claim(&req).await.unwrap();
    let took = t.elapsed();
    assert!(matches!(claim, Claim::Claimed { .. }), "{claim:?}");
    took
}

/// Claims alternating between `small` and `big`, after a warm-up; prints
/// the row.
async fn compare(name: &str, small: &dyn IdempotencyStore, big: &dyn IdempotencyStore, n: u64) {
    for _ in 0..500 {
        claim(small).await;
        claim(big).await;
    }
    let (mut s, mut b) = (Vec::new(), Vec::new());
    for _ in 0..CLAIMS {
        s.push(claim(small).await);
        b.push(claim(big).await);
    }
    let (s50, s99) = common::median_p99(&mut s);
    let (b50, b99) = common::median_p99(&mut b);
    println!(
        "| {name} | {SMALL} / {n} | {s50:.0} / {b50:.0} | {s99:.0} / {b99:.0} | {:.2}× | {:.2}× |",
        b50 / s50,
        b99 / s99
    );
}

/// A migrated PostgresStore in a fresh schema holding `n` COMPLETED
/// records; the time the insert took.
async fn pg_store(url: &str, n: u64) -> (PostgresStore, Duration) {
    let schema = format!("growth_{:016x}", Attempt::random().get());
    let store = PostgresStore::builder(url)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let t = Instant::now();
    common::sql(
        url,
        &format!(
            "INSERT INTO {schema}.idem_records (attempt, claimed_at, updated_at, lease_until, \
               expires_at, retain_until, state, key, fingerprint, tenant, tool, body) \
             SELECT i, now(), now(), now(), now() + interval '15 minutes', \
               now() + interval '48 hours', 1, sha256(int8send(i) || '{schema}'::bytea), \
               sha256(int8send(-i)), 'acme', 'charge_card', convert_to('{}', 'UTF8') \
             FROM generate_series(1, {n}) AS i",
            common::RESPONSE
        ),
    )
    .await;
    let took = t.elapsed();
    common::sql(url, &format!("VACUUM ANALYZE {schema}.idem_records")).await;
    (store, took)
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

/// A SqliteStore in `path` holding `n` COMPLETED records; the time the
/// insert took.
async fn sqlite_store(path: &std::path::Path, n: u64) -> (SqliteStore, Duration) {
    drop(SqliteStore::open(path).await.unwrap());
    let t = Instant::now();
    let conn = rusqlite::Connection::open(path).unwrap();
    // Pages stay in memory until the commit: a bulk insert in random key
    // order through SQLite's default 2 MB cache spills a page to the WAL
    // each time it is evicted, many times over.
    conn.execute_batch("PRAGMA cache_size = -4000000").unwrap();
    let now = nanos(SystemTime::now());
    let minute = 60_000_000_000i64;
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
         INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, claimed_at, \
           updated_at, lease_until, expires_at, retain_until, body) \
         SELECT randomblob(32), randomblob(32), 'acme', 'charge_card', 1, i, ?2, ?2, ?2, ?3, ?4, ?5 \
         FROM n",
        rusqlite::params![n as i64, now, now + 15 * minute, now + 48 * 60 * minute, common::RESPONSE],
    )
    .unwrap();
    conn.execute_batch("ANALYZE").unwrap();
    drop(conn);
    let took = t.elapsed();
    (SqliteStore::open(path).await.unwrap(), took)
}

fn header() {
    println!();
    println!("Claims of fresh keys at concurrency 1, {CLAIMS} on each store, alternating");
    println!();
    println!("| store | records: small / big | median µs: small / big | p99 µs: small / big | median ratio | p99 ratio |");
    println!("| --- | --- | --- | --- | ---: | ---: |");
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    let n = big();

    let dir = std::env::temp_dir().join(format!("idem-growth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (small, _) = sqlite_store(&dir.join("small.sqlite3"), SMALL).await;
    let (large, took) = sqlite_store(&dir.join("big.sqlite3"), n).await;
    println!(
        "SQLite: {n} records inserted in {:.0} s",
        took.as_secs_f64()
    );
    header();
    compare("SQLite (`SqliteStore`)", &small, &large, n).await;
    drop((small, large));
    std::fs::remove_dir_all(&dir).ok();

    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (small, _) = pg_store(&url, SMALL).await;
    let (large, took) = pg_store(&url, n).await;
    println!(
        "PostgreSQL: {n} records inserted in {:.0} s",
        took.as_secs_f64()
    );
    header();
    compare("PostgreSQL (`PostgresStore`)", &small, &large, n).await;
    for store in [small, large] {
        common::sql(&url, &format!("DROP SCHEMA {} CASCADE", store.schema())).await;
    }
}
