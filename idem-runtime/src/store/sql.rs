//! What the SQL stores share: the state codes, the record's predicates
//! (expired, claimable, kept when taken over) and its superseded copy, how
//! a reference is found by a range over the primary key, and the follow-on
//! follow-ons' columns and listing.

use super::{RecordState, RecordStateKind, StoreError};
use crate::key::Reference;

/// The `state` column's codes, from the one table in [`RecordStateKind`].
pub(crate) const IN_PROGRESS: i16 = RecordStateKind::InProgress.code();
pub(crate) const COMPLETED: i16 = RecordStateKind::Completed.code();
pub(crate) const UNKNOWN: i16 = RecordStateKind::Unknown.code();
pub(crate) const NOT_PERFORMED: i16 = RecordStateKind::NotPerformed.code();

/// Every column of a record, in the order the stores' row readers take them.
pub(crate) const COLUMNS: &str = "key, fingerprint, tenant, tool, state, attempt, claimed_at, \
                                  updated_at, lease_until, expires_at, retain_until, body, \
                                  next_check_at, checks, resolution, operation";

/// The record state a row's `state` code and `body` stand for.
pub(crate) fn state_from(code: i16, body: Option<String>) -> Result<RecordState, StoreError> {
    RecordStateKind::from_code(code.into())
        .and_then(|kind| RecordState::from_stored(kind, body))
        .ok_or_else(|| StoreError::Corrupt(format!("state {code}")))
}

/// `Record::is_expired` in SQL, for the row named `r` (`"r."`, or `""`)
/// at the time `now` (a parameter or `now()`): its retention ended and,
/// unless it settled (COMPLETED or NOT_PERFORMED), its lease ran out too.
/// `retain_until <= now` comes first so the index on `retain_until`
/// (migration 6) finds the candidates: a COMPLETED record now lives until
/// its retention, not until its window.
pub(crate) fn expired(r: &str, now: &str) -> String {
    format!(
        "{r}retain_until <= {now} AND ({r}state IN ({COMPLETED}, {NOT_PERFORMED}) \
         OR {r}lease_until <= {now})"
    )
}

/// `Record::is_claimable` (the negation of `Record::holds_key`) in SQL, for
/// the row named `r` at the time `now`: a COMPLETED record holds its key
/// until its window ends (`expires_at`, never moved after the claim), a
/// NOT_PERFORMED one never, an IN_PROGRESS or UNKNOWN one until both its
/// retention and its lease ran out.
pub(crate) fn claimable(r: &str, now: &str) -> String {
    format!(
        "(({r}state = {COMPLETED} AND {r}expires_at <= {now}) OR {r}state = {NOT_PERFORMED} \
         OR ({r}state IN ({IN_PROGRESS}, {UNKNOWN}) AND {r}retain_until <= {now} \
           AND {r}lease_until <= {now}))"
    )
}

/// `Record::outlives_takeover` in SQL, for the row named `r` taken over at
/// `now` by a claim offering the operation tag `offered`: the claim runs
/// under another reference than the record's (see [`takeover_operation`];
/// a reference is the key's first bytes and the tag, so comparing tags
/// compares references), and the record's retention has not ended. Such a
/// record is kept in `idem_superseded` by the claim that takes its key.
pub(crate) fn outlives_takeover(r: &str, offered: &str, now: &str) -> String {
    format!(
        "(NOT ({r}state = {NOT_PERFORMED} AND {r}expires_at > {now}) \
         AND coalesce({r}operation, 0) <> {offered} AND {r}retain_until > {now})"
    )
}

/// The columns of a superseded operation's row (`idem_superseded`), from
/// the record's row named `r`, in [`COLUMNS`]' order: the same, but the
/// operation is never NULL (it is part of the primary key): a record
/// written before tags is kept under tag 0, which reads as the same
/// reference.
pub(crate) fn superseded_copy(r: &str) -> String {
    format!(
        "{r}key, {r}fingerprint, {r}tenant, {r}tool, {r}state, {r}attempt, {r}claimed_at, \
         {r}updated_at, {r}lease_until, {r}expires_at, {r}retain_until, {r}body, \
         {r}next_check_at, {r}checks, {r}resolution, coalesce({r}operation, 0)"
    )
}

