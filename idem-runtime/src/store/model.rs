//! The data model of the store contract: what a claim asks for and finds,
//! a record and its states, how a record reads to a caller, and the
//! filters and counts of the operator's reads.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::Attempt;
use crate::key::{IdempotencyKey, Reference};

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
    /// How long the key is held for this operation once it settled,
    /// counted from the claim: a COMPLETED record answers repeats for this
    /// long, and never longer ([`Record::holds_key`]).
    pub window: Duration,
    /// How long the operation's record is kept, counted from the claim
    /// (never less than `window`: [`ClaimRequest::retain_for`]): it reads
    /// by its reference until then, even after a new operation took the
    /// key, and an UNKNOWN record holds its key until then (a charge that
    /// may have happened is not forgotten when the window ends).
    pub retention: Duration,
}

impl ClaimRequest {
    /// How long the record is kept after the claim: its `retention`, and
    /// never less than its `window` (a record forgotten before its window
    /// ends would let the same call run twice within it). The one rule of
    /// the claim's retention: a store that computes its deadlines in its
    /// own statements takes this duration as a parameter.
    pub fn retain_for(&self) -> Duration {
        self.retention.max(self.window)
    }

    /// The deadlines a claim made at `now` (store clock) sets on its record,
    /// every store's: the lease's end, the window's end, the retention's
    /// end ([`ClaimRequest::retain_for`]).
    pub fn deadlines(&self, now: SystemTime) -> Deadlines {
        Deadlines {
            lease_until: now + self.lease,
            expires_at: now + self.window,
            retain_until: now + self.retain_for(),
        }
    }
}

/// The deadlines a claim sets on its record ([`ClaimRequest::deadlines`]):
/// the fields of [`Record`] of the same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Until when the claim holds without a heartbeat.
    pub lease_until: SystemTime,
    /// When the key's hold ends for a settled record: the window's end.
    pub expires_at: SystemTime,
    /// When the record may be forgotten: the retention's end.
    pub retain_until: SystemTime,
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
    /// Which of the four states this is, without its payload.
    pub fn kind(&self) -> RecordStateKind {
        match self {
            RecordState::InProgress => RecordStateKind::InProgress,
            RecordState::Completed { .. } => RecordStateKind::Completed,
            RecordState::Unknown { .. } => RecordStateKind::Unknown,
            RecordState::NotPerformed { .. } => RecordStateKind::NotPerformed,
        }
    }

    /// `IN_PROGRESS`, `COMPLETED`, `UNKNOWN` or `NOT_PERFORMED`.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The state a store kept as its kind and one text, `body` (the
    /// response of a COMPLETED record, the note of an UNKNOWN or
    /// NOT_PERFORMED one, none for IN_PROGRESS), read back: every store's
    /// one decoding. A missing note reads as empty; `None` for a COMPLETED
    /// record without its response, which the store reports as corrupt.
    pub fn from_stored(kind: RecordStateKind, body: Option<String>) -> Option<Self> {
        Some(match kind {
            RecordStateKind::InProgress => RecordState::InProgress,
            RecordStateKind::Completed => RecordState::Completed { response: body? },
            RecordStateKind::Unknown => RecordState::Unknown {
                note: body.unwrap_or_default(),
            },
            RecordStateKind::NotPerformed => RecordState::NotPerformed {
                note: body.unwrap_or_default(),
            },
        })
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

/// A state is written as its name: `"COMPLETED"`.
impl serde::Serialize for RecordStateKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
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
    /// When the key's hold ends for a settled record: the end of the
    /// window, counted from the claim. Set by the claim and never moved
    /// after it, however late the operation settles: a COMPLETED record
    /// answers repeats until then, and not after.
    pub expires_at: SystemTime,
    /// When the record may be forgotten: until then it reads by its
    /// reference (status tool, `tasks/get`, `lookup`, the command line),
    /// whatever its state and even after a new operation took its key; an
    /// UNKNOWN record (or a lapsed IN_PROGRESS one) also holds its key until
    /// then. Counted from the claim, at least the window.
    pub retain_until: SystemTime,
    /// When a reconciler looks at an UNKNOWN record next (set when it
    /// becomes UNKNOWN, pushed back by [`Upkeep::defer_check`](super::Upkeep::defer_check)).
    pub next_check_at: SystemTime,
    /// How many times a reconciler looked at it without resolving it.
    pub checks: u32,
    /// Who resolved it and why, when its handler did not complete it: an
    /// operator's note (by hand), the reconciler's, or the one a call run as
    /// a task keeps when its handler rejected it ([`Record::completed_by`]
    /// reads it).
    pub resolution: Option<String>,
    /// The store's clock when this copy was read: judge the lease against it.
    pub observed_at: SystemTime,
}

