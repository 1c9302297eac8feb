//! The SQLite store's SQL, written once from the state codes of
//! [`RecordStateKind`].

use super::*;

/// The store's SQL, written once from the state codes of
/// [`RecordStateKind`].
pub(super) struct Statements {
    pub(super) claim: String,
    pub(super) keep: String,
    pub(super) take_over: String,
    pub(super) read: String,
    pub(super) refusal: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) mark_unknown: String,
    pub(super) mark_lapsed: String,
    pub(super) resolve_completed: String,
    pub(super) resolve_not_performed: String,
    pub(super) defer_check: String,
    pub(super) take_check: String,
    pub(super) heartbeat: String,
    pub(super) lookup: String,
    /// The records with a reference in every tenant: `?1`, `?2` the key
    /// range, `?3` the tag.
    pub(super) by_reference: String,
    pub(super) purge: String,
    pub(super) purge_superseded: String,
    pub(super) purge_jobs: String,
    pub(super) lapsed: String,
    pub(super) unknown: String,
    pub(super) filtered: String,
    pub(super) counted: String,
    pub(super) record_tenant: String,
    pub(super) insert_job: String,
    pub(super) lease_follow_ons: String,
    pub(super) finish_follow_on: String,
    pub(super) retry_follow_on: String,
    pub(super) bury_follow_on: String,
    pub(super) redrive_follow_on: String,
    pub(super) jobs_filtered: String,
    pub(super) count_due_follow_ons: String,
}

/// The claim's upsert (`?1`..`?10`: key, fingerprint, tenant, tool,
/// attempt, now, lease's end, window's end, retention's end, offered tag),
/// taking over an existing row only `WHERE when`. It returns the operation
/// the claim runs under (Record::takeover_reference).
fn upsert(when: &str) -> String {
    format!(
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
         WHERE {when} \
         RETURNING operation",
        takeover_operation("idem_records.", "excluded.operation", "?6"),
    )
}

