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

pub use canonical::{
    canonical_json, canonicalize_str, format_number_es6, CanonicalError,
    MAX_DEPTH as CANONICAL_MAX_DEPTH,
};
pub use key::{Caller, IdempotencyKey, KeyError, Reference, Scope};
pub use store::{Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordState, StoreError};
