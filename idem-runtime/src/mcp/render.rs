//! What a model reads: an [`Answer`] turned into a tool result with
//! `_meta["idem/operation"]`.

use std::fmt;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, MetaObject};
use serde_json::{json, Value};

use super::RESULT_META_KEY;
use crate::answer::{text, Answer, AnswerState, Classify, Disposition};

pub(super) fn no_caller() -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text::NO_CALLER)]);
    set_meta(
        &mut result,
        json!({ "reference": null, "state": AnswerState::NoCaller.as_str(), "replayed": false }),
    );
    result
}

fn set_meta(result: &mut CallToolResult, value: Value) {
    result
        .meta
        .get_or_insert_with(MetaObject::new)
        .insert(RESULT_META_KEY.to_owned(), value);
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

pub(super) fn render<E: fmt::Display>(answer: Answer<CallToolResult, E>) -> CallToolResult {
    let message = answer.message();
    let state = answer.state().as_str();
    let reference = answer.reference().map(|r| r.to_string());
    match answer {
        Answer::Executed {
            mut value,
            recorded,
            ..
        } => {
            set_meta(
                &mut value,
                json!({ "reference": reference, "state": state, "replayed": false, "recorded": recorded }),
            );
            value
        }
        Answer::Replayed { mut value, .. } => {
            set_meta(
                &mut value,
                json!({ "reference": reference, "state": state, "replayed": true }),
            );
            value
        }
        other => {
            let mut meta = json!({ "reference": reference, "state": state, "replayed": false });
            match &other {
                Answer::InFlight {
                    status_tool,
                    retry_after,
                    ..
                } => {
                    meta["statusTool"] = json!(status_tool);
                    meta["retryAfterSeconds"] = json!(retry_after.as_secs().max(1));
                }
                Answer::Unknown { status_tool, .. }
                | Answer::Conflict { status_tool, .. }
                | Answer::Failed { status_tool, .. } => {
                    meta["statusTool"] = json!(status_tool);
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
