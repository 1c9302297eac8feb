//! [`SqliteStore`]: the embedded durable store, on bundled SQLite in WAL mode.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::sql::{
    counted, counts, expired, filtered, jobs_filtered, key_range, state_from, tag_to_column,
    takeover_operation, COLUMNS, COMPLETED, IN_PROGRESS, JOB_COLUMNS, NOT_PERFORMED, UNKNOWN,
};
use super::{
    check_distinct, Attempt, Claim, ClaimRequest, FollowOn, FollowOnStore, IdempotencyStore,
    JobFilter, JobId, OutboxJob, Record, RecordFilter, RecordStateKind, Resolution, StateCounts,
    StoreError,
};
use crate::key::{IdempotencyKey, Reference};
use std::collections::BTreeMap;

/// At most this many jobs share one transaction: bounds how long one batch
/// holds the file lock against other processes.
const MAX_BATCH: usize = 256;

/// How long a statement waits for another process's lock before the call
/// fails as `Unavailable`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one entry per version; `PRAGMA user_version` says how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/sqlite/0001_records.sql"),
    include_str!("../../migrations/sqlite/0002_lifecycle.sql"),
    include_str!("../../migrations/sqlite/0003_outbox.sql"),
    include_str!("../../migrations/sqlite/0004_operations.sql"),
];

/// The store's SQL, written once from the state codes of
/// [`RecordStateKind`].
struct Statements {
    claim: String,
    read: String,
    refusal: String,
    complete: String,
    release: String,
    mark_unknown: String,
    mark_lapsed: String,
    resolve_completed: String,
    resolve_not_performed: String,
    defer_check: String,
    heartbeat: String,
    lookup: String,
    purge: String,
    lapsed: String,
    unknown: String,
    filtered: String,
    counted: String,
    record_tenant: String,
    insert_job: String,
    lease_jobs: String,
    finish_job: String,
    retry_job: String,
    bury_job: String,
    redrive_job: String,
    jobs_filtered: String,
    count_due_jobs: String,
}

