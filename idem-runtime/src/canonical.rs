//! Canonical JSON (RFC 8785, with exact integers).

/// Why a value has no canonical form.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// Placeholder until the canonicalizer lands.
    #[error("not implemented")]
    Unimplemented,
}

/// The canonical JSON text of `value`.
pub fn canonical_json(_value: &serde_json::Value) -> Result<String, CanonicalError> {
    Err(CanonicalError::Unimplemented)
}
