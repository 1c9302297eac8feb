//! Follow-ons as a store keeps them: what a handler declares
//! ([`FollowOn`]), the follow-on written with the completion ([`FollowOnRecord`]), its
//! identity ([`FollowOnId`]) and the operator's filter ([`FollowOnFilter`]).
//!
//! A follow-on is written in the same atomic step as the COMPLETED record it
//! follows (see [`FollowOnStore::complete_with_follow_ons`]), so a crash
//! can never leave a completed charge without its receipt follow-on, nor a receipt
//! follow-on without its charge. A dispatcher leases due follow-ons with a fencing token
//! ([`FollowOnStore::lease_follow_ons`]), runs them, and finishes, retries or
//! buries them, each fenced by that attempt.
//!
//! [`FollowOnStore::complete_with_follow_ons`]: super::FollowOnStore::complete_with_follow_ons
//! [`FollowOnStore::lease_follow_ons`]: super::FollowOnStore::lease_follow_ons

use std::fmt;
use std::time::SystemTime;

use super::{Attempt, StoreError, DEFAULT_LIST_LIMIT};
use crate::key::Reference;

/// The default largest payload of one follow-on, as JSON text: 64 KiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 64 * 1024;

/// The longest follow-on name, in bytes.
pub const MAX_FOLLOW_ON_NAME: usize = 128;

/// The longest `last_error` the dispatcher keeps, in bytes. A longer error
/// text is cut at a character boundary and ends with a mark that says how
/// much was cut; a NUL byte (which a PostgreSQL text column refuses) is kept
/// as the two characters `\0`. So whatever a far side answers, the failure
/// is recorded and the follow-on's attempt limit holds.
pub const MAX_FOLLOW_ON_ERROR: usize = 2048;

/// Whether every store can keep `name` as a follow-on name: 1 to [`MAX_FOLLOW_ON_NAME`]
/// characters, each an ASCII letter or digit, `_`, `-` or `.`.
///
/// Nothing else: a NUL byte is refused by PostgreSQL's text columns; the
/// Redis store puts the name in key names and in set members whose parts
/// are joined with `:` (and `{`…`}` picks a Cluster slot); the downstream
/// key is `<reference>:<name>`; and a control character or a space would
/// garble an operator's listing. A name is checked where it is declared, so
/// a completion never fails on it after the side effect.
pub fn is_valid_follow_on_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FOLLOW_ON_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A follow-on as a handler (or a reconciler) declares it: a name that
/// picks the dispatcher's handler, and a payload (JSON text). Its identity
/// in the store is (tenant, reference, name), so one operation declares each
/// name at most once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowOn {
    name: String,
    payload: String,
}

impl FollowOn {
    /// A follow-on named `name` carrying `payload` serialized as JSON, refused if
    /// the name is not 1 to [`MAX_FOLLOW_ON_NAME`] characters from `A-Z a-z 0-9 _
    /// - .` ([`is_valid_follow_on_name`]), if the payload does not serialize, or
    /// if it is over [`DEFAULT_MAX_PAYLOAD`] bytes.
    pub fn new<P: serde::Serialize + ?Sized>(
        name: &str,
        payload: &P,
    ) -> Result<Self, FollowOnError> {
        Self::with_limit(name, payload, DEFAULT_MAX_PAYLOAD)
    }

    /// [`FollowOn::new`] with a payload limit of `max_payload` bytes.
    pub fn with_limit<P: serde::Serialize + ?Sized>(
        name: &str,
        payload: &P,
        max_payload: usize,
    ) -> Result<Self, FollowOnError> {
        check_name(name)?;
        let payload =
            serde_json::to_string(payload).map_err(|e| FollowOnError::Unserializable {
                name: name.to_owned(),
                reason: e.to_string(),
            })?;
        if payload.len() > max_payload {
            return Err(FollowOnError::TooLarge {
                name: name.to_owned(),
                size: payload.len(),
                limit: max_payload,
            });
        }
        Ok(FollowOn {
            name: name.to_owned(),
            payload,
        })
    }

