//! PostgresStore against raw tokio-postgres, in the same run over the same
//! pool: one claim plus one completion per call (the store's own two
//! statements, run raw as the baseline). Then bytes per row, and a purge of
//! 1,000,000 expired rows while claims run.
//!
//! `IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench --bench store_postgres`
//! (the variable defaults to that address). Works in a fresh schema, dropped
//! at the end.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::Upkeep;
use idem_runtime::{
    store::{Attempt, Claim, ClaimRequest},
    IdempotencyStore, PostgresStore,
};

/// One call through the store: claim, then complete.
async fn via_store(store: &PostgresStore, req: &ClaimRequest) {
    assert!(matches!(
        store.claim(req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .complete(&req.key, req.attempt, common::RESPONSE)
        .await
        .unwrap();
}

/// The store's claim and completion statements, written out again on
/// purpose: the baseline is what a hand-written claim costs. `{t}` is the
/// table. Keep them in step with `store/postgres/statements.rs`.
fn raw_statements(t: &str) -> (String, String) {
    let claim = format!(
        "INSERT INTO {t} AS r (key, fingerprint, tenant, tool, state, attempt, \
           claimed_at, updated_at, lease_until, expires_at, retain_until, body) \
         VALUES ($1, $2, $3, $4, 0, $5, now(), now(), \
           now() + $6::int8 * interval '1 microsecond', \
           now() + $7::int8 * interval '1 microsecond', \
           now() + $8::int8 * interval '1 microsecond', NULL) \
         ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
           tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = 0, \
           attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
           updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
           expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
           body = NULL \
         WHERE r.expires_at <= now() AND (r.state = 1 \
           OR (r.retain_until <= now() AND r.lease_until <= now())) \
         RETURNING 1"
    );
    let complete = format!(
        "UPDATE {t} SET state = 1, body = $3, updated_at = now() \
         WHERE key = $1 AND attempt = $2 AND state <> 1"
    );
    (claim, complete)
}

/// The raw side: a pool like the store's (same size, LIFO) and the SQL.
struct Raw {
    pool: deadpool_postgres::Pool,
    claim: String,
    complete: String,
}

impl Raw {
    fn new(url: &str, table: &str) -> Self {
        let manager = deadpool_postgres::Manager::from_config(
            url.parse().unwrap(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(16)
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap();
        let (claim, complete) = raw_statements(table);
        Raw {
            pool,
            claim,
            complete,
        }
    }
}

/// The same two statements, raw, on one connection of a pool like the store's.
async fn raw(raw: &Raw, req: &ClaimRequest) {
    let client = raw.pool.get().await.unwrap();
    let claim = client.prepare_cached(&raw.claim).await.unwrap();
    let complete = client.prepare_cached(&raw.complete).await.unwrap();
    let key = &req.key.as_bytes()[..];
    let micros = |d: Duration| d.as_micros() as i64;
    let row = client
        .query_opt(
            &claim,
            &[
                &key,
                &&req.key.fingerprint()[..],
                &req.tenant,
                &req.tool,
                &(req.attempt.get() as i64),
                &micros(req.lease),
                &micros(req.window),
                &micros(req.retention),
            ],
        )
        .await
        .unwrap();
    assert!(row.is_some());
    let n = client
        .execute(
            &complete,
            &[
                &key,
                &(req.attempt.get() as i64),
                &common::RESPONSE.as_bytes(),
            ],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Store,
    Raw,
}

/// Both sides over the same server and schema.
struct Sides {
    store: PostgresStore,
    raw: Raw,
}

async fn call(sides: &Sides, side: Side) -> Duration {
    let req = common::request();
    let t = Instant::now();
    match side {
        Side::Store => via_store(&sides.store, &req).await,
        Side::Raw => raw(&sides.raw, &req).await,
    }
    t.elapsed()
}

/// Calls per second with `concurrency` tasks making `per_task` calls each.
async fn throughput(sides: &Arc<Sides>, side: Side, concurrency: usize, per_task: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let sides = sides.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    call(&sides, side).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (concurrency * per_task) as f64 / started.elapsed().as_secs_f64()
}

/// How many tasks claim while the purge runs.
const CLAIMERS: usize = 2;

/// 1,000,000 expired rows (lapsed IN_PROGRESS, retention over; no body),
/// then VACUUM ANALYZE; returns the insert's duration.
async fn insert_expired(url: &str, t: &str) -> Duration {
    let inserted = Instant::now();
    common::sql(
        url,
        &format!(
            "INSERT INTO {t} (attempt, claimed_at, updated_at, lease_until, expires_at, \
               retain_until, state, key, fingerprint, tenant, tool, body) \
             SELECT i, now() - interval '3 days', now() - interval '3 days', \
               now() - interval '3 days', now() - interval '2 days', now() - interval '1 hour', \
               0, sha256(int8send(i)), sha256(int8send(-i)), 'acme', 'charge_card', NULL \
             FROM generate_series(1, 1000000) AS i"
        ),
    )
    .await;
    let took = inserted.elapsed();
    common::sql(url, &format!("VACUUM ANALYZE {t}")).await;
    took
}

#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Batch after batch, with no pause (what `idem_runtime::maintenance::purge` did first).
    BackToBack,
    /// After each batch, a pause as long as the batch took (at most half the
    /// time purging), as `idem_runtime::maintenance::purge` runs them.
    Paced,
}

/// Claim latency with and without the purge, in the same run: the purge works
/// in alternating half-second windows (purging, idle, purging, …) until every
/// expired row is gone, and each claim is counted with the window it started
/// in. Both sets of claims see the same neighbours on this shared machine, so
/// the ratio is robust even when the absolute figures drift.
/// Returns the purge's rows per second.
async fn purge_under_claims(store: &Arc<PostgresStore>, pace: Pace, batch: usize) -> f64 {
    const WINDOW: Duration = Duration::from_millis(500);
    let purging = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let purger = {
        let (store, purging, done) = (store.clone(), purging.clone(), done.clone());
        tokio::spawn(async move {
            let (mut n, mut busy) = (0, Duration::ZERO);
            // Start idle, so both sets begin alike.
            tokio::time::sleep(WINDOW).await;
            'purge: loop {
                purging.store(true, Ordering::SeqCst);
                let window = Instant::now();
                while window.elapsed() < WINDOW {
                    let b = Instant::now();
                    let k = store.purge_expired(batch).await.unwrap();
                    n += k;
                    if k < batch {
                        busy += window.elapsed();
                        break 'purge;
                    }
                    match pace {
                        Pace::BackToBack => tokio::task::yield_now().await,
                        Pace::Paced => tokio::time::sleep(b.elapsed()).await,
                    }
                }
                busy += window.elapsed();
                purging.store(false, Ordering::SeqCst);
                tokio::time::sleep(WINDOW).await;
            }
            purging.store(false, Ordering::SeqCst);
            tokio::time::sleep(WINDOW).await;
            done.store(true, Ordering::SeqCst);
            (n, busy)
        })
    };
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let (store, purging, done) = (store.clone(), purging.clone(), done.clone());
            tokio::spawn(async move {
                let (mut idle, mut busy) = (Vec::new(), Vec::new());
                while !done.load(Ordering::SeqCst) {
                    let req = common::request();
                    let during = purging.load(Ordering::SeqCst);
                    let t = Instant::now();
                    assert!(matches!(
                        store.claim(&req).await.unwrap(),
                        Claim::Claimed { .. }
                    ));
                    if during { &mut busy } else { &mut idle }.push(t.elapsed());
                }
                (idle, busy)
            })
        })
        .collect();
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    for t in tasks {
        let (i, b) = t.await.unwrap();
        idle.extend(i);
        busy.extend(b);
    }
    let (purged, took) = purger.await.unwrap();
    assert_eq!(purged, 1_000_000, "every expired row, and nothing else");
    let (i50, i99) = common::median_p99(&mut idle);
    let (b50, b99) = common::median_p99(&mut busy);
    println!(
        "| {pace:?}, batches of {batch} | {} / {} | {i50:.0} / {b50:.0} | {i99:.0} / {b99:.0} | {:.2}× | {:.1} s ({:.0} rows/s) |",
        idle.len(),
        busy.len(),
        b99 / i99,
        took.as_secs_f64(),
        purged as f64 / took.as_secs_f64()
    );
    purged as f64 / took.as_secs_f64()
}

#[tokio::main]
async fn main() {
    println!("load average at start: {}", common::load());
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{:016x}", Attempt::random().get());
    let store = Arc::new(
        PostgresStore::builder(&url)
            .unwrap()
            .schema(&schema)
            .pool_size(16)
            .build()
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let t = format!("{}.idem_records", store.schema());

    let sides = Arc::new(Sides {
        store: (*store).clone(),
        raw: Raw::new(&url, &t),
    });

    // Warm-up: connections, prepared statements, caches.
    throughput(&sides, Side::Store, 16, 100).await;
    throughput(&sides, Side::Raw, 16, 100).await;

    // Latency at concurrency 1, store and raw alternating call by call, so
    // that drift (autovacuum, checkpoints, fsync stalls, the neighbours) hits
    // both alike.
    let (mut s, mut r) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        s.push(call(&sides, Side::Store).await);
        r.push(call(&sides, Side::Raw).await);
    }
    let (s50, s99) = common::median_p99(&mut s);
    let (r50, r99) = common::median_p99(&mut r);

    // Throughput at concurrency 16, alternated; the median of nine rounds.
    let (mut st, mut rt) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        st.push(throughput(&sides, Side::Store, 16, 300).await);
        rt.push(throughput(&sides, Side::Raw, 16, 300).await);
    }
    st.sort_by(f64::total_cmp);
    rt.sort_by(f64::total_cmp);
    let (st, rt) = (st[4], rt[4]);

    println!("PostgresStore vs raw tokio-postgres (same statements, pools alike), one claim + one completion per call");
    println!("| measure | PostgresStore | raw | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| median latency, concurrency 1 (µs) | {s50:.0} | {r50:.0} | {:.2}× |",
        s50 / r50
    );
    println!(
        "| p99 latency, concurrency 1 (µs) | {s99:.0} | {r99:.0} | {:.2}× |",
        s99 / r99
    );
    println!(
        "| throughput, concurrency 16 (calls/s) | {st:.0} | {rt:.0} | {:.2}× |",
        st / rt
    );

    // Bytes per row, from the rows the runs above wrote (COMPLETED, with a
    // response of RESPONSE.len() bytes): the row without its response.
    let row = &common::sql(
        &url,
        &format!(
            "SELECT avg(pg_column_size(r.*))::float8, avg(pg_column_size(r.body))::float8, count(*) \
             FROM {t} r"
        ),
    )
    .await[0];
    let (with_body, body, rows): (f64, f64, i64) = (row.get(0), row.get(1), row.get(2));

    // 1,000,000 expired rows (lapsed IN_PROGRESS, retention over; no body).
    let insert_time = insert_expired(&url, &t).await;
    let row = &common::sql(
        &url,
        &format!(
            "SELECT pg_total_relation_size('{t}')::float8, pg_relation_size('{t}')::float8, \
               count(*), avg(pg_column_size(r.*))::float8 \
             FROM {t} r WHERE body IS NULL"
        ),
    )
    .await[0];
    let (total, heap, expired_rows, tuple): (f64, f64, i64, f64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let all_rows = expired_rows + rows;

    println!();
    println!("Bytes per row (PostgreSQL; tenant \"acme\", tool \"charge_card\")");
    println!("| measure | bytes |");
    println!("| --- | ---: |");
    println!(
        "| tuple without response, avg pg_column_size (1,000,000 rows, body NULL) | {tuple:.0} |"
    );
    println!(
        "| tuple of a COMPLETED row minus its {:.0}-byte response ({rows} rows written by the store) | {:.0} |",
        body,
        with_body - body
    );
    println!(
        "| heap per row, pg_relation_size / rows ({all_rows} rows) | {:.0} |",
        heap / all_rows as f64
    );
    println!(
        "| heap + indexes + TOAST per row, pg_total_relation_size / rows | {:.0} |",
        total / all_rows as f64
    );

    println!();
    println!(
        "Purge of 1,000,000 expired rows (inserted with generate_series in {:.1} s) in \
         batches, while {CLAIMERS} tasks claim",
        insert_time.as_secs_f64()
    );
    println!("| purge | claims without / during | claim median µs without / during | claim p99 µs without / during | p99 ratio | time purging |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    purge_under_claims(&store, Pace::BackToBack, 1000).await;
    insert_expired(&url, &t).await;
    purge_under_claims(&store, Pace::Paced, 1000).await;
    insert_expired(&url, &t).await;
    let paced = purge_under_claims(&store, Pace::Paced, 250).await;
    println!();
    println!(
        "Purge against the claim rate, this run: the paced purge in batches of 250 (the \
         maintenance default) deletes {paced:.0} rows/s; PostgresStore makes {st:.0} calls/s at \
         concurrency 16 (one record each): the purge keeps up with {:.1}× the call rate",
        paced / st
    );

    common::sql(&url, &format!("DROP SCHEMA {} CASCADE", store.schema())).await;
    println!("load average at end: {}", common::load());
}
