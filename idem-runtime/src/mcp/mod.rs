//! The rmcp glue: what `#[idempotent]` expands to, the caller of a request,
//! the reference inside a handler, the status tool, and the start-up audit
//! of a router's hints.

use rmcp::model::{ContentBlock, IntoContents};
use rmcp::ErrorData;

use crate::answer::{Classify, ToolError};

mod audit;
mod caller;
#[doc(hidden)]
pub mod private;
mod render;
mod status_tool;

pub use audit::{audit_hints, HintProblem};
pub use caller::{current_reference, request_caller, IdempotentServer};
pub use status_tool::status_tool;

/// The `_meta` key of a tool result that describes its operation:
/// `{"reference", "state", "replayed", "statusTool", "retryAfterSeconds"}`.
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

/// A protocol error from a handler says nothing about its side effect.
impl Classify for ErrorData {}
