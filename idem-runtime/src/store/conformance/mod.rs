//! The store conformance suite: every [`IdempotencyStore`] must pass every
//! case, and a store of your own can run the same cases.
//!
//! Each case is a plain async function over `&dyn IdempotencyStore` that uses
//! fresh random keys and tenants, so cases can share one store and run in
//! parallel. Run them all with [`run_all`], or one test per case with
//! [`conformance_tests!`](crate::conformance_tests):
//!
//! ```ignore
//! // tests/my_store.rs, with idem-runtime's `conformance` feature on
//! idem_runtime::conformance_tests!(Some(my_store().await));
//! ```
//!
//! The expression is evaluated inside each test (it may `.await`) and gives
//! `Option<S>` where `S` derefs to a store (`Arc<MyStore>`, a guard that drops
//! a schema, ...); `None` skips the case, for a backend that is not
//! available here: say why on stderr, and fail instead under `CI=true`.
//!
//! The cases come in two lists: the records' ([`RECORD_CASES`]) and the
//! follow-ons', for follow-ons ([`FOLLOW_ON_CASES`]). The records' are
//! grouped as the contract is, by who calls the methods they hold, so a
//! failing case points at the trait to look in:
//!
//! - the call's steps ([`IdempotencyStore`]: `claim`, `heartbeat`,
//!   `complete`, `release`, `mark_unknown`, `lookup`), from
//!   [`claim_creates_in_progress`] to
//!   [`a_superseded_operation_reads_until_its_retention_ends`];
//! - upkeep ([`Upkeep`]: the sweep, the reconcilers' checks and
//!   resolutions, the purge), from [`lapsed_lease_is_listed_not_taken_over`]
//!   to [`late_truth_inside_the_window_holds_until_the_window_ends`];
//! - inspection ([`Inspect`]: `list_records`, `find_by_reference`,
//!   `count_records`), from [`a_reference_is_found_in_every_tenant`] to
//!   [`default_record_filter_lists_a_page`];
//!
//! and the follow-ons' hold [`FollowOnStore`]'s methods. A store that keeps no
//! follow-ons yet writes `conformance_tests!(make; follow_ons pending)`:
//! each follow-on test then passes only while its case fails with
//! `Unsupported` (it says `PENDING` on stderr) and fails once the case
//! passes, so the mark goes when the work is done.
//!
//! Beside the cases: [`claim_request`] and [`again`] build requests, and
//! [`FaultyStore`] wraps a store to inject faults.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Attempt, Claim, ClaimRequest, FollowOn, FollowOnFilter, FollowOnId, FollowOnRecord,
    FollowOnState, FollowOnStore, FollowOns, IdempotencyStore, Inspect, Limits, Reading, Record,
    RecordFilter, RecordState, RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};
use crate::key::{IdempotencyKey, Reference};

mod faults;
mod follow_ons;
mod inspect;
mod steps;
mod upkeep;

pub use faults::{Call, Fault, FaultPlan, FaultyStore};
pub use follow_ons::*;
pub use inspect::*;
pub use steps::*;
pub use upkeep::*;

fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&Attempt::random().get().to_le_bytes());
    }
    b
}

/// Restarts this thread's sequence of attempt tokens and reference tags from
/// `seed`, so that a simulation on a single-threaded runtime draws the same
/// tokens and references every time it replays a schedule. For tests only:
/// two threads seeded alike draw the same values.
pub fn seed_this_thread(seed: u64) {
    super::seed_this_thread(seed);
}

/// A claim request for a fresh random key in a fresh tenant, as the executor
/// makes one: a 30 s lease, `window`, and a retention of at least an hour.
pub fn claim_request(window: Duration) -> ClaimRequest {
    let key = IdempotencyKey::from_parts(random32(), random32());
    ClaimRequest {
        key,
        reference: Reference::new_operation(&key),
        tenant: format!("tenant-{}", Attempt::random().get()),
        tool: "charge_card".to_owned(),
        attempt: Attempt::random(),
        lease: Duration::from_secs(30),
        window,
        retention: window.max(Duration::from_secs(3600)),
    }
}

/// The same operation claimed again, with a new attempt. It offers the same
/// reference, so a lookup by `req.reference` finds the record whichever
/// claim holds it; [`new_operation`] offers another, as the executor does
/// for every call.
pub fn again(req: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        attempt: Attempt::random(),
        ..req.clone()
    }
}

