//! The record of an operation and the store that keeps it: the store
//! contract, grouped by who calls it ([`IdempotencyStore`], the steps of a
//! call; [`Upkeep`], the maintenance loop's and reconcilers'; [`Inspect`],
//! an operator's reads; [`FollowOnStore`], the follow-ons), and its
//! backends one module each.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::key::{IdempotencyKey, Reference};

mod attempt;
mod fence;
pub(crate) mod follow_ons;
mod forward;
mod limits;
mod memory;
mod model;
pub(crate) use model::resolved_by;
mod open;
#[cfg(feature = "postgres")]
mod pause;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "conformance")]
pub(crate) use crate::random::seed_this_thread;
pub use crate::time::rfc3339;
pub use attempt::Attempt;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{
    DynamoDbStore, DynamoDbStoreBuilder, DYNAMODB_MAX_FOLLOW_ONS,
    TABLE_DEFINITION as DYNAMODB_TABLE_DEFINITION,
};
pub(crate) use fence::fence;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use fence::refusal;
pub(crate) use follow_ons::{due_order, lease_names, listing_order, sort_leased};
pub(crate) use follow_ons::{FollowOn, FollowOnError, DEFAULT_MAX_PAYLOAD};
pub use follow_ons::{FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnState, FollowOns};
pub use limits::{ItemLimit, Limits};
pub(crate) use limits::{JobTooLarge, Room};
pub use memory::MemoryStore;
pub use model::{
    Claim, ClaimRequest, CompletedBy, Deadlines, Reading, Record, RecordFilter, RecordState,
    RecordStateKind, Resolution, StateCounts, DEFAULT_LIST_LIMIT,
};
pub use open::open_store;
#[cfg(feature = "postgres")]
pub(crate) use pause::Pauses;
#[cfg(feature = "postgres")]
pub use pause::{PauseHook, PausePoint};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreBuilder};

/// The errors of a store. Backends map their own errors into these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or did not answer in time. Nothing was
    /// changed by this call, as far as the caller can tell.
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(String),
    /// The attempt no longer owns the record (or the record is gone): another
    /// claim took it over, or it was released, purged or reconciled.
    #[error("the claim was lost: the record belongs to another attempt or no longer exists")]
    Fenced,
    /// The record is in a state that does not allow this transition.
    #[error("the record is {found}, which does not allow this change")]
    WrongState {
        /// The state found.
        found: RecordStateKind,
    },
    /// The store does not implement this (optional) method: nothing was
    /// tried.
    #[error("the idempotency store cannot {0}")]
    Unsupported(&'static str),
    /// The store was configured wrongly (an invalid connection string or
    /// schema name): nothing was tried. Fix the configuration; retrying
    /// will not help.
    #[error("the idempotency store is misconfigured: {0}")]
    Config(String),
    /// The request itself was malformed (two follow-ons with one name):
    /// nothing was tried. Fix the call; retrying will not help.
    #[error("the idempotency store refused the request: {0}")]
    Invalid(String),
    /// The store answered, but with something it should not hold.
    #[error("the idempotency store holds an invalid record: {0}")]
    Corrupt(String),
    /// A not-performed resolution came too soon: the record changed less
    /// than the settle period ago, and a request still in flight may yet
    /// land at the processor. Nothing was changed; ask again after `until`.
    #[error("the record changed too recently to trust \"not performed\"; ask again later")]
    NotSettled {
        /// When the record will have been unchanged for the settle period
        /// (store clock).
        until: SystemTime,
    },
}

