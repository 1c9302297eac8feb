//! One durable commit per call (issue 25, lever a): a wrapped call through
//! the executor with a no-op handler, with relaxed completions and with
//! synchronous ones, against the floor: one raw synchronous commit of the
//! claim's statement. On PostgreSQL and on SQLite, each in one process, the
//! sides alternated call by call at concurrency 1 and round by round at
//! concurrency 16 and 64, with each side's calls/s and p99.
//!
//! `IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench --bench commit`
//! (the variable defaults to that address; `-- sqlite` or `-- postgres` runs
//! one store; `IDEM_BENCH_ROUNDS` sets the rounds, 5 by default). PostgreSQL
//! works in a fresh schema, dropped at the end; SQLite on files in the
//! temporary directory.
//!
//! Besides the floor, a fourth side measures the completion's own round
//! trip: the raw claim, then the raw relaxed completion on the same
//! connection. The executor's call is that pair plus the executor's work.
//!
//! A fifth side is lever b: the executor with relaxed completions written
//! in the background (`with_background_completions`), answered when the
//! handler returns. At concurrency 1 its pending completion is waited for
//! after each call, outside the timed part, so it does not land on the
//! next side's call; at concurrency 16 the wait for the last ones is inside
//! the timed part, so the rate counts every completion written.
//!
//! A sixth side is the fifth with PostgreSQL's batched completions off
//! (`batched_completions(false)`: each completion a statement of its own);
//! on SQLite it is the fifth again, the store having no batching. The
//! PostgreSQL executors use named, cached statements
//! (`direct_connection(true)`), as the floor does; a seventh side is the
//! fifth with the default builder (unnamed statements, the claim and the
//! completion as the schema's functions), which a transaction pooler
//! needs (on SQLite, the fifth again). The eighth and ninth go through
//! PgBouncer in transaction mode (`IDEM_TEST_PGBOUNCER_URL`, default
//! postgres://postgres@127.0.0.1:6432/test, `scripts/pgbouncer start`):
//! the floor's raw named claim on one client connection, at concurrency 1
//! only (a named statement behind a transaction pooler holds only while
//! one call is in flight), and the default builder. Last, the default
//! builder's goals, each ratio beside its floor. The tenth and eleventh
//! are migration 9's claim function alone (raw, no executor, no store),
//! prepared once and sent unnamed, at concurrency 1: the parse a call
//! without session state pays, measured beside the default builder.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    answer::Answer, store::Attempt, Caller, Executor, IdempotencyStore, PostgresStore, SqliteStore,
};

/// One call through `exec` with a no-op handler: a new operation.
async fn wrapped(exec: &Executor, caller: &Caller, n: u64) {
    match common::charge(exec, caller, n).await {
        Answer::Executed { .. } => {}
        other => panic!("every call is a new operation: {other:?}"),
    }
}

/// The raw statements: a claim, and the claim then a relaxed completion.
enum Raw {
    Pg {
        pool: deadpool_postgres::Pool,
        claim: String,
        complete: String,
    },
    /// Migration 9's claim function alone, called as the stores call it:
    /// named (prepared once, `direct_connection(true)`) or unnamed (the
    /// default builder), with no executor and no store around it.
    PgFunction {
        pool: deadpool_postgres::Pool,
        call: String,
        named: bool,
    },
    Sqlite(Mutex<rusqlite::Connection>),
}

/// The PostgreSQL store's claim and relaxed completion, written out again on
/// purpose (keep them in step with `store/postgres/statements.rs`).
fn pg_statements(t: &str) -> (String, String) {
    let claim = format!(
        "INSERT INTO {t} AS r (key, fingerprint, tenant, tool, state, attempt, \
           claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
           next_check_at, checks, resolution, operation) \
         VALUES ($1, $2, $3, $4, 0, $5, now(), now(), \
           now() + $6::int8 * interval '1 microsecond', \
           now() + $7::int8 * interval '1 microsecond', \
           now() + $8::int8 * interval '1 microsecond', NULL, now(), 0, NULL, $9) \
         ON CONFLICT (key) DO UPDATE SET operation = CASE WHEN r.state = 3 \
             AND r.expires_at > now() THEN r.operation ELSE EXCLUDED.operation END, \
           fingerprint = EXCLUDED.fingerprint, \
           tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = 0, \
           attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
           updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
           expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
           body = NULL, next_check_at = EXCLUDED.next_check_at, checks = 0, resolution = NULL \
         WHERE ((r.state = 1 AND r.expires_at <= now()) OR r.state = 3 \
           OR (r.state IN (0, 2) AND r.retain_until <= now() AND r.lease_until <= now())) \
           AND NOT (NOT (r.state = 3 AND r.expires_at > now()) \
             AND coalesce(r.operation, 0) <> EXCLUDED.operation AND r.retain_until > now()) \
         RETURNING operation"
    );
    let complete = format!(
        "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS off) \
         UPDATE {t} SET state = 1, body = $3, updated_at = now() \
         FROM relaxed WHERE key = $1 AND attempt = $2 AND state <> 1"
    );
    (claim, complete)
}

