-- A delivered job is kept, as long as its operation's record, so an operator
-- can see that it was delivered, when, and by which run.
-- delivered_at: when a run finished it (NULL until then; no lease finds it
--   once set); kept_until: when the purge deletes it, its record's expiry
--   (NULL while it is not delivered). Rows written before this migration
--   are waiting, running or dead jobs: both NULL.
ALTER TABLE idem_jobs ADD COLUMN delivered_at INTEGER;
ALTER TABLE idem_jobs ADD COLUMN kept_until INTEGER;

-- A lease reads only the jobs neither dead nor delivered.
DROP INDEX idem_jobs_due;
CREATE INDEX idem_jobs_due ON idem_jobs (next_run_at) WHERE dead = 0 AND delivered_at IS NULL;
-- The purge finds the delivered jobs whose record has expired.
CREATE INDEX idem_jobs_kept ON idem_jobs (kept_until) WHERE delivered_at IS NOT NULL;
