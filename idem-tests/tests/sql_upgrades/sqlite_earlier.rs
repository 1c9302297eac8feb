//! A SQLite replica of commit e11d36c, the last version of layout 6 (the
//! one before migration 7), serving a file beside this version's.
//!
//! What makes it faithful: what that version sent to the file. Its
//! statements on `idem_jobs` and the reconciler's deferral are replayed
//! here exactly, the text its `statements.rs` and `sql.rs` built (`git
//! show e11d36c:idem-runtime/src/store/sqlite/statements.rs`, with `sql.rs`'s
//! `JOB_COLUMNS`, `JOB_STATE_BIT` and `jobs_filtered` and the state codes
//! written out), with its parameters in its order, on a connection of its
//! own (the process it was) and with its transactions: a completion or a
//! resolution and its jobs in one, as its writer thread ran them. Those
//! are the statements that read or write what migrations 7 and 8 changed
//! (`attempts`, the columns 7 added; its deferral has no hold, and it
//! took no checks: its `take_check` is answered taken, nothing written).
//! Every other statement of that version (the claim, the completion
//! without jobs, the release, the sweep's, the lookup, the purge, the
//! listings) is this version's text too, unchanged since e11d36c: those
//! calls go to this version's store on the same file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore,
    FollowOns, IdempotencyStore, Inspect, Record, RecordFilter, RecordStateKind, Resolution,
    StateCounts, StoreError, Upkeep,
};
use idem_runtime::{key::IdempotencyKey, Reference, SqliteStore};
use rusqlite::{params, Connection, OptionalExtension};

/// The commit whose statements these are.
pub const COMMIT: &str = "e11d36c";

const REFUSAL: &str = "SELECT attempt, state, updated_at FROM idem_records WHERE key = ?1";
const COMPLETE: &str = "UPDATE idem_records SET state = 1, body = ?3, updated_at = ?4 \
         WHERE key = ?1 AND attempt = ?2 AND state <> 1";
const RESOLVE_COMPLETED: &str = "UPDATE idem_records SET state = 1, body = ?3, resolution = ?4, \
           updated_at = ?5 \
         WHERE key = ?1 AND attempt = ?2 AND state = 2";
const DEFER_CHECK: &str = "UPDATE idem_records SET next_check_at = ?3, checks = checks + 1 \
         WHERE key = ?1 AND attempt = ?2 AND state = 2";
const RECORD_TENANT: &str = "SELECT tenant, operation FROM idem_records WHERE key = ?1";
const INSERT_JOB: &str =
    "INSERT INTO idem_jobs (tenant, reference, name, payload, attempts, token, \
           next_run_at, last_error, dead, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 0, NULL, ?5, NULL, 0, ?5, ?5) \
         ON CONFLICT (tenant, reference, name) DO NOTHING";
const LEASE_JOBS: &str =
    "UPDATE idem_jobs SET token = ?1, attempts = attempts + 1, next_run_at = ?2, \
           updated_at = ?3 \
         WHERE (tenant, reference, name) IN ( \
           SELECT tenant, reference, name FROM idem_jobs \
           WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?3 \
             AND name IN (SELECT value FROM json_each(?4)) \
           ORDER BY next_run_at LIMIT ?5) \
         RETURNING tenant, reference, name, payload, attempts, token, \
                                      next_run_at, last_error, dead, created_at, updated_at, \
                                      delivered_at, kept_until";
const FINISH_JOB: &str = "UPDATE idem_jobs SET token = NULL, delivered_at = ?5, updated_at = ?5, \
           kept_until = coalesce((SELECT retain_until FROM idem_records \
             WHERE key BETWEEN ?6 AND ?7 AND tenant = ?1 AND coalesce(operation, 0) = ?8 \
             ORDER BY key LIMIT 1), \
           (SELECT retain_until FROM idem_superseded \
             WHERE key BETWEEN ?6 AND ?7 AND tenant = ?1 AND operation = ?8 \
             ORDER BY key LIMIT 1), ?5) \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4";
