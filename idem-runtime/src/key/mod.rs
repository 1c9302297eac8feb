//! Operation keys: who called which tool with what, within which scope.

use std::cell::RefCell;
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

pub mod canonical;

use canonical::{write_canonical, CanonicalError, Sink};

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
    /// The key covers the caller (tenant and subject) and a key the client
    /// sent outside the arguments (`_meta["idem/idempotency-key"]`, or the
    /// `Idempotency-Key` header): the host says which calls are one
    /// operation. The full arguments are kept as a fingerprint: the same
    /// client key with other arguments is a conflict. A valid client key is
    /// 1 to 255 visible ASCII characters ([`valid_client_key`]).
    ClientKey(String),
}

/// The longest client key accepted, in bytes (each one visible ASCII
/// character).
pub const MAX_CLIENT_KEY_LEN: usize = 255;

/// Whether `key` is a valid client key: 1 to [`MAX_CLIENT_KEY_LEN`]
/// characters, each visible ASCII (`!` to `~`, 0x21 to 0x7E: no space, no
/// control character, nothing outside ASCII). Anything else is refused
/// before anything runs; it is never trimmed or normalized, so two keys
/// are one only when they are byte for byte the same.
pub fn valid_client_key(key: &str) -> bool {
    (1..=MAX_CLIENT_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
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
    /// A business key was empty: `null`, `""`, or an array or object holding
    /// only such values.
    #[error(
        "the business key is empty (null, \"\", or only empty values); \
         every call needs a value for it, so fill in the business-key field(s)"
    )]
    EmptyBusinessKey,
    /// A client key that is empty, longer than 255 bytes, or holds a
    /// character outside visible ASCII.
    #[error(
        "the idempotency key is not valid: it must be 1 to 255 visible ASCII characters \
         (0x21 to 0x7E, no spaces); send a valid key, or none"
    )]
    InvalidClientKey,
}

