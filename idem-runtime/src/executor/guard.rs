//! What guards a claim and its handler: an unconfirmed claim released, a
//! dropped call marked UNKNOWN.

use std::sync::Arc;
use std::time::Duration;

use crate::answer::note;
use crate::key::{IdempotencyKey, Reference};
use crate::store::{Attempt, IdempotencyStore, StoreError};

/// Marks the record UNKNOWN, best effort: a failure is logged and the lease
/// still covers the record, so the sweep marks it later.
pub(super) async fn mark(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    reference: Reference,
    attempt: Attempt,
    note: &str,
) {
    if let Err(error) = store.mark_unknown(key, attempt, note).await {
        // The lease still covers the record: the sweep marks it later.
        tracing::error!(%reference, %error, "marking the record UNKNOWN failed");
    }
}

/// A completion the store refused as invalid (it cannot hold it, now or
/// ever) after the side effect: the record is marked UNKNOWN with a note
/// that says why, rather than left IN_PROGRESS for the sweep to call the
/// process dead. The inline and the background completion both end here.
pub(super) async fn mark_refused(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    reference: Reference,
    attempt: Attempt,
    error: String,
) {
    let note = crate::answer::note::refused(error);
    tracing::error!(%reference, %note, "completion refused after the side effect");
    mark(store, key, reference, attempt, &note).await;
}

/// Marks the record UNKNOWN if the call's future is dropped mid-handler (the
/// client went away, a timeout cancelled it): the side effect may be half done.
/// It borrows the store and clones the `Arc` only when it fires: a clone per
/// call would bounce the reference count between cores on the hot path.
pub(super) struct UnknownOnDrop<'a> {
    pub(super) store: Option<&'a Arc<dyn IdempotencyStore>>,
    pub(super) key: IdempotencyKey,
    pub(super) reference: Reference,
    pub(super) attempt: Attempt,
}

impl<'a> UnknownOnDrop<'a> {
    pub(super) fn disarm(&mut self) -> &'a Arc<dyn IdempotencyStore> {
        self.store.take().expect("disarmed once")
    }
}

impl Drop for UnknownOnDrop<'_> {
    fn drop(&mut self) {
        let Some(store) = self.store.take().cloned() else {
            return;
        };
        let (key, reference, attempt) = (self.key, self.reference, self.attempt);
        tracing::warn!(%reference, "call cancelled mid-handler; marking UNKNOWN");
        // Best effort: without a runtime the lease runs out and the sweep
        // marks the record.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                mark(&*store, &key, reference, attempt, note::CANCELLED).await;
            });
        }
    }
}

/// Retracts a claim whose answer never came (lost after the commit, given
/// up on by the store's client-side timeout, or the call dropped while it
/// was in flight), unless disarmed: nothing ran under it, and the caller is
/// told so, so the retry that answer invites must find no orphan.
///
/// A request the client stopped waiting for can still be applied by the
/// server (PostgreSQL finishes a statement that waited on a lock, Redis
/// runs a script already in its buffer, DynamoDB applies a request whose
/// answer was lost), so one release is not enough: "nothing ran" is final
/// only once the claim can no longer land. The guard keeps releasing,
/// fenced by the claim's attempt, until `watch_until`: the claim's own
/// lease counted from before it was sent. A claim that lands in that time
/// is deleted within a pause of its landing (at most [`MAX_PAUSE`], and an
/// eighth of the lease), and a repeat that meets it meanwhile reads it as
/// in progress, with a retry-after no later than its lease's end: at most
/// two leases after it was sent. The last release is sent at or after
/// `watch_until`. A release that does not answer within a quarter of the
/// lease (at most [`MAX_WAIT`]) is given up and sent again: a stalled
/// connection must not hold the watch. Store errors
/// are retried with backoff until the store answers, for at most
/// [`GIVE_UP_AFTER`], after which the sweep and the reconciler own whatever
/// is left.
pub(super) struct ReleaseOnDrop<'a> {
    store: Option<&'a Arc<dyn IdempotencyStore>>,
    key: IdempotencyKey,
    attempt: Attempt,
    watch_until: tokio::time::Instant,
    lease: Duration,
}

/// How long the background release of an unconfirmed claim keeps trying
/// while the store does not answer.
const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

/// The first pause between two releases of an unconfirmed claim; it
/// doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between two releases of an unconfirmed claim (an
/// eighth of the lease when that is shorter): how long a claim that landed
/// late stays at most before it is deleted. A repeat that meets it is told
/// to ask again in at least a second, by when it is gone.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The longest wait for one release's answer (a quarter of the lease when
/// that is shorter) before it is sent again.
const MAX_WAIT: Duration = Duration::from_secs(5);

impl<'a> ReleaseOnDrop<'a> {
    /// Guards the claim `attempt` of `key` with `lease`, sent at `sent`: it
    /// may land until `sent + lease`.
    pub(super) fn new(
        store: &'a Arc<dyn IdempotencyStore>,
        key: IdempotencyKey,
        attempt: Attempt,
        sent: tokio::time::Instant,
        lease: Duration,
    ) -> Self {
        ReleaseOnDrop {
            store: Some(store),
            key,
            attempt,
            watch_until: sent + lease,
            lease,
        }
    }

    pub(super) fn disarm(&mut self) {
        self.store = None;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        let Some(store) = self.store.take().cloned() else {
            return;
        };
        let (key, attempt) = (self.key, self.attempt);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(retract(store, key, attempt, self.watch_until, self.lease));
    }
}

/// [`ReleaseOnDrop`]'s watch: releases the claim `attempt` of `key` until a
/// release sent at or after `watch_until` has been answered.
async fn retract(
    store: Arc<dyn IdempotencyStore>,
    key: IdempotencyKey,
    attempt: Attempt,
    watch_until: tokio::time::Instant,
    lease: Duration,
) {
    let wait = MAX_WAIT.min(lease / 4).max(FIRST_PAUSE);
    let started = tokio::time::Instant::now();
    let watch = watch_until.saturating_duration_since(started);
    let max_pause = MAX_PAUSE.min(watch / 8).max(FIRST_PAUSE);
    let mut pause = FIRST_PAUSE;
    loop {
        let asked = tokio::time::Instant::now();
        let released = tokio::time::timeout(wait, store.release(&key, attempt)).await;
        let released = released.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the release did not answer in time".into(),
            ))
        });
        match released {
            // Released, or not there (yet): it never landed, or it is not
            // ours to undo. Final only once the claim can no longer land.
            Ok(()) | Err(StoreError::Fenced) | Err(StoreError::WrongState { .. }) => {
                if asked >= watch_until {
                    return;
                }
            }
            // Misconfigured: no release will ever be accepted, and a claim
            // refused so never landed.
            Err(error @ StoreError::Config(_)) => {
                tracing::error!(%key, %error,
                    "an unconfirmed claim cannot be released: the store is misconfigured");
                return;
            }
            Err(error) if started.elapsed() >= GIVE_UP_AFTER => {
                tracing::error!(%key, %error,
                    "an unconfirmed claim could not be released; the sweep and the reconciler will resolve it");
                return;
            }
            Err(_) => {}
        }
        // The last release goes out right at `watch_until`, not a whole
        // pause after it.
        let now = tokio::time::Instant::now();
        let wake = if now < watch_until {
            (now + pause).min(watch_until)
        } else {
            now + pause
        };
        tokio::time::sleep_until(wake).await;
        pause = (pause * 2).min(max_pause);
    }
}
