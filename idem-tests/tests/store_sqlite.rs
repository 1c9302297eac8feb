//! SqliteStore: the conformance suite, and what only a durable file store has.

mod durable;

use std::time::Duration;

use durable::{request, temp_dir};
use idem_runtime::store::conformance::{self, again};
use idem_runtime::store::Inspect;
use idem_runtime::{
    store::{Claim, RecordState},
    IdempotencyStore, SqliteStore,
};

/// A store on a file in a directory of its own, removed after the test.
struct TempSqlite {
    store: SqliteStore,
    _dir: durable::TempDir,
}

impl std::ops::Deref for TempSqlite {
    type Target = SqliteStore;

    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

async fn store() -> TempSqlite {
    let dir = temp_dir("sqlite");
    let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
    TempSqlite { store, _dir: dir }
}

idem_runtime::conformance_tests!(Some(store().await));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    conformance::run_all(&*store().await).await;
}

/// The conformance suite with synchronous completions too (the cases above
/// run with the default, relaxed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_pass_with_synchronous_completions() {
    let dir = temp_dir("synchronous");
    let store = SqliteStore::builder()
        .relaxed_completions(false)
        .open(dir.join("idem.sqlite3"))
        .await
        .unwrap();
    conformance::run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_passes_too() {
    conformance::run_all(&SqliteStore::open_in_memory().await.unwrap()).await;
}

/// A record outlives the store that wrote it: reopen the file and find it.
#[tokio::test]
async fn records_survive_reopening() {
    let dir = temp_dir("reopen");
    let path = dir.join("idem.sqlite3");
    let req = request(Duration::from_secs(30), Duration::from_secs(60));
    let key = req.key;
    {
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(
            store.claim(&req).await.unwrap(),
            Claim::Claimed {
                reference: req.reference
            }
        );
        store.complete(&key, req.attempt, "\"paid\"").await.unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    match store.claim(&again(&req)).await {
        Ok(Claim::Existing { record, .. }) => assert_eq!(
            record.state,
            RecordState::Completed {
                response: "\"paid\"".into()
            }
        ),
        other => panic!("{other:?}"),
    }
}

/// Two stores (two writer threads, as two processes would have) on one file
/// still let exactly one claim win.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_yield_one_winner() {
    let dir = temp_dir("two");
    let path = dir.join("idem.sqlite3");
    let (a, b) = (
        SqliteStore::open(&path).await.unwrap(),
        SqliteStore::open(&path).await.unwrap(),
    );
    for _ in 0..20 {
        let ra = request(Duration::from_secs(30), Duration::from_secs(60));
        let rb = again(&ra);
        let (x, y) = tokio::join!(a.claim(&ra), b.claim(&rb));
        let won = [x.unwrap(), y.unwrap()]
            .iter()
            .filter(|c| matches!(c, Claim::Claimed { .. }))
            .count();
        assert_eq!(won, 1);
    }
}

/// Rows written before migration 4 (no operation tag on the record, an
/// 8-byte reference on the job) keep their references after the upgrade;
/// a job written before migration 5 (no delivered_at, kept_until) runs and
/// is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_jobs_written_before_tags_keep_their_references() {
    let dir = temp_dir("legacy");
    let path = dir.join("idem.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();
    let (req, name) = durable::completed_with_a_job(&store).await;
    drop(store);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE idem_records SET operation = NULL; \
             UPDATE idem_jobs SET reference = substr(reference, 1, 8); \
             DROP INDEX idem_jobs_due; DROP INDEX idem_jobs_kept; \
             ALTER TABLE idem_jobs DROP COLUMN delivered_at; \
             ALTER TABLE idem_jobs DROP COLUMN kept_until; \
             ALTER TABLE idem_jobs DROP COLUMN earlier_runs; \
             ALTER TABLE idem_jobs DROP COLUMN error_before_redrive; \
             CREATE INDEX idem_jobs_due ON idem_jobs (next_run_at) WHERE dead = 0; \
             DROP TABLE idem_superseded; DROP INDEX idem_records_retain_until; \
             CREATE INDEX idem_records_expires_at ON idem_records (expires_at); \
             PRAGMA user_version = 4;",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    durable::legacy_rows_still_work(&store, &req, &name).await;
}

