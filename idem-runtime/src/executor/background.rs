//! Completions written after the answer
//! ([`Executor::with_background_completions`]): the caller gets the
//! handler's result as soon as it returns, and the completion is written by
//! a task of its own, with retries, while the heartbeat keeps the lease.
//!
//! What may be lost, and what it costs: if this process dies (or the store
//! loses the write) before the completion lands, the record stays
//! IN_PROGRESS; with no heartbeat its lease runs out, the sweep marks it
//! UNKNOWN and the reconciler finds the effect. That is the end of a lost
//! asynchronous commit too: a reconcile, never a second run, because the
//! claim (the only write at-most-once rests on) was durable before the
//! handler started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::replay_cache::Replays;
use super::running::Completing;
use super::Executor;
use crate::key::{IdempotencyKey, Reference};
use crate::store::FollowOn;
use crate::store::{complete_with_follow_ons, Attempt, IdempotencyStore, StoreError};
use crate::telemetry::{self, Step};

/// How long a completion in the background keeps trying before it leaves
/// the record to the sweep and the reconciler (as an unconfirmed claim's
/// release does).
pub(super) const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

/// Whether this process runs where it is frozen once it has answered: AWS
/// Lambda, which sets `AWS_LAMBDA_RUNTIME_API` for its runtimes. A
/// completion written after the answer would not run there.
pub(super) fn frozen_after_answer() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some_and(|v| !v.is_empty())
}

/// Says, once per process, that background completions were asked for
/// under Lambda and are kept inline.
pub(super) fn say_refused_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "background completions are off: this process runs on AWS Lambda \
             (AWS_LAMBDA_RUNTIME_API is set), which freezes it after the answer, so a \
             completion written afterwards would be lost; every completion is written \
             before the answer instead"
        );
    });
}

/// The completions an executor (and its clones) is writing in the
/// background.
#[derive(Debug, Default)]
pub(super) struct Background {
    pending: AtomicUsize,
    /// Woken each time one ends.
    ended: Notify,
}

/// One completion in flight: counted until dropped.
struct InFlight(Arc<Background>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
        self.0.ended.notify_waiters();
    }
}

impl Background {
    /// How many completions are being written now.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Waits until none is pending or `timeout` passes; how many remain.
    pub(super) async fn drain(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ended = self.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let pending = self.pending();
            if pending == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.pending();
            }
        }
    }
}

/// What the task needs to write one completion.
pub(super) struct Completion {
    pub(super) key: IdempotencyKey,
    pub(super) reference: Reference,
    pub(super) attempt: Attempt,
    /// The response, shared with the table's entry.
    pub(super) response: Arc<str>,
    pub(super) jobs: Vec<FollowOn>,
    /// When the claim was sent: the heartbeats keep to its schedule.
    pub(super) sent: tokio::time::Instant,
    /// The table's entry that answers repeats with the response meanwhile.
    pub(super) entry: Completing,
    /// The replay cache, the tenant and the window's end, to keep the
    /// response in once the completion landed.
    pub(super) replay: Option<(Arc<Replays>, Box<str>, tokio::time::Instant)>,
}

impl Executor {
    /// Writes `completion` in a task of its own: retried (with backoff, for
    /// [`GIVE_UP_AFTER`]) while the store is unavailable, with the lease
    /// renewed on the claim's schedule until it lands.
    ///
    /// Without a runtime to spawn on (never the case inside a call) it is
    /// written here instead.
    pub(super) fn complete_in_background(&self, background: &Arc<Background>, c: Completion) {
        background.pending.fetch_add(1, Ordering::AcqRel);
        let in_flight = InFlight(background.clone());
        let (store, steps, lease) = (self.store.clone(), self.steps.clone(), self.lease);
        let task = async move {
            let _in_flight = in_flight;
            let write = write_until_landed(&*store, &steps, &c);
            let beat =
                super::execute::heartbeats(&*store, &c.key, c.reference, c.attempt, lease, c.sent);
            let written = tokio::select! {
                biased;
                written = write => written,
                () = beat => Written::NotLanded,
            };
            // Landed: the store holds it COMPLETED, and the replay cache may
            // answer with it from now on.
            if let (Written::Landed, Some((replays, tenant, until))) = (&written, &c.replay) {
                replays.insert(&c.key, tenant, c.reference, c.response.clone(), *until);
            }
            // The entry goes with the write: repeats now ask the store (or
            // the replay cache). A refused completion's entry goes before
            // the record is marked UNKNOWN, so that no repeat is answered
            // from it once the record says the response could not be
            // stored.
            drop(c.entry);
            if let Written::Refused(error) = written {
                super::mark_refused(&*store, &c.key, c.reference, c.attempt, error).await;
            }
        };
        tokio::spawn(task);
    }
}

/// How a background completion's write ended.
enum Written {
    /// The store holds it COMPLETED.
    Landed,
    /// The store cannot hold it, now or ever: the record is to be marked
    /// UNKNOWN with this reason.
    Refused(String),
    /// Settled otherwise, given up, or no longer this attempt's.
    NotLanded,
}

/// Writes the completion until it lands, is refused for good, or
/// [`GIVE_UP_AFTER`] passes.
async fn write_until_landed(
    store: &dyn IdempotencyStore,
    steps: &telemetry::StoreSteps,
    c: &Completion,
) -> Written {
    let first = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        let started = Instant::now();
        let written =
            complete_with_follow_ons(store, &c.key, c.attempt, &c.response, &c.jobs).await;
        steps.record(Step::Complete, started);
        let reference = c.reference;
        match written {
            Ok(()) => {
                if !c.jobs.is_empty() {
                    telemetry::follow_ons_enqueued(c.jobs.len());
                }
                return Written::Landed;
            }
            // An earlier try landed and its answer was lost, or the
            // reconciler resolved the record first: it is settled.
            Err(StoreError::WrongState { .. }) => return Written::NotLanded,
            // The store cannot hold it, now or ever: the record says so
            // rather than waiting for the sweep to call the process dead.
            Err(StoreError::Invalid(error)) => return Written::Refused(error),
            Err(error @ StoreError::Unavailable(_)) if first.elapsed() < GIVE_UP_AFTER => {
                tracing::warn!(%reference, %error, "completion write failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                // The side effect happened and the caller has its result;
                // the record stays IN_PROGRESS (or is no longer this
                // attempt's), and the sweep and the reconciler resolve it.
                tracing::error!(%reference, %error, "completion write failed after the side effect");
                return Written::NotLanded;
            }
        }
    }
}
