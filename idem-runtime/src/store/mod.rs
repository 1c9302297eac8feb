//! The record of an operation and the store that keeps it: the
//! [`IdempotencyStore`] contract, and its backends one module each.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::key::{IdempotencyKey, Reference};

mod attempt;
mod memory;
mod open;
mod outbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "conformance")]
pub(crate) use attempt::seed_this_thread;
pub use attempt::Attempt;
pub use memory::MemoryStore;
pub use open::open_store;
pub(crate) use outbox::{check_distinct, listing_order};
pub use outbox::{
    is_valid_job_name, FollowOn, FollowOnError, JobFilter, JobId, OutboxJob, DEFAULT_MAX_PAYLOAD,
    MAX_JOB_NAME,
};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// What a claim asks the store to create.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The operation's key and fingerprint.
    pub key: IdempotencyKey,
    /// The reference the operation gets if this claim starts a new one
    /// (drawn by [`Reference::new_operation`]). A claim that takes over a
    /// NOT_PERFORMED record within its window continues that operation and
    /// keeps its reference instead ([`Record::takeover_reference`]).
    pub reference: Reference,
    /// The caller's tenant; lookups by reference are scoped to it.
    pub tenant: String,
    /// The tool's name, for status answers.
    pub tool: String,
    /// The fencing token this claim will own the record with.
    pub attempt: Attempt,
    /// How long the claim holds without a heartbeat.
    pub lease: Duration,
    /// How long a COMPLETED record answers repeats, counted from the claim.
    pub window: Duration,
    /// How long an IN_PROGRESS or UNKNOWN record is kept, counted from the
    /// claim (at least `window`): a charge that may have happened is not
    /// forgotten when the window ends.
    pub retention: Duration,
}

/// The state of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed; the handler is running (or died, once the lease ran out).
    InProgress,
    /// The handler finished; the response is kept for replays.
    Completed {
        /// The response exactly as it was first returned (JSON text).
        response: String,
    },
    /// Nobody knows whether the side effect happened; it must be reconciled.
    Unknown {
        /// Why the outcome is unknown.
        note: String,
    },
    /// Resolved as never having taken effect (by a reconciler or by hand):
    /// the next claim of the operation takes the record over and runs. Kept
    /// until its retention ends, so the status tool can say so.
    NotPerformed {
        /// How it was found not performed.
        note: String,
    },
}

impl RecordState {
    /// Which of the three states this is, without its payload.
    pub fn kind(&self) -> RecordStateKind {
        match self {
            RecordState::InProgress => RecordStateKind::InProgress,
            RecordState::Completed { .. } => RecordStateKind::Completed,
            RecordState::Unknown { .. } => RecordStateKind::Unknown,
            RecordState::NotPerformed { .. } => RecordStateKind::NotPerformed,
        }
    }

    /// `IN_PROGRESS`, `COMPLETED` or `UNKNOWN`.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// The state of a record without its payload: the one place the states'
/// names and their codes in the SQL stores' `state` column are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordStateKind {
    /// Claimed; the handler is running (or died, once the lease ran out).
    InProgress,
    /// The handler finished; the response is kept for replays.
    Completed,
    /// Nobody knows whether the side effect happened.
    Unknown,
    /// Resolved as never having taken effect; the next claim runs.
    NotPerformed,
}

impl RecordStateKind {
    /// Every kind, in code order.
    pub const ALL: [RecordStateKind; 4] = [
        RecordStateKind::InProgress,
        RecordStateKind::Completed,
        RecordStateKind::Unknown,
        RecordStateKind::NotPerformed,
    ];

    /// The name the status tool and the docs use: `IN_PROGRESS`,
    /// `COMPLETED`, `UNKNOWN` or `NOT_PERFORMED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordStateKind::InProgress => "IN_PROGRESS",
            RecordStateKind::Completed => "COMPLETED",
            RecordStateKind::Unknown => "UNKNOWN",
            RecordStateKind::NotPerformed => "NOT_PERFORMED",
        }
    }

    /// The code a SQL store keeps in its `state` column (0, 1, 2, 3). Stored
    /// data depends on these: they never change.
    pub const fn code(self) -> i16 {
        match self {
            RecordStateKind::InProgress => 0,
            RecordStateKind::Completed => 1,
            RecordStateKind::Unknown => 2,
            RecordStateKind::NotPerformed => 3,
        }
    }

    /// The kind with this code, if any.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|k| i64::from(k.code()) == code)
    }
}

