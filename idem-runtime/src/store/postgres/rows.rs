//! Rows read into records and jobs, durations as microseconds, and the
//! fenced changes and their refusals.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::exec::{Db, Param};
use super::statements::Statements;
use super::CallError;
use crate::key::{IdempotencyKey, Reference};
use crate::store::sql::state_from;
use crate::store::{
    self, Attempt, FollowOn, FollowOnId, FollowOnRecord, Record, RecordStateKind, StoreError,
};

pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A record from a row of `{COLUMNS}, now()`.
pub(super) fn row_to_record(row: &Row) -> Result<Record, StoreError> {
    let bytes32 = |i: usize| -> Result<[u8; 32], StoreError> {
        let v: &[u8] = row.try_get(i).map_err(corrupt)?;
        <[u8; 32]>::try_from(v)
            .map_err(|_| StoreError::Corrupt("a key or fingerprint is not 32 bytes".into()))
    };
    let text = |i: usize| -> Result<Option<String>, StoreError> {
        let b: Option<Vec<u8>> = row.try_get(i).map_err(corrupt)?;
        b.map(|b| {
            String::from_utf8(b).map_err(|_| StoreError::Corrupt("a body is not UTF-8".into()))
        })
        .transpose()
    };
    let state = state_from(row.try_get(4).map_err(corrupt)?, text(11)?)?;
    let time = |i: usize| row.try_get::<_, SystemTime>(i).map_err(corrupt);
    let key = IdempotencyKey::from_parts(bytes32(0)?, bytes32(1)?);
    let tag = row.try_get::<_, Option<i64>>(15).map_err(corrupt)?;
    Ok(Record {
        key,
        reference: Reference::with_tag(&key, tag.unwrap_or(0) as u64),
        tenant: row.try_get(2).map_err(corrupt)?,
        tool: row.try_get(3).map_err(corrupt)?,
        attempt: Attempt::from_stored(row.try_get::<_, i64>(5).map_err(corrupt)? as u64),
        state,
        claimed_at: time(6)?,
        updated_at: time(7)?,
        lease_until: time(8)?,
        expires_at: time(9)?,
        retain_until: time(10)?,
        next_check_at: time(12)?,
        checks: row.try_get::<_, i32>(13).map_err(corrupt)?.max(0) as u32,
        resolution: text(14)?,
        observed_at: time(16)?,
    })
}

pub(super) fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("unexpected column: {e}"))
}

/// The owner, state and last change of the record with this key, if any:
/// why a fenced change touched no row.
pub(super) async fn found(
    db: &Db<'_>,
    sql: &Statements,
    key: &[u8],
) -> Result<Option<(Attempt, RecordStateKind, SystemTime)>, CallError> {
    let Some(row) = db.query_opt(&sql.refusal, &[&key]).await? else {
        return Ok(None);
    };
    let state = row.get::<_, i16>(1);
    let kind = RecordStateKind::from_code(state.into())
        .ok_or_else(|| StoreError::Corrupt(format!("state {state}")))?;
    Ok(Some((
        Attempt::from_stored(row.get::<_, i64>(0) as u64),
        kind,
        row.get(2),
    )))
}

/// Why a fenced change touched no row: the attempt lost the record (or it is
/// gone), or the record is in a state that refuses the change.
pub(super) async fn refusal(
    db: &Db<'_>,
    sql: &Statements,
    key: &[u8],
    attempt: Attempt,
) -> Result<StoreError, CallError> {
    let found = found(db, sql, key).await?;
    Ok(store::refusal(
        found.map(|(owner, state, _)| (owner, state)),
        attempt,
    ))
}

/// A fenced change: `sql` must change exactly one row or it is refused.
pub(super) async fn fenced(
    db: &Db<'_>,
    sql: &Statements,
    stmt: &str,
    key: &[u8],
    attempt: Attempt,
    params: &[&dyn Param],
) -> Result<(), CallError> {
    if db.execute(stmt, params).await? == 1 {
        Ok(())
    } else {
        Err(refusal(db, sql, key, attempt).await?.into())
    }
}

