//! idem makes MCP tool calls safe to repeat.
//!
//! An MCP host that sees `idempotentHint: true` retries a tool after a
//! timeout; so do transports, models and clients.
#![cfg_attr(feature = "rmcp", doc = "[`macro@idempotent`]")]
#![cfg_attr(not(feature = "rmcp"), doc = "`#[idempotent]` (feature `rmcp`)")]
//! makes that hint true: the wrapped handler runs its side effect at most once per
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
//! The root holds what an application needs to write and serve a tool.
//!
#![cfg_attr(
    feature = "rmcp",
    doc = "- [`macro@idempotent`] wraps an rmcp tool in the [`Executor`] and gives it
  `idempotentHint: true`; [`macro@tool_router`] on the impl refuses a hint
  no wrapper backs and adds the status tool ([`status_tool`]);
  [`audit_hints`] checks the served router at start-up."
)]
#![cfg_attr(
    not(feature = "rmcp"),
    doc = "- `#[idempotent]` (feature `rmcp`, default) wraps an rmcp tool in the
  [`Executor`] and gives it `idempotentHint: true`; `#[tool_router]` on the
  impl refuses a hint no wrapper backs and adds the status tool;
  `audit_hints` checks the served router at start-up."
)]
//! - The [`Executor`] derives the operation's [`IdempotencyKey`] (canonical
//!   JSON, [`canonical`]), claims a record in an [`IdempotencyStore`]
//!   before the side effect, records the outcome after it, and answers every
//!   repeat from the record: in progress, replayed, unknown or conflict (see
//!   [`Answer`] and [`AnswerState`]).
//! - Stores: [`MemoryStore`], `SqliteStore` (feature `sqlite`, default),
//!   `PostgresStore` (`postgres`), `RedisStore` (`redis`), `DynamoDbStore`
//!   (`dynamodb`); [`open_store`]
//!   opens one from its URL.
//!
//! The rest lives in a module of its own:
//!
//! - [`maintenance`]: the loop that purges, sweeps dead calls to UNKNOWN and
//!   reconciles them through your
//!   [`Reconciler`](maintenance::Reconciler); an operator's
//!   [`resolve_by_hand`](maintenance::resolve_by_hand) for what nobody can
//!   reconcile.
//! - [`outbox`]: follow-on work. A handler declares jobs with [`follow_on`]
//!   (a receipt after a charge), written with its completion; an
//!   [`Outbox`](outbox::Outbox) dispatcher runs each at least once through
//!   your [`JobHandlers`](outbox::JobHandlers), with a stable downstream
//!   key, retries with backoff, and a dead letter.
//! - [`store`]: the contract a store implements ([`IdempotencyStore`],
//!   [`FollowOnStore`](store::FollowOnStore)), the records and jobs it
//!   keeps, and (feature `conformance`) the suite a store of your own runs.
//! - [`canonical`]: the RFC 8785 canonical JSON the keys hash.
//! - Operating it: calls, store latencies and maintenance are counted
//!   through the `metrics` facade (feature `metrics`, default; the names are
//!   in the README's "Operating it"), each call runs in an `idem.call`
//!   tracing span, and the `idem` command line (the `idem-cli` crate:
//!   `cargo install idem-cli`) lists, shows, resolves by hand, purges and
//!   counts records.
// On docs.rs (`--cfg docsrs`, nightly rustdoc), each item is labelled with
// the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod answer;
pub mod canonical;
mod executor;
mod future;
mod key;
pub mod maintenance;
#[cfg(feature = "rmcp")]
mod mcp;
pub mod outbox;
mod random;
pub mod store;
mod telemetry;
#[cfg(feature = "rmcp")]
mod time;

// The root holds what an application needs to write and serve a tool; a
// store author's, an operator's and the background loops' names live in
// `store`, `maintenance`, `outbox` and `canonical`.
pub use answer::{
    Answer, AnswerState, Classify, Disposition, Recording, Resolver, StatusReport, ToolError,
};
/// The attribute a [`Reconciler`](maintenance::Reconciler) implementation needs (its method is
/// `async`), re-exported so that implementing it takes no dependency of your
/// own: `#[idem_runtime::async_trait]` on the `impl` block.
pub use async_trait::async_trait;
pub use executor::{
    ConfigError, Executor, Operation, OperationContext, ScopeSpec, TaskCancellation,
    DEFAULT_CLIENT_KEY_RETENTION, DEFAULT_LEASE, DEFAULT_RETENTION, MAX_TOOL_WINDOW,
};
/// The attribute that makes an rmcp tool safe to repeat.
#[cfg(feature = "rmcp")]
pub use idem_macros::{idempotent, tool_router};
pub use key::{
    valid_client_key, Caller, IdempotencyKey, KeyError, Reference, Scope, MAX_CLIENT_KEY_LEN,
};
#[cfg(feature = "rmcp")]
#[doc(hidden)]
pub use mcp::private as __private;
#[cfg(feature = "rmcp")]
pub use mcp::{
    audit_hints, current_cancellation, current_reference, list_tools, request_caller,
    request_client_key, status_tool, stored_response, tasks, ClientKeyMode, HintProblem,
    IdempotentServer, CLIENT_KEY_HEADER, CLIENT_KEY_META, RESULT_META_KEY, TOOL_META_KEY,
};
#[cfg(feature = "rmcp")]
pub use mcp::{current_continuation, hint_report, Ask, Continuation, HintBacking};
pub use outbox::follow_on;
pub use store::{open_store, IdempotencyStore, MemoryStore, StoreError};
#[cfg(feature = "dynamodb")]
pub use store::{DynamoDbStore, DynamoDbStoreBuilder};
#[cfg(feature = "postgres")]
pub use store::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
pub use store::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use store::{SqliteStore, SqliteStoreBuilder};
