//! Procedural macros for idem: [`macro@idempotent`] on rmcp tools and its
//! impl-level companion [`macro@tool_router`]. Depend on `idem-runtime`,
//! which re-exports them; the generated code names runtime items only through
//! `idem_runtime::__private`.
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod ast;
mod attr;
mod expand;
mod router;
mod valid;

use proc_macro::TokenStream;

/// Makes an rmcp tool safe to repeat: its side effect runs at most once per
/// operation, and its `tools/list` entry says so with `idempotentHint: true`.
///
/// Put it on the line **above** rmcp's `#[tool(...)]`, on an `async fn`
/// method with a `&self` receiver and, usually, a `Parameters<T>` argument,
/// in an impl block marked [`#[idem_runtime::tool_router]`](macro@tool_router)
/// (which adds the status tool to the router):
///
/// ```rust,ignore
/// use idem_runtime::{idempotent, Executor, IdempotentServer, ToolError};
/// use rmcp::handler::server::wrapper::{Json, Parameters};
/// use rmcp::tool;
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct ChargeArgs { order_id: String, amount_cents: u64 }
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct Receipt { charge_id: String }
///
/// struct Payments { executor: Executor }
///
/// impl IdempotentServer for Payments {
///     fn executor(&self) -> &Executor { &self.executor }
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
///         // The processor gets the operation's reference as its own
///         // idempotency key, so the guarantee reaches across the boundary.
///         let reference = idem_runtime::current_reference().expect("inside #[idempotent]");
///         let charge_id = charge(&args, &reference.to_string()).await?;
///         Ok(Json(Receipt { charge_id }))
///     }
/// }
/// ```
///
/// The parameter type must implement `Serialize` as well as `Deserialize`:
/// the operation is keyed on the arguments *after* deserialization, written
/// back as canonical JSON, so two encodings of one call are one operation.
/// The server type implements `idem_runtime::IdempotentServer`, which hands
/// the wrapper its executor (store, lease, retention) and, for a single-user
/// server, a default caller. Nothing is global.
///
/// # Options
///
/// Each option is given at most once. A scope (`window` or `business_key`)
/// is required, unless the tool is idempotent by construction
/// (`by_construction`, below).
///
/// ## `window = "15m"`
///
/// The operation is this caller, this tool and these arguments. A repeat
/// within the window of the first call is the same operation (a sliding
/// window, not a clock bucket); after it, the same call runs again. A
/// duration is one or more `<number><unit>` parts, largest unit first, with
/// units `s`, `m`, `h` and `d`: `"90s"`, `"15m"`, `"48h"`, `"7d"`, `"1h30m"`.
/// It is parsed at compile time; `"15x"`, `"0m"` and `""` are errors on the
/// string.
///
/// ```rust,ignore
/// #[idempotent(window = "1h30m")]
/// #[tool(description = "Send an invoice")]
/// async fn send_invoice(&self, Parameters(args): Parameters<InvoiceArgs>) -> Result<String, ToolError> { .. }
/// ```
///
/// ## `business_key = "order_id"` or `business_key = ["tenant_ref", "order_id"]`
///
/// The operation is the business key's value within the caller's tenant,
/// whoever in the tenant asks and whatever the other arguments are: one
/// shipment per order. The same key with *other* arguments is a conflict,
/// answered as such and never executed. Each name is the Rust name of a
/// field of the parameter type, or a path into one (`"customer.id"`),
/// checked at compile time: a name the type lacks is an error on the
/// string, and so is a field of type `Option<_>` (a business key always has
/// a value; make it a `String`, not an `Option<String>`). The value is read
/// from the typed field itself, so serde's renames (`#[serde(rename)]`,
/// `rename_all`) change nothing. A call whose key is empty (`""`, `[]`, `{}`)
/// is refused and nothing runs.
///
/// One field is keyed by its value; several by an object of them under
/// their names as written here (`{"warehouse": .., "customer.id": ..}`).
/// With several fields the operation is the *combination*: with
/// `business_key = ["charge_id", "refund_no"]`, a refund is one operation
/// per charge and refund number, and the same pair with another amount is a
/// conflict. Every field must have a value. The names are part of the key:
/// renaming one here (not in serde) makes new operations of keys already
/// recorded.
///
/// With a business key, `window` sets how long the record is kept. Without
/// it the record is kept for the executor's retention: 48 h
/// (`idem_runtime::executor::DEFAULT_RETENTION`) unless the server's executor was built
/// `with_retention(..)`. The tool's `_meta` shows `window`, or 48 h: it is
/// written at compile time and does not see `with_retention`.
///
/// ```rust,ignore
/// #[idempotent(business_key = "order_id", window = "48h")]
/// #[tool(description = "Create a shipment")]
/// async fn create_shipment(&self, Parameters(args): Parameters<ShipmentArgs>) -> Result<Json<Shipment>, ToolError> { .. }
///
/// #[idempotent(business_key = ["warehouse", "customer.id"])]
/// #[tool(description = "Reserve stock")]
/// async fn reserve_stock(&self, Parameters(args): Parameters<ReserveArgs>) -> Result<Json<Reservation>, ToolError> { .. }
/// ```
///
/// ## Tools without arguments
///
/// A tool with a side effect and no arguments is keyed on the caller and
/// the tool (its arguments are `{}`): with `window`, one run per caller per
/// window. `business_key` on such a tool is an error: there is no field.
///
/// ```rust,ignore
/// #[idempotent(window = "15m")]
/// #[tool(description = "Rotate the API key")]
/// async fn rotate_api_key(&self) -> Result<Json<ApiKey>, ToolError> { .. }
/// ```
///
/// ## `status_tool = "get_operation_status"`
///
/// The tool that in-flight and outcome-unknown answers tell the model to call
/// with the reference. Defaults to `get_operation_status`.
/// [`#[idem_runtime::tool_router]`](macro@tool_router) adds a status tool of
/// that name to the router it generates; `idem_runtime::audit_hints`
/// reports a wrapped tool whose status tool a router lacks.
///
/// ```rust,ignore
/// #[idempotent(window = "15m", status_tool = "payment_status")]
/// #[tool(description = "Refund a charge")]
/// async fn refund(&self, Parameters(args): Parameters<RefundArgs>) -> Result<Json<Refund>, ToolError> { .. }
/// ```
///
/// ## `task = "optional"` (or `task = "never"`, the default)
///
/// Lets a call be answered with an MCP task (the extension
/// `io.modelcontextprotocol/tasks`, protocol 2026-07-28) instead of waiting
/// for the handler, when the request asks for one; a request that does not
/// gets exactly what it gets without this option (the result inline,
/// `in_progress` answers and the status tool). `task = "required"` is not
/// offered: idem can always answer inline, so refusing a client without the
/// extension would only make its call fail.
///
/// - **The client declares the extension** in each request's `_meta`, under
///   protocol 2026-07-28 or later (an earlier protocol is served as if it
///   declared nothing):
///   `"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
///   "io.modelcontextprotocol/clientCapabilities": {"extensions":
///   {"io.modelcontextprotocol/tasks": {}}}}`. rmcp's client does this with
///   `ClientCapabilities::builder().enable_tasks()` and the lifecycle
///   `ClientLifecycleMode::Discover { preferred_versions:
///   vec![ProtocolVersion::V_2026_07_28] }`.
/// - **The answer**, once the claim is stored (so `tasks/get` already finds
///   it): `resultType: "task"`, `taskId` (the operation's reference,
///   `idem_…`), `status: "working"`, `ttlMs` (the window; 48 h once the
///   outcome is unknown) and `pollIntervalMs` (a tenth of the lease, 100 ms
///   to 5 s). A repeat of the call gets the same task while it runs, and
///   the stored result once it completed; nothing runs twice.
/// - **`tasks/get`** with the `taskId`, on any replica sharing the store:
///   `status: "working"` while the handler runs (and, with a message saying
///   so, while an unknown outcome is reconciled); `"completed"` with the
///   tool result inline in the field **`result`** (the whole
///   `CallToolResult`: `content`, `structuredContent`, `isError`, and
///   `_meta["idem/operation"]`); `"failed"` with a JSON-RPC error object in
///   the field `error` when the handler rejected the call or the operation
///   was resolved as not performed. Another tenant's task id is not found.
/// - **`tasks/cancel`** is acknowledged and signals the handler, if it runs
///   in this process: `idem_runtime::mcp::current_cancellation()` is `Some` inside
///   a handler running as a task. The record is never deleted; the task ends
///   with what the handler really did.
///
/// The server type must be `Clone` (the handler runs on after the answer,
/// on a clone of the server), advertise the extension
/// (`ServerCapabilities::builder().enable_tools().enable_tasks()` in
/// `get_info`) and answer `tasks/get` and `tasks/cancel` with
/// `idem_runtime::mcp::tasks::get_task` and `idem_runtime::mcp::tasks::cancel_task`
/// in its `ServerHandler` (the module `idem_runtime::mcp::tasks` shows the impl).
///
/// ```rust,ignore
/// #[idempotent(window = "24h", task = "optional")]
/// #[tool(description = "Export the account's history as CSV (minutes)")]
/// async fn export_history(&self, Parameters(args): Parameters<ExportArgs>) -> Result<Json<Export>, ToolError> {
///     let cancel = idem_runtime::mcp::current_cancellation(); // Some(..) when run as a task
///     ..
/// }
/// ```
///
/// ## `by_construction = "sets the status to the given value; a repeat writes the same value"`
///
/// For a tool whose own code makes a repeat harmless: it sets a value,
/// deletes by id, or only reads (and the host should still retry it). The
/// tool keeps `idempotentHint: true`, and idem neither claims nor records
/// its calls: the method is left exactly as written, and no store is called.
/// The reason is required and must say, in words, which lines of the
/// handler make a repeat harmless; it appears in the tool's
/// `_meta["idem/idempotent"]` as `{"byConstruction": "<reason>"}`, and in
/// `idem_runtime::mcp::hint_report` (and the log of `audit_hints`), so that a
/// reviewer can hold it against the code. The review question for any hint
/// is which lines of the handler make it true.
///
/// It stands alone: `window`, `business_key`, `client_key`, `status_tool`
/// and `task` are options of a recorded tool, and each is an error beside
/// it. `by_construction` without a reason, or with an empty one, is an error
/// too.
///
/// ```rust,ignore
/// #[idempotent(by_construction = "sets the status to the given value; a repeat writes the same value")]
/// #[tool(description = "Set an order's status")]
/// async fn set_status(&self, Parameters(args): Parameters<StatusArgs>) -> Result<String, ToolError> { .. }
/// ```
///
/// ## `client_key = "optional"` (or `client_key = "required"`)
///
/// Lets the host say which calls are one operation, with a key it sends
/// outside the arguments: `params._meta["idem/idempotency-key"]` on
/// `tools/call`, or, over streamable HTTP, the `Idempotency-Key` request
/// header (both present and different: refused). A valid key is 1 to 255
/// visible ASCII characters (0x21 to 0x7E); anything else is refused, and
/// nothing runs. The model never fills it in: it is not in the input schema.
/// Needs a `window` (what decides for calls without a key); a business key
/// already names its operation, so the two do not combine.
///
/// Per caller (tenant and subject):
/// - the same key with the same arguments is one operation for the key's
///   retention (24 h by default, `Executor::with_client_key_retention`;
///   never less than the window): a repeat is told "in progress" or gets
///   the stored result, even after the window;
/// - the same key with other arguments is a conflict: nothing runs, and the
///   first operation is untouched;
/// - another key is another operation, even with the same arguments inside
///   the window, and even while the first is still running. Such a call is
///   counted (`idem_client_key_new_key_repeats_total`) and logged: a host
///   that sends a fresh key per retry runs every retry;
/// - no key: the window decides, as without this option (`"required"`
///   refuses the call instead).
///
/// The tool's listing shows `"clientKey": "optional"` (or `"required"`) in
/// `_meta["idem/idempotent"]`, and every answer says what identified the
/// operation in `_meta["idem/operation"].keyedBy`: `"clientKey"`,
/// `"businessKey"` or `"arguments"`.
///
/// ```rust,ignore
/// #[idempotent(window = "15m", client_key = "optional")]
/// #[tool(description = "Charge a card")]
/// async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> { .. }
/// ```
///
/// ## `crate = "path"`
///
/// The path idem-runtime is reachable at, when it is renamed or re-exported:
///
/// ```rust,ignore
/// use my_platform::idem as idem;
///
/// #[idem::idempotent(window = "15m", crate = "my_platform::idem")]
/// #[tool(description = "Charge a card")]
/// async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> { .. }
/// ```
///
/// # Return types
///
/// `Result<Json<T>, E>`, `Result<CallToolResult, E>`, `Result<String, E>`,
/// any other rmcp tool output in `Result<_, E>`, or a plain output such as
/// `CallToolResult`. The error type implements `idem_runtime::Classify`
/// (`ToolError` does): a *rejected* error releases the claim so a corrected
/// call can run; anything else leaves the outcome *unknown*, and repeats are
/// told to check the status tool instead of running again. A plain return
/// type is always recorded and replayed.
///
/// `Result<Ask<T>, E>` (or `Ask<T>`) for a tool that may ask the user
/// before its effect (a multi-round-trip request, protocol 2026-07-28):
/// `Ask::Done(value)` is recorded as any value; `Ask::Input(..)` (built with
/// `Ask::elicit` or `Ask::input`) releases the claim and records nothing,
/// and idem answers `input_required` with a sealed `requestState`. The
/// continuation, the same call with the answers, is the same operation: its
/// handler finds them in `idem_runtime::mcp::current_continuation()`. The macro
/// recognises `Ask` by name (an alias of it does not compile: `Ask` is not a
/// tool output), and the method then also takes rmcp's `RequestState` and
/// `InputResponses` and returns rmcp's `CallToolResponse`. With `task =
/// "optional"`, a task whose handler asks fails (nothing ran) with a message
/// to call again without the tasks extension.
///
/// The output schema of a `Json<T>` tool is kept. A repeat of a completed
/// operation returns the stored result of the first call, identical, with
/// `_meta["idem/operation"].replayed = true`. Answers that carry no value
/// (in progress, outcome unknown, conflict, no caller, store unavailable) are
/// tool errors (`isError: true`) whose text tells the model what to do and
/// whose `_meta["idem/operation"]` has the reference, the state, the status
/// tool and, when in progress, `retryAfterSeconds`.
///
/// # The caller
///
/// The operation belongs to the caller, taken from the request, never from
/// the arguments: an `idem_runtime::Caller` in the request context's
/// extensions, or in the extensions of the `http::request::Parts` that an
/// auth layer filled in; otherwise `IdempotentServer::default_caller`;
/// otherwise the call is refused and nothing runs.
///
/// # The reference
///
/// Inside the body, `idem_runtime::current_reference()` returns the
/// operation's reference (`idem_` and 32 hex digits). Pass it to the
/// processor as its idempotency key. It is a task-local: a task the body
/// spawns does not see it, so read it first and move it in.
///
/// # What this expands to
///
/// Roughly (paths through `idem_runtime::__private` shortened):
///
/// ```rust,ignore
/// #[tool(
///     description = "Charge a card",
///     annotations(idempotent_hint = true),
///     meta = tool_meta(None, ScopeSpec::Window(Duration::from_secs(900)), "get_operation_status"),
///     output_schema = schema_for_output::<Receipt>(),
/// )]
/// async fn charge_card(
///     &self,
///     __idem_params: Parameters<ChargeArgs>,
///     __idem_request: RequestContext<RoleServer>,
/// ) -> Result<CallToolResult, ErrorData> {
///     call(
///         self,
///         __idem_request,
///         ToolSpec {
///             tool: "charge_card",
///             scope: ScopeSpec::Window(Duration::from_secs(900)),
///             status_tool: "get_operation_status",
///         },
///         arguments(&__idem_params), // the arguments as JSON; needs `ChargeArgs: Serialize`
///         [], // a business key's (field, value) pairs, see below
///         __idem_params,
///         move |__idem_params: Parameters<ChargeArgs>| async move {
///             let __idem_returned = async move {
///                 let Parameters(args): Parameters<ChargeArgs> = __idem_params;
///                 /* the body as written, typed as Result<Json<Receipt>, ToolError> */
///             }
///             .await;
///             outcome(__idem_returned) // Ok: the tool result to record; Err: rejected or unknown
///         },
///     )
///     .await
/// }
/// ```
///
/// `call` finds the caller and hands the operation to the server's executor,
/// which claims it in the store before the body runs, runs the body at most
/// once (with [`current_reference`](#the-reference) set), records its result,
/// and answers repeats from the record; the answer becomes the tool result.
/// `tool_meta` adds `"idem/idempotent"` (the scope and the status tool) to
/// the tool's `_meta`: the mark of a wrapper that `audit_hints` looks for.
///
/// With `business_key = "order_id"`, the fields are read before the handler
/// takes the parameters, each spanned on its string (so a field the type
/// lacks, or an `Option` one, is an error there), and handed to `call`:
///
/// ```rust,ignore
/// let __idem_business_key = [(
///     "order_id",
///     // `OptionalKeyField` for an `Option` field (a compile error), else
///     // the field serialized on its own.
///     (&&KeyField(&__idem_params.0.order_id)).business_key_value(),
/// )];
/// call(self, __idem_request, spec, arguments(&__idem_params), __idem_business_key, __idem_params, ..)
/// ```
///
/// A tool without arguments is given `()` and `no_arguments()` (`{}`) instead.
///
/// # Why the hint cannot be set by hand
///
/// MCP clients read `idempotentHint: true` as "repeating this call is safe"
/// and retry on it. Written by hand, the flag is a promise no code keeps: a
/// retried charge is a second charge. So the hint comes from this wrapper
/// and from nothing else. With [`macro@tool_router`] on the impl,
/// `annotations(idempotent_hint = true)` on a tool this attribute does not
/// wrap is a compile error pointing at the hint, and so is
/// `idempotent_hint = false` on one it does. Hints set through rmcp's
/// builder API are out of the macros' sight: `idem_runtime::audit_hints`
/// checks a finished router at start-up.
///
/// # Errors
///
/// Every mistake the macro can see is a compile error on the offending token
/// saying what to write instead, and the method is still emitted as written
/// so the rest of the crate keeps compiling.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// Marks the impl block of an rmcp server's tools, in place of rmcp's
/// `#[tool_router]` (which it adds): it generates the router fn, **with the
/// status tool** the [`#[idempotent]`](macro@idempotent) tools name, and
/// refuses at compile time an `idempotentHint` that no wrapper backs.
///
/// ```rust,ignore
/// #[idem_runtime::tool_router(server_handler)]
/// impl Payments {
///     #[idempotent(window = "15m")]
///     #[tool(description = "Charge a card")]
///     async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> { .. }
///
///     #[tool(description = "List charges", annotations(read_only_hint = true))]
///     async fn list_charges(&self) -> Result<Json<Charges>, ToolError> { .. }
/// }
///
/// // Serves charge_card, list_charges and get_operation_status; the router
/// // checked at start-up is the router served.
/// idem_runtime::audit_hints(&Payments::tool_router())?;
/// ```
///
/// # The status tool
///
/// In-flight and outcome-unknown answers tell the model to call a status
/// tool with the operation's reference. `Self::tool_router()` has it: one
/// `idem_runtime::mcp::status_tool::<Self>(name)` per name the wrapped tools give
/// (`get_operation_status` unless `#[idempotent(status_tool = "..")]` says
/// otherwise), unless the impl has a tool of that name itself. The server
/// type implements `idem_runtime::IdempotentServer` (and is `Send + Sync +
/// 'static`); the status tool answers from its executor's store, within the
/// caller's tenant. An impl without `#[idempotent]` tools gets no status tool.
///
/// # Options
///
/// rmcp's, handed on to it:
///
/// - `router = my_router`: the router fn's name (default `tool_router`);
/// - `vis = "pub(crate)"`: its visibility;
/// - `server_handler`: also write `impl ServerHandler for Self` serving that
///   router, so no `#[tool_handler]` impl is needed. The router is built on
///   the first request and kept (rmcp's own `server_handler` builds it again
///   for every call, about a third of a bare call's cost); for a generic
///   server type, which a static cannot name, it is built for every call;
/// - `allow_empty`: an impl with no `#[tool]` is not an error.
///
/// And its own:
///
/// - `status_tool = false`: add no status tool, for a server that brings its
///   own (add it to the router before `audit_hints` checks it);
/// - `crate = "path"`: where idem-runtime is, when renamed (by default the
///   path a tool's `#[idempotent(crate = ..)]` gives, else `::idem_runtime`).
///
/// ```rust,ignore
/// #[idem_runtime::tool_router(router = payments_router, vis = "pub(crate)", status_tool = false)]
/// impl Payments { .. }
/// ```
///
/// It may also sit on the line above rmcp's own `#[tool_router(...)]`, whose
/// options it then takes over; below it, rmcp would already have written
/// the router, and that is a compile error.
///
/// # What it refuses
///
/// It sees every method before anything expands, so it refuses:
///
/// - `annotations(idempotent_hint = true)` on a `#[tool]` that
///   `#[idempotent]` does not wrap (error on the hint);
/// - `#[idempotent]` written below `#[tool]` (error on `#[idempotent]`).
///
/// # What this expands to
///
/// With wrapped tools, rmcp writes the router fn under a private name and a
/// fn of the name asked for adds the status tools:
///
/// ```rust,ignore
/// #[rmcp::tool_router(router = __idem_tool_router_routes)]
/// impl Payments {
///     /* the tools */
///     fn tool_router() -> ToolRouter<Self> {
///         idem_runtime::__private::with_status_tools::<Self>(
///             Self::__idem_tool_router_routes(),
///             &["get_operation_status"],
///         )
///     }
/// }
/// // With `server_handler`: the router, built once.
/// impl Payments {
///     fn __idem_tool_router_served() -> &'static ToolRouter<Self> {
///         static ROUTER: OnceLock<ToolRouter<Payments>> = OnceLock::new();
///         ROUTER.get_or_init(Self::tool_router)
///     }
/// }
/// #[rmcp::tool_handler(router = Self::__idem_tool_router_served())]
/// impl rmcp::ServerHandler for Payments {}
/// ```
#[proc_macro_attribute]
pub fn tool_router(args: TokenStream, item: TokenStream) -> TokenStream {
    router::tool_router(args.into(), item.into()).into()
}
