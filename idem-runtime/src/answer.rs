//! How a handler says it ended, what a call receives, and every word a
//! model reads about it: the answers' states and texts, and the status
//! report.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::key::Reference;
use crate::store::{Reading, Record, RecordStateKind, StoreError};

/// How a failed handler ended, as far as the side effect goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Definitely nothing happened (validation, authorisation, a decline
    /// before any effect): the claim is released so a corrected call can run.
    Rejected,
    /// The side effect may have happened (a timeout against the processor):
    /// the record becomes UNKNOWN and is not run again until it is resolved
    /// ([`Resolver`] says by whom).
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
    /// processor). The record becomes UNKNOWN and is never run again: a
    /// reconciler or an operator resolves it ([`Resolver`]).
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

/// Who resolves an operation whose outcome is unknown, as this server's
/// answers tell the model: set with
/// [`Executor::with_resolver`](crate::Executor::with_resolver).
///
/// Nothing else makes an UNKNOWN record known: it refuses every repeat until
/// a [`Reconciler`](crate::maintenance::Reconciler) or an operator resolves
/// it, or until its retention ends (48 h by default). So every answer about
/// an unknown outcome (the repeat's, the failed call's, the status tool's,
/// `tasks/get`'s) says who will: [`Resolver::Reconciler`] promises a
/// reconciler, and [`Resolver::Operator`] names the command an operator
/// runs, `idem resolve` with the reference.
///
/// It describes the deployment, not this process. Replicas share the store,
/// and a reconciler on any of them resolves every replica's records; so
/// give every replica of one store the same setting, the one that holds
/// for the store: `Reconciler` when some replica's
/// [`Maintenance`](crate::maintenance::Maintenance) runs with a reconciler,
/// even on a replica that runs none itself. A replica that says nothing
/// says `Operator`, the default, which is never a false promise: an
/// operator can resolve any record. [`Maintenance::resolver`] and
/// [`MaintenanceConfig::resolver`] give the setting that matches a
/// maintenance configuration.
///
/// [`Maintenance::resolver`]: crate::maintenance::Maintenance::resolver
/// [`MaintenanceConfig::resolver`]: crate::maintenance::MaintenanceConfig::resolver
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resolver {
    /// A [`Reconciler`](crate::maintenance::Reconciler) runs against the
    /// store and asks the processor; what it cannot settle (a tool it does
    /// not handle, a processor that does not know) waits for an operator.
    Reconciler,
    /// No reconciler runs: each record stays UNKNOWN until an operator
    /// resolves it with `idem resolve` (or
    /// [`resolve_by_hand`](crate::maintenance::resolve_by_hand)). The
    /// default.
    #[default]
    Operator,
}

impl Resolver {
    /// Who resolves operation `reference`, as one sentence of an answer.
    fn resolves(self, reference: impl fmt::Display) -> String {
        match self {
            Resolver::Reconciler => format!(
                "It is being reconciled with the processor by this server's reconciler; what \
                 the reconciler cannot settle, an operator resolves with `idem resolve \
                 {reference}`."
            ),
            Resolver::Operator => format!(
                "No reconciler runs for this server: it stays unknown until an operator \
                 resolves it with `idem resolve {reference}`."
            ),
        }
    }

    /// What the model may tell the user meanwhile.
    fn meanwhile(self) -> &'static str {
        match self {
            Resolver::Reconciler => "tell the user it is under review",
            Resolver::Operator => "tell the user it is waiting for an operator's review",
        }
    }
}

/// Whether an executed call's response was stored for replays when the
/// call was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recording {
    /// Stored before the answer: every repeat, on any replica, replays it.
    Stored,
    /// Being stored in the background, after the answer
    /// ([`Executor::with_background_completions`](crate::Executor::with_background_completions)):
    /// a repeat on this replica replays it from memory, one on another
    /// replica is told the operation is in progress until it lands. If this
    /// process or the store dies first, the record stays in progress, its
    /// lease runs out, the sweep marks it UNKNOWN and the reconciler (or an
    /// operator) finds the effect: a repeat is never run again.
    Pending,
    /// It could not be stored: the result is still real. When the store
    /// failed, the record stays in progress, the sweep marks it UNKNOWN,
    /// and the reconciler (or an operator) resolves it. When the store cannot hold the response (over
    /// its [limit](crate::store::Limits::max_response_bytes), or refused
    /// as invalid), the record is marked UNKNOWN at once with a note that
    /// says why, which a repeat is told.
    Failed,
}