impl fmt::Display for RecordStateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One operation's record, as a store holds it. The raw arguments are never
/// stored, only their fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Key and fingerprint.
    pub key: IdempotencyKey,
    /// The operation's public reference: drawn when the operation started,
    /// the same for every repeat within its life.
    pub reference: Reference,
    /// The caller's tenant.
    pub tenant: String,
    /// The tool's name.
    pub tool: String,
    /// The current claim's fencing token.
    pub attempt: Attempt,
    /// Where the record stands.
    pub state: RecordState,
    /// When the current claim was made (store clock).
    pub claimed_at: SystemTime,
    /// When the record last changed (store clock).
    pub updated_at: SystemTime,
    /// Until when the claim holds without a heartbeat.
    pub lease_until: SystemTime,
    /// When a COMPLETED record stops answering repeats.
    pub expires_at: SystemTime,
    /// When an IN_PROGRESS, UNKNOWN or NOT_PERFORMED record may be
    /// forgotten.
    pub retain_until: SystemTime,
    /// When a reconciler looks at an UNKNOWN record next (set when it
    /// becomes UNKNOWN, pushed back by [`IdempotencyStore::defer_check`]).
    pub next_check_at: SystemTime,
    /// How many times a reconciler looked at it without resolving it.
    pub checks: u32,
    /// Who resolved it by hand and why, when a person did.
    pub resolution: Option<String>,
    /// The store's clock when this copy was read: judge the lease against it.
    pub observed_at: SystemTime,
}

impl Record {
    /// The reference a claim that takes this record over at `now` runs
    /// under, when the claim offered `offered` for a new operation.
    ///
    /// A NOT_PERFORMED record whose window has not ended is the same
    /// operation, tried again: it keeps its reference, so a processor still
    /// dedupes a request of the first try that lands late. Anything else
    /// taken over (past its life) is a new operation with the new
    /// reference. Every store applies this rule in its claim.
    pub fn takeover_reference(&self, offered: Reference, now: SystemTime) -> Reference {
        match self.state {
            RecordState::NotPerformed { .. } if now < self.expires_at => self.reference,
            _ => offered,
        }
    }

    /// Whether a record is past its life at `now` (store clock), so that
    /// purge may delete it (and a new claim take it over). A COMPLETED record
    /// ends at `expires_at`; any other only at `retain_until` and once its
    /// lease ran out, because its side effect may have happened (or, for
    /// NOT_PERFORMED, so the status tool can still say it did not).
    pub fn is_expired(&self, now: SystemTime) -> bool {
        match self.state {
            RecordState::Completed { .. } => self.expires_at <= now,
            _ => self.retain_until <= now && self.lease_until <= now,
        }
    }

    /// Whether a new claim may take the record over at `now`: it expired,
    /// or it was resolved as not performed.
    pub fn is_claimable(&self, now: SystemTime) -> bool {
        matches!(self.state, RecordState::NotPerformed { .. }) || self.is_expired(now)
    }

    /// Whether the claim's lease ran out at `now` (store clock): the one
    /// test of a lapse, for a store listing lapsed records at its own `now`
    /// and for [`Record::reading`].
    pub fn lease_expired(&self, now: SystemTime) -> bool {
        self.lease_until <= now
    }

    /// How the record reads to a caller, judged at `observed_at` (the
    /// store's clock when it was read): the one judgement behind a repeat's
    /// answer, the status tool, `tasks/get` and the command line.
    ///
    /// An IN_PROGRESS record whose lease ran out reads as unknown: its
    /// process stopped renewing the lease and may have died mid-call, and
    /// "still running" would be said forever.
    pub fn reading(&self) -> Reading<'_> {
        match &self.state {
            RecordState::InProgress if !self.lease_expired(self.observed_at) => Reading::Running {
                retry_after: self
                    .lease_until
                    .duration_since(self.observed_at)
                    .unwrap_or_default(),
            },
            RecordState::InProgress => Reading::Unknown {
                note: LEASE_LAPSED,
                lapsed: true,
            },
            RecordState::Completed { response } => Reading::Completed { response },
            RecordState::Unknown { note } => Reading::Unknown {
                note,
                lapsed: false,
            },
            RecordState::NotPerformed { note } => Reading::NotPerformed { note },
        }
    }

    /// Whether the record, as read, is an IN_PROGRESS claim whose lease ran
    /// out ([`Reading::Unknown`] with `lapsed`).
    pub fn is_lapsed(&self) -> bool {
        matches!(self.reading(), Reading::Unknown { lapsed: true, .. })
    }
}

