-- A re-drive keeps what came before it, so an operator sees a job's whole
-- history: earlier_runs, the runs before its last re-drive (every
-- re-drive's summed; runs counts the runs since, for the retry schedule
-- and the dead letter), and error_before_redrive, the last error it had
-- when it was re-driven (last_error is then a run's since). Rows written
-- before this migration: 0 and NULL. A job re-driven before it keeps its
-- old error in last_error.
ALTER TABLE idem_jobs ADD COLUMN earlier_runs INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_jobs ADD COLUMN error_before_redrive TEXT;

-- The count of a job's runs is named for what it counts (the attempt is the
-- fencing token, `token`): attempts becomes runs.
ALTER TABLE idem_jobs RENAME COLUMN attempts TO runs;
