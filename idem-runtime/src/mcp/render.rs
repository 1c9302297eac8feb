//! What a model reads: an [`Answer`] turned into a tool result with
//! `_meta["idem/operation"]`.

use std::fmt;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, MetaObject};
use rmcp::ErrorData;
use serde_json::{json, Map, Value};

use super::RESULT_META_KEY;
use crate::answer::{text, Answer, AnswerState, Classify, Disposition, Recording};

/// The answer to a call with no caller. The first one in a process also
/// tells the developer, in the log, what to configure: the model's message
/// is for the model, and a stdio server without a default caller would
/// otherwise refuse every call in silence.
pub(super) fn no_caller() -> CallToolResult {
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        tracing::warn!(
            "idem refused a call because the request carries no caller, and nothing ran. \
             A stdio server serves one local user: return it from \
             IdempotentServer::default_caller. Over HTTP, an auth layer in front of the \
             MCP service must insert an idem_runtime::Caller into the request's extensions. \
             (This is logged once per process.)"
        );
    });
    let mut result = CallToolResult::error(vec![ContentBlock::text(text::NO_CALLER)]);
    set_meta(
        &mut result,
        operation(None, AnswerState::NoCaller.as_str(), false),
    );
    result
}

/// `{"reference", "state", "replayed"}`, the entries every answer's
/// `_meta["idem/operation"]` starts with, built as a map directly: what
/// `json!` writes, with no copy of the reference on the way.
fn operation(reference: Option<String>, state: &str, replayed: bool) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(
        "reference".to_owned(),
        reference.map_or(Value::Null, Value::String),
    );
    meta.insert("state".to_owned(), Value::String(state.to_owned()));
    meta.insert("replayed".to_owned(), Value::Bool(replayed));
    meta
}

fn set_meta(result: &mut CallToolResult, value: Map<String, Value>) {
    result
        .meta
        .get_or_insert_with(MetaObject::new)
        .insert(RESULT_META_KEY.to_owned(), Value::Object(value));
}

/// How a wrapped handler failed, with its error type erased: how it ended
/// and what to tell the model.
#[doc(hidden)]
#[derive(Debug)]
pub struct HandlerFailure {
    disposition: Disposition,
    message: String,
}

impl HandlerFailure {
    pub(super) fn tool<E: Classify + fmt::Display>(error: E) -> Self {
        HandlerFailure {
            disposition: error.disposition(),
            message: error.to_string(),
        }
    }

    /// The handler ran but its output cannot become a tool result: the side
    /// effect happened and what it returned is lost, so the outcome is unknown.
    fn output(message: impl fmt::Display) -> Self {
        HandlerFailure {
            disposition: Disposition::Unknown,
            message: text::output_lost(message),
        }
    }
}

impl Classify for HandlerFailure {
    fn disposition(&self) -> Disposition {
        self.disposition
    }
}

impl fmt::Display for HandlerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub(super) fn completed(value: impl IntoCallToolResult) -> Result<CallToolResult, HandlerFailure> {
    match value.into_call_tool_result() {
        Ok(CallToolResponse::Complete(result)) => Ok(result),
        Ok(_) => Err(HandlerFailure::output(text::NOT_ONE_RESULT)),
        Err(error) => Err(HandlerFailure::output(error)),
    }
}

/// The text idem stores for a wrapped tool whose handler returned
/// `returned`: what a repeat replays, the status tool shows as `response`
/// and `tasks/get` answers, byte for byte what a handler's own completion
/// stores. Build with it whatever stores a tool's result on the tool's
/// behalf: an
/// [`Outcome::Completed`](crate::maintenance::Outcome::Completed), found by a
/// reconciler or resolved by hand (the `idem resolve --completed` command
/// line uses it). Stored text the tool could
/// not have returned would not replay: each repeat would answer "unknown".
///
/// `returned` is what the handler returns on success: `Json(value)` for a
/// tool with a structured result (`Result<Json<Receipt>, ToolError>`), a
/// `String` for a text result, or a whole `CallToolResult`.
///
/// ```
/// use rmcp::handler::server::wrapper::Json;
/// use rmcp::model::CallToolResult;
/// use serde_json::json;
///
/// let stored = idem_runtime::mcp::stored_response(Json(json!({ "charge_id": "ch_42" }))).unwrap();
/// let replayed: CallToolResult = serde_json::from_str(&stored).unwrap();
/// assert_eq!(replayed.structured_content, Some(json!({ "charge_id": "ch_42" })));
/// ```
///
/// Errors (`internal_error`): the value does not serialize, or the handler's
/// return is not one complete result (it asks for input or starts a task),
/// which an `#[idempotent]` tool cannot record either.
pub fn stored_response<R: IntoCallToolResult>(returned: R) -> Result<String, ErrorData> {
    let result = completed(returned)
        .map_err(|failure| ErrorData::internal_error(failure.to_string(), None))?;
    serde_json::to_string(&result).map_err(|e| {
        ErrorData::internal_error(format!("the tool result does not serialize: {e}"), None)
    })
}

pub(super) fn render<E: fmt::Display>(answer: Answer<CallToolResult, E>) -> CallToolResult {
    let message = answer.message();
    let state = answer.state().as_str();
    let reference = answer.reference().map(|r| r.to_string());
    match answer {
        Answer::Executed {
            mut value,
            recording,
            ..
        } => {
            let mut meta = operation(reference, state, false);
            meta.insert("recorded".to_owned(), Value::Bool(recording.is_stored()));
            if recording == Recording::Pending {
                // Answered before the completion landed: a repeat on this
                // replica replays it, one on another is told "in progress"
                // until it does.
                meta.insert("recording".to_owned(), json!("pending"));
            }
            set_meta(&mut value, meta);
            value
        }
        Answer::Replayed { mut value, .. } => {
            set_meta(&mut value, operation(reference, state, true));
            value
        }
        other => {
            let mut meta = operation(reference, state, false);
            match &other {
                Answer::InProgress {
                    status_tool,
                    retry_after,
                    ..
                } => {
                    meta.insert("statusTool".to_owned(), json!(status_tool));
                    meta.insert(
                        "retryAfterSeconds".to_owned(),
                        json!(retry_after.as_secs().max(1)),
                    );
                }
                Answer::Unknown { status_tool, .. }
                | Answer::Conflict { status_tool, .. }
                | Answer::ClientKeyConflict { status_tool, .. }
                | Answer::Failed { status_tool, .. } => {
                    meta.insert("statusTool".to_owned(), json!(status_tool));
                }
                _ => {}
            }
            let mut result =
                CallToolResult::error(vec![ContentBlock::text(message.unwrap_or_default())]);
            set_meta(&mut result, meta);
            result
        }
    }
}
