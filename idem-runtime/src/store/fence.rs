//! The fencing rule every store applies: whether a write fenced by an
//! attempt may change the record it found, and the refusal when it may not.

use super::{Attempt, RecordStateKind, StoreError};

/// Whether a write fenced by `attempt` may change the record found under
/// its key (`found`: its owner and state, `None` when there is none) from
/// one of the states `from`: `Fenced` when the record is gone or another
/// attempt owns it (a worker that lost its claim must not touch the new
/// owner's record), `WrongState` when it is in none of `from`. The one
/// judgement behind every store's "fenced, or in the wrong state".
pub(crate) fn fence(
    found: Option<(Attempt, RecordStateKind)>,
    attempt: Attempt,
    from: &[RecordStateKind],
) -> Result<(), StoreError> {
    match found {
        Some((owner, state)) if owner == attempt => match from.contains(&state) {
            true => Ok(()),
            false => Err(StoreError::WrongState { found: state }),
        },
        _ => Err(StoreError::Fenced),
    }
}

/// Why a fenced write that changed nothing was refused, from the record
/// found under its key afterwards: [`fence`] with no state allowed, for a
/// store whose statement judged the state itself.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn refusal(found: Option<(Attempt, RecordStateKind)>, attempt: Attempt) -> StoreError {
    match fence(found, attempt, &[]) {
        Err(refused) => refused,
        Ok(()) => unreachable!("no state is allowed"),
    }
}
