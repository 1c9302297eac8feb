//! The rmcp glue: what `#[idempotent]` expands to, the caller of a request,
//! the reference inside a handler, and the start-up audit of a router's hints.

use std::fmt;
use std::future::Future;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext};
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, Extensions, IntoContents, MetaObject, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::Serialize;
use serde_json::{json, Value};

use crate::executor::{Executor, Operation};
use crate::key::{Caller, Reference};
use crate::outcome::{Answer, Classify, Disposition, ToolError};

/// The `_meta` key of a tool result that describes its operation:
/// `{"reference", "state", "replayed", "statusTool", "retryAfterSeconds"}`.
pub const RESULT_META_KEY: &str = "idem/operation";

/// The `_meta` key of a tool definition that `#[idempotent]` wraps; its value
/// describes the scope. [`audit_hints`] trusts `idempotentHint` only where
/// this key is present.
pub const TOOL_META_KEY: &str = "idem/idempotent";

/// A server whose tools `#[idempotent]` wraps: it hands the wrapper its
/// executor (and so its store, lease and retention) and, optionally, the
/// caller to use when a request carries none.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{Caller, Executor, IdempotentServer, MemoryStore};
///
/// struct Payments {
///     executor: Executor,
///     local_user: Caller,
/// }
///
/// impl IdempotentServer for Payments {
///     fn executor(&self) -> &Executor {
///         &self.executor
///     }
///     // A stdio server serves one local user.
///     fn default_caller(&self) -> Option<&Caller> {
///         Some(&self.local_user)
///     }
/// }
///
/// let server = Payments {
///     executor: Executor::new(Arc::new(MemoryStore::new())),
///     local_user: Caller::new("local", "me"),
/// };
/// # let _ = server;
/// ```
pub trait IdempotentServer {
    /// The executor every wrapped tool of this server runs through.
    fn executor(&self) -> &Executor;

    /// The caller of a request that carries none. `None` (the default)
    /// refuses such calls before anything runs.
    fn default_caller(&self) -> Option<&Caller> {
        None
    }
}

tokio::task_local! {
    static CURRENT_REFERENCE: Reference;
}

/// The reference of the operation whose handler is running, inside the body
/// of an `#[idempotent]` tool; `None` anywhere else. Pass it to the processor
/// as its own idempotency key.
///
/// It is a task-local: a task spawned by the handler does not see it, so
/// read it first and move the value in.
pub fn current_reference() -> Option<Reference> {
    CURRENT_REFERENCE.try_with(|reference| *reference).ok()
}

/// The caller of a request: a [`Caller`] in the request context's
/// extensions, or in the extensions of the HTTP request parts (what an auth
/// layer in front of rmcp's streamable HTTP service fills in). `None` when
/// neither has one.
pub fn request_caller(extensions: &Extensions) -> Option<Caller> {
    if let Some(caller) = extensions.get::<Caller>() {
        return Some(caller.clone());
    }
    extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
}

fn resolve_caller<S: IdempotentServer + ?Sized>(
    server: &S,
    request: &RequestContext<RoleServer>,
) -> Option<Caller> {
    request_caller(&request.extensions).or_else(|| server.default_caller().cloned())
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.message().to_owned())]
    }
}

/// A protocol error from a handler says nothing about its side effect.
impl Classify for ErrorData {}

/// A tool that claims `idempotentHint: true` with no `#[idempotent]` wrapper
/// behind it, as found by [`audit_hints`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HintProblem {
    /// The tool says repeating it is safe, and nothing makes it so: the hint
    /// was set by hand (rmcp's builder API, or a `#[tool]` the macros did not see).
    UnbackedHint {
        /// The tool's name.
        tool: String,
    },
    /// A wrapped tool names a status tool the router does not have, so its
    /// in-flight and unknown answers send the model to a tool that is not there.
    MissingStatusTool {
        /// The wrapped tool.
        tool: String,
        /// The status tool it names.
        status_tool: String,
    },
}

impl fmt::Display for HintProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HintProblem::UnbackedHint { tool } => write!(
                f,
                "tool `{tool}` claims idempotentHint: true but no #[idempotent] wrapper backs it; \
                 wrap it or remove the hint"
            ),
            HintProblem::MissingStatusTool { tool, status_tool } => write!(
                f,
                "tool `{tool}` sends models to status tool `{status_tool}`, which this router \
                 does not have; add it (idem_runtime::status_tool) or name another"
            ),
        }
    }
}

impl std::error::Error for HintProblem {}

