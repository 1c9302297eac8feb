//! What generated code names. Not a public API: it changes without notice.

use std::fmt;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::MetaObject;
use serde::Serialize;
use serde_json::{json, Value};

pub use core::time::Duration;
pub use rmcp;
pub use rmcp::handler::server::tool::schema_for_output;
pub use rmcp::model::{CallToolResponse, CallToolResult};
pub use rmcp::service::RequestContext;
pub use rmcp::{ErrorData, RoleServer};

pub use super::ask::{ask_outcome, ask_output, call_asking, call_task_asking, Ask};
pub use super::call::{call, call_task};
pub use super::client_key::ClientKeyMode;
pub use super::render::HandlerFailure;
pub use crate::executor::ScopeSpec;
pub use rmcp::handler::server::tool::{
    InputResponses as InputResponsesArg, RequestState as RequestStateArg,
};

use super::caller::IdempotentServer;
use super::render::completed;
use super::status_tool::status_tool;
use super::TOOL_META_KEY;
use crate::answer::Classify;
use crate::executor::DEFAULT_RETENTION;

/// What the macro knows about a tool.
#[derive(Clone, Copy, Debug)]
pub struct ToolSpec<'a> {
    pub tool: &'a str,
    pub scope: ScopeSpec<'a>,
    pub status_tool: &'a str,
    /// `client_key = "..."`: whether a call's client key names its
    /// operation (`None`: the tool ignores client keys).
    pub client_key: Option<ClientKeyMode>,
}

/// A return type `#[idempotent]` can record: `Result<V, E>`.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` cannot record a tool that returns `{Self}`",
    label = "the error type must implement `idem_runtime::Classify` and `Display`",
    note = "return `Result<T, ToolError>` (T: `Json<_>`, `CallToolResult`, `String`, ...), \
            or implement `idem_runtime::Classify` for your error type"
)]
pub trait ToolReturn {
    type Value: IntoCallToolResult;
    type Error: Classify + fmt::Display;
    fn into_result(self) -> Result<Self::Value, Self::Error>;
}

impl<V: IntoCallToolResult, E: Classify + fmt::Display> ToolReturn for Result<V, E> {
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

/// The arguments of a tool that takes none: the operation is the caller
/// and the tool (within the window).
pub fn no_arguments() -> Result<Value, serde_json::Error> {
    Ok(Value::Object(serde_json::Map::new()))
}

/// A business key field, borrowed from the typed arguments before the
/// handler consumes them. The macro calls `(&&KeyField(&args.field))
/// .business_key_value()`: method resolution picks [`OptionalKeyField`] for
/// an `Option` (one reference more, tried first) and [`KeyFieldValue`] for
/// anything else, so an `Option` field is refused at compile time.
#[derive(Debug)]
pub struct KeyField<'a, T: ?Sized>(pub &'a T);

/// A business key field's value: the typed field serialized on its own,
/// so serde's renames on the argument type do not hide it.
pub trait KeyFieldValue {
    /// The field's type.
    type Field: ?Sized;
    fn business_key_value(&self) -> Result<Value, serde_json::Error>
    where
        Self::Field: Serialize;
}

impl<T: ?Sized> KeyFieldValue for KeyField<'_, T> {
    type Field = T;
    fn business_key_value(&self) -> Result<Value, serde_json::Error>
    where
        T: Serialize,
    {
        serde_json::to_value(self.0)
    }
}

/// An `Option` business key field: never compiles, because no type
/// implements [`NotOptional`].
pub trait OptionalKeyField {
    /// `T` of `Option<T>`.
    type Inner;
    fn business_key_value(&self) -> Result<Value, serde_json::Error>
    where
        Self::Inner: NotOptional;
}

impl<T> OptionalKeyField for &KeyField<'_, Option<T>> {
    type Inner = T;
    fn business_key_value(&self) -> Result<Value, serde_json::Error>
    where
        T: NotOptional,
    {
        // Unreachable: nothing implements `NotOptional`. Were it reached, a
        // null is refused as missing.
        Ok(Value::Null)
    }
}

/// Implemented by no type: what makes an `Option` business key field a
/// compile error, with this message.
#[diagnostic::on_unimplemented(
    message = "a business key must always have a value; make this field a `{Self}`, not an `Option<{Self}>`",
    label = "this business key field is an `Option<{Self}>`",
    note = "the tool's schema would tell the model the field may be left out, and every call \
            without it would be refused: the operation is the business key's value"
)]
pub trait NotOptional {}

/// A server whose tools `#[idempotent]` wraps: what the generated body
/// requires of `self`'s type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` serves `#[idempotent]` tools but does not implement `idem_runtime::IdempotentServer`",
    label = "this tool runs through its server's executor",
    note = "implement `idem_runtime::IdempotentServer` for `{Self}`: its `executor()` hands the tools their store"
)]
pub trait WrappedServer: IdempotentServer {}

impl<S: IdempotentServer + ?Sized> WrappedServer for S {}

/// A server whose router gets a status tool: what
/// `#[idem_runtime::tool_router]` requires of the impl's type.
#[diagnostic::on_unimplemented(
    message = "the status tool that `#[idem_runtime::tool_router]` adds needs `{Self}: idem_runtime::IdempotentServer + Send + Sync + 'static`",
    label = "this type's router gets the status tool its `#[idempotent]` tools name",
    note = "implement `idem_runtime::IdempotentServer` for `{Self}` (its `executor()` is what the tools and the \
            status tool run through), or write `#[idem_runtime::tool_router(status_tool = false)]` and add a \
            status tool yourself"
)]
pub trait StatusServer: IdempotentServer + Send + Sync + 'static {}

