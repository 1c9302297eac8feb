-- A reference names one operation, not one key: the same call after its
-- window is a new operation with a new reference. operation: the tag that
-- makes the record's reference (the key's first eight bytes, then the tag's
-- eight, big-endian), drawn when the operation starts and kept by a claim
-- that takes over a NOT_PERFORMED record within its window. NULL on a record
-- written before this migration: its reference is the key's first eight
-- bytes alone, as it was when the record was written.
ALTER TABLE {schema}.idem_records ADD COLUMN operation bigint;

-- A job's reference is its operation's: 16 bytes, or 8 for a job written
-- before this migration (it keeps them, and its downstream key).
ALTER TABLE {schema}.idem_jobs DROP CONSTRAINT IF EXISTS idem_jobs_reference_check;
ALTER TABLE {schema}.idem_jobs ADD CONSTRAINT idem_jobs_reference_check
    CHECK (octet_length(reference) IN (8, 16));