/// Where idempotency records live: the steps of one call, and the trait a
/// server holds its store by (`Arc<dyn IdempotencyStore>`).
///
/// The contract is grouped by who calls it, each group a trait a store
/// implements:
///
/// - this one, the executor's steps on a call's path: [`claim`], then
///   [`heartbeat`]s while the handler runs, then [`complete`], [`release`]
///   or [`mark_unknown`]; and [`lookup`] of an operation by its reference
///   (an MCP task's `tasks/get`). Beside them, what the store declares once,
///   read when an executor, a maintenance loop or a follow-on dispatcher is built: its
///   [`backend`](IdempotencyStore::backend) name, its
///   [`limits`](IdempotencyStore::limits) and its
///   [`follow_ons`](IdempotencyStore::follow_ons);
/// - [`Upkeep`], the steps of the maintenance loop and of reconcilers, off
///   the calls' path: the sweep of lapsed leases, the reconcilers' checks
///   and resolutions (and an operator's resolution by hand), the purge;
/// - [`Inspect`], an operator's snapshot reads (`idem list`, `idem show`,
///   `idem stats`), which change nothing.
///
/// `IdempotencyStore` requires the other two, so a `dyn IdempotencyStore`
/// offers every method of the three (on a concrete store, bring [`Upkeep`]
/// and [`Inspect`] into scope to call theirs). A store that also keeps follow-ons implements
/// [`FollowOnStore`] and returns itself from
/// [`follow_ons`](IdempotencyStore::follow_ons): the executor, the
/// maintenance loop and the follow-on dispatcher find out there, when they are built,
/// never at the first completion.
///
/// Every method is one atomic step against the store; none of them ever runs
/// the operation or calls back into user code. Times are the store's own clock
/// (a database's `now()` where there is one), so several processes with skewed
/// clocks agree on expiry and leases.
///
/// [`claim`]: IdempotencyStore::claim
/// [`heartbeat`]: IdempotencyStore::heartbeat
/// [`complete`]: IdempotencyStore::complete
/// [`release`]: IdempotencyStore::release
/// [`mark_unknown`]: IdempotencyStore::mark_unknown
/// [`lookup`]: IdempotencyStore::lookup
#[async_trait]
pub trait IdempotencyStore: Upkeep + Inspect + Send + Sync + std::fmt::Debug {
    /// A short, constant name of the backend (`memory`, `sqlite`,
    /// `postgres`, `redis`, `dynamodb`), the `store` label of the latency metrics.
    fn backend(&self) -> &'static str {
        "custom"
    }

    /// Claims the operation: atomically inserts an IN_PROGRESS record owned by
    /// `req.attempt` if none exists, or takes over the key of a record that
    /// no longer holds it ([`Record::is_claimable`]: COMPLETED past its
    /// window, NOT_PERFORMED, or UNKNOWN past its retention). Otherwise
    /// returns the existing record unchanged.
    ///
    /// A record taken over whose operation goes on under a new reference
    /// and whose retention has not ended ([`Record::outlives_takeover`]) is
    /// kept, in the same atomic step, as a superseded operation: `lookup`
    /// still finds it by its reference, as it was, until its retention
    /// ends. Any other record taken over is replaced whole.
    ///
    /// Never check-then-insert: two concurrent claims of one key yield exactly
    /// one `Claimed`. Errors: `Unavailable` (nothing claimed).
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Records the response: IN_PROGRESS, UNKNOWN or NOT_PERFORMED →
    /// COMPLETED, only if `attempt` still owns the record (a slow handler's
    /// truth wins over what the sweep or a reconciler concluded). The
    /// window's end (`expires_at`) is not moved: a completion that lands
    /// after it frees the key at once, and the record reads by its
    /// reference until its retention ends. Errors:
    /// `Fenced` when it does not (the record is left as it is), `WrongState`
    /// when it is already COMPLETED, `Unavailable`.
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError>;

    /// Deletes the record (nothing happened, a corrected call may run), only
    /// if `attempt` still owns it and it is IN_PROGRESS or UNKNOWN. Errors:
    /// `Fenced`, `WrongState` when COMPLETED, `Unavailable`.
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError>;

    /// Extends an IN_PROGRESS record's lease to `lease` from now (a heartbeat
    /// of a live handler), only if `attempt` still owns it. Errors: `Fenced`,
    /// `WrongState` when it is no longer IN_PROGRESS, `Unavailable`.
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError>;

    /// IN_PROGRESS → UNKNOWN with `note`, only if `attempt` still owns the
    /// record; its first check by a reconciler is due at once (`checks` 0).
    /// Errors: `Fenced`, `WrongState` when not IN_PROGRESS, `Unavailable`.
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError>;

    /// The record with this reference in this tenant, if any: the key's
    /// current record, or a superseded operation kept until its retention
    /// ends ([`Record::outlives_takeover`]). A record of another tenant is
    /// `None`, never returned. Expired records that purge has not deleted
    /// yet are still returned, as they are.
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError>;

    /// The store's follow-ons, when it keeps them: itself, as a
    /// [`FollowOnStore`]. `None` (the default) for a store that keeps no
    /// follow-ons: the executor then refuses a handler's declaration at once,
    /// while the handler can still act, and the follow-on dispatcher refuses to start.
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        None
    }

    /// What the store can hold in one write ([`Limits`]): its limit on a
    /// response, on one item, and on the follow-ons of one completion.
    /// [`Limits::NONE`] (the default) for a store without limits.
    ///
    /// The executor reads them when it is built, and judges each write
    /// against them before it is made, where it can be made before the
    /// handler's side effect, so that a write the store would refuse for
    /// its size is never sent.
    fn limits(&self) -> Limits {
        Limits::NONE
    }
}

