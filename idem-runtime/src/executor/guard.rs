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
/// `watch_until`. A release that has not answered within a pause (or
/// twice the last answer's time) is joined by one more, at most two on
/// their way at once, and one that does not answer within a quarter of the
/// lease (at most [`MAX_WAIT`]) is given up: a stalled connection must not
/// hold the watch. Store errors
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
/// that is shorter) before it is given up.
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
///
/// One release is on its way at a time, the next a pause after the last
/// answer, except that a release that has not answered within its hedge
/// (a pause, or twice the last answer's time when that is longer) is
/// joined by one more: a release stalled on its connection must not hold
/// back the next, or a claim that lands meanwhile outlives its lease. At
/// most two are on their way at once, and a store that is slow for every
/// release is sent no more than one at a time, since the hedge grows with
/// its answers. A release is fenced by the attempt, so two in flight cannot
/// undo anything but this claim.
async fn retract(
    store: Arc<dyn IdempotencyStore>,
    key: IdempotencyKey,
    attempt: Attempt,
    watch_until: tokio::time::Instant,
    lease: Duration,
) {
    use tokio::time::Instant;
    let wait = MAX_WAIT.min(lease / 4).max(FIRST_PAUSE);
    let started = Instant::now();
    let watch = watch_until.saturating_duration_since(started);
    let max_pause = MAX_PAUSE.min(watch / 8).max(FIRST_PAUSE);
    let mut pause = FIRST_PAUSE;
    // When the next release is due with none on its way, and the time the
    // last answered release took.
    let mut due = started;
    let mut answered_in = Duration::ZERO;
    let mut in_flight = tokio::task::JoinSet::new();
    // The releases on their way: their task and when each was sent.
    let mut sent: Vec<(tokio::task::Id, Instant)> = Vec::with_capacity(2);
    loop {
        let next = match sent.as_slice() {
            [] => Some(due),
            [(_, first)] => Some(due.max(*first + pause.max(answered_in * 2))),
            _ => None,
        };
        // Biased, answers first: no random draw, so that a schedule on a
        // paused clock replays exactly.
        tokio::select! {
            biased;
            Some(joined) = in_flight.join_next_with_id() => {
                let id = match &joined {
                    Ok((id, _)) => *id,
                    Err(error) => error.id(),
                };
                let Some(at) = sent.iter().position(|(task, _)| *task == id) else {
                    continue;
                };
                let (_, asked) = sent.swap_remove(at);
                let now = Instant::now();
                // The next release a pause after this answer (or right at
                // `watch_until`), the pause doubling up to its most.
                due = if now < watch_until {
                    (now + pause).min(watch_until)
                } else {
                    now + pause
                };
                pause = (pause * 2).min(max_pause);
                // A panicked release counts as one that failed.
                let released = joined.map_or_else(
                    |_| Err(StoreError::Unavailable("the release panicked".into())),
                    |(_, released)| released,
                );
                match released {
                    // Released, or not there (yet): it never landed, or it
                    // is not ours to undo. Final only once the claim can no
                    // longer land.
                    Ok(()) | Err(StoreError::Fenced) | Err(StoreError::WrongState { .. }) => {
                        if asked >= watch_until {
                            return;
                        }
                        answered_in = now - asked;
                    }
                    // Misconfigured: no release will ever be accepted, and a
                    // claim refused so never landed.
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
            }
            () = sleep_until_some(next) => {
                let asked = Instant::now();
                let store = store.clone();
                let task = in_flight.spawn(async move {
                    let released = tokio::time::timeout(wait, store.release(&key, attempt)).await;
                    released.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable(
                            "the release did not answer in time".into(),
                        ))
                    })
                });
                sent.push((task.id(), asked));
                // The last release goes out right at `watch_until`, not a
                // whole pause after it.
                due = if asked < watch_until {
                    (asked + pause).min(watch_until)
                } else {
                    asked + pause
                };
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