    /// The follow-on's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The payload, as JSON text.
    pub fn payload(&self) -> &str {
        &self.payload
    }
}

fn check_name(name: &str) -> Result<(), FollowOnError> {
    if !is_valid_follow_on_name(name) {
        return Err(FollowOnError::BadName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// The follow-ons of one completion (or resolution), no two with one
/// name: a follow-on's identity is (tenant, reference, name), so two would be
/// one. Checked once, where the list is built ([`FollowOns::new`]), so a
/// store writes them as they are, and never refuses them after a side
/// effect for a reason it could have been told before. Reads as the slice
/// of its follow-ons.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowOns<'a>(&'a [FollowOn]);

impl<'a> FollowOns<'a> {
    /// No follow-ons: a plain completion.
    pub const NONE: FollowOns<'static> = FollowOns(&[]);

    /// `jobs`, refused when two share a name. Errors: `Invalid`, naming
    /// the repeated name (nothing is asked of a store).
    pub fn new(jobs: &'a [FollowOn]) -> Result<Self, StoreError> {
        for (i, job) in jobs.iter().enumerate() {
            if jobs[..i].iter().any(|other| other.name == job.name) {
                return Err(StoreError::Invalid(format!(
                    "the follow-on `{}` is declared twice for one operation",
                    job.name
                )));
            }
        }
        Ok(FollowOns(jobs))
    }

    /// The follow-ons, as a slice that lives as long as the list they came from.
    pub fn as_slice(self) -> &'a [FollowOn] {
        self.0
    }
}

impl std::ops::Deref for FollowOns<'_> {
    type Target = [FollowOn];

    fn deref(&self) -> &[FollowOn] {
        self.0
    }
}

/// Why a follow-on was refused at its declaration. Nothing was declared;
/// the handler's own outcome is untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FollowOnError {
    /// Declared outside the handler of a wrapped (`#[idempotent]` or
    /// [`Executor::run`](crate::Executor::run)) operation, or from a task the
    /// handler spawned: there is no operation to attach it to.
    #[error(
        "follow-on `{name}` was declared outside a wrapped handler; declare it inside the \
         #[idempotent] handler's own task (not a spawned one)"
    )]
    OutsideHandler {
        /// The follow-on's name.
        name: String,
    },
    /// The name is empty, too long, or has a character outside the names'
    /// alphabet ([`is_valid_follow_on_name`]).
    #[error(
        "follow-on name {name:?} cannot be kept: a follow-on name is 1 to 128 characters, each \
         one of A-Z a-z 0-9 _ - . (no spaces, colons, control characters or NUL bytes); \
         rename the follow-on, e.g. `send_receipt`"
    )]
    BadName {
        /// The name given.
        name: String,
    },
    /// The payload does not serialize to JSON.
    #[error("the payload of follow-on `{name}` cannot be serialized as JSON ({reason})")]
    Unserializable {
        /// The follow-on's name.
        name: String,
        /// serde_json's message.
        reason: String,
    },
    /// The payload is over the limit.
    #[error(
        "the payload of follow-on `{name}` is {size} bytes, over the limit of {limit}; keep \
         an identifier in the payload and look the rest up when the follow-on runs"
    )]
    TooLarge {
        /// The follow-on's name.
        name: String,
        /// The payload's size as JSON text.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The operation already declared a follow-on with this name.
    #[error(
        "follow-on `{name}` is already declared for this operation; a follow-on is identified by \
         the operation and its name, so declare each name once"
    )]
    Duplicate {
        /// The follow-on's name.
        name: String,
    },
    /// The operation declared as many follow-ons as its store writes with one
    /// completion ([`Limits::max_follow_ons_per_completion`](super::Limits::max_follow_ons_per_completion)).
    #[error(
        "follow-on `{name}` is one too many: the {store} store writes at most {limit} \
         follow-ons with one completion; declare one follow-on that fans out when it runs"
    )]
    TooMany {
        /// The follow-on's name.
        name: String,
        /// The store's limit.
        limit: usize,
        /// The store's kind.
        store: &'static str,
    },
    /// The operation's follow-ons would carry more payload bytes than its store
    /// writes with one completion
    /// ([`Limits::max_follow_on_bytes_per_completion`](super::Limits::max_follow_on_bytes_per_completion)).
    #[error(
        "follow-on `{name}` is too much: with it the operation's follow-ons carry {total} bytes \
         of payload, over the {limit} bytes the {store} store writes with one completion; keep \
         identifiers in the payloads and look the rest up when the follow-ons run"
    )]
    TooMuch {
        /// The follow-on's name.
        name: String,
        /// The payload bytes of the operation's follow-ons, this one included.
        total: usize,
        /// The store's limit.
        limit: usize,
        /// The store's kind.
        store: &'static str,
    },
    /// The follow-on's own item would be over the store's limit on one item
    /// ([`Limits::item`](super::Limits::item)):
    /// its payload is over what the item leaves beside the follow-on's tenant,
    /// name and other fields.
    #[error(
        "the payload of follow-on `{name}` is {size} bytes, over the {limit} bytes one follow-on \
         holds on the {store} store (its item, less the follow-on's tenant, name and other fields); \
         keep an identifier in the payload and look the rest up when the follow-on runs"
    )]
    ItemTooLarge {
        /// The follow-on's name.
        name: String,
        /// The payload's size as JSON text.
        size: usize,
        /// The most payload bytes the follow-on's item holds.
        limit: usize,
        /// The store's kind.
        store: &'static str,
    },
    /// The follow-on's name and its operation's tenant are over what the store
    /// keys a follow-on by
    /// ([`ItemLimit::follow_on_key_bytes`](super::ItemLimit::follow_on_key_bytes)).
    #[error(
        "follow-on `{name}` cannot be kept: its name and its operation's tenant id take \
         {bytes} bytes, over the {limit} bytes the {store} store keys a follow-on by; use a shorter \
         follow-on name"
    )]
    NameTooLong {
        /// The follow-on's name.
        name: String,
        /// The bytes of the name and the tenant id together.
        bytes: usize,
        /// The store's limit.
        limit: usize,
        /// The store's kind.
        store: &'static str,
    },
    /// The executor's store cannot keep follow-ons.
    #[error(
        "follow-on `{name}` cannot be kept: the {store} store does not support follow-on \
         follow-ons; use one that does (memory, sqlite, postgres, redis, dynamodb)"
    )]
    Unsupported {
        /// The follow-on's name.
        name: String,
        /// The store's kind.
        store: &'static str,
    },
}