/// The SQLite store's claim (keep it in step with
/// `store/sqlite/statements.rs`).
const SQLITE_CLAIM: &str = "INSERT INTO idem_records (key, fingerprint, tenant, tool, state, \
       attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
       next_check_at, checks, resolution, operation) \
     VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?6, ?7, ?8, ?9, NULL, ?6, 0, NULL, ?10) \
     ON CONFLICT (key) DO UPDATE SET operation = CASE WHEN idem_records.state = 3 \
         AND idem_records.expires_at > ?6 THEN idem_records.operation \
         ELSE excluded.operation END, fingerprint = excluded.fingerprint, \
       tenant = excluded.tenant, tool = excluded.tool, state = 0, \
       attempt = excluded.attempt, claimed_at = excluded.claimed_at, \
       updated_at = excluded.updated_at, lease_until = excluded.lease_until, \
       expires_at = excluded.expires_at, retain_until = excluded.retain_until, \
       body = NULL, next_check_at = excluded.next_check_at, checks = 0, resolution = NULL \
     WHERE ((idem_records.state = 1 AND idem_records.expires_at <= ?6) \
       OR idem_records.state = 3 \
       OR (idem_records.state IN (0, 2) AND idem_records.retain_until <= ?6 \
         AND idem_records.lease_until <= ?6)) \
       AND NOT (NOT (idem_records.state = 3 AND idem_records.expires_at > ?6) \
         AND coalesce(idem_records.operation, 0) <> excluded.operation \
         AND idem_records.retain_until > ?6) \
     RETURNING operation";

const SQLITE_COMPLETE: &str = "UPDATE idem_records SET state = 1, body = ?3, updated_at = ?4 \
     WHERE key = ?1 AND attempt = ?2 AND state <> 1";

fn nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