impl Recording {
    /// Whether the response was stored before the answer.
    pub fn is_stored(self) -> bool {
        self == Recording::Stored
    }
}

/// What a call receives: one variant per row of the state table, plus the
/// ways a call is refused before anything runs.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer<T, E> {
    /// The handler ran, once, and returned `value`. The result is real
    /// whatever `recording` says; it says whether a repeat will find it
    /// stored.
    Executed {
        /// What the handler returned.
        value: T,
        /// The operation's reference.
        reference: Reference,
        /// Whether the response was stored for replays.
        recording: Recording,
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
    InProgress {
        /// The operation's reference.
        reference: Reference,
        /// The tool to call with the reference.
        status_tool: String,
        /// When to ask again: what remains of the tool's usual duration
        /// (its recent calls in this process), or as long again as the call
        /// has run so far; at least 1 s, at most what remains of its lease.
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
        /// Who resolves it.
        resolver: Resolver,
    },
    /// The business key is taken by an operation with other arguments;
    /// nothing was run and nothing is replayed.
    Conflict {
        /// The existing operation's reference.
        reference: Reference,
        /// The tool to call with the reference.
        status_tool: String,
    },
    /// The client key names an operation with other arguments (the same
    /// caller sent the same key for another call); nothing was run and
    /// nothing is replayed. Its state is [`AnswerState::Conflict`].
    ClientKeyConflict {
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
        /// Who resolves it, when its disposition is `Unknown`.
        resolver: Resolver,
    },
    /// The call could not be turned into an operation (its arguments cannot
    /// be canonicalized, a business key is missing); nothing was run.
    Refused {
        /// What is wrong with the call.
        reason: String,
    },
    /// The store could not be reached to claim the operation, or confirmed
    /// the claim only after its lease had run out; nothing was run. Calling
    /// again later runs it.
    StoreUnavailable {
        /// The store's error: for the operator's log, never shown to the
        /// model.
        error: StoreError,
    },
    /// The store refused the claim as misconfigured
    /// ([`StoreError::Config`]); nothing was run, and calling again will
    /// not help until the server's configuration is fixed.
    StoreMisconfigured {
        /// The store's error: for the operator's log, never shown to the
        /// model.
        error: StoreError,
    },
}

impl<T, E> Answer<T, E> {
    /// The operation's reference, where there is one.
    pub fn reference(&self) -> Option<Reference> {
        match self {
            Answer::Executed { reference, .. }
            | Answer::Replayed { reference, .. }
            | Answer::InProgress { reference, .. }
            | Answer::Unknown { reference, .. }
            | Answer::Conflict { reference, .. }
            | Answer::ClientKeyConflict { reference, .. }
            | Answer::Failed { reference, .. } => Some(*reference),
            Answer::Refused { .. }
            | Answer::StoreUnavailable { .. }
            | Answer::StoreMisconfigured { .. } => None,
        }
    }

    /// The answer to a claim the store failed: misconfigured for a
    /// [`StoreError::Config`] (retrying cannot help), unavailable for any
    /// other error.
    pub(crate) fn unclaimed(error: StoreError) -> Self {
        match error {
            StoreError::Config(_) => Answer::StoreMisconfigured { error },
            error => Answer::StoreUnavailable { error },
        }
    }

