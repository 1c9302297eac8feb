//! idem makes MCP tool calls safe to repeat.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod canonical;
mod key;
mod store;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod durable;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use canonical::{canonical_json, CanonicalError};
pub use key::{Caller, IdempotencyKey, KeyError, Reference, Scope};
pub use store::{Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordState, StoreError};

#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
