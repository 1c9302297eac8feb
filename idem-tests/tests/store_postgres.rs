//! PostgresStore: the conformance suite, migrations, and what only a shared
//! server store has. Needs `IDEM_TEST_DATABASE_URL` (see `durable::database_url`).

mod durable;
#[path = "store_postgres/online.rs"]
mod online;

use std::sync::Arc;
use std::time::Duration;

use durable::PgSchema;
use idem_runtime::store::{Inspect, Upkeep};
use idem_runtime::{
    store::{conformance, Attempt, FollowOnStore},
    IdempotencyStore,
};

// Each case in a fresh schema of its own, dropped at the end.
idem_runtime::conformance_tests!(PgSchema::new().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    conformance::run_all(&pg.store).await;
}

/// Migrating twice, and from several stores at once, is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_is_idempotent_and_safe_concurrently() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let others: Vec<_> = (0..4)
        .map(|_| {
            idem_runtime::PostgresStore::builder(&pg.url)
                .unwrap()
                .schema(&pg.name)
                .build()
                .unwrap()
        })
        .collect();
    let runs = others.iter().map(|s| {
        let s = s.clone();
        async move { s.migrate().await }
    });
    for r in tokio_join_all(runs).await {
        r.unwrap();
    }
    pg.store.migrate().await.unwrap();
    let client = durable::connect(&pg.url).await;
    let versions = client
        .query(
            &format!(
                "SELECT version FROM {}.idem_migrations ORDER BY version",
                pg.store.schema()
            ),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = versions.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        versions,
        [1, 2, 3, 4, 5, 6, 7, 8, 9],
        "each shipped migration recorded once"
    );
    conformance::claim_creates_in_progress(&others[0]).await;
}

async fn tokio_join_all<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A server that is not there fails fast and says so, without a database.
#[tokio::test]
async fn unreachable_server_fails_fast() {
    // Port 1 on loopback: nothing listens there.
    let store = idem_runtime::PostgresStore::builder("postgres://nobody@127.0.0.1:1/none")
        .unwrap()
        .timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = store.migrate().await.unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(
        matches!(err, idem_runtime::StoreError::Unavailable(ref m) if m.contains("PostgreSQL")),
        "{err}"
    );
    let err = idem_runtime::PostgresStore::connect("postgres://nobody@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem_runtime::StoreError::Unavailable(_)),
        "{err}"
    );
}

/// Times come from the server's clock: a claim's times fall between two
/// readings of the server's `now()`.
#[tokio::test]
async fn times_come_from_the_server() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let client = durable::connect(&pg.url).await;
    let server_now = async || -> std::time::SystemTime {
        client.query_one("SELECT now()", &[]).await.unwrap().get(0)
    };
    let before = server_now().await;
    let req = durable::request(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_secs(60),
    );
    pg.store.claim(&req).await.unwrap();
    let after = server_now().await;
    let record = pg
        .store
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(before <= record.claimed_at && record.claimed_at <= after);
    assert_eq!(
        record
            .lease_until
            .duration_since(record.claimed_at)
            .unwrap(),
        std::time::Duration::from_secs(30)
    );
    assert_eq!(
        record.expires_at.duration_since(record.claimed_at).unwrap(),
        std::time::Duration::from_secs(60)
    );
}

/// A store whose schema was never migrated says what to do.
#[tokio::test]
async fn unmigrated_schema_says_to_migrate() {
    let Some(url) = durable::database_url() else {
        return;
    };
    let store = idem_runtime::PostgresStore::builder(&url)
        .unwrap()
        .schema("t_never_migrated")
        .build()
        .unwrap();
    let err = store.list_unknown(1).await.unwrap_err();
    assert!(err.to_string().contains("migrate()"), "{err}");
}

/// A connection of the test's own holding the record of `key` locked, in a
/// transaction it ends with `COMMIT` or `ROLLBACK` (as a concurrent claim or
/// a reconciler would hold it).
async fn lock_record(
    pg: &PgSchema,
    key: &idem_runtime::key::IdempotencyKey,
) -> tokio_postgres::Client {
    let locker = durable::connect(&pg.url).await;
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .execute(
            &format!(
                "SELECT 1 FROM {}.idem_records WHERE key = $1 FOR UPDATE",
                pg.store.schema()
            ),
            &[&&key.as_bytes()[..]],
        )
        .await
        .unwrap();
    locker
}

/// Purge skips a row that someone holds locked (a claim taking it over right
/// now) instead of waiting for it, and deletes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_locked_rows() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let short = std::time::Duration::from_millis(50);
    let held = durable::request(short, short);
    let free = durable::request(short, short);
    for req in [&held, &free] {
        pg.store.claim(req).await.unwrap();
        pg.store.complete(&req.key, req.attempt, "1").await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let locker = lock_record(&pg, &held.key).await;

    let purged = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        pg.store.purge_expired(100),
    )
    .await
    .expect("purge does not wait for a locked row")
    .unwrap();
    assert_eq!(purged, 1);
    assert!(pg
        .store
        .lookup(&free.tenant, &free.reference)
        .await
        .unwrap()
        .is_none());
    assert!(pg
        .store
        .lookup(&held.tenant, &held.reference)
        .await
        .unwrap()
        .is_some());
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(pg.store.purge_expired(100).await.unwrap(), 1);
}

