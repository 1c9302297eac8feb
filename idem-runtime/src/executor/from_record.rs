//! The answers a call gets from an operation the store (or the replay
//! cache) already holds: a repeat's answer from the record, and the stored
//! response decoded as the tool's value.

use serde::de::DeserializeOwned;

use super::pace::ToolDurations;
use super::replay_cache::Replays;
use crate::answer::{note, Answer, Resolver};
use crate::key::{IdempotencyKey, Reference};
use crate::store::{Reading, Record, RecordState};

/// The answer to a repeat that found a live record; a running one is told
/// when to ask again from `durations`, an unknown one who resolves it.
pub(super) fn existing<T: DeserializeOwned, E>(
    record: Record,
    key: &IdempotencyKey,
    status_tool: &str,
    durations: &ToolDurations,
    resolver: Resolver,
) -> Answer<T, E> {
    let reference = record.reference;
    let status_tool = status_tool.to_owned();
    if record.key.fingerprint() != key.fingerprint() {
        return Answer::Conflict {
            reference,
            status_tool,
        };
    }
    match record.reading() {
        Reading::Completed { response } => replay(response, reference, status_tool, resolver),
        Reading::Running { retry_after } => Answer::InProgress {
            reference,
            status_tool,
            // Both times on the store's clock.
            retry_after: durations.retry_hint(
                &record.tool,
                record
                    .observed_at
                    .duration_since(record.claimed_at)
                    .unwrap_or_default(),
                retry_after,
            ),
        },
        Reading::Unknown { note, .. } => Answer::Unknown {
            reference,
            status_tool,
            note: note.to_owned(),
            resolver,
        },
        // The store takes a NOT_PERFORMED record over in the claim itself; a
        // store that hands one back answers honestly rather than guessing.
        Reading::NotPerformed { note } => Answer::Unknown {
            reference,
            status_tool,
            note: format!(
                "it was resolved as not performed ({note}), but could not be claimed again"
            ),
            resolver,
        },
    }
}

/// Keeps `record`'s response in the replay cache when the store answered
/// the claim of `key` with it completed, for the same arguments: until its
/// window ends, counted from `asked` (before the claim was sent), by what
/// the store said was left of it.
pub(super) fn keep_replay(
    replays: &Replays,
    record: &Record,
    key: &IdempotencyKey,
    tenant: &str,
    asked: tokio::time::Instant,
) {
    if record.key.fingerprint() != key.fingerprint() || record.tenant != tenant {
        return;
    }
    if let RecordState::Completed { response } = &record.state {
        let left = record
            .expires_at
            .duration_since(record.observed_at)
            .unwrap_or_default();
        replays.insert(
            key,
            tenant,
            record.reference,
            response.as_str().into(),
            asked + left,
        );
    }
}

/// The answer of a completed operation: its stored `response`, decoded
/// (or, if it no longer decodes, an unknown outcome that `resolver`
/// resolves).
pub(super) fn replay<T: DeserializeOwned, E>(
    response: &str,
    reference: Reference,
    status_tool: String,
    resolver: Resolver,
) -> Answer<T, E> {
    match serde_json::from_str(response) {
        Ok(value) => Answer::Replayed {
            value,
            stored: response.to_owned(),
            reference,
        },
        // It completed, so it must not run again; say so rather than guess.
        Err(e) => Answer::Unknown {
            reference,
            status_tool,
            note: note::unreadable(e),
            resolver,
        },
    }
}
