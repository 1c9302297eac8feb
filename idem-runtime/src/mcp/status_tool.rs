//! The status tool: an operation's fate, looked up by its reference.

use rmcp::handler::server::router::tool::ToolRoute;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Tool};
use rmcp::ErrorData;

use super::caller::{resolve_caller, IdempotentServer};
use super::render::no_caller;
use crate::answer::text;

/// The arguments of the status tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct StatusArgs {
    /// The reference an answer gave, e.g. `idem_3f9a0c1d2e4b5a69c07e51d2a8f4e913`.
    reference: String,
}

/// A ready-made status tool for a router: `name(reference)` answers from the
/// record of the caller's tenant (state, tool, times, the stored response
/// when completed, and the next step).
///
/// `#[idem_runtime::tool_router]` adds it to the router it generates, under
/// each name the wrapped tools' `status_tool` uses (by default
/// `get_operation_status`). Add it by hand to a router built otherwise, or
/// generated with `#[idem_runtime::tool_router(status_tool = false)]`:
///
/// ```ignore
/// let router = Payments::tool_router()
///     .with_route(idem_runtime::mcp::status_tool::<Payments>("get_operation_status"));
/// ```
pub fn status_tool<S>(name: &'static str) -> ToolRoute<S>
where
    S: IdempotentServer + Send + Sync + 'static,
{
    let input_schema = rmcp::handler::server::tool::schema_for_input::<StatusArgs>()
        .expect("the status tool's arguments have an object schema");
    let attr = Tool::new(
        name,
        "Look up an operation by the reference an earlier answer gave: its state, and its \
         result once completed. Use it instead of repeating a call that is in progress or \
         whose outcome is unknown.",
        input_schema,
    )
    .annotate(rmcp::model::ToolAnnotations::new().read_only(true));
    ToolRoute::new_dyn(attr, |context: ToolCallContext<'_, S>| {
        Box::pin(async move {
            let server = context.service;
            let args: StatusArgs = rmcp::handler::server::tool::parse_json_object(
                context.arguments.clone().unwrap_or_default(),
            )?;
            let Some(caller) = resolve_caller(server, &context.request_context) else {
                return Ok(no_caller().into());
            };
            let result = match server.executor().status(&caller, &args.reference).await {
                Ok(Some(report)) => {
                    let value = serde_json::to_value(&report)
                        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    CallToolResult::structured(value)
                }
                Ok(None) => CallToolResult::error(vec![ContentBlock::text(text::not_found(
                    &args.reference,
                ))]),
                Err(error) => {
                    tracing::warn!(reference = %args.reference, %error, "status lookup failed");
                    CallToolResult::error(vec![ContentBlock::text(text::store_unreachable(&error))])
                }
            };
            Ok(CallToolResponse::Complete(result))
        })
    })
}