/// A lease skips a job another transaction holds locked (`FOR UPDATE SKIP
/// LOCKED`) instead of waiting for it, and leases it once the lock is gone.
/// The job's times come from the server's clock.
#[tokio::test]
async fn lease_skips_locked_jobs() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let client = durable::connect(&pg.url).await;
    let server_now = async || -> std::time::SystemTime {
        client.query_one("SELECT now()", &[]).await.unwrap().get(0)
    };
    let name = format!("receipt_{}", idem_runtime::store::Attempt::random().get());
    let window = std::time::Duration::from_secs(60);
    let (held, free) = (
        durable::request(window, window),
        durable::request(window, window),
    );
    let before = server_now().await;
    for req in [&held, &free] {
        pg.store.claim(req).await.unwrap();
        let job =
            idem_runtime::follow_ons::FollowOn::new(&name, &serde_json::json!({ "n": 1 })).unwrap();
        pg.store
            .complete_with_follow_ons(
                &req.key,
                req.attempt,
                "1",
                idem_runtime::store::FollowOns::new(&[job]).unwrap(),
            )
            .await
            .unwrap();
    }
    let after = server_now().await;
    let written = pg
        .store
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            name: Some(name.clone()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(written.len(), 2);
    for job in &written {
        assert!(
            before <= job.created_at && job.created_at <= after,
            "{job:?}"
        );
        assert_eq!(job.next_run_at, job.created_at);
    }

    let mut locker = durable::connect(&pg.url).await;
    let tx = locker.transaction().await.unwrap();
    // The job's row, locked as another dispatcher's lease would hold it.
    tx.execute(
        &format!(
            "SELECT 1 FROM {}.idem_jobs WHERE tenant = $1 AND reference = $2 FOR UPDATE",
            pg.store.schema()
        ),
        &[&held.tenant, &held.reference.as_bytes()],
    )
    .await
    .unwrap();

    let lease = std::time::Duration::from_secs(60);
    let token = idem_runtime::store::Attempt::random();
    let leased = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        pg.store
            .lease_follow_ons(&[name.as_str()], 10, lease, token),
    )
    .await
    .expect("a lease does not wait for a locked job")
    .unwrap();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].id.reference, free.reference);
    let leased_until = leased[0].next_run_at;
    let since = leased_until.duration_since(leased[0].updated_at).unwrap();
    assert_eq!(
        since, lease,
        "the lease's end is the server's now() + lease"
    );
    tx.rollback().await.unwrap();
    let rest = pg
        .store
        .lease_follow_ons(
            &[name.as_str()],
            10,
            lease,
            idem_runtime::store::Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id.reference, held.reference);
}

/// A claim decides at its statement's start and, when it finds a live
/// record, reads that record in a second statement. When the record's window
/// ends between the two (here: the claim waits on a row lock across the
/// end), the claim must not answer with a record that could be taken over
/// at the time it was read: a repeat after the window is a new operation,
/// and the answer's `observed_at` says the window is over. It claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waits_past_the_window_takes_the_record_over() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let window = std::time::Duration::from_millis(800);
    let first = durable::request(window, window);
    pg.store.claim(&first).await.unwrap();
    pg.store
        .complete(&first.key, first.attempt, "\"first\"")
        .await
        .unwrap();
    let record = pg
        .store
        .lookup(&first.tenant, &first.reference)
        .await
        .unwrap()
        .unwrap();

    // Another transaction holds the row from before the window's end until
    // after it, as a concurrent claim or a reconciler may.
    let locker = lock_record(&pg, &first.key).await;

    let second = idem_runtime::store::ClaimRequest {
        attempt: idem_runtime::store::Attempt::random(),
        ..first.clone()
    };
    let store = pg.store.clone();
    let repeat = tokio::spawn(async move { store.claim(&second).await });
    // The repeat's statement starts while the record is live, then waits.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!repeat.is_finished(), "the repeat waits for the row lock");
    let end = record.expires_at;
    while std::time::SystemTime::now() < end + std::time::Duration::from_millis(200) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    locker.batch_execute("COMMIT").await.unwrap();

    match repeat.await.unwrap().unwrap() {
        idem_runtime::store::Claim::Claimed { .. } => {}
        idem_runtime::store::Claim::Existing { record } => panic!(
            "the repeat was answered with a record it could take over (claimable at its \
             observed_at: {}): {record:?}",
            record.is_claimable(record.observed_at)
        ),
    }
}

/// Rows written before migration 4 (no operation tag on the record, an
/// 8-byte reference on the job) keep their references after the upgrade;
/// a job written before migration 5 (no delivered_at, kept_until) runs and
/// is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_jobs_written_before_tags_keep_their_references() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let (req, name) = durable::completed_with_a_job(&pg.store).await;
    let client = durable::connect(&pg.url).await;
    client
        .batch_execute(&format!(
            "UPDATE {0}.idem_records SET operation = NULL; \
             UPDATE {0}.idem_jobs SET reference = substring(reference FROM 1 FOR 8); \
             ALTER TABLE {0}.idem_jobs DROP COLUMN delivered_at, DROP COLUMN kept_until; \
             CREATE INDEX idem_jobs_due ON {0}.idem_jobs (next_run_at) WHERE NOT dead; \
             DELETE FROM {0}.idem_migrations WHERE version = 5;",
            pg.store.schema()
        ))
        .await
        .unwrap();
    pg.store.migrate().await.unwrap();
    durable::legacy_rows_still_work(&pg.store, &req, &name).await;
}