static SQL: std::sync::LazyLock<Statements> = std::sync::LazyLock::new(|| Statements {
    // One statement: insert, or take over a record that Record::is_claimable
    // says is past its life or resolved as not performed. It returns the
    // operation the claim runs under (Record::takeover_reference).
    claim: format!(
        "INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, \
           claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
           next_check_at, checks, resolution, operation) \
         VALUES (?1, ?2, ?3, ?4, {IN_PROGRESS}, ?5, ?6, ?6, ?7, ?8, ?9, NULL, ?6, 0, NULL, ?10) \
         ON CONFLICT (key) DO UPDATE SET operation = {}, fingerprint = excluded.fingerprint, \
           tenant = excluded.tenant, tool = excluded.tool, state = {IN_PROGRESS}, \
           attempt = excluded.attempt, claimed_at = excluded.claimed_at, \
           updated_at = excluded.updated_at, lease_until = excluded.lease_until, \
           expires_at = excluded.expires_at, retain_until = excluded.retain_until, \
           body = NULL, next_check_at = excluded.next_check_at, checks = 0, \
           resolution = NULL \
         WHERE ({}) OR idem_records.state = {NOT_PERFORMED} \
         RETURNING operation",
        takeover_operation("idem_records.", "excluded.operation", "?6"),
        expired("idem_records.", "?6")
    ),
    read: format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?1"),
    refusal: "SELECT attempt, state, updated_at FROM idem_records WHERE key = ?1".to_owned(),
    // Every fenced change carries `attempt = ?2`: a worker whose claim was
    // taken over must not overwrite, delete or extend the new owner's record.
    // A completion after the sweep or a reconciler gave up on the record
    // answers repeats until the retention ends: found after its window, it
    // would otherwise expire the moment it is written.
    complete: format!(
        "UPDATE idem_records SET state = {COMPLETED}, body = ?3, updated_at = ?4, \
           expires_at = CASE WHEN state = {IN_PROGRESS} THEN expires_at \
             ELSE MAX(expires_at, retain_until) END \
         WHERE key = ?1 AND attempt = ?2 AND state <> {COMPLETED}"
    ),
    release: format!(
        "DELETE FROM idem_records WHERE key = ?1 AND attempt = ?2 \
         AND state IN ({IN_PROGRESS}, {UNKNOWN})"
    ),
    mark_unknown: format!(
        "UPDATE idem_records SET state = {UNKNOWN}, body = ?3, updated_at = ?4, \
           next_check_at = ?4, checks = 0 \
         WHERE key = ?1 AND attempt = ?2 AND state = {IN_PROGRESS}"
    ),
    // `lease_until <= ?4` in the same statement: a heartbeat that landed
    // after the sweep listed the record keeps it alive.
    mark_lapsed: format!(
        "UPDATE idem_records SET state = {UNKNOWN}, body = ?3, updated_at = ?4, \
           next_check_at = ?4, checks = 0 \
         WHERE key = ?1 AND attempt = ?2 AND state = {IN_PROGRESS} AND lease_until <= ?4"
    ),
    resolve_completed: format!(
        "UPDATE idem_records SET state = {COMPLETED}, body = ?3, resolution = ?4, \
           updated_at = ?5, expires_at = MAX(expires_at, retain_until) \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN}"
    ),
    // `updated_at <= ?6`: "not performed" is trusted only for a record
    // unchanged for the settle period (?6 = now - settle).
    resolve_not_performed: format!(
        "UPDATE idem_records SET state = {NOT_PERFORMED}, body = ?3, resolution = ?4, \
           updated_at = ?5 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN} AND updated_at <= ?6"
    ),
    defer_check: format!(
        "UPDATE idem_records SET next_check_at = ?3, checks = checks + 1 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN}"
    ),
    heartbeat: format!(
        "UPDATE idem_records SET lease_until = ?3, updated_at = ?4 \
         WHERE key = ?1 AND attempt = ?2 AND state = {IN_PROGRESS}"
    ),
    // A reference starts with the key's first eight bytes: a range over the
    // primary key finds it without an index of its own. The tag then tells
    // this operation from a later one of the same key (NULL: a record
    // written before tags, whose reference has none).
    lookup: format!(
        "SELECT {COLUMNS} FROM idem_records \
         WHERE key BETWEEN ?1 AND ?2 AND tenant = ?3 AND coalesce(operation, 0) = ?4 \
         ORDER BY key LIMIT 1"
    ),
    purge: format!(
        "DELETE FROM idem_records WHERE key IN ( \
           SELECT key FROM idem_records WHERE {} LIMIT ?2)",
        expired("", "?1")
    ),
    // The partial indexes of migration 2 serve these two: `state = …` is
    // written as a literal so the planner can match the index's WHERE.
    lapsed: format!(
        "SELECT {COLUMNS} FROM idem_records \
         WHERE state = {IN_PROGRESS} AND lease_until <= ?1 ORDER BY lease_until LIMIT ?2"
    ),
    unknown: format!(
        "SELECT {COLUMNS} FROM idem_records \
         WHERE state = {UNKNOWN} AND next_check_at <= ?1 ORDER BY next_check_at LIMIT ?2"
    ),
    filtered: filtered("idem_records", "", |n| format!("?{n}")),
    counted: counted("idem_records"),
    record_tenant: "SELECT tenant, operation FROM idem_records WHERE key = ?1".to_owned(),
    // A job's identity is its operation's reference and its name: one
    // completion per operation writes jobs, and a job already there is
    // never replaced, live or dead.
    insert_job: "INSERT INTO idem_jobs (tenant, reference, name, payload, attempts, token, \
           next_run_at, last_error, dead, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 0, NULL, ?5, NULL, 0, ?5, ?5) \
         ON CONFLICT (tenant, reference, name) DO NOTHING"
        .to_owned(),
    // One statement under the writer's lock: the selection and the lease
    // cannot be split by another process's lease. `dead = 0` is a literal
    // so the planner can use the partial index.
    lease_jobs: format!(
        "UPDATE idem_jobs SET token = ?1, attempts = attempts + 1, next_run_at = ?2, \
           updated_at = ?3 \
         WHERE (tenant, reference, name) IN ( \
           SELECT tenant, reference, name FROM idem_jobs \
           WHERE dead = 0 AND next_run_at <= ?3 \
             AND name IN (SELECT value FROM json_each(?4)) \
           ORDER BY next_run_at LIMIT ?5) \
         RETURNING {JOB_COLUMNS}"
    ),
    // Every change of a leased job carries `token = ?4`: a dispatcher whose
    // lease ran out (and was taken by another) must not finish, retry or
    // bury the new holder's run.
    finish_job: "DELETE FROM idem_jobs \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
        .to_owned(),
    retry_job: "UPDATE idem_jobs SET token = NULL, next_run_at = ?5, last_error = ?6, \
           updated_at = ?7 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
        .to_owned(),
    bury_job: "UPDATE idem_jobs SET token = NULL, dead = 1, last_error = ?5, updated_at = ?6 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
        .to_owned(),
    redrive_job: "UPDATE idem_jobs SET dead = 0, attempts = 0, token = NULL, next_run_at = ?4, \
           updated_at = ?4 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND dead = 1"
        .to_owned(),
    jobs_filtered: jobs_filtered("idem_jobs", |n| format!("?{n}")),
    count_due_jobs: "SELECT name, count(*) FROM idem_jobs \
         WHERE dead = 0 AND next_run_at <= ?1 GROUP BY name"
        .to_owned(),
});

