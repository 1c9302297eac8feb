//! The runtime bodies of a wrapped tool, which the generated code calls
//! through `__private`: [`call`] (answered inline) and [`call_task`] (an
//! MCP task when the request declares the extension).

use std::future::Future;

use rmcp::model::{CallToolResponse, CallToolResult};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;
use tracing::Instrument;

use super::caller::{resolve_caller, IdempotentServer, CURRENT_CANCELLATION};
use super::client_key::{self, ClientKeyMode};
use super::private::{ToolSpec, WrappedServer};
use super::render::{no_caller, render, HandlerFailure};
use super::tasks;
use super::RESULT_META_KEY;
use crate::answer::{Answer, AnswerState};
use crate::executor::{Keyed, Operation, ScopeSpec, TaskClaim};
use crate::key::Caller;

/// The body of a wrapped tool: find the caller, run the handler through
/// the server's executor, and turn the answer into a tool result.
/// `business_key` is `(field as written in the attribute, its value)` for
/// each field of a business key, taken from the typed arguments; empty for
/// a window.
pub async fn call<'k, S, P, F, Fut>(
    server: &S,
    request: RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    business_key: impl IntoIterator<Item = (&'k str, Result<Value, serde_json::Error>)>,
    params: P,
    handler: F,
) -> Result<CallToolResult, ErrorData>
where
    S: WrappedServer + ?Sized,
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = Result<CallToolResult, HandlerFailure>>,
{
    let prepared = match prepare(server, &request, spec, args, business_key) {
        Ok(prepared) => prepared,
        Err(refused) => return Ok(refused),
    };
    drop(request);
    let operation = prepared.operation(spec);
    let keyed_by = client_key::keyed_by(operation.scope);
    let answer = server
        .executor()
        .run_json(operation, prepared.keyed(), move |_| handler(params))
        .await;
    Ok(with_keyed_by(render(answer), keyed_by))
}

/// `result` with `_meta["idem/operation"].keyedBy`: what identified the
/// operation.
fn with_keyed_by(mut result: CallToolResult, keyed_by: &'static str) -> CallToolResult {
    if let Some(Value::Object(operation)) = result
        .meta
        .as_mut()
        .and_then(|meta| meta.get_mut(RESULT_META_KEY))
    {
        operation.insert("keyedBy".to_owned(), Value::String(keyed_by.to_owned()));
    }
    result
}

/// What a call runs as: its caller, its arguments and its business key's
/// values, taken from the request before the operation is claimed.
struct Prepared<'k> {
    caller: Caller,
    args: Value,
    values: Vec<(&'k str, Value)>,
    /// The call's client key, for a tool that accepts one and a request
    /// that carries one.
    client_key: Option<String>,
}

impl Prepared<'_> {
    /// The operation `spec`'s tool runs for this call: the one way both
    /// bodies build it.
    fn operation<'a>(&'a self, spec: ToolSpec<'a>) -> Operation<'a, Value> {
        // A client key names the operation in place of the window (the
        // macro accepts `client_key` with a window only).
        let scope = match (&self.client_key, spec.scope) {
            (Some(key), ScopeSpec::Window(window)) => ScopeSpec::ClientKey { key, window },
            (_, scope) => scope,
        };
        Operation {
            caller: &self.caller,
            tool: spec.tool,
            args: &self.args,
            scope,
            status_tool: spec.status_tool,
        }
    }

    /// The business key's values, from the typed fields, not from the JSON
    /// object: a field serde renames would not be found there by its name.
    fn keyed(&self) -> Keyed<'_> {
        Some(&self.values)
    }
}

