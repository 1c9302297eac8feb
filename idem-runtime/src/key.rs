//! Operation keys: who called which tool with what, within which scope.

use std::fmt;
use std::time::Duration;

use crate::canonical::CanonicalError;

/// The authenticated principal of a call, taken by the server from the
/// request, never from the arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    tenant: String,
    subject: String,
}

impl Caller {
    /// A caller: `tenant` is the isolation boundary (an account, an
    /// organisation), `subject` the user or service acting inside it.
    pub fn new(tenant: impl Into<String>, subject: impl Into<String>) -> Self {
        Caller {
            tenant: tenant.into(),
            subject: subject.into(),
        }
    }

    /// The tenant: references and records never cross it.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The user or service inside the tenant.
    pub fn subject(&self) -> &str {
        &self.subject
    }
}

/// What makes two calls the same operation, besides caller and tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    /// The key covers the caller and the canonical arguments. A repeat within
    /// this long of the first claim is the same operation (a sliding window,
    /// not a clock bucket).
    Window(Duration),
    /// The key covers the tenant and this business key's canonical value (an
    /// order id, or an object of several fields), not the subject and not the
    /// other arguments. The full arguments are kept as a fingerprint: the same
    /// business key with other arguments is a conflict.
    BusinessKey(serde_json::Value),
}

/// The derived identity of one operation: a SHA-256 key and a fingerprint of
/// the full arguments.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub(crate) key: [u8; 32],
    pub(crate) fingerprint: [u8; 32],
}

/// The ways deriving a key can fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The arguments (or the business key) cannot be written as canonical JSON.
    #[error("the arguments cannot be canonicalized: {0}")]
    Canonical(#[from] CanonicalError),
    /// A business key was empty (`null`, `""` or an empty list/object).
    #[error("the business key is empty; every call needs a value for it")]
    EmptyBusinessKey,
}

impl IdempotencyKey {
    /// Builds a key from raw parts, as a store reads it back.
    pub fn from_parts(key: [u8; 32], fingerprint: [u8; 32]) -> Self {
        IdempotencyKey { key, fingerprint }
    }

    /// The 32 bytes of the SHA-256 key.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.key
    }

    /// The SHA-256 over the tool and the full canonical arguments.
    pub fn fingerprint(&self) -> &[u8; 32] {
        &self.fingerprint
    }

    /// The short reference shown to callers and models, e.g.
    /// `idem_3f9a0c1d2e4b5a69`: the first 64 bits of the key. It is only
    /// looked up together with the caller's tenant.
    pub fn reference(&self) -> Reference {
        Reference::from_key(&self.key)
    }
}

impl fmt::Display for IdempotencyKey {
    /// The 64 lowercase hex digits of the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.key))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKey")
            .field("key", &hex(&self.key))
            .field("fingerprint", &hex(&self.fingerprint))
            .finish()
    }
}

/// The public, tenant-scoped name of an operation: `idem_` and 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference([u8; 8]);

impl Reference {
    const PREFIX: &'static str = "idem_";

    /// The reference of a key: its first eight bytes.
    pub fn from_key(key: &[u8; 32]) -> Self {
        let mut r = [0u8; 8];
        r.copy_from_slice(&key[..8]);
        Reference(r)
    }

    /// Parses `idem_` followed by 16 hex digits; anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let hexpart = text.trim().strip_prefix(Self::PREFIX)?;
        if hexpart.len() != 16 {
            return None;
        }
        let mut r = [0u8; 8];
        for (i, byte) in r.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hexpart.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Reference(r))
    }

    /// The eight bytes: the first eight bytes of the key.
    pub fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

// TEMPORARY until the canonical branch lands: not canonical, not final.
impl IdempotencyKey {
    /// Derives the key (temporary placeholder).
    pub fn derive(
        caller: &Caller,
        tool: &str,
        args: &serde_json::Value,
        scope: &Scope,
    ) -> Result<IdempotencyKey, KeyError> {
        use sha2::{Digest, Sha256};
        let a = Sha256::digest(serde_json::to_vec(args).unwrap());
        let mut h = Sha256::new();
        h.update(caller.tenant().as_bytes());
        match scope {
            Scope::Window(_) => {
                h.update(caller.subject().as_bytes());
                h.update(tool.as_bytes());
                h.update(a);
            }
            Scope::BusinessKey(v) => {
                h.update(tool.as_bytes());
                h.update(serde_json::to_vec(v).unwrap());
            }
        }
        let mut f = Sha256::new();
        f.update(tool.as_bytes());
        f.update(a);
        Ok(IdempotencyKey {
            key: h.finalize().into(),
            fingerprint: f.finalize().into(),
        })
    }
}
