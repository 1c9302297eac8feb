-- Migration 5 (../0005_delivered_jobs.sql) online: the same schema. The
-- leases' index is built anew under another name, the old one dropped,
-- and the new one given its name: leases have an index all along.
ALTER TABLE {schema}.idem_jobs
    ADD COLUMN IF NOT EXISTS delivered_at timestamptz,
    ADD COLUMN IF NOT EXISTS kept_until   timestamptz;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_jobs_due_5 ON {schema}.idem_jobs (next_run_at)
    WHERE NOT dead AND delivered_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.idem_jobs_due;
ALTER INDEX IF EXISTS {schema}.idem_jobs_due_5 RENAME TO idem_jobs_due;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_jobs_kept ON {schema}.idem_jobs (kept_until)
    WHERE delivered_at IS NOT NULL;
