//! What idem counts and times, through the [`metrics`] facade (feature
//! `metrics`): the names and labels are written here once. Without the
//! feature every function is empty; with it and no recorder installed, each
//! is a load of the facade's global recorder and a call into its no-op.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `idem_calls_total` | counter | `tool`, `state` ([`AnswerState::as_str`]) |
//! | `idem_store_seconds` | histogram | `store` ([`IdempotencyStore::kind`]), `op` (`claim`, `complete`) |
//! | `idem_purged_total` | counter | |
//! | `idem_swept_total` | counter | |
//! | `idem_reconciled_total` | counter | `outcome` (`completed`, `not_performed`, `still_unknown`, `not_mine`, `checked_elsewhere`: another replica held the check) |
//! | `idem_resolved_by_hand_total` | counter | `outcome` (`completed`, `not_performed`) |
//! | `idem_outbox_enqueued_total` | counter | |
//! | `idem_outbox_jobs_total` | counter | `job`, `outcome` (`delivered`, `retried`, `buried`) |
//! | `idem_outbox_unhandled_jobs` | gauge | `job`: due follow-ons no handler of the dispatcher runs |
//! | `idem_replay_cache_total` | counter | `result` (`hit`, `miss`): repeats looked up in the replay cache |
//! | `idem_replay_cache_evicted_total` | counter | entries dropped to stay within the cache's budget |
//! | `idem_replay_cache_bytes` | gauge | the bytes the replay cache holds |
//! | `idem_client_key_new_key_repeats_total` | counter | `tool`: a call with a client key whose caller sent identical arguments under another client key inside the tool's window (a host that sends a fresh key per retry makes every retry a new operation) |
//!
//! [`IdempotencyStore::kind`]: crate::IdempotencyStore::kind

#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]

use std::time::Instant;

use crate::answer::AnswerState;

/// Identical arguments from one caller arrived under a new client key
/// inside `tool`'s window.
pub(crate) fn client_key_new_key_repeat(tool: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_client_key_new_key_repeats_total", "tool" => tool.to_owned())
        .increment(1);
}

/// One call of `tool` answered `state`.
///
/// The key of each (tool, state) is built once per thread and kept: the
/// `metrics` macros would build it for every call, with the label set and
/// the tool's name allocated and the key hashed, whether a recorder is
/// installed or not.
pub(crate) fn call(tool: &str, state: AnswerState) {
    #[cfg(feature = "metrics")]
    {
        use std::cell::RefCell;

        /// More (tool, state) pairs than a server is likely to answer with
        /// on one thread; past it the cache starts again.
        const KEPT: usize = 64;
        thread_local! {
            static KEYS: RefCell<Vec<(AnswerState, metrics::Key)>> = const { RefCell::new(Vec::new()) };
        }
        let build = || {
            metrics::Key::from_parts(
                "idem_calls_total",
                vec![
                    metrics::Label::new("tool", tool.to_owned()),
                    metrics::Label::from_static_parts("state", state.as_str()),
                ],
            )
        };
        let count = |key: &metrics::Key| {
            metrics::with_recorder(|r| r.register_counter(key, metadata())).increment(1)
        };
        KEYS.with(|keys| {
            // A recorder that counts a call from inside `register_counter`
            // finds the cache borrowed and builds its key afresh.
            let Ok(mut keys) = keys.try_borrow_mut() else {
                return count(&build());
            };
            let found = keys
                .iter()
                .position(|(s, key)| *s == state && tool_of(key) == Some(tool));
            let at = found.unwrap_or_else(|| {
                if keys.len() == KEPT {
                    keys.clear();
                }
                keys.push((state, build()));
                keys.len() - 1
            });
            count(&keys[at].1)
        });
    }
}

/// The value of a key's first label: the tool of an `idem_calls_total` key.
#[cfg(feature = "metrics")]
fn tool_of(key: &metrics::Key) -> Option<&str> {
    key.labels().next().map(metrics::Label::value)
}