    /// Which answer this is.
    pub fn state(&self) -> AnswerState {
        match self {
            Answer::Executed { .. } => AnswerState::Executed,
            Answer::Replayed { .. } => AnswerState::Replayed,
            Answer::InProgress { .. } => AnswerState::InProgress,
            Answer::Unknown { .. } => AnswerState::Unknown,
            Answer::Conflict { .. } | Answer::ClientKeyConflict { .. } => AnswerState::Conflict,
            Answer::Failed {
                disposition: Disposition::Rejected,
                ..
            } => AnswerState::Rejected,
            Answer::Failed { .. } => AnswerState::FailedUnknown,
            Answer::Refused { .. } => AnswerState::Refused,
            Answer::StoreUnavailable { .. } => AnswerState::StoreUnavailable,
            Answer::StoreMisconfigured { .. } => AnswerState::StoreMisconfigured,
        }
    }

    /// The answer's wire name, [`AnswerState::as_str`].
    pub fn name(&self) -> &'static str {
        self.state().as_str()
    }
}

/// `text` as a sentence of its own: trimmed, and ending in `.`, `!` or `?`,
/// so the handler's message and what follows it read as two sentences.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    match text.chars().last() {
        None => "The tool failed.".to_owned(),
        Some('.' | '!' | '?') => text.to_owned(),
        Some(_) => format!("{text}."),
    }
}

/// Which answer a call got: the `state` of `_meta["idem/operation"]` on a
/// tool result, and what metrics and logs count. [`AnswerState::as_str`] is
/// the one place the wire names are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AnswerState {
    /// The handler ran, once, for this call.
    Executed,
    /// The operation had completed before; its stored response was returned.
    Replayed,
    /// The same operation is running now; nothing ran.
    InProgress,
    /// Nobody knows whether the operation took effect; nothing ran.
    Unknown,
    /// The business key, or the caller's client key, belongs to an
    /// operation with other arguments.
    Conflict,
    /// The handler ran and said nothing happened; the claim was released.
    Rejected,
    /// The handler ran and failed in a way that may have taken effect.
    FailedUnknown,
    /// The call could not be made an operation (bad arguments); nothing ran.
    Refused,
    /// The request carried no caller and the server has no default; nothing
    /// ran.
    NoCaller,
    /// The store could not be reached to claim the operation, or confirmed
    /// the claim only after its lease had run out; nothing ran, and a call
    /// later runs.
    StoreUnavailable,
    /// The store refused the claim as misconfigured; nothing ran, and
    /// calling again will not help until the server's operator fixes its
    /// configuration. A state of its own, so that a client retrying
    /// `store_unavailable` does not retry this, and a metric can alert on it.
    StoreMisconfigured,
}

impl AnswerState {
    /// Every state, in the order the README's table lists them.
    pub const ALL: [AnswerState; 11] = [
        AnswerState::Executed,
        AnswerState::Replayed,
        AnswerState::InProgress,
        AnswerState::Unknown,
        AnswerState::Conflict,
        AnswerState::Rejected,
        AnswerState::FailedUnknown,
        AnswerState::Refused,
        AnswerState::NoCaller,
        AnswerState::StoreUnavailable,
        AnswerState::StoreMisconfigured,
    ];

    /// The wire name: `executed`, `replayed`, `in_progress`, `unknown`,
    /// `conflict`, `rejected`, `failed_unknown`, `refused`, `no_caller`,
    /// `store_unavailable`, `store_misconfigured`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AnswerState::Executed => "executed",
            AnswerState::Replayed => "replayed",
            AnswerState::InProgress => "in_progress",
            AnswerState::Unknown => "unknown",
            AnswerState::Conflict => "conflict",
            AnswerState::Rejected => "rejected",
            AnswerState::FailedUnknown => "failed_unknown",
            AnswerState::Refused => "refused",
            AnswerState::NoCaller => "no_caller",
            AnswerState::StoreUnavailable => "store_unavailable",
            AnswerState::StoreMisconfigured => "store_misconfigured",
        }
    }

    /// Whether the result carries the operation's value (`isError: false`).
    pub const fn has_value(self) -> bool {
        matches!(self, AnswerState::Executed | AnswerState::Replayed)
    }
}