const RETRY_JOB: &str = "UPDATE idem_jobs SET token = NULL, next_run_at = ?5, last_error = ?6, \
           updated_at = ?7 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4";
const BURY_JOB: &str =
    "UPDATE idem_jobs SET token = NULL, dead = 1, last_error = ?5, updated_at = ?6 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4";
const REDRIVE_JOB: &str =
    "UPDATE idem_jobs SET dead = 0, attempts = 0, token = NULL, next_run_at = ?4, \
           updated_at = ?4 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND dead = 1";
const JOBS_FILTERED: &str = "SELECT tenant, reference, name, payload, attempts, token, \
                                      next_run_at, last_error, dead, created_at, updated_at, \
                                      delivered_at, kept_until FROM idem_jobs \
         WHERE (?1 IS NULL OR tenant = ?1) \
           AND (?2 IS NULL OR reference = ?2) \
           AND (?3 IS NULL OR name = ?3) \
           AND (?4 IS NULL OR (?4 & CASE WHEN delivered_at IS NOT NULL THEN 8 WHEN dead THEN 4 \
                             WHEN token IS NOT NULL THEN 2 ELSE 1 END) <> 0) \
         ORDER BY created_at, reference, name, tenant LIMIT ?5";
const COUNT_DUE_JOBS: &str = "SELECT name, count(*) FROM idem_jobs \
         WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?1 GROUP BY name";

/// The replica's store: this version's for the statements the two share,
/// e11d36c's own on its connection for the rest.
#[derive(Clone)]
pub struct EarlierSqlite {
    shared: SqliteStore,
    conn: Arc<Mutex<Connection>>,
    /// How many times each of its own calls committed.
    pub ran: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl std::fmt::Debug for EarlierSqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EarlierSqlite({COMMIT})")
    }
}

fn unavailable(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("SQLite: {e}"))
}

fn to_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn from_nanos(n: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n.max(0) as u64)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// e11d36c's `row_to_job`, its 13 columns.
fn row_to_job(row: &rusqlite::Row<'_>) -> rusqlite::Result<FollowOnRecord> {
    let reference: Vec<u8> = row.get(1)?;
    Ok(FollowOnRecord {
        id: FollowOnId {
            tenant: row.get(0)?,
            reference: Reference::from_bytes(&reference).expect("8 or 16 bytes"),
            name: row.get(2)?,
        },
        payload: row.get(3)?,
        runs: row.get::<_, i64>(4)?.clamp(0, u32::MAX.into()) as u32,
        earlier_runs: 0,
        attempt: row
            .get::<_, Option<i64>>(5)?
            .map(|t| Attempt::from_stored(t as u64)),
        next_run_at: from_nanos(row.get(6)?),
        last_error: row.get(7)?,
        error_before_redrive: None,
        dead: row.get::<_, i64>(8)? != 0,
        created_at: from_nanos(row.get(9)?),
        updated_at: from_nanos(row.get(10)?),
        delivered_at: row.get::<_, Option<i64>>(11)?.map(from_nanos),
        kept_until: row.get::<_, Option<i64>>(12)?.map(from_nanos),
    })
}

