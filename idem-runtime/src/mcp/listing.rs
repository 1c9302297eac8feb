//! The tool listing as served: a wrapped tool's `_meta["idem/idempotent"]`
//! with the window or retention start-up set for it
//! ([`Executor::with_window`]), not only the attribute's.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CacheScope, ListToolsResult, ProtocolVersion, ResultType, Tool};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Value};

use super::TOOL_META_KEY;
use crate::executor::Executor;

/// The tools of `router` as `executor` serves them: each wrapped tool's
/// `_meta["idem/idempotent"]` says the window (`windowSeconds`) or the
/// business-key retention (`retentionSeconds`) that
/// [`Executor::with_window`] or [`Executor::with_business_key_retention`]
/// set for it, in place of its attribute's.
///
/// A [`tool_router(server_handler)`](crate::tool_router) impl lists its
/// tools through this already; a `#[tool_handler]` impl of your own lists
/// them with it in its `list_tools`:
///
/// ```rust,ignore
/// async fn list_tools(&self, _: Option<PaginatedRequestParams>, _: RequestContext<RoleServer>)
///     -> Result<ListToolsResult, ErrorData>
/// {
///     Ok(ListToolsResult::with_all_items(idem_runtime::mcp::list_tools(&self.tool_router, self.executor())))
/// }
/// ```
pub fn list_tools<S: Send + Sync + 'static>(
    router: &ToolRouter<S>,
    executor: &Executor,
) -> Vec<Tool> {
    router
        .list_all()
        .into_iter()
        .map(|tool| served(tool, executor))
        .collect()
}

/// `tool` as `executor` serves it.
pub(crate) fn served(mut tool: Tool, executor: &Executor) -> Tool {
    let window = executor.window_of(&tool.name);
    let retention = executor.business_key_retention_of(&tool.name);
    if window.is_none() && retention.is_none() {
        return tool;
    }
    let Some(marker) = tool
        .meta
        .as_mut()
        .and_then(|meta| meta.get_mut(TOOL_META_KEY))
        .and_then(Value::as_object_mut)
    else {
        return tool;
    };
    if let (Some(window), true) = (window, marker.contains_key("windowSeconds")) {
        marker.insert("windowSeconds".to_owned(), json!(window.as_secs()));
    }
    if let (Some(retention), true) = (retention, marker.contains_key("businessKey")) {
        marker.insert("retentionSeconds".to_owned(), json!(retention.as_secs()));
    }
    tool
}

/// What the `list_tools` of a generated `ServerHandler` answers: rmcp's
/// own answer, with the tools as served.
pub(crate) fn served_result<S: Send + Sync + 'static>(
    router: &ToolRouter<S>,
    executor: &Executor,
    context: &RequestContext<RoleServer>,
) -> ListToolsResult {
    let supports_cache_hints = context
        .protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
    ListToolsResult {
        result_type: Some(ResultType::COMPLETE),
        tools: list_tools(router, executor),
        meta: None,
        next_cursor: None,
        ttl_ms: supports_cache_hints.then_some(0),
        cache_scope: supports_cache_hints.then_some(CacheScope::Public),
    }
}