impl fmt::Display for AnswerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<T, E: fmt::Display> Answer<T, E> {
    /// The text a model reads for every answer that is not a value: what
    /// happened, the reference, and the next call to make. `None` for
    /// `Executed` and `Replayed`, whose value is the answer.
    pub fn message(&self) -> Option<String> {
        Some(match self {
            Answer::Executed { .. } | Answer::Replayed { .. } => return None,
            Answer::InProgress {
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
                resolver,
            } => format!(
                "The outcome of operation {reference} is unknown ({note}). It may have taken \
                 effect, so it was not run again. {} Do not submit it again: call \
                 {status_tool} with reference \"{reference}\" to learn how it was resolved.",
                resolver.resolves(reference)
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
            Answer::ClientKeyConflict {
                reference,
                status_tool,
            } => format!(
                "Conflict: this idempotency key already names operation {reference}, made with \
                 different arguments. Nothing was executed. To see that operation, call \
                 {status_tool} with reference \"{reference}\"; for a new operation, send a new \
                 idempotency key."
            ),
            Answer::Failed {
                error,
                reference,
                disposition: Disposition::Rejected,
                ..
            } => format!(
                "{} Nothing was executed for operation {reference}; correct the call and \
                 submit it again.",
                sentence(&error.to_string())
            ),
            Answer::Failed {
                error,
                reference,
                status_tool,
                resolver,
                ..
            } => format!(
                "{} The outcome of operation {reference} is unknown: it may have taken \
                 effect. {} Do not submit it again: call {status_tool} with reference \
                 \"{reference}\" to learn how it was resolved.",
                sentence(&error.to_string()),
                resolver.resolves(reference)
            ),
            Answer::Refused { reason } => format!(
                "The call was refused and nothing was executed: {reason}. Correct the \
                 arguments and call again."
            ),
            // The store's error is the operator's (the claim step logs it):
            // the model reads what happened and what to do, never a
            // driver's words. The claim may have landed with its answer
            // lost, or land later: nothing runs under it and the executor
            // retracts it until it can no longer land, but a retry in
            // between can meet it. Say so, so the model neither gives up nor
            // worries.
            Answer::StoreUnavailable { .. } => text::STORE_UNAVAILABLE.to_owned(),
            Answer::StoreMisconfigured { .. } => text::STORE_MISCONFIGURED.to_owned(),
        })
    }
}

/// What a status lookup finds.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StatusReport {
    /// The reference looked up.
    pub reference: String,
    /// The tool the operation belongs to.
    pub tool: String,
    /// The record's state as it reads to a caller: `UNKNOWN` also for a
    /// claim whose lease ran out. Serialized as its name (`IN_PROGRESS`,
    /// `COMPLETED`, `UNKNOWN`, `NOT_PERFORMED`).
    pub state: RecordStateKind,
    /// When the operation was claimed, in milliseconds since the Unix epoch.
    pub claimed_at_ms: u64,
    /// When it last changed, in milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
    /// The stored response, when completed: the JSON the first call returned
    /// (as a string only if what is stored is not JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<serde_json::Value>,
    /// Why the outcome is unknown, or how it was found not performed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Who resolved the operation, and why, when its handler did not
    /// complete it: an operator's note, or the reconciler's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
    /// What the reader should do next.
    pub next_step: String,
}

