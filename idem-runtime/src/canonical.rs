//! RFC 8785 (JSON Canonicalization Scheme): the canonical text an
//! operation's key is the hash of. Two argument objects that mean the same
//! JSON (keys in any order, `1.0` and `1`, escapes spelled differently) have
//! one canonical text, so they name one operation.

pub use crate::key::canonical::{
    canonical_json, canonicalize_str, format_number_es6, CanonicalError, MAX_DEPTH,
};
