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
//! | `idem_reconciled_total` | counter | `outcome` (`completed`, `not_performed`, `still_unknown`, `not_mine`) |
//! | `idem_resolved_by_hand_total` | counter | `outcome` (`completed`, `not_performed`) |
//! | `idem_outbox_enqueued_total` | counter | |
//! | `idem_outbox_jobs_total` | counter | `job`, `outcome` (`delivered`, `retried`, `buried`) |
//! | `idem_outbox_unhandled_jobs` | gauge | `job`: due jobs no handler of the dispatcher runs |
//!
//! [`IdempotencyStore::kind`]: crate::IdempotencyStore::kind

#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]

use std::time::Instant;

use crate::answer::AnswerState;

/// One call of `tool` answered `state`.
pub(crate) fn call(tool: &str, state: AnswerState) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_calls_total", "tool" => tool.to_owned(), "state" => state.as_str())
        .increment(1);
}

/// One store step (`op`: `claim`, `complete`) of `store`, begun at `started`.
pub(crate) fn store_step(store: &'static str, op: &'static str, started: Instant) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("idem_store_seconds", "store" => store, "op" => op)
        .record(started.elapsed().as_secs_f64());
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

/// `n` follow-on jobs written with a completion or a resolution.
pub(crate) fn follow_ons_enqueued(n: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_enqueued_total").increment(n as u64);
}

/// One run of a follow-on job named `job` ended with `outcome`.
pub(crate) fn outbox_job(job: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_jobs_total", "job" => job.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// `n` due jobs named `job` wait: the dispatcher has no handler for them.
pub(crate) fn outbox_unhandled(job: &str, n: u64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("idem_outbox_unhandled_jobs", "job" => job.to_owned()).set(n as f64);
}