/// The note a lapsed IN_PROGRESS record reads with.
pub(crate) const LEASE_LAPSED: &str = "the call that claimed it stopped renewing its lease; \
                                       its process may have died mid-call";

/// How a record reads to a caller ([`Record::reading`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading<'r> {
    /// Its handler is running, and its lease holds for `retry_after` more.
    Running {
        /// What remains of the lease.
        retry_after: Duration,
    },
    /// It completed: repeats replay `response`.
    Completed {
        /// The response exactly as it was first returned (JSON text).
        response: &'r str,
    },
    /// Nobody knows whether it took effect: it is UNKNOWN, or its claim's
    /// lease ran out while it was IN_PROGRESS (`lapsed`). It must be
    /// reconciled before it can run again.
    Unknown {
        /// Why the outcome is unknown.
        note: &'r str,
        /// Whether it is an IN_PROGRESS record whose lease ran out (not yet
        /// marked UNKNOWN by the sweep).
        lapsed: bool,
    },
    /// It did not take effect; the next claim runs it.
    NotPerformed {
        /// How it was found not performed.
        note: &'r str,
    },
}

/// What a claim found.
// A record is returned by value: a repeat is rarer than a first call and the
// enum only ever lives on the stack of one claim.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The record was created (or an expired one taken over): the caller owns
    /// it with the request's attempt and must now run the operation, under
    /// `reference`: the request's own for a new operation, the record's for
    /// a NOT_PERFORMED one taken over within its window.
    Claimed {
        /// The reference the operation runs under.
        reference: Reference,
    },
    /// A live record exists; nothing was changed. Its `observed_at` is the
    /// store's clock at the time of the read, to judge the lease against.
    Existing {
        /// The record as found.
        record: Record,
    },
}

/// How an UNKNOWN record is resolved ([`IdempotencyStore::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// It happened: COMPLETED, and repeats replay `response` (JSON text,
    /// exactly what the tool would have returned).
    Completed {
        /// The response to store.
        response: &'a str,
    },
    /// It did not happen: NOT_PERFORMED with `note`, and the next claim of
    /// the operation runs. Accepted only once the record has been unchanged
    /// for `settle`.
    NotPerformed {
        /// How it was found not performed.
        note: &'a str,
        /// How long the record must have been unchanged.
        settle: Duration,
    },
}

/// The `limit` of a default [`RecordFilter`] or [`JobFilter`]: a page of 100.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// Which records [`IdempotencyStore::list_records`] returns: every field
/// that is set must match; the newest claims come first, at most `limit`.
/// `RecordFilter::default()` matches every record and lists the newest
/// [`DEFAULT_LIST_LIMIT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFilter {
    /// Only records in this state, as stored (an IN_PROGRESS record whose
    /// lease ran out is still IN_PROGRESS here; [`Record::is_lapsed`] tells).
    pub state: Option<RecordStateKind>,
    /// Only this tenant's records.
    pub tenant: Option<String>,
    /// Only this tool's records.
    pub tool: Option<String>,
    /// The most records returned: [`DEFAULT_LIST_LIMIT`] (100) by default;
    /// `0` returns none.
    pub limit: usize,
}

impl Default for RecordFilter {
    /// Every record, the newest [`DEFAULT_LIST_LIMIT`].
    fn default() -> Self {
        RecordFilter {
            state: None,
            tenant: None,
            tool: None,
            limit: DEFAULT_LIST_LIMIT,
        }
    }
}

