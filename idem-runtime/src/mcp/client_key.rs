//! Client keys on `tools/call`: where a request carries one, what a valid
//! one is, and what the answer says identified the operation.
//!
//! The wire names are a contract hosts write: `params._meta["idem/idempotency-key"]`
//! and, over streamable HTTP, the `Idempotency-Key` request header. Both
//! present and different, several headers, a `_meta` value that is not a
//! string, or a key that is not 1 to 255 visible ASCII characters: the call
//! is refused and nothing runs.

use rmcp::model::Extensions;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value;

use crate::executor::ScopeSpec;
use crate::key::{valid_client_key, MAX_CLIENT_KEY_LEN};

/// The `_meta` key of a `tools/call` request that carries a client key.
pub const CLIENT_KEY_META: &str = "idem/idempotency-key";

/// The HTTP request header that carries a client key over streamable HTTP
/// (Stripe's, and the IETF httpapi draft's, name). Header names are
/// case-insensitive.
pub const CLIENT_KEY_HEADER: &str = "Idempotency-Key";

/// Whether a tool accepts a client key: `#[idempotent(client_key = "...")]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientKeyMode {
    /// A call may carry a key; without one, the tool's window decides.
    Optional,
    /// A call without a key is refused, and nothing runs.
    Required,
}

impl ClientKeyMode {
    /// The wire name, as the tool's listing shows it in
    /// `_meta["idem/idempotent"].clientKey`: `optional` or `required`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ClientKeyMode::Optional => "optional",
            ClientKeyMode::Required => "required",
        }
    }
}

/// What names an operation, as `_meta["idem/operation"].keyedBy` says it.
pub(super) fn keyed_by(scope: ScopeSpec<'_>) -> &'static str {
    match scope {
        ScopeSpec::ClientKey { .. } => "clientKey",
        ScopeSpec::BusinessKey { .. } => "businessKey",
        ScopeSpec::Window(_) => "arguments",
    }
}

/// The client key a request carries, from its `_meta` or its HTTP
/// `Idempotency-Key` header: `Ok(None)` when it carries none, `Err` with the
/// reason to refuse it when it is malformed, or the two disagree.
pub fn request_client_key(
    meta: &rmcp::model::MetaObject,
    extensions: &Extensions,
) -> Result<Option<String>, String> {
    let from_meta = match meta.get(CLIENT_KEY_META) {
        None => None,
        Some(Value::String(key)) => Some(key.clone()),
        Some(other) => {
            return Err(format!(
                "_meta[\"{CLIENT_KEY_META}\"] must be a string, not {}; {}",
                kind(other),
                WHAT_IS_VALID
            ))
        }
    };
    let from_header = match extensions.get::<http::request::Parts>() {
        None => None,
        Some(parts) => {
            let mut values = parts.headers.get_all(CLIENT_KEY_HEADER).iter();
            match (values.next(), values.next()) {
                (None, _) => None,
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "the request has more than one {CLIENT_KEY_HEADER} header; send one key"
                    ))
                }
                (Some(value), None) => match value.to_str() {
                    Ok(text) => Some(text.to_owned()),
                    Err(_) => {
                        return Err(format!(
                            "the {CLIENT_KEY_HEADER} header is not valid: {WHAT_IS_VALID}"
                        ))
                    }
                },
            }
        }
    };
    let key = match (from_meta, from_header) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "the request carries two different idempotency keys, one in \
                 _meta[\"{CLIENT_KEY_META}\"] and one in the {CLIENT_KEY_HEADER} header; \
                 send one key, or the same key in both"
            ))
        }
        (Some(key), _) | (None, Some(key)) => key,
        (None, None) => return Ok(None),
    };
    if !valid_client_key(&key) {
        return Err(format!("the idempotency key is not valid: {WHAT_IS_VALID}"));
    }
    Ok(Some(key))
}

/// The rule, as every refusal of a malformed key says it.
const WHAT_IS_VALID: &str = "a key is 1 to 255 visible ASCII characters (0x21 to 0x7E, no \
                             spaces); send a valid key, the same one for every retry of \
                             one operation";

/// The refusal of a call without a key to a tool that requires one.
pub(super) fn required() -> String {
    format!(
        "this tool requires an idempotency key: send one in params._meta[\"{CLIENT_KEY_META}\"] \
         (over HTTP, or in the {CLIENT_KEY_HEADER} header), the same key for every retry of \
         one operation and a new key for a new one; it is 1 to {MAX_CLIENT_KEY_LEN} visible \
         ASCII characters"
    )
}

/// The client key of `request`, for a tool that accepts one.
pub(super) fn from_request(request: &RequestContext<RoleServer>) -> Result<Option<String>, String> {
    request_client_key(&request.meta.0, &request.extensions)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with_header(values: &[&[u8]]) -> Extensions {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        for value in values {
            parts.headers.append(
                "idempotency-key",
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        let mut extensions = Extensions::new();
        extensions.insert(parts);
        extensions
    }

    fn meta(value: Value) -> rmcp::model::MetaObject {
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert(CLIENT_KEY_META.to_owned(), value);
        meta
    }

    #[test]
    fn a_key_from_meta_or_header_and_every_refusal() {
        let none = rmcp::model::MetaObject::new();
        let bare = Extensions::new();
        assert_eq!(request_client_key(&none, &bare), Ok(None));
        assert_eq!(
            request_client_key(&meta(json!("k-1")), &bare),
            Ok(Some("k-1".into()))
        );
        assert_eq!(
            request_client_key(&none, &with_header(&[b"k-2"])),
            Ok(Some("k-2".into()))
        );
        assert_eq!(
            request_client_key(&meta(json!("k-3")), &with_header(&[b"k-3"])),
            Ok(Some("k-3".into()))
        );
        let refused = [
            request_client_key(&meta(json!("k-1")), &with_header(&[b"k-2"])),
            request_client_key(&none, &with_header(&[b"a", b"b"])),
            request_client_key(&meta(json!(42)), &bare),
            request_client_key(&meta(json!("")), &bare),
            request_client_key(&meta(json!("has space")), &bare),
            request_client_key(&meta(json!("é")), &bare),
            request_client_key(&meta(json!("k".repeat(256))), &bare),
            request_client_key(&none, &with_header(&[b"caf\xc3\xa9"])),
        ];
        for (i, answer) in refused.iter().enumerate() {
            let reason = answer
                .as_ref()
                .expect_err(&format!("case {i} was accepted"));
            assert!(reason.contains("key"), "{reason}");
        }
    }
}