/// Who brought a record to COMPLETED or NOT_PERFORMED, as far as the record
/// itself tells ([`Record::completed_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompletedBy {
    /// Its handler: a completion (no resolution note, on a record that was
    /// never UNKNOWN), or the rejection of a call run as a task
    /// (NOT_PERFORMED, with the rejection's resolution note).
    Handler,
    /// A reconciler, from the processor's answer: its resolution note, or,
    /// on a record it found not performed, its note "the processor has no
    /// record of it".
    Reconciler,
    /// An operator, by hand (`idem resolve`,
    /// [`resolve_by_hand`](crate::maintenance::resolve_by_hand)): any other
    /// resolution note, which is the operator's own.
    Operator,
    /// The record cannot tell. COMPLETED without a resolution note after it
    /// was UNKNOWN: its handler's late completion, or the resolution of a
    /// reconciler of an idem from before reconcilers noted theirs. Or
    /// NOT_PERFORMED with notes no writer of idem's leaves (a resolution
    /// through the store by other code).
    Unknown,
}

impl CompletedBy {
    /// Its name: `handler`, `reconciler`, `operator` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompletedBy::Handler => "handler",
            CompletedBy::Reconciler => "reconciler",
            CompletedBy::Operator => "operator",
            CompletedBy::Unknown => "unknown",
        }
    }
}

impl fmt::Display for CompletedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resolution notes that say who resolved a record, read by
/// [`Record::completed_by`]. The executor, the reconciler and an operator's
/// resolution write them (through `answer::note` and the executor); they
/// live here, beside the record that keeps them.
pub(crate) mod resolved_by {
    /// A reconciler's resolution (completed or not performed).
    pub(crate) const RECONCILED: &str =
        "resolved by the reconciler, from what the processor reports";
    /// A reconciler found it not performed at the processor (the record's
    /// state note).
    pub(crate) const RECONCILED_NOT_PERFORMED: &str =
        "the processor has no record of it: it did not take effect";
    /// A call run as a task whose handler rejected it.
    pub(crate) const REJECTED: &str =
        "rejected by its handler before any side effect; nothing happened";
}

impl Record {
    /// Who brought the record to COMPLETED or NOT_PERFORMED, read from what
    /// it holds; `None` while it is IN_PROGRESS or UNKNOWN. The resolution
    /// note says who resolved it (the reconciler's, a rejection's, else an
    /// operator's); without one, a COMPLETED record was completed by its
    /// handler if it was never UNKNOWN: its `next_check_at` is still the
    /// claim's time (every store sets it so at the claim, and moves it when
    /// the record becomes UNKNOWN) and no check was counted. Otherwise the
    /// record cannot tell ([`CompletedBy::Unknown`]).
    pub fn completed_by(&self) -> Option<CompletedBy> {
        use resolved_by::{RECONCILED, RECONCILED_NOT_PERFORMED, REJECTED};
        let was_unknown = self.checks > 0 || self.next_check_at != self.claimed_at;
        Some(match (&self.state, self.resolution.as_deref()) {
            (RecordState::InProgress | RecordState::Unknown { .. }, _) => return None,
            (_, Some(RECONCILED)) => CompletedBy::Reconciler,
            (_, Some(REJECTED)) => CompletedBy::Handler,
            (_, Some(_)) => CompletedBy::Operator,
            (RecordState::NotPerformed { note: n }, None) if n == RECONCILED_NOT_PERFORMED => {
                CompletedBy::Reconciler
            }
            (RecordState::Completed { .. }, None) if !was_unknown => CompletedBy::Handler,
            (RecordState::Completed { .. } | RecordState::NotPerformed { .. }, None) => {
                CompletedBy::Unknown
            }
        })
    }

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

