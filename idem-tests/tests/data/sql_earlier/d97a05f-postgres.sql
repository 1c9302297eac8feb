-- The statements of idem-runtime's postgres store at commit d97a05f, the last
-- commit at layout 4 (before migration 5), as that commit built them:
-- idem-runtime/src/store/sql.rs and src/store/postgres/statements.rs of
-- `git show d97a05f:…`, compiled alone (the state codes written out, the
-- row readers left out) and each statement printed after its field's name,
-- over the schema {schema}.
-- tests/sql_upgrades replays them; nothing here is edited by hand.
-- statement: claim
INSERT INTO {schema}.idem_records AS r (key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation) VALUES ($1, $2, $3, $4, 0, $5, now(), now(), now() + $6::int8 * interval '1 microsecond', now() + $7::int8 * interval '1 microsecond', now() + $8::int8 * interval '1 microsecond', NULL, now(), 0, NULL, $9) ON CONFLICT (key) DO UPDATE SET operation = CASE WHEN r.state = 3 AND r.expires_at > now()          THEN r.operation ELSE EXCLUDED.operation END, fingerprint = EXCLUDED.fingerprint, tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = 0, attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, body = NULL, next_check_at = EXCLUDED.next_check_at, checks = 0, resolution = NULL WHERE (r.expires_at <= now() AND (r.state = 1 OR (r.retain_until <= now() AND r.lease_until <= now()))) OR r.state = 3 RETURNING operation
-- statement: read
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation, now() FROM {schema}.idem_records WHERE key = $1
-- statement: complete
UPDATE {schema}.idem_records SET state = 1, body = $3, updated_at = now(), expires_at = CASE WHEN state = 0 THEN expires_at ELSE GREATEST(expires_at, retain_until) END WHERE key = $1 AND attempt = $2 AND state <> 1
-- statement: release
DELETE FROM {schema}.idem_records WHERE key = $1 AND attempt = $2 AND state IN (0, 2)
-- statement: mark_unknown
UPDATE {schema}.idem_records SET state = 2, body = $3, updated_at = now(), next_check_at = now(), checks = 0 WHERE key = $1 AND attempt = $2 AND state = 0
-- statement: mark_lapsed
UPDATE {schema}.idem_records SET state = 2, body = $3, updated_at = now(), next_check_at = now(), checks = 0 WHERE key = $1 AND attempt = $2 AND state = 0 AND lease_until <= now()
-- statement: resolve_completed
UPDATE {schema}.idem_records SET state = 1, body = $3, resolution = $4, updated_at = now(), expires_at = GREATEST(expires_at, retain_until) WHERE key = $1 AND attempt = $2 AND state = 2
-- statement: resolve_not_performed
UPDATE {schema}.idem_records SET state = 3, body = $3, resolution = $4, updated_at = now() WHERE key = $1 AND attempt = $2 AND state = 2 AND updated_at <= now() - $5::int8 * interval '1 microsecond'
-- statement: defer_check
UPDATE {schema}.idem_records SET next_check_at = now() + $3::int8 * interval '1 microsecond', checks = checks + 1 WHERE key = $1 AND attempt = $2 AND state = 2
-- statement: heartbeat
UPDATE {schema}.idem_records SET lease_until = now() + $3::int8 * interval '1 microsecond', updated_at = now() WHERE key = $1 AND attempt = $2 AND state = 0
-- statement: refusal
SELECT attempt, state, updated_at FROM {schema}.idem_records WHERE key = $1
-- statement: lookup
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation, now() FROM {schema}.idem_records WHERE key BETWEEN $1 AND $2 AND tenant = $3 AND coalesce(operation, 0) = $4 ORDER BY key LIMIT 1
-- statement: purge
DELETE FROM {schema}.idem_records WHERE ctid = ANY(ARRAY( SELECT ctid FROM {schema}.idem_records AS r WHERE r.expires_at <= now() AND (r.state = 1 OR (r.retain_until <= now() AND r.lease_until <= now())) LIMIT $1 FOR UPDATE SKIP LOCKED))
-- statement: lapsed
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation, now() FROM {schema}.idem_records WHERE state = 0 AND lease_until <= now() ORDER BY lease_until LIMIT $1
-- statement: unknown
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation, now() FROM {schema}.idem_records WHERE state = 2 AND next_check_at <= now() ORDER BY next_check_at LIMIT $1
-- statement: filtered
SELECT key, fingerprint, tenant, tool, state, attempt, claimed_at, updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, resolution, operation, now() FROM {schema}.idem_records WHERE ($1::int2 IS NULL OR state = $1::int2) AND ($2::text IS NULL OR tenant = $2::text) AND ($3::text IS NULL OR tool = $3::text) ORDER BY claimed_at DESC LIMIT $4::int8
-- statement: counted
SELECT state, count(*) FROM {schema}.idem_records GROUP BY state
-- statement: complete_with_jobs
WITH done AS (UPDATE {schema}.idem_records SET state = 1, body = $3, updated_at = now(), expires_at = CASE WHEN state = 0 THEN expires_at ELSE GREATEST(expires_at, retain_until) END WHERE key = $1 AND attempt = $2 AND state <> 1 RETURNING tenant, CASE WHEN coalesce(operation, 0) = 0 THEN substring(key FROM 1 FOR 8) ELSE substring(key FROM 1 FOR 8) || int8send(operation) END AS reference), written AS ( INSERT INTO {schema}.idem_jobs (tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at) SELECT done.tenant, done.reference, f.name, f.payload, 0, NULL, now(), NULL, false, now(), now() FROM done, unnest($4::text[], $5::bytea[]) AS f(name, payload) ON CONFLICT (tenant, reference, name) DO NOTHING RETURNING 1) SELECT count(*) FROM done
-- statement: resolve_with_jobs
WITH done AS (UPDATE {schema}.idem_records SET state = 1, body = $3, resolution = $4, updated_at = now(), expires_at = GREATEST(expires_at, retain_until) WHERE key = $1 AND attempt = $2 AND state = 2 RETURNING tenant, CASE WHEN coalesce(operation, 0) = 0 THEN substring(key FROM 1 FOR 8) ELSE substring(key FROM 1 FOR 8) || int8send(operation) END AS reference), written AS ( INSERT INTO {schema}.idem_jobs (tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at) SELECT done.tenant, done.reference, f.name, f.payload, 0, NULL, now(), NULL, false, now(), now() FROM done, unnest($5::text[], $6::bytea[]) AS f(name, payload) ON CONFLICT (tenant, reference, name) DO NOTHING RETURNING 1) SELECT count(*) FROM done
-- statement: lease_jobs
UPDATE {schema}.idem_jobs SET token = $1, attempts = attempts + 1, next_run_at = now() + $2::int8 * interval '1 microsecond', updated_at = now() WHERE (tenant, reference, name) IN ( SELECT tenant, reference, name FROM {schema}.idem_jobs WHERE NOT dead AND next_run_at <= now() AND name = ANY($3::text[]) ORDER BY next_run_at LIMIT $4 FOR UPDATE SKIP LOCKED) RETURNING tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at
-- statement: finish_job
DELETE FROM {schema}.idem_jobs WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4
-- statement: retry_job
UPDATE {schema}.idem_jobs SET token = NULL, next_run_at = now() + $5::int8 * interval '1 microsecond', last_error = $6, updated_at = now() WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4
-- statement: bury_job
UPDATE {schema}.idem_jobs SET token = NULL, dead = true, last_error = $5, updated_at = now() WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4
-- statement: redrive_job
UPDATE {schema}.idem_jobs SET dead = false, attempts = 0, token = NULL, next_run_at = now(), updated_at = now() WHERE tenant = $1 AND reference = $2 AND name = $3 AND dead
-- statement: jobs_filtered
SELECT tenant, reference, name, payload, attempts, token, next_run_at, last_error, dead, created_at, updated_at FROM {schema}.idem_jobs WHERE ($1::text IS NULL OR tenant = $1::text) AND ($2::bytea IS NULL OR reference = $2::bytea) AND ($3::text IS NULL OR name = $3::text) AND ($4::bool IS NULL OR dead = $4::bool) ORDER BY created_at, reference, name, tenant LIMIT $5::int8
-- statement: count_due_jobs
SELECT name, count(*) FROM {schema}.idem_jobs WHERE NOT dead AND next_run_at <= now() GROUP BY name