/// Checks a finished router: every tool that claims `idempotentHint: true`
/// must be wrapped by `#[idempotent]`, and every wrapped tool's status tool
/// must be in the router. Call it at start-up, on the router the server
/// will serve (after every `+`, `merge` and `with_route`), and refuse to
/// start on an error:
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{audit_hints, idempotent, Executor, IdempotentServer, MemoryStore, ToolError};
/// use rmcp::handler::server::wrapper::{Json, Parameters};
/// use rmcp::tool;
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct ChargeArgs {
///     order_id: String,
///     amount_cents: u64,
/// }
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct Receipt {
///     charge_id: String,
/// }
///
/// struct Payments {
///     executor: Executor,
/// }
///
/// impl IdempotentServer for Payments {
///     fn executor(&self) -> &Executor {
///         &self.executor
///     }
/// }
///
/// #[idem_runtime::tool_router]
/// impl Payments {
///     #[idempotent(window = "15m")]
///     #[tool(description = "Charge a card")]
///     async fn charge_card(
///         &self,
///         Parameters(args): Parameters<ChargeArgs>,
///     ) -> Result<Json<Receipt>, ToolError> {
///         Ok(Json(Receipt { charge_id: format!("ch_{}", args.order_id) }))
///     }
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     // The router the server will serve, status tool included.
///     let router = Payments::tool_router()
///         .with_route(idem_runtime::status_tool::<Payments>("get_operation_status"));
///     if let Err(problems) = audit_hints(&router) {
///         for problem in &problems {
///             eprintln!("{problem}");
///         }
///         return Err("refusing to start: a tool's idempotentHint is not backed".into());
///     }
///     // ... serve `Payments { executor: Executor::new(Arc::new(MemoryStore::new())) }`
///     # let _ = Payments { executor: Executor::new(Arc::new(MemoryStore::new())) };
///     Ok(())
/// }
/// ```
///
/// The macros already refuse a hand-written hint on a `#[tool]` they can
/// see; this finds the rest, such as a hint set through rmcp's builder API
/// (`ToolRoute::new`, `.annotation(..)`). A wrapped tool is recognised by
/// the `_meta` entry its wrapper adds ([`TOOL_META_KEY`]); disabled routes
/// are checked too, since they may be enabled later. A route built by hand
/// from a wrapped tool's definition with some other handler carries that
/// entry and passes: the audit catches slips, not forgery.
pub fn audit_hints<S>(router: &ToolRouter<S>) -> Result<(), Vec<HintProblem>> {
    let mut routes: Vec<&ToolRoute<S>> = router.map.values().collect();
    routes.sort_by(|a, b| a.attr.name.cmp(&b.attr.name));
    let mut problems = Vec::new();
    for route in routes {
        let tool = &route.attr;
        let claims = tool
            .annotations
            .as_ref()
            .and_then(|a| a.idempotent_hint)
            .unwrap_or(false);
        let marker = tool.meta.as_ref().and_then(|meta| meta.get(TOOL_META_KEY));
        match marker {
            None if claims => problems.push(HintProblem::UnbackedHint {
                tool: tool.name.to_string(),
            }),
            None => {}
            Some(marker) => {
                let status_tool = marker.get("statusTool").and_then(Value::as_str);
                if let Some(status_tool) = status_tool {
                    if !router.map.contains_key(status_tool) {
                        problems.push(HintProblem::MissingStatusTool {
                            tool: tool.name.to_string(),
                            status_tool: status_tool.to_owned(),
                        });
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The arguments of the status tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct StatusArgs {
    /// The reference an answer gave, e.g. `idem_3f9a0c1d2e4b5a69`.
    reference: String,
}

/// A ready-made status tool for a router: `name(reference)` answers from the
/// record of the caller's tenant (state, tool, times, the stored response
/// when completed, and the next step). Add it under the name the wrapped
/// tools' `status_tool` uses (by default `get_operation_status`):
///
/// ```ignore
/// let router = Payments::tool_router()
///     .with_route(idem_runtime::status_tool::<Payments>("get_operation_status"));
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
                Ok(None) => CallToolResult::error(vec![ContentBlock::text(format!(
                    "No operation with reference \"{}\" was found for this caller.",
                    args.reference
                ))]),
                Err(error) => CallToolResult::error(vec![ContentBlock::text(format!(
                    "The operation store cannot be reached ({error}); ask again shortly."
                ))]),
            };
            Ok(CallToolResponse::Complete(result))
        })
    })
}

fn no_caller() -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(
        "The call was refused and nothing was executed: the request carries no authenticated \
         caller, and this server has no default caller. Connect with credentials (over HTTP, an \
         Authorization header the server accepts), then call again.",
    )]);
    set_meta(&mut result, json!({ "state": "refused" }));
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
pub struct Failure {
    disposition: Disposition,
    message: String,
}