    /// Whether the record holds its key at `now` (store clock): whether a
    /// claim of the same key finds this operation rather than starting or
    /// resuming one. The key's hold and the record's life are two lives:
    ///
    /// - COMPLETED: until the window ends (`expires_at`), however late the
    ///   operation settled (on time, by a late handler, by a reconciler or
    ///   by hand). A late truth never stretches the window: after it, the
    ///   same call is an operation the user wanted.
    /// - NOT_PERFORMED: never; the next claim runs (within the window as the
    ///   same operation, after it as a new one: [`Record::takeover_reference`]).
    /// - IN_PROGRESS with its lease held: always (a live claim).
    /// - UNKNOWN, or IN_PROGRESS whose lease ran out (it may have died
    ///   mid-call): until it is resolved, or until its retention ends. A
    ///   charge that may have happened must be reconciled before an
    ///   identical call can run again, whatever the window says.
    pub fn holds_key(&self, now: SystemTime) -> bool {
        match self.state {
            RecordState::Completed { .. } => now < self.expires_at,
            RecordState::NotPerformed { .. } => false,
            RecordState::InProgress | RecordState::Unknown { .. } => {
                now < self.retain_until || now < self.lease_until
            }
        }
    }

    /// Whether a new claim may take the record's key over at `now`: the
    /// record no longer holds it ([`Record::holds_key`]).
    pub fn is_claimable(&self, now: SystemTime) -> bool {
        !self.holds_key(now)
    }

    /// Whether a record is past its life at `now` (store clock), so that
    /// purge may delete it: its retention ended, and, unless it settled
    /// (COMPLETED or NOT_PERFORMED), its lease ran out too. Until then it
    /// reads by its reference, in any state, even once a new operation took
    /// its key ([`Record::outlives_takeover`]).
    pub fn is_expired(&self, now: SystemTime) -> bool {
        match self.state {
            RecordState::Completed { .. } | RecordState::NotPerformed { .. } => {
                self.retain_until <= now
            }
            RecordState::InProgress | RecordState::Unknown { .. } => {
                self.retain_until <= now && self.lease_until <= now
            }
        }
    }

    /// Whether a claim that takes this record's key over at `now`, offering
    /// `offered`, leaves this record to be kept beside the new one: the new
    /// claim runs under another reference (a new operation), and this
    /// operation's retention has not ended, so a caller who was given its
    /// reference must still find what happened to it. Every store keeps
    /// such a record (its superseded operations), readable by
    /// [`lookup`](super::IdempotencyStore::lookup) and listed with the
    /// others, until it [`is_expired`](Record::is_expired).
    pub fn outlives_takeover(&self, offered: Reference, now: SystemTime) -> bool {
        self.takeover_reference(offered, now) != self.reference && now < self.retain_until
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
const LEASE_LAPSED: &str = "the call that claimed it stopped renewing its lease; \
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

/// How an UNKNOWN record is resolved ([`Upkeep::resolve`](super::Upkeep::resolve)).
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

/// The `limit` of a default [`RecordFilter`] or [`FollowOnFilter`](super::FollowOnFilter): a page of 100.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// Which records [`Inspect::list_records`](super::Inspect::list_records) returns: every field
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
/// ([`Inspect::count_records`](super::Inspect::count_records)).
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

impl RecordFilter {
    /// Whether `record` matches the filter's state, tenant and tool (not its
    /// limit): for a store that filters after reading.
    pub fn matches(&self, record: &Record) -> bool {
        self.state.is_none_or(|s| record.state.kind() == s)
            && self.tenant.as_deref().is_none_or(|t| record.tenant == t)
            && self.tool.as_deref().is_none_or(|t| record.tool == t)
    }
}
