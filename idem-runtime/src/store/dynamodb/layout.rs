//! Where a record and a job live in the table: the item keys, the attribute
//! names, the four sparse indexes, and the table's definition.
//!
//! | item | `pk` (B) | `sk` (B) |
//! | --- | --- | --- |
//! | record | the key's first 8 bytes (every reference of the key starts with them) | `r` and the key's other 24 bytes |
//! | superseded operation | the same partition | `s`, the key's other 24 bytes, and the operation's reference (8 or 16 bytes) |
//! | job | its operation's reference's first 8 bytes (its record's `pk`) | `j`, the reference's length and bytes, the tenant's length (4 bytes) and bytes, the name |
//!
//! A record's partition is named by its key, which the key's SHA-256 has
//! made tenant-scoped (the tenant is hashed into it): a fenced change, which
//! knows the key, names the record directly, and a lookup by (tenant,
//! reference) reads the one partition the reference names, with a strongly
//! consistent `Query` over its record and superseded items (`sk >= "r"`;
//! jobs sort before them) that keeps the item of this tenant and reference:
//! the key's current record first (`r` sorts before `s`), then a superseded
//! one. No index is read on the calls' path: a global secondary index is
//! only eventually consistent, and a status read right after a claim must
//! find it.
//!
//! A superseded operation is a record whose key a later operation took
//! while its retention had not ended (`Record::outlives_takeover`): the
//! claim that takes the key writes it, a copy of the record as it was read,
//! in the same `TransactWriteItems` as the new record (whose `Put` is
//! conditioned on the attempt and state it read). Nothing changes it after:
//! every fenced change names the key's `r` item. It is in the `expiry`
//! index at its retention end, with the TTL backstop at the same time, and
//! in no other index.
//!
//! | index | hash | range | holds |
//! | --- | --- | --- | --- |
//! | `leases` | `mq` (N, shard) | `lu` (lease until, µs) | every current record from its claim to its delete, keys only: the sweep walks it behind a cursor |
//! | `unknown` | `uq` (N, shard) | `nc` (next check, µs) | UNKNOWN records only: the reconciler's due records |
//! | `expiry` | `xq` (N, shard) | `xk` (µs) | COMPLETED and NOT_PERFORMED records and superseded operations (`xk`: their retention end) and delivered jobs (kept until); keys, `st` and `lu` only |
//! | `due` | `dq` (N, shard) | `nr` (next run, µs) | live jobs only (neither dead nor delivered) |
//!
//! Each index is sparse: an item is in it only while it carries the index's
//! hash attribute, which a transition sets or removes in the same write.
//! A claim enters its record in `leases` and nothing takes it out but the
//! record's delete: `leases` projects keys only, so a completion, which
//! changes neither `mq` nor `lu`, writes no index at all (a first call is
//! 3 write units: the claim's item and its entry, the completion's item).
//! The sweep walks `leases` in lease order from a cursor per shard (an item
//! of its own, `cursor_key`), reading each record once as its lease ends
//! (an eventually consistent `BatchGetItem`), and moves the cursor past
//! what is settled; an IN_PROGRESS record holds the cursor until it is
//! marked. A COMPLETED record completed on time is in no other index: its
//! TTL (its retention end) deletes it, and every read treats it as gone
//! from then on ([`Record::is_expired`](crate::store::Record::is_expired)).
//! The purge deletes the others: UNKNOWN ones through `unknown`, the rest
//! through `expiry`, and an IN_PROGRESS record past its life from the walk.
//! The hash attribute is a shard (the key's first byte modulo [`SHARDS`]),
//! so no index partition takes every write of the table; a listing asks the
//! shards at once.
//!
//! `tt` (epoch seconds) is DynamoDB's TTL attribute: set on COMPLETED
//! records and superseded operations (their retention end, from `te`,
//! which the claim writes) and delivered jobs (their record's retention
//! end), never on an IN_PROGRESS or UNKNOWN record, whose end depends on a
//! lease a heartbeat moves, nor on a NOT_PERFORMED one (the purge takes it
//! at its retention end). It is what deletes a record completed on time,
//! free of write units and "typically within a few days" of its retention
//! end; reads never rely on it having run.
//!
//! # Tables created before the `leases` index
//!
//! Those tables have a `lapsed` index (`lq`, `lu`, all attributes) that
//! held IN_PROGRESS records, and their completions put records into
//! `expiry`. [`DynamoDbStore::migrate`](super::DynamoDbStore::migrate)
//! adds `leases` (DynamoDB fills it from existing items: none carries `mq`,
//! so it starts empty). The store then finds the records claimed before
//! the upgrade, or by a replica not upgraded yet, where they are: the
//! sweep and the purge still read `lapsed` while the table has it, every
//! completion and mark still removes `lq`, and a record in `expiry` is
//! purged from there. Once `lapsed` is empty (every older claim settled),
//! the operator may delete it.
//!
//! # Items written before the window and the retention were two lives
//!
//! The table's definition is unchanged; items written by earlier versions
//! read and behave under the current rules:
//!
//! - A COMPLETED record completed on time has `xk` and `tt` at the end of
//!   its window (`ea`), not at its retention end. It is read as it is, and
//!   a claim after its window takes the key over and keeps it as a
//!   superseded operation (at its retention end) as for any record. Left
//!   alone, the purge lists it at its window's end, its delete's condition
//!   (the retention) refuses it, and the purge moves its `xk` and `tt` to
//!   its retention end in their place, so it is deleted then and never
//!   blocks the index's head. Its TTL backstop may still delete it between
//!   its window's end and its retention end when the purge has not run in
//!   between.
//! - A COMPLETED record completed late (from UNKNOWN or NOT_PERFORMED) had
//!   its window moved to its retention end (`ea = ra`) and its TTL removed.
//!   Such an item (COMPLETED without `tt`: every completion now sets it) is
//!   read with the window it was claimed with, from `te` (which earlier
//!   claims wrote as the window's end in epoch seconds, rounded up), and
//!   the claim's condition frees its key then too.
//! - A record claimed before and completed after the upgrade has `te` and
//!   no `tr`: its TTL backstop is its window's end (`te`), as before.
use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::key::{IdempotencyKey, Reference};
use crate::store::FollowOnId;

