//! The record of an operation and the store that keeps it: the
//! [`IdempotencyStore`] contract, and its backends one module each.

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::key::{IdempotencyKey, Reference};

mod attempt;
mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use attempt::Attempt;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// What a claim asks the store to create.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The operation's key and fingerprint.
    pub key: IdempotencyKey,
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
}

impl RecordState {
    /// Which of the three states this is, without its payload.
    pub fn kind(&self) -> RecordStateKind {
        match self {
            RecordState::InProgress => RecordStateKind::InProgress,
            RecordState::Completed { .. } => RecordStateKind::Completed,
            RecordState::Unknown { .. } => RecordStateKind::Unknown,
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
}

impl RecordStateKind {
    /// Every kind, in code order.
    pub const ALL: [RecordStateKind; 3] = [
        RecordStateKind::InProgress,
        RecordStateKind::Completed,
        RecordStateKind::Unknown,
    ];

    /// The name the status tool and the docs use: `IN_PROGRESS`,
    /// `COMPLETED` or `UNKNOWN`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordStateKind::InProgress => "IN_PROGRESS",
            RecordStateKind::Completed => "COMPLETED",
            RecordStateKind::Unknown => "UNKNOWN",
        }
    }

    /// The code a SQL store keeps in its `state` column (0, 1, 2). Stored
    /// data depends on these: they never change.
    pub const fn code(self) -> i16 {
        match self {
            RecordStateKind::InProgress => 0,
            RecordStateKind::Completed => 1,
            RecordStateKind::Unknown => 2,
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
    /// When an IN_PROGRESS or UNKNOWN record may be forgotten.
    pub retain_until: SystemTime,
}

impl Record {
    /// The record's public reference.
    pub fn reference(&self) -> Reference {
        self.key.reference()
    }

    /// Whether a record is past its life at `now` (store clock), so that a new
    /// claim may take it over and purge may delete it. A COMPLETED record ends
    /// at `expires_at`; an IN_PROGRESS or UNKNOWN one only at `retain_until`
    /// and once its lease ran out, because its side effect may have happened.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        match self.state {
            RecordState::Completed { .. } => self.expires_at <= now,
            _ => self.retain_until <= now && self.lease_until <= now,
        }
    }

    /// Whether the claim's lease ran out at `now` (store clock).
    pub fn lease_expired(&self, now: SystemTime) -> bool {
        self.lease_until <= now
    }
}

/// What a claim found.
// A record is returned by value: a repeat is rarer than a first call and the
// enum only ever lives on the stack of one claim.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The record was created (or an expired one taken over): the caller owns
    /// it with the request's attempt and must now run the operation.
    Claimed,
    /// A live record exists; nothing was changed. `now` is the store's clock at
    /// the time of the read, to judge the lease against.
    Existing {
        /// The record as found.
        record: Record,
        /// The store's clock when it was read.
        now: SystemTime,
    },
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
    /// The store was configured wrongly (an invalid connection string or
    /// schema name): nothing was tried. Fix the configuration; retrying
    /// will not help.
    #[error("the idempotency store is misconfigured: {0}")]
    Config(String),
    /// The store answered, but with something it should not hold.
    #[error("the idempotency store holds an invalid record: {0}")]
    Corrupt(String),
}

/// Where idempotency records live.
///
/// Every method is one atomic step against the store; none of them ever runs
/// the operation or calls back into user code. Times are the store's own clock
/// (a database's `now()` where there is one), so several processes with skewed
/// clocks agree on expiry and leases.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + std::fmt::Debug {
    /// Claims the operation: atomically inserts an IN_PROGRESS record owned by
    /// `req.attempt` if none exists, or takes over a record that
    /// [`Record::is_expired`] (a new claim replaces it whole). Otherwise
    /// returns the existing record unchanged.
    ///
    /// Never check-then-insert: two concurrent claims of one key yield exactly
    /// one `Claimed`. Errors: `Unavailable` (nothing claimed).
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError>;

    /// Records the response: IN_PROGRESS or UNKNOWN → COMPLETED, only if
    /// `attempt` still owns the record. Errors: `Fenced` when it does not (the
    /// record is left as it is), `WrongState` when it is already COMPLETED,
    /// `Unavailable`.
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
    /// record. Errors: `Fenced`, `WrongState` when COMPLETED or already
    /// UNKNOWN, `Unavailable`.
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
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

    /// At most `limit` UNKNOWN records, oldest claim first, for a reconciler.
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError>;
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
}
