//! What one write can hold: a store's [`Limits`] (on one response, on one
//! item ([`ItemLimit`]), on the follow-ons of one completion), and the
//! judgement of a claim, a response and a follow-on against them, made
//! before the write, where it can be made before the handler's side effect.
//!
//! The rule is written once, here; a backend only describes its limits
//! ([`IdempotencyStore::limits`]).

use super::follow_ons::MAX_FOLLOW_ON_ERROR;
use super::{IdempotencyStore, StoreError};

/// The limit on one item of a store that keeps each record, and each
/// follow-on, as one item of bounded size, with every one of its
/// fields counted in that size: DynamoDB's 400 KB an item, counted as the
/// attributes' names and values. What [`Limits::item`] describes and the executor consults before each write:
///
/// - a claim is refused, before its handler runs and with nothing written,
///   when its record's tenant and tool would leave less than
///   [`ItemLimit::NOTE_ROOM`] of the item for the note and resolution a
///   later step may write;
/// - a response is judged against the room its record leaves beside its
///   tenant, tool and resolution note, before the completion is written;
/// - a follow-on is refused at its declaration, while the handler can
///   still act, when its own item (the payload, the tenant, the name, and
///   room for the dispatcher's two error texts of at most
///   [`MAX_FOLLOW_ON_ERROR`] bytes each) would be over the limit, or its tenant
///   and name over the store's limit on a follow-on's key.
///
/// A text counts as its UTF-8 bytes. A store's overheads are its most
/// bytes of everything else a record's or a follow-on's item ever holds (keys,
/// numbers, the attributes' names), bounded from above, so that what
/// passes here is never refused by the store for its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemLimit {
    max_bytes: usize,
    record_bytes: usize,
    follow_on_bytes: usize,
    follow_on_key_bytes: Option<usize>,
}

impl ItemLimit {
    /// How much of a record's item a claim keeps for the note (why an
    /// outcome is unknown or a call was not performed) and the resolution
    /// note (who resolved it, and why) that later steps may write: 4 KiB.
    pub const NOTE_ROOM: usize = 4096;

    /// An item of at most `max_bytes`, of which a record's item takes
    /// `record_bytes` at most besides its texts (tenant, tool, response,
    /// note, resolution note) and a follow-on's item `follow_on_bytes` at most besides
    /// its texts (tenant, name, payload, errors).
    pub const fn new(max_bytes: usize, record_bytes: usize, follow_on_bytes: usize) -> Self {
        ItemLimit {
            max_bytes,
            record_bytes,
            follow_on_bytes,
            follow_on_key_bytes: None,
        }
    }

    /// A follow-on's tenant and name take at most `bytes` together, where a store
    /// keys a follow-on by them (DynamoDB: in its sort key, of at most 1024
    /// bytes).
    pub const fn with_follow_on_key(mut self, bytes: usize) -> Self {
        self.follow_on_key_bytes = Some(bytes);
        self
    }

    /// The most bytes of one item.
    pub const fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The most bytes a record's item takes besides its texts.
    pub const fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    /// The most bytes a follow-on's item takes besides its texts.
    pub const fn follow_on_bytes(&self) -> usize {
        self.follow_on_bytes
    }

    /// The most bytes of a follow-on's tenant and name together, where the store
    /// keys follow-ons by them.
    pub const fn follow_on_key_bytes(&self) -> Option<usize> {
        self.follow_on_key_bytes
    }

    /// The room a record with `texts` (its tenant, tool and any other text
    /// it will hold) leaves for one more text: `None` when it is over
    /// already.
    fn record_room(&self, texts: usize) -> Option<usize> {
        self.max_bytes
            .checked_sub(self.record_bytes)?
            .checked_sub(texts)
    }

    /// The room a follow-on of `tenant` bytes named with `name` bytes leaves for
    /// its payload; `Err` with the limit when its key is too long.
    fn payload_room(&self, tenant: usize, name: usize) -> Result<usize, usize> {
        if let Some(key) = self.follow_on_key_bytes {
            if tenant + name > key {
                return Err(key);
            }
        }
        let texts = tenant + name + 2 * MAX_FOLLOW_ON_ERROR;
        Ok(self
            .max_bytes
            .saturating_sub(self.follow_on_bytes)
            .saturating_sub(texts))
    }
}