/// How many records a store holds in each state
/// ([`IdempotencyStore::count_records`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// IN_PROGRESS records (running, or lapsed).
    pub in_progress: u64,
    /// COMPLETED records.
    pub completed: u64,
    /// UNKNOWN records: each one waits for a reconciler or a person.
    pub unknown: u64,
    /// NOT_PERFORMED records.
    pub not_performed: u64,
}

impl StateCounts {
    /// The count of one state.
    pub fn get(&self, kind: RecordStateKind) -> u64 {
        match kind {
            RecordStateKind::InProgress => self.in_progress,
            RecordStateKind::Completed => self.completed,
            RecordStateKind::Unknown => self.unknown,
            RecordStateKind::NotPerformed => self.not_performed,
        }
    }

    /// Adds `n` to the count of `kind`.
    pub fn add(&mut self, kind: RecordStateKind, n: u64) {
        match kind {
            RecordStateKind::InProgress => self.in_progress += n,
            RecordStateKind::Completed => self.completed += n,
            RecordStateKind::Unknown => self.unknown += n,
            RecordStateKind::NotPerformed => self.not_performed += n,
        }
    }

    /// All records.
    pub fn total(&self) -> u64 {
        RecordStateKind::ALL.iter().map(|&k| self.get(k)).sum()
    }
}

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
    /// The request itself was malformed (two follow-on jobs with one name):
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

/// Where idempotency records live, and the follow-on jobs written with them.
///
/// Every method is one atomic step against the store; none of them ever runs
/// the operation or calls back into user code. Times are the store's own clock
/// (a database's `now()` where there is one), so several processes with skewed
/// clocks agree on expiry and leases.
///
/// The follow-on jobs' methods (from [`supports_follow_ons`] on) are
/// provided, answering `Unsupported`, so a store written before them still
/// compiles; a store that keeps jobs implements all of them and passes the
/// outbox's conformance cases.
///
/// [`supports_follow_ons`]: IdempotencyStore::supports_follow_ons
#[async_trait]
pub trait IdempotencyStore: Send + Sync + std::fmt::Debug {
    /// A short, constant name of the backend (`memory`, `sqlite`,
    /// `postgres`, `redis`), the `store` label of the latency metrics.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Claims the operation: atomically inserts an IN_PROGRESS record owned by
    /// `req.attempt` if none exists, or takes over a record that
    /// [`Record::is_claimable`] (expired, or NOT_PERFORMED; a new claim
    /// replaces it whole). Otherwise returns the existing record unchanged.
    ///
    /// Never check-then-insert: two concurrent claims of one key yield exactly
    /// one `Claimed`. Errors: `Unavailable` (nothing claimed).
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Records the response: IN_PROGRESS, UNKNOWN or NOT_PERFORMED →
    /// COMPLETED, only if `attempt` still owns the record (a slow handler's
    /// truth wins over what the sweep or a reconciler concluded). Errors:
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

    /// IN_PROGRESS → UNKNOWN with `note`, only if `attempt` still owns the
    /// record; its first check by a reconciler is due at once (`checks` 0).
    /// Errors: `Fenced`, `WrongState` when not IN_PROGRESS, `Unavailable`.
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError>;

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
    /// claim takes over). `note` (who resolved it and why, for a resolution
    /// by hand) is kept on the record.
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
    /// by one. Errors: `Fenced`, `WrongState` when not UNKNOWN,
    /// `Unavailable`.
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError>;

    /// Extends an IN_PROGRESS record's lease to `lease` from now (a heartbeat
    /// of a live handler), only if `attempt` still owns it. Errors: `Fenced`,
    /// `WrongState` when it is no longer IN_PROGRESS, `Unavailable`.
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError>;

    /// The record with this reference in this tenant, if any. A record of
    /// another tenant is `None`, never returned. Expired records that purge has
    /// not deleted yet are still returned, as they are.
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError>;

    /// Deletes at most `batch` records that [`Record::is_expired`]; returns how
    /// many. Call it in a loop until it returns less than `batch`. Each batch
    /// is its own short step, so claims are never held up for long.
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError>;