/// The conformance suite with synchronous completions too (the cases above
/// run with the default, relaxed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_pass_with_synchronous_completions() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let store = idem_runtime::PostgresStore::builder(&pg.url)
        .unwrap()
        .schema(&pg.name)
        .relaxed_completions(false)
        .build()
        .unwrap();
    conformance::run_all(&store).await;
}

/// The conformance suite on a direct connection with named, cached
/// statements and the server's statement_timeout
/// (`PostgresStoreBuilder::direct_connection`); the cases above run with the
/// default, which works behind a transaction pooler too (CI points
/// `IDEM_TEST_DATABASE_URL` at PgBouncer in transaction mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_pass_with_named_statements_on_a_direct_connection() {
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let pg = PgSchema::open(&url, &format!("t_{:016x}", Attempt::random().get())).await;
    let store = idem_runtime::PostgresStore::builder(&pg.url)
        .unwrap()
        .schema(&pg.name)
        .direct_connection(true)
        .build()
        .unwrap();
    conformance::run_all(&store).await;
}

/// Behind PgBouncer in transaction mode (`IDEM_TEST_PGBOUNCER_URL`), with
/// the default builder: 120 charges through the executor, 40 at a time,
/// then each again. No store error, one charge per operation at the
/// processor stub, and every repeat replayed. Before the store sent its
/// statements unnamed, most of these failed with `prepared statement "sN"
/// does not exist` or `already exists`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_40_concurrent_callers_make_no_store_error() {
    use idem_runtime::{
        answer::Answer,
        executor::{Operation, ScopeSpec},
        Caller, Executor, ToolError,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(url) = durable::url_from(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    ) else {
        return;
    };
    let name = format!("t_{:016x}", Attempt::random().get());
    let pg = PgSchema::open(&url, &name).await;
    let store = idem_runtime::PostgresStore::builder(&url)
        .unwrap()
        .schema(&name)
        .pool_size(40)
        .build()
        .unwrap();
    let executor = Arc::new(Executor::new(Arc::new(store)));
    let charges = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(40));
    for round in ["first", "repeat"] {
        let mut tasks = Vec::new();
        for card in 0..120 {
            let (executor, charges, gate) = (executor.clone(), charges.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let caller = Caller::new("acme", "alice");
                let args = serde_json::json!({"card": format!("tok_{card}"), "amount_cents": 500});
                let op = Operation {
                    caller: &caller,
                    tool: "charge_card",
                    args: &args,
                    scope: ScopeSpec::Window(Duration::from_secs(900)),
                    status_tool: "get_operation_status",
                };
                executor
                    .run(op, |_| async {
                        charges.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, ToolError>(card)
                    })
                    .await
            }));
        }
        for task in tasks {
            match (round, task.await.unwrap()) {
                ("first", Answer::Executed { .. }) | ("repeat", Answer::Replayed { .. }) => {}
                (round, other) => panic!("{round}: {other:?}"),
            }
        }
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        120,
        "one charge per operation"
    );
    drop(pg);
}