/// The steps of upkeep: what the maintenance loop (sweep, reconcile, purge)
/// and reconcilers call, in rounds off the calls' path, and an operator's
/// resolution by hand (`idem resolve`).
///
/// The sweep lists lapsed leases ([`list_lapsed`](Upkeep::list_lapsed)) and
/// marks them UNKNOWN ([`mark_lapsed`](Upkeep::mark_lapsed)); a reconciler
/// lists the UNKNOWN records due a check
/// ([`list_unknown`](Upkeep::list_unknown)), takes each check
/// ([`take_check`](Upkeep::take_check)), and [`resolve`](Upkeep::resolve)s
/// the record or puts its next check off
/// ([`defer_check`](Upkeep::defer_check)); the purge deletes what has
/// expired ([`purge_expired`](Upkeep::purge_expired)). Every write checks
/// its own condition in its one atomic step, so two replicas' rounds may
/// overlap. Part of the store contract ([`IdempotencyStore`] requires it).
#[async_trait]
pub trait Upkeep: Send + Sync + std::fmt::Debug {
    /// The sweep's mark: IN_PROGRESS → UNKNOWN as [`mark_unknown`] does, but
    /// only if the lease has run out *at the time of the change* (store
    /// clock), checked in the same atomic step. A heartbeat that landed after
    /// the sweep listed the record wins: `Ok(false)`, nothing changed.
    /// Errors: `Fenced`, `WrongState` when not IN_PROGRESS, `Unavailable`.
    ///
    /// [`mark_unknown`]: IdempotencyStore::mark_unknown
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError>;

    /// Resolves an UNKNOWN record, only if `attempt` still owns it:
    /// to COMPLETED with a response, or to NOT_PERFORMED (which the next
    /// claim takes over). `note` (who resolved it and why: an operator's, or
    /// the reconciler's) is kept on the record.
    ///
    /// A not-performed resolution is accepted only for a record unchanged
    /// (`updated_at`) for at least its `settle` period, judged by the store's
    /// clock in the same atomic step: a request still in flight may not show
    /// at the processor yet. Errors: `NotSettled` (nothing changed),
    /// `Fenced`, `WrongState` when the record is not UNKNOWN, `Unavailable`.
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Puts off the next reconciler check of an UNKNOWN record: its
    /// `next_check_at` becomes now + `delay` (store clock) and `checks` grows
    /// by one.
    ///
    /// With `taken` (the hold's end a [`take_check`](Self::take_check)
    /// returned), only while that check is still the record's
    /// (`next_check_at` equal to it): once its hold ran out and another
    /// replica took the check, `Ok(false)`, nothing changed, so a late
    /// answer never makes the record due while another lookup is in flight.
    /// Without, always (`Ok(true)`). Errors: `Fenced`, `WrongState` when not
    /// UNKNOWN, `Unavailable`.
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError>;

    /// Takes the next reconciler check of an UNKNOWN record for this
    /// replica, so that one replica asks the processor and the others skip
    /// it: only if `attempt` owns the record, it is UNKNOWN and its check is
    /// due (`next_check_at <= now`, store clock), `next_check_at` becomes
    /// now + `hold`, in one atomic step. `checks` is left as it is (the
    /// [`defer_check`](Self::defer_check) after the answer counts it).
    /// `Ok(Some(until))`: taken, with the hold's end exactly as the store
    /// wrote it, for the deferral that answers this check. `Ok(None)`: the
    /// check is not due, so another replica holds it. Errors: `Fenced`,
    /// `WrongState` when not UNKNOWN, `Unavailable`.
    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError>;

