//! What generated code names. Not a public API: it changes without notice.

use std::fmt;
use std::future::Future;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::MetaObject;
use serde::Serialize;
use serde_json::{json, Value};

pub use core::time::Duration;
pub use rmcp;
pub use rmcp::handler::server::tool::schema_for_output;
pub use rmcp::model::CallToolResult;
pub use rmcp::service::RequestContext;
pub use rmcp::{ErrorData, RoleServer};

pub use super::render::HandlerFailure;
pub use crate::executor::ScopeSpec;

use super::caller::{resolve_caller, IdempotentServer, CURRENT_REFERENCE};
use super::render::{completed, no_caller, render};
use super::TOOL_META_KEY;
use crate::answer::{Answer, Classify};
use crate::executor::Operation;

/// What the macro knows about a tool.
#[derive(Clone, Copy, Debug)]
pub struct ToolSpec<'a> {
    pub tool: &'a str,
    pub scope: ScopeSpec<'a>,
    pub status_tool: &'a str,
}

/// A return type `#[idempotent]` can record: `Result<V, E>`.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` cannot record a tool that returns `{Self}`",
    label = "the error type must implement `idem_runtime::Classify` and `Display`",
    note = "return `Result<T, ToolError>` (T: `Json<_>`, `CallToolResult`, `String`, ...), \
            or implement `idem_runtime::Classify` for your error type"
)]
pub trait Outcome {
    type Value: IntoCallToolResult;
    type Error: Classify + fmt::Display;
    fn into_result(self) -> Result<Self::Value, Self::Error>;
}

impl<V: IntoCallToolResult, E: Classify + fmt::Display> Outcome for Result<V, E> {
    type Value = V;
    type Error = E;
    fn into_result(self) -> Result<V, E> {
        self
    }
}

/// The arguments as JSON, taken before the handler consumes them. The
/// macro spans this call on the parameter type, so a type that is not
/// `Serialize` is reported there.
pub fn arguments<P: Serialize>(params: &P) -> Result<Value, serde_json::Error> {
    serde_json::to_value(params)
}

/// A `Result<V, E>` body's outcome, spanned on the declared return type.
pub fn outcome<R: Outcome>(returned: R) -> Result<CallToolResult, HandlerFailure> {
    completed(returned.into_result().map_err(HandlerFailure::tool)?)
}

/// A plain body's output (never a failure of the tool's own), spanned on
/// the declared return type.
pub fn output<V: IntoCallToolResult>(returned: V) -> Result<CallToolResult, HandlerFailure> {
    completed(returned)
}

/// The `_meta` of a wrapped tool's definition: the user's, plus the
/// marker [`audit_hints`] looks for.
pub fn tool_meta(user: Option<MetaObject>, scope: ScopeSpec<'_>, status_tool: &str) -> MetaObject {
    let mut meta = user.unwrap_or_default();
    let scope = match scope {
        ScopeSpec::Window(window) => json!({ "windowSeconds": window.as_secs() }),
        ScopeSpec::BusinessKey { fields, retention } => json!({
            "businessKey": fields,
            "retentionSeconds": retention.map(|r| r.as_secs()),
        }),
    };
    let mut marker = json!({ "statusTool": status_tool });
    if let (Some(marker), Some(scope)) = (marker.as_object_mut(), scope.as_object()) {
        marker.extend(scope.clone());
    }
    meta.insert(TOOL_META_KEY.to_owned(), marker);
    meta
}

/// The body of a wrapped tool: find the caller, run the handler through
/// the server's executor, and turn the answer into a tool result.
pub async fn call<S, P, F, Fut>(
    server: &S,
    request: RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    params: P,
    handler: F,
) -> Result<CallToolResult, ErrorData>
where
    S: IdempotentServer + ?Sized,
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = Result<CallToolResult, HandlerFailure>>,
{
    let Some(caller) = resolve_caller(server, &request) else {
        return Ok(no_caller());
    };
    drop(request);
    let args = match args {
        Ok(args) => args,
        Err(error) => {
            let answer: Answer<CallToolResult, HandlerFailure> = Answer::Refused {
                reason: format!("the arguments cannot be serialized ({error})"),
            };
            return Ok(render(answer));
        }
    };
    let operation = Operation {
        caller: &caller,
        tool: spec.tool,
        args: &args,
        scope: spec.scope,
        status_tool: spec.status_tool,
    };
    let answer = server
        .executor()
        .run_json(operation, move |context| {
            CURRENT_REFERENCE.scope(context.reference(), handler(params))
        })
        .await;
    Ok(render(answer))
}

#[cfg(test)]
mod tests {
    use rmcp::model::MetaObject;
    use serde_json::json;

    use super::ScopeSpec;
    use crate::mcp::TOOL_META_KEY;

    #[test]
    fn tool_meta_marks_the_scope_and_keeps_the_users_entries() {
        let mut user = MetaObject::new();
        user.insert("vendor/x".into(), json!(1));
        let meta = super::tool_meta(
            Some(user),
            ScopeSpec::BusinessKey {
                fields: &["order_id"],
                retention: None,
            },
            "get_operation_status",
        );
        assert_eq!(meta.get("vendor/x"), Some(&json!(1)));
        assert_eq!(
            meta.get(TOOL_META_KEY),
            Some(&json!({
                "statusTool": "get_operation_status",
                "businessKey": ["order_id"],
                "retentionSeconds": null,
            }))
        );
    }
}
