//! Who calls: the server's executor and default caller, the caller of a
//! request, and the reference inside a running handler.

use rmcp::model::Extensions;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::executor::{Executor, TaskCancellation};
use crate::key::Caller;

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

    /// What seals the `requestState` of a tool that asks before its effect
    /// ([`Ask`](super::Ask)), so that a tampered, expired or borrowed state
    /// is refused. `None` (the default) uses a key drawn once per process:
    /// enough for one replica, but a continuation that reaches another
    /// replica is refused there. Servers with several replicas return a
    /// codec built from a secret they share, at least 32 bytes
    /// (`RequestStateCodec::try_new(secret)`), kept out of clients' reach.
    fn request_state_codec(&self) -> Option<&rmcp::model::RequestStateCodec> {
        None
    }
}

tokio::task_local! {
    pub(super) static CURRENT_CANCELLATION: TaskCancellation;
}

/// The cancellation signal of the handler that is running, inside the body
/// of an `#[idempotent(task = "optional")]` tool whose call was answered with
/// an MCP task; `None` anywhere else (a call answered inline has no task to
/// cancel). `tasks/cancel` for the task sets it, on the replica that runs
/// the handler.
///
/// Cancellation is cooperative and never touches the record: stop if you
/// can, and end the way the call really ended (`ToolError::rejected` when
/// nothing happened, `ToolError::unknown` when something may have). Like
/// [`current_reference`](crate::current_reference), it is a task-local: read it before spawning.
pub fn current_cancellation() -> Option<TaskCancellation> {
    CURRENT_CANCELLATION.try_with(Clone::clone).ok()
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

pub(super) fn resolve_caller<S: IdempotentServer + ?Sized>(
    server: &S,
    request: &RequestContext<RoleServer>,
) -> Option<Caller> {
    request_caller(&request.extensions).or_else(|| server.default_caller().cloned())
}

#[cfg(test)]
mod tests {
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
}