    /// Deletes at most `batch` rows, records (current and superseded) that
    /// [`Record::is_expired`] first and then, on a store that keeps follow-ons, delivered follow-ons
    /// whose [`kept_until`](FollowOnRecord::kept_until) has passed (their record's
    /// expiry, so they go in the same purge pass as their record); returns
    /// how many of both. Call it in a loop until it returns less than
    /// `batch`. Each batch is its own short step, so claims are never held
    /// up for long.
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError>;

    /// At most `limit` IN_PROGRESS records whose lease ran out: their handler
    /// may have died mid-call. The sweep marks them UNKNOWN.
    ///
    /// On a store whose indexes are eventually consistent (DynamoDB's), a
    /// listing may trail the latest writes: a record just changed may be
    /// missing or listed as it was. Every write a listing leads to checks
    /// its own condition atomically ([`mark_lapsed`](Self::mark_lapsed),
    /// [`take_check`](Self::take_check)), so a stale entry changes nothing;
    /// a record missing now is listed by a later round.
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// At most `limit` UNKNOWN records whose next check is due
    /// (`next_check_at <= now`), the longest due first, for a reconciler.
    /// Records a reconciler cannot resolve are deferred with a backoff, so
    /// they never hide the others. It may trail the latest writes as
    /// [`list_lapsed`](Self::list_lapsed) may.
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError>;
}

/// An operator's reads: what `idem list`, `idem show` and `idem stats` (and
/// a dashboard of your own) call. Snapshot reads that change nothing, never
/// on the calls' path; each may read the whole store. Part of the store
/// contract ([`IdempotencyStore`] requires it).
#[async_trait]
pub trait Inspect: Send + Sync + std::fmt::Debug {
    /// At most `filter.limit` records that match `filter`, the newest claims
    /// (`claimed_at`) first, for an operator: the keys' current records and
    /// the superseded operations kept for their retention. Expired records
    /// that purge has not deleted yet may be returned, as they are.
    ///
    /// A snapshot read that changes nothing; not on the calls' path, and it
    /// may read the whole store (an index helps only the state filter).
    /// Errors: `Unavailable`.
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError>;

    /// The records with this reference in any tenant, for an operator who
    /// has a reference and not its tenant (`idem show REF`). References are
    /// drawn at random per operation, so this is almost always one record
    /// or none; two tenants' records can share one only by a deliberate
    /// copy, and the caller must then ask which tenant is meant. A snapshot
    /// read that changes nothing; not on the calls' path.
    ///
    /// The default reads every record through
    /// [`list_records`](crate::store::Inspect::list_records) and keeps those with
    /// `reference`: correct on any store, and as slow as a full listing. A
    /// store with an index by reference may answer from it instead.
    /// Errors: `Unavailable`.
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        let every = RecordFilter {
            limit: usize::MAX,
            ..RecordFilter::default()
        };
        let mut found = self.list_records(&every).await?;
        found.retain(|record| record.reference == *reference);
        Ok(found)
    }

    /// How many records the store holds in each state, superseded ones and
    /// expired ones that purge has not deleted yet included. A snapshot read that changes
    /// nothing, not on the calls' path; it may read the whole store.
    /// Errors: `Unavailable`.
    async fn count_records(&self) -> Result<StateCounts, StoreError>;
}

/// The follow-ons a store keeps beside its records (the follow-on dispatcher): written
/// with a completion in the same atomic step, leased to dispatchers with a
/// fencing token, retried, buried and re-driven. A capability of its own,
/// as object_store's `MultipartStore` is beside `ObjectStore`: a store that
/// keeps follow-ons implements every method and passes the follow-ons' conformance
/// cases, and says so from [`IdempotencyStore::follow_ons`].
#[async_trait]
pub trait FollowOnStore: IdempotencyStore {
    /// [`complete`](IdempotencyStore::complete) and, in the same atomic step
    /// (one transaction, one lock), one follow-on per entry of `jobs`,
    /// in the record's tenant under its reference, due at once with no
    /// runs. Either the record is COMPLETED and every follow-on is written, or
    /// nothing changed. Same fencing and states as `complete`.
    ///
    /// A follow-on's identity is (tenant, the operation's reference, name): one
    /// completion per operation writes follow-ons, and a follow-on that already exists
    /// under the same identity is never replaced, live or dead (a later
    /// operation of the same call has its own reference). `jobs` come with
    /// distinct names ([`FollowOns::new`]).
    ///
    /// Errors: `Fenced`, `WrongState`, `Unavailable`.
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError>;