/// A fenced change whose own condition may hold it back: `Ok(true)`
/// changed; `Ok(false)` still `attempt`'s and `in_state` (the condition held
/// it back); otherwise refused.
pub(super) async fn fenced_unless(
    db: &Db<'_>,
    sql: &Statements,
    stmt: &str,
    key: &[u8],
    attempt: Attempt,
    in_state: RecordStateKind,
    params: &[&dyn Param],
) -> Result<bool, CallError> {
    if db.execute(stmt, params).await? == 1 {
        return Ok(true);
    }
    match refusal(db, sql, key, attempt).await? {
        StoreError::WrongState { found } if found == in_state => Ok(false),
        refused => Err(refused.into()),
    }
}

/// A follow-on from a row of `{JOB_COLUMNS}`.
pub(super) fn row_to_job(row: &Row) -> Result<FollowOnRecord, StoreError> {
    let reference: &[u8] = row.try_get(1).map_err(corrupt)?;
    let reference = Reference::from_bytes(reference)
        .ok_or_else(|| StoreError::Corrupt("a job's reference is not 8 or 16 bytes".into()))?;
    let payload: Vec<u8> = row.try_get(3).map_err(corrupt)?;
    let payload = String::from_utf8(payload)
        .map_err(|_| StoreError::Corrupt("a job's payload is not UTF-8".into()))?;
    let time = |i: usize| row.try_get::<_, SystemTime>(i).map_err(corrupt);
    Ok(FollowOnRecord {
        id: FollowOnId {
            tenant: row.try_get(0).map_err(corrupt)?,
            reference,
            name: row.try_get(2).map_err(corrupt)?,
        },
        payload,
        runs: row.try_get::<_, i32>(4).map_err(corrupt)?.max(0) as u32,
        attempt: row
            .try_get::<_, Option<i64>>(5)
            .map_err(corrupt)?
            .map(|t| Attempt::from_stored(t as u64)),
        next_run_at: time(6)?,
        last_error: row.try_get(7).map_err(corrupt)?,
        dead: row.try_get(8).map_err(corrupt)?,
        created_at: time(9)?,
        updated_at: time(10)?,
        delivered_at: row.try_get(11).map_err(corrupt)?,
        kept_until: row.try_get(12).map_err(corrupt)?,
        earlier_runs: row.try_get::<_, i32>(13).map_err(corrupt)?.max(0) as u32,
        error_before_redrive: row.try_get(14).map_err(corrupt)?,
    })
}

/// A change of a leased job, fenced by its attempt: `stmt` with `$1`..`$4` =
/// tenant, reference, name, attempt, then `rest`. `Fenced` when no row
/// changed: another lease holds the job, or it is gone.
pub(super) async fn fenced_job(
    db: &Db<'_>,
    stmt: &str,
    id: &FollowOnId,
    attempt: Attempt,
    rest: &[&dyn Param],
) -> Result<(), CallError> {
    let (reference, attempt) = (id.reference.as_bytes(), attempt.get() as i64);
    let mut params: Vec<&dyn Param> = vec![&id.tenant, &reference, &id.name, &attempt];
    params.extend_from_slice(rest);
    match db.execute(stmt, &params).await? {
        0 => Err(StoreError::Fenced.into()),
        _ => Ok(()),
    }
}

/// The names and payloads of `jobs`, as the two arrays the statements
/// unnest.
pub(super) fn job_columns(jobs: &[FollowOn]) -> (Vec<&str>, Vec<&[u8]>) {
    jobs.iter()
        .map(|j| (j.name(), j.payload().as_bytes()))
        .unzip()
}

/// A fenced change of a record and its jobs in one statement
/// ([`Statements::complete_with_follow_ons`], `resolve_with_jobs`): refused as
/// [`fenced`] refuses when the record did not change, and then no job was
/// written either.
pub(super) async fn with_jobs(
    db: &Db<'_>,
    sql: &Statements,
    stmt: &str,
    key: &[u8],
    attempt: Attempt,
    params: &[&dyn Param],
) -> Result<(), CallError> {
    let changed: i64 = db.query_one(stmt, params).await?.try_get(0)?;
    if changed == 1 {
        Ok(())
    } else {
        Err(refusal(db, sql, key, attempt).await?.into())
    }
}
