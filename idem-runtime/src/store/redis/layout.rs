//! Where a record and its listings live in Redis: the key names, and the
//! shards that keep a record and its sorted-set entries on one Cluster slot.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `P:{SS}:r:REF` | string | the record (packed: `REC` in `lua/prelude.lua`) whose key starts with `REF` (the key's first 8 bytes, 16 hex digits; every reference of the key starts with them) |
//! | `P:{SS}:k:KEY` | string | a record whose reference was held by another operation's record when it was claimed (`KEY`: 64 hex digits) |
//! | `P:{SS}:x:REF` | set | the `k:KEY` members of those records, for lookups by reference |
//! | `P:{SS}:o:REF32` | string | a superseded operation: a record (packed as `r:`) whose key a later operation took while its retention had not ended (`Record::outlives_takeover`), kept by the claim that took it, in the same script, under its whole reference (`REF32`: 16 bytes in hex; 8 for a record written before references had tags). Native expiry at its `retain_until` (`PXAT`), so Redis deletes it and the purge has nothing to do for it |
//! | `P:{SS}:lapsed` | sorted set | the shard's IN_PROGRESS records (`r:REF` or `k:KEY`), scored by `lease_until` (µs) |
//! | `P:{SS}:unknown` | sorted set | the shard's UNKNOWN records, scored by `next_check_at` (µs) |
//! | `P:{SS}:j:REF:TENANT:NAME` | hash | a follow-on of the operation with reference `REF` (all its bytes in hex: 32 digits, or 16 for a job written before references had tags; the tenant in hex) |
//! | `P:{SS}:jd:NAME` | sorted set | the shard's live jobs named `NAME`, scored by `next_run_at` (µs) |
//! | `P:{SS}:jobs` | sorted set | every job of the shard, live or dead, scored by `created_at` (µs) |
//! | `P:{SS}:jobnames` | set | the names of the shard's live jobs |
//! | `P:{SS}:delivered` | sorted set | the shard's delivered jobs, scored by `kept_until` (µs), their record's `retain_until`, for the purge |
//! | `P:{SS}:retained` | string | the migration of the shard's COMPLETED records written before they lived until `retain_until` (their native expiry was at `expires_at`): the SCAN cursor `lua/purge.lua` has reached, then `done` |
//!
//! `P` is the store's prefix and `SS` the shard: the key's first byte modulo
//! [`SHARDS`], in two hex digits. `{SS}` is the Cluster hash tag, so a record
//! and the sets that list it sit on one slot and every script touches one
//! slot only; the records spread over [`SHARDS`] slots, which the listings
//! and the purge visit one by one.
//!
//! A job sits on its operation's shard, so the completion and its jobs are
//! written by one script on one slot; a dispatcher's lease, a listing and a
//! count ask every shard (`lua/jobs.lua` has the details).
//!
//! A record is stored under its key's first eight bytes, which its reference
//! starts with, so a lookup by reference names it directly, with no index to
//! keep in step, and a fenced change (which knows the key, not the tenant)
//! names it too; the lookup then checks the tenant and the operation's tag.
//! Two live records share those eight bytes only by a 64-bit collision; the
//! later one is then stored under its full key and listed in the collision
//! set, which exists only for such a pair.
//!
//! Every record, current or superseded, has a native expiry at the end of
//! its life (`Record::is_expired`): a COMPLETED or NOT_PERFORMED one at its
//! `retain_until` (not at `expires_at`, which only ends the key's hold), any
//! other once its retention and its lease are both over. A lookup by
//! reference reads the key's current record first (`r:`, then `k:`), then
//! the superseded operation (`o:`); a fenced change reads the current record
//! only, so an attempt of a superseded operation is fenced.

use crate::key::{hex, IdempotencyKey, Reference};
use crate::store::FollowOnId;

/// How many shards (hash tags) the records spread over. Fixed for the life
/// of the data: a record is found again only under the shard it was written
/// to.
pub(super) const SHARDS: u8 = 64;

/// The key names of one store, from its prefix.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    prefix: String,
}

