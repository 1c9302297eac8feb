-- Migration 4 (../0004_operations.sql) online: the same schema. The
-- reference check is added NOT VALID (enforced on new rows at once), then
-- validated over idem_jobs without blocking its writes.
ALTER TABLE {schema}.idem_records ADD COLUMN IF NOT EXISTS operation bigint;
ALTER TABLE {schema}.idem_jobs DROP CONSTRAINT IF EXISTS idem_jobs_reference_check;
ALTER TABLE {schema}.idem_jobs ADD CONSTRAINT idem_jobs_reference_check
    CHECK (octet_length(reference) IN (8, 16)) NOT VALID;

ALTER TABLE {schema}.idem_jobs VALIDATE CONSTRAINT idem_jobs_reference_check;
