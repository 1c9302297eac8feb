//! The replay cache ([`Executor::with_replay_cache`](super::Executor::with_replay_cache)):
//! the responses of operations this executor saw completed, so that a
//! repeat within the window is answered without a store round trip (on
//! DynamoDB, a refused conditional write billed as a write).
//!
//! Like the running claims' table, it only ever answers what the store
//! would answer:
//! - an entry is added only once the store holds the operation COMPLETED
//!   with this response: after this executor's completion landed, or when
//!   the store answered a claim with the completed record;
//! - an entry answers only until the operation's window ends, counted from
//!   before the claim (or the replayed claim) was sent, on the process's
//!   monotonic clock: a store counts the window from the claim's arrival,
//!   which is later, so the entry never answers past the store's window,
//!   and a repeat after it asks the store, which starts a new operation;
//! - an entry answers only for the same key, the same fingerprint (the
//!   same arguments) and the same tenant; any other call asks the store.
//!
//! A COMPLETED record is final until its window ends (nothing resolves,
//! releases or purges it before), so an entry never goes stale. The cache
//! holds at most its byte budget (responses and tenants, plus a fixed
//! overhead per entry), split over shards; past it, the entry used least
//! recently in the shard goes first.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::key::{IdempotencyKey, Reference};
use crate::telemetry;

/// Shards, so that concurrent calls on different keys rarely share a lock.
const SHARDS: usize = 16;

/// What an entry costs besides its response and tenant: the key, the
/// fingerprint, the reference, the times and the maps' own slots.
pub(super) const ENTRY_OVERHEAD: usize = 160;

/// The completed responses, by key.
#[derive(Debug)]
pub(super) struct Replays {
    /// Each shard's budget in bytes.
    shard_budget: usize,
    /// How many entries exist: a lookup with none is one atomic load.
    entries: AtomicUsize,
    /// The bytes held, over every shard.
    bytes: AtomicUsize,
    /// The recency stamp of the next use.
    clock: AtomicU64,
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Debug, Default)]
struct Shard {
    by_key: HashMap<[u8; 32], Entry>,
    /// Keys by their last use, least recent first.
    by_use: BTreeMap<u64, [u8; 32]>,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    fingerprint: [u8; 32],
    tenant: Box<str>,
    reference: Reference,
    response: Arc<str>,
    /// When the operation's window ends at the earliest, on this clock.
    until: Instant,
    used: u64,
    size: usize,
}

impl Replays {
    /// A cache of at most `max_bytes`.
    pub(super) fn new(max_bytes: usize) -> Self {
        Replays {
            shard_budget: max_bytes / SHARDS,
            entries: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
            shards: Default::default(),
        }
    }

