-- Migration 6 (../0006_superseded.sql) online: the same schema. The
-- purge's index on retain_until is built before the one on expires_at is
-- dropped, both concurrently; idem_superseded is new, so its index is
-- built with it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_retain_until
    ON {schema}.idem_records (retain_until);
DROP INDEX CONCURRENTLY IF EXISTS {schema}.idem_records_expires_at;

CREATE TABLE IF NOT EXISTS {schema}.idem_superseded (
    attempt       bigint      NOT NULL,
    operation     bigint      NOT NULL,
    claimed_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    retain_until  timestamptz NOT NULL,
    next_check_at timestamptz NOT NULL,
    checks        integer     NOT NULL,
    state         smallint    NOT NULL,
    key           bytea       NOT NULL CHECK (octet_length(key) = 32),
    fingerprint   bytea       NOT NULL,
    tenant        text        NOT NULL,
    tool          text        NOT NULL,
    body          bytea,
    resolution    bytea,
    PRIMARY KEY (key, operation)
);
CREATE INDEX IF NOT EXISTS idem_superseded_retain_until
    ON {schema}.idem_superseded (retain_until);
