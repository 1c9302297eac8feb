-- A reference names one operation, not one key: the same call after its
-- window is a new operation with a new reference. operation: the tag that
-- makes the record's reference (the key's first eight bytes, then the tag),
-- drawn when the operation starts and kept by a claim that takes over a
-- NOT_PERFORMED record within its window. NULL on a record written before
-- this migration: its reference is the key's first eight bytes alone, as it
-- was when the record was written.
ALTER TABLE idem_records ADD COLUMN operation INTEGER;
