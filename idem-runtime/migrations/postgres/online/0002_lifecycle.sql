-- Migration 2 (../0002_lifecycle.sql) online, for a deployment that has
-- not applied it: the same schema, without blocking writes to
-- idem_records for longer than the lock timeout. The columns are added
-- without a rewrite (now() is not volatile: PostgreSQL 11 and later keep
-- its value once, as the rows' default); each statement may run again
-- after an interrupted run.
ALTER TABLE {schema}.idem_records
    ADD COLUMN IF NOT EXISTS next_check_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS checks integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS resolution bytea;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_lapsed
    ON {schema}.idem_records (lease_until) WHERE state = 0;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_records_unknown
    ON {schema}.idem_records (next_check_at) WHERE state = 2;