impl Raw {
    /// One claim, committed synchronously; then, if `complete`, the relaxed
    /// completion on the same connection.
    async fn call(&self, complete: bool) {
        let req = common::request();
        let key = &req.key.as_bytes()[..];
        let attempt = req.attempt.get() as i64;
        match self {
            Raw::Pg {
                pool,
                claim,
                complete: completion,
            } => {
                let client = pool.get().await.unwrap();
                let claim = client.prepare_cached(claim).await.unwrap();
                let micros = |d: Duration| d.as_micros() as i64;
                let row = client
                    .query_opt(
                        &claim,
                        &[
                            &key,
                            &&req.key.fingerprint()[..],
                            &req.tenant,
                            &req.tool,
                            &attempt,
                            &micros(req.lease),
                            &micros(req.window),
                            &micros(req.retention),
                            &None::<i64>,
                        ],
                    )
                    .await
                    .unwrap();
                assert!(row.is_some());
                if complete {
                    let stmt = client.prepare_cached(completion).await.unwrap();
                    let n = client
                        .execute(&stmt, &[&key, &attempt, &common::RESPONSE.as_bytes()])
                        .await
                        .unwrap();
                    assert_eq!(n, 1);
                }
            }
            Raw::PgFunction { pool, call, named } => {
                use tokio_postgres::types::{ToSql, Type};
                let client = pool.get().await.unwrap();
                let micros = |d: Duration| d.as_micros() as i64;
                let (fingerprint, lease, window, retention, tag, bound) = (
                    &req.key.fingerprint()[..],
                    micros(req.lease),
                    micros(req.window),
                    micros(req.retention),
                    0_i64,
                    5_000_000_i64,
                );
                let params: [(&(dyn ToSql + Sync), Type); 10] = [
                    (&key, Type::BYTEA),
                    (&fingerprint, Type::BYTEA),
                    (&req.tenant, Type::TEXT),
                    (&req.tool, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&lease, Type::INT8),
                    (&window, Type::INT8),
                    (&retention, Type::INT8),
                    (&tag, Type::INT8),
                    (&bound, Type::INT8),
                ];
                let row = if *named {
                    let stmt = client.prepare_cached(call).await.unwrap();
                    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.0).collect();
                    client.query_one(&stmt, &values).await.unwrap()
                } else {
                    let rows = client.query_typed(call, &params).await.unwrap();
                    rows.into_iter().next().unwrap()
                };
                assert_eq!(row.get::<_, Option<i64>>(0), Some(0), "claimed");
            }
            Raw::Sqlite(conn) => {
                // Inline, on the runtime's thread: the floor is SQLite's
                // commit alone, without the store's hop to its writer thread.
                let conn = conn.lock().unwrap();
                let now = nanos();
                let n = |d: Duration| now + d.as_nanos() as i64;
                let claimed = conn
                    .prepare_cached(SQLITE_CLAIM)
                    .unwrap()
                    .query_row(
                        rusqlite::params![
                            key,
                            &req.key.fingerprint()[..],
                            req.tenant,
                            req.tool,
                            attempt,
                            now,
                            n(req.lease),
                            n(req.window),
                            n(req.retention),
                            None::<i64>,
                        ],
                        |r| r.get::<_, Option<i64>>(0),
                    )
                    .is_ok();
                assert!(claimed);
                if complete {
                    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
                    let changed = conn
                        .prepare_cached(SQLITE_COMPLETE)
                        .unwrap()
                        .execute(rusqlite::params![key, attempt, common::RESPONSE, nanos()])
                        .unwrap();
                    assert_eq!(changed, 1);
                    conn.pragma_update(None, "synchronous", "FULL").unwrap();
                }
            }
        }
    }
}

/// What one store's run compares.
struct Sides {
    name: &'static str,
    raw: Raw,
    /// The raw claim and completion: [`Sides::raw`]'s statements on a pool
    /// (or a connection) of its own.
    raw_pair: Raw,
    relaxed: Executor,
    synchronous: Executor,
    /// `relaxed`'s store, with background completions.
    background: Executor,
    /// The same with each completion a statement of its own (PostgreSQL's
    /// `batched_completions(false)`; SQLite's store has no batching).
    background_alone: Executor,
    /// `background` with unnamed statements, as behind a transaction
    /// pooler (PostgreSQL's default; SQLite's store has no such choice).
    background_unnamed: Executor,
    /// The floor through PgBouncer in transaction mode: the raw named claim
    /// on one client connection (at concurrency 1 PgBouncer hands it the
    /// same server connection, so the statement stays prepared). Measured
    /// at concurrency 1 only. SQLite: the floor again.
    pgbouncer_floor: Raw,
    /// The default builder through the same PgBouncer, background
    /// completions. SQLite: the fifth side again.
    pgbouncer_default: Executor,
    /// The claim's function alone, named and unnamed, on the server
    /// itself (concurrency 1 only): what the parse of the default
    /// builder's statement costs, with nothing of idem's around it.
    /// SQLite: the floor again.
    function_named: Raw,
    function_unnamed: Raw,
    /// The connection [`Sides::flush`] commits on (PostgreSQL).
    flusher: Option<deadpool_postgres::Pool>,
    caller: Caller,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    Floor,
    RawPair,
    Relaxed,
    Synchronous,
    Background,
    BackgroundAlone,
    BackgroundUnnamed,
    PgBouncerFloor,
    PgBouncerDefault,
    FunctionNamed,
    FunctionUnnamed,
}

const SIDES: [Side; 11] = [
    Side::Floor,
    Side::RawPair,
    Side::Relaxed,
    Side::Synchronous,
    Side::Background,
    Side::BackgroundAlone,
    Side::BackgroundUnnamed,
    Side::PgBouncerFloor,
    Side::PgBouncerDefault,
    Side::FunctionNamed,
    Side::FunctionUnnamed,
];

/// One throughput round of a side: calls/s, the calls' p99 µs, and the
/// CPU µs a call took in the client and in the servers.
type Rate = (f64, f64, (f64, f64));

/// The sides measured at concurrency 1 only.
fn alone_only(side: Side) -> bool {
    matches!(
        side,
        Side::PgBouncerFloor | Side::FunctionNamed | Side::FunctionUnnamed
    )
}