/// What a script over one record is given: the record under its reference,
/// its one `KEYS` entry (the script finds the shard's other names from it),
/// and the key in hex, which names the record under its full key.
#[derive(Debug)]
pub(super) struct RecordKeys {
    /// `P:{SS}:r:REF`.
    pub(super) by_reference: Vec<u8>,
    /// The key's 32 bytes in hex (64 digits).
    pub(super) key_hex: String,
}

impl Layout {
    /// A layout under `prefix`: letters, digits and `:_-.` only, so that no
    /// `{` in it moves the hash tag.
    pub(super) fn new(prefix: &str) -> Result<Self, String> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ":_-.".contains(c));
        if valid {
            Ok(Layout {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(format!(
                "invalid key prefix {prefix:?}: use letters, digits and :_-. (at most 64)"
            ))
        }
    }

    /// The prefix every key of the store starts with.
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P:{SS}:`, the start of every key of shard `shard`.
    pub(super) fn shard(&self, shard: u8) -> Vec<u8> {
        format!("{}:{{{shard:02x}}}:", self.prefix).into_bytes()
    }

    /// The shard's lapsed and unknown sets.
    pub(super) fn sets(&self, shard: u8) -> [Vec<u8>; 2] {
        let base = self.shard(shard);
        [
            [&base[..], b"lapsed"].concat(),
            [&base[..], b"unknown"].concat(),
        ]
    }

    /// What a script over the record of `key` names.
    pub(super) fn record(&self, key: &IdempotencyKey) -> RecordKeys {
        RecordKeys {
            by_reference: self.by_prefix(key_prefix(key)),
            key_hex: hex(key.as_bytes()),
        }
    }

    /// The key of the record stored under `reference` (its first eight
    /// bytes, the key's).
    pub(super) fn by_reference(&self, reference: &Reference) -> Vec<u8> {
        self.by_prefix(reference.key_prefix())
    }

    /// The key of the record whose key starts with `prefix`.
    fn by_prefix(&self, prefix: [u8; 8]) -> Vec<u8> {
        let base = self.shard(prefix[0] % SHARDS);
        [&base[..], format!("r:{}", hex(&prefix)).as_bytes()].concat()
    }

    /// The collision set of the records whose key starts as `reference`'s.
    pub(super) fn collisions(&self, reference: &Reference) -> Vec<u8> {
        let base = self.shard(shard_of(reference));
        [
            &base[..],
            format!("x:{}", hex(&reference.key_prefix())).as_bytes(),
        ]
        .concat()
    }

    /// The shard of the record of `key`.
    pub(super) fn shard_of_key(&self, key: &IdempotencyKey) -> u8 {
        key_prefix(key)[0] % SHARDS
    }

    /// What a script over one job names: the job's hash, its name's due
    /// set, the shard's job list and the shard's job names (`KEYS`), and the
    /// job's member in the sets.
    pub(super) fn job(&self, id: &FollowOnId) -> ([Vec<u8>; 4], Vec<u8>) {
        let base = self.shard(shard_of(&id.reference));
        let member = format!(
            "{}:{}:{}",
            hex(id.reference.as_bytes()),
            hex(id.tenant.as_bytes()),
            id.name
        )
        .into_bytes();
        let [list, names] = self.job_sets(shard_of(&id.reference));
        (
            [
                [&base[..], b"j:", &member[..]].concat(),
                [&base[..], b"jd:", id.name.as_bytes()].concat(),
                list,
                names,
            ],
            member,
        )
    }

    /// The shard's job list and job names.
    pub(super) fn job_sets(&self, shard: u8) -> [Vec<u8>; 2] {
        let base = self.shard(shard);
        [
            [&base[..], b"jobs"].concat(),
            [&base[..], b"jobnames"].concat(),
        ]
    }

    /// The shard a reference (and its key) belongs to.
    pub(super) fn shard_of(&self, reference: &Reference) -> u8 {
        shard_of(reference)
    }
}

fn shard_of(reference: &Reference) -> u8 {
    reference.key_prefix()[0] % SHARDS
}

fn key_prefix(key: &IdempotencyKey) -> [u8; 8] {
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key.as_bytes()[..8]);
    prefix
}