impl IdempotencyKey {
    /// Derives the key and fingerprint of one operation: `caller` calling
    /// `tool` with `args` (the handler's typed parameters turned back into a
    /// JSON value) within `scope`.
    ///
    /// # Encoding
    ///
    /// Let `args_digest = SHA-256(canonical_json(args))`, computed by
    /// streaming the canonical bytes into the hasher (no copy of the text is
    /// built), and let `field(x)` be the length of `x` as a big-endian `u64`
    /// followed by the bytes of `x`. Then
    ///
    /// ```text
    /// key         = SHA-256(field("idem/key/v1") field(tenant) field(subject)
    ///                       field(tool) field(scope tag) field(scope material))
    /// fingerprint = SHA-256(field("idem/fingerprint/v1") field(tool) field(args_digest))
    /// ```
    ///
    /// | scope | subject | scope tag | scope material |
    /// | --- | --- | --- | --- |
    /// | [`Scope::Window`] | the caller's subject | `window` | `args_digest` |
    /// | [`Scope::BusinessKey`] | empty | `business_key` | `SHA-256(canonical_json(business key))` |
    /// | [`Scope::ClientKey`] | the caller's subject | `client_key` | `SHA-256(field(client key))` |
    ///
    /// The scope tag is a field of its own, so a client-keyed operation can
    /// never share a key with an unkeyed one (nor with a business key),
    /// whatever the client key's text: the tags differ.
    ///
    /// Length prefixes make the encoding unambiguous: with a separator, tenant
    /// `a|b` and subject `c` would collide with tenant `a` and subject `b|c`.
    /// The version tag lets a future encoding coexist with stored keys.
    ///
    /// A business key ignores the subject and the other arguments: the rule
    /// "one shipment per order" holds whoever in the tenant asks. The
    /// fingerprint still covers the tool and every argument, so the same
    /// business key with other arguments can be told apart (a conflict).
    ///
    /// The window's *duration* is deliberately not in the key. If it were,
    /// changing the configured window (say during a rolling deploy, where old
    /// and new replicas disagree for a while) would give a repeated call a new
    /// key, and it would run as a new operation. The duration only decides how
    /// long the record lives.
    ///
    /// # Errors
    ///
    /// - [`KeyError::Canonical`] if the arguments or the business key nest
    ///   deeper than [`canonical::MAX_DEPTH`].
    /// - [`KeyError::EmptyBusinessKey`] if the business key is `null`, `""`,
    ///   or an array or object holding only such empty values (`[]`, `{}`,
    ///   `{"order_id": null}`): every call without a value would otherwise be
    ///   one operation per tenant.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::{Caller, key::{IdempotencyKey, Scope}};
    ///
    /// let caller = Caller::new("acme", "alice");
    /// let scope = Scope::Window(Duration::from_secs(900));
    /// let a = IdempotencyKey::derive(&caller, "charge", &serde_json::json!({"cents": 500, "to": "bob"}), &scope)?;
    /// let b = IdempotencyKey::derive(&caller, "charge", &serde_json::json!({"to": "bob", "cents": 500}), &scope)?;
    /// assert_eq!(a, b);
    /// # Ok::<(), idem_runtime::key::KeyError>(())
    /// ```
    pub fn derive(
        caller: &Caller,
        tool: &str,
        args: &Value,
        scope: &Scope,
    ) -> Result<IdempotencyKey, KeyError> {
        let (subject, tag, material) = match scope {
            Scope::Window(_) => (caller.subject(), "window", None),
            Scope::BusinessKey(business_key) => {
                if is_empty_business_key(business_key) {
                    return Err(KeyError::EmptyBusinessKey);
                }
                ("", "business_key", Some(canonical_digest(business_key)?))
            }
            Scope::ClientKey(client_key) => {
                if !valid_client_key(client_key) {
                    return Err(KeyError::InvalidClientKey);
                }
                let digest = Fields::new(CLIENT_KEY_VERSION)
                    .field(client_key.as_bytes())
                    .finish();
                (caller.subject(), "client_key", Some(digest))
            }
        };
        let args_digest = canonical_digest(args)?;
        let material = material.unwrap_or(args_digest);

        let key = Fields::new(KEY_VERSION)
            .field(caller.tenant().as_bytes())
            .field(subject.as_bytes())
            .field(tool.as_bytes())
            .field(tag.as_bytes())
            .field(&material)
            .finish();
        let fingerprint = Fields::new(FINGERPRINT_VERSION)
            .field(tool.as_bytes())
            .field(&args_digest)
            .finish();
        Ok(IdempotencyKey { key, fingerprint })
    }

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

/// The public, tenant-scoped name of one *operation*: `idem_` and 32 hex
/// digits, e.g. `idem_3f9a0c1d2e4b5a69c07e51d2a8f4e913`.
///
/// A reference names an operation, not a key. Its first eight bytes are the
/// key's (so a store finds the record by the key it already indexes), its
/// last eight a tag drawn at random when the operation starts. Every repeat
/// within the operation's life answers with the same reference; the same
/// call after its window is a new operation with a new tag, so a processor
/// that keeps idempotency keys for a day never mistakes the second purchase
/// for the first. Hand it downstream as it is: it carries 128 bits.
///
/// A reference written before references had tags (`idem_` and 16 hex
/// digits) still parses and prints as it did: its tag is zero, a value a
/// drawn tag never takes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference([u8; 16]);

impl Reference {
    const PREFIX: &'static str = "idem_";

    /// A new operation's reference for `key`: the key's first eight bytes
    /// and a fresh random tag (never zero).
    pub fn new_operation(key: &IdempotencyKey) -> Self {
        Self::with_tag(key, crate::random::nonzero_u64())
    }

    /// The reference of the operation of `key` whose tag is `tag` (a store
    /// that keeps the tag apart from the key builds it back this way). A
    /// zero tag is a reference written before references had tags.
    pub fn with_tag(key: &IdempotencyKey, tag: u64) -> Self {
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&key.key[..8]);
        Self::from_parts(prefix, tag)
    }

