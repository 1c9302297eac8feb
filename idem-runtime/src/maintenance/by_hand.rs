//! Resolving an unknown outcome by hand: an operator's word, checked and
//! written as the reconciler's would be.

use std::time::Duration;

use super::reconcile::Outcome;
use crate::answer::note;
use crate::key::Reference;
use crate::store::{
    resolve_with_follow_ons, FollowOn, IdempotencyStore, Record, RecordState, RecordStateKind,
    Resolution, StoreError,
};

/// Why a resolution by hand was refused. Nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No record has this reference in this tenant.
    #[error("no operation with reference {reference} in tenant {tenant:?}; check both")]
    NotFound {
        /// The tenant asked.
        tenant: String,
        /// The reference asked.
        reference: Reference,
    },
    /// The record's outcome is known already (or it is still running), so
    /// there is nothing to resolve; it was left as it was.
    #[error(
        "operation {reference} is {state}, not UNKNOWN: only an operation whose outcome is \
         unknown can be resolved by hand; it was left as it was"
    )]
    NotUnknown {
        /// The reference.
        reference: Reference,
        /// The state found.
        state: RecordStateKind,
    },
    /// The record was IN_PROGRESS, its lease run out, when this call looked,
    /// and something else marked it UNKNOWN before this call could (its
    /// handler, which renewed it and then ended with an unknown outcome, or
    /// another replica's sweep): a request its handler sent may have reached
    /// the processor after the operator checked. It was left UNKNOWN.
    #[error(
        "operation {reference} was still in progress when it was looked at and has since been \
         marked UNKNOWN by its handler or a sweep: a request it sent may have reached the \
         processor after you checked; check the processor again, then resolve it again; it was \
         left as it was"
    )]
    Changed {
        /// The reference.
        reference: Reference,
    },
    /// The note is empty.
    #[error("the note is empty: say who resolves the operation and why")]
    EmptyNote,
    /// The note is one idem writes itself (the reconciler's, or a
    /// rejection's), by which a record tells who resolved it
    /// ([`Record::completed_by`]).
    #[error("the note is one idem writes for a reconciler or a handler: say who resolves the operation and why in your own words")]
    ReservedNote,
    /// The completed response is not JSON.
    #[error("the response is not JSON ({0}): give the tool's result as JSON text")]
    InvalidResponse(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The record as a resolution by hand left it. The resolution took effect,
/// so it is answered as such, whatever a purge or a new claim does to the
/// record a moment later: read back if still there, else as resolved.
async fn resolved_as(
    store: &dyn IdempotencyStore,
    tenant: &str,
    reference: &Reference,
    record: Record,
    outcome: &Outcome,
    note: &str,
) -> Record {
    match store.lookup(tenant, reference).await {
        Ok(Some(read)) if read.attempt == record.attempt => read,
        _ => Record {
            state: match outcome {
                Outcome::Completed { response, .. } => RecordState::Completed {
                    response: response.clone(),
                },
                Outcome::NotPerformed => RecordState::NotPerformed {
                    note: note::RESOLVED_BY_HAND_NOT_PERFORMED.to_owned(),
                },
            },
            resolution: Some(note.to_owned()),
            ..record
        },
    }
}

/// Resolves an UNKNOWN operation by hand: completed (with its response,
/// and the follow-ons the handler would have declared, written in the
/// same atomic step: the receipt that was never sent), or not performed,
/// with `note` (who and why) kept on the record, where the status tool shows
/// it. An IN_PROGRESS record whose lease ran out counts as UNKNOWN (its
/// process is presumed dead, as the sweep would conclude) once this call
/// has marked it so; if its handler comes back first (or another replica
/// marks it), it is refused with [`ResolveError::Changed`], since the
/// processor may have been checked before the handler's request reached it.
///
/// Fenced by the record's attempt, so it cannot overwrite a resolution or a
/// late completion that lands at the same moment; and idempotent: resolving
/// again the same way with the same note answers the resolved record. Any
/// other record is refused with [`ResolveError::NotUnknown`] and left as it
/// was; a repeated follow-on name is refused with a store error `Invalid`, and
/// nothing is changed. Returns the record as resolved.
pub async fn resolve_by_hand(
    store: &dyn IdempotencyStore,
    tenant: &str,
    reference: &Reference,
    outcome: &Outcome,
    note: &str,
) -> Result<Record, ResolveError> {
    let follow_ons: &[FollowOn] = match outcome {
        Outcome::Completed { follow_ons, .. } => follow_ons,
        Outcome::NotPerformed => &[],
    };
    crate::store::FollowOns::new(follow_ons)?;
    let note = note.trim();
    if note.is_empty() {
        return Err(ResolveError::EmptyNote);
    }
    if note == note::RECONCILED || note == crate::store::resolved_by::REJECTED {
        return Err(ResolveError::ReservedNote);
    }
    if let Outcome::Completed { response, .. } = outcome {
        serde_json::from_str::<serde_json::Value>(response)
            .map_err(|e| ResolveError::InvalidResponse(e.to_string()))?;
    }
    let not_found = || ResolveError::NotFound {
        tenant: tenant.to_owned(),
        reference: *reference,
    };
    let record = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    // What the operator checked the processor against: an UNKNOWN record,
    // or a lapsed one that this call marks UNKNOWN itself. A lapsed record
    // whose handler comes back first (a heartbeat lands before the mark)
    // and then ends UNKNOWN on its own may have sent its request after the
    // operator looked, so it is not resolved on that word.
    let as_seen = if record.is_lapsed() {
        // The sweep's own step, fenced and re-checked.
        match store
            .mark_lapsed(&record.key, record.attempt, note::SWEPT)
            .await
        {
            Ok(marked) => marked,
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => false,
            Err(e) => return Err(e.into()),
        }
    } else {
        true
    };
    let record = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    if !as_seen && matches!(record.state, RecordState::Unknown { .. }) {
        return Err(ResolveError::Changed {
            reference: *reference,
        });
    }
    let resolution = match outcome {
        Outcome::Completed { response, .. } => Resolution::Completed { response },
        Outcome::NotPerformed => Resolution::NotPerformed {
            note: note::RESOLVED_BY_HAND_NOT_PERFORMED,
            settle: Duration::ZERO,
        },
    };
    if matches!(record.state, RecordState::Unknown { .. }) {
        let resolved = match resolution {
            Resolution::Completed { response } => {
                resolve_with_follow_ons(store, &record, response, Some(note), follow_ons).await
            }
            not_performed => {
                store
                    .resolve(&record.key, record.attempt, not_performed, Some(note))
                    .await
            }
        };
        match resolved {
            Ok(()) => {
                if !follow_ons.is_empty() {
                    crate::telemetry::follow_ons_enqueued(follow_ons.len());
                }
                tracing::info!(%reference, tool = %record.tool, "resolved by hand");
                crate::telemetry::resolved_by_hand(outcome.name());
                return Ok(resolved_as(store, tenant, reference, record, outcome, note).await);
            }
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let resolved = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    let same = resolved.resolution.as_deref() == Some(note)
        && match (&resolved.state, outcome) {
            (RecordState::Completed { response }, Outcome::Completed { response: r, .. }) => {
                response == r
            }
            (RecordState::NotPerformed { .. }, Outcome::NotPerformed) => true,
            _ => false,
        };
    if same {
        Ok(resolved)
    } else {
        Err(ResolveError::NotUnknown {
            reference: *reference,
            state: resolved.state.kind(),
        })
    }
}