/// The `ON CONFLICT (key, operation)` action of a copy into
/// `idem_superseded`: the operation's latest record replaces an older copy
/// (`excluded` is the proposed row, `EXCLUDED` in PostgreSQL).
pub(crate) fn superseded_replace(excluded: &str) -> String {
    format!(
        "ON CONFLICT (key, operation) DO UPDATE SET fingerprint = {e}.fingerprint, \
           tenant = {e}.tenant, tool = {e}.tool, state = {e}.state, attempt = {e}.attempt, \
           claimed_at = {e}.claimed_at, updated_at = {e}.updated_at, \
           lease_until = {e}.lease_until, expires_at = {e}.expires_at, \
           retain_until = {e}.retain_until, body = {e}.body, \
           next_check_at = {e}.next_check_at, checks = {e}.checks, \
           resolution = {e}.resolution",
        e = excluded
    )
}

/// The smallest and largest 32-byte keys that start with `reference`'s
/// first eight bytes: a reference starts with its key's, so a range over the
/// primary key finds the record without an index of its own (the lookup then
/// checks the operation's tag).
pub(crate) fn key_range(reference: &Reference) -> ([u8; 32], [u8; 32]) {
    let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
    lo[..8].copy_from_slice(&reference.key_prefix());
    hi[..8].copy_from_slice(&reference.key_prefix());
    (lo, hi)
}

/// The `operation` column's value for a reference's tag: the tag's bits as a
/// signed 64-bit integer, NULL (a record written before tags) read as zero.
pub(crate) fn tag_to_column(reference: &Reference) -> i64 {
    reference.tag() as i64
}

/// The claim's rule for the reference ([`Record::takeover_reference`](super::Record::takeover_reference))
/// in SQL, for an upsert's `SET operation = …`: a NOT_PERFORMED record
/// within its window keeps its operation; anything else taken over gets the
/// claim's. `r` names the existing row, `offered` the claim's tag and `now`
/// the time.
pub(crate) fn takeover_operation(r: &str, offered: &str, now: &str) -> String {
    format!(
        "CASE WHEN {r}state = {NOT_PERFORMED} AND {r}expires_at > {now} \
         THEN {r}operation ELSE {offered} END"
    )
}

/// `list_records`: the rows of `table` and of `superseded` (the keys'
/// current records and the superseded operations) matching the optional
/// state, tenant and tool (each parameter NULL for "any"), the newest
/// claims first. `param(n)` is the backend's n-th placeholder, typed where
/// the backend needs it.
pub(crate) fn filtered(
    table: &str,
    superseded: &str,
    extra: &str,
    param: impl Fn(u8) -> String,
) -> String {
    let (state, tenant, tool, limit) = (param(1), param(2), param(3), param(4));
    let pick = |t: &str| {
        format!(
            "SELECT {COLUMNS} FROM {t} \
             WHERE ({state} IS NULL OR state = {state}) \
               AND ({tenant} IS NULL OR tenant = {tenant}) \
               AND ({tool} IS NULL OR tool = {tool})"
        )
    };
    format!(
        "SELECT {COLUMNS}{extra} FROM ({} UNION ALL {}) AS r \
         ORDER BY claimed_at DESC LIMIT {limit}",
        pick(table),
        pick(superseded)
    )
}

/// `lookup`: the record with a reference in a tenant, `param(1)`..`param(4)`
/// the key range, the tenant and the tag ([`key_range`], [`tag_to_column`]):
/// the key's current record in `table` first, then a superseded operation
/// in `superseded`. A reference starts with its key's first eight bytes: a
/// range over the primary key finds it without an index of its own, and
/// the tag tells this operation from another of the same key (NULL: a
/// record written before tags, whose reference has none).
pub(crate) fn looked_up(
    table: &str,
    superseded: &str,
    extra: &str,
    param: impl Fn(u8) -> String,
) -> String {
    let (lo, hi, tenant, tag) = (param(1), param(2), param(3), param(4));
    let pick = |t: &str, rank: u8| {
        format!(
            "SELECT {COLUMNS}, {rank} AS rank FROM {t} \
             WHERE key BETWEEN {lo} AND {hi} AND tenant = {tenant} \
               AND coalesce(operation, 0) = {tag}"
        )
    };
    format!(
        "SELECT {COLUMNS}{extra} FROM ({} UNION ALL {}) AS r ORDER BY rank, key LIMIT 1",
        pick(table, 0),
        pick(superseded, 1)
    )
}

