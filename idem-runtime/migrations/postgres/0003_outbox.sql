-- Follow-on jobs (the outbox): written in the same transaction as the
-- COMPLETED record they follow (one statement: the completion and the job
-- inserts are data-modifying CTEs of one UPDATE), one per (tenant,
-- reference, name).
-- attempts: how many times it was leased to run; token: the fencing token of
--   the dispatcher that leased it (NULL when none does); next_run_at: when it
--   may run next, which for a leased job is when its lease runs out (so "due"
--   and "lease free" are one comparison); dead: in the dead letter.
-- Times come from the server's now(), as in idem_records. payload is bytea
-- like the records' body: handed back byte for byte whatever the database's
-- encoding.
CREATE TABLE {schema}.idem_jobs (
    token       bigint,
    next_run_at timestamptz NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    attempts    integer     NOT NULL,
    dead        boolean     NOT NULL,
    reference   bytea       NOT NULL CHECK (octet_length(reference) = 8),
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    payload     bytea       NOT NULL,
    last_error  text,
    PRIMARY KEY (tenant, reference, name)
);

-- A dispatcher's lease reads only the live jobs, the longest due first;
-- dead jobs (the dead letter) are in no index a lease reads.
CREATE INDEX idem_jobs_due ON {schema}.idem_jobs (next_run_at) WHERE NOT dead;
