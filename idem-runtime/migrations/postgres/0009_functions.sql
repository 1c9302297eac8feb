-- A call's two statements, the claim and the completion, as functions of
-- the schema. PL/pgSQL prepares the statements inside a function once per
-- server connection and keeps their plans, and a transaction pooler
-- (PgBouncer in transaction mode) keeps the server connections: a short
-- unnamed `SELECT idem_claim(...)` is parsed and planned on each call
-- instead of the whole upsert, and nothing lives in a session. Each returns
-- a scalar (or a set of two columns, the batch): a function that returns
-- a whole record costs the server more to plan than it saves.
--
-- The functions run with the caller's rights (SECURITY INVOKER, the
-- default): the role that serves needs EXECUTE on them, which PostgreSQL
-- grants to PUBLIC when a function is created, and the table privileges it
-- already has. Every name in them is qualified with the schema.
--
-- State codes: 0 IN_PROGRESS, 1 COMPLETED, 2 UNKNOWN, 3 NOT_PERFORMED.

-- The claim: insert the record, or take over the row only if it is
-- claimable and need not be kept (a row that holds its key, or that must be
-- kept, is left alone, and locked until the statement ends). Answers the
-- operation the claim runs under (0 for a record written before tags), or
-- NULL when it claimed nothing: the caller then reads the record.
--
-- The server's own bound (p_bound microseconds, the store's timeout; 0:
-- none): a claim that took longer than it by the server's clock, a wait on
-- the row's lock included, is not committed (query_canceled, 57014), so a
-- caller that gave up on it never finds it landed later, even when its
-- cancel request never reached the server.
CREATE OR REPLACE FUNCTION {schema}.idem_claim(
    p_key bytea, p_fingerprint bytea, p_tenant text, p_tool text,
    p_attempt bigint, p_lease bigint, p_window bigint, p_retention bigint,
    p_operation bigint, p_bound bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    op bigint;
BEGIN
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
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_bound > 0
        AND clock_timestamp() > statement_timestamp() + p_bound * interval '1 microsecond'
    THEN
        RAISE EXCEPTION 'the claim took longer than the store''s timeout (% ms) on the server; it was not applied',
            p_bound / 1000 USING ERRCODE = 'query_canceled';
    END IF;
    RETURN coalesce(op, 0);
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
