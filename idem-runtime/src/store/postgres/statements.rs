//! The store's SQL, written once per schema from the state codes of
//! [`RecordStateKind`](crate::store::RecordStateKind).

use crate::store::sql::{
    claimable, counted, expired, filtered, found_by_reference, jobs_filtered, looked_up,
    outlives_takeover, superseded_copy, superseded_replace, takeover_operation, COLUMNS, COMPLETED,
    IN_PROGRESS, JOB_COLUMNS, NOT_PERFORMED, REDRIVE_SET, UNKNOWN,
};

/// The store's SQL, with the schema filled in once. Every statement that
/// reads records selects `now()` last, the record's `observed_at`.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) schema: String,
    pub(super) claim: String,
    pub(super) take_over: String,
    pub(super) read: String,
    /// Migration 9's completion: `$1` the key, `$2` the attempt, `$3`
    /// the response; answers how many records it completed (0 or 1).
    pub(super) complete: String,
    /// [`Statements::complete`] for many records at once (migration 9's
    /// function), each fenced by its own attempt: `$1` the keys, `$2` the
    /// attempts, `$3` the responses; returns the (key, attempt) of each row
    /// it completed.
    pub(super) complete_many: String,
    pub(super) release: String,
    pub(super) mark_unknown: String,
    pub(super) mark_lapsed: String,
    pub(super) resolve_completed: String,
    pub(super) resolve_not_performed: String,
    pub(super) defer_check: String,
    pub(super) take_check: String,
    pub(super) heartbeat: String,
    pub(super) refusal: String,
    pub(super) lookup: String,
    /// The records with a reference in every tenant: `$1`, `$2` the key
    /// range, `$3` the tag.
    pub(super) by_reference: String,
    pub(super) purge: String,
    pub(super) purge_superseded: String,
    pub(super) purge_jobs: String,
    pub(super) lapsed: String,
    pub(super) unknown: String,
    pub(super) filtered: String,
    pub(super) counted: String,
    pub(super) complete_with_follow_ons: String,
    pub(super) resolve_with_jobs: String,
    pub(super) lease_follow_ons: String,
    pub(super) finish_follow_on: String,
    pub(super) retry_follow_on: String,
    pub(super) bury_follow_on: String,
    pub(super) redrive_follow_on: String,
    pub(super) jobs_filtered: String,
    pub(super) count_due_follow_ons: String,
}

/// A fenced change of a record (`change`, whose parameters end at `$n - 1`)
/// and, in the same statement, its follow-ons: `$n` the names (text[]),
/// `$n+1` the payloads (bytea[]). One statement is one transaction: the jobs
/// are inserted only from the row the change returns (its tenant and its
/// operation's reference), so a refused change inserts none, and a failed
/// insert undoes the change. Answers how many records changed (0 or 1).
///
/// A job's identity is its operation's reference and its name: one
/// completion per operation writes jobs, and a job already there is never
/// replaced, live or dead.
///
/// `first`, if not empty, is a CTE put before `done` (`name AS (…), `):
/// [`RELAXED`] for a relaxed completion.
fn with_jobs(first: &str, change: &str, jobs: &str, n: u8) -> String {
    let (names, payloads) = (n, n + 1);
    format!(
        "WITH {first}done AS ({change} RETURNING tenant, {REFERENCE}), \
         written AS ( \
           INSERT INTO {jobs} (tenant, reference, name, payload, attempts, token, next_run_at, \
             last_error, dead, created_at, updated_at) \
           SELECT done.tenant, done.reference, f.name, f.payload, 0, NULL, now(), NULL, \
             false, now(), now() \
           FROM done, unnest(${names}::text[], ${payloads}::bytea[]) AS f(name, payload) \
           ON CONFLICT (tenant, reference, name) DO NOTHING \
           RETURNING 1) \
         SELECT count(*) FROM done"
    )
}

/// The CTE that relaxes a completion's commit: `synchronous_commit = off`
/// for the statement's own (implicit) transaction only (`is_local = true`:
/// the setting ends with the transaction, so the pooled connection's next
/// statement, a claim say, commits synchronously again). The statement joins
/// it (`FROM relaxed`) so that it runs, and runs before the commit.
///
/// One statement, one round trip: `BEGIN; SET LOCAL …; UPDATE; COMMIT` as
/// four round trips costs more than the synchronous commit it saves.
const RELAXED: &str = "relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS off)";