    /// At most `limit` IN_PROGRESS records whose lease ran out: their handler
    /// may have died mid-call. The sweep marks them UNKNOWN.
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// At most `limit` UNKNOWN records whose next check is due
    /// (`next_check_at <= now`), the longest due first, for a reconciler.
    /// Records a reconciler cannot resolve are deferred with a backoff, so
    /// they never hide the others.
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// At most `filter.limit` records that match `filter`, the newest claims
    /// (`claimed_at`) first, for an operator. Expired records that purge has
    /// not deleted yet may be returned, as they are.
    ///
    /// A snapshot read that changes nothing; not on the calls' path, and it
    /// may read the whole store (an index helps only the state filter).
    /// Provided so existing stores compile: the default answers
    /// `Unsupported`. Errors: `Unavailable`.
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let _ = filter;
        Err(StoreError::Unsupported("list its records"))
    }

    /// How many records the store holds in each state, expired ones that
    /// purge has not deleted yet included. A snapshot read that changes
    /// nothing, not on the calls' path; it may read the whole store. The
    /// default answers `Unsupported`. Errors: `Unavailable`.
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        Err(StoreError::Unsupported("count its records"))
    }

    /// Whether the store keeps follow-on jobs (implements
    /// [`complete_with_follow_ons`] and the dispatcher's methods below). The
    /// executor refuses a declaration at once when it does not, so a handler
    /// learns it while it can still act. The default answers `false`.
    ///
    /// [`complete_with_follow_ons`]: IdempotencyStore::complete_with_follow_ons
    fn supports_follow_ons(&self) -> bool {
        false
    }

    /// [`complete`](IdempotencyStore::complete) and, in the same atomic step
    /// (one transaction, one lock), one follow-on job per entry of `jobs`,
    /// in the record's tenant under its reference, due at once with no
    /// attempts. Either the record is COMPLETED and every job is written, or
    /// nothing changed. Same fencing and states as `complete`.
    ///
    /// A job whose (tenant, reference, name) already exists (left by an
    /// earlier operation with the same reference, after its window) is
    /// replaced whole: a new operation starts its jobs afresh.
    ///
    /// Errors: `Invalid` when two jobs share a name (nothing written),
    /// `Fenced`, `WrongState`, `Unavailable`. The default completes when
    /// `jobs` is empty and otherwise answers `Unsupported` without writing.
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            return self.complete(key, attempt, response).await;
        }
        Err(StoreError::Unsupported("write follow-on jobs"))
    }

    /// [`resolve`](IdempotencyStore::resolve) to COMPLETED with `response`
    /// (a reconciler or an operator found the operation performed) and, in
    /// the same atomic step, the follow-on `jobs`, as
    /// [`complete_with_follow_ons`](IdempotencyStore::complete_with_follow_ons)
    /// writes them. Same fencing and states as `resolve`: only an UNKNOWN
    /// record, only for its attempt.
    ///
    /// Errors: `Invalid` (a repeated name), `Fenced`, `WrongState`,
    /// `Unavailable`. The default resolves when `jobs` is empty and otherwise
    /// answers `Unsupported` without writing.
    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            let completed = Resolution::Completed { response };
            return self.resolve(key, attempt, completed, note).await;
        }
        Err(StoreError::Unsupported("write follow-on jobs"))
    }

    /// Leases at most `limit` due jobs whose name is in `names`, the longest
    /// due first: live (not dead) jobs with `next_run_at <= now` (store
    /// clock), which covers a job never run, a retry whose delay is over, and
    /// a job whose last lease ran out (its dispatcher died or overran). Each
    /// leased job gets `token`, `attempts + 1`, and `next_run_at = now +
    /// lease`, and is returned as changed.
    ///
    /// Atomic per job: of two dispatchers leasing at once, exactly one gets a
    /// given job, and until its lease runs out no other lease returns it (on
    /// PostgreSQL, `FOR UPDATE SKIP LOCKED`). A job whose name is not in
    /// `names` is never leased: it waits for a dispatcher that handles it.
    /// Errors: `Unavailable` (nothing leased). The default answers
    /// `Unsupported`.
    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<OutboxJob>, StoreError> {
        let _ = (names, limit, lease, token);
        Err(StoreError::Unsupported("lease follow-on jobs"))
    }

    /// The job ran: deletes it, only if `token` still holds its lease (or
    /// held the last one and nobody leased it since). Errors: `Fenced` when
    /// another lease took it or it is gone (nothing changed), `Unavailable`.
    /// The default answers `Unsupported`.
    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        let _ = (id, token);
        Err(StoreError::Unsupported("finish follow-on jobs"))
    }

    /// The job failed and runs again later: its lease is given up, its
    /// `next_run_at` becomes now + `delay` (store clock) and `error` is kept
    /// as its `last_error`; fenced by `token` as
    /// [`finish_job`](IdempotencyStore::finish_job). Errors: `Fenced`,
    /// `Unavailable`. The default answers `Unsupported`.
    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let _ = (id, token, delay, error);
        Err(StoreError::Unsupported("retry follow-on jobs"))
    }

    /// The job failed too often: into the dead letter (`dead`, its lease
    /// given up, `error` kept), where no lease finds it until it is
    /// re-driven; fenced by `token` as
    /// [`finish_job`](IdempotencyStore::finish_job). Errors: `Fenced`,
    /// `Unavailable`. The default answers `Unsupported`.
    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        let _ = (id, token, error);
        Err(StoreError::Unsupported("bury follow-on jobs"))
    }

    /// At most `filter.limit` jobs matching `filter`, the oldest first (then
    /// by reference and name), for an operator: live and dead ones. A
    /// snapshot read that changes nothing; it may read every job. Errors:
    /// `Unavailable`. The default answers `Unsupported`.
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<OutboxJob>, StoreError> {
        let _ = filter;
        Err(StoreError::Unsupported("list follow-on jobs"))
    }

    /// Takes a dead job out of the dead letter: live again, due now, with
    /// no attempts (its `last_error` kept). `Ok(false)` when no dead job has
    /// this id (a live one is left as it is). Errors: `Unavailable`. The
    /// default answers `Unsupported`.
    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        let _ = id;
        Err(StoreError::Unsupported("re-drive follow-on jobs"))
    }

    /// How many live jobs are due now (as [`lease_jobs`] would find them,
    /// whatever their name), by name: a dispatcher reports the names it has
    /// no handler for, whose jobs wait. A snapshot read. Errors:
    /// `Unavailable`. The default answers `Unsupported`.
    ///
    /// [`lease_jobs`]: IdempotencyStore::lease_jobs
    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        Err(StoreError::Unsupported("count follow-on jobs"))
    }
}