/// Which follow-on: the tenant and reference of the operation it follows, and its
/// name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FollowOnId {
    /// The operation's tenant.
    pub tenant: String,
    /// The operation's reference.
    pub reference: Reference,
    /// The follow-on's name.
    pub name: String,
}

impl FollowOnId {
    /// The stable idempotency key a follow-on's handler passes downstream (to the
    /// mailer, the warehouse): its operation's reference and the follow-on's name,
    /// `idem_3f9a0c1d2e4b5a69c07e51d2a8f4e913:send_receipt`. The same on
    /// every attempt and after every restart, so the far side can drop a
    /// repeat; another operation of the same call (after its window) has
    /// another reference, so its follow-on is never dropped as a repeat. A follow-on
    /// written before references had tags keeps its 16-digit reference, and
    /// so its key.
    pub fn downstream_key(&self) -> String {
        format!("{}:{}", self.reference, self.name)
    }
}

impl fmt::Display for FollowOnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.reference, self.name)
    }
}

/// A follow-on as a store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowOnRecord {
    /// Tenant, reference and name.
    pub id: FollowOnId,
    /// The payload, as JSON text.
    pub payload: String,
    /// How many times it was leased to run since it was written or last
    /// re-driven (1 while its first run is under way): the count its retry
    /// schedule and its dead letter go by. A re-drive adds it to
    /// `earlier_runs` and starts it again at 0.
    pub runs: u32,
    /// The runs before its last re-drive, every re-drive's summed: the follow-on
    /// ran `earlier_runs + runs` times in all ([`FollowOnRecord::all_runs`]). 0 for a
    /// follow-on never re-driven.
    pub earlier_runs: u32,
    /// The fencing token of the dispatcher that leased it, while one does.
    pub attempt: Option<Attempt>,
    /// When it may run next (store clock): when it was written, or when its
    /// retry is due; for a leased follow-on, when its lease runs out and another
    /// dispatcher may take it.
    pub next_run_at: SystemTime,
    /// Why its last run since it was written or last re-driven failed
    /// (`None` when none did). A delivered follow-on's is from a run before the
    /// one that delivered it.
    pub last_error: Option<String>,
    /// The `last_error` it had when it was last re-driven: why it went to
    /// the dead letter. `None` for a follow-on never re-driven.
    pub error_before_redrive: Option<String>,
    /// In the dead letter: it failed too often and waits for a person
    /// ([`FollowOnStore::redrive_follow_on`](super::FollowOnStore::redrive_follow_on)).
    pub dead: bool,
    /// When it was written, with its operation's completion (store clock).
    pub created_at: SystemTime,
    /// When it last changed (store clock).
    pub updated_at: SystemTime,
    /// When a run finished it (store clock): it was delivered, by its run
    /// number `runs`, and no lease finds it again. `None` until then.
    pub delivered_at: Option<SystemTime>,
    /// How long a delivered follow-on is kept: until its operation's record
    /// expires (store clock), when the purge deletes both. `None` while it
    /// is not delivered (a waiting, running or dead follow-on is never purged).
    pub kept_until: Option<SystemTime>,
}