/// What a store can hold in one write, as it declares them
/// ([`IdempotencyStore::limits`]); `None` where it has no limit.
///
/// Non-exhaustive, so a limit added later breaks no store: start from
/// [`Limits::NONE`] and set those the store has.
///
/// ```
/// use idem_runtime::store::{ItemLimit, Limits};
///
/// const LIMITS: Limits = Limits::NONE
///     .with_max_response_bytes(64 * 1024 * 1024)
///     .with_max_follow_ons_per_completion(99);
/// assert_eq!(LIMITS.max_response_bytes, Some(64 * 1024 * 1024));
/// assert_eq!(LIMITS.item, None::<ItemLimit>);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The largest response, in bytes of its JSON text, that a completion
    /// (or a resolution as COMPLETED) stores, when the store has a limit on
    /// the response itself. A store whose limit is on the whole record, all
    /// its fields counted, says so with [`item`](Limits::item) instead (or
    /// as well).
    ///
    /// The executor checks a handler's response against it before the
    /// completion write: one that cannot be stored is never written (the
    /// store would refuse it after the side effect anyway); the caller
    /// still gets its result, and the record is marked UNKNOWN with a note
    /// that says why, rather than left IN_PROGRESS for the sweep.
    pub max_response_bytes: Option<usize>,
    /// The store's limit on one item, when it keeps each record and each
    /// follow-on as one item of bounded size with every field counted
    /// (DynamoDB's 400 KB).
    ///
    /// The executor judges each write against it before it is made
    /// ([`ItemLimit`] has the rule): a claim whose tenant and tool leave
    /// too little room is refused before its handler runs, with nothing
    /// written; a response is judged against what its record's other
    /// fields leave, before the completion; a follow-on against its
    /// own item, at its declaration, while the handler can still act.
    pub item: Option<ItemLimit>,
    /// The most follow-ons one completion (or resolution) writes in its
    /// one atomic step. The executor refuses a declaration past it at once
    /// ([`FollowOnError::TooMany`](crate::follow_ons::FollowOnError::TooMany)),
    /// while the handler can still act, never at the completion.
    pub max_follow_ons_per_completion: Option<usize>,
    /// The most bytes of follow-on payloads (the sum of the follow-ons' payloads,
    /// as JSON text) one completion (or resolution) writes in its one
    /// atomic step. The executor refuses a declaration that would take the
    /// operation's follow-ons past it at once
    /// ([`FollowOnError::TooMuch`](crate::follow_ons::FollowOnError::TooMuch)),
    /// while the handler can still act, never at the completion.
    pub max_follow_on_bytes_per_completion: Option<usize>,
}

impl Limits {
    /// No limits: what a store declares by default.
    pub const NONE: Limits = Limits {
        max_response_bytes: None,
        item: None,
        max_follow_ons_per_completion: None,
        max_follow_on_bytes_per_completion: None,
    };

    /// These limits, with a response of at most `bytes`
    /// ([`max_response_bytes`](Limits::max_response_bytes)).
    pub const fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = Some(bytes);
        self
    }

    /// These limits, with each record and each follow-on one item of at most
    /// `item` ([`item`](Limits::item)).
    pub const fn with_item(mut self, item: ItemLimit) -> Self {
        self.item = Some(item);
        self
    }

    /// These limits, with at most `jobs` follow-ons per completion
    /// ([`max_follow_ons_per_completion`](Limits::max_follow_ons_per_completion)).
    pub const fn with_max_follow_ons_per_completion(mut self, jobs: usize) -> Self {
        self.max_follow_ons_per_completion = Some(jobs);
        self
    }

    /// These limits, with at most `bytes` of follow-on payloads per
    /// completion
    /// ([`max_follow_on_bytes_per_completion`](Limits::max_follow_on_bytes_per_completion)).
    pub const fn with_max_follow_on_bytes_per_completion(mut self, bytes: usize) -> Self {
        self.max_follow_on_bytes_per_completion = Some(bytes);
        self
    }
}

/// A store's limits, read once (an executor keeps them for its life), and
/// the room they leave each write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Room {
    backend: &'static str,
    /// [`IdempotencyStore::limits`].
    limits: Limits,
}

impl Room {
    /// What `store` declares.
    pub(crate) fn of(store: &dyn IdempotencyStore) -> Self {
        Room {
            backend: store.backend(),
            limits: store.limits(),
        }
    }

    /// The limits declared.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether a record of `tenant` and `tool` can be claimed: `Err` with
    /// why not, when the two leave too little of the store's item
    /// ([`ItemLimit::NOTE_ROOM`]). Judged before the claim is sent, so
    /// nothing is written and no handler runs.
    pub(crate) fn claim(&self, tenant: &str, tool: &str) -> Result<(), String> {
        let Some(item) = self.limits.item else {
            return Ok(());
        };
        let texts = tenant.len() + tool.len();
        match item.record_room(texts) {
            Some(room) if room >= ItemLimit::NOTE_ROOM => Ok(()),
            _ => Err(format!(
                "its tenant id ({} bytes) and tool name ({} bytes) are too long to be recorded: \
                 the {} store keeps each operation in an item of at most {} bytes, and these \
                 two may take at most {} of them; calling again will be refused the same way \
                 until the server's operator shortens the tenant id or the tool name",
                tenant.len(),
                tool.len(),
                self.backend,
                item.max_bytes,
                item.max_bytes
                    .saturating_sub(item.record_bytes)
                    .saturating_sub(ItemLimit::NOTE_ROOM),
            )),
        }
    }

