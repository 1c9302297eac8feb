//! The rmcp glue: what `#[idempotent]` expands to, the caller of a request,
//! the reference inside a handler, the status tool, and the start-up audit
//! of a router's hints.

use rmcp::model::{ContentBlock, IntoContents};
use rmcp::ErrorData;

use crate::answer::{Classify, Disposition, ToolError};

mod ask;
mod audit;
mod call;
mod caller;
mod client_key;
mod listing;
#[doc(hidden)]
pub mod private;
mod render;
mod status_tool;
pub mod tasks;

pub use ask::{current_continuation, Ask, Continuation};
pub use audit::{audit_hints, hint_report, HintBacking, HintProblem};
pub use caller::{current_cancellation, request_caller, IdempotentServer};
pub use client_key::{request_client_key, ClientKeyMode, CLIENT_KEY_HEADER, CLIENT_KEY_META};
pub use listing::list_tools;
pub use render::stored_response;
pub use status_tool::status_tool;

/// The `_meta` key of a tool result that describes its operation:
/// `{"reference", "state", "replayed", "keyedBy", "statusTool", "retryAfterSeconds"}`.
/// `keyedBy` says what identified the operation: `"clientKey"` (the call's
/// client key, for a tool that accepts one), `"businessKey"` or
/// `"arguments"` (the caller's arguments within the tool's window).
pub const RESULT_META_KEY: &str = "idem/operation";

/// The `_meta` key of a tool definition that `#[idempotent]` wraps; its value
/// describes the scope. [`audit_hints`] trusts `idempotentHint` only where
/// this key is present.
pub const TOOL_META_KEY: &str = "idem/idempotent";

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.message().to_owned())]
    }
}

/// rmcp's own error type, as a handler returns it
/// (`Result<CallToolResult, ErrorData>` is rmcp's default signature), is
/// classified by its JSON-RPC code:
///
/// - `invalid_params` (-32602), `invalid_request` (-32600),
///   `method_not_found` (-32601) and `parse_error` (-32700) say the call was
///   refused as made: nothing happened, [`Disposition::Rejected`], and the
///   claim is released so a corrected call can run;
/// - every other code (`internal_error`, `resource_not_found`, a server's
///   own codes) says nothing about the side effect: [`Disposition::Unknown`].
impl Classify for ErrorData {
    fn disposition(&self) -> Disposition {
        use rmcp::model::ErrorCode;
        match self.code {
            ErrorCode::INVALID_PARAMS
            | ErrorCode::INVALID_REQUEST
            | ErrorCode::METHOD_NOT_FOUND
            | ErrorCode::PARSE_ERROR => Disposition::Rejected,
            _ => Disposition::Unknown,
        }
    }
}