    /// [`resolve`](crate::store::Upkeep::resolve) to COMPLETED with `response`
    /// (a reconciler or an operator found the operation performed) and, in
    /// the same atomic step, the follow-on `jobs`, as
    /// [`complete_with_follow_ons`](FollowOnStore::complete_with_follow_ons)
    /// writes them. Same fencing and states as `resolve`: only an UNKNOWN
    /// record, only for its attempt.
    ///
    /// Errors: `Fenced`, `WrongState`, `Unavailable`.
    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError>;

    /// Leases at most `limit` due follow-ons whose name is in `names`, the longest
    /// due first: live (neither dead nor delivered) follow-ons with `next_run_at <= now` (store
    /// clock), which covers a follow-on never run, a retry whose delay is over, and
    /// a follow-on whose last lease ran out (its dispatcher died or overran). Each
    /// leased follow-on gets `attempt`, `runs + 1`, and `next_run_at = now +
    /// lease`, and is returned as changed; the leased follow-ons come in the
    /// order [`list_follow_ons`](FollowOnStore::list_follow_ons) lists them.
    ///
    /// Atomic per follow-on: of two dispatchers leasing at once, exactly one gets a
    /// given follow-on, and until its lease runs out no other lease returns it (on
    /// PostgreSQL, `FOR UPDATE SKIP LOCKED`). A follow-on whose name is not in
    /// `names` is never leased: it waits for a dispatcher that handles it.
    /// Errors: `Unavailable` (nothing leased).
    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError>;

    /// The follow-on ran: delivered, only if `attempt` still holds its lease (or
    /// held the last one and nobody leased it since). Its lease is given up,
    /// `delivered_at` is now (store clock), `runs` stays the run that
    /// delivered it, and no lease finds it again. It is kept, for an
    /// operator asking whether it was delivered, until its operation's
    /// record expires (`kept_until`: the record's `retain_until`, current or
    /// superseded, or now when the record is gone), and purged with it
    /// ([`purge_expired`](crate::store::Upkeep::purge_expired)). Errors:
    /// `Fenced` when another lease took it, it is gone or already delivered
    /// (nothing changed), `Unavailable`.
    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError>;

    /// The follow-on failed and runs again later: its lease is given up, its
    /// `next_run_at` becomes now + `delay` (store clock) and `error` is kept
    /// as its `last_error`; fenced by `attempt` as
    /// [`finish_follow_on`](FollowOnStore::finish_follow_on). Errors: `Fenced`,
    /// `Unavailable`.
    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError>;

    /// The follow-on failed too often: into the dead letter (`dead`, its lease
    /// given up, `error` kept), where no lease finds it until it is
    /// re-driven; fenced by `attempt` as
    /// [`finish_follow_on`](FollowOnStore::finish_follow_on). Errors: `Fenced`,
    /// `Unavailable`.
    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError>;

    /// At most `filter.limit` follow-ons matching `filter`, the oldest first (then
    /// by reference and name), for an operator: waiting, running, dead and
    /// delivered ones ([`FollowOnFilter::states`]). A
    /// snapshot read that changes nothing; it may read every follow-on. Errors:
    /// `Unavailable`.
    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError>;

    /// Takes a dead follow-on out of the dead letter: live again, due now and
    /// unleased, its `runs` counted from 0 again and added to
    /// `earlier_runs`, its `last_error` kept as `error_before_redrive` (so
    /// a `last_error` is always a run's since the last re-drive), in one
    /// atomic write. `Ok(false)` when no dead follow-on has this id (a live or
    /// delivered one is left as it is). Errors: `Unavailable`.
    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError>;

    /// How many live follow-ons are due now (as [`lease_follow_ons`] would find them,
    /// whatever their name), by name: a dispatcher reports the names it has
    /// no handler for, whose follow-ons wait. A snapshot read. Errors:
    /// `Unavailable`.
    ///
    /// [`lease_follow_ons`]: FollowOnStore::lease_follow_ons
    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError>;
}

/// The record a completion or resolution writes to, as far as its size
/// goes ([`Limits::item`]): its tenant and tool, and the resolution note it
/// gets.
#[derive(Clone, Copy, Debug)]
struct Texts<'a> {
    tenant: &'a str,
    tool: &'a str,
    resolution: Option<&'a str>,
}

