//! The claims this executor holds while their handlers run, so that a
//! repeat of one is answered "in progress" without a store round trip.
//!
//! The store stays the truth; this table only ever answers what the store
//! would answer, and only ever refuses (it never lets a call run):
//! - an entry exists only while this executor's handler runs under a claim
//!   the store granted it: it is added when the handler first waits (a
//!   handler that finishes at once is never entered) and removed as soon as
//!   the handler's future ends or is dropped, whether it returned, panicked
//!   or was cancelled, before its outcome is written, so a repeat that
//!   comes while the outcome is being written asks the store;
//! - an entry answers only until the lease its claim was granted runs out,
//!   counted from before the claim was sent on the store's timer (tokio's
//!   clock), so never past the store's own lease; the heartbeat's renewals
//!   are not followed, and a repeat after that asks the store;
//! - an entry answers only for the same key and the same fingerprint (the
//!   same arguments); a conflicting call asks the store, which says so.
//!
//! - with background completions on, an entry is added again once the
//!   handler returned, holding its response, and removed when the completion
//!   landed, failed for good or gave up: a repeat then is answered with the
//!   response (what the store will hold once the write lands), for at most
//!   the operation's window counted from the claim's send; after that
//!   it asks the store, as it would have had the completion landed then.
//!
//! Each [`Executor`](super::Executor) (and its clones) has its own table: it
//! is "this process" for the claims it made.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::{IdempotencyKey, Reference};
use crate::store::Attempt;

/// Shards, so that concurrent calls on different keys rarely share a lock.
const SHARDS: usize = 16;

/// The running claims, by key.
#[derive(Debug, Default)]
pub(super) struct RunningClaims {
    /// How many entries may exist: a lookup with none is one atomic load.
    held: AtomicUsize,
    shards: [Mutex<HashMap<[u8; 32], Held>>; SHARDS],
}

/// One running claim.
#[derive(Clone, Debug)]
struct Held {
    fingerprint: [u8; 32],
    /// The operation's reference, which a repeat is answered with.
    reference: Reference,
    attempt: Attempt,
    /// When its lease runs out at the latest, as the store counts it; for a
    /// completion in the background, when its window ends.
    until: Instant,
    /// The handler's response, once it returned and its completion is
    /// being written in the background.
    response: Option<Arc<str>>,
}

/// What the table knows of a key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// Its handler runs: the reference, and what remains of the lease.
    Running(Reference, Duration),
    /// Its handler returned this response, and the completion is being
    /// written in the background.
    Completing(Reference, Arc<str>),
}

impl RunningClaims {
    fn shard(&self, key: &IdempotencyKey) -> MutexGuard<'_, HashMap<[u8; 32], Held>> {
        self.shards[key.key[0] as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What this executor holds of `key` for the same arguments: a running
    /// claim whose lease still runs, or a response whose completion is being
    /// written and whose window still runs.
    pub(super) fn running(&self, key: &IdempotencyKey) -> Option<Found> {
        if self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        let held = self.shard(key).get(&key.key)?.clone();
        if held.fingerprint != key.fingerprint {
            return None;
        }
        let now = Instant::now();
        if now >= held.until {
            return None;
        }
        Some(match held.response {
            Some(response) => Found::Completing(held.reference, response),
            None => Found::Running(held.reference, held.until - now),
        })
    }

    /// Holds `response`, the handler's result under the claim `attempt` on
    /// `key`, while its completion is written in the background, until the
    /// returned entry is dropped or `until` (the window's end).
    pub(super) fn hold_completing(
        self: &Arc<Self>,
        key: IdempotencyKey,
        reference: Reference,
        attempt: Attempt,
        response: Arc<str>,
        until: Instant,
    ) -> Completing {
        self.insert(key, reference, attempt, until, Some(response));
        Completing {
            table: self.clone(),
            key,
            attempt,
        }
    }

    /// Holds the claim `attempt` on `key` until `until`, with the handler's
    /// `response` once there is one.
    fn insert(
        &self,
        key: IdempotencyKey,
        reference: Reference,
        attempt: Attempt,
        until: Instant,
        response: Option<Arc<str>>,
    ) {
        let held = Held {
            fingerprint: key.fingerprint,
            reference,
            attempt,
            until,
            response,
        };
        self.held.fetch_add(1, Ordering::AcqRel);
        self.shard(&key).insert(key.key, held);
    }

    /// Removes `key`'s entry if it is still the claim `attempt`'s (a later
    /// claim on the key may have replaced it).
    fn remove(&self, key: &IdempotencyKey, attempt: Attempt) {
        {
            let mut shard = self.shard(key);
            if shard
                .get(&key.key)
                .is_some_and(|held| held.attempt == attempt)
            {
                shard.remove(&key.key);
            }
        }
        self.held.fetch_sub(1, Ordering::AcqRel);
    }

    /// Drives `work`, the handler running under the claim `attempt` on
    /// `key` for the operation `reference`, with the claim in the table from
    /// its first wait until it ends or is dropped. `until` is when the
    /// claim's lease runs out at the latest.
    pub(super) async fn run<F: Future>(
        &self,
        key: IdempotencyKey,
        reference: Reference,
        attempt: Attempt,
        until: Instant,
        work: F,
    ) -> F::Output {
        let mut work = std::pin::pin!(work);
        let mut entry: Option<Entry<'_>> = None;
        std::future::poll_fn(|cx| {
            let polled = work.as_mut().poll(cx);
            if polled.is_pending() && entry.is_none() {
                entry = Some(self.hold(key, reference, attempt, until));
            }
            polled
        })
        .await
        // `entry` is dropped here, or with this future if it is dropped.
    }

    fn hold(
        &self,
        key: IdempotencyKey,
        reference: Reference,
        attempt: Attempt,
        until: Instant,
    ) -> Entry<'_> {
        self.insert(key, reference, attempt, until, None);
        Entry {
            table: self,
            key,
            attempt,
        }
    }
}

