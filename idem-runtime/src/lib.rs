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
//! What it does: `#[idempotent]` claims a record before the handler runs
//! and records the outcome after it; `#[idem_runtime::tool_router]` adds
//! the status tool (`get_operation_status`) and refuses a hand-written hint
//! nothing backs. Return `ToolError::rejected(..)` when nothing happened
//! (the claim is released) and `ToolError::unknown(..)` when it may have
//! (the record waits for reconciliation; the call is not run again). Give
//! the processor `current_reference()` as its own idempotency key.
//!
//! # Choosing what names an operation
//!
//! - `window = "15m"`: the same caller, tool and arguments within 15
//!   minutes are one operation; after it, the same call is a new one.
//! - `business_key = "order_id"` (or several fields): the field's value
//!   names the operation within the tenant, whoever asks; the same value
//!   with other arguments is a conflict. Kept 48 h unless `window` says.
//! - `client_key = "optional"` or `"required"`: the host's key
//!   (`_meta["idem/idempotency-key"]` or the `Idempotency-Key` header)
//!   names it, for 24 h.
//! - `by_construction = "why"`: no record; the tool's own code makes a
//!   repeat harmless.
//!
//! # Stores
//!
//! | store | URL for [`open_store`] | for |
//! | --- | --- | --- |
//! | [`MemoryStore`] | `memory` | tests, one process |
//! | `SqliteStore` (`sqlite`, default) | `sqlite:PATH` | one service, durable |
//! | `PostgresStore` (`postgres`) | `postgres://USER@HOST/DB?schema=NAME` | several replicas |
//! | `RedisStore` (`redis`) | `redis://HOST:6379` | several replicas on Redis or Valkey |
//! | `DynamoDbStore` (`dynamodb`) | `dynamodb://TABLE?region=R` (an emulator: `&endpoint=URL`) | AWS Lambda, teams on AWS |
//!
//! # What an answer means
//!
//! Every result carries `_meta["idem/operation"]` with the reference and
//! an [`AnswerState`](answer::AnswerState): `executed` (ran once), `replayed` (the stored
//! result), `in_progress`, `unknown` (a repeat met an operation whose
//! outcome nobody knows), `failed_unknown` (this call's handler failed in a
//! way that may have taken effect), `conflict`, `rejected`, `refused`,
//! `no_caller`, `store_unavailable`, `store_misconfigured`. Only `executed`
//! ran the handler; after `unknown` or `failed_unknown`, the model must not
//! submit again: the [`Reconciler`](maintenance::Reconciler) (or an operator
//! with `idem resolve`) settles it.
//!
//! # Operating it
//!
//! Run [`Maintenance`](maintenance::Maintenance) (purge, sweep, reconcile)
//! and [`FollowOnDispatcher`](follow_ons::FollowOnDispatcher) (follow-ons) beside the server in every
//! replica, or their `round`s from a schedule on AWS Lambda. A reconciler
//! that finds an operation performed answers with its response and the
//! follow-ons the handler would have declared
//! ([`Outcome::completed_with`](maintenance::Outcome::completed_with)).
//!
//! The guide, with a server over HTTP, the stores' limits, deployment and
//! upgrades, is the README and the pages under `docs/` of
//! <https://github.com/idem-rs/idem>.
//!
//! # The parts
//!
//! The root holds what an application needs to write and serve a tool.
//!
#![cfg_attr(
    feature = "rmcp",
    doc = "- [`macro@idempotent`] wraps an rmcp tool in the [`Executor`] and gives it
  `idempotentHint: true`; [`macro@tool_router`] on the impl refuses a hint
  no wrapper backs and adds the status tool ([`status_tool`](mcp::status_tool));
  [`audit_hints`] checks the served router at start-up."
)]
#![cfg_attr(
    not(feature = "rmcp"),
    doc = "- `#[idempotent]` (feature `rmcp`, default) wraps an rmcp tool in the
  [`Executor`] and gives it `idempotentHint: true`; `#[tool_router]` on the
  impl refuses a hint no wrapper backs and adds the status tool;
  `audit_hints` checks the served router at start-up."
)]
//! - The [`Executor`] derives the operation's [`IdempotencyKey`](key::IdempotencyKey) (canonical
//!   JSON, [`canonical`](key::canonical)), claims a record in an [`IdempotencyStore`]
//!   before the side effect, records the outcome after it, and answers every
//!   repeat from the record: in progress, replayed, unknown or conflict (see
//!   [`Answer`](answer::Answer) and [`AnswerState`](answer::AnswerState)).
//! - Stores: [`MemoryStore`], `SqliteStore` (feature `sqlite`, default),
//!   `PostgresStore` (`postgres`), `RedisStore` (`redis`), `DynamoDbStore`
//!   (`dynamodb`); [`open_store`]
//!   opens one from its URL.
//!
//! The rest lives in a module of its own:
//!
//! - [`answer`]: what a call receives ([`Answer`](answer::Answer), its
//!   [`AnswerState`](answer::AnswerState), the status report).
//! - [`executor`]: an operation run without the macro
//!   ([`ScopeSpec`](executor::ScopeSpec), [`Operation`](executor::Operation)),
//!   and the defaults of windows, leases and retentions.
//! - [`key`]: operation keys, their scopes, and the canonical JSON they hash.
//! - `mcp` (feature `rmcp`): the rmcp glue beyond the attributes: the
//!   status tool, MCP tasks, client keys, tools that ask first, and the
//!   hints' report.
//! - [`maintenance`]: the loop that purges, sweeps dead calls to UNKNOWN and
//!   reconciles them through your
//!   [`Reconciler`](maintenance::Reconciler); an operator's
//!   [`resolve_by_hand`](maintenance::resolve_by_hand) for what nobody can
//!   reconcile.
//! - [`follow_ons`]: follow-on work. A handler declares follow-ons with [`follow_on`]
//!   (a receipt after a charge), written with its completion; an
//!   [`FollowOnDispatcher`](follow_ons::FollowOnDispatcher) runs each at least once through
//!   your [`FollowOnHandlers`](follow_ons::FollowOnHandlers), with a stable downstream
//!   key, retries with backoff, and a dead letter.
//! - [`store`]: the contract a store implements ([`IdempotencyStore`],
//!   [`FollowOnStore`](store::FollowOnStore)), the records and follow-ons it
//!   keeps, and (feature `conformance`) the suite a store of your own runs.
//! - Operating it: calls, store latencies and maintenance are counted
//!   through the `metrics` facade (feature `metrics`, default; the names are
//!   in docs/operating.md), each call runs in an `idem.call`
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