    /// The reference made of a key's first eight bytes and a tag.
    pub fn from_parts(key_prefix: [u8; 8], tag: u64) -> Self {
        let mut r = [0u8; 16];
        r[..8].copy_from_slice(&key_prefix);
        r[8..].copy_from_slice(&tag.to_be_bytes());
        Reference(r)
    }

    /// Parses `idem_` followed by 32 hex digits (or 16, a reference written
    /// before references had tags), in either case; the `idem_` may be left
    /// out. Anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let hexpart = text.strip_prefix(Self::PREFIX).unwrap_or(text);
        // `from_str_radix` alone would also take a sign ("+f"), so check
        // the digits first.
        if !matches!(hexpart.len(), 16 | 32) || !hexpart.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut r = [0u8; 16];
        for (i, byte) in r.iter_mut().take(hexpart.len() / 2).enumerate() {
            *byte = u8::from_str_radix(hexpart.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Reference(r))
    }

    /// The reference a store kept as [`as_bytes`](Reference::as_bytes)
    /// gave it: 16 bytes, or 8 for a reference written before references
    /// had tags. `None` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let mut r = [0u8; 16];
        match bytes.len() {
            8 | 16 => r[..bytes.len()].copy_from_slice(bytes),
            _ => return None,
        }
        Some(Reference(r))
    }

    /// The bytes a store keeps: all 16, or the first 8 of a reference
    /// written before references had tags (so a follow-on stored under one is
    /// found again under the same bytes).
    pub fn as_bytes(&self) -> &[u8] {
        if self.tag() == 0 {
            &self.0[..8]
        } else {
            &self.0
        }
    }

    /// The first eight bytes: the key's. A store finds the record by them.
    pub fn key_prefix(&self) -> [u8; 8] {
        let mut p = [0u8; 8];
        p.copy_from_slice(&self.0[..8]);
        p
    }

    /// The operation's tag: the last eight bytes, zero for a reference
    /// written before references had tags.
    pub fn tag(&self) -> u64 {
        let mut t = [0u8; 8];
        t.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(t)
    }

    /// Whether this names an operation of `key` (its first eight bytes are
    /// the key's).
    pub fn is_of(&self, key: &IdempotencyKey) -> bool {
        self.0[..8] == key.key[..8]
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(&hex(self.as_bytes()))
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The version tags of the two encodings. A change to either encoding (or to
/// the canonical form) needs a new tag, so old and new keys never collide.
const KEY_VERSION: &[u8] = b"idem/key/v1";
const FINGERPRINT_VERSION: &[u8] = b"idem/fingerprint/v1";
/// The tag of a client key's digest, the scope material of
/// [`Scope::ClientKey`].
const CLIENT_KEY_VERSION: &[u8] = b"idem/client-key/v1";

/// A SHA-256 over length-prefixed fields, the encoding of keys and
/// fingerprints.
struct Fields(Sha256);

impl Fields {
    fn new(version: &[u8]) -> Self {
        Fields(Sha256::new()).field(version)
    }

    fn field(mut self, bytes: &[u8]) -> Self {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// SHA-256 of the canonical JSON of `value`, in one pass over the value.
fn canonical_digest(value: &Value) -> Result<[u8; 32], CanonicalError> {
    thread_local! {
        static BUFFER: RefCell<[u8; HASH_BUFFER]> = const { RefCell::new([0; HASH_BUFFER]) };
    }
    let digest = |buf: &mut [u8; HASH_BUFFER]| {
        let mut sink = HashSink::new(buf);
        write_canonical(value, &mut sink, 0)?;
        Ok(sink.finish())
    };
    // The thread's buffer, zeroed once: a fresh one on the stack cost a 4 KiB
    // memset per key, more than hashing a small call's arguments. (It is
    // never borrowed twice, as nothing here calls back in; if it were, a
    // fresh buffer would do.)
    BUFFER.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut buf) => digest(&mut buf),
        Err(_) => digest(&mut [0; HASH_BUFFER]),
    })
}

/// Size of [`HashSink`]'s buffer: big enough that the hasher sees few,
/// long updates.
const HASH_BUFFER: usize = 4096;

/// A [`Sink`] that hashes what it is given. The canonical writer emits many
/// pieces of a few bytes (punctuation, numbers, short strings); copying them
/// into a buffer and hashing it in large updates costs much less than one
/// hasher update per piece.
struct HashSink<'b> {
    hasher: Sha256,
    buf: &'b mut [u8; HASH_BUFFER],
    len: usize,
}

