//! Tools that ask before their effect: a multi-round-trip request
//! (SEP-2322, protocol 2026-07-28). A wrapped handler that returns
//! [`Ask::Input`] has done nothing yet: idem releases the claim, records
//! nothing, and answers `resultType: "input_required"` with the handler's
//! questions and a `requestState` sealed for this caller, tool and
//! arguments. The client answers and sends the same call again, with
//! `inputResponses` and the `requestState`: the same operation, claimed,
//! run once with the answers ([`current_continuation`]) and recorded. A
//! repeat of it, or of the original call, replays the stored answer.

use std::fmt;
use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rmcp::handler::server::tool::RequestState as RequestStateArg;
use rmcp::handler::server::tool::{InputResponses as InputResponsesArg, IntoCallToolResult};
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, ElicitRequest, ElicitRequestParams,
    ElicitResult, ElicitationSchema, InputRequest, InputRequests, InputRequiredResult,
    InputResponses, MetaObject, ProtocolVersion, RequestStateCodec, SealOptions,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::call::call;
use super::caller::{resolve_caller, IdempotentServer};
use super::client_key;
use super::private::{ToolSpec, WrappedServer};
use super::render::{completed, HandlerFailure};
use super::RESULT_META_KEY;
use crate::answer::{AnswerState, Classify, ToolError};
use crate::executor::{Executor, ScopeSpec, DEFAULT_RETENTION};
use crate::key::canonical::canonical_json;
use crate::key::Caller;

/// What a wrapped tool that may ask before its effect returns: its result,
/// or the questions to put to the user first. Declare the handler as
/// returning `Result<Ask<T>, E>` (or `Ask<T>`), with `T` any tool output
/// (`Json<Receipt>`, `String`, `CallToolResult`):
///
/// ```rust,ignore
/// #[idempotent(window = "15m")]
/// #[tool(description = "Charge a card")]
/// async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Ask<Json<Receipt>>, ToolError> {
///     if args.amount_cents >= 100_000 {
///         match idem_runtime::mcp::current_continuation().and_then(|c| c.elicitation("confirm")) {
///             // First round: ask, before anything happens.
///             None => return Ok(Ask::elicit("confirm", "Charge this card?", confirm_schema())),
///             Some(answer) if accepted(&answer) => {}
///             // A decline is a rejection: nothing ran, the next call asks again.
///             Some(_) => return Err(ToolError::rejected("declined: nothing was charged")),
///         }
///     }
///     Ok(Ask::Done(Json(charge(&args).await?)))
/// }
/// ```
///
/// Return [`Ask::Input`] only before any effect: idem records nothing for
/// it and releases the claim, so the continuation can claim the operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Ask<T> {
    /// The tool ran: its result, recorded and replayed as any other.
    Done(T),
    /// Nothing ran: the client must answer these requests and call again.
    /// Its `requestState`, if any, is the handler's own; idem seals it and
    /// hands it back verified in [`Continuation::state`].
    Input(InputRequiredResult),
}

impl<T> Ask<T> {
    /// Asks the user through a form-mode elicitation: `message`, and a
    /// `schema` of the fields to fill in. The answer comes back under `key`
    /// ([`Continuation::elicitation`]).
    pub fn elicit(
        key: impl Into<String>,
        message: impl Into<String>,
        schema: ElicitationSchema,
    ) -> Self {
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: message.into(),
            requested_schema: schema,
        };
        let mut requests = InputRequests::new();
        requests.insert(
            key.into(),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        );
        Ask::Input(InputRequiredResult::new(Some(requests), None))
    }

    /// Asks with any input requests (elicitation, sampling, roots).
    pub fn input(requests: InputRequests) -> Self {
        Ask::Input(InputRequiredResult::new(Some(requests), None))
    }

    /// Carries the handler's own state to the continuation, sealed with
    /// the rest (read it back with [`Continuation::state`]). It is signed,
    /// not encrypted: put no secret in it.
    pub fn with_state(self, state: impl Into<String>) -> Self {
        match self {
            Ask::Input(mut input) => {
                input.request_state = Some(state.into());
                Ask::Input(input)
            }
            done => done,
        }
    }
}

/// The client's answers, inside the handler of a continuation: the same
/// call sent again with `inputResponses` and the `requestState` idem
/// issued, verified.
#[derive(Clone, Debug, Default)]
pub struct Continuation {
    responses: InputResponses,
    state: Option<String>,
}

impl Continuation {
    /// The client's response to the request asked under `key`, as sent.
    pub fn response(&self, key: &str) -> Option<&Value> {
        self.responses.get(key)
    }

