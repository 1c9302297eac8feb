//! An in-process store for tests and single-process servers.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordState, RecordStateKind,
    StoreError,
};
use crate::key::{IdempotencyKey, Reference};

const SHARDS: usize = 64;

type Shard = Mutex<BTreeMap<[u8; 32], Record>>;

/// Records in process memory, lost when the process ends.
///
/// The map is split into 64 shards chosen by the key's first byte, each behind
/// its own mutex, so concurrent calls on different keys do not wait for each
/// other and no lock is ever held across an `.await`. A shard is a `BTreeMap`
/// so a reference (the key's first eight bytes) is found by a range query.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Shard]>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(BTreeMap::new())).collect(),
        }
    }

    /// How many records the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, first_byte: u8) -> std::sync::MutexGuard<'_, BTreeMap<[u8; 32], Record>> {
        lock(&self.shards[first_byte as usize % SHARDS])
    }

    /// Applies `change` to the record if `attempt` owns it.
    fn fenced<R>(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        change: impl FnOnce(&mut BTreeMap<[u8; 32], Record>, SystemTime) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut shard = self.shard(key.key[0]);
        match shard.get(&key.key) {
            Some(record) if record.attempt == attempt => change(&mut shard, SystemTime::now()),
            _ => Err(StoreError::Fenced),
        }
    }
}

// A panic while a shard was locked cannot leave a record half-written (every
// change is a single insert, remove or field assignment), so poisoning is
// ignored rather than turning one panic into a dead store.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let now = SystemTime::now();
        let mut shard = self.shard(req.key.key[0]);
        if let Some(existing) = shard.get(&req.key.key) {
            if !existing.is_expired(now) {
                return Ok(Claim::Existing {
                    record: existing.clone(),
                    now,
                });
            }
        }
        shard.insert(
            req.key.key,
            Record {
                key: req.key,
                tenant: req.tenant.clone(),
                tool: req.tool.clone(),
                attempt: req.attempt,
                state: RecordState::InProgress,
                claimed_at: now,
                updated_at: now,
                lease_until: now + req.lease,
                expires_at: now + req.window,
                retain_until: now + req.retention.max(req.window),
            },
        );
        Ok(Claim::Claimed)
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.fenced(key, attempt, |shard, now| {
            let record = shard.get_mut(&key.key).expect("checked by fenced");
            if let RecordState::Completed { .. } = record.state {
                return Err(StoreError::WrongState {
                    found: RecordStateKind::Completed,
                });
            }
            record.state = RecordState::Completed {
                response: response.to_owned(),
            };
            record.updated_at = now;
            Ok(())
        })
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.fenced(key, attempt, |shard, _| {
            if let Some(Record {
                state: RecordState::Completed { .. },
                ..
            }) = shard.get(&key.key)
            {
                return Err(StoreError::WrongState {
                    found: RecordStateKind::Completed,
                });
            }
            shard.remove(&key.key);
            Ok(())
        })
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.fenced(key, attempt, |shard, now| {
            let record = shard.get_mut(&key.key).expect("checked by fenced");
            if record.state != RecordState::InProgress {
                return Err(StoreError::WrongState {
                    found: record.state.kind(),
                });
            }
            record.state = RecordState::Unknown {
                note: note.to_owned(),
            };
            record.updated_at = now;
            Ok(())
        })
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.fenced(key, attempt, |shard, now| {
            let record = shard.get_mut(&key.key).expect("checked by fenced");
            if record.state != RecordState::InProgress {
                return Err(StoreError::WrongState {
                    found: record.state.kind(),
                });
            }
            record.lease_until = now + lease;
            Ok(())
        })
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let mut lo = [0u8; 32];
        let mut hi = [0xffu8; 32];
        lo[..8].copy_from_slice(reference.as_bytes());
        hi[..8].copy_from_slice(reference.as_bytes());
        let shard = self.shard(reference.as_bytes()[0]);
        Ok(shard
            .range(lo..=hi)
            .map(|(_, r)| r)
            .find(|r| r.tenant == tenant)
            .cloned())
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let now = SystemTime::now();
        let mut purged = 0;
        // One shard at a time: a batch never holds more than one shard's lock.
        for shard in self.shards.iter() {
            if purged >= batch {
                break;
            }
            let mut shard = lock(shard);
            let doomed: Vec<[u8; 32]> = shard
                .iter()
                .filter(|(_, r)| r.is_expired(now))
                .map(|(k, _)| *k)
                .take(batch - purged)
                .collect();
            for k in &doomed {
                shard.remove(k);
            }
            purged += doomed.len();
        }
        Ok(purged)
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = SystemTime::now();
        Ok(self.collect(limit, |r| {
            r.state == RecordState::InProgress && r.lease_expired(now)
        }))
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        Ok(self.collect(limit, |r| matches!(r.state, RecordState::Unknown { .. })))
    }
}

impl MemoryStore {
    /// Up to `limit` records matching `pick`, oldest claim first.
    fn collect(&self, limit: usize, pick: impl Fn(&Record) -> bool) -> Vec<Record> {
        let mut found: Vec<Record> = Vec::new();
        for shard in self.shards.iter() {
            found.extend(lock(shard).values().filter(|r| pick(r)).cloned());
        }
        found.sort_by_key(|r| r.claimed_at);
        found.truncate(limit);
        found
    }
}