/// e11d36c's `fenced`: the change, or why it was refused.
fn fenced(
    conn: &Connection,
    key: &[u8; 32],
    attempt: Attempt,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<(), StoreError> {
    if conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(unavailable)?
        == 1
    {
        return Ok(());
    }
    let found: Option<(i64, i16)> = conn
        .prepare_cached(REFUSAL)
        .and_then(|mut s| {
            s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(unavailable)?;
    Err(match found {
        Some((owner, state)) if owner as u64 == attempt.get() => StoreError::WrongState {
            found: RecordStateKind::from_code(state.into()).expect("a state code"),
        },
        _ => StoreError::Fenced,
    })
}

/// e11d36c's `insert_jobs`: the record's tenant and reference, then a row
/// per job.
fn insert_jobs(
    conn: &Connection,
    key: &[u8; 32],
    jobs: FollowOns<'_>,
    now: i64,
) -> Result<(), StoreError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let (tenant, tag): (String, Option<i64>) = conn
        .prepare_cached(RECORD_TENANT)
        .and_then(|mut s| s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(unavailable)?;
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key[..8]);
    let reference = Reference::from_parts(prefix, tag.unwrap_or(0) as u64);
    let reference = reference.as_bytes();
    let mut insert = conn.prepare_cached(INSERT_JOB).map_err(unavailable)?;
    for job in jobs.iter() {
        insert
            .execute(params![tenant, reference, job.name(), job.payload(), now])
            .map_err(unavailable)?;
    }
    Ok(())
}

/// e11d36c's `fenced_job`.
fn fenced_job(
    conn: &Connection,
    sql: &str,
    id: &FollowOnId,
    attempt: Attempt,
    rest: &[&dyn rusqlite::ToSql],
) -> Result<(), StoreError> {
    let (attempt, reference) = (attempt.get() as i64, id.reference.as_bytes());
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&id.tenant, &reference, &id.name, &attempt];
    params.extend_from_slice(rest);
    match conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(&params[..]))
        .map_err(unavailable)?
    {
        0 => Err(StoreError::Fenced),
        _ => Ok(()),
    }
}

impl EarlierSqlite {
    /// The replica on the file at `path`, which is at layout 6: this
    /// version's store is opened on it as it would open a file of its
    /// own layout (it checks the layout at its opening only, so the
    /// file's `user_version` says this version's for that moment, and
    /// 6 again at once; nothing else is written), and e11d36c's own
    /// connection with its pragmas.
    pub async fn open(path: &std::path::Path) -> EarlierSqlite {
        let conn = Connection::open(path).unwrap();
        let layout: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        conn.pragma_update(None, "user_version", crate::sql_layouts::LATEST as i64)
            .unwrap();
        let shared = SqliteStore::builder().migrate(false).open(path).await;
        conn.pragma_update(None, "user_version", layout).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        EarlierSqlite {
            shared: shared.unwrap(),
            conn: Arc::new(Mutex::new(conn)),
            ran: Arc::default(),
        }
    }

    /// Runs `f` in one write transaction of its own, as e11d36c's writer
    /// ran an item (BEGIN IMMEDIATE, all or nothing), with its clock.
    async fn run<T: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (conn, ran) = (self.conn.clone(), self.ran.clone());
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").map_err(unavailable)?;
            match f(&conn, to_nanos(SystemTime::now())) {
                Ok(v) => {
                    conn.execute_batch("COMMIT").map_err(unavailable)?;
                    *ran.lock().unwrap().entry(call).or_default() += 1;
                    Ok(v)
                }
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(e)
                }
            }
        })
        .await
        .unwrap()
    }
}

#[async_trait]
impl IdempotencyStore for EarlierSqlite {
    fn backend(&self) -> &'static str {
        "sqlite"
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.shared.claim(req).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.shared.complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.shared.release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.shared.mark_unknown(key, attempt, note).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.shared.heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.shared.lookup(tenant, reference).await
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

#[async_trait]
impl Upkeep for EarlierSqlite {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.shared.mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.shared.resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        _taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = *key.as_bytes();
        self.run("defer_check", move |conn, now| {
            let params: [&dyn rusqlite::ToSql; 3] = [
                &&key[..],
                &(attempt.get() as i64),
                &now.saturating_add(nanos(delay)),
            ];
            fenced(conn, &key, attempt, DEFER_CHECK, &params).map(|()| true)
        })
        .await
    }
    async fn take_check(
        &self,
        _key: &IdempotencyKey,
        _attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        Ok(Some(SystemTime::now() + hold))
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.shared.purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.shared.list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.shared.list_unknown(limit).await
    }
}

#[async_trait]
impl Inspect for EarlierSqlite {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.shared.list_records(filter).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.shared.count_records().await
    }
}

