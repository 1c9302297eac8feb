//! An in-process store for tests and single-process servers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordFilter, RecordState,
    RecordStateKind, Resolution, StateCounts, StoreError,
};
use crate::key::{IdempotencyKey, Reference};

const SHARDS: usize = 64;

type Shard = Mutex<BTreeMap<[u8; 32], Record>>;

/// Where a [`MemoryStore`] reads the time.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Records in process memory, lost when the process ends.
///
/// The map is split into 64 shards chosen by the key's first byte, each behind
/// its own mutex, so concurrent calls on different keys do not wait for each
/// other and no lock is ever held across an `.await`. A shard is a `BTreeMap`
/// so a reference (the key's first eight bytes) is found by a range query.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    clock: Option<Clock>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the process clock.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(BTreeMap::new())).collect(),
            clock: None,
        }
    }

    /// An empty store that reads the time from `clock`: a simulation runs
    /// leases, windows and settle periods on its own time.
    pub fn with_clock(clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        MemoryStore {
            clock: Some(Arc::new(clock)),
            ..Self::new()
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

    fn now(&self) -> SystemTime {
        match &self.clock {
            Some(clock) => clock(),
            None => SystemTime::now(),
        }
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
        let now = self.now();
        let mut shard = self.shard(key.key[0]);
        match shard.get(&key.key) {
            Some(record) if record.attempt == attempt => change(&mut shard, now),
            _ => Err(StoreError::Fenced),
        }
    }

    /// Applies `change` to the record if `attempt` owns it and it is in
    /// state `kind`; otherwise `Fenced` or `WrongState`.
    fn fenced_in<R>(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        kind: RecordStateKind,
        change: impl FnOnce(&mut Record, SystemTime) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.fenced(key, attempt, |shard, now| {
            let record = shard.get_mut(&key.key).expect("checked by fenced");
            if record.state.kind() != kind {
                return Err(StoreError::WrongState {
                    found: record.state.kind(),
                });
            }
            change(record, now)
        })
    }

    /// Up to `limit` records matching `pick`, ordered by `order`.
    fn collect<K: Ord>(
        &self,
        limit: usize,
        pick: impl Fn(&Record) -> bool,
        order: impl Fn(&Record) -> K,
    ) -> Vec<Record> {
        let now = self.now();
        let mut found: Vec<Record> = Vec::new();
        for shard in self.shards.iter() {
            found.extend(lock(shard).values().filter(|r| pick(r)).cloned());
        }
        found.sort_by_key(order);
        found.truncate(limit);
        for r in &mut found {
            r.observed_at = now;
        }
        found
    }
}

// A panic while a shard was locked cannot leave a record half-written (every
// change is a single insert, remove or field assignment), so poisoning is
// ignored rather than turning one panic into a dead store.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A completion that arrives after the sweep or a reconciler gave up on the
/// record (a late handler, a reconciler, an operator) answers repeats until
/// the retention ends, not only the window: found after its window, it would
/// otherwise expire the moment it is written, be purged, and let the next
/// identical call run again.
fn settle_late_completion(record: &mut Record) {
    record.expires_at = record.expires_at.max(record.retain_until);
}

fn unknown(record: &mut Record, note: &str, now: SystemTime) {
    record.state = RecordState::Unknown {
        note: note.to_owned(),
    };
    record.updated_at = now;
    record.next_check_at = now;
    record.checks = 0;
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let newest_first = |r: &Record| std::cmp::Reverse(r.claimed_at);
        Ok(self.collect(filter.limit, |r| filter.matches(r), newest_first))
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let mut counts = StateCounts::default();
        for shard in self.shards.iter() {
            for record in lock(shard).values() {
                counts.add(record.state.kind(), 1);
            }
        }
        Ok(counts)
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.now();
        let mut shard = self.shard(req.key.key[0]);
        if let Some(existing) = shard.get(&req.key.key) {
            if !existing.is_claimable(now) {
                let mut record = existing.clone();
                record.observed_at = now;
                return Ok(Claim::Existing { record });
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
                next_check_at: now,
                checks: 0,
                resolution: None,
                observed_at: now,
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
            if record.state != RecordState::InProgress {
                settle_late_completion(record);
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
            let found = shard.get(&key.key).map(|r| r.state.kind());
            if let Some(found @ (RecordStateKind::Completed | RecordStateKind::NotPerformed)) =
                found
            {
                return Err(StoreError::WrongState { found });
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
        self.fenced_in(key, attempt, RecordStateKind::InProgress, |record, now| {
            unknown(record, note, now);
            Ok(())
        })
    }

    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::InProgress, |record, now| {
            // Re-checked under the shard's lock: a heartbeat that landed after
            // the sweep listed the record keeps it alive.
            if !record.lease_expired(now) {
                return Ok(false);
            }
            unknown(record, note, now);
            Ok(true)
        })
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::Unknown, |record, now| {
            record.state = match resolution {
                Resolution::Completed { response } => {
                    settle_late_completion(record);
                    RecordState::Completed {
                        response: response.to_owned(),
                    }
                }
                Resolution::NotPerformed { note, settle } => {
                    let until = record.updated_at + settle;
                    if now < until {
                        return Err(StoreError::NotSettled { until });
                    }
                    RecordState::NotPerformed {
                        note: note.to_owned(),
                    }
                }
            };
            record.resolution = note.map(str::to_owned);
            record.updated_at = now;
            Ok(())
        })
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::Unknown, |record, now| {
            record.next_check_at = now + delay;
            record.checks = record.checks.saturating_add(1);
            Ok(())
        })
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::InProgress, |record, now| {
            record.lease_until = now + lease;
            record.updated_at = now;
            Ok(())
        })
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let now = self.now();
        let mut lo = [0u8; 32];
        let mut hi = [0xffu8; 32];
        lo[..8].copy_from_slice(reference.as_bytes());
        hi[..8].copy_from_slice(reference.as_bytes());
        let shard = self.shard(reference.as_bytes()[0]);
        Ok(shard
            .range(lo..=hi)
            .map(|(_, r)| r)
            .find(|r| r.tenant == tenant)
            .map(|r| Record {
                observed_at: now,
                ..r.clone()
            }))
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let now = self.now();
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
        let now = self.now();
        Ok(self.collect(
            limit,
            |r| r.state == RecordState::InProgress && r.lease_expired(now),
            |r| r.lease_until,
        ))
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        Ok(self.collect(
            limit,
            |r| matches!(r.state, RecordState::Unknown { .. }) && r.next_check_at <= now,
            |r| r.next_check_at,
        ))
    }
}
