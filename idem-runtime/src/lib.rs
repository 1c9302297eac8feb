//! idem makes MCP tool calls safe to repeat.
//!
//! An MCP host that sees `idempotentHint: true` retries a tool after a
//! timeout; so do transports, models and clients. [`macro@idempotent`] makes
//! that hint true: the wrapped handler runs its side effect at most once per
//! operation (*this caller, this tool, these arguments, within this scope*),
//! and every repeat is answered from a record.
//!
//! # Quick start
//!
//! A complete stdio server (dependencies: `idem-runtime`, `rmcp` with
//! `server`, `macros` and `transport-io`, `tokio` with `macros`,
//! `rt-multi-thread` and `io-std`, `serde`, `schemars`):
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use idem_runtime::{audit_hints, idempotent, Caller, Executor, IdempotentServer, SqliteStore, ToolError};
//! use rmcp::handler::server::wrapper::{Json, Parameters};
//! use rmcp::{tool, ServiceExt};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct ChargeArgs {
//!     card: String,
//!     amount_cents: u64,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct Receipt {
//!     charge_id: String,
//! }
//!
//! #[derive(Clone)]
//! struct Payments {
//!     executor: Executor,
//!     local_user: Caller,
//! }
//!
//! impl IdempotentServer for Payments {
//!     fn executor(&self) -> &Executor {
//!         &self.executor
//!     }
//!     // stdio serves one local user; over HTTP an auth layer supplies the caller.
//!     fn default_caller(&self) -> Option<&Caller> {
//!         Some(&self.local_user)
//!     }
//! }
//!
//! // Instead of rmcp's #[tool_router]: adds the status tool, serves the router.
//! #[idem_runtime::tool_router(server_handler)]
//! impl Payments {
//!     #[idempotent(window = "15m")]
//!     #[tool(description = "Charge a card")]
//!     async fn charge_card(
//!         &self,
//!         Parameters(args): Parameters<ChargeArgs>,
//!     ) -> Result<Json<Receipt>, ToolError> {
//!         // Pass this to the processor as its idempotency key.
//!         let reference = idem_runtime::current_reference().expect("inside #[idempotent]");
//!         Ok(Json(Receipt { charge_id: format!("ch_{reference}_{}", args.card) }))
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     audit_hints(&Payments::tool_router()).map_err(|p| format!("{p:?}"))?;
//!     let store = Arc::new(SqliteStore::open("idem.sqlite3").await?);
//!     let server = Payments { executor: Executor::new(store), local_user: Caller::new("local", "me") };
//!     server.serve(rmcp::transport::stdio()).await?.waiting().await?;
//!     Ok(())
//! }
//! ```
//!
//! # The parts
//!
//! - [`macro@idempotent`] wraps an rmcp tool in the [`Executor`] and gives it
//!   `idempotentHint: true`; [`macro@tool_router`] on the impl refuses a hint
//!   no wrapper backs and adds the status tool ([`status_tool`]);
//!   [`audit_hints`] checks the served router at start-up.
//! - The [`Executor`] derives the operation's [`IdempotencyKey`] (canonical
//!   JSON, [`canonical_json`]), claims a record in an [`IdempotencyStore`]
//!   before the side effect, records the outcome after it, and answers every
//!   repeat from the record: in flight, replayed, unknown or conflict (see
//!   [`Answer`] and [`AnswerState`]).
//! - Stores: [`MemoryStore`], `SqliteStore` (feature `sqlite`, default),
//!   `PostgresStore` (`postgres`), `RedisStore` (`redis`); a store of your
//!   own runs the same conformance suite (`conformance`).
//! - [`Maintenance`] purges, sweeps dead calls to UNKNOWN and reconciles them
//!   through your [`Reconciler`]; [`resolve_by_hand`] is for what nobody can
//!   reconcile.
//! - Follow-on work: a handler declares jobs with [`follow_on`] (a receipt
//!   after a charge), written with its completion; an [`Outbox`] dispatcher
//!   runs each at least once through your [`JobHandlers`], with a stable
//!   downstream key, retries with backoff, and a dead letter.
//! - Operating it: calls, store latencies and maintenance are counted
//!   through the `metrics` facade (feature `metrics`, default; the names are
//!   in the README's "Operating it"), each call runs in an `idem.call`
//!   tracing span, and the `idem` command line (feature `cli`, module
//!   `cli`) lists, shows, resolves by hand, purges and counts records;
//!   [`open_store`] opens a store from its URL.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod answer;
#[cfg(feature = "cli")]
pub mod cli;
mod executor;
mod future;
mod key;
mod maintenance;
#[cfg(feature = "rmcp")]
mod mcp;
mod outbox;
mod store;
mod telemetry;
#[cfg(any(feature = "cli", feature = "rmcp"))]
mod time;

pub use answer::{Answer, AnswerState, Classify, Disposition, StatusReport, ToolError};
/// The attribute a [`Reconciler`] implementation needs (its method is
/// `async`), re-exported so that implementing it takes no dependency of your
/// own: `#[idem_runtime::async_trait]` on the `impl` block.
pub use async_trait::async_trait;
pub use executor::{
    Executor, Operation, OperationContext, ScopeSpec, TaskCancellation, DEFAULT_LEASE,
    DEFAULT_RETENTION,
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
    purge, reconcile, resolve_by_hand, resolve_by_hand_with_follow_ons, sweep, Maintenance,
    MaintenanceConfig, ManualOutcome, ReconcileConfig, ReconcileReport, Reconciler, Reconciliation,
    ResolveError,
};
#[cfg(feature = "rmcp")]
#[doc(hidden)]
pub use mcp::private as __private;
#[cfg(feature = "rmcp")]
pub use mcp::{
    audit_hints, current_cancellation, current_reference, request_caller, status_tool,
    stored_response, tasks, HintProblem, IdempotentServer, RESULT_META_KEY, TOOL_META_KEY,
};
pub use outbox::{
    follow_on, job_fn, DispatchReport, JobError, JobFn, JobHandler, JobHandlers, JobRun, Outbox,
    OutboxConfig, MAX_JOB_ERROR,
};
/// The store conformance suite, for a store of your own: see
/// [`conformance_tests!`].
#[cfg(feature = "conformance")]
pub use store::conformance;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{
    is_valid_job_name, open_store, Attempt, Claim, ClaimRequest, FollowOn, FollowOnError,
    FollowOnStore, IdempotencyStore, JobFilter, JobId, MemoryStore, OutboxJob, Reading, Record,
    RecordFilter, RecordState, RecordStateKind, Resolution, StateCounts, StoreError,
    DEFAULT_LIST_LIMIT, DEFAULT_MAX_PAYLOAD, MAX_JOB_NAME,
};
#[cfg(feature = "postgres")]
pub use store::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
pub use store::{RedisStore, RedisStoreBuilder};