    /// The response under `key` read as an elicitation result (its
    /// `action` and `content`); `None` when there is none or it is not one.
    pub fn elicitation(&self, key: &str) -> Option<ElicitResult> {
        serde_json::from_value(self.responses.get(key)?.clone()).ok()
    }

    /// Every response, by key.
    pub fn responses(&self) -> &InputResponses {
        &self.responses
    }

    /// The handler's own state given with [`Ask::with_state`], verified.
    pub fn state(&self) -> Option<&str> {
        self.state.as_deref()
    }
}

tokio::task_local! {
    static CURRENT_CONTINUATION: Option<Continuation>;
}

/// The client's answers, inside the body of an `#[idempotent]` tool that
/// returns [`Ask`], when the call is a continuation (it carries
/// `inputResponses` and a `requestState` idem issued for this caller, tool
/// and arguments); `None` on a first call and anywhere else. A task-local:
/// read it before spawning.
pub fn current_continuation() -> Option<Continuation> {
    CURRENT_CONTINUATION.try_with(Clone::clone).ok().flatten()
}

/// What idem seals into a `requestState`.
#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The handler's own state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<String>,
}

/// The codec of servers that name none: a key drawn once per process.
fn process_codec() -> &'static RequestStateCodec {
    static CODEC: OnceLock<RequestStateCodec> = OnceLock::new();
    CODEC.get_or_init(|| {
        let mut key = [0u8; 32];
        if getrandom::fill(&mut key).is_err() {
            // No OS randomness: a key no client can guess is still needed.
            for chunk in key.chunks_mut(8) {
                chunk.copy_from_slice(&crate::random::nonzero_u64().to_le_bytes());
            }
        }
        RequestStateCodec::try_new(key.to_vec()).expect("a 32-byte key")
    })
}

/// What a sealed state is bound to: this caller, this tool, these
/// arguments (canonical), each field length-prefixed. A state cannot be
/// carried to another caller, tool or call.
fn binding(caller: &Caller, tool: &str, args: &Value) -> Option<Vec<u8>> {
    let args = canonical_json(args).ok()?;
    let mut out = b"idem/request-state/v1".to_vec();
    for field in [caller.tenant(), caller.subject(), tool, args.as_str()] {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    Some(out)
}

/// How long a question stays answerable: as long as the continuation
/// still names the operation that asked. That is the window, a business
/// key's retention, or, for a call under a client key, the key's retention
/// ([`Executor::with_client_key_retention`], never less than the window):
/// a host that answers an hour later under the same key continues the
/// same operation.
fn state_ttl(
    executor: &Executor,
    spec: ToolSpec<'_>,
    request: &RequestContext<RoleServer>,
) -> Duration {
    // A key the call cannot use is refused by `call` before anything runs.
    let keyed =
        spec.client_key.is_some() && matches!(client_key::from_request(request), Ok(Some(_)));
    match executor.scope_of(spec.tool, spec.scope) {
        ScopeSpec::Window(window) if keyed => executor.client_key_retention().max(window),
        ScopeSpec::Window(window) => window,
        ScopeSpec::BusinessKey { retention, .. } => retention.unwrap_or(DEFAULT_RETENTION),
        ScopeSpec::ClientKey { window, .. } => executor.client_key_retention().max(window),
    }
}

/// A tool error that refuses the call before anything ran, with
/// `_meta["idem/operation"].state = "refused"`. Counted in the metrics as
/// refused, unless the executor has already counted the call (`counted`).
fn refusal(tool: &str, message: String, counted: bool) -> CallToolResult {
    if !counted {
        crate::telemetry::call(tool, AnswerState::Refused);
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(message)]);
    result.meta.get_or_insert_with(MetaObject::new).insert(
        RESULT_META_KEY.to_owned(),
        json!({ "reference": null, "state": AnswerState::Refused.as_str(), "replayed": false }),
    );
    result
}

/// Whether the request's protocol carries multi-round-trip requests.
fn modern(request: &RequestContext<RoleServer>) -> (bool, String) {
    let version = request.protocol_version();
    let modern = version
        .as_ref()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
    let name = version.map_or_else(|| "an unknown version".to_owned(), |v| v.to_string());
    (modern, name)
}