/// The same key claimed again by another call: a new attempt offering a new
/// reference, as the executor's every claim does.
pub fn new_operation(req: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        attempt: Attempt::random(),
        reference: Reference::new_operation(&req.key),
        ..req.clone()
    }
}

fn fresh(window: Duration) -> ClaimRequest {
    claim_request(window)
}

use crate::future::join_all;

async fn record(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Option<Record> {
    store
        .lookup(&req.tenant, &req.reference)
        .await
        .expect("lookup")
}

async fn existing(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Record {
    match store.claim(req).await.expect("claim") {
        Claim::Existing { record, .. } => record,
        Claim::Claimed { .. } => panic!("expected the existing record, but the claim succeeded"),
    }
}

/// Claims `req`, which must win; the reference the operation runs under.
async fn claimed(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Reference {
    match store.claim(req).await.expect("claim") {
        Claim::Claimed { reference } => reference,
        Claim::Existing { record, .. } => panic!("expected a claim, found {record:?}"),
    }
}

/// The window of most cases.
const W: Duration = Duration::from_secs(900);

/// One conformance case: a function over a borrowed store.
pub type Case =
    for<'a> fn(&'a dyn IdempotencyStore) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The list of cases, written once; `$callback` is a `#[macro_export]`ed
/// macro of this crate, called with its arguments followed by the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_cases {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback!($($args)*
            // IdempotencyStore: the call's steps (steps.rs).
            claim_creates_in_progress,
            claim_of_live_record_returns_it,
            concurrent_claims_have_one_winner,
            complete_then_claim_returns_response,
            release_lets_next_claim_run,
            mark_unknown_keeps_record,
            stale_attempt_is_fenced,
            complete_accepted_from_unknown,
            completed_record_is_final,
            expired_completed_record_is_taken_over,
            claim_runs_under_the_offered_reference,
            a_claim_after_the_window_is_a_new_operation,
            not_performed_within_the_window_keeps_its_reference,
            not_performed_after_the_window_is_a_new_operation,
            a_record_reads_by_its_state_and_lease,
            unknown_record_outlives_window,
            heartbeat_extends_lease,
            lookup_is_scoped_to_tenant,
            existing_record_keeps_its_fingerprint,
            a_long_held_key_answers_replays_and_conflicts_until_it_ends,
            a_superseded_operation_reads_until_its_retention_ends,
            // Upkeep: the sweep, the reconcilers' checks and resolutions,
            // the purge (upkeep.rs).
            lapsed_lease_is_listed_not_taken_over,
            purge_deletes_expired_in_batches,
            expiry_sweep_and_purge,
            sweep_mark_rechecks_the_lease,
            unknown_records_are_listed_when_due,
            a_check_is_taken_by_one_replica,
            a_late_answer_leaves_the_next_check_alone,
            resolve_completed_from_unknown_only,
            not_performed_waits_for_settle,
            late_completion_wins_over_not_performed,
            late_truth_frees_the_key_after_the_window,
            late_truth_inside_the_window_holds_until_the_window_ends,
            // Inspect: an operator's reads (inspect.rs).
            a_reference_is_found_in_every_tenant,
            records_are_listed_by_filter_newest_first,
            records_are_counted_by_state,
            default_record_filter_lists_a_page,
        );
    };
}