/// The embedded durable store: one SQLite database file in WAL mode, kept
/// across process restarts.
///
/// # One writer thread
///
/// The store owns one connection on one dedicated OS thread, fed by a channel;
/// async callers send it a job and await a oneshot reply, so no SQLite call
/// ever runs on (or blocks) a runtime thread. One thread rather than a
/// `spawn_blocking` pool because SQLite admits one writer per database anyway:
/// a pool would only queue on SQLite's file lock (and answer `SQLITE_BUSY`)
/// instead of on a channel. One thread also lets the writer *group-commit*:
/// it drains every job waiting in the channel, runs them in one
/// `BEGIN IMMEDIATE` transaction and commits once, so eight concurrent callers
/// share one fsync. A job's answer is sent only after its commit succeeded. A
/// batch is all or nothing: if the commit fails, or SQLite fails any
/// statement of the batch (disk full, an I/O error), the batch is rolled
/// back, nothing of it was written, and every job of it is answered
/// `Unavailable`.
///
/// # The clock
///
/// SQLite has no server clock of its own. The writer thread reads the process
/// clock (`SystemTime::now()`) for each job, so claimed, lease and expiry
/// times come from one place per process. Several processes sharing one
/// database file each use their own clock: keep their clocks in sync (NTP), or
/// use `PostgresStore`, whose times come from the
/// database server.
///
/// # Durability
///
/// `synchronous = FULL`: a commit is on disk before a claim is answered, so a
/// power cut cannot forget a claim whose side effect then ran (which would let
/// the same charge run twice after a restart).
///
/// Cloning is cheap; every clone talks to the same writer thread. The thread
/// and its connection close when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    path: Option<PathBuf>,
}