/// A relaxed completion (with or without follow-ons) commits with
/// `synchronous_commit = off`, and the setting ends with its statement: on
/// a pool of one connection, the claim, the sweep's mark, the resolution and
/// the release after it see `on`. Triggers on the store's tables note the
/// setting (and the backend) of every row each statement writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_completion_does_not_outlive_its_statement() {
    use idem_runtime::{follow_ons::FollowOn, store::Resolution};
    // One server backend for the whole test, so a direct connection: behind
    // a transaction pooler each statement may land on another backend.
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let pg = PgSchema::open(&url, &format!("t_{:016x}", Attempt::random().get())).await;
    let s = pg.store.schema().to_owned();
    let client = durable::connect(&pg.url).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {s}.seen (n serial, op text, tbl text, setting text, pid int); \
             CREATE FUNCTION {s}.note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               INSERT INTO {s}.seen (op, tbl, setting, pid) VALUES (TG_OP, TG_TABLE_NAME, \
                 current_setting('synchronous_commit'), pg_backend_pid()); \
               RETURN NULL; END $$; \
             CREATE TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON {s}.idem_records \
               FOR EACH ROW EXECUTE FUNCTION {s}.note(); \
             CREATE TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON {s}.idem_jobs \
               FOR EACH ROW EXECUTE FUNCTION {s}.note();"
        ))
        .await
        .unwrap();
    for relaxed in [true, false] {
        let store = idem_runtime::PostgresStore::builder(&pg.url)
            .unwrap()
            .schema(&pg.name)
            .pool_size(1)
            .relaxed_completions(relaxed)
            .build()
            .unwrap();
        let request = || {
            durable::request(
                std::time::Duration::from_secs(30),
                std::time::Duration::from_secs(60),
            )
        };
        let (a, b, c, d) = (request(), request(), request(), request());
        let job = |name: &str| vec![FollowOn::new(name, &serde_json::json!({"n": 1})).unwrap()];
        store.claim(&a).await.unwrap();
        store.complete(&a.key, a.attempt, "\"a\"").await.unwrap();
        store.claim(&b).await.unwrap();
        store
            .complete_with_follow_ons(
                &b.key,
                b.attempt,
                "\"b\"",
                idem_runtime::store::FollowOns::new(&job("receipt")).unwrap(),
            )
            .await
            .unwrap();
        store.claim(&c).await.unwrap();
        store.mark_unknown(&c.key, c.attempt, "lost").await.unwrap();
        store
            .resolve_with_follow_ons(
                &c.key,
                c.attempt,
                "\"c\"",
                None,
                idem_runtime::store::FollowOns::new(&job("receipt")).unwrap(),
            )
            .await
            .unwrap();
        store.claim(&d).await.unwrap();
        store.mark_unknown(&d.key, d.attempt, "lost").await.unwrap();
        store
            .resolve(
                &d.key,
                d.attempt,
                Resolution::Completed { response: "\"d\"" },
                Some("by hand"),
            )
            .await
            .unwrap();
        let e = request();
        store.claim(&e).await.unwrap();
        store.release(&e.key, e.attempt).await.unwrap();

        let rows = client
            .query(
                &format!("DELETE FROM {s}.seen RETURNING n, op, tbl, setting, pid"),
                &[],
            )
            .await
            .unwrap();
        let mut rows: Vec<(i32, String, String, String, i32)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        rows.sort();
        let pids: std::collections::BTreeSet<i32> = rows.iter().map(|r| r.4).collect();
        assert_eq!(pids.len(), 1, "one connection wrote everything: {rows:?}");
        let off = if relaxed { "off" } else { "on" };
        let seen: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.1.as_str(), r.2.as_str(), r.3.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("INSERT", "idem_records", "on"), // claim a
                ("UPDATE", "idem_records", off),  // complete a
                ("INSERT", "idem_records", "on"), // claim b
                ("UPDATE", "idem_records", off),  // complete b …
                ("INSERT", "idem_jobs", off),     // … and its job
                ("INSERT", "idem_records", "on"), // claim c
                ("UPDATE", "idem_records", "on"), // mark c unknown
                ("UPDATE", "idem_records", "on"), // the reconciler resolves c …
                ("INSERT", "idem_jobs", "on"),    // … with its job
                ("INSERT", "idem_records", "on"), // claim d
                ("UPDATE", "idem_records", "on"), // mark d unknown
                ("UPDATE", "idem_records", "on"), // resolved by hand
                ("INSERT", "idem_records", "on"), // claim e
                ("DELETE", "idem_records", "on"), // release e
            ],
            "relaxed_completions({relaxed})"
        );
    }
}

/// A schema written at migration 5 (the DDL of the shipped migrations 1 to
/// 5, as that store applied them, and rows as it wrote them, a late
/// resolution by its own statement) migrates to the newest and serves: see
/// `durable::old_records_still_work`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_migration_5_upgrades() {
    const OLD: [&str; 5] = [
        include_str!("../../idem-runtime/migrations/postgres/0001_records.sql"),
        include_str!("../../idem-runtime/migrations/postgres/0002_lifecycle.sql"),
        include_str!("../../idem-runtime/migrations/postgres/0003_outbox.sql"),
        include_str!("../../idem-runtime/migrations/postgres/0004_operations.sql"),
        include_str!("../../idem-runtime/migrations/postgres/0005_delivered_jobs.sql"),
    ];
    let Some(url) = durable::database_url() else {
        return;
    };
    let name = format!("t_{:016x}", idem_runtime::store::Attempt::random().get());
    let schema = format!("\"{name}\"");
    let client = durable::connect(&url).await;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; \
             CREATE TABLE {schema}.idem_migrations ( \
               version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now()); \
             INSERT INTO {schema}.idem_migrations (version) VALUES (1), (2), (3), (4), (5);"
        ))
        .await
        .unwrap();
    for sql in OLD {
        client
            .batch_execute(&sql.replace("{schema}", &schema))
            .await
            .unwrap();
    }
    let (old, rows) = durable::OldRecords::new();
    for r in &rows {
        let ms = |n: i64| format!("now() + interval '{n} milliseconds'");
        client
            .execute(
                &format!(
                    "INSERT INTO {schema}.idem_records (key, fingerprint, tenant, tool, state, \
                       attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, \
                       body, next_check_at, checks, resolution, operation) \
                     VALUES ($1, $2, $3, $4, $5, $6, {c}, {c}, {}, {}, {}, $7, {c}, 0, NULL, $8)",
                    ms(r.lease_until),
                    ms(r.expires_at),
                    ms(r.retain_until),
                    c = ms(r.claimed_at),
                ),
                &[
                    &&r.req.key.as_bytes()[..],
                    &&r.req.key.fingerprint()[..],
                    &r.req.tenant,
                    &r.req.tool,
                    &r.state,
                    &(r.req.attempt.get() as i64),
                    &r.body.map(str::as_bytes),
                    &(r.req.reference.tag() as i64),
                ],
            )
            .await
            .unwrap();
    }
    // That store's resolution of an UNKNOWN record as completed.
    let changed = client
        .execute(
            &format!(
                "UPDATE {schema}.idem_records SET state = 1, body = $3, resolution = NULL, \
                   updated_at = now(), expires_at = GREATEST(expires_at, retain_until) \
                 WHERE key = $1 AND attempt = $2 AND state = 2"
            ),
            &[
                &&old.extended.key.as_bytes()[..],
                &(old.extended.attempt.get() as i64),
                &durable::LATE.as_bytes(),
            ],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
    let pg = PgSchema::open(&url, &name).await;
    durable::old_records_still_work(&pg.store, &old).await;
}