/// Whether the store can hold `response` and `jobs` in one completion, by
/// its declared [`Limits`] (and with `texts`, the record's and each follow-on's
/// item by [`Limits::item`]): `Invalid`, and nothing asked of the store,
/// when it cannot.
fn check_limits(
    store: &dyn IdempotencyStore,
    texts: Option<Texts<'_>>,
    response: &str,
    jobs: &[FollowOn],
) -> Result<(), StoreError> {
    let room = Room::of(store);
    let limits = room.limits();
    let limit = match texts {
        Some(t) => room.response(t.tenant, t.tool, t.resolution),
        None => limits.max_response_bytes,
    };
    if let Some(limit) = limit {
        if response.len() > limit {
            return Err(StoreError::Invalid(format!(
                "the response is {} bytes, over the {} store's limit of {limit} bytes for this \
                 record",
                response.len(),
                store.backend()
            )));
        }
    }
    if let Some(t) = texts {
        for job in jobs {
            let payload = job.payload().len();
            room.job(t.tenant.len(), job.name().len(), payload)
                .map_err(|e| e.refusal(job.name(), payload))?;
        }
    }
    if let (false, Some(_)) = (jobs.is_empty(), store.follow_ons()) {
        if let Some(limit) = limits.max_follow_ons_per_completion {
            if jobs.len() > limit {
                return Err(StoreError::Invalid(format!(
                    "{} follow-ons, over the {} store's limit of {limit} per completion",
                    jobs.len(),
                    store.backend()
                )));
            }
        }
        if let Some(limit) = limits.max_follow_on_bytes_per_completion {
            let total: usize = jobs.iter().map(|job| job.payload().len()).sum();
            if total > limit {
                return Err(StoreError::Invalid(format!(
                    "the follow-ons carry {total} bytes of payload, over the {} store's \
                     limit of {limit} bytes per completion",
                    store.backend()
                )));
            }
        }
    }
    Ok(())
}

/// [`IdempotencyStore::complete`], with the follow-on `jobs` in the same
/// step when there are any: on a store that keeps none, a completion with
/// follow-ons answers `Unsupported` and writes nothing; one past the store's
/// declared limits answers `Invalid` and writes nothing. The record's and
/// the follow-ons' items ([`Limits::item`]) are the caller's to
/// judge, before the side effect where it can: the executor does, with the
/// claim's tenant and tool, at each declaration and before the completion.
pub(crate) async fn complete_with_follow_ons(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    attempt: Attempt,
    response: &str,
    jobs: &[FollowOn],
) -> Result<(), StoreError> {
    check_limits(store, None, response, jobs)?;
    match (jobs.is_empty(), store.follow_ons()) {
        (true, _) => store.complete(key, attempt, response).await,
        (false, Some(store)) => {
            let jobs = FollowOns::new(jobs)?;
            store
                .complete_with_follow_ons(key, attempt, response, jobs)
                .await
        }
        (false, None) => Err(StoreError::Unsupported("write follow-ons")),
    }
}

/// [`Upkeep::resolve`] of `record` to COMPLETED, with the
/// follow-on `jobs` in the same step when there are any, as
/// [`complete_with_follow_ons`] writes them; the record (with its
/// resolution `note`) and each follow-on judged against the store's item too.
pub(crate) async fn resolve_with_follow_ons(
    store: &dyn IdempotencyStore,
    record: &Record,
    response: &str,
    note: Option<&str>,
    jobs: &[FollowOn],
) -> Result<(), StoreError> {
    let texts = Texts {
        tenant: &record.tenant,
        tool: &record.tool,
        resolution: note,
    };
    check_limits(store, Some(texts), response, jobs)?;
    let (key, attempt) = (&record.key, record.attempt);
    match (jobs.is_empty(), store.follow_ons()) {
        (true, _) => {
            let completed = Resolution::Completed { response };
            store.resolve(key, attempt, completed, note).await
        }
        (false, Some(store)) => {
            let jobs = FollowOns::new(jobs)?;
            store
                .resolve_with_follow_ons(key, attempt, response, note, jobs)
                .await
        }
        (false, None) => Err(StoreError::Unsupported("write follow-ons")),
    }
}
