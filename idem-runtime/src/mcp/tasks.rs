//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663)
//! served from idem's records.
//!
//! A record already is a durable task: it exists before the side effect, it
//! has a reference, a state and a stored result, and every replica reads it.
//! So the task id is the operation's reference, and `tasks/get` is a lookup
//! in the caller's tenant, answered by any replica.
//!
//! A server serves tasks in three steps:
//!
//! 1. `#[idempotent(window = "15m", task = "optional")]` on each tool that
//!    may answer with a task (the server type must be `Clone`: the handler
//!    runs on after the answer, on a clone of it);
//! 2. `ServerCapabilities::builder().enable_tools().enable_tasks()` in
//!    `get_info`, which advertises the extension (and without which rmcp
//!    refuses `tasks/get` and `tasks/cancel`);
//! 3. `get_task` and `cancel_task` of its `ServerHandler` answered by
//!    [`get_task`] and [`cancel_task`]:
//!
//! ```no_run
//! use idem_runtime::{idempotent, Executor, IdempotentServer, ToolError};
//! use rmcp::handler::server::router::tool::ToolRouter;
//! use rmcp::handler::server::wrapper::{Json, Parameters};
//! use rmcp::model::{
//!     CancelTaskParams, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig,
//! };
//! use rmcp::service::RequestContext;
//! use rmcp::{tool, tool_handler, ErrorData, RoleServer, ServerHandler};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct ExportArgs {
//!     customer_id: String,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct Export {
//!     rows: u64,
//! }
//!
//! #[derive(Clone)] // the handler runs on after the answer, on a clone
//! struct Exports {
//!     executor: Executor,
//!     tool_router: ToolRouter<Self>, // Self::tool_router(), built once
//! }
//!
//! impl IdempotentServer for Exports {
//!     fn executor(&self) -> &Executor {
//!         &self.executor
//!     }
//! }
//!
//! // Without `server_handler`: the impl below is the server's handler.
//! #[idem_runtime::tool_router]
//! impl Exports {
//!     #[idempotent(window = "1h", task = "optional")]
//!     #[tool(description = "Export a customer's history (takes minutes)")]
//!     async fn export_history(
//!         &self,
//!         Parameters(args): Parameters<ExportArgs>,
//!     ) -> Result<Json<Export>, ToolError> {
//!         // Some(..) when the call runs as a task: tasks/cancel signals it.
//!         let _cancel = idem_runtime::mcp::current_cancellation();
//!         Ok(Json(Export { rows: args.customer_id.len() as u64 }))
//!     }
//! }
//!
//! #[tool_handler(router = self.tool_router)]
//! impl ServerHandler for Exports {
//!     fn get_info(&self) -> ServerConfig {
//!         ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
//!     }
//!     async fn get_task(
//!         &self,
//!         request: GetTaskParams,
//!         context: RequestContext<RoleServer>,
//!     ) -> Result<GetTaskResult, ErrorData> {
//!         idem_runtime::mcp::tasks::get_task(self, request, context).await
//!     }
//!     async fn cancel_task(
//!         &self,
//!         request: CancelTaskParams,
//!         context: RequestContext<RoleServer>,
//!     ) -> Result<(), ErrorData> {
//!         idem_runtime::mcp::tasks::cancel_task(self, request, context).await
//!     }
//! }
//! ```
//!
//! A client declares the extension in each request's `_meta` (see the
//! `task` option of [`macro@crate::idempotent`]); `tasks/get` answers a
//! completed task with the tool result inline in its field `result`.
//!
//! A request that does not declare the extension gets exactly what it got
//! before: the result inline, and the status tool for an operation still
//! running.

use std::time::{Duration, SystemTime};