/// A database written at migration 5 (the DDL of the shipped migrations 1
/// to 5, as that store applied them, and rows as it wrote them, a late
/// resolution by its own statement) opens with migration 6 and serves:
/// see `durable::old_records_still_work`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_migration_5_upgrades() {
    const OLD: [&str; 5] = [
        include_str!("../../idem-runtime/migrations/sqlite/0001_records.sql"),
        include_str!("../../idem-runtime/migrations/sqlite/0002_lifecycle.sql"),
        include_str!("../../idem-runtime/migrations/sqlite/0003_outbox.sql"),
        include_str!("../../idem-runtime/migrations/sqlite/0004_operations.sql"),
        include_str!("../../idem-runtime/migrations/sqlite/0005_delivered_jobs.sql"),
    ];
    let dir = temp_dir("migration-5");
    let path = dir.join("idem.sqlite3");
    let (old, rows) = durable::OldRecords::new();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in OLD {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let at = |ms: i64| now + ms * 1_000_000;
        for r in &rows {
            conn.execute(
                "INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, \
                   claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
                   next_check_at, checks, resolution, operation) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10, ?11, ?7, 0, NULL, ?12)",
                rusqlite::params![
                    &r.req.key.as_bytes()[..],
                    &r.req.key.fingerprint()[..],
                    r.req.tenant,
                    r.req.tool,
                    r.state,
                    r.req.attempt.get() as i64,
                    at(r.claimed_at),
                    at(r.lease_until),
                    at(r.expires_at),
                    at(r.retain_until),
                    r.body,
                    r.req.reference.tag() as i64,
                ],
            )
            .unwrap();
        }
        // That store's resolution of an UNKNOWN record as completed.
        let changed = conn
            .execute(
                "UPDATE idem_records SET state = 1, body = ?3, resolution = ?4, \
                   updated_at = ?5, expires_at = MAX(expires_at, retain_until) \
                 WHERE key = ?1 AND attempt = ?2 AND state = 2",
                rusqlite::params![
                    &old.extended.key.as_bytes()[..],
                    old.extended.attempt.get() as i64,
                    durable::LATE,
                    Option::<String>::None,
                    now,
                ],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let store = SqliteStore::open(&path).await.unwrap();
    durable::old_records_still_work(&store, &old).await;
}

/// Issue 33 end to end through `Executor::run` on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_truth_frees_the_key_through_the_executor() {
    let store = store().await;
    durable::late_truth_frees_the_key_through_the_executor(std::sync::Arc::new(
        store.store.clone(),
    ))
    .await;
}

/// Every insert and update of the store's records, as SQLite applied it
/// (committed with the transaction that made it): triggers copy the key,
/// the attempt and the state of each row written into `audit`.
fn audit_writes(conn: &rusqlite::Connection) {
    conn.execute_batch(
        "CREATE TABLE audit (key BLOB, attempt INTEGER, state INTEGER); \
         CREATE TRIGGER audit_insert AFTER INSERT ON idem_records BEGIN \
           INSERT INTO audit VALUES (NEW.key, NEW.attempt, NEW.state); END; \
         CREATE TRIGGER audit_update AFTER UPDATE ON idem_records BEGIN \
           INSERT INTO audit VALUES (NEW.key, NEW.attempt, NEW.state); END;",
    )
    .unwrap();
}