/// The body of a wrapped tool that returns [`Ask`]. A first call runs as
/// any wrapped call; if the handler asks, the claim is released (nothing
/// ran), nothing is recorded, and the answer is `input_required` with a
/// sealed `requestState`. A continuation whose `requestState` does not
/// open for this caller, tool and arguments is refused before anything
/// runs; one that opens runs as the operation, with its answers in
/// [`current_continuation`]. A client on a protocol before 2026-07-28,
/// which cannot answer, is refused when the handler asks.
#[allow(clippy::too_many_arguments)]
pub async fn call_asking<'k, S, P, F, Fut>(
    server: &S,
    request: RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    business_key: impl IntoIterator<Item = (&'k str, Result<Value, serde_json::Error>)>,
    RequestStateArg(state): RequestStateArg,
    InputResponsesArg(responses): InputResponsesArg,
    params: P,
    handler: F,
) -> Result<CallToolResponse, ErrorData>
where
    S: WrappedServer + ?Sized,
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = Result<Ask<CallToolResult>, HandlerFailure>>,
{
    let codec: &RequestStateCodec = match server.request_state_codec() {
        Some(codec) => codec,
        None => process_codec(),
    };
    let (modern, version) = modern(&request);
    let ttl = state_ttl(server.executor(), spec, &request);
    let (bound, continuation) = match continuation(server, &request, spec, &args, state, responses)
    {
        Ok(found) => found,
        Err(refused) => return Ok(CallToolResponse::Complete(refused)),
    };
    let asked: Mutex<Option<InputRequiredResult>> = Mutex::new(None);
    let asked_ref = &asked;
    let result = call(
        server,
        request,
        spec,
        args,
        business_key,
        params,
        move |params| async move {
            match CURRENT_CONTINUATION
                .scope(continuation, handler(params))
                .await?
            {
                Ask::Done(result) => Ok(result),
                Ask::Input(input) => {
                    if let Ok(mut slot) = asked_ref.lock() {
                        *slot = Some(input);
                    }
                    // Nothing ran: the claim is released, nothing recorded.
                    Err(HandlerFailure::tool(ToolError::rejected(
                        "the tool asked for input before its effect",
                    )))
                }
            }
        },
    )
    .await?;
    let asked = asked.into_inner().ok().flatten();
    let Some(mut input) = asked else {
        return Ok(CallToolResponse::Complete(result));
    };
    if !modern {
        return Ok(CallToolResponse::Complete(refusal(
            spec.tool,
            format!(
                "`{}` asks the user before it acts (a multi-round-trip request of protocol 2026-07-28), \
                 and this client speaks protocol {version}, which cannot answer. Nothing ran. Connect with \
                 protocol 2026-07-28 or later (`server/discover`) to answer the question and continue.",
                spec.tool
            ),
            // The executor counted the asking run as rejected.
            true,
        )));
    }
    let Some(bound) = bound else {
        // The handler ran, so `call` had a caller and the arguments.
        return Ok(CallToolResponse::Complete(result));
    };
    let sealed = codec
        .seal_json_with(
            &Sealed {
                state: input.request_state.take(),
            },
            &SealOptions::new().associated_data(&bound).ttl(ttl),
        )
        .map_err(|e| {
            ErrorData::internal_error(
                format!("the requestState could not be sealed ({e}); nothing ran, call again"),
                None,
            )
        })?;
    input.request_state = Some(sealed);
    input.meta.get_or_insert_with(MetaObject::new).insert(
        RESULT_META_KEY.to_owned(),
        json!({ "reference": null, "state": "input_required", "replayed": false }),
    );
    Ok(CallToolResponse::InputRequired(input))
}

/// The binding of this call's `requestState` (`None` when the call has
/// no caller or unwritable arguments: `call` refuses it before anything
/// runs) and its continuation, verified; or the answer that refuses it.
fn continuation<S: IdempotentServer + ?Sized>(
    server: &S,
    request: &RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: &Result<Value, serde_json::Error>,
    state: Option<String>,
    responses: Option<InputResponses>,
) -> Result<(Option<Vec<u8>>, Option<Continuation>), CallToolResult> {
    let codec: &RequestStateCodec = match server.request_state_codec() {
        Some(codec) => codec,
        None => process_codec(),
    };
    let bound = match (resolve_caller(server, request), args) {
        (Some(caller), Ok(args)) => binding(&caller, spec.tool, args),
        _ => None,
    };
    let again = text_call_again(spec.tool);
    let continuation = match (state, responses) {
        (None, None) => None,
        (None, Some(_)) => {
            let message = format!(
                "This call carries inputResponses but no requestState: `{}` did not ask for them, \
                 so nothing ran. {again}",
                spec.tool
            );
            return Err(refusal(spec.tool, message, false));
        }
        (Some(sealed), responses) => {
            let opened = bound
                .as_deref()
                .map(|bound| codec.open_json_with::<Sealed>(&sealed, bound));
            match opened {
                // Refused by `call` before anything runs.
                None => None,
                Some(Ok(opened)) => Some(Continuation {
                    responses: responses.unwrap_or_default(),
                    state: opened.state,
                }),
                Some(Err(error)) => {
                    tracing::warn!(tool = spec.tool, %error, "requestState refused");
                    return Err(refusal(
                        spec.tool,
                        format!(
                            "The requestState of this call was not issued by this server for this caller, \
                             tool and arguments, or it has expired ({error}), so nothing ran. {again}"
                        ),
                        false,
                    ));
                }
            }
        }
    };
    Ok((bound, continuation))
}

