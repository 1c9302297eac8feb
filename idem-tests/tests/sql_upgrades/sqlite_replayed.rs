//! A SQLite replica of an earlier commit, serving a file beside this
//! version's: 8d26ab9, the last of layout 5 (the layout of 0.1.0, before
//! migration 6), or d97a05f, the last of layout 4 (before migration 5).
//!
//! What makes it faithful: every statement it sends is that commit's own
//! text (`tests/data/sql_earlier/COMMIT-sqlite.sql`, printed by that
//! commit's `statements.rs` and `sql.rs` compiled alone), with its
//! parameters in its order, on a connection of its own (the process it
//! was), each call in one write transaction as its writer thread ran it
//! (a completion or a resolution with its jobs in one). The Rust between
//! the statements is that commit's `sqlite/mod.rs` and `rows.rs` as they
//! were (a claim is its upsert, then the read of the record it found; a
//! refused change reads why; the purge deletes records, then delivered
//! jobs, in one batch), written here against the public types. It took
//! no checks (its `take_check` is answered taken, nothing written), and
//! it knew nothing of `idem_superseded`: a record it takes over after the
//! window is replaced whole, and its purge deletes a record once its
//! window has ended. d97a05f also deleted a job once it was delivered (a
//! job had no `delivered_at` before migration 5), and listed jobs by
//! `dead` alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnState,
    FollowOnStore, FollowOns, IdempotencyStore, Inspect, Record, RecordFilter, RecordState,
    RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};
use idem_runtime::{key::IdempotencyKey, Reference};
use rusqlite::{params, Connection, OptionalExtension};

/// A commit's statements by the name of the field that held each.
type Statements = HashMap<&'static str, &'static str>;

/// The commits replayed, each with its layout and its statements by the
/// name of the field that held each.
static EARLIER: LazyLock<BTreeMap<&'static str, (usize, Statements)>> = LazyLock::new(|| {
    use crate::sql_layouts::statements;
    BTreeMap::from([
        (
            "8d26ab9",
            (
                5,
                statements(include_str!("../data/sql_earlier/8d26ab9-sqlite.sql")),
            ),
        ),
        (
            "d97a05f",
            (
                4,
                statements(include_str!("../data/sql_earlier/d97a05f-sqlite.sql")),
            ),
        ),
    ])
});

/// The statement `name` of the commit being replayed (one per thread: the
/// replica's calls each run on a blocking thread, told which first).
fn sql(name: &str) -> &'static str {
    let commit = COMMIT_NOW.with(|c| c.get());
    EARLIER[commit]
        .1
        .get(name)
        .unwrap_or_else(|| panic!("{commit} has no statement {name}"))
}

thread_local! {
    static COMMIT_NOW: std::cell::Cell<&'static str> = const { std::cell::Cell::new("8d26ab9") };
}

/// The replica's store: 8d26ab9's statements on a connection of its own.
#[derive(Clone)]
pub struct SqliteReplayed {
    /// The commit replayed.
    pub commit: &'static str,
    layout: usize,
    conn: Arc<Mutex<Connection>>,
    /// How many times each of its calls committed.
    pub ran: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl std::fmt::Debug for SqliteReplayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqliteReplayed({})", self.commit)
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

/// 8d26ab9's `state_from`.
fn state_from(code: i16, body: Option<String>) -> Result<RecordState, StoreError> {
    Ok(match (RecordStateKind::from_code(code.into()), body) {
        (Some(RecordStateKind::InProgress), _) => RecordState::InProgress,
        (Some(RecordStateKind::Completed), Some(response)) => RecordState::Completed { response },
        (Some(RecordStateKind::Unknown), note) => RecordState::Unknown {
            note: note.unwrap_or_default(),
        },
        (Some(RecordStateKind::NotPerformed), note) => RecordState::NotPerformed {
            note: note.unwrap_or_default(),
        },
        (_, _) => return Err(StoreError::Corrupt(format!("state {code}"))),
    })
}

/// 8d26ab9's `row_to_record`.
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

fn read_many(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    now: i64,
) -> Result<Vec<Record>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(unavailable)?;
    let rows = stmt
        .query_map(params, |row| row_to_record(row, now))
        .map_err(unavailable)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row.map_err(unavailable)??);
    }
    Ok(out)
}

fn read(conn: &Connection, key: &[u8; 32], now: i64) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(sql("read"))
        .and_then(|mut s| {
            s.query_row([&key[..]], |row| row_to_record(row, now))
                .optional()
        })
        .map_err(unavailable)?
        .transpose()
}