/// One unit of work for the writer: runs its statements inside the batch's
/// transaction (or learns that the batch failed before its turn, and runs
/// nothing), and returns what to do once the batch's commit succeeded or
/// failed, and whether SQLite itself failed one of its statements.
type Job = Box<dyn FnOnce(Result<&Connection, &str>) -> (Finish, bool) + Send>;
type Finish = Box<dyn FnOnce(Result<(), &str>) + Send>;

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, switches it to WAL
    /// mode and applies the shipped schema. Errors: `Unavailable` when the file
    /// cannot be opened or migrated.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        Self::start(move || Connection::open(&p), Some(path)).await
    }

    /// A private in-memory database, gone when the store is dropped: for tests
    /// that want SQLite's behaviour without a file.
    pub async fn open_in_memory() -> Result<Self, StoreError> {
        Self::start(Connection::open_in_memory, None).await
    }

    /// The database file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    async fn start(
        open: impl FnOnce() -> rusqlite::Result<Connection> + Send + 'static,
        path: Option<PathBuf>,
    ) -> Result<Self, StoreError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("idem-sqlite".into())
            .spawn(move || {
                let conn = match open().and_then(|c| init(&c).map(|()| c)) {
                    Ok(conn) => {
                        let _ = ready.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = ready.send(Err(unavailable(&e)));
                        return;
                    }
                };
                writer(conn, rx);
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite thread: {e}")))?;
        ready_rx.await.map_err(|_| {
            StoreError::Unavailable("the SQLite thread stopped while opening".into())
        })??;
        Ok(SqliteStore { jobs, path })
    }

    /// Runs `f` on the writer thread inside the current batch's transaction,
    /// with the process clock read for this job, and answers after the commit.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let out = match conn {
                Ok(conn) => f(conn, to_nanos(SystemTime::now())),
                Err(e) => Err(StoreError::Unavailable(e.to_owned())),
            };
            // Every SQLite error is mapped to Unavailable; refusals (Fenced,
            // WrongState, NotSettled) are answers, not failures.
            let failed = matches!(out, Err(StoreError::Unavailable(_)));
            let finish: Finish = Box::new(move |commit| {
                let _ = reply.send(match commit {
                    Ok(()) => out,
                    Err(e) => Err(StoreError::Unavailable(e.to_owned())),
                });
            });
            (finish, failed)
        });
        self.jobs.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// `complete` with its jobs in one transaction. An inherent method, so
    /// `complete` costs no second boxed future.
    async fn completed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: Vec<FollowOn>,
    ) -> Result<(), StoreError> {
        let (key, response) = (*key.as_bytes(), response.to_owned());
        self.run(move |conn, now| {
            // `attempt = ?2`: a worker whose claim was taken over must not
            // overwrite the new owner's record with its own response.
            fenced(
                conn,
                &key,
                attempt,
                &SQL.complete,
                &[&&key[..], &(attempt.get() as i64), &response, &now],
            )?;
            // The same transaction: a failed insert fails the batch, and the
            // completion is rolled back with it.
            insert_jobs(conn, &key, &jobs, now)
        })
        .await
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the SQLite writer thread has stopped".into())
}

fn unavailable(e: &rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("SQLite: {e}"))
}

/// Pragmas and migrations, on the writer thread before it serves.
fn init(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers of other processes never block the writer, and a commit
    // appends to one file. In-memory databases answer "memory"; that is fine.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let migrated = (|| {
        let done: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", (i + 1) as i64)?;
        }
        Ok(())
    })();
    match migrated {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The writer loop: one batch of waiting jobs per transaction, answers after
/// the commit. Ends when every [`SqliteStore`] clone is dropped.
///
/// A batch is all or nothing. A statement that SQLite fails (disk full, an
/// I/O error) may have made SQLite roll the transaction back on its own, after
/// which later statements would each commit by themselves; so once one job
/// fails, the jobs after it run nothing, the batch is rolled back, and every
/// job of it is answered `Unavailable`.
fn writer(conn: Connection, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut failed = conn
            .execute_batch("BEGIN IMMEDIATE")
            .err()
            .map(|e| format!("SQLite: cannot begin a transaction: {e}"));
        let began = failed.is_none();
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        for job in batch {
            let turn = match &failed {
                None => Ok(&conn),
                Some(reason) => Err(reason.as_str()),
            };
            // A panicking job must not take the thread (and the store) down
            // with it: the batch fails instead.
            let (finish, sqlite_failed) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(turn)))
                    .unwrap_or_else(|_| (Box::new(|_| ()), true));
            finishes.push(finish);
            if failed.is_none() && (sqlite_failed || conn.is_autocommit()) {
                failed = Some(
                    "SQLite failed a statement of this batch; the batch was rolled back and \
                     nothing of it was written"
                        .to_owned(),
                );
            }
        }
        let committed = match failed {
            Some(reason) => {
                if began && !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Err(reason)
            }
            None => conn.execute_batch("COMMIT").map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                format!("SQLite: the commit failed, nothing was written: {e}")
            }),
        };
        for finish in finishes {
            finish(committed.as_ref().map(|_| ()).map_err(String::as_str));
        }
    }
}

fn to_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