/// A shared store is a store: `Arc<MemoryStore>`, `Arc<dyn IdempotencyStore>`.
#[async_trait]
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for std::sync::Arc<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        (**self).claim(req).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        (**self).complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        (**self).release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        (**self).mark_unknown(key, attempt, note).await
    }
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        (**self).mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        (**self).resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        (**self).defer_check(key, attempt, delay).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        (**self).heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        (**self).lookup(tenant, reference).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        (**self).purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        (**self).list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        (**self).list_unknown(limit).await
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        (**self).list_records(filter).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        (**self).count_records().await
    }
    fn supports_follow_ons(&self) -> bool {
        (**self).supports_follow_ons()
    }
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        (**self)
            .complete_with_follow_ons(key, attempt, response, jobs)
            .await
    }
    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: &[FollowOn],
    ) -> Result<(), StoreError> {
        (**self)
            .resolve_with_follow_ons(key, attempt, response, note, jobs)
            .await
    }
    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<OutboxJob>, StoreError> {
        (**self).lease_jobs(names, limit, lease, token).await
    }
    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        (**self).finish_job(id, token).await
    }
    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        (**self).retry_job(id, token, delay, error).await
    }
    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        (**self).bury_job(id, token, error).await
    }
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<OutboxJob>, StoreError> {
        (**self).list_jobs(filter).await
    }
    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        (**self).redrive_job(id).await
    }
    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        (**self).count_due_jobs().await
    }
}

impl RecordFilter {
    /// Whether `record` matches the filter's state, tenant and tool (not its
    /// limit): for a store that filters after reading.
    pub fn matches(&self, record: &Record) -> bool {
        self.state.is_none_or(|s| record.state.kind() == s)
            && self.tenant.as_deref().is_none_or(|t| record.tenant == t)
            && self.tool.as_deref().is_none_or(|t| record.tool == t)
    }
}