fn found(
    conn: &Connection,
    key: &[u8; 32],
) -> Result<Option<(Attempt, RecordStateKind, i64)>, StoreError> {
    let row: Option<(i64, i16, i64)> = conn
        .prepare_cached(sql("refusal"))
        .and_then(|mut s| {
            s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(unavailable)?;
    Ok(row.map(|(attempt, state, updated_at)| {
        let kind = RecordStateKind::from_code(state.into()).expect("a state code");
        (Attempt::from_stored(attempt as u64), kind, updated_at)
    }))
}

fn refusal(conn: &Connection, key: &[u8; 32], attempt: Attempt) -> StoreError {
    match found(conn, key) {
        Err(e) => e,
        Ok(Some((owner, found, _))) if owner == attempt => StoreError::WrongState { found },
        Ok(_) => StoreError::Fenced,
    }
}

fn change(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(unavailable)
}

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

/// The commit's `row_to_job`: 13 columns, or 11 before migration 5.
fn row_to_job(row: &rusqlite::Row<'_>) -> rusqlite::Result<FollowOnRecord> {
    let delivered = row.as_ref().column_count() > 11;
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
        delivered_at: if delivered {
            row.get::<_, Option<i64>>(11)?.map(from_nanos)
        } else {
            None
        },
        kept_until: if delivered {
            row.get::<_, Option<i64>>(12)?.map(from_nanos)
        } else {
            None
        },
    })
}

fn read_jobs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<FollowOnRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(unavailable)?;
    stmt.query_map(params, row_to_job)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(unavailable)
}

fn insert_jobs(
    conn: &Connection,
    key: &[u8; 32],
    jobs: &[idem_runtime::follow_ons::FollowOn],
    now: i64,
) -> Result<(), StoreError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let (tenant, tag): (String, Option<i64>) = conn
        .prepare_cached(sql("record_tenant"))
        .and_then(|mut s| s.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(unavailable)?;
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key[..8]);
    let reference = Reference::from_parts(prefix, tag.unwrap_or(0) as u64);
    let reference = reference.as_bytes();
    let mut insert = conn
        .prepare_cached(sql("insert_job"))
        .map_err(unavailable)?;
    for job in jobs {
        insert
            .execute(params![tenant, reference, job.name(), job.payload(), now])
            .map_err(unavailable)?;
    }
    Ok(())
}

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
    match change(conn, sql, &params)? {
        0 => Err(StoreError::Fenced),
        _ => Ok(()),
    }
}

fn key_range(reference: &Reference) -> ([u8; 32], [u8; 32]) {
    let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
    lo[..8].copy_from_slice(&reference.key_prefix());
    hi[..8].copy_from_slice(&reference.key_prefix());
    (lo, hi)
}

impl SqliteReplayed {
    /// The replica of `commit` on the file at `path`, with that commit's
    /// pragmas.
    pub fn open(path: &std::path::Path, commit: &'static str) -> SqliteReplayed {
        let layout = EARLIER[commit].0;
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        SqliteReplayed {
            commit,
            layout,
            conn: Arc::new(Mutex::new(conn)),
            ran: Arc::default(),
        }
    }

    /// `f` in one write transaction (BEGIN IMMEDIATE, all or nothing), as
    /// that commit's writer ran an item, with its clock.
    async fn run<T: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (conn, ran, commit) = (self.conn.clone(), self.ran.clone(), self.commit);
        tokio::task::spawn_blocking(move || {
            COMMIT_NOW.with(|c| c.set(commit));
            let conn = conn.lock().unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").map_err(unavailable)?;
            let out = f(&conn, to_nanos(SystemTime::now()));
            // Refusals are answers: the batch still commits.
            if matches!(out, Err(StoreError::Unavailable(_))) {
                let _ = conn.execute_batch("ROLLBACK");
                return out;
            }
            conn.execute_batch("COMMIT").map_err(unavailable)?;
            *ran.lock().unwrap().entry(call).or_default() += 1;
            out
        })
        .await
        .unwrap()
    }

    async fn completed(
        &self,
        call: &'static str,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: Vec<idem_runtime::follow_ons::FollowOn>,
    ) -> Result<(), StoreError> {
        let (key, response) = (*key.as_bytes(), response.to_owned());
        self.run(call, move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                sql("complete"),
                &[&&key[..], &(attempt.get() as i64), &response, &now],
            )?;
            insert_jobs(conn, &key, &jobs, now)
        })
        .await
    }
}

