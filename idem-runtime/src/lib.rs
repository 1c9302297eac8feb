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

mod canonical;
mod executor;
mod jobs;
mod key;
#[cfg(feature = "rmcp")]
mod mcp;
mod memory;
mod outcome;
mod store;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod durable;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use canonical::{
    canonical_json, canonicalize_str, format_number_es6, CanonicalError,
    MAX_DEPTH as CANONICAL_MAX_DEPTH,
};
pub use executor::{
    Executor, Operation, OperationContext, ScopeSpec, StatusReport, DEFAULT_LEASE,
    DEFAULT_RETENTION,
};
/// The attribute that makes an rmcp tool safe to repeat.
#[cfg(feature = "rmcp")]
pub use idem_macros::{idempotent, tool_router};
pub use jobs::{
    purge, reconcile, sweep, Maintenance, MaintenanceConfig, ReconcileReport, Reconciler,
    Reconciliation,
};
pub use key::{Caller, IdempotencyKey, KeyError, Reference, Scope};
#[cfg(feature = "rmcp")]
#[doc(hidden)]
pub use mcp::__private;
#[cfg(feature = "rmcp")]
pub use mcp::{
    audit_hints, current_reference, request_caller, status_tool, HintProblem, IdempotentServer,
    RESULT_META_KEY, TOOL_META_KEY,
};
pub use memory::MemoryStore;
pub use outcome::{Answer, Classify, Disposition, ToolError};
pub use store::{Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordState, StoreError};

#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
