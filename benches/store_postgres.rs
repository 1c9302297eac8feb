//! PostgresStore against raw tokio-postgres, in the same run over the same
//! pool: one claim plus one completion per call (the store's own two
//! statements, run raw as the baseline). Then bytes per row, and a purge of
//! 1,000,000 expired rows while claims run.
//!
//! `IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench --bench store_postgres`
//! (the variable defaults to that address). Works in a fresh schema, dropped
//! at the end.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{purge, Attempt, Claim, ClaimRequest, IdempotencyStore, PostgresStore};

/// One call through the store: claim, then complete.
async fn via_store(store: &PostgresStore, req: &ClaimRequest) {
    assert_eq!(store.claim(req).await.unwrap(), Claim::Claimed);
    store
        .complete(&req.key, req.attempt, common::RESPONSE)
        .await
        .unwrap();
}

/// The same two statements, raw, on one connection of the same pool.
async fn raw(store: &PostgresStore, req: &ClaimRequest) {
    let (claim_sql, complete_sql) = store.claim_and_complete_sql();
    let client = store.pool().get().await.unwrap();
    let claim = client.prepare_cached(claim_sql).await.unwrap();
    let complete = client.prepare_cached(complete_sql).await.unwrap();
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
                &(req.attempt.0 as i64),
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
            &[&key, &(req.attempt.0 as i64), &common::RESPONSE.as_bytes()],
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

async fn call(store: &PostgresStore, side: Side) -> Duration {
    let req = common::request();
    let t = Instant::now();
    match side {
        Side::Store => via_store(store, &req).await,
        Side::Raw => raw(store, &req).await,
    }
    t.elapsed()
}

/// Calls per second with `concurrency` tasks making `per_task` calls each.
async fn throughput(
    store: &Arc<PostgresStore>,
    side: Side,
    concurrency: usize,
    per_task: usize,
) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    call(&store, side).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (concurrency * per_task) as f64 / started.elapsed().as_secs_f64()
}

/// Claim latencies (claim only) from `concurrency` tasks until `until` says stop.
async fn claims_while(
    store: &Arc<PostgresStore>,
    concurrency: usize,
    until: impl Fn() -> bool + Send + Sync + 'static,
) -> Vec<Duration> {
    let until = Arc::new(until);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (store, until) = (store.clone(), until.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while !until() {
                    let req = common::request();
                    let t = Instant::now();
                    assert_eq!(store.claim(&req).await.unwrap(), Claim::Claimed);
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat
}

/// Runs set-up SQL on a connection of its own: the store's connections carry
/// a statement timeout that a bulk insert of a million rows exceeds.
async fn sql(url: &str, text: &str) -> Vec<tokio_postgres::Row> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.query(text, &[]).await.unwrap()
}

#[tokio::main]
async fn main() {
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{:016x}", Attempt::random().0);
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

    // Warm-up: connections, prepared statements, caches.
    throughput(&store, Side::Store, 16, 100).await;
    throughput(&store, Side::Raw, 16, 100).await;

    // Latency at concurrency 1, store and raw interleaved in blocks so that
    // drift (autovacuum, checkpoints) hits both alike.
    let (mut s, mut r) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        for _ in 0..300 {
            s.push(call(&store, Side::Store).await);
        }
        for _ in 0..300 {
            r.push(call(&store, Side::Raw).await);
        }
    }
    let (s50, s99) = common::median_p99(&mut s);
    let (r50, r99) = common::median_p99(&mut r);

    // Throughput at concurrency 16, alternated; the median of five rounds.
    let (mut st, mut rt) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        st.push(throughput(&store, Side::Store, 16, 300).await);
        rt.push(throughput(&store, Side::Raw, 16, 300).await);
    }
    st.sort_by(f64::total_cmp);
    rt.sort_by(f64::total_cmp);
    let (st, rt) = (st[2], rt[2]);

    println!("PostgresStore vs raw tokio-postgres (same statements, same pool), one claim + one completion per call");
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
    let row = &sql(
        &url,
        &format!(
            "SELECT avg(pg_column_size(r.*))::float8, avg(pg_column_size(r.body))::float8, count(*) \
             FROM {t} r"
        ),
    )
    .await[0];
    let (with_body, body, rows): (f64, f64, i64) = (row.get(0), row.get(1), row.get(2));

    // 1,000,000 expired rows (lapsed IN_PROGRESS, retention over; no body).
    let inserted = Instant::now();
    sql(
        &url,
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
    let insert_time = inserted.elapsed();
    sql(&url, &format!("VACUUM ANALYZE {t}")).await;
    let row = &sql(
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

    // Claim latency without, then during, the purge of those rows.
    let stop_at = Instant::now() + Duration::from_secs(5);
    let mut before = claims_while(&store, 4, move || Instant::now() >= stop_at).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let purging = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let n = purge(&*store, 1000).await.unwrap();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (n, t.elapsed())
        })
    };
    let d = done.clone();
    let mut during = claims_while(&store, 4, move || {
        d.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let (purged, purge_time) = purging.await.unwrap();
    let (b50, b99) = common::median_p99(&mut before);
    let (d50, d99) = common::median_p99(&mut during);
    println!();
    println!(
        "Purge of {purged} expired rows in batches of 1000 while 4 tasks claim \
         (rows inserted with generate_series in {:.1} s)",
        insert_time.as_secs_f64()
    );
    println!("| measure | without purge | during purge | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| claims | {} | {} | |", before.len(), during.len());
    println!(
        "| claim median (µs) | {b50:.0} | {d50:.0} | {:.2}× |",
        d50 / b50
    );
    println!(
        "| claim p99 (µs) | {b99:.0} | {d99:.0} | {:.2}× |",
        d99 / b99
    );
    println!(
        "| purge time | | {:.1} s ({:.0} rows/s) | |",
        purge_time.as_secs_f64(),
        purged as f64 / purge_time.as_secs_f64()
    );

    sql(&url, &format!("DROP SCHEMA {} CASCADE", store.schema())).await;
}
