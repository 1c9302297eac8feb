//! How a handler says it ended, and what a call receives.

use std::fmt;
use std::time::Duration;

use crate::key::Reference;
use crate::store::StoreError;

/// How a failed handler ended, as far as the side effect goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Definitely nothing happened (validation, authorisation, a decline
    /// before any effect): the claim is released so a corrected call can run.
    Rejected,
    /// The side effect may have happened (a timeout against the processor):
    /// the record becomes UNKNOWN and is not run again until reconciled.
    Unknown,
}

/// Classifies a handler's error. An error that is not classified counts as
/// [`Disposition::Unknown`]: the pessimistic default is "not safe to repeat".
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say whether the side effect happened",
    label = "`{Self}` does not implement `idem_runtime::Classify`",
    note = "return `idem_runtime::ToolError` (`ToolError::rejected(..)` when nothing happened, `ToolError::unknown(..)` otherwise), or implement `Classify` for your error type (`impl Classify for MyError {{}}` counts every error as unknown)"
)]
pub trait Classify {
    /// How the handler ended.
    fn disposition(&self) -> Disposition {
        Disposition::Unknown
    }
}

impl Classify for String {}
impl Classify for &str {}
impl Classify for Box<dyn std::error::Error + Send + Sync> {}

/// A handler error that says whether anything happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    disposition: Disposition,
    message: String,
}

impl ToolError {
    /// Nothing happened (bad input, a decline before any effect). The claim is
    /// released; the caller may correct the call and submit it again.
    pub fn rejected(message: impl Into<String>) -> Self {
        ToolError {
            disposition: Disposition::Rejected,
            message: message.into(),
        }
    }

    /// The side effect may have happened (a timeout, a lost connection to the
    /// processor). The record becomes UNKNOWN and is reconciled, never re-run.
    pub fn unknown(message: impl Into<String>) -> Self {
        ToolError {
            disposition: Disposition::Unknown,
            message: message.into(),
        }
    }

    /// The message given by the handler.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

impl Classify for ToolError {
    fn disposition(&self) -> Disposition {
        self.disposition
    }
}

/// What a call receives: one variant per row of the state table, plus the
/// ways a call is refused before anything runs.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer<T, E> {
    /// The handler ran, once, and returned `value`. `recorded` is false when
    /// the completion could not be written: the result is still real, and the
    /// sweep will resolve the record.
    Executed {
        /// What the handler returned.
        value: T,
        /// The operation's reference.
        reference: Reference,
        /// Whether the response was stored for replays.
        recorded: bool,
    },
    /// The operation had completed before: the stored response, not run again.
    Replayed {
        /// The stored response, decoded.
        value: T,
        /// The stored response exactly as first serialized.
        stored: String,
        /// The operation's reference.
        reference: Reference,
    },
    /// The same operation is running now; nothing was run.
    InFlight {
        /// The operation's reference.
        reference: Reference,
        /// The tool to call with the reference.
        status_tool: String,
        /// When to ask again: what remains of the running call's lease.
        retry_after: Duration,
    },
    /// Nobody knows whether the operation took effect; nothing was run.
    Unknown {
        /// The operation's reference.
        reference: Reference,
        /// The tool to call with the reference.
        status_tool: String,
        /// Why the outcome is unknown.
        note: String,
    },
    /// The business key is taken by an operation with other arguments;
    /// nothing was run and nothing is replayed.
    Conflict {
        /// The existing operation's reference.
        reference: Reference,
        /// The tool to call with the reference.
        status_tool: String,
    },
    /// The handler ran and returned an error.
    Failed {
        /// The handler's error.
        error: E,
        /// The operation's reference.
        reference: Reference,
        /// Released (`Rejected`) or kept UNKNOWN (`Unknown`).
        disposition: Disposition,
        /// The tool to call with the reference.
        status_tool: String,
    },
    /// The call could not be turned into an operation (its arguments cannot
    /// be canonicalized, a business key is missing); nothing was run.
    Refused {
        /// What is wrong with the call.
        reason: String,
    },
    /// The store could not be reached to claim the operation; nothing was run.
    StoreUnavailable {
        /// The store's error.
        error: StoreError,
    },
}

impl<T, E> Answer<T, E> {
    /// The operation's reference, where there is one.
    pub fn reference(&self) -> Option<Reference> {
        match self {
            Answer::Executed { reference, .. }
            | Answer::Replayed { reference, .. }
            | Answer::InFlight { reference, .. }
            | Answer::Unknown { reference, .. }
            | Answer::Conflict { reference, .. }
            | Answer::Failed { reference, .. } => Some(*reference),
            Answer::Refused { .. } | Answer::StoreUnavailable { .. } => None,
        }
    }

    /// A short machine name: `executed`, `replayed`, `in_progress`, `unknown`,
    /// `conflict`, `rejected`, `failed_unknown`, `refused`, `store_unavailable`.
    pub fn kind(&self) -> &'static str {
        match self {
            Answer::Executed { .. } => "executed",
            Answer::Replayed { .. } => "replayed",
            Answer::InFlight { .. } => "in_progress",
            Answer::Unknown { .. } => "unknown",
            Answer::Conflict { .. } => "conflict",
            Answer::Failed {
                disposition: Disposition::Rejected,
                ..
            } => "rejected",
            Answer::Failed { .. } => "failed_unknown",
            Answer::Refused { .. } => "refused",
            Answer::StoreUnavailable { .. } => "store_unavailable",
        }
    }
}

impl<T, E: fmt::Display> Answer<T, E> {
    /// The text a model reads for every answer that is not a value: what
    /// happened, the reference, and the next call to make. `None` for
    /// `Executed` and `Replayed`, whose value is the answer.
    pub fn message(&self) -> Option<String> {
        Some(match self {
            Answer::Executed { .. } | Answer::Replayed { .. } => return None,
            Answer::InFlight {
                reference,
                status_tool,
                retry_after,
            } => format!(
                "Operation {reference} is already in progress; this call did not run it again. \
                 Do not submit it again: call {status_tool} with reference \"{reference}\" \
                 to get its result; if it is still running, ask again within {} s.",
                retry_after.as_secs().max(1)
            ),
            Answer::Unknown {
                reference,
                status_tool,
                note,
            } => format!(
                "The outcome of operation {reference} is unknown ({note}). It may have taken \
                 effect, so it was not run again. Do not submit it again: call {status_tool} \
                 with reference \"{reference}\" to learn how it was resolved."
            ),
            Answer::Conflict {
                reference,
                status_tool,
            } => format!(
                "Conflict: operation {reference} already exists for this business key with \
                 different arguments. Nothing was executed. To see the existing operation, call \
                 {status_tool} with reference \"{reference}\"; for a new operation, use a new \
                 business key."
            ),
            Answer::Failed {
                error,
                reference,
                disposition: Disposition::Rejected,
                ..
            } => format!(
                "{error} Nothing was executed for operation {reference}; correct the call and \
                 submit it again."
            ),
            Answer::Failed {
                error,
                reference,
                status_tool,
                ..
            } => format!(
                "{error} The outcome of operation {reference} is unknown: it may have taken \
                 effect. Do not submit it again: call {status_tool} with reference \
                 \"{reference}\" to learn how it was resolved."
            ),
            Answer::Refused { reason } => format!(
                "The call was refused and nothing was executed: {reason}. Correct the \
                 arguments and call again."
            ),
            Answer::StoreUnavailable { error } => format!(
                "Nothing was executed: {error}. It is safe to call again with the same \
                 arguments in a little while."
            ),
        })
    }
}
