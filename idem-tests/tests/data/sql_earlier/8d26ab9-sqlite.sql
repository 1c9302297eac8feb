-- The statements of idem-runtime's sqlite store at commit 8d26ab9, the last
-- commit at layout 5 (the layout of 0.1.0), as that commit built them:
-- idem-runtime/src/store/sql.rs and src/store/sqlite/statements.rs of
-- `git show 8d26ab9:…`, compiled alone (the state codes written out, the
-- row readers left out) and each statement printed after its field's name.
-- tests/sql_upgrades replays them; nothing here is edited by hand.
-- statement: claim
INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?6, ?7, ?8, ?9, NULL, ?6, 0, NULL, ?10) ON CONFLICT (key) DO UPDATE SET operation = CASE WHEN idem_records.state = 3 AND idem_records.expires_at > ?6          THEN idem_records.operation ELSE excluded.operation END, fingerprint = excluded.fingerprint, tenant = excluded.tenant, tool = excluded.tool, state = 0, attempt = excluded.attempt, claimed_at = excluded.claimed_at, updated_at = excluded.updated_at, lease_until = excluded.lease_until, expires_at = excluded.expires_at, retain_until = excluded.retain_until, body = NULL, next_check_at = excluded.next_check_at, checks = 0, resolution = NULL WHERE (idem_records.expires_at <= ?6 AND (idem_records.state = 1 OR (idem_records.retain_until <= ?6 AND idem_records.lease_until <= ?6))) OR idem_records.state = 3 RETURNING operation
-- statement: read
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation FROM idem_records WHERE key = ?1
-- statement: refusal
SELECT attempt, state, updated_at FROM idem_records WHERE key = ?1
-- statement: complete
UPDATE idem_records SET state = 1, body = ?3, updated_at = ?4, expires_at = CASE WHEN state = 0 THEN expires_at ELSE MAX(expires_at, retain_until) END WHERE key = ?1 AND attempt = ?2 AND state <> 1
-- statement: release
DELETE FROM idem_records WHERE key = ?1 AND attempt = ?2 AND state IN (0, 2)
-- statement: mark_unknown
UPDATE idem_records SET state = 2, body = ?3, updated_at = ?4, next_check_at = ?4, checks = 0 WHERE key = ?1 AND attempt = ?2 AND state = 0
-- statement: mark_lapsed
UPDATE idem_records SET state = 2, body = ?3, updated_at = ?4, next_check_at = ?4, checks = 0 WHERE key = ?1 AND attempt = ?2 AND state = 0 AND lease_until <= ?4
-- statement: resolve_completed
UPDATE idem_records SET state = 1, body = ?3, resolution = ?4, updated_at = ?5, expires_at = MAX(expires_at, retain_until) WHERE key = ?1 AND attempt = ?2 AND state = 2
-- statement: resolve_not_performed
UPDATE idem_records SET state = 3, body = ?3, resolution = ?4, updated_at = ?5 WHERE key = ?1 AND attempt = ?2 AND state = 2 AND updated_at <= ?6
-- statement: defer_check
UPDATE idem_records SET next_check_at = ?3, checks = checks + 1 WHERE key = ?1 AND attempt = ?2 AND state = 2
-- statement: heartbeat
UPDATE idem_records SET lease_until = ?3, updated_at = ?4 WHERE key = ?1 AND attempt = ?2 AND state = 0
-- statement: lookup
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation FROM idem_records WHERE key BETWEEN ?1 AND ?2 AND tenant = ?3 AND coalesce(operation, 0) = ?4 ORDER BY key LIMIT 1
-- statement: purge
DELETE FROM idem_records WHERE key IN ( SELECT key FROM idem_records WHERE expires_at <= ?1 AND (state = 1 OR (retain_until <= ?1 AND lease_until <= ?1)) LIMIT ?2)
-- statement: purge_jobs
DELETE FROM idem_jobs WHERE (tenant, reference, name) IN ( SELECT tenant, reference, name FROM idem_jobs WHERE delivered_at IS NOT NULL AND kept_until <= ?1 LIMIT ?2)
-- statement: lapsed
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation FROM idem_records WHERE state = 0 AND lease_until <= ?1 ORDER BY lease_until LIMIT ?2
-- statement: unknown
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation FROM idem_records WHERE state = 2 AND next_check_at <= ?1 ORDER BY next_check_at LIMIT ?2
-- statement: filtered
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation FROM idem_records WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR tool = ?3) ORDER BY claimed_at DESC LIMIT ?4
-- statement: counted
SELECT state, count(*) FROM idem_records GROUP BY state
-- statement: record_tenant
SELECT tenant, operation FROM idem_records WHERE key = ?1
-- statement: insert_job
INSERT INTO idem_jobs (tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 0, NULL, ?5, NULL, 0, ?5, ?5) ON CONFLICT (tenant, reference, name) DO NOTHING
-- statement: lease_jobs
UPDATE idem_jobs SET token = ?1, attempts = attempts + 1, next_run_at = ?2, updated_at = ?3 WHERE (tenant, reference, name) IN ( SELECT tenant, reference, name FROM idem_jobs WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?3 AND name IN (SELECT value FROM json_each(?4)) ORDER BY next_run_at LIMIT ?5) RETURNING tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at, delivered_at, kept_until
-- statement: finish_job
UPDATE idem_jobs SET token = NULL, delivered_at = ?5, updated_at = ?5, kept_until = coalesce((SELECT expires_at FROM idem_records WHERE key BETWEEN ?6 AND ?7 AND tenant = ?1 AND coalesce(operation, 0) = ?8 ORDER BY key LIMIT 1), ?5) WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4
-- statement: retry_job
UPDATE idem_jobs SET token = NULL, next_run_at = ?5, last_error = ?6, updated_at = ?7 WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4
-- statement: bury_job
UPDATE idem_jobs SET token = NULL, dead = 1, last_error = ?5, updated_at = ?6 WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND token = ?4
-- statement: redrive_job
UPDATE idem_jobs SET dead = 0, attempts = 0, token = NULL, next_run_at = ?4, updated_at = ?4 WHERE tenant = ?1 AND reference = ?2 AND name = ?3 AND dead = 1
-- statement: jobs_filtered
SELECT tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at, delivered_at, kept_until FROM idem_jobs WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR reference = ?2) AND (?3 IS NULL OR name = ?3) AND (?4 IS NULL OR (?4 & CASE WHEN delivered_at IS NOT NULL THEN 8 WHEN dead THEN 4 WHEN token IS NOT NULL THEN 2 ELSE 1 END) <> 0) ORDER BY created_at, reference, name, tenant LIMIT ?5
-- statement: count_due_jobs
SELECT name, count(*) FROM idem_jobs WHERE dead = 0 AND delivered_at IS NULL AND next_run_at <= ?1 GROUP BY name