impl StatusReport {
    pub(crate) fn from_record(record: &Record, resolver: Resolver) -> Self {
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64
        };
        let mut state = record.state.kind();
        let (response, note, next_step) = match record.reading() {
            Reading::Completed { response } => (
                Some(
                    serde_json::from_str(response)
                        .unwrap_or_else(|_| serde_json::Value::String(response.to_owned())),
                ),
                None,
                "The operation completed; its result is in `response`. Do not submit it again."
                    .to_owned(),
            ),
            Reading::Running { .. } => (
                None,
                None,
                "The operation is still running. Ask again in a few seconds; do not submit it \
                 again."
                    .to_owned(),
            ),
            // A claim whose lease ran out reads as outcome unknown, as a
            // repeat call does.
            Reading::Unknown { note, .. } => {
                state = RecordStateKind::Unknown;
                let next_step = format!(
                    "The outcome is not known yet. {} Do not submit it again; ask again later, \
                     or {}.",
                    resolver.resolves(record.reference),
                    resolver.meanwhile()
                );
                (None, Some(note.to_owned()), next_step)
            }
            Reading::NotPerformed { note } => (
                None,
                Some(note.to_owned()),
                "The operation did not take effect. It is safe to submit it again.".to_owned(),
            ),
        };
        StatusReport {
            reference: record.reference.to_string(),
            tool: record.tool.clone(),
            state,
            claimed_at_ms: ms(record.claimed_at),
            updated_at_ms: ms(record.updated_at),
            response,
            note,
            resolution: record.resolution.clone(),
            next_step,
        }
    }
}

/// The notes kept on an UNKNOWN record and read by models: why the outcome
/// is unknown.
pub(crate) mod note {
    /// What the sweep writes on a lapsed record.
    pub(crate) const SWEPT: &str =
        "its lease ran out before it finished; the process may have died mid-call";
    /// A call future dropped while its handler ran.
    pub(crate) const CANCELLED: &str = "the call was cancelled while its handler ran";
    /// A reconciler found it not performed at the processor.
    pub(crate) const RECONCILED_NOT_PERFORMED: &str =
        crate::store::resolved_by::RECONCILED_NOT_PERFORMED;
    /// An operator resolved it as not performed.
    pub(crate) const RESOLVED_BY_HAND_NOT_PERFORMED: &str =
        "resolved by hand as not performed: it did not take effect";
    /// The resolution note a reconciler's resolution keeps on the record
    /// (completed or not performed), where an operator's keeps their own
    /// note: how [`Record::completed_by`](crate::store::Record::completed_by)
    /// tells the two apart. An operator may not give it as theirs.
    pub(crate) const RECONCILED: &str = crate::store::resolved_by::RECONCILED;

    /// A handler that panicked.
    pub(crate) fn panicked(message: &str) -> String {
        format!("the handler panicked: {message}")
    }

    /// A response that ran but cannot be stored.
    pub(crate) fn unstorable(error: impl std::fmt::Display) -> String {
        format!("the response could not be stored: {error}")
    }

    /// What a note on a response that could not be stored ends with.
    const NOT_REPLAYABLE: &str = "the handler ran and its caller got the result, but no \
        repeat can replay it: check the far side for the effect, and have the tool return \
        less (an identifier to look the rest up by)";

    /// A response over the store's limit ([`Limits::max_response_bytes`]).
    ///
    /// [`Limits::max_response_bytes`]: crate::store::Limits::max_response_bytes
    pub(crate) fn too_large(size: usize, limit: usize) -> String {
        format!(
            "the response could not be stored: {size} bytes, over the store's limit of {limit} \
             bytes; {NOT_REPLAYABLE}"
        )
    }

    /// A completion the store refused as invalid.
    pub(crate) fn refused(error: impl std::fmt::Display) -> String {
        format!("the response could not be stored: {error}; {NOT_REPLAYABLE}")
    }

    /// A completed record whose stored response no longer decodes.
    pub(crate) fn unreadable(error: impl std::fmt::Display) -> String {
        format!("it completed, but its stored response cannot be read ({error})")
    }
}

/// Texts of answers the rmcp glue gives outside [`Answer`].
#[cfg_attr(not(feature = "rmcp"), allow(dead_code))]
pub(crate) mod text {
    use super::Resolver;
    use crate::store::StoreError;

    /// A call with no caller.
    pub(crate) const NO_CALLER: &str = "The call was refused and nothing was executed: the \
        request carries no authenticated caller, and this server has no default caller. Connect \
        with credentials (over HTTP, an Authorization header the server accepts), then call again.";

    /// The status tool found nothing for the caller.
    pub(crate) fn not_found(reference: &str) -> String {
        format!("No operation with reference \"{reference}\" was found for this caller.")
    }

