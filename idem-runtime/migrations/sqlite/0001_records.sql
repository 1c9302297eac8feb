-- One row per operation. Times are nanoseconds since the Unix epoch, read
-- from the process clock by the store's writer thread.
-- state: 0 IN_PROGRESS, 1 COMPLETED, 2 UNKNOWN.
-- body: the response when COMPLETED, the note when UNKNOWN, else NULL.
CREATE TABLE idem_records (
    key          BLOB    NOT NULL PRIMARY KEY,
    fingerprint  BLOB    NOT NULL,
    tenant       TEXT    NOT NULL,
    tool         TEXT    NOT NULL,
    state        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    claimed_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    retain_until INTEGER NOT NULL,
    body         TEXT
) WITHOUT ROWID;

-- Purge finds its candidates here: every expired record has
-- expires_at <= now (retain_until is never before expires_at).
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
