//! The store's SQL, written once per schema from the state codes of
//! [`RecordStateKind`](crate::store::RecordStateKind).

use crate::store::sql::{expired, COLUMNS, COMPLETED, IN_PROGRESS, UNKNOWN};

/// The store's SQL, with the schema filled in once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) schema: String,
    pub(super) claim: String,
    pub(super) read: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) mark_unknown: String,
    pub(super) heartbeat: String,
    pub(super) refusal: String,
    pub(super) lookup: String,
    pub(super) purge: String,
    pub(super) lapsed: String,
    pub(super) unknown: String,
}

impl Statements {
    pub(super) fn new(schema: String) -> Self {
        let t = format!("{schema}.idem_records");
        Statements {
            // One statement: insert, or take over the row only if it is
            // expired per Record::is_expired. A live row is left alone (and
            // only locked for the statement), and no row comes back.
            claim: format!(
                "INSERT INTO {t} AS r (key, fingerprint, tenant, tool, state, attempt, \
                   claimed_at, updated_at, lease_until, expires_at, retain_until, body) \
                 VALUES ($1, $2, $3, $4, {IN_PROGRESS}, $5, now(), now(), \
                   now() + $6::int8 * interval '1 microsecond', \
                   now() + $7::int8 * interval '1 microsecond', \
                   now() + $8::int8 * interval '1 microsecond', NULL) \
                 ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
                   tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = {IN_PROGRESS}, \
                   attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
                   updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
                   expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
                   body = NULL \
                 WHERE {} \
                 RETURNING 1",
                expired("r.", "now()")
            ),
            read: format!("SELECT {COLUMNS}, now() FROM {t} WHERE key = $1"),
            // Every fenced change carries `attempt = $2`: a worker whose claim
            // was taken over (lease ran out, record purged and claimed again)
            // must not overwrite, delete or extend the new owner's record.
            complete: format!(
                "UPDATE {t} SET state = {COMPLETED}, body = $3, updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state <> {COMPLETED}"
            ),
            release: format!(
                "DELETE FROM {t} WHERE key = $1 AND attempt = $2 AND state <> {COMPLETED}"
            ),
            mark_unknown: format!(
                "UPDATE {t} SET state = {UNKNOWN}, body = $3, updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = {IN_PROGRESS}"
            ),
            heartbeat: format!(
                "UPDATE {t} SET lease_until = now() + $3::int8 * interval '1 microsecond', \
                   updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = {IN_PROGRESS}"
            ),
            refusal: format!("SELECT attempt, state FROM {t} WHERE key = $1"),
            // The reference is the key's first eight bytes: a range over the
            // primary key finds it without a column or index of its own.
            lookup: format!(
                "SELECT {COLUMNS} FROM {t} WHERE key BETWEEN $1 AND $2 AND tenant = $3 \
                 ORDER BY key LIMIT 1"
            ),
            // Bounded, and SKIP LOCKED: rows a claim is taking over right now
            // are left for the next batch instead of being waited on. The
            // rows are deleted by ctid (stable: they are locked), a TID scan;
            // `key IN (…)` let the planner choose a hash join over a sequential
            // scan of the whole table on mid-sized tables, 5× slower a batch.
            purge: format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {t} AS r WHERE {} LIMIT $1 FOR UPDATE SKIP LOCKED))",
                expired("r.", "now()")
            ),
            lapsed: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = {IN_PROGRESS} AND lease_until <= now() \
                 ORDER BY lease_until LIMIT $1"
            ),
            unknown: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = {UNKNOWN} ORDER BY claimed_at LIMIT $1"
            ),
            schema,
        }
    }
}