impl Sides {
    async fn call(&self, side: Side, n: u64) -> Duration {
        let t = Instant::now();
        match side {
            Side::Floor => self.raw.call(false).await,
            Side::RawPair => self.raw_pair.call(true).await,
            Side::Relaxed => wrapped(&self.relaxed, &self.caller, n).await,
            Side::Synchronous => wrapped(&self.synchronous, &self.caller, n).await,
            Side::Background => wrapped(&self.background, &self.caller, n).await,
            Side::BackgroundAlone => wrapped(&self.background_alone, &self.caller, n).await,
            Side::BackgroundUnnamed => wrapped(&self.background_unnamed, &self.caller, n).await,
            Side::PgBouncerFloor => self.pgbouncer_floor.call(false).await,
            Side::PgBouncerDefault => wrapped(&self.pgbouncer_default, &self.caller, n).await,
            Side::FunctionNamed => self.function_named.call(false).await,
            Side::FunctionUnnamed => self.function_unnamed.call(false).await,
        }
        t.elapsed()
    }

    /// Waits for the background sides' pending completions.
    async fn settle(&self) {
        assert_eq!(self.background.drain(Duration::from_secs(30)).await, 0);
        assert_eq!(
            self.background_alone.drain(Duration::from_secs(30)).await,
            0
        );
        assert_eq!(
            self.background_unnamed.drain(Duration::from_secs(30)).await,
            0
        );
        assert_eq!(
            self.pgbouncer_default.drain(Duration::from_secs(30)).await,
            0
        );
    }

    /// Before a timed call at concurrency 1: a synchronous commit of a
    /// transaction of its own (PostgreSQL), which flushes whatever WAL a
    /// side's relaxed completion left unflushed. Otherwise the side that
    /// follows a relaxed completion pays for its flush (often a second
    /// fsync, the WAL writer's in progress) and the side that follows a
    /// synchronous one does not: the order of the sides would show as
    /// their cost.
    ///
    /// On a connection of its own, used by no side: the side that sent it
    /// would find its server backend warmer than the others find theirs.
    async fn flush(&self) {
        if let Some(pool) = &self.flusher {
            let client = pool.get().await.unwrap();
            client.batch_execute("SELECT txid_current()").await.unwrap();
        }
    }

    /// Calls per second of `side` with `tasks` tasks making `per_task`
    /// calls each, the calls' p99 in µs, and the CPU µs a call took in
    /// this process and in the rest of the machine (the servers).
    async fn throughput(self: &Arc<Self>, side: Side, tasks: u64, per_task: u64) -> Rate {
        let cpu = common::cpu_seconds();
        let started = Instant::now();
        let running: Vec<_> = (0..tasks)
            .map(|t| {
                let sides = self.clone();
                tokio::spawn(async move {
                    let mut took = Vec::with_capacity(per_task as usize);
                    for i in 0..per_task {
                        took.push(sides.call(side, next(t * per_task + i)).await);
                    }
                    took
                })
            })
            .collect();
        let mut took = Vec::new();
        for t in running {
            took.extend(t.await.unwrap());
        }
        self.settle().await;
        let rate = (tasks * per_task) as f64 / started.elapsed().as_secs_f64();
        let (process, machine) = common::cpu_seconds();
        let per_call = |s: f64| s * 1e6 / (tasks * per_task) as f64;
        let client = per_call(process - cpu.0);
        let servers = per_call((machine - cpu.1) - (process - cpu.0));
        (rate, common::median_p99(&mut took).1, (client, servers))
    }
}

/// A number no other call of this process used: a new operation each call.
fn next(salt: u64) -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    (N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 20) ^ salt
}

/// The concurrencies the throughput is measured at, each side in turn.
const CONCURRENCY: [u64; 2] = [16, 64];