    /// A call whose claim the store could not make, or confirm in time.
    pub(crate) const STORE_UNAVAILABLE: &str = "Nothing was executed: this server could not \
        record the call in its idempotency store, so the tool was not run. It is safe to call \
        again with the same arguments in a little while. If that call answers that the \
        operation is already in progress, it met this call's unconfirmed claim, under which \
        nothing ran and which is being retracted: wait as long as that answer says, then call \
        again, and that call runs.";

    /// A call whose claim the store refused as misconfigured.
    pub(crate) const STORE_MISCONFIGURED: &str = "Nothing was executed: this server's \
        idempotency store is misconfigured, so the tool was not run. Calling again will not help \
        until the server's operator fixes the configuration; tell the user the tool cannot be \
        used for now.";

    /// The status tool or `tasks/get` could not read the store: what the
    /// model reads. The store's error goes to the log, never to the model.
    pub(crate) fn store_unreachable(error: &StoreError) -> &'static str {
        match error {
            StoreError::Config(_) => {
                "This server's idempotency store is misconfigured, so the operation cannot be \
                 looked up. Asking again will not help until the server's operator fixes the \
                 configuration; tell the user it cannot be checked for now."
            }
            _ => "This server's idempotency store cannot be reached right now; ask again shortly.",
        }
    }

    /// The handler ran but what it returned cannot become a tool result.
    pub(crate) fn output_lost(detail: impl std::fmt::Display) -> String {
        format!("The tool ran, but its result could not be returned ({detail}).")
    }

    /// Why a wrapped tool's output is refused when it is not one result.
    pub(crate) const NOT_ONE_RESULT: &str =
        "an idempotent tool must complete in one call; it asked for input or started a task";

    /// `tasks/get` or `tasks/cancel` with no caller.
    pub(crate) const TASK_NO_CALLER: &str = "The request carries no authenticated caller, and \
        this server has no default caller, so no task can be looked up. Connect with \
        credentials, then ask again.";

    /// `tasks/get` or `tasks/cancel` for an id that is not the caller's task.
    pub(crate) fn task_not_found(task_id: &str) -> String {
        format!("No task with id \"{task_id}\" was found for this caller.")
    }

    /// The status message of a task just created.
    pub(crate) fn task_started(reference: &str) -> String {
        format!(
            "Operation {reference} is running. Poll tasks/get with this task id for its result; \
             calling the tool again with the same arguments returns this same task and runs nothing."
        )
    }

    /// A task whose handler is running.
    pub(crate) fn task_running(reference: &str) -> String {
        format!("Operation {reference} is still running. Keep polling; do not call the tool again.")
    }

    /// A completed task.
    pub(crate) fn task_completed(reference: &str) -> String {
        format!("Operation {reference} completed; its result is in `result`.")
    }

    /// A task whose outcome is unknown, and who resolves it.
    pub(crate) fn task_unknown(reference: &str, note: &str, resolver: Resolver) -> String {
        format!(
            "The outcome of operation {reference} is not known yet ({note}). {} Keep polling, \
             less often, or {}; do not call the tool again: a repeat would not run it.",
            resolver.resolves(reference),
            resolver.meanwhile()
        )
    }

    /// A task whose handler rejected the call: nothing happened.
    pub(crate) fn task_rejected(reference: &str, message: &str) -> String {
        format!(
            "{message} (operation {reference} was refused before any side effect; nothing \
             happened. Correct the call and make it again.)"
        )
    }

    /// A task resolved as never having taken effect.
    pub(crate) fn task_not_performed(reference: &str, note: &str) -> String {
        format!(
            "Operation {reference} did not take effect ({note}). It is safe to call the tool again."
        )
    }

    /// A completed task whose stored result cannot be read.
    pub(crate) fn task_unreadable(reference: &str, error: impl std::fmt::Display) -> String {
        format!(
            "Operation {reference} completed, but its stored result cannot be read ({error}). \
             Do not call the tool again; ask the operator."
        )
    }
}
