//! What the maintenance indexes (migration 2: partial indexes on the lapsed
//! and the UNKNOWN rows) cost a claim and save a maintenance round, on SQLite
//! and PostgreSQL, each with and without the indexes in the same run.
//!
//! Each store is filled with 200,000 COMPLETED rows (the bulk of a real
//! table). Then, alternating call by call between the indexed store and the
//! one whose two indexes were dropped:
//! - one claim + one completion;
//! - one maintenance round's reads (`list_lapsed` + `list_unknown`);
//! - claims while maintenance rounds run back to back beside them.
//!
//! `cargo bench --bench maintenance_index` (PostgreSQL from
//! `IDEM_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`;
//! it works in fresh schemas, dropped at the end).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    store::{Attempt, Claim},
    IdempotencyStore, PostgresStore, SqliteStore,
};

const ROWS: i64 = 200_000;

/// One call: claim, then complete.
async fn call(store: &dyn IdempotencyStore) -> Duration {
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
    t.elapsed()
}

/// One maintenance round's reads.
async fn round(store: &dyn IdempotencyStore) -> Duration {
    let t = Instant::now();
    store.list_lapsed(250).await.unwrap();
    store.list_unknown(250).await.unwrap();
    t.elapsed()
}

/// Claims' latencies while another task runs maintenance rounds back to back.
async fn claims_beside_rounds(store: Arc<dyn IdempotencyStore>, calls: usize) -> Vec<Duration> {
    let done = Arc::new(AtomicBool::new(false));
    let rounds = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                round(&*store).await;
            }
        })
    };
    let mut lat = Vec::with_capacity(calls);
    for _ in 0..calls {
        lat.push(call(&*store).await);
    }
    done.store(true, Ordering::Relaxed);
    rounds.await.unwrap();
    lat
}

/// Runs the comparison and prints its table.
async fn compare(name: &str, indexed: Arc<dyn IdempotencyStore>, bare: Arc<dyn IdempotencyStore>) {
    for _ in 0..300 {
        call(&*indexed).await;
        call(&*bare).await;
    }
    let (mut ci, mut cb) = (Vec::new(), Vec::new());
    for _ in 0..3000 {
        ci.push(call(&*indexed).await);
        cb.push(call(&*bare).await);
    }
    let (mut ri, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        ri.push(round(&*indexed).await);
        rb.push(round(&*bare).await);
    }
    let mut bi = claims_beside_rounds(indexed.clone(), 1500).await;
    let mut bb = claims_beside_rounds(bare.clone(), 1500).await;
    let (ci50, ci99) = common::median_p99(&mut ci);
    let (cb50, cb99) = common::median_p99(&mut cb);
    let (ri50, _) = common::median_p99(&mut ri);
    let (rb50, _) = common::median_p99(&mut rb);
    let (bi50, bi99) = common::median_p99(&mut bi);
    let (bb50, bb99) = common::median_p99(&mut bb);
    println!("{name}, {ROWS} completed rows, with and without the maintenance indexes");
    println!("| measure | with indexes | without | with / without |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| claim + complete, median µs | {ci50:.0} | {cb50:.0} | {:.2}× |",
        ci50 / cb50
    );
    println!(
        "| claim + complete, p99 µs | {ci99:.0} | {cb99:.0} | {:.2}× |",
        ci99 / cb99
    );
    println!(
        "| maintenance round (list_lapsed + list_unknown), median µs | {ri50:.0} | {rb50:.0} | {:.3}× |",
        ri50 / rb50
    );
    println!(
        "| claim + complete beside back-to-back rounds, median µs | {bi50:.0} | {bb50:.0} | {:.2}× |",
        bi50 / bb50
    );
    println!(
        "| claim + complete beside back-to-back rounds, p99 µs | {bi99:.0} | {bb99:.0} | {:.2}× |",
        bi99 / bb99
    );
    println!();
}

/// A SQLite store at `path` holding `ROWS` completed rows, with or without
/// the maintenance indexes.
async fn sqlite(path: &std::path::Path, indexes: bool) -> SqliteStore {
    drop(SqliteStore::open(path).await.unwrap());
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut insert = conn
            .prepare(
                "INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, \
                   claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
                   next_check_at, checks, resolution) \
                 VALUES (?1, ?1, 'acme', 'charge_card', 1, ?2, ?3, ?3, ?3, ?4, ?4, ?5, ?3, 0, NULL)",
            )
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        for i in 0..ROWS {
            let key = common::request().key;
            insert
                .execute(rusqlite::params![
                    &key.as_bytes()[..],
                    i,
                    now,
                    now + 3_600_000_000_000,
                    common::RESPONSE
                ])
                .unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
    if !indexes {
        conn.execute_batch("DROP INDEX idem_records_lapsed; DROP INDEX idem_records_unknown;")
            .unwrap();
    }
    conn.execute_batch("ANALYZE").unwrap();
    drop(conn);
    SqliteStore::open(path).await.unwrap()
}

async fn sql(url: &str, text: &str) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.batch_execute(text).await.unwrap();
}

/// A PostgreSQL store in a fresh schema holding `ROWS` completed rows, with
/// or without the maintenance indexes.
async fn postgres(url: &str, indexes: bool) -> PostgresStore {
    let schema = format!("bench_{:016x}", Attempt::random().get());
    let store = PostgresStore::builder(url)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let t = format!("{}.idem_records", store.schema());
    sql(
        url,
        &format!(
            "INSERT INTO {t} (attempt, claimed_at, updated_at, lease_until, expires_at, \
               retain_until, state, key, fingerprint, tenant, tool, body) \
             SELECT i, now(), now(), now(), now() + interval '1 hour', \
               now() + interval '1 hour', 1, sha256(int8send(i)), sha256(int8send(-i)), \
               'acme', 'charge_card', convert_to('{}', 'UTF8') \
             FROM generate_series(1, {ROWS}) AS i; \
             {}",
            common::RESPONSE,
            if indexes {
                String::new()
            } else {
                format!(
                    "DROP INDEX {s}.idem_records_lapsed; DROP INDEX {s}.idem_records_unknown;",
                    s = store.schema()
                )
            }
        ),
    )
    .await;
    // On its own: VACUUM cannot run inside the implicit transaction of a
    // multi-statement batch.
    sql(url, &format!("VACUUM ANALYZE {t}")).await;
    store
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    let dir = std::env::temp_dir().join(format!("idem-bench-index-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let indexed = sqlite(&dir.join("indexed.sqlite3"), true).await;
    let bare = sqlite(&dir.join("bare.sqlite3"), false).await;
    compare("SqliteStore", Arc::new(indexed), Arc::new(bare)).await;
    let _ = std::fs::remove_dir_all(&dir);

    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let indexed = postgres(&url, true).await;
    let bare = postgres(&url, false).await;
    let schemas = [indexed.schema().to_owned(), bare.schema().to_owned()];
    compare("PostgresStore", Arc::new(indexed), Arc::new(bare)).await;
    for s in schemas {
        sql(&url, &format!("DROP SCHEMA {s} CASCADE")).await;
    }
    println!("load average at end: {}", common::load());
}
