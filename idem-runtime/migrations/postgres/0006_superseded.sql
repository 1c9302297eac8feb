-- The key's hold and the operation's record are two lives. A COMPLETED
-- record holds its key until its window ends (expires_at, set by the claim
-- and never moved again) and is kept until its retention ends
-- (retain_until); the purge now finds records by retain_until.
--
-- Records written before this migration by a completion or a resolution
-- that landed after the record had become UNKNOWN had their expires_at
-- moved to their retain_until. They cannot be told apart from a business
-- key's records (whose window is their retention): they keep their key
-- until their retention ends, as they did when they were written.
DROP INDEX {schema}.idem_records_expires_at;
CREATE INDEX idem_records_retain_until ON {schema}.idem_records (retain_until);

-- Superseded operations: a record whose key a new operation (under another
-- reference) took while its retention had not ended is moved here, in the
-- claim's statement, as it was. It reads by its reference (lookup, the
-- operator's listings) until its retention ends, when the purge deletes it;
-- nothing changes it. The columns are idem_records'; operation is never
-- NULL here (a record written before tags is kept under tag 0, its
-- reference the key's first eight bytes alone).
CREATE TABLE {schema}.idem_superseded (
    attempt       bigint      NOT NULL,
    operation     bigint      NOT NULL,
    claimed_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    retain_until  timestamptz NOT NULL,
    next_check_at timestamptz NOT NULL,
    checks        integer     NOT NULL,
    state         smallint    NOT NULL,
    key           bytea       NOT NULL CHECK (octet_length(key) = 32),
    fingerprint   bytea       NOT NULL,
    tenant        text        NOT NULL,
    tool          text        NOT NULL,
    body          bytea,
    resolution    bytea,
    PRIMARY KEY (key, operation)
);

-- The purge finds the superseded operations whose retention ended.
CREATE INDEX idem_superseded_retain_until ON {schema}.idem_superseded (retain_until);