fn from_nanos(n: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n.max(0) as u64)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn row_to_record(
    row: &rusqlite::Row<'_>,
    now: i64,
) -> rusqlite::Result<Result<Record, StoreError>> {
    let key: Vec<u8> = row.get(0)?;
    let fingerprint: Vec<u8> = row.get(1)?;
    let (Ok(key), Ok(fingerprint)) = (
        <[u8; 32]>::try_from(key.as_slice()),
        <[u8; 32]>::try_from(fingerprint.as_slice()),
    ) else {
        return Ok(Err(StoreError::Corrupt(
            "a key or fingerprint is not 32 bytes".into(),
        )));
    };
    let state = match state_from(row.get(4)?, row.get(11)?) {
        Ok(state) => state,
        Err(e) => return Ok(Err(e)),
    };
    let key = IdempotencyKey::from_parts(key, fingerprint);
    let tag = row.get::<_, Option<i64>>(15)?.unwrap_or(0) as u64;
    Ok(Ok(Record {
        key,
        reference: Reference::with_tag(&key, tag),
        tenant: row.get(2)?,
        tool: row.get(3)?,
        attempt: Attempt::from_stored(row.get::<_, i64>(5)? as u64),
        state,
        claimed_at: from_nanos(row.get(6)?),
        updated_at: from_nanos(row.get(7)?),
        lease_until: from_nanos(row.get(8)?),
        expires_at: from_nanos(row.get(9)?),
        retain_until: from_nanos(row.get(10)?),
        next_check_at: from_nanos(row.get(12)?),
        checks: row.get::<_, i64>(13)?.clamp(0, u32::MAX.into()) as u32,
        resolution: row.get(14)?,
        observed_at: from_nanos(now),
    }))
}

fn read(conn: &Connection, key: &[u8; 32], now: i64) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(&SQL.read)
        .and_then(|mut s| {
            s.query_row([&key[..]], |row| row_to_record(row, now))
                .optional()
        })
        .map_err(|e| unavailable(&e))?
        .transpose()
}

fn read_many(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    now: i64,
) -> Result<Vec<Record>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| unavailable(&e))?;
    let rows = stmt
        .query_map(params, |row| row_to_record(row, now))
        .map_err(|e| unavailable(&e))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row.map_err(|e| unavailable(&e))??);
    }
    Ok(out)
}

/// The owner, state and last change of the record with this key, if any:
/// why a fenced change touched no row.
fn found(
    conn: &Connection,
    key: &[u8; 32],
) -> Result<Option<(Attempt, RecordStateKind, i64)>, StoreError> {
    let row: Option<(i64, i16, i64)> = conn
        .prepare_cached(&SQL.refusal)
        .and_then(|mut s| {
            s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(|e| unavailable(&e))?;
    row.map(|(attempt, state, updated_at)| {
        RecordStateKind::from_code(state.into())
            .map(|kind| (Attempt::from_stored(attempt as u64), kind, updated_at))
            .ok_or_else(|| StoreError::Corrupt(format!("state {state}")))
    })
    .transpose()
}

/// Why a fenced change touched no row: the attempt lost the record (or it is
/// gone), or the record is in a state that refuses the change.
fn refusal(conn: &Connection, key: &[u8; 32], attempt: Attempt) -> StoreError {
    match found(conn, key) {
        Err(e) => e,
        Ok(Some((owner, found, _))) if owner == attempt => StoreError::WrongState { found },
        Ok(_) => StoreError::Fenced,
    }
}

/// Runs a fenced change: `sql` with `?1` = key and `?2` = attempt; how many
/// rows it changed (0 or 1).
fn change(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(|e| unavailable(&e))
}

/// A fenced change that must touch exactly one row, or it is refused.
fn fenced(
    conn: &Connection,
    key: &[u8; 32],
    attempt: Attempt,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<(), StoreError> {
    if change(conn, sql, params)? == 1 {
        Ok(())
    } else {
        Err(refusal(conn, key, attempt))
    }
}

fn row_to_job(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<OutboxJob, StoreError>> {
    let reference: Vec<u8> = row.get(1)?;
    let Some(reference) = Reference::from_bytes(&reference) else {
        return Ok(Err(StoreError::Corrupt(
            "a job's reference is not 8 or 16 bytes".into(),
        )));
    };
    Ok(Ok(OutboxJob {
        id: JobId {
            tenant: row.get(0)?,
            reference,
            name: row.get(2)?,
        },
        payload: row.get(3)?,
        attempts: row.get::<_, i64>(4)?.clamp(0, u32::MAX.into()) as u32,
        token: row
            .get::<_, Option<i64>>(5)?
            .map(|t| Attempt::from_stored(t as u64)),
        next_run_at: from_nanos(row.get(6)?),
        last_error: row.get(7)?,
        dead: row.get::<_, i64>(8)? != 0,
        created_at: from_nanos(row.get(9)?),
        updated_at: from_nanos(row.get(10)?),
    }))
}

fn read_jobs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<OutboxJob>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| unavailable(&e))?;
    let rows = stmt
        .query_map(params, row_to_job)
        .map_err(|e| unavailable(&e))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row.map_err(|e| unavailable(&e))??);
    }
    Ok(out)
}

