-- The unknown-outcome lifecycle.
-- next_check_at: when a reconciler looks at an UNKNOWN record next (set when it
--   becomes UNKNOWN, pushed back with a backoff; rows older than this
--   migration are due at once). checks: how many looks found nothing;
--   resolution: who resolved it by hand and why (bytea, like body).
-- state 3 is NOT_PERFORMED: resolved as never having taken effect; the next
--   claim takes it over. (Codes: idem_runtime::RecordStateKind::code, which
--   never change.)
ALTER TABLE {schema}.idem_records
    ADD COLUMN next_check_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN checks integer NOT NULL DEFAULT 0,
    ADD COLUMN resolution bytea;

-- Maintenance reads only these rows: partial indexes, so completed rows (the
-- bulk of the table) are in neither and a round never scans the table.
CREATE INDEX idem_records_lapsed ON {schema}.idem_records (lease_until) WHERE state = 0;
CREATE INDEX idem_records_unknown ON {schema}.idem_records (next_check_at) WHERE state = 2;