/// How many shards the indexes' hash attributes spread over. Fixed for the
/// life of the data: a listing asks exactly these. Four keeps a
/// maintenance round (sweep, reconcile, purge) and a dispatcher's lease at
/// a few queries each; a partition key value takes about 1,000 writes a
/// second before DynamoDB splits it by its sort key, and a call writes the
/// `leases` index once (a heartbeat moves its entry), so four values carry
/// some 4,000 calls a second before then.
pub(super) const SHARDS: u8 = 4;

/// An item as the SDK reads and writes it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// The attribute names: short, since every item carries them and DynamoDB
/// counts their bytes in each item's size; none is a DynamoDB reserved word.
pub(super) mod attr {
    /// Partition key (B).
    pub(crate) const PK: &str = "pk";
    /// Sort key (B).
    pub(crate) const SK: &str = "sk";
    /// The key's fingerprint (B, 32 bytes).
    pub(crate) const FINGERPRINT: &str = "fp";
    /// Tenant (S).
    pub(crate) const TENANT: &str = "tn";
    /// Tool (S).
    pub(crate) const TOOL: &str = "tl";
    /// Reference (B, 16 bytes).
    pub(crate) const REFERENCE: &str = "rf";
    /// The claim's attempt, the fencing token (N).
    pub(crate) const ATTEMPT: &str = "ak";
    /// The state's code (N, `RecordStateKind::code`).
    pub(crate) const STATE: &str = "st";
    /// A COMPLETED record's response (S).
    pub(crate) const RESPONSE: &str = "rs";
    /// An UNKNOWN or NOT_PERFORMED record's note (S).
    pub(crate) const NOTE: &str = "nt";
    /// Who resolved it by hand and why (S).
    pub(crate) const RESOLUTION: &str = "rv";
    /// Claimed at (N, µs).
    pub(crate) const CLAIMED: &str = "ca";
    /// Updated at (N, µs).
    pub(crate) const UPDATED: &str = "ua";
    /// Lease until (N, µs).
    pub(crate) const LEASE: &str = "lu";
    /// Expires at (N, µs).
    pub(crate) const EXPIRES: &str = "ea";
    /// Retain until (N, µs).
    pub(crate) const RETAIN: &str = "ra";
    /// Next check at (N, µs).
    pub(crate) const NEXT_CHECK: &str = "nc";
    /// Checks (N).
    pub(crate) const CHECKS: &str = "ck";
    /// The TTL a completion sets, in epoch seconds rounded up (N), written
    /// by the claim: the retention's end. Claims of earlier versions wrote
    /// the window's end here, read back only for the window of an item they
    /// completed late.
    pub(crate) const TTL_AT: &str = "te";
    /// `leases` index hash: present from the claim to the delete (N).
    pub(crate) const LEASE_SHARD: &str = "mq";
    /// The legacy `lapsed` index's hash: present while IN_PROGRESS on a
    /// record claimed before `leases` (N).
    pub(crate) const LAPSED_SHARD: &str = "lq";
    /// A sweep cursor's position (N, µs): every `leases` entry of its shard
    /// below it is settled or gone.
    pub(crate) const CURSOR: &str = "cu";
    /// `unknown` index hash: present while UNKNOWN (N).
    pub(crate) const UNKNOWN_SHARD: &str = "uq";
    /// `expiry` index hash (N).
    pub(crate) const EXPIRY_SHARD: &str = "xq";
    /// `expiry` index range (N, µs).
    pub(crate) const EXPIRY: &str = "xk";
    /// DynamoDB's TTL attribute (N, epoch seconds).
    pub(crate) const TTL: &str = "tt";
    /// Job name (S).
    pub(crate) const NAME: &str = "nm";
    /// Job payload (S).
    pub(crate) const PAYLOAD: &str = "pl";
    /// Job runs (N).
    pub(crate) const RUNS: &str = "rn";
    /// The attempt holding the job's lease (N), absent when none.
    pub(crate) const JOB_ATTEMPT: &str = "ja";
    /// Next run at (N, µs).
    pub(crate) const NEXT_RUN: &str = "nr";
    /// Last error (S).
    pub(crate) const ERROR: &str = "er";
    /// The runs before the last re-drive (N), absent until a re-drive.
    pub(crate) const EARLIER_RUNS: &str = "rb";
    /// The last error when last re-driven (S), absent until a re-drive.
    pub(crate) const ERROR_BEFORE_REDRIVE: &str = "eb";
    /// In the dead letter (BOOL), absent when not.
    pub(crate) const DEAD: &str = "dd";
    /// Created at (N, µs).
    pub(crate) const CREATED: &str = "cr";
    /// Delivered at (N, µs), absent until then.
    pub(crate) const DELIVERED: &str = "dl";
    /// Kept until (N, µs), a delivered job's.
    pub(crate) const KEPT: &str = "ku";
    /// `due` index hash: present while the job is live (N).
    pub(crate) const DUE_SHARD: &str = "dq";
}