/// Writes `jobs` for the record with `key`, due at `now`, inside the
/// transaction of its completion.
fn insert_jobs(
    conn: &Connection,
    key: &[u8; 32],
    jobs: &[FollowOn],
    now: i64,
) -> Result<(), StoreError> {
    // A completion without follow-ons costs no statement more than before.
    if jobs.is_empty() {
        return Ok(());
    }
    let (tenant, tag): (String, Option<i64>) = conn
        .prepare_cached(&SQL.record_tenant)
        .and_then(|mut s| s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(|e| unavailable(&e))?;
    // The record's own operation: the jobs belong to it.
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key[..8]);
    let reference = Reference::from_parts(prefix, tag.unwrap_or(0) as u64);
    let reference = reference.as_bytes();
    let mut insert = conn
        .prepare_cached(&SQL.insert_job)
        .map_err(|e| unavailable(&e))?;
    for job in jobs {
        insert
            .execute(params![tenant, reference, job.name(), job.payload(), now])
            .map_err(|e| unavailable(&e))?;
    }
    Ok(())
}

/// A change of a leased job, fenced by its token: `sql` with `?1`..`?4` =
/// tenant, reference, name, token, then `rest`. `Fenced` when no row changed.
fn fenced_job(
    conn: &Connection,
    sql: &str,
    id: &JobId,
    token: Attempt,
    rest: &[&dyn rusqlite::ToSql],
) -> Result<(), StoreError> {
    let (token, reference) = (token.get() as i64, id.reference.as_bytes());
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&id.tenant, &reference, &id.name, &token];
    params.extend_from_slice(rest);
    match change(conn, sql, &params)? {
        0 => Err(StoreError::Fenced),
        _ => Ok(()),
    }
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.code());
        let (tenant, tool) = (filter.tenant.clone(), filter.tool.clone());
        self.run(move |conn, now| {
            read_many(
                conn,
                &SQL.filtered,
                params![state, tenant, tool, limit],
                now,
            )
        })
        .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.run(|conn, _| {
            let mut stmt = conn
                .prepare_cached(&SQL.counted)
                .map_err(|e| unavailable(&e))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unavailable(&e))?;
            counts(rows)
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let req = req.clone();
        self.run(move |conn, now| {
            let key = req.key.as_bytes();
            // The writer holds the database's write lock for the batch, so no
            // other claim (of this or another process) can slip between the
            // claim and the read below.
            let claimed = conn
                .prepare_cached(&SQL.claim)
                .and_then(|mut s| {
                    s.query_row(
                        params![
                            &key[..],
                            &req.key.fingerprint()[..],
                            req.tenant,
                            req.tool,
                            req.attempt.get() as i64,
                            now,
                            now.saturating_add(nanos(req.lease)),
                            now.saturating_add(nanos(req.window)),
                            now.saturating_add(nanos(req.retention.max(req.window))),
                            tag_to_column(&req.reference),
                        ],
                        |row| row.get::<_, Option<i64>>(0),
                    )
                    .optional()
                })
                .map_err(|e| unavailable(&e))?;
            if let Some(tag) = claimed {
                let reference = Reference::with_tag(&req.key, tag.unwrap_or(0) as u64);
                return Ok(Claim::Claimed { reference });
            }
            match read(conn, key, now)? {
                Some(record) => Ok(Claim::Existing { record }),
                // The conflict and the read run under one write lock.
                None => Err(StoreError::Corrupt(
                    "a conflicting record vanished under the write lock".into(),
                )),
            }
        })
        .await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.completed(key, attempt, response, Vec::new()).await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, _| {
            // `attempt = ?2`: a stale worker must not delete the new owner's claim.
            fenced(
                conn,
                &key,
                attempt,
                &SQL.release,
                &[&&key[..], &(attempt.get() as i64)],
            )
        })
        .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let (key, note) = (*key.as_bytes(), note.to_owned());
        self.run(move |conn, now| {
            // `attempt = ?2`: only the claim's owner (or the sweep, which read
            // the attempt) may declare its outcome unknown.
            fenced(
                conn,
                &key,
                attempt,
                &SQL.mark_unknown,
                &[&&key[..], &(attempt.get() as i64), &note, &now],
            )
        })
        .await
    }

    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let (key, note) = (*key.as_bytes(), note.to_owned());
        self.run(move |conn, now| {
            let params: &[&dyn rusqlite::ToSql] =
                &[&&key[..], &(attempt.get() as i64), &note, &now];
            if change(conn, &SQL.mark_lapsed, params)? == 1 {
                return Ok(true);
            }
            match refusal(conn, &key, attempt) {
                // Still ours and IN_PROGRESS: the lease is live again.
                StoreError::WrongState {
                    found: RecordStateKind::InProgress,
                } => Ok(false),
                refused => Err(refused),
            }
        })
        .await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        let note = note.map(str::to_owned);
        let (body, settle) = match resolution {
            Resolution::Completed { response } => (response.to_owned(), None),
            Resolution::NotPerformed { note, settle } => (note.to_owned(), Some(nanos(settle))),
        };
        self.run(move |conn, now| {
            let a = attempt.get() as i64;
            let changed = match settle {
                None => change(
                    conn,
                    &SQL.resolve_completed,
                    &[&&key[..], &a, &body, &note, &now],
                )?,
                Some(settle) => change(
                    conn,
                    &SQL.resolve_not_performed,
                    &[
                        &&key[..],
                        &a,
                        &body,
                        &note,
                        &now,
                        &now.saturating_sub(settle),
                    ],
                )?,
            };
            if changed == 1 {
                return Ok(());
            }
            match (found(conn, &key)?, settle) {
                (Some((owner, RecordStateKind::Unknown, updated_at)), Some(settle))
                    if owner == attempt =>
                {
                    Err(StoreError::NotSettled {
                        until: from_nanos(updated_at.saturating_add(settle)),
                    })
                }
                _ => Err(refusal(conn, &key, attempt)),
            }
        })
        .await
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                &SQL.defer_check,
                &[
                    &&key[..],
                    &(attempt.get() as i64),
                    &now.saturating_add(nanos(delay)),
                ],
            )
        })
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, now| {
            // `attempt = ?2`: a stale worker must not keep the new owner's
            // record alive.
            fenced(
                conn,
                &key,
                attempt,
                &SQL.heartbeat,
                &[
                    &&key[..],
                    &(attempt.get() as i64),
                    &now.saturating_add(nanos(lease)),
                    &now,
                ],
            )
        })
        .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        let tenant = tenant.to_owned();
        self.run(move |conn, now| {
            // The reference is the key's first eight bytes: a range over the
            // primary key finds it without an index of its own.
            let mut found = read_many(
                conn,
                &SQL.lookup,
                params![&lo[..], &hi[..], tenant, tag],
                now,
            )?;
            Ok(found.pop())
        })
        .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        self.run(move |conn, now| {
            // `expires_at <= now` comes first so the index on expires_at finds
            // the candidates (an IN_PROGRESS or UNKNOWN record is kept past its
            // window, never before it); the rest is Record::is_expired.
            conn.prepare_cached(&SQL.purge)
                .and_then(|mut s| s.execute(params![now, batch]))
                .map_err(|e| unavailable(&e))
        })
        .await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| read_many(conn, &SQL.lapsed, params![now, limit], now))
            .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| read_many(conn, &SQL.unknown, params![now, limit], now))
            .await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