/// `rounds` rounds: at concurrency 1, `calls` calls per side alternated
/// call by call; at each of [`CONCURRENCY`], each side in turn (the same
/// number of calls at each). Prints a table.
async fn compare(sides: Arc<Sides>, rounds: usize, calls: usize, per_task: u64) {
    // Warm-up: connections, prepared statements, caches.
    for side in SIDES {
        for _ in 0..100 {
            sides.call(side, next(0)).await;
            sides.settle().await;
        }
    }
    let mut all: Vec<Vec<Duration>> = vec![Vec::new(); SIDES.len()];
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); SIDES.len()];
    let mut ratios: Vec<(f64, f64, f64)> = Vec::new();
    // rates[c][side]: each round's figures.
    let mut rates: Vec<Vec<Vec<Rate>>> = vec![vec![Vec::new(); SIDES.len()]; CONCURRENCY.len()];
    for _ in 0..rounds {
        let mut round: Vec<Vec<Duration>> = vec![Vec::new(); SIDES.len()];
        for _ in 0..calls {
            for (i, side) in SIDES.iter().enumerate() {
                sides.flush().await;
                round[i].push(sides.call(*side, next(0)).await);
                sides.settle().await;
            }
        }
        let m: Vec<f64> = round.iter_mut().map(|r| common::median_p99(r).0).collect();
        ratios.push((m[2] / m[0], m[3] / m[0], m[4] / m[0]));
        for (i, r) in round.into_iter().enumerate() {
            medians[i].push(m[i]);
            all[i].extend(r);
        }
        for (c, tasks) in CONCURRENCY.iter().enumerate() {
            for (i, side) in SIDES.iter().enumerate() {
                let per = per_task * 16 / tasks;
                // A named statement through a transaction pooler holds
                // only while one call is in flight.
                let rate = if alone_only(*side) {
                    (f64::NAN, f64::NAN, (f64::NAN, f64::NAN))
                } else {
                    sides.throughput(*side, *tasks, per).await
                };
                rates[c][i].push(rate);
            }
        }
    }
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    };
    let pooled: Vec<(f64, f64)> = all.iter_mut().map(|s| common::median_p99(s)).collect();
    let floor = pooled[0].0;
    println!(
        "{}: {rounds} rounds; concurrency 1: {calls} calls per side per round, alternated; \
         concurrency {CONCURRENCY:?}: {} calls per side per round",
        sides.name,
        16 * per_task
    );
    println!("| side | median µs (all rounds) | round medians µs | p99 µs | median / floor |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let names = [
        "floor: raw claim, one synchronous commit",
        "raw claim + raw relaxed completion",
        "executor, relaxed completions",
        "executor, synchronous completions",
        "executor, relaxed completions in the background",
        "the same, each completion a statement of its own",
        "the same as the fifth, the default builder (unnamed statements, the claim's function)",
        "through PgBouncer (transaction mode): the floor's raw named claim",
        "through PgBouncer: the default builder, background completions",
        "the claim's function alone, named (prepared once)",
        "the claim's function alone, unnamed (parsed each call)",
    ];
    for i in 0..SIDES.len() {
        let (lo, hi) = range(&medians[i]);
        println!(
            "| {} | {:.0} | {lo:.0}–{hi:.0} | {:.0} | {:.2}× |",
            names[i],
            pooled[i].0,
            pooled[i].1,
            pooled[i].0 / floor,
        );
    }
    println!();
    println!(
        "| side | concurrency | calls/s (median of rounds) | range | / floor | p99 µs (median of rounds) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (c, tasks) in CONCURRENCY.iter().enumerate() {
        let floor_rate = median(rates[c][0].iter().map(|r| r.0).collect());
        for i in 0..SIDES.len() {
            let r: Vec<f64> = rates[c][i].iter().map(|r| r.0).collect();
            if r.iter().all(|r| r.is_nan()) {
                continue;
            }
            let (rlo, rhi) = range(&r);
            let rate = median(r);
            let p99 = median(rates[c][i].iter().map(|r| r.1).collect());
            println!(
                "| {} | {tasks} | {rate:.0} | {rlo:.0}–{rhi:.0} | {:.2}× | {p99:.0} |",
                names[i],
                rate / floor_rate
            );
        }
    }
    println!();
    println!(
        "CPU a call (µs, the median of rounds): this process (the executor, the pool, \
         tokio-postgres) / the rest of the machine (PostgreSQL, PgBouncer)"
    );
    println!();
    println!("| side | concurrency | client µs | servers µs | total µs |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (c, tasks) in CONCURRENCY.iter().enumerate() {
        for i in 0..SIDES.len() {
            if rates[c][i].iter().all(|r| r.0.is_nan()) {
                continue;
            }
            let client = median(rates[c][i].iter().map(|r| r.2 .0).collect());
            let servers = median(rates[c][i].iter().map(|r| r.2 .1).collect());
            println!(
                "| {} | {tasks} | {client:.0} | {servers:.0} | {:.0} |",
                names[i],
                client + servers
            );
        }
    }
    println!();
    let relaxed: Vec<f64> = ratios.iter().map(|r| r.0).collect();
    let synchronous: Vec<f64> = ratios.iter().map(|r| r.1).collect();
    let background: Vec<f64> = ratios.iter().map(|r| r.2).collect();
    let ((a, b), (c, d), (e, f)) = (range(&relaxed), range(&synchronous), range(&background));
    println!(
        "per-round median ratio to the floor: relaxed {a:.2}–{b:.2}×, synchronous {c:.2}–{d:.2}×, \
         in the background {e:.2}–{f:.2}×"
    );
    println!(
        "the completion's round trip (raw pair − floor): {:.0} µs; executor relaxed − raw pair: {:.0} µs",
        pooled[1].0 - pooled[0].0,
        pooled[2].0 - pooled[1].0
    );
    // The goals of the default builder, each beside its floor.
    let rate = |c: usize, i: usize| median(rates[c][i].iter().map(|r| r.0).collect());
    println!(
        "default builder ÷ floor, concurrency 1: {:.2}×; ÷ direct_connection(true): {:.2}×; \
         through PgBouncer ÷ its floor there: {:.2}×",
        pooled[6].0 / floor,
        pooled[6].0 / pooled[4].0,
        pooled[8].0 / pooled[7].0,
    );
    println!(
        "the claim's function alone ÷ floor: named {:.2}×, unnamed {:.2}×; unnamed ÷ named {:.2}× \
         (the parse a call without session state pays)",
        pooled[9].0 / floor,
        pooled[10].0 / floor,
        pooled[10].0 / pooled[9].0,
    );
    for (c, tasks) in CONCURRENCY.iter().enumerate() {
        println!(
            "concurrency {tasks}: default builder ÷ floor {:.2}×; ÷ direct_connection(true) {:.2}×; \
             direct_connection(true) ÷ floor {:.2}×",
            rate(c, 6) / rate(c, 0),
            rate(c, 6) / rate(c, 4),
            rate(c, 4) / rate(c, 0),
        );
    }
    println!();
}