/// A record's reference as `Reference::as_bytes` gives it: the key's first
/// eight bytes, then the operation's tag big-endian (none for a record
/// written before tags).
const REFERENCE: &str = "CASE WHEN coalesce(operation, 0) = 0 THEN substring(key FROM 1 FOR 8) \
     ELSE substring(key FROM 1 FOR 8) || int8send(operation) END AS reference";

/// `$n` microseconds as an interval.
fn micros(n: u8) -> String {
    format!("${n}::int8 * interval '1 microsecond'")
}

impl Statements {
    /// The statements over `schema`; with `relaxed_completions`, a
    /// completion (`complete`, `complete_with_follow_ons`) commits with
    /// `synchronous_commit = off` (see [`RELAXED`]); every other change
    /// commits as the server is configured.
    pub(super) fn new(schema: String, relaxed_completions: bool) -> Self {
        let t = format!("{schema}.idem_records");
        let s = format!("{schema}.idem_superseded");
        let j = format!("{schema}.idem_jobs");
        let (lease, window, retention) = (micros(6), micros(7), micros(8));
        let mut sql = Statements {
            // One statement, migration 9's function: insert, or take over
            // the row only if Record::is_claimable and the record need not
            // be kept (Record::outlives_takeover). A row that holds its key,
            // or that must be kept, is left alone (and only locked for the
            // statement), and NULL comes back; a claim answers the operation
            // it runs under (Record::takeover_reference). `$10`: the
            // server's own bound, in µs.
            claim: format!("SELECT {schema}.idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
            // The rare takeover of a record that must be kept: the claim's
            // parameters, and `$10` the attempt of the record the claim read.
            // One statement, so one transaction: `old` locks the row (and
            // reads its latest version), `taken` takes it over if it still
            // is that attempt's record and claimable, and `kept` copies the
            // record as it was into idem_superseded if it outlives the
            // takeover (an older copy of the same operation is replaced).
            // `taken` joins `old`, so the row is read before it is changed.
            // No row: the record changed or vanished since it was read; the
            // claim starts over.
            take_over: format!(
                "WITH old AS (SELECT {COLUMNS} FROM {t} WHERE key = $1 AND attempt = $10 \
                   FOR UPDATE), \
                 taken AS ( \
                   UPDATE {t} AS r SET operation = {}, fingerprint = $2, tenant = $3, \
                     tool = $4, state = {IN_PROGRESS}, attempt = $5, claimed_at = now(), \
                     updated_at = now(), lease_until = now() + {lease}, \
                     expires_at = now() + {window}, retain_until = now() + {retention}, \
                     body = NULL, next_check_at = now(), checks = 0, resolution = NULL \
                   FROM old WHERE r.key = old.key AND r.attempt = old.attempt AND {} \
                   RETURNING r.operation), \
                 kept AS ( \
                   INSERT INTO {s} ({COLUMNS}) SELECT {} FROM old, taken WHERE {} \
                   {}) \
                 SELECT operation FROM taken",
                takeover_operation("r.", "$9::int8", "now()"),
                claimable("r.", "now()"),
                superseded_copy("old."),
                outlives_takeover("old.", "$9::int8", "now()"),
                superseded_replace("EXCLUDED"),
            ),
            read: format!("SELECT {COLUMNS}, now() FROM {t} WHERE key = $1"),
            // Every fenced change carries `attempt = $2`: a worker whose claim
            // was taken over (lease ran out, record purged and claimed again)
            // must not overwrite, delete or extend the new owner's record.
            // Only the completion may be relaxed: losing it in a crash leaves
            // the record IN_PROGRESS, which the sweep and the reconciler
            // settle. Every other change commits synchronously (see
            // docs/states.md, "One durable commit per call").
            complete: format!("SELECT {schema}.idem_complete($1, $2, $3, {relaxed_completions})"),
            complete_many: format!(
                "SELECT * FROM {schema}.idem_complete_many($1, $2, $3, {relaxed_completions})"
            ),
            release: format!(
                "DELETE FROM {t} WHERE key = $1 AND attempt = $2 \
                 AND state IN ({IN_PROGRESS}, {UNKNOWN})"
            ),
            mark_unknown: format!(
                "UPDATE {t} SET state = {UNKNOWN}, body = $3, updated_at = now(), \
                   next_check_at = now(), checks = 0 \
                 WHERE key = $1 AND attempt = $2 AND state = {IN_PROGRESS}"
            ),
            // `lease_until <= now()` in the same statement: a heartbeat that
            // landed after the sweep listed the record keeps it alive.
            mark_lapsed: format!(
                "UPDATE {t} SET state = {UNKNOWN}, body = $3, updated_at = now(), \
                   next_check_at = now(), checks = 0 \
                 WHERE key = $1 AND attempt = $2 AND state = {IN_PROGRESS} \
                   AND lease_until <= now()"
            ),
            resolve_completed: format!(
                "UPDATE {t} SET state = {COMPLETED}, body = $3, resolution = $4, \
                   updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = {UNKNOWN}"
            ),
            // "Not performed" is trusted only for a record unchanged for the
            // settle period ($5 µs), by the server's clock.
            resolve_not_performed: format!(
                "UPDATE {t} SET state = {NOT_PERFORMED}, body = $3, resolution = $4, \
                   updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = {UNKNOWN} \
                   AND updated_at <= now() - {}",
                micros(5)
            ),
            // `$4`: the hold's end of the check taken, if any; the deferral
            // answers only that check, not one another replica took once
            // the hold ran out.
            defer_check: format!(
                "UPDATE {t} SET next_check_at = now() + {}, checks = checks + 1 \
                 WHERE key = $1 AND attempt = $2 AND state = {UNKNOWN} \
                   AND ($4::timestamptz IS NULL OR next_check_at = $4::timestamptz)",
                micros(3)
            ),
            // `next_check_at <= now()`: taken only when due, so of the
            // replicas that listed the record one asks the processor. The
            // hold's end comes back for the deferral that answers the check.
            take_check: format!(
                "UPDATE {t} SET next_check_at = now() + {} \
                 WHERE key = $1 AND attempt = $2 AND state = {UNKNOWN} \
                   AND next_check_at <= now() \
                 RETURNING next_check_at",
                micros(3)
            ),
            heartbeat: format!(
                "UPDATE {t} SET lease_until = now() + {}, updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = {IN_PROGRESS}",
                micros(3)
            ),
            refusal: format!("SELECT attempt, state, updated_at FROM {t} WHERE key = $1"),
            // The key's current record, then a superseded operation.
            lookup: looked_up(&t, &s, ", now()", |n| {
                let ty = match n {
                    1 | 2 => "bytea",
                    3 => "text",
                    _ => "int8",
                };
                format!("${n}::{ty}")
            }),
            by_reference: found_by_reference(&t, &s, ", now()", |n| {
                let ty = if n == 3 { "int8" } else { "bytea" };
                format!("${n}::{ty}")
            }),
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
            // The purge's second statement, with what is left of the batch:
            // the superseded operations whose retention ended.
            purge_superseded: format!(
                "DELETE FROM {s} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {s} AS r WHERE {} LIMIT $1 FOR UPDATE SKIP LOCKED))",
                expired("r.", "now()")
            ),
            // The purge's third statement, with what is left of the batch:
            // the delivered jobs whose record has expired (kept_until is its
            // expiry).
            purge_jobs: format!(
                "DELETE FROM {j} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {j} WHERE delivered_at IS NOT NULL AND kept_until <= now() \
                   LIMIT $1 FOR UPDATE SKIP LOCKED))"
            ),
            // The partial indexes of migration 2 serve these two: `state = …`
            // is a literal so the planner matches the index's predicate.
            lapsed: format!(
                "SELECT {COLUMNS}, now() FROM {t} \
                 WHERE state = {IN_PROGRESS} AND lease_until <= now() \
                 ORDER BY lease_until LIMIT $1"
            ),
            unknown: format!(
                "SELECT {COLUMNS}, now() FROM {t} \
                 WHERE state = {UNKNOWN} AND next_check_at <= now() \
                 ORDER BY next_check_at LIMIT $1"
            ),
            filtered: filtered(&t, &s, ", now()", |n| {
                let ty = match n {
                    1 => "int2",
                    4 => "int8",
                    _ => "text",
                };
                format!("${n}::{ty}")
            }),
            counted: counted(&t, &s),
            // Filled in below, from `complete` and `resolve_completed`.
            complete_with_follow_ons: String::new(),
            resolve_with_jobs: String::new(),
            // The selection locks the jobs it takes and skips those another
            // lease has locked (FOR UPDATE SKIP LOCKED): of two dispatchers
            // leasing at once, each gets other jobs, and neither waits. A job
            // a concurrent lease took and committed is re-checked on the
            // locked row (its next_run_at is then the lease's end) and left
            // out. `NOT dead AND delivered_at IS NULL` is written as the
            // partial index's predicate.
            lease_follow_ons: format!(
                "UPDATE {j} SET token = $1, attempts = attempts + 1, \
                   next_run_at = now() + {}, updated_at = now() \
                 WHERE (tenant, reference, name) IN ( \
                   SELECT tenant, reference, name FROM {j} \
                   WHERE NOT dead AND delivered_at IS NULL AND next_run_at <= now() \
                     AND name = ANY($3::text[]) \
                   ORDER BY next_run_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING {JOB_COLUMNS}",
                micros(2)
            ),
            // Every change of a leased job carries `attempt = $4`: a dispatcher
            // whose lease ran out (and was taken by another) must not finish,
            // retry or bury the new holder's run.
            // Finishing delivers the job: kept (never leased again) until its
            // record's retention ends, the record found as `lookup` finds it
            // ($5..$7: the key range and the tag; the key's current record,
            // then a superseded operation), or until the next purge when it
            // is gone.
            finish_follow_on: format!(
                "UPDATE {j} SET token = NULL, delivered_at = now(), updated_at = now(), \
                   kept_until = coalesce((SELECT retain_until FROM {t} \
                     WHERE key BETWEEN $5::bytea AND $6::bytea AND tenant = $1 \
                       AND coalesce(operation, 0) = $7::int8 \
                     ORDER BY key LIMIT 1), \
                   (SELECT retain_until FROM {s} \
                     WHERE key BETWEEN $5::bytea AND $6::bytea AND tenant = $1 \
                       AND operation = $7::int8 \
                     ORDER BY key LIMIT 1), now()) \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4"
            ),
            retry_follow_on: format!(
                "UPDATE {j} SET token = NULL, next_run_at = now() + {}, last_error = $6, \
                   updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4",
                micros(5)
            ),
            bury_follow_on: format!(
                "UPDATE {j} SET token = NULL, dead = true, last_error = $5, updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4"
            ),
            redrive_follow_on: format!(
                "UPDATE {j} SET dead = false, {REDRIVE_SET}, next_run_at = now(), \
                   updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND dead"
            ),
            jobs_filtered: jobs_filtered(&j, |n| {
                let ty = match n {
                    2 => "bytea",
                    4 => "int8",
                    5 => "int8",
                    _ => "text",
                };
                format!("${n}::{ty}")
            }),
            count_due_follow_ons: format!(
                "SELECT name, count(*) FROM {j} \
                 WHERE NOT dead AND delivered_at IS NULL AND next_run_at <= now() \
                 GROUP BY name"
            ),
            schema,
        };
        // The completion's CTE goes first, before `done`: a statement in a
        // WITH may not have a WITH of its own that modifies data.
        sql.complete_with_follow_ons = if relaxed_completions {
            with_jobs(&format!("{RELAXED}, "), &update_complete(&t, true), &j, 4)
        } else {
            with_jobs("", &update_complete(&t, false), &j, 4)
        };
        sql.resolve_with_jobs = with_jobs("", &sql.resolve_completed, &j, 5);
        sql
    }
}

/// The completion's `UPDATE`, joining `relaxed` if `relaxed` (the CTE itself
/// is the caller's to write). The window's end (`expires_at`) is not moved,
/// however late the completion: one that lands after it frees the key at
/// once, and the record reads by its reference until its retention ends.
fn update_complete(t: &str, relaxed: bool) -> String {
    let from = if relaxed { "FROM relaxed " } else { "" };
    format!(
        "UPDATE {t} SET state = {COMPLETED}, body = $3, updated_at = now() \
         {from}WHERE key = $1 AND attempt = $2 AND state <> {COMPLETED}"
    )
}