    fn shard(&self, key: &IdempotencyKey) -> MutexGuard<'_, Shard> {
        self.shards[key.key[0] as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The bytes held now.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// The response of `key`'s completed operation, for the same arguments
    /// and tenant, while its window runs.
    pub(super) fn get(&self, key: &IdempotencyKey, tenant: &str) -> Option<(Reference, Arc<str>)> {
        if self.entries.load(Ordering::Acquire) == 0 {
            telemetry::replay_cache(false);
            return None;
        }
        let mut shard = self.shard(key);
        let found = match shard.by_key.get(&key.key) {
            Some(e) if Instant::now() >= e.until => {
                self.remove(&mut shard, &key.key);
                None
            }
            Some(e) if e.fingerprint == key.fingerprint && *e.tenant == *tenant => {
                Some((e.reference, e.response.clone(), e.used))
            }
            _ => None,
        };
        let hit = found.map(|(reference, response, used)| {
            let now = self.clock.fetch_add(1, Ordering::Relaxed);
            shard.by_use.remove(&used);
            shard.by_use.insert(now, key.key);
            if let Some(e) = shard.by_key.get_mut(&key.key) {
                e.used = now;
            }
            (reference, response)
        });
        drop(shard);
        telemetry::replay_cache(hit.is_some());
        hit
    }

    /// Keeps `response`, the completed operation `reference` of `key` in
    /// `tenant`, until `until` (its window's end, counted from before its
    /// claim was sent). One too large for a shard's budget is not kept.
    pub(super) fn insert(
        &self,
        key: &IdempotencyKey,
        tenant: &str,
        reference: Reference,
        response: Arc<str>,
        until: Instant,
    ) {
        let size = response.len() + tenant.len() + ENTRY_OVERHEAD;
        if size > self.shard_budget || Instant::now() >= until {
            return;
        }
        let used = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(key);
        self.remove(&mut shard, &key.key);
        while shard.bytes + size > self.shard_budget {
            let Some((_, oldest)) = shard.by_use.pop_first() else {
                break;
            };
            self.remove(&mut shard, &oldest);
            telemetry::replay_cache_evicted();
        }
        shard.by_use.insert(used, key.key);
        shard.by_key.insert(
            key.key,
            Entry {
                fingerprint: key.fingerprint,
                tenant: tenant.into(),
                reference,
                response,
                until,
                used,
                size,
            },
        );
        shard.bytes += size;
        self.entries.fetch_add(1, Ordering::AcqRel);
        let bytes = self.bytes.fetch_add(size, Ordering::AcqRel) + size;
        telemetry::replay_cache_bytes(bytes);
    }

    /// Removes `key`'s entry from `shard`, if any.
    fn remove(&self, shard: &mut Shard, key: &[u8; 32]) {
        if let Some(e) = shard.by_key.remove(key) {
            shard.by_use.remove(&e.used);
            shard.bytes -= e.size;
            self.entries.fetch_sub(1, Ordering::AcqRel);
            let bytes = self.bytes.fetch_sub(e.size, Ordering::AcqRel) - e.size;
            telemetry::replay_cache_bytes(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::{Caller, Scope};

    fn key(tenant: &str, args: serde_json::Value) -> IdempotencyKey {
        let caller = Caller::new(tenant, "alice");
        IdempotencyKey::derive(
            &caller,
            "charge",
            &args,
            &Scope::Window(Duration::from_secs(60)),
        )
        .unwrap()
    }

    fn reference(key: &IdempotencyKey) -> Reference {
        Reference::new_operation(key)
    }

    #[tokio::test]
    async fn answers_within_the_window_only() {
        let cache = Replays::new(1 << 20);
        let k = key("acme", serde_json::json!({"amount": 1}));
        let until = Instant::now() + Duration::from_millis(200);
        cache.insert(&k, "acme", reference(&k), "\"ch_1\"".into(), until);
        assert_eq!(
            cache.get(&k, "acme").map(|(_, r)| r),
            Some("\"ch_1\"".into())
        );
        tokio::time::sleep_until(until).await;
        assert_eq!(cache.get(&k, "acme"), None, "the window ended");
        assert_eq!(cache.bytes(), 0, "and the entry went");
    }

    #[tokio::test]
    async fn answers_the_same_arguments_and_tenant_only() {
        let cache = Replays::new(1 << 20);
        let k = key("acme", serde_json::json!({"amount": 1}));
        let until = Instant::now() + Duration::from_secs(10);
        cache.insert(&k, "acme", reference(&k), "\"ch_1\"".into(), until);
        // The same key bytes with another fingerprint: other arguments
        // under one business key.
        let other_args = IdempotencyKey::from_parts(k.key, [7; 32]);
        assert_eq!(cache.get(&other_args, "acme"), None);
        assert_eq!(cache.get(&k, "globex"), None);
        assert!(cache.get(&k, "acme").is_some());
    }

    #[tokio::test]
    async fn holds_its_budget_and_drops_the_least_recently_used() {
        // One shard's budget is a sixteenth: three entries of ~260 bytes fit
        // in 16 × 800.
        let cache = Replays::new(16 * 800);
        let until = Instant::now() + Duration::from_secs(60);
        let response: Arc<str> = "x".repeat(90).into();
        // Keys of one shard (their first byte alike modulo 16).
        let mut keys = Vec::new();
        let mut n = 0;
        while keys.len() < 4 {
            let k = key("acme", serde_json::json!({ "n": n }));
            n += 1;
            if (k.key[0] as usize).is_multiple_of(SHARDS) {
                keys.push(k);
            }
        }
        for k in &keys[..3] {
            cache.insert(k, "acme", reference(k), response.clone(), until);
        }
        // The first is used again, so the second is the least recent.
        assert!(cache.get(&keys[0], "acme").is_some());
        cache.insert(
            &keys[3],
            "acme",
            reference(&keys[3]),
            response.clone(),
            until,
        );
        assert!(cache.get(&keys[1], "acme").is_none(), "evicted");
        for k in [&keys[0], &keys[2], &keys[3]] {
            assert!(cache.get(k, "acme").is_some());
        }
        assert!(cache.bytes() <= 800, "{}", cache.bytes());
    }
}
