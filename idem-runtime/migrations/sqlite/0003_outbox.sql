-- Follow-on jobs (the outbox): written in the same transaction as the
-- COMPLETED record they follow, one per (tenant, reference, name).
-- Times are nanoseconds since the Unix epoch, as in idem_records.
-- attempts: how many times it was leased to run; token: the fencing token of
--   the dispatcher that leased it (NULL when none does); next_run_at: when it
--   may run next, which for a leased job is when its lease runs out (so "due"
--   and "lease free" are one comparison); dead: 1 in the dead letter.
CREATE TABLE idem_jobs (
    tenant      TEXT    NOT NULL,
    reference   BLOB    NOT NULL,
    name        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    token       INTEGER,
    next_run_at INTEGER NOT NULL,
    last_error  TEXT,
    dead        INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, reference, name)
) WITHOUT ROWID;

-- A dispatcher's lease reads only the live jobs, the longest due first.
CREATE INDEX idem_jobs_due ON idem_jobs (next_run_at) WHERE dead = 0;