impl FollowOnRecord {
    /// How many times it was leased to run in all, across re-drives.
    pub fn all_runs(&self) -> u32 {
        self.earlier_runs.saturating_add(self.runs)
    }

    /// Re-drives a dead follow-on at `now`, as every store does (the same fields,
    /// in one atomic write): live and due now, unleased, its runs counted
    /// from 0 again and added to `earlier_runs`, its last error kept as
    /// `error_before_redrive`. `false`, and nothing changed, for a follow-on that
    /// is not dead.
    pub(crate) fn redrive(&mut self, now: SystemTime) -> bool {
        if !self.dead {
            return false;
        }
        self.dead = false;
        self.earlier_runs = self.all_runs();
        self.runs = 0;
        self.error_before_redrive = self.last_error.take();
        self.attempt = None;
        self.next_run_at = now;
        self.updated_at = now;
        true
    }

    /// Where the follow-on stands: delivered, dead, running (a dispatcher holds
    /// its lease) or waiting.
    pub fn state(&self) -> FollowOnState {
        if self.delivered_at.is_some() {
            FollowOnState::Delivered
        } else if self.dead {
            FollowOnState::Dead
        } else if self.attempt.is_some() {
            FollowOnState::Running
        } else {
            FollowOnState::Waiting
        }
    }
}

/// Where a follow-on stands ([`FollowOnRecord::state`]), for an operator and for
/// [`FollowOnFilter::states`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FollowOnState {
    /// Live and not leased: due at its `next_run_at`.
    Waiting,
    /// A dispatcher holds its lease (which may have run out: then the next
    /// lease takes it).
    Running,
    /// In the dead letter, until it is re-driven.
    Dead,
    /// A run finished it; kept, never run again, until its operation's
    /// record is purged.
    Delivered,
}

impl FollowOnState {
    /// Every state, in the order above.
    pub const ALL: [FollowOnState; 4] = [
        FollowOnState::Waiting,
        FollowOnState::Running,
        FollowOnState::Dead,
        FollowOnState::Delivered,
    ];

    /// The state's name: `waiting`, `running`, `dead`, `delivered`.
    pub fn as_str(self) -> &'static str {
        match self {
            FollowOnState::Waiting => "waiting",
            FollowOnState::Running => "running",
            FollowOnState::Dead => "dead",
            FollowOnState::Delivered => "delivered",
        }
    }

    /// The state's bit in [`FollowOnFilter::state_mask`]: 1, 2, 4, 8.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
    pub(crate) const fn bit(self) -> u8 {
        match self {
            FollowOnState::Waiting => 1,
            FollowOnState::Running => 2,
            FollowOnState::Dead => 4,
            FollowOnState::Delivered => 8,
        }
    }
}

