-- The unknown-outcome lifecycle.
-- next_check_at: when a reconciler looks at an UNKNOWN record next (set when it
--   becomes UNKNOWN, pushed back with a backoff); checks: how many looks found
--   nothing; resolution: who resolved it by hand and why.
-- state 3 is NOT_PERFORMED: resolved as never having taken effect; the next
--   claim takes it over. (Codes: idem_runtime::RecordStateKind::code, which
--   never change.)
ALTER TABLE idem_records ADD COLUMN next_check_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN checks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN resolution TEXT;

-- Maintenance reads only these rows: without the indexes each round scanned the
-- whole table on the single writer thread, stalling every claim meanwhile.
CREATE INDEX idem_records_lapsed ON idem_records (lease_until) WHERE state = 0;
CREATE INDEX idem_records_unknown ON idem_records (next_check_at) WHERE state = 2;
