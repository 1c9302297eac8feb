//! An in-process store for tests and single-process servers.
//!
//! One follow-on, the store: its sharded records and follow-ons and the contract over
//! them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hashbrown::hash_table::{Entry, HashTable};
use RecordStateKind::{InProgress, NotPerformed, Unknown};

use super::{
    due_order, fence, lease_names, listing_order, sort_leased, Attempt, Claim, ClaimRequest,
    FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore, FollowOns, IdempotencyStore,
    Inspect, Record, RecordFilter, RecordState, RecordStateKind, Resolution, StateCounts,
    StoreError, Upkeep,
};
use crate::key::{IdempotencyKey, Reference};

const SHARDS: usize = 64;

/// One shard: the records whose key starts with its byte, and the follow-on
/// follow-ons of those records (a reference starts with the key's first eight
/// bytes, so a follow-on lives in its record's shard and is written under the same
/// lock).
#[derive(Default)]
struct ShardData {
    records: Records,
    /// Operations whose key a later operation took while their retention
    /// had not ended ([`Record::outlives_takeover`]), by reference: read by
    /// `lookup` and listed until purge deletes them.
    superseded: HashMap<Reference, Record>,
    jobs: BTreeMap<JobKey, FollowOnRecord>,
}

/// A shard's records in a hash table hashed by the key's first eight bytes
/// (which every reference of the key starts with), so that a claim finds its
/// key, and a lookup its reference, with one probe each. (A B-tree walk took a cache miss on each
/// node for the random keys: about a fifth of a call.) Nothing here is
/// ordered; what lists records sorts them.
#[derive(Default)]
struct Records(HashTable<Slot>);

/// A record and its key's first eight bytes, kept beside it so that probing
/// for a new key and growing the table read them without following the box
/// to the record (a cache miss each).
struct Slot {
    prefix: [u8; 8],
    record: Box<Record>,
}

impl Slot {
    fn is(&self, key: &[u8; 32]) -> bool {
        self.prefix[..] == key[..8] && self.record.key.key == *key
    }
}

