-- A call's two statements, the claim and the completion, as functions of
-- the schema. PL/pgSQL prepares the statements inside a function once per
-- server connection and keeps their plans, and a transaction pooler
-- (PgBouncer in transaction mode) keeps the server connections: a short
-- unnamed `SELECT * FROM idem_claim(...)` is parsed and planned on each
-- call instead of the whole upsert, and nothing lives in a session.
--
-- The functions run with the caller's rights (SECURITY INVOKER, the
-- default): the role that serves needs EXECUTE on them, which PostgreSQL
-- grants to PUBLIC when a function is created, and the table privileges it
-- already has. Every name in them is qualified with the schema.
--
-- State codes: 0 IN_PROGRESS, 1 COMPLETED, 2 UNKNOWN, 3 NOT_PERFORMED.

-- The claim: insert the record, or take over the row only if it is
-- claimable and need not be kept (a row that holds its key, or that must be
-- kept, is left alone, and locked until the statement ends).
--
-- Claimed: one row, o_claimed true and o_operation the operation it runs
-- under; every other column NULL. Not claimed: the key's record as it is
-- now, read after the insert found it (o_observed_at the server's clock at
-- the read), o_claimed false; the caller decides whether it is an answer or
-- must be taken over (idem_records is read under the row's lock, so the
-- row is there, unless the key was never inserted by this call at all).
--
-- The server's own bound (p_bound microseconds, the store's timeout): lock
-- waits end at it (lock_timeout, for this statement's transaction only),
-- and a claim that took longer than it by the server's clock is not
-- committed (query_canceled, 57014): a caller that gave up on it never
-- finds it landed later. p_pause: microseconds to sleep between the insert
-- and the read (0 outside a simulation, which widens that gap).
CREATE OR REPLACE FUNCTION {schema}.idem_claim(
    p_key bytea, p_fingerprint bytea, p_tenant text, p_tool text,
    p_attempt bigint, p_lease bigint, p_window bigint, p_retention bigint,
    p_operation bigint, p_bound bigint, p_pause bigint)
RETURNS TABLE (
    o_key bytea, o_fingerprint bytea, o_tenant text, o_tool text,
    o_state smallint, o_attempt bigint, o_claimed_at timestamptz,
    o_updated_at timestamptz, o_lease_until timestamptz,
    o_expires_at timestamptz, o_retain_until timestamptz, o_body bytea,
    o_next_check_at timestamptz, o_checks integer, o_resolution bytea,
    o_operation bigint, o_observed_at timestamptz, o_claimed boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    op bigint;
BEGIN
    IF p_bound > 0 THEN
        PERFORM set_config('lock_timeout', greatest(p_bound / 1000, 1)::text, true);
    END IF;
    INSERT INTO {schema}.idem_records AS r (key, fingerprint, tenant, tool,
        state, attempt, claimed_at, updated_at, lease_until, expires_at,
        retain_until, body, next_check_at, checks, resolution, operation)
    VALUES (p_key, p_fingerprint, p_tenant, p_tool, 0, p_attempt, now(), now(),
        now() + p_lease * interval '1 microsecond',
        now() + p_window * interval '1 microsecond',
        now() + p_retention * interval '1 microsecond', NULL, now(), 0, NULL,
        p_operation)
    ON CONFLICT (key) DO UPDATE SET
        operation = CASE WHEN r.state = 3 AND r.expires_at > now()
            THEN r.operation ELSE EXCLUDED.operation END,
        fingerprint = EXCLUDED.fingerprint, tenant = EXCLUDED.tenant,
        tool = EXCLUDED.tool, state = 0, attempt = EXCLUDED.attempt,
        claimed_at = EXCLUDED.claimed_at, updated_at = EXCLUDED.updated_at,
        lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at,
        retain_until = EXCLUDED.retain_until, body = NULL,
        next_check_at = EXCLUDED.next_check_at, checks = 0, resolution = NULL
    -- Claimable (Record::is_claimable) and not to be kept
    -- (Record::outlives_takeover).
    WHERE ((r.state = 1 AND r.expires_at <= now()) OR r.state = 3
            OR (r.state IN (0, 2) AND r.retain_until <= now()
                AND r.lease_until <= now()))
        AND NOT (NOT (r.state = 3 AND r.expires_at > now())
            AND coalesce(r.operation, 0) <> EXCLUDED.operation
            AND r.retain_until > now())
    RETURNING r.operation INTO op;
    IF FOUND THEN
        IF p_bound > 0
            AND clock_timestamp() > statement_timestamp() + p_bound * interval '1 microsecond'
        THEN
            RAISE EXCEPTION 'the claim took longer than the store''s timeout (% ms) on the server; it was not applied',
                p_bound / 1000 USING ERRCODE = 'query_canceled';
        END IF;
        o_operation := op;
        o_claimed := true;
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_pause > 0 THEN
        PERFORM pg_sleep(p_pause / 1000000.0);
    END IF;
    RETURN QUERY
        SELECT r.key, r.fingerprint, r.tenant, r.tool, r.state, r.attempt,
            r.claimed_at, r.updated_at, r.lease_until, r.expires_at,
            r.retain_until, r.body, r.next_check_at, r.checks, r.resolution,
            r.operation, clock_timestamp(), false
        FROM {schema}.idem_records AS r WHERE r.key = p_key;
END
$$;

-- The completion, fenced by the attempt: how many records it completed
-- (0 or 1). p_relaxed: commit with synchronous_commit = off, for this
-- statement's transaction only (PostgresStoreBuilder::relaxed_completions).
-- The window's end (expires_at) is not moved, however late the completion.
CREATE OR REPLACE FUNCTION {schema}.idem_complete(
    p_key bytea, p_attempt bigint, p_body bytea, p_relaxed boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n integer;
BEGIN
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    UPDATE {schema}.idem_records SET state = 1, body = p_body, updated_at = now()
    WHERE key = p_key AND attempt = p_attempt AND state <> 1;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Many completions in one statement and one commit, each fenced by its own
-- attempt: the (key, attempt) of each record it completed.
CREATE OR REPLACE FUNCTION {schema}.idem_complete_many(
    p_keys bytea[], p_attempts bigint[], p_bodies bytea[], p_relaxed boolean)
RETURNS TABLE (o_key bytea, o_attempt bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
        UPDATE {schema}.idem_records AS r SET state = 1, body = c.body, updated_at = now()
        FROM unnest(p_keys, p_attempts, p_bodies) AS c(key, attempt, body)
        WHERE r.key = c.key AND r.attempt = c.attempt AND r.state <> 1
        RETURNING r.key, r.attempt;
END
$$;
