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

/// Releases a claim whose answer never came (lost after the commit, or the
/// call dropped while it was in flight), unless disarmed: nothing ran under
/// it, so the retry the answer invites must find no orphan. The release is
/// fenced by the attempt (a claim that never landed answers `Fenced`, and
/// that is the end of it) and retried in the background, with backoff, until
/// the store answers; after [`GIVE_UP_AFTER`] the lease has long run out and
/// the sweep and reconciler own the record.
pub(super) struct ReleaseOnDrop<'a> {
    store: Option<&'a Arc<dyn IdempotencyStore>>,
    key: IdempotencyKey,
    attempt: Attempt,
}

/// How long the background release of an unconfirmed claim keeps trying.
const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

impl<'a> ReleaseOnDrop<'a> {
    pub(super) fn new(
        store: &'a Arc<dyn IdempotencyStore>,
        key: IdempotencyKey,
        attempt: Attempt,
    ) -> Self {
        ReleaseOnDrop {
            store: Some(store),
            key,
            attempt,
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
        rt.spawn(async move {
            let started = tokio::time::Instant::now();
            let mut pause = Duration::from_millis(50);
            loop {
                match store.release(&key, attempt).await {
                    // Released, or it never landed, or it is not ours to undo.
                    Ok(()) | Err(StoreError::Fenced) | Err(StoreError::WrongState { .. }) => {
                        return
                    }
                    Err(error) if started.elapsed() >= GIVE_UP_AFTER => {
                        tracing::error!(%key, %error,
                            "an unconfirmed claim could not be released; the sweep and the reconciler will resolve it");
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    }
}
