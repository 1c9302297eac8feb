-- One row per operation, kept small: the key and fingerprint as 32 raw bytes,
-- the state as a smallint, times as timestamptz from the server's now().
-- Fixed-width columns come first so that no alignment padding is needed.
-- state: 0 IN_PROGRESS, 1 COMPLETED, 2 UNKNOWN.
-- body: the response when COMPLETED, the note when UNKNOWN, else NULL. It is
-- bytea, not jsonb (which reorders keys) nor text (which a non-UTF-8 database
-- would transcode): a replay must be byte-identical to the first answer.
-- The reference is the key's first eight bytes, found by a range over the
-- primary key, so it needs no column or index of its own.
CREATE TABLE {schema}.idem_records (
    attempt      bigint      NOT NULL,
    claimed_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    retain_until timestamptz NOT NULL,
    state        smallint    NOT NULL,
    key          bytea       NOT NULL PRIMARY KEY CHECK (octet_length(key) = 32),
    fingerprint  bytea       NOT NULL,
    tenant       text        NOT NULL,
    tool         text        NOT NULL,
    body         bytea
);

-- Purge finds its candidates here: every expired record has
-- expires_at <= now() (retain_until is never before expires_at). expires_at
-- only changes when a claim replaces the row, so completing, heartbeats and
-- marking unknown leave this index alone.
CREATE INDEX idem_records_expires_at ON {schema}.idem_records (expires_at);