async fn postgres(rounds: usize) {
    let url = std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("bench_{:016x}", Attempt::random().get());
    // Named, cached statements, as the floor's: the bench connects to the
    // server itself. One side keeps the default (unnamed statements, each
    // parsed and planned again), which a transaction pooler needs.
    let builder = || PostgresStore::builder(&url).unwrap().schema(&schema);
    // Every side has a pool (or a store) of its own, used once in each
    // turn of the sides: a pool two sides share keeps its server backend
    // warmer than the others', which shows as a cheaper call. The server
    // takes 100 connections: the goals' sides (the floor, the fifth, the
    // seventh, and PgBouncer's 20) have 16 each, the four others 6 (their
    // rates at 16 and 64 are those of 6 connections).
    const SMALL: usize = 6;
    let store = |relaxed, size| {
        builder()
            .direct_connection(true)
            .relaxed_completions(relaxed)
            .pool_size(size)
            .build()
            .unwrap()
    };
    let (relaxed, synchronous) = (store(true, SMALL), store(false, SMALL));
    relaxed.migrate().await.unwrap();
    let alone = builder()
        .direct_connection(true)
        .batched_completions(false)
        .pool_size(SMALL)
        .build()
        .unwrap();
    let unnamed = builder().build().unwrap();
    let (claim, complete) = pg_statements(&format!("{}.idem_records", relaxed.schema()));
    let raw_pool = |size| {
        let manager = deadpool_postgres::Manager::from_config(
            url.parse().unwrap(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        deadpool_postgres::Pool::builder(manager)
            .max_size(size)
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap()
    };
    let (pool, pair_pool) = (raw_pool(16), raw_pool(SMALL));
    let function = |named| Raw::PgFunction {
        pool: raw_pool(1),
        call: format!(
            "SELECT {}.idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            relaxed.schema()
        ),
        named,
    };
    let pgbouncer = std::env::var("IDEM_TEST_PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".into());
    let through = PostgresStore::builder(&pgbouncer)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    if let Err(e) = through.check_layout().await {
        panic!("PgBouncer at {pgbouncer}: {e} (scripts/pgbouncer start)");
    }
    // The floor through PgBouncer logs in as another role (`root`, which
    // scripts/pgbouncer lets in as it does `postgres`): PgBouncer keeps a
    // pool of server connections per role, so the floor's one client has
    // one server connection to itself, on which its named statement stays
    // prepared, whatever the default builder's calls take. A connection
    // PgBouncer kept from an earlier run may hold statements of the same
    // names: they go first.
    let mut floor_config: tokio_postgres::Config = pgbouncer.parse().unwrap();
    floor_config.user("root");
    let pgbouncer_pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::from_config(
        floor_config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    ))
    .max_size(1)
    .runtime(deadpool_postgres::Runtime::Tokio1)
    .build()
    .unwrap();
    pgbouncer_pool
        .get()
        .await
        .unwrap()
        .batch_execute("DEALLOCATE ALL")
        .await
        .unwrap();
    let exec = |s: PostgresStore| Executor::new(Arc::new(s) as Arc<dyn IdempotencyStore>);
    let sides = Arc::new(Sides {
        name: "PostgresStore",
        pgbouncer_floor: Raw::Pg {
            pool: pgbouncer_pool,
            claim: claim.clone(),
            complete: complete.clone(),
        },
        pgbouncer_default: exec(through).with_background_completions(true),
        function_named: function(true),
        function_unnamed: function(false),
        flusher: Some(raw_pool(1)),
        raw_pair: Raw::Pg {
            pool: pair_pool,
            claim: claim.clone(),
            complete: complete.clone(),
        },
        raw: Raw::Pg {
            pool: pool.clone(),
            claim,
            complete,
        },
        relaxed: exec(relaxed.clone()),
        synchronous: exec(synchronous),
        background: exec(store(true, 16)).with_background_completions(true),
        background_alone: exec(alone).with_background_completions(true),
        background_unnamed: exec(unnamed).with_background_completions(true),
        caller: Caller::new("acme", "alice"),
    });
    compare(sides, rounds, 1000, 100).await;
    let client = pool.get().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", relaxed.schema()))
        .await
        .unwrap();
}

async fn sqlite(rounds: usize) {
    let dir = std::env::temp_dir().join(format!("idem-bench-commit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = async |name: &str, relaxed| {
        SqliteStore::builder()
            .relaxed_completions(relaxed)
            .open(dir.join(name))
            .await
            .unwrap()
    };
    let (relaxed, synchronous) = (
        store("relaxed.sqlite3", true).await,
        store("synchronous.sqlite3", false).await,
    );
    // The floor's file: migrated by a store, then a connection of its own
    // as the store's writer sets it up (WAL, synchronous = FULL).
    let floor = dir.join("floor.sqlite3");
    drop(store("floor.sqlite3", false).await);
    let conn = rusqlite::Connection::open(&floor).unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    let exec = |s: SqliteStore| Executor::new(Arc::new(s) as Arc<dyn IdempotencyStore>);
    let floor_again = || {
        let conn = rusqlite::Connection::open(&floor).unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        conn
    };
    let sides = Arc::new(Sides {
        name: "SqliteStore",
        raw: Raw::Sqlite(Mutex::new(conn)),
        pgbouncer_floor: Raw::Sqlite(Mutex::new(floor_again())),
        function_named: Raw::Sqlite(Mutex::new(floor_again())),
        function_unnamed: Raw::Sqlite(Mutex::new(floor_again())),
        flusher: None,
        raw_pair: Raw::Sqlite(Mutex::new(floor_again())),
        pgbouncer_default: exec(relaxed.clone()).with_background_completions(true),
        background: exec(relaxed.clone()).with_background_completions(true),
        background_alone: exec(relaxed.clone()).with_background_completions(true),
        background_unnamed: exec(relaxed.clone()).with_background_completions(true),
        relaxed: exec(relaxed),
        synchronous: exec(synchronous),
        caller: Caller::new("acme", "alice"),
    });
    compare(sides, rounds, 1000, 100).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::main]
async fn main() {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let wants = |name: &str| only.is_empty() || only.iter().any(|a| a == name);
    let rounds = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    println!("load average at start: {}", common::load());
    if wants("postgres") {
        postgres(rounds).await;
    }
    if wants("sqlite") {
        sqlite(rounds).await;
    }
    println!("load average at end: {}", common::load());
}
