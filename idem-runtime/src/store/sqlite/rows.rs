//! Rows read into records and jobs, times as nanoseconds, and the fenced
//! changes and their refusals.

use super::*;
use crate::store;

pub(super) fn to_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

pub(super) fn from_nanos(n: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n.max(0) as u64)
}

pub(super) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

pub(super) fn row_to_record(
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

pub(super) fn read(
    conn: &Connection,
    key: &[u8; 32],
    now: i64,
) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(&SQL.read)
        .and_then(|mut s| {
            s.query_row([&key[..]], |row| row_to_record(row, now))
                .optional()
        })
        .map_err(|e| unavailable(&e))?
        .transpose()
}

pub(super) fn read_many(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    now: i64,
) -> Result<Vec<Record>, StoreError> {
    read_rows(conn, sql, params, |row| row_to_record(row, now))
}

/// Every row `sql` selects, each read by `read`: `Unavailable` when the
/// statement fails, the first row's own error when one cannot be read.
fn read_rows<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<Result<T, StoreError>>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| unavailable(&e))?;
    let rows = stmt.query_map(params, read).map_err(|e| unavailable(&e))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row.map_err(|e| unavailable(&e))??);
    }
    Ok(out)
}

/// The owner, state and last change of the record with this key, if any:
/// why a fenced change touched no row.
pub(super) fn found(
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
pub(super) fn refusal(conn: &Connection, key: &[u8; 32], attempt: Attempt) -> StoreError {
    match found(conn, key) {
        Err(e) => e,
        Ok(found) => store::refusal(found.map(|(owner, state, _)| (owner, state)), attempt),
    }
}

/// Runs a fenced change: `sql` with `?1` = key and `?2` = attempt; how many
/// rows it changed (0 or 1).
pub(super) fn change(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(|e| unavailable(&e))
}

/// A fenced change of the record with `key` by `attempt` that must touch
/// exactly one row, or it is refused: `sql` with `?1` = key, `?2` =
/// attempt, then `rest`.
pub(super) fn fenced(
    conn: &Connection,
    key: &[u8; 32],
    attempt: Attempt,
    sql: &str,
    rest: &[&dyn rusqlite::ToSql],
) -> Result<(), StoreError> {
    let (at, fence) = (&key[..], attempt.get() as i64);
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&at, &fence];
    params.extend_from_slice(rest);
    if change(conn, sql, &params)? == 1 {
        Ok(())
    } else {
        Err(refusal(conn, key, attempt))
    }
}

/// A fenced change of the record with `key` by `attempt` whose own
/// condition may hold it back: `sql` with `?1` = key and `?2` = attempt
/// among `params`. `Ok(true)` changed; `Ok(false)` still `attempt`'s and
/// `in_state` (the condition held it back); otherwise refused.
pub(super) fn fenced_unless(
    conn: &Connection,
    key: &[u8; 32],
    attempt: Attempt,
    in_state: RecordStateKind,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<bool, StoreError> {
    if change(conn, sql, params)? == 1 {
        return Ok(true);
    }
    match refusal(conn, key, attempt) {
        StoreError::WrongState { found } if found == in_state => Ok(false),
        refused => Err(refused),
    }
}

pub(super) fn row_to_job(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<Result<FollowOnRecord, StoreError>> {
    let reference: Vec<u8> = row.get(1)?;
    let Some(reference) = Reference::from_bytes(&reference) else {
        return Ok(Err(StoreError::Corrupt(
            "a job's reference is not 8 or 16 bytes".into(),
        )));
    };
    Ok(Ok(FollowOnRecord {
        id: FollowOnId {
            tenant: row.get(0)?,
            reference,
            name: row.get(2)?,
        },
        payload: row.get(3)?,
        runs: row.get::<_, i64>(4)?.clamp(0, u32::MAX.into()) as u32,
        attempt: row
            .get::<_, Option<i64>>(5)?
            .map(|t| Attempt::from_stored(t as u64)),
        next_run_at: from_nanos(row.get(6)?),
        last_error: row.get(7)?,
        dead: row.get::<_, i64>(8)? != 0,
        created_at: from_nanos(row.get(9)?),
        updated_at: from_nanos(row.get(10)?),
        delivered_at: row.get::<_, Option<i64>>(11)?.map(from_nanos),
        kept_until: row.get::<_, Option<i64>>(12)?.map(from_nanos),
        earlier_runs: row.get::<_, i64>(13)?.clamp(0, u32::MAX.into()) as u32,
        error_before_redrive: row.get(14)?,
    }))
}

pub(super) fn read_jobs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<FollowOnRecord>, StoreError> {
    read_rows(conn, sql, params, row_to_job)
}

/// Writes `jobs` for the record with `key`, due at `now`, inside the
/// transaction of its completion.
pub(super) fn insert_jobs(
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

/// A change of a leased job, fenced by its attempt: `sql` with `?1`..`?4` =
/// tenant, reference, name, attempt, then `rest`. `Fenced` when no row changed.
pub(super) fn fenced_job(
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