impl fmt::Display for FollowOnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which follow-ons [`FollowOnStore::list_follow_ons`](super::FollowOnStore::list_follow_ons)
/// returns: every field that is set must match; the oldest first (then by
/// reference and name), at most `limit`. `FollowOnFilter::default()` matches
/// every follow-on and lists the oldest [`DEFAULT_LIST_LIMIT`]; the dead letter is
/// `FollowOnFilter { states: vec![FollowOnState::Dead], ..FollowOnFilter::default() }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowOnFilter {
    /// Only this tenant's follow-ons.
    pub tenant: Option<String>,
    /// Only the follow-ons of this operation.
    pub reference: Option<Reference>,
    /// Only follow-ons with this name.
    pub name: Option<String>,
    /// Only follow-ons in one of these states ([`FollowOnRecord::state`]); empty (the
    /// default) for every state. The work not done yet is `[Waiting,
    /// Running, Dead]`; what was delivered is `[Delivered]`.
    pub states: Vec<FollowOnState>,
    /// The most follow-ons returned: [`DEFAULT_LIST_LIMIT`] (100) by default; `0`
    /// returns none.
    pub limit: usize,
}

impl Default for FollowOnFilter {
    /// Every follow-on, the oldest [`DEFAULT_LIST_LIMIT`].
    fn default() -> Self {
        FollowOnFilter {
            tenant: None,
            reference: None,
            name: None,
            states: Vec::new(),
            limit: DEFAULT_LIST_LIMIT,
        }
    }
}

impl FollowOnFilter {
    /// Whether `job` matches the filter (not its limit): for a store that
    /// filters after reading.
    pub fn matches(&self, job: &FollowOnRecord) -> bool {
        self.tenant.as_deref().is_none_or(|t| job.id.tenant == t)
            && self.reference.is_none_or(|r| job.id.reference == r)
            && self.name.as_deref().is_none_or(|n| job.id.name == n)
            && (self.states.is_empty() || self.states.contains(&job.state()))
    }

    /// The states as bits ([`FollowOnState`]'s: waiting 1, running 2, dead 4,
    /// delivered 8), `None` for every state: for a store that filters in
    /// SQL or in a script.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
    pub(crate) fn state_mask(&self) -> Option<u8> {
        (!self.states.is_empty()).then(|| self.states.iter().fold(0, |m, s| m | s.bit()))
    }
}

/// The order of [`FollowOnFilter`]'s listing: oldest first, then reference, name.
pub(crate) fn listing_order(job: &FollowOnRecord) -> (SystemTime, Reference, String, String) {
    (
        job.created_at,
        job.id.reference,
        job.id.name.clone(),
        job.id.tenant.clone(),
    )
}

/// The names a lease looks for, sorted and without repeats; `None` when it
/// can find nothing (no names, or a limit of 0): the lease then leases
/// nothing and asks nothing of the store's backend.
pub(crate) fn lease_names<'n>(names: &[&'n str], limit: usize) -> Option<Vec<&'n str>> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names.dedup();
    (!names.is_empty() && limit > 0).then_some(names)
}

/// The order a lease takes due follow-ons in, for a store that picks them
/// itself: the longest due first, then in the listing's order.
pub(crate) fn due_order(
    job: &FollowOnRecord,
) -> (SystemTime, (SystemTime, Reference, String, String)) {
    (job.next_run_at, listing_order(job))
}

/// Puts follow-ons just leased in the order a lease returns them: the listing's
/// ([`listing_order`]), whatever order the store leased them in (a SQL
/// `RETURNING` has none of its own, the Redis shards answer in turn).
pub(crate) fn sort_leased(leased: &mut [FollowOnRecord]) {
    leased.sort_by_key(listing_order);
}
