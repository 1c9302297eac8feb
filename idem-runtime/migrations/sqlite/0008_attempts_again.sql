-- Migration 7 renamed idem_jobs.attempts to runs, and so broke every
-- replica of the version before it still serving the file during a
-- rolling deploy: its completions that carry follow-on jobs, its leases
-- and its re-drives name `attempts` ("table idem_jobs has no column named
-- attempts"), after the side effect ran. A migration only adds what the
-- version before it does not know (expand), and removes or renames only
-- what no version still serving reads (contract): the column is
-- `attempts` again, the count of a job's runs as it always was. The
-- columns migration 7 added stay; the version before ignores them.
ALTER TABLE idem_jobs RENAME COLUMN runs TO attempts;