    /// The largest response a record of `tenant` and `tool` (with the
    /// resolution note `resolution`, when it gets one) can hold: the
    /// store's limit on a response, and what its item leaves beside the
    /// record's other texts. `None` when there is no limit.
    pub(crate) fn response(
        &self,
        tenant: &str,
        tool: &str,
        resolution: Option<&str>,
    ) -> Option<usize> {
        let texts = tenant.len() + tool.len() + resolution.map_or(0, str::len);
        let item = self
            .limits
            .item
            .map(|item| item.record_room(texts).unwrap_or_default());
        match (self.limits.max_response_bytes, item) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a follow-on of a tenant of `tenant` bytes, named with
    /// `name` bytes, with a payload of `payload` bytes, fits its own item:
    /// `Err` when it does not.
    pub(crate) fn job(
        &self,
        tenant: usize,
        name: usize,
        payload: usize,
    ) -> Result<(), JobTooLarge> {
        let Some(item) = self.limits.item else {
            return Ok(());
        };
        match item.payload_room(tenant, name) {
            Err(limit) => Err(JobTooLarge::Key {
                bytes: tenant + name,
                limit,
                store: self.backend,
            }),
            Ok(room) if payload > room => Err(JobTooLarge::Payload {
                limit: room,
                store: self.backend,
            }),
            Ok(_) => Ok(()),
        }
    }
}

/// Why a follow-on does not fit its store's item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobTooLarge {
    /// Its payload is over what its item leaves for it.
    Payload { limit: usize, store: &'static str },
    /// Its tenant and name are over the store's limit on a follow-on's key.
    Key {
        bytes: usize,
        limit: usize,
        store: &'static str,
    },
}

impl JobTooLarge {
    /// As the store's refusal of a completion or resolution that carries
    /// the follow-on `name` with `payload` bytes: nothing was written.
    pub(crate) fn refusal(self, name: &str, payload: usize) -> StoreError {
        StoreError::Invalid(match self {
            JobTooLarge::Payload { limit, store } => format!(
                "the follow-on `{name}` carries {payload} bytes of payload, over the \
                 {limit} bytes its own item holds on the {store} store"
            ),
            JobTooLarge::Key {
                bytes,
                limit,
                store,
            } => format!(
                "the follow-on `{name}` and its tenant take {bytes} bytes of the {store} \
                 store's follow-on key, over its {limit}"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(item: ItemLimit) -> Room {
        Room {
            backend: "test",
            limits: Limits::NONE.with_item(item),
        }
    }

    #[test]
    fn a_claim_keeps_room_for_its_notes() {
        let l = limits(ItemLimit::new(10_000, 1000, 2000));
        let room = 10_000 - 1000 - ItemLimit::NOTE_ROOM;
        assert!(l.claim(&"t".repeat(room - 4), "tool").is_ok());
        let refused = l.claim(&"t".repeat(room - 3), "tool").unwrap_err();
        assert!(refused.contains("tenant id (4901 bytes)"), "{refused}");
        assert!(refused.contains("at most 4904 of them"), "{refused}");
    }

    #[test]
    fn a_response_gets_what_the_record_leaves() {
        let l = limits(ItemLimit::new(10_000, 1000, 2000));
        assert_eq!(l.response("acme", "charge", None), Some(10_000 - 1000 - 10));
        assert_eq!(
            l.response("acme", "charge", Some("checked")),
            Some(10_000 - 1000 - 17)
        );
        assert_eq!(l.response(&"t".repeat(20_000), "charge", None), Some(0));
        let both = Room {
            limits: l.limits.with_max_response_bytes(500),
            ..l
        };
        assert_eq!(both.response("acme", "charge", None), Some(500));
        let none = Room {
            limits: Limits::NONE,
            backend: "test",
        };
        assert_eq!(none.response("acme", "charge", None), None);
    }

    #[test]
    fn a_job_fits_its_own_item() {
        let l = limits(ItemLimit::new(10_000, 1000, 100).with_follow_on_key(20));
        let room = 10_000 - 100 - 2 * MAX_FOLLOW_ON_ERROR - 4 - 7;
        assert_eq!(l.job(4, 7, room), Ok(()));
        assert_eq!(
            l.job(4, 7, room + 1),
            Err(JobTooLarge::Payload {
                limit: room,
                store: "test"
            })
        );
        assert_eq!(
            l.job(4, 17, 1),
            Err(JobTooLarge::Key {
                bytes: 21,
                limit: 20,
                store: "test"
            })
        );
    }
}