pub use rmcp::model::TASKS_EXTENSION_ID;
use rmcp::model::{
    CancelTaskParams, CreateTaskResult, DetailedTask, ErrorCode, GetTaskParams, GetTaskResult,
    JsonObject, ProtocolVersion, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::json;

use super::caller::{resolve_caller, IdempotentServer};
use super::RESULT_META_KEY;
use crate::answer::text;
use crate::executor::Executor;
use crate::executor::REJECTED_RESOLUTION;
use crate::key::{Caller, Reference};
use crate::store::{Reading, Record};
use crate::time::rfc3339;

/// Whether the request declares the tasks extension in its capabilities
/// (its `_meta`, or the client's `initialize` on a connection that had one)
/// under protocol 2026-07-28 or later. Under an earlier version the
/// extension is not defined (SEP-2663: such a client is served as one that
/// declared nothing).
pub fn declared(context: &RequestContext<RoleServer>) -> bool {
    let version_defines_it = context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
    version_defines_it
        && context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// How often a client should poll: a tenth of the lease, between 100 ms and
/// 5 s. The lease is how long the record may go without news of a live
/// handler, so a poll this often sees a finished or a dead handler within
/// about a lease of it happening, without hammering the store.
pub fn poll_interval(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// The task a `tools/call` is answered with once its claim is durable.
pub(crate) fn created(reference: Reference, window: Duration, lease: Duration) -> CreateTaskResult {
    let now = rfc3339(SystemTime::now());
    let task = Task::new(reference.to_string(), TaskStatus::Working, now.clone(), now)
        .with_status_message(text::task_started(&reference.to_string()))
        .with_ttl_ms(millis(window))
        .with_poll_interval_ms(millis(poll_interval(lease)));
    CreateTaskResult::new(task)
}

/// The task a repeat `tools/call` of a running (or unknown) operation is
/// answered with: the same task id, its state as `tasks/get` would give it.
pub(crate) fn repeated(record: &Record, executor: &Executor) -> CreateTaskResult {
    CreateTaskResult::new(detailed(record, executor).task)
}

/// `tasks/get`: the caller's record with this reference, as a task. Any
/// replica answers it from the store. A task id that is not a reference,
/// belongs to no record, or belongs to another tenant's record gets the
/// same "not found" (`-32602`).
pub async fn get_task<S: IdempotentServer + ?Sized>(
    server: &S,
    request: GetTaskParams,
    context: RequestContext<RoleServer>,
) -> Result<GetTaskResult, ErrorData> {
    let record = find(server, &request.task_id, &context).await?;
    Ok(GetTaskResult::new(detailed(&record, server.executor())))
}

/// `tasks/cancel`: acknowledged for the caller's own task (another's, or
/// none, is "not found" as for `tasks/get`). When the task's handler runs in
/// this process, it is signalled ([`crate::mcp::current_cancellation`]); on any
/// other replica, or once the handler has finished, nothing happens. The
/// record is never changed by it: the handler's own outcome is what the
/// task ends with.
pub async fn cancel_task<S: IdempotentServer + ?Sized>(
    server: &S,
    request: CancelTaskParams,
    context: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    let record = find(server, &request.task_id, &context).await?;
    let signalled = server
        .executor()
        .task_signals()
        .cancel(&record.tenant, record.reference);
    tracing::info!(reference = %record.reference, signalled, "tasks/cancel");
    Ok(())
}

/// The caller's record for a task id.
async fn find<S: IdempotentServer + ?Sized>(
    server: &S,
    task_id: &str,
    context: &RequestContext<RoleServer>,
) -> Result<Record, ErrorData> {
    let Some(caller): Option<Caller> = resolve_caller(server, context) else {
        return Err(ErrorData::invalid_request(text::TASK_NO_CALLER, None));
    };
    let not_found = || {
        ErrorData::invalid_params(
            text::task_not_found(task_id),
            Some(json!({ "taskId": task_id })),
        )
    };
    let Some(reference) = Reference::parse(task_id) else {
        return Err(not_found());
    };
    match server
        .executor()
        .store()
        .lookup(caller.tenant(), &reference)
        .await
    {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(not_found()),
        Err(error) => {
            tracing::warn!(%reference, %error, "task lookup failed");
            Err(ErrorData::internal_error(
                text::store_unreachable(&error),
                None,
            ))
        }
    }
}

/// A record as a task: IN_PROGRESS with a live lease is working; COMPLETED
/// is completed with the stored result; UNKNOWN (or IN_PROGRESS with its
/// lease run out) is working with a message saying who resolves it (the
/// executor's [`Resolver`](crate::answer::Resolver)); NOT_PERFORMED is failed with
/// the handler's message (a rejection) or the resolution's.
fn detailed(record: &Record, executor: &Executor) -> DetailedTask {
    let lease = executor.lease();
    let reference = record.reference.to_string();
    let lifetime =
        |until: SystemTime| millis(until.duration_since(record.claimed_at).unwrap_or_default());
    let task = |ttl: SystemTime| {
        Task::new(
            reference.clone(),
            TaskStatus::Working,
            rfc3339(record.claimed_at),
            rfc3339(record.updated_at),
        )
        .with_ttl_ms(lifetime(ttl))
        .with_poll_interval_ms(millis(poll_interval(lease)))
    };
    match record.reading() {
        // A completed task reads until its record's retention ends, even
        // after its window let a new operation take the key.
        Reading::Completed { response } => {
            let task = task(record.retain_until);
            match serde_json::from_str::<JsonObject>(response) {
                Ok(mut result) => {
                    let meta = result.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(meta) = meta.as_object_mut() {
                        meta.insert(
                            RESULT_META_KEY.to_owned(),
                            json!({ "reference": reference, "state": "executed", "replayed": false, "recorded": true }),
                        );
                    }
                    DetailedTask::new(
                        task.with_status_message(text::task_completed(&reference)),
                        TaskPayload::Completed { result },
                    )
                }
                // It completed, so it must not run again; and what it
                // returned cannot be shown. A protocol error says so.
                Err(e) => {
                    let message = text::task_unreadable(&reference, e);
                    DetailedTask::new(
                        task.with_status_message(message.clone()),
                        TaskPayload::Failed {
                            error: error_object(
                                ErrorCode::INTERNAL_ERROR,
                                &message,
                                &reference,
                                "COMPLETED",
                            ),
                        },
                    )
                }
            }
        }
        Reading::Running { .. } => DetailedTask::new(
            task(record.expires_at).with_status_message(text::task_running(&reference)),
            TaskPayload::Working,
        ),
        // UNKNOWN, or a claim whose lease ran out: waiting for whoever
        // resolves it.
        Reading::Unknown { note, .. } => DetailedTask::new(
            task(record.retain_until).with_status_message(text::task_unknown(
                &reference,
                note,
                executor.resolver(),
            )),
            TaskPayload::Working,
        ),
        Reading::NotPerformed { note } => {
            let rejected = record.resolution.as_deref() == Some(REJECTED_RESOLUTION);
            let (code, message) = if rejected {
                (
                    ErrorCode::INVALID_PARAMS,
                    text::task_rejected(&reference, note),
                )
            } else {
                (
                    ErrorCode::INTERNAL_ERROR,
                    text::task_not_performed(&reference, note),
                )
            };
            DetailedTask::new(
                task(record.retain_until).with_status_message(message.clone()),
                TaskPayload::Failed {
                    error: error_object(code, &message, &reference, "NOT_PERFORMED"),
                },
            )
        }
    }
}

/// A JSON-RPC error object for a failed task, naming the operation.
fn error_object(code: ErrorCode, message: &str, reference: &str, state: &str) -> JsonObject {
    let value = json!({
        "code": code.0,
        "message": message,
        "data": { "reference": reference, "state": state },
    });
    match value {
        serde_json::Value::Object(object) => object,
        _ => JsonObject::new(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_follows_the_lease_within_bounds() {
        assert_eq!(
            poll_interval(Duration::from_secs(30)),
            Duration::from_secs(3)
        );
        assert_eq!(
            poll_interval(Duration::from_millis(300)),
            Duration::from_millis(100)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
    }
}