/// A running claim's place in the table, removed when dropped.
struct Entry<'a> {
    table: &'a RunningClaims,
    key: IdempotencyKey,
    attempt: Attempt,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.table.remove(&self.key, self.attempt);
    }
}

/// A response's place in the table while its completion is written in the
/// background, removed when dropped.
#[derive(Debug)]
pub(super) struct Completing {
    table: Arc<RunningClaims>,
    key: IdempotencyKey,
    attempt: Attempt,
}

impl Drop for Completing {
    fn drop(&mut self) {
        self.table.remove(&self.key, self.attempt);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::{Caller, Scope};

    fn key(args: serde_json::Value) -> IdempotencyKey {
        let caller = Caller::new("acme", "alice");
        IdempotencyKey::derive(
            &caller,
            "charge",
            &args,
            &Scope::BusinessKey(serde_json::json!("order-1")),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_waiting_handler_is_held_until_it_ends_and_only_for_its_arguments() {
        let table = Arc::new(RunningClaims::default());
        let k = key(serde_json::json!({"amount": 1}));
        let other = key(serde_json::json!({"amount": 2}));
        assert_eq!(k.key, other.key, "one business key");
        let until = Instant::now() + Duration::from_millis(300);
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let reference = Reference::new_operation(&k);
        let running = {
            let table = table.clone();
            tokio::spawn(async move {
                table
                    .run(k, reference, Attempt::from_stored(7), until, async {
                        wait.await.unwrap();
                        42
                    })
                    .await
            })
        };
        while table.held.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let Some(Found::Running(answered, left)) = table.running(&k) else {
            panic!("held while it runs");
        };
        assert_eq!(
            answered, reference,
            "a repeat is answered with the running operation's"
        );
        assert!(left <= Duration::from_millis(300), "{left:?}");
        assert_eq!(table.running(&other), None, "other arguments ask the store");
        tokio::time::sleep_until(until).await;
        assert_eq!(table.running(&k), None, "the lease ran out");
        go.send(()).unwrap();
        assert_eq!(running.await.unwrap(), 42);
        assert!(table.shard(&k).is_empty());
        assert_eq!(table.held.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_handler_done_at_once_is_never_entered_and_a_dropped_one_leaves() {
        let table = RunningClaims::default();
        let k = key(serde_json::json!({"amount": 1}));
        let until = Instant::now() + Duration::from_secs(30);
        assert_eq!(
            table
                .run(
                    k,
                    Reference::new_operation(&k),
                    Attempt::from_stored(1),
                    until,
                    async { 1 }
                )
                .await,
            1
        );
        assert_eq!(table.held.load(Ordering::SeqCst), 0);
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            table.run(
                k,
                Reference::new_operation(&k),
                Attempt::from_stored(2),
                until,
                std::future::pending::<()>(),
            ),
        )
        .await;
        assert!(cancelled.is_err());
        assert_eq!(table.running(&k), None);
        assert!(table.shard(&k).is_empty());
        assert_eq!(table.held.load(Ordering::SeqCst), 0);
    }
}