impl<S: IdempotentServer + Send + Sync + 'static> StatusServer for S {}

/// The router `#[idem_runtime::tool_router]` generates: rmcp's, plus the
/// status tool under each name its `#[idempotent]` tools give, unless the
/// impl already has a tool of that name.
pub fn with_status_tools<S: StatusServer>(
    mut router: ToolRouter<S>,
    names: &[&'static str],
) -> ToolRouter<S> {
    for &name in names {
        if !router.map.contains_key(name) {
            router.add_route(status_tool::<S>(name));
        }
    }
    router
}

/// The `list_tools` answer of a generated `ServerHandler`: the tools with
/// the windows and retentions `server`'s executor serves.
pub fn served_tools<S: IdempotentServer + ?Sized, R: Send + Sync + 'static>(
    server: &S,
    router: &ToolRouter<R>,
    context: &RequestContext<RoleServer>,
) -> rmcp::model::ListToolsResult {
    super::listing::served_result(router, server.executor(), context)
}

/// The `get_tool` of a generated `ServerHandler`: `name`'s definition as
/// `server`'s executor serves it.
pub fn served_tool<S: IdempotentServer + ?Sized, R: Send + Sync + 'static>(
    server: &S,
    router: &ToolRouter<R>,
    name: &str,
) -> Option<rmcp::model::Tool> {
    let tool = router.get(name)?.clone();
    Some(super::listing::served(tool, server.executor()))
}

/// A `Result<V, E>` body's outcome, spanned on the declared return type.
pub fn outcome<R: ToolReturn>(returned: R) -> Result<CallToolResult, HandlerFailure> {
    completed(returned.into_result().map_err(HandlerFailure::tool)?)
}

/// A plain body's output (never a failure of the tool's own), spanned on
/// the declared return type.
pub fn output<V: IntoCallToolResult>(returned: V) -> Result<CallToolResult, HandlerFailure> {
    completed(returned)
}

/// The `_meta` of a wrapped tool's definition: the user's, plus the
/// marker [`audit_hints`](super::audit_hints) looks for.
pub fn tool_meta(user: Option<MetaObject>, scope: ScopeSpec<'_>, status_tool: &str) -> MetaObject {
    let mut meta = user.unwrap_or_default();
    let scope = match scope {
        ScopeSpec::Window(window) => json!({ "windowSeconds": window.as_secs() }),
        // The default retention is shown as such: the `_meta` is static, so
        // an `Executor::with_retention` of the server's is not seen here.
        ScopeSpec::BusinessKey { fields, retention } => json!({
            "businessKey": fields,
            "retentionSeconds": retention.unwrap_or(DEFAULT_RETENTION).as_secs(),
        }),
        // Not a scope a tool declares (a call's client key is), but shown
        // as what it is if one is passed.
        ScopeSpec::ClientKey { window, .. } => json!({ "windowSeconds": window.as_secs() }),
    };
    let mut marker = json!({ "statusTool": status_tool });
    if let (Some(marker), Some(scope)) = (marker.as_object_mut(), scope.as_object()) {
        marker.extend(scope.clone());
    }
    meta.insert(TOOL_META_KEY.to_owned(), marker);
    meta
}

/// The `_meta` of a tool idempotent by construction: the user's, plus the
/// marker with the reason, which [`audit_hints`](super::audit_hints) accepts
/// as what backs the hint and [`hint_report`](super::hint_report) shows.
pub fn construction_tool_meta(user: Option<MetaObject>, reason: &str) -> MetaObject {
    let mut meta = user.unwrap_or_default();
    meta.insert(
        TOOL_META_KEY.to_owned(),
        json!({ "byConstruction": reason }),
    );
    meta
}

/// `meta` (a [`tool_meta`]) of a tool with `client_key = "..."`: its
/// marker says whether a call may, or must, carry a client key.
pub fn with_client_key(mut meta: MetaObject, mode: Option<ClientKeyMode>) -> MetaObject {
    if let (Some(marker), Some(mode)) = (
        meta.get_mut(TOOL_META_KEY).and_then(Value::as_object_mut),
        mode,
    ) {
        marker.insert("clientKey".to_owned(), json!(mode.as_str()));
    }
    meta
}

/// [`tool_meta`] of a tool with `task = "optional"`: its marker also says
/// that a request declaring the tasks extension may get a task.
pub fn task_tool_meta(
    user: Option<MetaObject>,
    scope: ScopeSpec<'_>,
    status_tool: &str,
) -> MetaObject {
    let mut meta = tool_meta(user, scope, status_tool);
    if let Some(marker) = meta.get_mut(TOOL_META_KEY).and_then(Value::as_object_mut) {
        marker.insert("task".to_owned(), json!("optional"));
    }
    meta
}

/// A server whose tools answer with tasks: what `task = "optional"`
/// requires of `self`'s type, to run the handler on a clone of it after the
/// answer has gone out.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(task = \"optional\")]` runs the handler on after the answer, on a clone of the server: `{Self}` must be `Clone + Send + Sync + 'static`",
    label = "this tool's handler runs on a clone of `{Self}`",
    note = "derive `Clone` for `{Self}` (keep what it shares behind an `Arc`), or drop `task = \"optional\"`"
)]
pub trait TaskServer: Clone + Send + Sync + 'static {}

impl<S: Clone + Send + Sync + 'static> TaskServer for S {}

/// The clone of the server a task's handler runs on.
pub fn owned_server<S: TaskServer>(server: &S) -> S {
    server.clone()
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
                "retentionSeconds": 172_800,
            }))
        );
    }
}