pub mod answer;
pub mod executor;
pub mod follow_ons;
mod future;
pub mod key;
pub mod maintenance;
#[cfg(feature = "rmcp")]
pub mod mcp;
mod random;
pub mod store;
mod telemetry;
mod time;

// The root holds what writing and serving a tool needs. The rest lives in
// named modules: `answer` (what a call receives), `executor` (running an
// operation without the macro), `key` (operation keys and their canonical
// JSON), `mcp` (the rmcp glue: the status tool, tasks, client keys, the
// hints' audit), `store` (the stores' contracts and builders),
// `maintenance` and `follow_ons`.
pub use answer::{Classify, ToolError};
/// The attribute a [`Reconciler`](maintenance::Reconciler) or a store
/// implementation needs (their methods are `async`), re-exported so that
/// implementing one takes no dependency of your own:
/// `#[idem_runtime::async_trait]` on the `impl` block.
pub use async_trait::async_trait;
pub use executor::{current_reference, Executor};
pub use follow_ons::follow_on;
/// The attribute that makes an rmcp tool safe to repeat.
#[cfg(feature = "rmcp")]
pub use idem_macros::{idempotent, tool_router};
pub use key::{Caller, Reference};
#[cfg(feature = "rmcp")]
#[doc(hidden)]
pub use mcp::private as __private;
#[cfg(feature = "rmcp")]
pub use mcp::{audit_hints, Ask, IdempotentServer};
#[cfg(feature = "dynamodb")]
pub use store::DynamoDbStore;
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{open_store, IdempotencyStore, MemoryStore, StoreError};