/// DynamoDB's limit on one item, as the store counts it: every
/// attribute's name and value ([`crate::store::ItemLimit`]).
///
/// DynamoDB documents 400 KB, and refuses past 409,600 bytes; the emulator
/// the tests run on refuses past 405,000. Taken as 400,000 bytes, so that
/// an item judged to fit is never refused by either.
pub(super) const MAX_ITEM: usize = 400_000;

/// The most bytes a number takes in an item: DynamoDB counts about one
/// byte per two significant digits and one more, at most 21 bytes for its
/// 38 digits; the emulator counts its decimal digits, at most 20 for a
/// `u64`.
const NUMBER: usize = 21;

/// The bytes a binary value of `n` bytes takes in an item, at most:
/// DynamoDB counts the bytes; the emulator counts them as base64, a third
/// more.
const fn binary(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// The bytes of these attributes' names.
const fn names(names: &[&str]) -> usize {
    let mut total = 0;
    let mut i = 0;
    while i < names.len() {
        total += names[i].len();
        i += 1;
    }
    total
}

/// The number attributes a record's item holds at some point of its life.
const RECORD_NUMBERS: [&str; 16] = [
    attr::ATTEMPT,
    attr::STATE,
    attr::CLAIMED,
    attr::UPDATED,
    attr::LEASE,
    attr::EXPIRES,
    attr::RETAIN,
    attr::NEXT_CHECK,
    attr::CHECKS,
    attr::TTL_AT,
    attr::LEASE_SHARD,
    attr::LAPSED_SHARD,
    attr::UNKNOWN_SHARD,
    attr::EXPIRY_SHARD,
    attr::EXPIRY,
    attr::TTL,
];

/// The most bytes a record's item (current or superseded) takes besides
/// its texts (tenant, tool, response, note, resolution): its keys (a
/// superseded operation's sort key carries its reference, 16 bytes), its
/// fingerprint and reference, its numbers, and every attribute's name.
pub(super) const RECORD_BYTES: usize = names(&[
    attr::PK,
    attr::SK,
    attr::FINGERPRINT,
    attr::REFERENCE,
    attr::TENANT,
    attr::TOOL,
    attr::RESPONSE,
    attr::NOTE,
    attr::RESOLUTION,
]) + names(&RECORD_NUMBERS)
    + binary(8)
    + binary(25 + 16)
    + binary(32)
    + binary(16)
    + RECORD_NUMBERS.len() * NUMBER;

/// The number attributes a job's item holds at some point of its life.
const JOB_NUMBERS: [&str; 12] = [
    attr::RUNS,
    attr::NEXT_RUN,
    attr::CREATED,
    attr::UPDATED,
    attr::DUE_SHARD,
    attr::JOB_ATTEMPT,
    attr::DELIVERED,
    attr::KEPT,
    attr::EXPIRY_SHARD,
    attr::EXPIRY,
    attr::TTL,
    attr::EARLIER_RUNS,
];

/// DynamoDB's limit on a sort key: 1024 bytes.
const MAX_SORT_KEY: usize = 1024;

/// A job's sort key besides its tenant and name ([`job_key`]): its tag,
/// the reference's length and 16 bytes, the tenant's length (4 bytes).
const JOB_KEY_FIXED: usize = 1 + 1 + 16 + 4;

/// The most bytes of a job's tenant and name together: what its sort key
/// leaves them.
pub(super) const JOB_KEY_TEXTS: usize = MAX_SORT_KEY - JOB_KEY_FIXED;

/// The most bytes a job's item takes besides its texts (tenant, name,
/// payload, the two errors): its keys (a sort key of at most
/// [`MAX_SORT_KEY`] bytes, which holds the tenant and the name again), its
/// reference, its numbers, the dead-letter flag, and every attribute's
/// name.
pub(super) const JOB_BYTES: usize = names(&[
    attr::PK,
    attr::SK,
    attr::TENANT,
    attr::REFERENCE,
    attr::NAME,
    attr::PAYLOAD,
    attr::ERROR,
    attr::ERROR_BEFORE_REDRIVE,
    attr::DEAD,
]) + names(&JOB_NUMBERS)
    + binary(8)
    + binary(MAX_SORT_KEY)
    + binary(16)
    + 1
    + JOB_NUMBERS.len() * NUMBER;

/// The indexes' names (`lapsed`: tables written before `leases` only).
pub(super) const LEASES_INDEX: &str = "leases";
pub(super) const LAPSED_INDEX: &str = "lapsed";
pub(super) const UNKNOWN_INDEX: &str = "unknown";
pub(super) const EXPIRY_INDEX: &str = "expiry";
pub(super) const DUE_INDEX: &str = "due";

/// The sort keys' first byte: a record's, a superseded operation's, a
/// job's. A record sorts before its superseded operations, and jobs before
/// both.
pub(super) const RECORD_TAG: u8 = b'r';
pub(super) const SUPERSEDED_TAG: u8 = b's';
pub(super) const JOB_TAG: u8 = b'j';
/// A sweep cursor's sort key's first byte (then its shard).
pub(super) const CURSOR_TAG: u8 = b'c';

/// The partition of the sweep's cursors: 5 bytes, where every record's and
/// job's is 8, so it is no record's.
const CURSORS: &[u8] = b"idem\0";

/// The sweep cursor of `shard`: its `pk` and `sk`.
pub(super) fn cursor_key(shard: u8) -> Item {
    HashMap::from([
        (attr::PK.to_owned(), blob(CURSORS)),
        (attr::SK.to_owned(), blob(&[CURSOR_TAG, shard])),
    ])
}

/// The shard of a record or job whose key (reference) starts with `first`.
pub(super) fn shard(first: u8) -> u8 {
    first % SHARDS
}

/// The record of `key`: its `pk` and `sk`.
pub(super) fn record_key(key: &IdempotencyKey) -> Item {
    let bytes = key.as_bytes();
    let mut sk = Vec::with_capacity(25);
    sk.push(RECORD_TAG);
    sk.extend_from_slice(&bytes[8..]);
    HashMap::from([
        (attr::PK.to_owned(), blob(&bytes[..8])),
        (attr::SK.to_owned(), AttributeValue::B(sk.into())),
    ])
}

/// The superseded operation `reference` of `key`: its `pk` and `sk`.
pub(super) fn superseded_key(key: &IdempotencyKey, reference: &Reference) -> Item {
    let bytes = key.as_bytes();
    let mut sk = Vec::with_capacity(25 + 16);
    sk.push(SUPERSEDED_TAG);
    sk.extend_from_slice(&bytes[8..]);
    sk.extend_from_slice(reference.as_bytes());
    HashMap::from([
        (attr::PK.to_owned(), blob(&bytes[..8])),
        (attr::SK.to_owned(), AttributeValue::B(sk.into())),
    ])
}

/// The partition every record of a reference's key sits in.
pub(super) fn partition_of(reference: &Reference) -> AttributeValue {
    blob(&reference.key_prefix())
}

/// The job `id`: its `pk` and `sk`.
pub(super) fn job_key(id: &FollowOnId) -> Item {
    let reference = id.reference.as_bytes();
    let tenant = id.tenant.as_bytes();
    let mut sk = Vec::with_capacity(6 + reference.len() + tenant.len() + id.name.len());
    sk.push(JOB_TAG);
    sk.push(reference.len() as u8);
    sk.extend_from_slice(reference);
    sk.extend_from_slice(&(tenant.len() as u32).to_be_bytes());
    sk.extend_from_slice(tenant);
    sk.extend_from_slice(id.name.as_bytes());
    HashMap::from([
        (attr::PK.to_owned(), partition_of(&id.reference)),
        (attr::SK.to_owned(), AttributeValue::B(sk.into())),
    ])
}

/// The start of the sort key of every job of the operation `reference`
/// ([`job_key`]): the job tag, the reference's length and bytes.
pub(super) fn jobs_prefix(reference: &Reference) -> Vec<u8> {
    let bytes = reference.as_bytes();
    let mut prefix = Vec::with_capacity(2 + bytes.len());
    prefix.push(JOB_TAG);
    prefix.push(bytes.len() as u8);
    prefix.extend_from_slice(bytes);
    prefix
}

/// A binary attribute.
pub(super) fn blob(bytes: &[u8]) -> AttributeValue {
    AttributeValue::B(bytes.to_vec().into())
}

/// A number attribute.
pub(super) fn num(n: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

/// The table's definition, as `aws dynamodb create-table --cli-input-json`
/// takes it (replace `TABLE`), for infrastructure code; then turn on TTL on
/// the attribute `tt` (`aws dynamodb update-time-to-live --table-name TABLE
/// --time-to-live-specification Enabled=true,AttributeName=tt`).
/// [`DynamoDbStore::create_table`](super::DynamoDbStore::create_table)
/// creates exactly this.
pub const TABLE_DEFINITION: &str = r#"{
  "TableName": "TABLE",
  "BillingMode": "PAY_PER_REQUEST",
  "AttributeDefinitions": [
    {"AttributeName": "pk", "AttributeType": "B"},
    {"AttributeName": "sk", "AttributeType": "B"},
    {"AttributeName": "mq", "AttributeType": "N"},
    {"AttributeName": "lu", "AttributeType": "N"},
    {"AttributeName": "uq", "AttributeType": "N"},
    {"AttributeName": "nc", "AttributeType": "N"},
    {"AttributeName": "xq", "AttributeType": "N"},
    {"AttributeName": "xk", "AttributeType": "N"},
    {"AttributeName": "dq", "AttributeType": "N"},
    {"AttributeName": "nr", "AttributeType": "N"}
  ],
  "KeySchema": [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"}
  ],
  "GlobalSecondaryIndexes": [
    {"IndexName": "leases",
     "KeySchema": [{"AttributeName": "mq", "KeyType": "HASH"}, {"AttributeName": "lu", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "KEYS_ONLY"}},
    {"IndexName": "unknown",
     "KeySchema": [{"AttributeName": "uq", "KeyType": "HASH"}, {"AttributeName": "nc", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}},
    {"IndexName": "expiry",
     "KeySchema": [{"AttributeName": "xq", "KeyType": "HASH"}, {"AttributeName": "xk", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["st", "lu"]}},
    {"IndexName": "due",
     "KeySchema": [{"AttributeName": "dq", "KeyType": "HASH"}, {"AttributeName": "nr", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}}
  ]
}"#;

/// The table's TTL attribute, as [`TABLE_DEFINITION`] says to turn it on.
pub(super) const TTL_ATTRIBUTE: &str = attr::TTL;

/// What an index holds of its items besides the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Projected {
    /// Every attribute.
    All,
    /// The table's and the index's keys only.
    Keys,
    /// These attributes too.
    Include(&'static [&'static str]),
}

/// The indexes as (name, hash, range, projection): what
/// [`TABLE_DEFINITION`] says, for `create_table` and `migrate`.
pub(super) const INDEXES: [(&str, &str, &str, Projected); 4] = [
    (
        LEASES_INDEX,
        attr::LEASE_SHARD,
        attr::LEASE,
        Projected::Keys,
    ),
    (
        UNKNOWN_INDEX,
        attr::UNKNOWN_SHARD,
        attr::NEXT_CHECK,
        Projected::All,
    ),
    (
        EXPIRY_INDEX,
        attr::EXPIRY_SHARD,
        attr::EXPIRY,
        Projected::Include(&[attr::STATE, attr::LEASE]),
    ),
    (DUE_INDEX, attr::DUE_SHARD, attr::NEXT_RUN, Projected::All),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented definition and what `create_table` builds agree.
    #[test]
    fn the_definition_names_every_index() {
        for (name, hash, range, _) in INDEXES {
            assert!(TABLE_DEFINITION.contains(&format!("\"IndexName\": \"{name}\"")));
            for a in [hash, range] {
                assert!(TABLE_DEFINITION.contains(&format!("\"AttributeName\": \"{a}\"")));
            }
        }
    }

    #[test]
    fn a_record_sits_in_the_partition_its_references_name() {
        let key = IdempotencyKey::from_parts([7; 32], [1; 32]);
        let reference = Reference::new_operation(&key);
        assert_eq!(record_key(&key)[attr::PK], partition_of(&reference));
        let superseded = superseded_key(&key, &reference);
        assert_eq!(superseded[attr::PK], partition_of(&reference));
        let (AttributeValue::B(r), AttributeValue::B(s)) =
            (&record_key(&key)[attr::SK], &superseded[attr::SK])
        else {
            panic!("binary sort keys");
        };
        assert!(r.as_ref() < s.as_ref(), "the current record sorts first");
        assert_eq!(
            &s.as_ref()[..25],
            &[&[SUPERSEDED_TAG][..], &r.as_ref()[1..]].concat()
        );
    }
}