/// Issue 33 end to end through `Executor::run` on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_truth_frees_the_key_through_the_executor() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    durable::late_truth_frees_the_key_through_the_executor(std::sync::Arc::new(pg.store.clone()))
        .await;
}

/// Concurrent claims of a key whose record must be kept when taken over
/// (its window over, its retention not): exactly one takes the key, the
/// others find its claim, and the earlier operation is kept once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_takeovers_of_a_kept_record_yield_one_winner() {
    use idem_runtime::store::{conformance::new_operation, Claim, RecordFilter};
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    for _ in 0..5 {
        let first = idem_runtime::store::ClaimRequest {
            retention: std::time::Duration::from_secs(60),
            ..durable::request(
                std::time::Duration::from_secs(30),
                std::time::Duration::from_millis(100),
            )
        };
        pg.store.claim(&first).await.unwrap();
        pg.store
            .complete(&first.key, first.attempt, "\"first\"")
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        let claims = (0..8).map(|_| {
            let (store, req) = (pg.store.clone(), new_operation(&first));
            async move { store.claim(&req).await }
        });
        let claims = tokio_join_all(claims).await;
        let won = claims
            .iter()
            .filter(|c| matches!(c, Ok(Claim::Claimed { .. })))
            .count();
        assert_eq!(won, 1, "{claims:?}");
        let listed = pg
            .store
            .list_records(&RecordFilter {
                tenant: Some(first.tenant.clone()),
                ..RecordFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 2, "the new operation and the kept one");
        let kept = pg
            .store
            .lookup(&first.tenant, &first.reference)
            .await
            .unwrap()
            .expect("kept");
        assert_eq!(kept.attempt, first.attempt);
    }
}

/// Completions that arrive while another is in flight are written together
/// (`batched_completions`, on by default), and each still answers for its
/// own attempt: the owner's lands with its own response, a stranger's is
/// fenced, a second completion finds the record COMPLETED. Batching is
/// seen at the far side: rows completed by one statement share its
/// transaction's `now()` as their `updated_at`. With batching off, the same
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_in_flight_together_each_answer_for_their_own_attempt() {
    use idem_runtime::store::{RecordState, StoreError};
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    for batched in [true, false] {
        let store = idem_runtime::PostgresStore::builder(&pg.url)
            .unwrap()
            .schema(&pg.name)
            .pool_size(8)
            .batched_completions(batched)
            .build()
            .unwrap();
        let long = Duration::from_secs(600);
        // The first completion is held in flight by a row lock, so that the
        // others arrive while it is written.
        let first = durable::request(long, long);
        store.claim(&first).await.unwrap();
        let (owned, stranger, twice): (Vec<_>, Vec<_>, Vec<_>) = (
            (0..24).map(|_| durable::request(long, long)).collect(),
            (0..8).map(|_| durable::request(long, long)).collect(),
            (0..8).map(|_| durable::request(long, long)).collect(),
        );
        for req in owned.iter().chain(&stranger).chain(&twice) {
            store.claim(req).await.unwrap();
        }
        for req in &twice {
            store
                .complete(&req.key, req.attempt, "\"before\"")
                .await
                .unwrap();
        }
        let locker = lock_record(&pg, &first.key).await;
        let held = {
            let store = store.clone();
            let first = first.clone();
            tokio::spawn(
                async move { store.complete(&first.key, first.attempt, "\"first\"").await },
            )
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let body = |i: usize| format!("{{\"n\":{i}}}");
        let calls = owned
            .iter()
            .enumerate()
            .map(|(i, r)| (r.key, r.attempt, body(i)))
            .chain(
                stranger
                    .iter()
                    .map(|r| (r.key, Attempt::random(), "\"stranger\"".into())),
            )
            .chain(twice.iter().map(|r| (r.key, r.attempt, "\"again\"".into())))
            .map(|(key, attempt, response): (_, _, String)| {
                let store = store.clone();
                tokio::spawn(async move { store.complete(&key, attempt, &response).await })
            })
            .collect::<Vec<_>>();
        tokio::time::sleep(Duration::from_millis(200)).await;
        locker.batch_execute("ROLLBACK").await.unwrap();
        held.await.unwrap().unwrap();
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await.unwrap());
        }
        let (a_owned, rest) = answers.split_at(owned.len());
        let (a_stranger, a_twice) = rest.split_at(stranger.len());
        assert!(a_owned.iter().all(Result::is_ok), "{a_owned:?}");
        assert!(
            a_stranger
                .iter()
                .all(|a| matches!(a, Err(StoreError::Fenced))),
            "{a_stranger:?}"
        );
        assert!(
            a_twice
                .iter()
                .all(|a| matches!(a, Err(StoreError::WrongState { .. }))),
            "{a_twice:?}"
        );
        let read = async |req: &idem_runtime::store::ClaimRequest| {
            let r = store
                .lookup(&req.tenant, &req.reference)
                .await
                .unwrap()
                .unwrap();
            (r.state, r.updated_at)
        };
        let mut times = Vec::new();
        for (i, req) in owned.iter().enumerate() {
            let (state, at) = read(req).await;
            assert_eq!(state, RecordState::Completed { response: body(i) });
            times.push(at);
        }
        for req in &stranger {
            assert_eq!(read(req).await.0, RecordState::InProgress);
        }
        for req in &twice {
            let response = "\"before\"".to_owned();
            assert_eq!(read(req).await.0, RecordState::Completed { response });
        }
        times.sort();
        let shared = times.windows(2).filter(|w| w[0] == w[1]).count();
        if batched {
            assert!(
                shared > 0,
                "no two completions shared a statement: {times:?}"
            );
        }
    }
}