#[async_trait]
impl IdempotencyStore for SqliteReplayed {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let req = req.clone();
        self.run("claim", move |conn, now| {
            let key = req.key.as_bytes();
            let claimed = conn
                .prepare_cached(sql("claim"))
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
                            req.reference.tag() as i64,
                        ],
                        |row| row.get::<_, Option<i64>>(0),
                    )
                    .optional()
                })
                .map_err(unavailable)?;
            if let Some(tag) = claimed {
                let reference = Reference::with_tag(&req.key, tag.unwrap_or(0) as u64);
                return Ok(Claim::Claimed { reference });
            }
            match read(conn, key, now)? {
                Some(record) => Ok(Claim::Existing { record }),
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
        self.completed("complete", key, attempt, response, Vec::new())
            .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run("release", move |conn, _| {
            fenced(
                conn,
                &key,
                attempt,
                sql("release"),
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
        self.run("mark_unknown", move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                sql("mark_unknown"),
                &[&&key[..], &(attempt.get() as i64), &note, &now],
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
        self.run("heartbeat", move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                sql("heartbeat"),
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
        let tag = reference.tag() as i64;
        let tenant = tenant.to_owned();
        self.run("lookup", move |conn, now| {
            let mut found = read_many(
                conn,
                sql("lookup"),
                params![&lo[..], &hi[..], tenant, tag],
                now,
            )?;
            Ok(found.pop())
        })
        .await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

#[async_trait]
impl Upkeep for SqliteReplayed {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let (key, note) = (*key.as_bytes(), note.to_owned());
        self.run("mark_lapsed", move |conn, now| {
            let params: &[&dyn rusqlite::ToSql] =
                &[&&key[..], &(attempt.get() as i64), &note, &now];
            if change(conn, sql("mark_lapsed"), params)? == 1 {
                return Ok(true);
            }
            match refusal(conn, &key, attempt) {
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
        self.run("resolve", move |conn, now| {
            let a = attempt.get() as i64;
            let changed = match settle {
                None => change(
                    conn,
                    sql("resolve_completed"),
                    &[&&key[..], &a, &body, &note, &now],
                )?,
                Some(settle) => change(
                    conn,
                    sql("resolve_not_performed"),
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
        _taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = *key.as_bytes();
        self.run("defer_check", move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                sql("defer_check"),
                &[
                    &&key[..],
                    &(attempt.get() as i64),
                    &now.saturating_add(nanos(delay)),
                ],
            )
            .map(|()| true)
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
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let delivered = self.layout >= 5;
        self.run("purge_expired", move |conn, now| {
            let records = conn
                .prepare_cached(sql("purge"))
                .and_then(|mut s| s.execute(params![now, batch]))
                .map_err(unavailable)?;
            if !delivered {
                return Ok(records);
            }
            let left = batch - i64::try_from(records).unwrap_or(batch);
            let jobs = conn
                .prepare_cached(sql("purge_jobs"))
                .and_then(|mut s| s.execute(params![now, left]))
                .map_err(unavailable)?;
            Ok(records + jobs)
        })
        .await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("list_lapsed", move |conn, now| {
            read_many(conn, sql("lapsed"), params![now, limit], now)
        })
        .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run("list_unknown", move |conn, now| {
            read_many(conn, sql("unknown"), params![now, limit], now)
        })
        .await
    }
}

#[async_trait]
impl Inspect for SqliteReplayed {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.code());
        let (tenant, tool) = (filter.tenant.clone(), filter.tool.clone());
        self.run("list_records", move |conn, now| {
            read_many(
                conn,
                sql("filtered"),
                params![state, tenant, tool, limit],
                now,
            )
        })
        .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.run("count_records", |conn, _| {
            let mut stmt = conn.prepare_cached(sql("counted")).map_err(unavailable)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)?;
            let mut counts = StateCounts::default();
            for (code, n) in rows {
                let kind = RecordStateKind::from_code(code)
                    .ok_or_else(|| StoreError::Corrupt(format!("state {code}")))?;
                counts.add(kind, u64::try_from(n).unwrap_or(0));
            }
            Ok(counts)
        })
        .await
    }
}

#[async_trait]
impl FollowOnStore for SqliteReplayed {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.completed(
            "complete_with_follow_ons",
            key,
            attempt,
            response,
            jobs.to_vec(),
        )
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
            fenced(
                conn,
                &key,
                attempt,
                sql("resolve_completed"),
                &[&&key[..], &(attempt.get() as i64), &body, &note, &now],
            )?;
            insert_jobs(conn, &key, &jobs, now)
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
            let mut leased = read_jobs(
                conn,
                sql("lease_jobs"),
                params![
                    attempt.get() as i64,
                    now.saturating_add(nanos(lease)),
                    now,
                    names,
                    limit
                ],
            )?;
            leased.sort_by_key(|j| (j.created_at, j.id.reference, j.id.name.clone()));
            Ok(leased)
        })
        .await
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        let id = id.clone();
        let (lo, hi) = key_range(&id.reference);
        let tag = id.reference.tag() as i64;
        let delivered = self.layout >= 5;
        self.run("finish_job", move |conn, now| {
            if !delivered {
                // It deleted the job.
                return fenced_job(conn, sql("finish_job"), &id, attempt, &[]);
            }
            let rest: [&dyn rusqlite::ToSql; 4] = [&now, &&lo[..], &&hi[..], &tag];
            fenced_job(conn, sql("finish_job"), &id, attempt, &rest)
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
            fenced_job(conn, sql("retry_job"), &id, attempt, &[&at, &error, &now])
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
            fenced_job(conn, sql("bury_job"), &id, attempt, &[&error, &now])
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
                    FollowOnState::Waiting => 1,
                    FollowOnState::Running => 2,
                    FollowOnState::Dead => 4,
                    FollowOnState::Delivered => 8,
                }
            })
        });
        self.run("list_jobs", move |conn, _| {
            read_jobs(
                conn,
                sql("jobs_filtered"),
                params![tenant, reference, name, states, limit],
            )
        })
        .await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.run("redrive_job", move |conn, now| {
            let changed = change(
                conn,
                sql("redrive_job"),
                &[&id.tenant, &id.reference.as_bytes(), &id.name, &now],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.run("count_due_jobs", |conn, now| {
            let mut stmt = conn
                .prepare_cached(sql("count_due_jobs"))
                .map_err(unavailable)?;
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