#[async_trait]
impl FollowOnStore for SqliteStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        check_distinct(jobs)?;
        self.completed(key, attempt, response, jobs.to_vec()).await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        check_distinct(jobs)?;
        let (key, body, jobs) = (*key.as_bytes(), response.to_owned(), jobs.to_vec());
        let note = note.map(str::to_owned);
        self.run(move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                &SQL.resolve_completed,
                &[&&key[..], &(attempt.get() as i64), &body, &note, &now],
            )?;
            insert_jobs(conn, &key, &jobs, now)
        })
        .await
    }

    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<OutboxJob>, StoreError> {
        if names.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let names = serde_json::to_string(names)
            .map_err(|e| StoreError::Invalid(format!("job names: {e}")))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| {
            let mut leased = read_jobs(
                conn,
                &SQL.lease_jobs,
                params![
                    token.get() as i64,
                    now.saturating_add(nanos(lease)),
                    now,
                    names,
                    limit
                ],
            )?;
            // RETURNING has no order of its own.
            leased.sort_by_key(|j| (j.created_at, j.id.reference, j.id.name.clone()));
            Ok(leased)
        })
        .await
    }

    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        let id = id.clone();
        self.run(move |conn, _| fenced_job(conn, &SQL.finish_job, &id, token, &[]))
            .await
    }

    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let (id, error) = (id.clone(), error.to_owned());
        self.run(move |conn, now| {
            let at = now.saturating_add(nanos(delay));
            fenced_job(conn, &SQL.retry_job, &id, token, &[&at, &error, &now])
        })
        .await
    }

    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        let (id, error) = (id.clone(), error.to_owned());
        self.run(move |conn, now| fenced_job(conn, &SQL.bury_job, &id, token, &[&error, &now]))
            .await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<OutboxJob>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let (tenant, name) = (filter.tenant.clone(), filter.name.clone());
        let reference = filter.reference.map(|r| r.as_bytes().to_vec());
        let dead = filter.dead.map(i64::from);
        self.run(move |conn, _| {
            read_jobs(
                conn,
                &SQL.jobs_filtered,
                params![tenant, reference, name, dead, limit],
            )
        })
        .await
    }

    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.run(move |conn, now| {
            let changed = change(
                conn,
                &SQL.redrive_job,
                &[&id.tenant, &id.reference.as_bytes(), &id.name, &now],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.run(|conn, now| {
            let mut stmt = conn
                .prepare_cached(&SQL.count_due_jobs)
                .map_err(|e| unavailable(&e))?;
            let rows = stmt
                .query_map([now], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unavailable(&e))?;
            Ok(rows
                .into_iter()
                .map(|(name, n)| (name, u64::try_from(n).unwrap_or(0)))
                .collect())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::{again, claim_request};

    /// A batch in which SQLite fails one statement (here: the database is
    /// full) writes nothing, and every job of it is told so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_is_all_or_nothing() {
        let dir = std::env::temp_dir().join(format!("idem-batch-{}", Attempt::random().get()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
        let held = claim_request(Duration::from_secs(900));
        assert!(matches!(
            store.claim(&held).await.unwrap(),
            Claim::Claimed { .. }
        ));
        // No room for a large response: the database may not grow any more.
        store
            .run(|conn, _| {
                let pages: i64 = conn
                    .query_row("PRAGMA page_count", [], |r| r.get(0))
                    .map_err(|e| unavailable(&e))?;
                conn.pragma_update(None, "max_page_count", pages + 2)
                    .map_err(|e| unavailable(&e))
            })
            .await
            .unwrap();

        // Hold the writer so that the next three jobs form one batch.
        let blocker = store.run(|_, _| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        });
        let (first, big, last) = (
            claim_request(Duration::from_secs(900)),
            "x".repeat(1 << 20),
            claim_request(Duration::from_secs(900)),
        );
        let (_, a, b, c) = tokio::join!(
            blocker,
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                store.claim(&first).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                store.complete(&held.key, held.attempt, &big).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(150)).await;
                store.claim(&last).await
            },
        );
        assert!(matches!(b, Err(StoreError::Unavailable(_))), "{b:?}");
        assert!(matches!(a, Err(StoreError::Unavailable(_))), "{a:?}");
        assert!(matches!(c, Err(StoreError::Unavailable(_))), "{c:?}");
        for req in [&first, &last] {
            assert_eq!(
                store.lookup(&req.tenant, &req.reference).await.unwrap(),
                None,
                "nothing of the failed batch was written"
            );
        }
        let kept = store
            .lookup(&held.tenant, &held.reference)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(kept.state, crate::store::RecordState::InProgress);
        // The store goes on serving once the statement fits.
        assert!(matches!(
            store.claim(&again(&first)).await.unwrap(),
            Claim::Claimed { .. }
        ));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
