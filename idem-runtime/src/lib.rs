//! idem makes MCP tool calls safe to repeat.
//!
//! An operation is *this caller, this tool, these arguments, within this
//! scope*. The [`Executor`] derives the operation's [`IdempotencyKey`], claims
//! a record in an [`IdempotencyStore`] before the side effect, records the
//! outcome after it, and answers every repeat from the record: in flight,
//! replayed, unknown or conflict (see [`Answer`]).
//!
//! With the `rmcp` feature (on by default), [`macro@idempotent`] wraps an rmcp
//! tool in the executor and gives it `idempotentHint: true`;
//! [`macro@tool_router`] on the impl refuses a hint no wrapper backs, and
//! [`audit_hints`] checks a finished router at start-up.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod answer;
mod executor;
mod key;
mod maintenance;
#[cfg(feature = "rmcp")]
mod mcp;
mod store;

pub use answer::{Answer, AnswerState, Classify, Disposition, StatusReport, ToolError};
pub use executor::{
    Executor, Operation, OperationContext, ScopeSpec, DEFAULT_LEASE, DEFAULT_RETENTION,
};
/// The attribute that makes an rmcp tool safe to repeat.
#[cfg(feature = "rmcp")]
pub use idem_macros::{idempotent, tool_router};
pub use key::canonical::{
    canonical_json, canonicalize_str, format_number_es6, CanonicalError,
    MAX_DEPTH as CANONICAL_MAX_DEPTH,
};
pub use key::{Caller, IdempotencyKey, KeyError, Reference, Scope};
pub use maintenance::{
    purge, reconcile, resolve_by_hand, sweep, Maintenance, MaintenanceConfig, ManualOutcome,
    ReconcileConfig, ReconcileReport, Reconciler, Reconciliation, ResolveError,
};
#[cfg(feature = "rmcp")]
#[doc(hidden)]
pub use mcp::private as __private;
#[cfg(feature = "rmcp")]
pub use mcp::{
    audit_hints, current_reference, request_caller, status_tool, HintProblem, IdempotentServer,
    RESULT_META_KEY, TOOL_META_KEY,
};
/// The store conformance suite, for a store of your own: see
/// [`conformance_tests!`].
#[cfg(feature = "conformance")]
pub use store::conformance;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{
    Attempt, Claim, ClaimRequest, IdempotencyStore, MemoryStore, Record, RecordState,
    RecordStateKind, Resolution, StoreError,
};
#[cfg(feature = "postgres")]
pub use store::{PostgresStore, PostgresStoreBuilder};