/// The hash of a record whose key starts with these bytes. Its bytes are SHA-256
/// output, already uniform, but the first one also chose the shard, so only
/// the next seven are used, spread over all 64 bits: the table indexes by
/// the low bits and tags entries with the high ones.
fn hash_of(prefix: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&prefix[..8]);
    (u64::from_le_bytes(b) >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Records {
    fn get(&self, key: &[u8; 32]) -> Option<&Record> {
        self.0.find(hash_of(key), |s| s.is(key)).map(|s| &*s.record)
    }

    fn get_mut(&mut self, key: &[u8; 32]) -> Option<&mut Record> {
        self.0
            .find_mut(hash_of(key), |s| s.is(key))
            .map(|s| &mut *s.record)
    }

    /// The place of the record with `key`, for a claim to read and fill.
    fn entry(&mut self, key: &[u8; 32]) -> Entry<'_, Slot> {
        self.0
            .entry(hash_of(key), |s| s.is(key), |s| hash_of(&s.prefix))
    }

    fn remove(&mut self, key: &[u8; 32]) {
        if let Ok(found) = self.0.find_entry(hash_of(key), |s| s.is(key)) {
            found.remove();
        }
    }

    /// The records whose key starts with `prefix` (almost always one).
    fn with_prefix(&self, prefix: [u8; 8]) -> impl Iterator<Item = &Record> {
        self.0
            .iter_hash(hash_of(&prefix))
            .filter(move |s| s.prefix == prefix)
            .map(|s| &*s.record)
    }

    fn values(&self) -> impl Iterator<Item = &Record> {
        self.0.iter().map(|s| &*s.record)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A follow-on's place in its shard: its operation's reference, tenant, name.
type JobKey = (Reference, String, String);

type Shard = Mutex<ShardData>;

/// Where a [`MemoryStore`] reads the time.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Records in process memory, lost when the process ends.
///
/// The map is split into 64 shards chosen by the key's first byte, each behind
/// its own mutex, so concurrent calls on different keys do not wait for each
/// other and no lock is ever held across an `.await`. A shard is a hash table
/// hashed by the key's first eight bytes (a reference starts with them), so
/// a record is found by its key or by its reference in one probe.
pub struct MemoryStore {
    shards: Arc<[Shard]>,
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
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
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

    /// An empty store whose time is tokio's: the time it was made, plus
    /// what `tokio::time::Instant` has advanced since. The executor reads
    /// tokio's clock too (the replay cache, the in-progress hints), and the
    /// store decides when a window, a lease and a retention end, so under
    /// tokio's paused time (`#[tokio::test(start_paused = true)]`, tokio's
    /// `test-util` feature, in a test's dev-dependencies)
    /// `tokio::time::advance` moves a tool past its window without waiting,
    /// and without a copy of the tool with a shorter one:
    ///
    /// ```ignore
    /// #[tokio::test(start_paused = true)]
    /// async fn a_charge_after_the_window_is_a_new_charge() {
    ///     let executor = Executor::new(Arc::new(MemoryStore::on_tokio_time()));
    ///     // call charge_card: charged once
    ///     tokio::time::advance(Duration::from_secs(15 * 60 + 1)).await;
    ///     // call charge_card again: charged a second time
    /// }
    /// ```
    ///
    /// Outside paused time it runs at the wall clock's pace, from the wall
    /// clock's reading when it was made.
    pub fn on_tokio_time() -> Self {
        let (wall, start) = (SystemTime::now(), tokio::time::Instant::now());
        Self::with_clock(move || wall + start.elapsed())
    }

    /// Another handle on this store's records (and follow-ons) that reads the
    /// time from `clock`: what one replica whose clock is its own sees of a
    /// shared store, as `SqliteStore` and `DynamoDbStore` replicas do. For
    /// simulations of clock skew.
    pub fn sharing_with_clock(
        &self,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> Self {
        MemoryStore {
            shards: self.shards.clone(),
            clock: Some(Arc::new(clock)),
        }
    }

    /// How many records the store holds, expired or not.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).records.len()).sum()
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

    fn shard(&self, first_byte: u8) -> std::sync::MutexGuard<'_, ShardData> {
        lock(&self.shards[first_byte as usize % SHARDS])
    }

    /// Applies `change` to the record if `attempt` owns it and it is in one
    /// of the states `from` ([`fence`]); otherwise `Fenced` or `WrongState`.
    fn fenced<R>(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        from: &[RecordStateKind],
        change: impl FnOnce(&mut ShardData, SystemTime) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let now = self.now();
        let mut shard = self.shard(key.key[0]);
        let found = shard.records.get(&key.key);
        fence(found.map(|r| (r.attempt, r.state.kind())), attempt, from)?;
        change(&mut shard, now)
    }

    /// [`fenced`](Self::fenced) from the one state `kind`, with the record
    /// to change.
    fn fenced_in<R>(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        kind: RecordStateKind,
        change: impl FnOnce(&mut Record, SystemTime) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.fenced(key, attempt, &[kind], |shard, now| {
            let record = shard.records.get_mut(&key.key).expect("checked by fenced");
            change(record, now)
        })
    }

    /// Applies `change` to the follow-on if `attempt` holds its lease; otherwise
    /// `Fenced`.
    fn fenced_job(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        change: impl FnOnce(&mut ShardData, &JobKey, SystemTime),
    ) -> Result<(), StoreError> {
        let now = self.now();
        let key = job_key(id);
        let mut shard = self.shard(id.reference.as_bytes()[0]);
        match shard.jobs.get(&key) {
            Some(job) if job.attempt == Some(attempt) => {
                change(&mut shard, &key, now);
                Ok(())
            }
            _ => Err(StoreError::Fenced),
        }
    }

    /// `complete` with its follow-ons, under the record's shard lock: both or
    /// neither. A plain function, so `complete` costs no second boxed
    /// future.
    fn completed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        // From any state but COMPLETED: a slow handler's truth wins over
        // what the sweep or a reconciler concluded.
        let from = [InProgress, Unknown, NotPerformed];
        self.fenced(key, attempt, &from, |shard, now| {
            let record = shard.records.get_mut(&key.key).expect("checked by fenced");
            record.state = RecordState::Completed {
                response: response.to_owned(),
            };
            record.updated_at = now;
            write_jobs(shard, key, jobs, now);
            Ok(())
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
            let shard = lock(shard);
            found.extend(
                shard
                    .records
                    .values()
                    .chain(shard.superseded.values())
                    .filter(|r| pick(r))
                    .map(Record::clone),
            );
        }
        // Ties in the order (records claimed at one instant) go by shard,
        // then key, as they did when shards were ordered maps: a listing
        // cut at `limit` keeps returning the same records.
        found.sort_by_cached_key(|r| (order(r), r.key.key[0] as usize % SHARDS, r.key.key));
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

fn unknown(record: &mut Record, note: &str, now: SystemTime) {
    record.state = RecordState::Unknown {
        note: note.to_owned(),
    };
    record.updated_at = now;
    record.next_check_at = now;
    record.checks = 0;
}

/// Writes `jobs` for `record` into its shard under its operation's
/// reference, due at once. A follow-on's identity is its operation's: one
/// completion per operation writes follow-ons, and a follow-on already there under the
/// same (tenant, reference, name) is never replaced, live or dead.
fn write_jobs(shard: &mut ShardData, key: &IdempotencyKey, jobs: FollowOns<'_>, now: SystemTime) {
    if jobs.is_empty() {
        return;
    }
    let Some(record) = shard.records.get(&key.key) else {
        return;
    };
    let (tenant, reference) = (record.tenant.clone(), record.reference);
    for job in jobs.iter() {
        let id = FollowOnId {
            tenant: tenant.clone(),
            reference,
            name: job.name().to_owned(),
        };
        shard.jobs.entry(job_key(&id)).or_insert(FollowOnRecord {
            id,
            payload: job.payload().to_owned(),
            runs: 0,
            earlier_runs: 0,
            attempt: None,
            next_run_at: now,
            last_error: None,
            error_before_redrive: None,
            dead: false,
            created_at: now,
            updated_at: now,
            delivered_at: None,
            kept_until: None,
        });
    }
}

fn job_key(id: &FollowOnId) -> JobKey {
    (id.reference, id.tenant.clone(), id.name.clone())
}

/// Whether a lease would find `job` at `now`.
fn is_due(job: &FollowOnRecord, now: SystemTime) -> bool {
    !job.dead && job.delivered_at.is_none() && job.next_run_at <= now
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let now = self.now();
        let mut shard = self.shard(req.key.key[0]);
        let ShardData {
            records,
            superseded,
            ..
        } = &mut *shard;
        let entry = records.entry(&req.key.key);
        let mut reference = req.reference;
        if let Entry::Occupied(existing) = &entry {
            let found = &existing.get().record;
            if !found.is_claimable(now) {
                let mut record = Record::clone(found);
                record.observed_at = now;
                return Ok(Claim::Existing { record });
            }
            reference = found.takeover_reference(req.reference, now);
            // A new operation takes the key; the one it replaces still
            // reads by its reference until its retention ends.
            if found.outlives_takeover(req.reference, now) {
                superseded.insert(found.reference, Record::clone(found));
            }
        }
        let deadlines = req.deadlines(now);
        let record = Record {
            key: req.key,
            reference,
            tenant: req.tenant.clone(),
            tool: req.tool.clone(),
            attempt: req.attempt,
            state: RecordState::InProgress,
            claimed_at: now,
            updated_at: now,
            lease_until: deadlines.lease_until,
            expires_at: deadlines.expires_at,
            retain_until: deadlines.retain_until,
            next_check_at: now,
            checks: 0,
            resolution: None,
            observed_at: now,
        };
        match entry {
            // Taken over: the expired record's box is reused.
            Entry::Occupied(mut existing) => *existing.get_mut().record = record,
            Entry::Vacant(place) => {
                place.insert(Slot {
                    prefix: reference.key_prefix(),
                    record: Box::new(record),
                });
            }
        }
        Ok(Claim::Claimed { reference })
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.completed(key, attempt, response, FollowOns::NONE)
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.fenced(key, attempt, &[InProgress, Unknown], |shard, _| {
            shard.records.remove(&key.key);
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
        let shard = self.shard(reference.as_bytes()[0]);
        let found = shard
            .records
            .with_prefix(reference.key_prefix())
            .find(|r| r.tenant == tenant && r.reference == *reference)
            .or_else(|| {
                shard
                    .superseded
                    .get(reference)
                    .filter(|r| r.tenant == tenant)
            })
            .map(|r| Record {
                observed_at: now,
                ..Record::clone(r)
            });
        Ok(found)
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

#[async_trait]
impl Upkeep for MemoryStore {
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
        if let Resolution::Completed { response } = resolution {
            return self
                .resolve_with_follow_ons(key, attempt, response, note, FollowOns::NONE)
                .await;
        }
        self.fenced_in(key, attempt, RecordStateKind::Unknown, |record, now| {
            record.state = match resolution {
                Resolution::Completed { .. } => unreachable!("resolved above"),
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
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::Unknown, |record, now| {
            if taken.is_some_and(|until| record.next_check_at != until) {
                return Ok(false);
            }
            record.next_check_at = now + delay;
            record.checks = record.checks.saturating_add(1);
            Ok(true)
        })
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.fenced_in(key, attempt, RecordStateKind::Unknown, |record, now| {
            if record.next_check_at > now {
                return Ok(None);
            }
            record.next_check_at = now + hold;
            Ok(Some(record.next_check_at))
        })
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let mut left = batch;
        // Records, then delivered follow-ons (kept until their record expires, so
        // they go in the same pass), one shard at a time: a batch never
        // holds more than one shard's lock.
        for shard in self.shards.iter() {
            if left == 0 {
                break;
            }
            let mut shard = lock(shard);
            shard.records.0.retain(|s| {
                let doomed = left > 0 && s.record.is_expired(now);
                left -= usize::from(doomed);
                !doomed
            });
            shard.superseded.retain(|_, r| {
                let doomed = left > 0 && r.is_expired(now);
                left -= usize::from(doomed);
                !doomed
            });
            shard.jobs.retain(|_, j| {
                let doomed = left > 0 && j.kept_until.is_some_and(|t| t <= now);
                left -= usize::from(doomed);
                !doomed
            });
        }
        Ok(batch - left)
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

#[async_trait]
impl Inspect for MemoryStore {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let newest_first = |r: &Record| std::cmp::Reverse(r.claimed_at);
        Ok(self.collect(filter.limit, |r| filter.matches(r), newest_first))
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let mut counts = StateCounts::default();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for record in shard.records.values().chain(shard.superseded.values()) {
                counts.add(record.state.kind(), 1);
            }
        }
        Ok(counts)
    }
}

#[async_trait]
impl FollowOnStore for MemoryStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.completed(key, attempt, response, jobs)
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.fenced(key, attempt, &[Unknown], |shard, now| {
            let record = shard.records.get_mut(&key.key).expect("checked by fenced");
            record.state = RecordState::Completed {
                response: response.to_owned(),
            };
            record.resolution = note.map(str::to_owned);
            record.updated_at = now;
            write_jobs(shard, key, jobs, now);
            Ok(())
        })
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let Some(names) = lease_names(names, limit) else {
            return Ok(Vec::new());
        };
        let now = self.now();
        // The due candidates, the longest due first, then each leased under
        // its shard's lock after a re-check: another dispatcher may have
        // leased it since the listing.
        let mut due = Vec::new();
        for shard in self.shards.iter() {
            due.extend(
                lock(shard)
                    .jobs
                    .iter()
                    .filter(|(_, j)| is_due(j, now) && names.contains(&j.id.name.as_str()))
                    .map(|(k, j)| (due_order(j), k.clone())),
            );
        }
        due.sort();
        let mut leased = Vec::new();
        for (_, job_key) in due {
            if leased.len() >= limit {
                break;
            }
            let mut shard = self.shard(job_key.0.as_bytes()[0]);
            let Some(job) = shard.jobs.get_mut(&job_key) else {
                continue;
            };
            if !is_due(job, now) {
                continue;
            }
            job.attempt = Some(attempt);
            job.runs = job.runs.saturating_add(1);
            job.next_run_at = now + lease;
            job.updated_at = now;
            leased.push(job.clone());
        }
        sort_leased(&mut leased);
        Ok(leased)
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        self.fenced_job(id, attempt, |shard, key, now| {
            // Kept as long as its operation's record (current or
            // superseded): until the record expires, or until the next
            // purge when it is gone already.
            let kept_until = shard
                .records
                .with_prefix(key.0.key_prefix())
                .find(|r| r.reference == key.0 && r.tenant == key.1)
                .or_else(|| shard.superseded.get(&key.0).filter(|r| r.tenant == key.1))
                .map_or(now, |r| r.retain_until);
            let job = shard.jobs.get_mut(key).expect("checked by fenced_job");
            job.attempt = None;
            job.delivered_at = Some(now);
            job.kept_until = Some(kept_until);
            job.updated_at = now;
        })
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.fenced_job(id, attempt, |shard, key, now| {
            let job = shard.jobs.get_mut(key).expect("checked by fenced_job");
            job.attempt = None;
            job.next_run_at = now + delay;
            job.last_error = Some(error.to_owned());
            job.updated_at = now;
        })
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        self.fenced_job(id, attempt, |shard, key, now| {
            let job = shard.jobs.get_mut(key).expect("checked by fenced_job");
            job.attempt = None;
            job.dead = true;
            job.last_error = Some(error.to_owned());
            job.updated_at = now;
        })
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let mut found: Vec<FollowOnRecord> = Vec::new();
        for shard in self.shards.iter() {
            found.extend(
                lock(shard)
                    .jobs
                    .values()
                    .filter(|j| filter.matches(j))
                    .cloned(),
            );
        }
        found.sort_by_key(listing_order);
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let now = self.now();
        let mut shard = self.shard(id.reference.as_bytes()[0]);
        match shard.jobs.get_mut(&job_key(id)) {
            Some(job) => Ok(job.redrive(now)),
            None => Ok(false),
        }
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let now = self.now();
        let mut counts = BTreeMap::new();
        for shard in self.shards.iter() {
            for job in lock(shard).jobs.values().filter(|j| is_due(j, now)) {
                *counts.entry(job.id.name.clone()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }
}