pub(super) static SQL: std::sync::LazyLock<Statements> = std::sync::LazyLock::new(|| Statements {
    // One statement: insert, or take over a record that Record::is_claimable
    // and that need not be kept (Record::outlives_takeover): the first
    // claim, and the takeover of a record past its retention, stay one
    // statement. A record that must be kept is left alone: the claim reads
    // it, then `keep` and `take_over` (one write lock: nothing slips
    // between them).
    claim: upsert(&format!(
        "{} AND NOT {}",
        claimable("idem_records.", "?6"),
        outlives_takeover("idem_records.", "excluded.operation", "?6")
    )),
    // The claim's parameters (only ?1, ?6 and ?10 are read): the record of
    // the key, as it is, into idem_superseded if the claim takes it over and
    // it outlives the takeover. An older copy of the same operation is
    // replaced.
    keep: format!(
        "INSERT INTO idem_superseded ({COLUMNS}) SELECT {} FROM idem_records \
         WHERE key = ?1 AND {} AND {} {}",
        superseded_copy(""),
        claimable("", "?6"),
        outlives_takeover("", "?10", "?6"),
        superseded_replace("excluded")
    ),
    // After `keep`: the claim, taking over any claimable record.
    take_over: upsert(&claimable("idem_records.", "?6")),
    read: format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?1"),
    refusal: "SELECT attempt, state, updated_at FROM idem_records WHERE key = ?1".to_owned(),
    // Every fenced change carries `attempt = ?2`: a worker whose claim was
    // taken over must not overwrite, delete or extend the new owner's record.
    // The window's end (`expires_at`) is not moved, however late the
    // completion: one that lands after it frees the key at once, and the
    // record reads by its reference until its retention ends.
    complete: format!(
        "UPDATE idem_records SET state = {COMPLETED}, body = ?3, updated_at = ?4 \
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
           updated_at = ?5 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN}"
    ),
    // `updated_at <= ?6`: "not performed" is trusted only for a record
    // unchanged for the settle period (?6 = now - settle).
    resolve_not_performed: format!(
        "UPDATE idem_records SET state = {NOT_PERFORMED}, body = ?3, resolution = ?4, \
           updated_at = ?5 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN} AND updated_at <= ?6"
    ),
    // `?4`: the hold's end of the check taken, if any; the deferral answers
    // only that check, not one another replica took once the hold ran out.
    defer_check: format!(
        "UPDATE idem_records SET next_check_at = ?3, checks = checks + 1 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN} \
           AND (?4 IS NULL OR next_check_at = ?4)"
    ),
    // `next_check_at <= ?4` (now): taken only when due, so of the replicas
    // that listed the record one asks the processor.
    take_check: format!(
        "UPDATE idem_records SET next_check_at = ?3 \
         WHERE key = ?1 AND attempt = ?2 AND state = {UNKNOWN} AND next_check_at <= ?4"
    ),
    heartbeat: format!(
        "UPDATE idem_records SET lease_until = ?3, updated_at = ?4 \
         WHERE key = ?1 AND attempt = ?2 AND state = {IN_PROGRESS}"
    ),
    // The key's current record, then a superseded operation.
    lookup: looked_up("idem_records", "idem_superseded", "", |n| format!("?{n}")),
    by_reference: found_by_reference("idem_records", "idem_superseded", "", |n| format!("?{n}")),
    purge: format!(
        "DELETE FROM idem_records WHERE key IN ( \
           SELECT key FROM idem_records WHERE {} LIMIT ?2)",
        expired("", "?1")
    ),
    // The superseded operations whose retention ended: the purge's second
    // statement, in the same transaction.
    purge_superseded: format!(
        "DELETE FROM idem_superseded WHERE (key, operation) IN ( \
           SELECT key, operation FROM idem_superseded WHERE {} LIMIT ?2)",
        expired("", "?1")
    ),
    // Delivered jobs whose record has expired (kept_until is its retention's
    // end): the purge's third statement, in the same transaction.
    purge_jobs: "DELETE FROM idem_jobs WHERE (tenant, reference, name) IN ( \
           SELECT tenant, reference, name FROM idem_jobs \
           WHERE delivered_at IS NOT NULL AND kept_until <= ?1 LIMIT ?2)"
        .to_owned(),
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
    filtered: filtered("idem_records", "idem_superseded", "", |n| format!("?{n}")),
    counted: counted("idem_records", "idem_superseded"),
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
    // cannot be split by another process's lease. `dead = 0 AND
    // delivered_at IS NULL` is written as the partial index's predicate.
    lease_follow_ons: format!(
        "UPDATE idem_jobs SET token = ?1, attempts = attempts + 1, next_run_at = ?2, \
           updated_at = ?3 \
         WHERE (tenant, reference, name) IN ( \
           SELECT tenant, reference, name FROM idem_jobs \
           WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?3 \
             AND name IN (SELECT value FROM json_each(?4)) \
           ORDER BY next_run_at LIMIT ?5) \
         RETURNING {JOB_COLUMNS}"
    ),
    // Every change of a leased job carries `attempt = ?4`: a dispatcher whose
    // lease ran out (and was taken by another) must not finish, retry or
    // bury the new holder's run.
    // Finishing delivers the job: kept (never leased again) until its
    // record's retention ends, the record found as `lookup` finds it (?6..?8:
    // the key range and the tag; the key's current record, then a
    // superseded operation), or until the next purge when it is gone.
    finish_follow_on: "UPDATE idem_jobs SET token = NULL, delivered_at = ?5, updated_at = ?5, \
           kept_until = coalesce((SELECT retain_until FROM idem_records \
             WHERE key BETWEEN ?6 AND ?7 AND tenant = ?1 AND coalesce(operation, 0) = ?8 \
             ORDER BY key LIMIT 1), \
           (SELECT retain_until FROM idem_superseded \
             WHERE key BETWEEN ?6 AND ?7 AND tenant = ?1 AND operation = ?8 \
             ORDER BY key LIMIT 1), ?5) \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
        .to_owned(),
    retry_follow_on: "UPDATE idem_jobs SET token = NULL, next_run_at = ?5, last_error = ?6, \
           updated_at = ?7 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
        .to_owned(),
    bury_follow_on:
        "UPDATE idem_jobs SET token = NULL, dead = 1, last_error = ?5, updated_at = ?6 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4"
            .to_owned(),
    redrive_follow_on: format!(
        "UPDATE idem_jobs SET dead = 0, {REDRIVE_SET}, next_run_at = ?4, updated_at = ?4 \
         WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND dead = 1"
    ),
    jobs_filtered: jobs_filtered("idem_jobs", |n| format!("?{n}")),
    count_due_follow_ons: "SELECT name, count(*) FROM idem_jobs \
         WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?1 GROUP BY name"
        .to_owned(),
});