impl Failure {
    fn tool<E: Classify + fmt::Display>(error: E) -> Self {
        Failure {
            disposition: error.disposition(),
            message: error.to_string(),
        }
    }

    /// The handler ran but its output cannot become a tool result: the side
    /// effect happened and what it returned is lost, so the outcome is unknown.
    fn output(message: impl fmt::Display) -> Self {
        Failure {
            disposition: Disposition::Unknown,
            message: format!("The tool ran, but its result could not be returned ({message})."),
        }
    }
}

impl Classify for Failure {
    fn disposition(&self) -> Disposition {
        self.disposition
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn completed(value: impl IntoCallToolResult) -> Result<CallToolResult, Failure> {
    match value.into_call_tool_result() {
        Ok(CallToolResponse::Complete(result)) => Ok(result),
        Ok(_) => Err(Failure::output(
            "an idempotent tool must complete in one call; it asked for input or started a task",
        )),
        Err(error) => Err(Failure::output(error)),
    }
}

fn render<E: fmt::Display>(answer: Answer<CallToolResult, E>) -> CallToolResult {
    let message = answer.message();
    let state = answer.kind();
    let reference = answer.reference().map(|r| r.to_string());
    match answer {
        Answer::Executed {
            mut value,
            recorded,
            ..
        } => {
            set_meta(
                &mut value,
                json!({ "reference": reference, "state": "completed", "replayed": false, "recorded": recorded }),
            );
            value
        }
        Answer::Replayed { mut value, .. } => {
            set_meta(
                &mut value,
                json!({ "reference": reference, "state": "completed", "replayed": true }),
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

/// What generated code names. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    use super::*;

    pub use core::time::Duration;
    pub use rmcp;
    pub use rmcp::handler::server::tool::schema_for_output;
    pub use rmcp::model::CallToolResult;
    pub use rmcp::service::RequestContext;
    pub use rmcp::{ErrorData, RoleServer};

    pub use crate::executor::ScopeSpec;

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

    pub use super::Failure;

    /// The arguments as JSON, taken before the handler consumes them. The
    /// macro spans this call on the parameter type, so a type that is not
    /// `Serialize` is reported there.
    pub fn arguments<P: Serialize>(params: &P) -> Result<Value, serde_json::Error> {
        serde_json::to_value(params)
    }

    /// A `Result<V, E>` body's outcome, spanned on the declared return type.
    pub fn outcome<R: Outcome>(returned: R) -> Result<CallToolResult, Failure> {
        completed(returned.into_result().map_err(Failure::tool)?)
    }

    /// A plain body's output (never a failure of the tool's own), spanned on
    /// the declared return type.
    pub fn output<V: IntoCallToolResult>(returned: V) -> Result<CallToolResult, Failure> {
        completed(returned)
    }

    /// The `_meta` of a wrapped tool's definition: the user's, plus the
    /// marker [`audit_hints`] looks for.
    pub fn tool_meta(
        user: Option<MetaObject>,
        scope: ScopeSpec<'_>,
        status_tool: &str,
    ) -> MetaObject {
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
        Fut: Future<Output = Result<CallToolResult, Failure>>,
    {
        let Some(caller) = resolve_caller(server, &request) else {
            return Ok(no_caller());
        };
        drop(request);
        let args = match args {
            Ok(args) => args,
            Err(error) => {
                let answer: Answer<CallToolResult, Failure> = Answer::Refused {
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
}

#[cfg(test)]
mod tests {
    use super::__private::ScopeSpec;
    use super::*;

    #[test]
    fn caller_from_extensions_then_http_parts() {
        let mut extensions = Extensions::new();
        assert_eq!(request_caller(&extensions), None);

        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.extensions.insert(Caller::new("acme", "via-http"));
        extensions.insert(parts);
        assert_eq!(
            request_caller(&extensions),
            Some(Caller::new("acme", "via-http"))
        );

        extensions.insert(Caller::new("acme", "direct"));
        assert_eq!(
            request_caller(&extensions),
            Some(Caller::new("acme", "direct"))
        );
    }

    #[test]
    fn tool_meta_marks_the_scope_and_keeps_the_users_entries() {
        let mut user = MetaObject::new();
        user.insert("vendor/x".into(), json!(1));
        let meta = __private::tool_meta(
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