#[async_trait]
impl FollowOnStore for EarlierSqlite {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let (key, response, jobs) = (*key.as_bytes(), response.to_owned(), jobs.to_vec());
        self.run("complete_with_follow_ons", move |conn, now| {
            let params: [&dyn rusqlite::ToSql; 4] =
                [&&key[..], &(attempt.get() as i64), &response, &now];
            fenced(conn, &key, attempt, COMPLETE, &params)?;
            insert_jobs(conn, &key, FollowOns::new(&jobs)?, now)
        })
        .await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let (key, body, jobs) = (*key.as_bytes(), response.to_owned(), jobs.to_vec());
        let note = note.map(str::to_owned);
        self.run("resolve_with_follow_ons", move |conn, now| {
            let params: [&dyn rusqlite::ToSql; 5] =
                [&&key[..], &(attempt.get() as i64), &body, &note, &now];
            fenced(conn, &key, attempt, RESOLVE_COMPLETED, &params)?;
            insert_jobs(conn, &key, FollowOns::new(&jobs)?, now)
        })
        .await
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        if names.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let names = serde_json::to_string(names).unwrap();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("lease_jobs", move |conn, now| {
            let mut stmt = conn.prepare_cached(LEASE_JOBS).map_err(unavailable)?;
            let mut leased = stmt
                .query_map(
                    params![
                        attempt.get() as i64,
                        now.saturating_add(nanos(lease)),
                        now,
                        names,
                        limit
                    ],
                    row_to_job,
                )
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)?;
            leased.sort_by_key(|j| (j.created_at, j.id.reference, j.id.name.clone()));
            Ok(leased)
        })
        .await
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        let id = id.clone();
        let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
        lo[..8].copy_from_slice(&id.reference.key_prefix());
        hi[..8].copy_from_slice(&id.reference.key_prefix());
        let tag = id.reference.tag() as i64;
        self.run("finish_job", move |conn, now| {
            let rest: [&dyn rusqlite::ToSql; 4] = [&now, &&lo[..], &&hi[..], &tag];
            fenced_job(conn, FINISH_JOB, &id, attempt, &rest)
        })
        .await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let (id, error) = (id.clone(), error.to_owned());
        self.run("retry_job", move |conn, now| {
            let at = now.saturating_add(nanos(delay));
            fenced_job(conn, RETRY_JOB, &id, attempt, &[&at, &error, &now])
        })
        .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        let (id, error) = (id.clone(), error.to_owned());
        self.run("bury_job", move |conn, now| {
            fenced_job(conn, BURY_JOB, &id, attempt, &[&error, &now])
        })
        .await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let (tenant, name) = (filter.tenant.clone(), filter.name.clone());
        let reference = filter.reference.map(|r| r.as_bytes().to_vec());
        let states = (!filter.states.is_empty()).then(|| {
            filter.states.iter().fold(0i64, |mask, state| {
                mask | match state {
                    idem_runtime::store::FollowOnState::Waiting => 1,
                    idem_runtime::store::FollowOnState::Running => 2,
                    idem_runtime::store::FollowOnState::Dead => 4,
                    idem_runtime::store::FollowOnState::Delivered => 8,
                }
            })
        });
        self.run("list_jobs", move |conn, _| {
            let mut stmt = conn.prepare_cached(JOBS_FILTERED).map_err(unavailable)?;
            stmt.query_map(params![tenant, reference, name, states, limit], row_to_job)
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)
        })
        .await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.run("redrive_job", move |conn, now| {
            let changed = conn
                .prepare_cached(REDRIVE_JOB)
                .and_then(|mut s| {
                    s.execute(params![id.tenant, id.reference.as_bytes(), id.name, now])
                })
                .map_err(unavailable)?;
            Ok(changed == 1)
        })
        .await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.run("count_due_jobs", |conn, now| {
            let mut stmt = conn.prepare_cached(COUNT_DUE_JOBS).map_err(unavailable)?;
            let rows = stmt
                .query_map([now], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)?;
            Ok(rows
                .into_iter()
                .map(|(name, n)| (name, u64::try_from(n).unwrap_or(0)))
                .collect())
        })
        .await
    }
}