/// `find_by_reference`: the records with a reference in every tenant,
/// `param(1)`..`param(3)` the key range and the tag ([`key_range`],
/// [`tag_to_column`]): the key's current records in `table` and the
/// superseded operations in `superseded`, the newest claims first, as
/// `list_records` lists them. Each part is a range over its table's
/// primary key (`key`, and `(key, operation)`): an index search, never a
/// scan, however many records the store holds.
pub(crate) fn found_by_reference(
    table: &str,
    superseded: &str,
    extra: &str,
    param: impl Fn(u8) -> String,
) -> String {
    let (lo, hi, tag) = (param(1), param(2), param(3));
    format!(
        "SELECT {COLUMNS}{extra} FROM ( \
           SELECT {COLUMNS} FROM {table} \
           WHERE key BETWEEN {lo} AND {hi} AND coalesce(operation, 0) = {tag} \
           UNION ALL \
           SELECT {COLUMNS} FROM {superseded} \
           WHERE key BETWEEN {lo} AND {hi} AND operation = {tag}) AS r \
         ORDER BY claimed_at DESC"
    )
}

/// `count_records`: one row per state code present, with its count, over
/// `table` and `superseded`.
pub(crate) fn counted(table: &str, superseded: &str) -> String {
    format!(
        "SELECT state, count(*) FROM \
         (SELECT state FROM {table} UNION ALL SELECT state FROM {superseded}) AS r \
         GROUP BY state"
    )
}

/// The counts of `count_records` from `(state code, count)` rows.
pub(crate) fn counts(
    rows: impl IntoIterator<Item = (i64, i64)>,
) -> Result<super::StateCounts, StoreError> {
    let mut counts = super::StateCounts::default();
    for (code, n) in rows {
        let kind = RecordStateKind::from_code(code)
            .ok_or_else(|| StoreError::Corrupt(format!("state {code}")))?;
        counts.add(kind, u64::try_from(n).unwrap_or(0));
    }
    Ok(counts)
}

/// Every column of a follow-on, in the order the stores' follow-on readers
/// take them. A follow-on is due when it is neither dead nor delivered and
/// `next_run_at <= now`; a lease sets `next_run_at` to the lease's end, so a
/// leased follow-on is not due until its lease runs out. A delivered follow-on keeps its
/// row until `kept_until` (its record's expiry), when the purge deletes it.
pub(crate) const JOB_COLUMNS: &str = "tenant, reference, name, payload, attempts, token, \
                                      next_run_at, last_error, dead, created_at, updated_at, \
                                      delivered_at, kept_until, earlier_runs, \
                                      error_before_redrive";

/// What a re-drive sets besides `dead`, the time and the due time, in both
/// SQL stores ([`FollowOnRecord::redrive`](super::FollowOnRecord)'s fields): the runs counted from
/// 0 again and added to `earlier_runs`, the last error kept as
/// `error_before_redrive`, no lease.
pub(crate) const REDRIVE_SET: &str = "earlier_runs = earlier_runs + attempts, attempts = 0, \
                                      error_before_redrive = last_error, last_error = NULL, \
                                      token = NULL";

/// A follow-on row's state as [`FollowOnState`](super::FollowOnState)'s bit: delivered 8,
/// dead 4, running (a token) 2, waiting 1.
const JOB_STATE_BIT: &str = "CASE WHEN delivered_at IS NOT NULL THEN 8 WHEN dead THEN 4 \
                             WHEN token IS NOT NULL THEN 2 ELSE 1 END";

/// `list_follow_ons`: the follow-ons matching the optional tenant, reference, name and
/// states (a mask of [`FollowOnState`](super::FollowOnState)'s bits; each parameter
/// NULL for "any"), the oldest first. `param(n)` is the backend's n-th
/// placeholder, typed where the backend needs it.
pub(crate) fn jobs_filtered(table: &str, param: impl Fn(u8) -> String) -> String {
    let (tenant, reference, name, states, limit) =
        (param(1), param(2), param(3), param(4), param(5));
    format!(
        "SELECT {JOB_COLUMNS} FROM {table} \
         WHERE ({tenant} IS NULL OR tenant = {tenant}) \
           AND ({reference} IS NULL OR reference = {reference}) \
           AND ({name} IS NULL OR name = {name}) \
           AND ({states} IS NULL OR ({states} & {JOB_STATE_BIT}) <> 0) \
         ORDER BY created_at, reference, name, tenant LIMIT {limit}"
    )
}