impl<'b> HashSink<'b> {
    /// A sink over `buf`, whose contents do not matter.
    fn new(buf: &'b mut [u8; HASH_BUFFER]) -> Self {
        HashSink {
            hasher: Sha256::new(),
            buf,
            len: 0,
        }
    }

    fn finish(mut self) -> [u8; 32] {
        self.hasher.update(&self.buf[..self.len]);
        self.hasher.finalize().into()
    }
}

impl Sink for HashSink<'_> {
    #[inline]
    fn write_ascii(&mut self, byte: u8) {
        if self.len == HASH_BUFFER {
            self.hasher.update(&self.buf[..]);
            self.len = 0;
        }
        self.buf[self.len] = byte;
        self.len += 1;
    }

    #[inline]
    fn write_str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        if bytes.len() > HASH_BUFFER - self.len {
            self.hasher.update(&self.buf[..self.len]);
            self.len = 0;
            if bytes.len() >= HASH_BUFFER {
                // A long run goes to the hasher directly, without a copy.
                self.hasher.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

/// Whether a business key carries no value: `null`, `""`, or an array or
/// object with nothing but such values in it.
pub(crate) fn is_empty_business_key(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.iter().all(is_empty_business_key),
        Value::Object(members) => members.values().all(is_empty_business_key),
        Value::Bool(_) | Value::Number(_) => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_keys_are_visible_ascii_of_1_to_255_bytes() {
        for good in ["a", "~", "!", "step-42/attempt:1", &"k".repeat(255)] {
            assert!(valid_client_key(good), "{good:?} was refused");
        }
        for bad in [
            "",
            " ",
            "a b",
            "tab\t",
            "nl\n",
            "é",
            "\u{7f}",
            &"k".repeat(256),
        ] {
            assert!(!valid_client_key(bad), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_client_key_never_shares_a_key_with_an_unkeyed_call() {
        let caller = Caller::new("acme", "alice");
        let args = serde_json::json!({});
        let window =
            IdempotencyKey::derive(&caller, "t", &args, &Scope::Window(Duration::from_secs(1)))
                .unwrap();
        let keyed =
            IdempotencyKey::derive(&caller, "t", &args, &Scope::ClientKey("k".into())).unwrap();
        assert_ne!(window.as_bytes(), keyed.as_bytes());
        // The arguments' fingerprint is the same: a conflict is judged by it.
        assert_eq!(window.fingerprint(), keyed.fingerprint());
        let other = Caller::new("acme", "bob");
        let theirs =
            IdempotencyKey::derive(&other, "t", &args, &Scope::ClientKey("k".into())).unwrap();
        assert_ne!(keyed.as_bytes(), theirs.as_bytes());
        assert!(matches!(
            IdempotencyKey::derive(&caller, "t", &args, &Scope::ClientKey(" ".into())),
            Err(KeyError::InvalidClientKey)
        ));
    }

    #[test]
    fn the_hashing_sink_hashes_exactly_the_canonical_text() {
        // Strings whose eight-byte words end inside characters, with escapes
        // at every offset, and long enough to cross the buffer's edge.
        let alphabet: Vec<char> = "aé€🚚\"\n\\b\u{1}".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in (0..64).chain([HASH_BUFFER - 3, HASH_BUFFER + 5, 3 * HASH_BUFFER + 1]) {
            for _ in 0..20 {
                let text: String = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        alphabet[(state % alphabet.len() as u64) as usize]
                    })
                    .collect();
                let value = serde_json::json!({ "a": text, "b": [text, 1.5, 7] });
                let canonical = canonical::canonical_json(&value).unwrap();
                let expected: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
                assert_eq!(canonical_digest(&value).unwrap(), expected, "{len}");
            }
        }
    }
}