/// The (attempt, state) of every write of `key`'s record since
/// [`audit_writes`], in order.
fn audited(
    conn: &rusqlite::Connection,
    key: &idem_runtime::key::IdempotencyKey,
) -> Vec<(i64, i64)> {
    let mut stmt = conn
        .prepare("SELECT attempt, state FROM audit WHERE key = ?1 ORDER BY rowid")
        .unwrap();
    stmt.query_map([&key.as_bytes()[..]], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A store on a file, the executor over it, and a connection of the test's
/// own on the same file with the writes audited.
async fn audited_store(name: &str) -> (TempSqlite, idem_runtime::Executor, rusqlite::Connection) {
    let dir = temp_dir(name);
    let path = dir.join("idem.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.busy_timeout(Duration::from_secs(10)).unwrap();
    audit_writes(&other);
    let executor = idem_runtime::Executor::new(std::sync::Arc::new(store.clone()));
    (TempSqlite { store, _dir: dir }, executor, other)
}

/// After a claim that was given up on: its retry runs the charge once, a
/// repeat replays it, and the key's record was written twice (the retry's
/// claim and completion), never as UNKNOWN.
async fn the_retry_charges_once(
    executor: &idem_runtime::Executor,
    processor: &durable::Processor,
    card: &str,
    other: &rusqlite::Connection,
) {
    use idem_runtime::answer::Answer;
    let retry = durable::charge(executor, processor, card).await;
    assert!(matches!(retry, Answer::Executed { .. }), "{retry:?}");
    let repeat = durable::charge(executor, processor, card).await;
    assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
    assert_eq!(processor.requests(), 1, "one request reached the processor");
    assert_eq!(processor.charges(), 1, "one charge");
    let writes = audited(other, &durable::charge_key(card));
    let unknown = i64::from(idem_runtime::store::RecordStateKind::Unknown.code());
    assert!(
        writes.iter().all(|(_, state)| *state != unknown),
        "a write made the record UNKNOWN: {writes:?}"
    );
    assert_eq!(
        writes.len(),
        2,
        "the retry's claim and completion: {writes:?}"
    );
}

/// Another connection (another process) holds the database's write lock
/// (`BEGIN IMMEDIATE`) past the store's busy timeout (5 s): the call is
/// answered store_unavailable, and its claim is never applied, neither
/// then nor once the lock goes. The retry runs the charge once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_behind_a_write_lock_held_past_the_timeout_never_lands() {
    let (_store, executor, other) = audited_store("locked-past").await;
    let processor = durable::Processor::default();
    let locker = {
        let path = _store.path().unwrap().to_path_buf();
        rusqlite::Connection::open(path).unwrap()
    };
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = std::time::Instant::now();
    let first = durable::charge(&executor, &processor, "tok_locked").await;
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    assert!(
        held.elapsed() < Duration::from_secs(6),
        "answered after {:?}",
        held.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(held.elapsed())).await;
    locker.execute_batch("COMMIT").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let writes = audited(&other, &durable::charge_key("tok_locked"));
    assert!(writes.is_empty(), "the claim landed: {writes:?}");
    assert_eq!(processor.requests(), 0);
    the_retry_charges_once(&executor, &processor, "tok_locked", &other).await;
}

/// A call whose caller stops waiting (a client's timeout, a cancelled
/// request) while its claim waits behind another connection's write lock:
/// the store's writer does not apply the claim once the lock goes, since
/// nobody is waiting for it and nothing will run under it. The retry runs
/// the charge once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_caller_gave_up_is_not_applied_once_the_lock_goes() {
    let (_store, executor, other) = audited_store("gave-up").await;
    let processor = durable::Processor::default();
    let locker = {
        let path = _store.path().unwrap().to_path_buf();
        rusqlite::Connection::open(path).unwrap()
    };
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = std::time::Instant::now();
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        durable::charge(&executor, &processor, "tok_gave_up"),
    )
    .await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(held.elapsed())).await;
    locker.execute_batch("COMMIT").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let writes = audited(&other, &durable::charge_key("tok_gave_up"));
    assert!(
        writes.is_empty(),
        "the claim its caller gave up on was applied once the lock went: {writes:?}"
    );
    assert_eq!(processor.requests(), 0);
    the_retry_charges_once(&executor, &processor, "tok_gave_up", &other).await;
}

/// `idem show REF` reads no whole table: `find_by_reference`'s statement,
/// on tables of 50,000 records and 50,000 superseded operations, searches
/// each table's primary key by the reference's key range (SQLite's
/// `SEARCH … USING PRIMARY KEY`) and scans neither. The records it finds
/// are the right ones (see the conformance case
/// `a_reference_is_found_in_every_tenant` for what "right" is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_by_reference_searches_the_primary_keys_and_scans_nothing() {
    let store = store().await;
    {
        let conn = rusqlite::Connection::open(store.path().unwrap()).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        let columns = "key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, \
                       lease_until, expires_at, retain_until, body, next_check_at, checks, \
                       resolution, operation";
        let rows = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
                      WHERE i < 50000) \
                    SELECT zeroblob(24) || cast(printf('%08d', i) AS BLOB), randomblob(32), \
                      'filler', 'charge_card', 1, i, 0, 0, 0, 9e18, 9e18, '1', 0, 0, NULL, i \
                    FROM n";
        conn.execute_batch(&format!(
            "INSERT INTO idem_records ({columns}) {rows}; \
             INSERT INTO idem_superseded ({columns}) {rows}; ANALYZE;"
        ))
        .unwrap();
    }
    let req = request(Duration::from_secs(30), Duration::from_secs(60));
    store.claim(&req).await.unwrap();

    let plan = store
        .plan_of_find_by_reference(&req.reference)
        .await
        .unwrap();
    for table in ["idem_records", "idem_superseded"] {
        assert!(
            !plan
                .lines()
                .any(|l| l.starts_with(&format!("SCAN {table}"))),
            "{table} is scanned:\n{plan}"
        );
        assert!(
            plan.lines()
                .any(|l| l.starts_with(&format!("SEARCH {table} USING PRIMARY KEY"))),
            "{table} is not searched by its primary key:\n{plan}"
        );
    }
    let found = store.find_by_reference(&req.reference).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].attempt, req.attempt);
}
