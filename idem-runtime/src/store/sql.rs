//! What the SQL stores share.

use crate::key::Reference;

/// The smallest and largest 32-byte keys that start with `reference`: the
/// reference is the key's first eight bytes, so a range over the primary key
/// finds it without a column or an index of its own.
pub(crate) fn key_range(reference: &Reference) -> ([u8; 32], [u8; 32]) {
    let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
    lo[..8].copy_from_slice(reference.as_bytes());
    hi[..8].copy_from_slice(reference.as_bytes());
    (lo, hi)
}