/// The caller, the arguments and the business key's values of a call, or
/// the answer that refuses it (no caller, arguments that cannot be written).
fn prepare<'k, S: IdempotentServer + ?Sized>(
    server: &S,
    request: &RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    business_key: impl IntoIterator<Item = (&'k str, Result<Value, serde_json::Error>)>,
) -> Result<Prepared<'k>, CallToolResult> {
    let tool = spec.tool;
    let Some(caller) = resolve_caller(server, request) else {
        crate::telemetry::call(tool, AnswerState::NoCaller);
        return Err(no_caller());
    };
    // A tool that did not opt in never reads a key: its calls are keyed as
    // they always were.
    let client_key = match spec.client_key {
        None => None,
        Some(mode) => {
            let refused = |reason: String| {
                let answer: Answer<CallToolResult, HandlerFailure> = Answer::Refused { reason };
                crate::telemetry::call(tool, answer.state());
                with_keyed_by(render(answer), "clientKey")
            };
            match client_key::from_request(request) {
                Ok(Some(key)) => Some(key),
                Ok(None) if mode == ClientKeyMode::Required => {
                    return Err(refused(client_key::required()))
                }
                Ok(None) => None,
                Err(reason) => return Err(refused(reason)),
            }
        }
    };
    let args = match args {
        Ok(args) => args,
        Err(error) => {
            let answer: Answer<CallToolResult, HandlerFailure> = Answer::Refused {
                reason: format!("the arguments cannot be serialized ({error})"),
            };
            crate::telemetry::call(tool, answer.state());
            return Err(render(answer));
        }
    };
    let values = business_key
        .into_iter()
        .map(|(field, value)| value.map(|value| (field, value)).map_err(|e| (field, e)))
        .collect::<Result<Vec<_>, _>>();
    match values {
        Ok(values) => Ok(Prepared {
            caller,
            args,
            values,
            client_key,
        }),
        Err((field, error)) => {
            let answer: Answer<CallToolResult, HandlerFailure> = Answer::Refused {
                reason: format!("the business key field `{field}` cannot be serialized ({error})"),
            };
            crate::telemetry::call(tool, answer.state());
            Err(render(answer))
        }
    }
}

/// The body of a wrapped tool with `task = "optional"`. A request that does
/// not declare the tasks extension is served by [`call`] with `inline`,
/// exactly as a tool without the option. One that declares it gets, once
/// the claim is durable, a task whose id is the operation's reference, and
/// the handler (`spawned`, on a clone of the server) runs on in the
/// background of this process, with its heartbeat. A repeat of a running or
/// unknown operation gets the same task; a completed one its stored result;
/// anything refused before the claim the same answer as without a task.
#[allow(clippy::too_many_arguments)]
pub async fn call_task<'k, S, P, F, Fut, G, Spawned>(
    server: &S,
    request: RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    business_key: impl IntoIterator<Item = (&'k str, Result<Value, serde_json::Error>)>,
    params: P,
    inline: F,
    spawned: G,
) -> Result<CallToolResponse, ErrorData>
where
    S: WrappedServer + ?Sized,
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = Result<CallToolResult, HandlerFailure>>,
    G: FnOnce(P) -> Spawned,
    Spawned: Future<Output = Result<CallToolResult, HandlerFailure>> + Send + 'static,
{
    if !tasks::declared(&request) {
        return call(server, request, spec, args, business_key, params, inline)
            .await
            .map(CallToolResponse::Complete);
    }
    let prepared = match prepare(server, &request, spec, args, business_key) {
        Ok(prepared) => prepared,
        Err(refused) => return Ok(CallToolResponse::Complete(refused)),
    };
    drop(request);
    let caller = &prepared.caller;
    let executor = server.executor();
    let operation = prepared.operation(spec);
    let keyed_by = client_key::keyed_by(operation.scope);
    match executor
        .claim_task::<CallToolResult, HandlerFailure>(operation, prepared.keyed())
        .await
    {
        TaskClaim::Answered(answer) => {
            crate::telemetry::call(spec.tool, answer.state());
            Ok(CallToolResponse::Complete(with_keyed_by(
                render(answer),
                keyed_by,
            )))
        }
        TaskClaim::Running(record) => {
            let state = match record.reading() {
                crate::store::Reading::Running { .. } => AnswerState::InProgress,
                _ => AnswerState::Unknown,
            };
            crate::telemetry::call(spec.tool, state);
            Ok(CallToolResponse::Task(tasks::repeated(&record, executor)))
        }
        TaskClaim::Claimed(claimed) => {
            let reference = claimed.reference();
            let created = tasks::created(reference, claimed.window(), claimed.lease());
            let signal = executor.task_signals().register(caller.tenant(), reference);
            let cancellation = signal.signal();
            let handler = crate::executor::CURRENT_REFERENCE.scope(
                reference,
                CURRENT_CANCELLATION.scope(cancellation, spawned(params)),
            );
            let executor = executor.clone();
            let span = tracing::info_span!(
                "idem.task",
                tool = spec.tool,
                tenant = caller.tenant(),
                reference = %reference,
            );
            tokio::spawn(
                async move {
                    let answer: Answer<CallToolResult, HandlerFailure> =
                        executor.run_claimed(claimed, handler).await;
                    drop(signal);
                    tracing::debug!(state = answer.state().as_str(), "task finished");
                }
                .instrument(span),
            );
            Ok(CallToolResponse::Task(created))
        }
    }
}
