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
DROP INDEX idem_records_expires_at;
CREATE INDEX idem_records_retain_until ON idem_records (retain_until);

-- Superseded operations: a record whose key a new operation (under another
-- reference) took while its retention had not ended is moved here, in the
-- claim's transaction, as it was. It reads by its reference (lookup, the
-- operator's listings) until its retention ends, when the purge deletes it;
-- nothing changes it. The columns are idem_records'; operation is never
-- NULL here (a record written before tags is kept under tag 0, its
-- reference the key's first eight bytes alone).
CREATE TABLE idem_superseded (
    key           BLOB    NOT NULL,
    operation     INTEGER NOT NULL,
    fingerprint   BLOB    NOT NULL,
    tenant        TEXT    NOT NULL,
    tool          TEXT    NOT NULL,
    state         INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    claimed_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    lease_until   INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    retain_until  INTEGER NOT NULL,
    body          TEXT,
    next_check_at INTEGER NOT NULL,
    checks        INTEGER NOT NULL,
    resolution    TEXT,
    PRIMARY KEY (key, operation)
) WITHOUT ROWID;

-- The purge finds the superseded operations whose retention ended.
CREATE INDEX idem_superseded_retain_until ON idem_superseded (retain_until);