/// The follow-ons' cases, written once, as
/// [`__idem_conformance_cases`] writes the records' cases: a store whose
/// follow-ons are still to come declares them pending
/// (`conformance_tests!(make; follow_ons pending)`).
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_follow_on_cases {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback!($($args)*
            follow_ons_are_written_with_the_completion,
            refused_completion_writes_no_follow_ons,
            repeated_follow_on_name_writes_nothing,
            resolution_writes_its_follow_ons,
            concurrent_leases_share_no_follow_on,
            lease_takes_only_its_names,
            lease_respects_its_limit,
            follow_on_changes_are_fenced_by_the_token,
            retried_follow_on_runs_again_after_its_delay,
            lapsed_follow_on_lease_is_taken_over,
            buried_follow_on_is_listed_and_redriven,
            follow_ons_are_listed_by_filter,
            a_later_operation_never_touches_an_earlier_operations_follow_ons,
            default_follow_on_filter_lists_a_page,
            finished_follow_on_is_kept_as_delivered,
            delivered_follow_on_is_purged_with_its_record,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_array {
    ($(#[$doc:meta])* $name:ident; $($case:ident),* $(,)?) => {
        $(#[$doc])*
        pub const $name: &[(&str, Case)] = &[
            $((stringify!($case), |store| Box::pin($case(store))),)*
        ];
    };
}

__idem_conformance_cases!(__idem_conformance_array!(
    /// The records' cases, by name, in the order [`run_all`] runs them.
    RECORD_CASES;
));
__idem_follow_on_cases!(__idem_conformance_array!(
    /// The follow-ons' cases, by name, in the order
    /// [`run_all`] runs them after [`RECORD_CASES`].
    FOLLOW_ON_CASES;
));

/// Every case, records' then follow-ons', by name.
pub fn cases() -> impl Iterator<Item = &'static (&'static str, Case)> {
    RECORD_CASES.iter().chain(FOLLOW_ON_CASES)
}

/// Runs every case, one after the other, on one store.
pub async fn run_all(store: &dyn IdempotencyStore) {
    for (_, case) in cases() {
        case(store).await;
    }
}

/// Runs the records' cases only, for a store whose follow-ons are still
/// to come; its test file declares the follow-ons' cases pending with
/// `conformance_tests!(make; follow_ons pending)`, which checks that they still
/// fail with `Unsupported`.
pub async fn run_all_but_follow_ons(store: &dyn IdempotencyStore) {
    for (_, case) in RECORD_CASES {
        case(store).await;
    }
}

/// Declares one `#[test]` per conformance case, each on a two-worker tokio
/// runtime. `$make` is an expression, evaluated inside the test (it may
/// `.await`), giving `Option<S>` where `S: Deref<Target = impl
/// IdempotencyStore>`: `None` when the backend is not available here and the
/// caller has already said why.
///
/// ```ignore
/// idem_runtime::conformance_tests!(Some(std::sync::Arc::new(idem_runtime::MemoryStore::new())));
/// ```
///
/// A store that does not keep follow-ons yet declares the follow-ons' cases
/// pending: `conformance_tests!(make; follow_ons pending)`. Each such test
/// passes only while its case fails with `StoreError::Unsupported` (and
/// says so on stderr), and fails once the case passes, so the store's author
/// removes `; follow_ons pending` when its follow-ons are done.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::__idem_conformance_cases!(__idem_conformance_test_fns!($make;));
        $crate::__idem_follow_on_cases!(__idem_conformance_test_fns!($make;));
    };
    ($make:expr; follow_ons pending) => {
        $crate::__idem_conformance_cases!(__idem_conformance_test_fns!($make;));
        $crate::__idem_follow_on_cases!(__idem_conformance_pending_fns!($make;));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_pending_fns {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let ran = ::std::panic::catch_unwind(|| {
                    $crate::store::conformance::block_on(async {
                        let Some(store) = $make else { return false };
                        $crate::store::conformance::$case(&*store).await;
                        true
                    })
                });
                $crate::store::conformance::pending(stringify!($case), ran);
            }
        )*
    };
}

/// The verdict on a case declared pending: it must still fail with
/// `Unsupported` (then it is reported pending on stderr); a case that passes
/// fails the test, so the pending mark is removed; any other failure is the
/// failure it is.
pub fn pending(case: &str, ran: std::thread::Result<bool>) {
    match ran {
        Ok(false) => {}
        Ok(true) => panic!(
            "conformance case `{case}` now passes on this store: remove `; follow_ons pending` from \
             its conformance_tests! call"
        ),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            if message.contains("Unsupported") {
                // To the process's stderr, past the test harness's capture:
                // a pending case must show in the log of a passing run.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "PENDING: conformance case `{case}`: this store does not keep follow-ons \
                     yet (StoreError::Unsupported)"
                );
            } else {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __idem_conformance_test_fns {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::store::conformance::block_on(async {
                    let Some(store) = $make else { return };
                    $crate::store::conformance::$case(&*store).await;
                });
            }
        )*
    };
}

/// Runs `work` on a fresh two-worker tokio runtime (what each generated test
/// does).
pub fn block_on<F: Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(work)
}