/// The `metrics` macros' metadata of every metric here: its target and
/// module are this module.
#[cfg(feature = "metrics")]
fn metadata() -> &'static metrics::Metadata<'static> {
    static METADATA: metrics::Metadata<'static> =
        metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
    &METADATA
}

/// One store step (`op`: `claim`, `complete`) of `store`, begun at `started`.
pub(crate) fn store_step(store: &'static str, op: &'static str, started: Instant) {
    #[cfg(feature = "metrics")]
    record_step(&step_key(store, op), started.elapsed());
}

/// The key of `idem_store_seconds` for one step of one store.
#[cfg(feature = "metrics")]
fn step_key(store: &'static str, op: &'static str) -> metrics::Key {
    metrics::Key::from_parts(
        "idem_store_seconds",
        vec![
            metrics::Label::from_static_parts("store", store),
            metrics::Label::from_static_parts("op", op),
        ],
    )
}

/// A step under `key` that took `took`.
#[cfg(feature = "metrics")]
fn record_step(key: &metrics::Key, took: std::time::Duration) {
    metrics::with_recorder(|r| r.register_histogram(key, metadata())).record(took.as_secs_f64());
}

/// The store steps an executor times on every call, with their keys built
/// once for its store (see [`call`] on what building a key costs).
#[derive(Debug)]
pub(crate) struct StoreSteps {
    #[cfg(feature = "metrics")]
    claim: metrics::Key,
    #[cfg(feature = "metrics")]
    complete: metrics::Key,
}

/// A step [`StoreSteps`] times.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    Claim,
    Complete,
}

impl StoreSteps {
    pub(crate) fn new(store: &'static str) -> Self {
        StoreSteps {
            #[cfg(feature = "metrics")]
            claim: step_key(store, "claim"),
            #[cfg(feature = "metrics")]
            complete: step_key(store, "complete"),
        }
    }

    /// One `step`, begun at `started`: what [`store_step`] records.
    pub(crate) fn record(&self, step: Step, started: Instant) {
        // Without the `metrics` feature the clock is not read at all.
        #[cfg(feature = "metrics")]
        self.record_took(step, started.elapsed());
    }

    /// One `step` that took `took`, from clock readings the caller already
    /// had.
    pub(crate) fn record_took(&self, step: Step, took: std::time::Duration) {
        #[cfg(feature = "metrics")]
        record_step(
            match step {
                Step::Claim => &self.claim,
                Step::Complete => &self.complete,
            },
            took,
        );
    }
}

/// `n` expired records purged.
pub(crate) fn purged(n: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_purged_total").increment(n as u64);
}

/// `n` lapsed records swept to UNKNOWN.
pub(crate) fn swept(n: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_swept_total").increment(n as u64);
}

/// `n` UNKNOWN records a reconciler answered with `outcome`.
pub(crate) fn reconciled(outcome: &'static str, n: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_reconciled_total", "outcome" => outcome).increment(n as u64);
}

/// One record resolved by hand with `outcome`.
pub(crate) fn resolved_by_hand(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_resolved_by_hand_total", "outcome" => outcome).increment(1);
}

/// `n` follow-ons written with a completion or a resolution.
pub(crate) fn follow_ons_enqueued(n: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_enqueued_total").increment(n as u64);
}

/// One run of a follow-on named `job` ended with `outcome`.
pub(crate) fn outbox_job(job: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_jobs_total", "job" => job.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// `n` due follow-ons named `job` wait: the dispatcher has no handler for them.
pub(crate) fn outbox_unhandled(job: &str, n: u64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("idem_outbox_unhandled_jobs", "job" => job.to_owned()).set(n as f64);
}

/// A repeat looked up in the replay cache: answered from it (`hit`) or not.
pub(crate) fn replay_cache(hit: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_replay_cache_total", "result" => if hit { "hit" } else { "miss" })
        .increment(1);
}

/// An entry of the replay cache dropped to stay within its budget.
pub(crate) fn replay_cache_evicted() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_replay_cache_evicted_total").increment(1);
}

/// The replay cache holds `bytes` now.
pub(crate) fn replay_cache_bytes(bytes: usize) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("idem_replay_cache_bytes").set(bytes as f64);
}