/// The body of a wrapped tool that returns [`Ask`] and has
/// `task = "optional"`. A request without the tasks extension is served by
/// [`call_asking`]. One that declares it is answered with a task, as any
/// task tool's, and a continuation (verified as by [`call_asking`]) runs as
/// a task with its answers. A task cannot carry the handler's question: if
/// the handler asks, nothing ran, the claim is released, and the task
/// fails with a message that says to call again without the extension,
/// where the question is asked.
#[allow(clippy::too_many_arguments)]
pub async fn call_task_asking<'k, S, P, F, Fut, G, Spawned>(
    server: &S,
    request: RequestContext<RoleServer>,
    spec: ToolSpec<'_>,
    args: Result<Value, serde_json::Error>,
    business_key: impl IntoIterator<Item = (&'k str, Result<Value, serde_json::Error>)>,
    state: RequestStateArg,
    responses: InputResponsesArg,
    params: P,
    inline: F,
    spawned: G,
) -> Result<CallToolResponse, ErrorData>
where
    S: WrappedServer + ?Sized,
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = Result<Ask<CallToolResult>, HandlerFailure>>,
    G: FnOnce(P) -> Spawned,
    Spawned: Future<Output = Result<Ask<CallToolResult>, HandlerFailure>> + Send + 'static,
{
    if !super::tasks::declared(&request) {
        return call_asking(
            server,
            request,
            spec,
            args,
            business_key,
            state,
            responses,
            params,
            inline,
        )
        .await;
    }
    let (_, continuation) = match continuation(server, &request, spec, &args, state.0, responses.0)
    {
        Ok(found) => found,
        Err(refused) => return Ok(CallToolResponse::Complete(refused)),
    };
    let tool = spec.tool.to_owned();
    super::call::call_task(
        server,
        request,
        spec,
        args,
        business_key,
        params,
        |_| async { unreachable_inline() },
        move |params| {
            let running = spawned(params);
            async move {
                match CURRENT_CONTINUATION.scope(continuation, running).await? {
                    Ask::Done(result) => Ok(result),
                    Ask::Input(_) => Err(HandlerFailure::tool(ToolError::rejected(format!(
                        "`{tool}` needs to ask the user before it acts, and a task cannot carry the \
                         question. Nothing ran. Call `{tool}` again without the tasks extension: the \
                         answer asks the question, and answering it continues the call."
                    )))),
                }
            }
        },
    )
    .await
}

/// `call_task` runs its inline body only for a request without the tasks
/// extension, which [`call_task_asking`] has already served.
fn unreachable_inline() -> Result<CallToolResult, HandlerFailure> {
    Err(HandlerFailure::tool(ToolError::rejected(
        "internal: an inline body was run for a task request; nothing ran, call again",
    )))
}

/// What to do after a refused continuation.
fn text_call_again(tool: &str) -> String {
    format!(
        "Call `{tool}` again with the same arguments and without inputResponses or requestState: \
         it asks again, and answering that continues the call."
    )
}

/// A `Result<Ask<V>, E>` body's outcome, spanned on the declared return type.
pub fn ask_outcome<V, E>(returned: Result<Ask<V>, E>) -> Result<Ask<CallToolResult>, HandlerFailure>
where
    V: IntoCallToolResult,
    E: Classify + fmt::Display,
{
    ask_output(returned.map_err(HandlerFailure::tool)?)
}

/// A plain `Ask<V>` body's output.
pub fn ask_output<V: IntoCallToolResult>(
    returned: Ask<V>,
) -> Result<Ask<CallToolResult>, HandlerFailure> {
    match returned {
        Ask::Done(value) => completed(value).map(Ask::Done),
        Ask::Input(input) => Ok(Ask::Input(input)),
    }
}