/// Every insert and update of the store's records, as the server applied
/// it (committed with the statement that made it): a trigger copies the
/// key, the attempt and the state of each row written into `audit`.
async fn audit_writes(client: &tokio_postgres::Client, schema: &str) {
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.audit (key bytea, attempt int8, state int2, \
               at timestamptz NOT NULL DEFAULT clock_timestamp()); \
             CREATE FUNCTION {schema}.audit() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN INSERT INTO {schema}.audit (key, attempt, state) \
                 VALUES (NEW.key, NEW.attempt, NEW.state); RETURN NEW; END $$; \
             CREATE TRIGGER audit AFTER INSERT OR UPDATE ON {schema}.idem_records \
               FOR EACH ROW EXECUTE FUNCTION {schema}.audit();"
        ))
        .await
        .unwrap();
}

/// The (attempt, state) of every write of `key`'s record since
/// [`audit_writes`], in order.
async fn audited(
    client: &tokio_postgres::Client,
    schema: &str,
    key: &idem_runtime::key::IdempotencyKey,
) -> Vec<(i64, i16)> {
    client
        .query(
            &format!("SELECT attempt, state FROM {schema}.audit WHERE key = $1 ORDER BY at"),
            &[&&key.as_bytes()[..]],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The statements of the store in `schema` that the server is running
/// right now (waiting on a lock included), other than `except`'s own.
async fn running_statements(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT query FROM pg_stat_activity \
             WHERE state = 'active' AND pid <> pg_backend_pid() \
               AND position($1 IN query) > 0",
            &[&format!("{schema}.idem_records")],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The default builder's timeout on a statement that waits on a row lock
/// (another transaction holds the record the claim takes over, as a
/// checkpoint, a failover or a long reconciler would stall it): the call
/// is answered store_unavailable within about the timeout, and the
/// statement is cancelled on the server then, not left waiting to commit
/// the claim once the lock goes. So the claim never lands, the retry runs
/// the charge once, and nothing ever reads as unknown.
async fn a_stalled_claim_is_cancelled_on_the_server(url: &str, direct: bool) {
    use idem_runtime::{answer::Answer, Executor};
    let name = format!("t_{:016x}", Attempt::random().get());
    let pg = PgSchema::open(url, &name).await;
    let schema = pg.store.schema().to_owned();
    let timeout = Duration::from_secs(1);
    let store = idem_runtime::PostgresStore::builder(url)
        .unwrap()
        .schema(&name)
        .timeout(timeout)
        .direct_connection(direct)
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store));
    let processor = durable::Processor::default();
    let call = || durable::charge(&executor, &processor, "tok_stall");

    // The call's record, past its retention: the call's claim takes it
    // over in one statement, which needs the row's lock.
    let key = durable::charge_key("tok_stall");
    let short = Duration::from_millis(50);
    let old = idem_runtime::store::ClaimRequest {
        key,
        reference: idem_runtime::Reference::new_operation(&key),
        tenant: "acme".into(),
        tool: "charge_card".into(),
        ..durable::request(short, short)
    };
    pg.store.claim(&old).await.unwrap();
    pg.store
        .complete(&old.key, old.attempt, "\"old\"")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let observer = durable::connect(url).await;
    audit_writes(&observer, &schema).await;

    // Another transaction holds the row for about 3 s.
    let locker = lock_record(&pg, &key).await;
    let held = std::time::Instant::now();
    let first = call().await;
    let answered = held.elapsed();
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    assert!(
        answered < timeout + Duration::from_millis(1_500),
        "answered after {answered:?}, with a timeout of {timeout:?}"
    );
    // Before the lock goes: the server is running nothing of the store's.
    let mut running = running_statements(&observer, &schema).await;
    let looked = std::time::Instant::now();
    while !running.is_empty() && looked.elapsed() < Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        running = running_statements(&observer, &schema).await;
    }
    assert!(
        running.is_empty(),
        "{:?} after the call was answered, the server still runs the claim: {running:?}",
        held.elapsed()
    );
    assert!(
        held.elapsed() < Duration::from_secs(3),
        "the test was too slow"
    );
    tokio::time::sleep_until(
        (tokio::time::Instant::now() + Duration::from_secs(3)) - held.elapsed(),
    )
    .await;
    locker.batch_execute("COMMIT").await.unwrap();

    // The claim never lands: no write of the record after the lock went.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let writes = audited(&observer, &schema, &key).await;
    assert!(
        writes.is_empty(),
        "the claim given up on landed after the lock was released: {writes:?}"
    );

    // The retry runs the charge, once; a repeat replays it.
    let retry = call().await;
    assert!(matches!(retry, Answer::Executed { .. }), "{retry:?}");
    let repeat = call().await;
    assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
    assert_eq!(processor.requests(), 1, "one request reached the processor");
    assert_eq!(processor.charges(), 1, "one charge");
    let writes = audited(&observer, &schema, &key).await;
    assert!(
        writes
            .iter()
            .all(|(_, state)| *state != idem_runtime::store::RecordStateKind::Unknown.code()),
        "a write made the record UNKNOWN: {writes:?}"
    );
    assert_eq!(
        writes.len(),
        2,
        "the retry's claim and completion: {writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claim_is_cancelled_on_the_server_directly() {
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    a_stalled_claim_is_cancelled_on_the_server(&url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claim_is_cancelled_on_the_server_through_pgbouncer() {
    let Some(url) = durable::url_from(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    ) else {
        return;
    };
    a_stalled_claim_is_cancelled_on_the_server(&url, false).await;
}

/// The claim's own bound on the server (migration 9's `idem_claim`, its
/// `p_bound` the store's timeout), with no cancel from the client: called
/// as the store calls it, on a connection that never cancels. A claim
/// whose insert waited on a row lock for longer than the bound applies
/// nothing once the lock goes; a claim whose write took longer than the
/// bound (a trigger that stalls the insert, as a slow disk would) is not
/// committed. So a caller that gave up on a claim at its timeout never
/// finds it landed, even where its cancel request is lost (TLS behind
/// PgBouncer drops it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_past_its_bound_on_the_server_never_lands() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let schema = pg.store.schema().to_owned();
    let client = Arc::new(durable::connect(&pg.url).await);
    let claim = format!(
        "SELECT {schema}.idem_claim($1, $2, 'acme', 'charge_card', $3, \
           30000000, 60000000, 60000000, 7, $4)"
    );
    let bound_us = Duration::from_millis(300).as_micros() as i64;
    let record = |key: [u8; 32]| {
        let (client, schema) = (client.clone(), schema.clone());
        async move {
            client
                .query_opt(
                    &format!("SELECT attempt FROM {schema}.idem_records WHERE key = $1"),
                    &[&&key[..]],
                )
                .await
                .unwrap()
                .map(|r| r.get::<_, i64>(0))
        }
    };

    // A lock wait: the record is past its retention (claimable), and
    // another transaction holds its row for 1 s, past the bound.
    let key = durable::charge_key("tok_bound_lock");
    let short = Duration::from_millis(50);
    let old = idem_runtime::store::ClaimRequest {
        key,
        ..durable::request(short, short)
    };
    pg.store.claim(&old).await.unwrap();
    pg.store
        .complete(&key, old.attempt, "\"old\"")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let locker = lock_record(&pg, &key).await;
    let waiting = {
        let (client, claim) = (client.clone(), claim.clone());
        tokio::spawn(async move {
            let fingerprint = key.fingerprint();
            client
                .query_one(
                    &claim,
                    &[&&key.as_bytes()[..], &&fingerprint[..], &9_i64, &bound_us],
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "the claim waits on the row lock");
    locker.batch_execute("COMMIT").await.unwrap();
    let refused = waiting
        .await
        .unwrap()
        .expect_err("a claim that waited past its bound is refused");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{refused}"
    );
    assert_eq!(
        record(*key.as_bytes()).await,
        Some(old.attempt.get() as i64),
        "the claim applied after the lock went"
    );

    // A slow write: every insert into the table stalls 600 ms, past the
    // bound; the claim is refused on the server, and no record is left.
    client
        .batch_execute(&format!(
            "CREATE FUNCTION {schema}.stall() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN PERFORM pg_sleep(0.6); RETURN NEW; END $$; \
             CREATE TRIGGER stall BEFORE INSERT ON {schema}.idem_records \
               FOR EACH ROW EXECUTE FUNCTION {schema}.stall();"
        ))
        .await
        .unwrap();
    let fresh = durable::charge_key("tok_bound_slow");
    let fingerprint = fresh.fingerprint();
    let refused = client
        .query_one(
            &claim,
            &[&&fresh.as_bytes()[..], &&fingerprint[..], &1_i64, &bound_us],
        )
        .await
        .expect_err("a claim that took longer than its bound is refused");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{refused}"
    );
    assert_eq!(
        record(*fresh.as_bytes()).await,
        None,
        "the slow claim landed"
    );
    // The same write within its bound lands.
    let wide = 10 * bound_us;
    let row = client
        .query_one(
            &claim,
            &[&&fresh.as_bytes()[..], &&fingerprint[..], &1_i64, &wide],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<i64>>(0), Some(7));
    assert_eq!(record(*fresh.as_bytes()).await, Some(1));
}

/// With `direct_connection(true)` the server's own statement_timeout ends
/// the statement, and the cancel stands behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claim_is_cancelled_on_the_server_on_a_direct_connection() {
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    a_stalled_claim_is_cancelled_on_the_server(&url, true).await;
}

/// Behind PgBouncer in transaction mode, a store built for a direct
/// connection (`direct_connection(true)`, named statements) fails as soon
/// as a statement it prepared is used on another server connection, and
/// it will fail so on every call: that is `StoreError::Config`, saying what
/// to change, not "unavailable, call again". Forced here by ending the one
/// server backend that holds the store's prepared statements (the one whose
/// last statement named this test's schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_behind_a_transaction_pooler_are_a_configuration_error() {
    use idem_runtime::store::StoreError;
    let Some(url) = durable::url_from(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    ) else {
        return;
    };
    let name = format!("t_{:016x}", Attempt::random().get());
    let pg = PgSchema::open(&url, &name).await;
    let store = idem_runtime::PostgresStore::builder(&url)
        .unwrap()
        .schema(&name)
        .pool_size(1)
        .direct_connection(true)
        .build()
        .unwrap();
    let long = Duration::from_secs(60);
    // Prepared (and maybe used) on whichever server connection PgBouncer
    // lent: this may already fail, as it will below.
    let first = store.claim(&durable::request(long, long)).await;
    assert!(
        matches!(first, Ok(_) | Err(StoreError::Config(_))),
        "{first:?}"
    );
    let direct = durable::connect(&url).await;
    direct
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND position($1 IN query) > 0",
            &[&format!("\"{name}\"")],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        match store.claim(&durable::request(long, long)).await {
            Err(StoreError::Config(message)) => {
                assert!(
                    message.contains("(26000)") || message.contains("(42P05)"),
                    "{message}"
                );
                assert!(
                    message.contains("direct_connection off") && message.contains("direct=true"),
                    "says what to change: {message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Through the executor: the store-misconfigured answer (calling again
    // will not help), carrying the configuration error; the handler never
    // ran.
    let executor = idem_runtime::Executor::new(Arc::new(store));
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let caller = idem_runtime::Caller::new("acme", "alice");
    let args = serde_json::json!({"card": "tok_named", "amount_cents": 500});
    let op = idem_runtime::executor::Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: idem_runtime::executor::ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    let counted = ran.clone();
    let answer = executor
        .run(op, |_| async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, idem_runtime::ToolError>(1)
        })
        .await;
    assert!(
        matches!(
            answer,
            idem_runtime::answer::Answer::StoreMisconfigured {
                error: StoreError::Config(_)
            }
        ),
        "{answer:?}"
    );
    assert_eq!(answer.name(), "store_misconfigured");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(pg);
}

/// `idem show REF` reads no whole table: `find_by_reference`'s statement,
/// on tables of 50,000 records and 50,000 superseded operations (enough
/// that the planner would not scan them for a handful of rows), searches
/// each table's primary key by the reference's key range, and scans
/// neither. The records it finds are the right ones (see the conformance
/// case `a_reference_is_found_in_every_tenant` for what "right" is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_by_reference_searches_the_primary_keys_and_scans_nothing() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let s = pg.store.schema().to_owned();
    let client = durable::connect(&pg.url).await;
    let columns = "key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, \
                   lease_until, expires_at, retain_until, body, next_check_at, checks, \
                   resolution, operation";
    let rows = "SELECT decode(lpad(to_hex(i), 64, '0'), 'hex'), \
                  decode(lpad(to_hex(i), 64, '0'), 'hex'), 'filler', 'charge_card', 1, i, \
                  now(), now(), now(), now() + interval '1 hour', now() + interval '1 hour', \
                  '\\x31'::bytea, now(), 0, NULL, i \
                FROM generate_series(1, 50000) AS i";
    client
        .batch_execute(&format!(
            "INSERT INTO {s}.idem_records ({columns}) {rows}; \
             INSERT INTO {s}.idem_superseded ({columns}) {rows}; \
             ANALYZE {s}.idem_records; ANALYZE {s}.idem_superseded;"
        ))
        .await
        .unwrap();
    let req = durable::request(Duration::from_secs(30), Duration::from_secs(60));
    pg.store.claim(&req).await.unwrap();

    let plan = pg
        .store
        .plan_of_find_by_reference(&req.reference)
        .await
        .unwrap();
    assert!(!plan.contains("Seq Scan"), "a table is scanned:\n{plan}");
    for table in ["idem_records", "idem_superseded"] {
        assert!(
            plan.lines()
                .any(|l| l.contains("Index") && l.contains(&format!(" on {table}"))),
            "{table} is not searched by an index:\n{plan}"
        );
    }
    let found = pg.store.find_by_reference(&req.reference).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].attempt, req.attempt);
}
