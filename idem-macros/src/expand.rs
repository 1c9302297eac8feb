//! Code generation for `#[idempotent]`: the rewritten `#[tool(...)]` and the
//! body that claims, executes and records through the executor.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{parse_quote, Ident, ImplItemFn, LitStr, Meta, Token};

use crate::ast::Tool;
use crate::attr::{Args, ClientKey, Scope, Window};
use crate::valid;

/// The item as written plus the error: the rest of the crate keeps compiling.
pub(crate) fn with_error(mut item: TokenStream, error: syn::Error) -> TokenStream {
    item.extend(error.into_compile_error());
    item
}

/// `#[idempotent(args)] item`.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let args: Args = match syn::parse2(args) {
        Ok(args) => args,
        Err(error) => return with_error(item, error),
    };
    let method: ImplItemFn = match syn::parse2(item.clone()) {
        Ok(method) => method,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` goes on an `async fn` tool method, above its `#[tool(...)]`",
            );
            return with_error(item, error);
        }
    };
    let tool = match Tool::from_syn(args, method) {
        Ok(tool) => tool,
        Err(error) => return with_error(item, error),
    };
    match valid::check(&tool) {
        Ok(()) => expand(tool),
        Err(error) => with_error(item, error),
    }
}

/// A name for generated code that user code cannot see or shadow.
fn private_ident(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn expand(tool: Tool) -> TokenStream {
    if let Scope::ByConstruction(reason) = &tool.scope {
        let reason = reason.clone();
        return by_construction(tool, &reason);
    }
    let krate = &tool.krate;
    let private = quote!(#krate::__private);
    let tool_name = tool
        .tool_args
        .name()
        .map_or_else(|| tool.method.sig.ident.to_string(), |name| name.value());
    let status_tool = &tool.status_tool;
    let scope = scope(&tool.scope, &private);
    let client_key = client_key_mode(tool.client_key, &private);

    let tool_attr = tool_attribute(&tool, &private, &scope);
    let mut method = tool.method;
    method.attrs[tool.tool_index] = tool_attr;

    // The signature: `Parameters(args): Parameters<T>` becomes a plain binding
    // (destructured again inside the handler), the request context is added
    // for the caller, and the result is always a `CallToolResult`.
    let params_ident = private_ident("__idem_params");
    let request_ident = private_ident("__idem_request");
    method.sig.inputs.push(parse_quote!(
        #request_ident: #private::RequestContext<#private::RoleServer>
    ));
    method.sig.output = parse_quote!(
        -> ::core::result::Result<#private::CallToolResult, #private::ErrorData>
    );

    // What the handler is given, how the arguments are written as JSON (a
    // call spanned on the parameter type, so a type that is not `Serialize`
    // is reported there), and how the body gets its parameters back.
    let (params, params_ty, arguments, unpack) = match &tool.params {
        Some(params) => {
            let params_ty = &params.arg.ty;
            let params_pat = &params.arg.pat;
            method.sig.inputs[params.index] = parse_quote!(#params_ident: #params_ty);
            (
                params_ident.to_token_stream(),
                params_ty.to_token_stream(),
                located_at(
                    quote!(#private::arguments(&#params_ident)),
                    params_ty.span(),
                ),
                quote!(let #params_pat: #params_ty = #params_ident;),
            )
        }
        // No arguments: the operation is the caller and the tool.
        None => (
            quote!(()),
            quote!(()),
            quote!(#private::no_arguments()),
            quote!(let () = #params_ident;),
        ),
    };

    let ret = &tool.returns.ty;
    // Spanned on the declared return type, so an error type that is not
    // `Classify` is reported once, there.
    let returned = private_ident("__idem_returned");
    let finish = match (tool.returns.asks, tool.returns.fallible) {
        (false, true) => located_at(quote!(#private::outcome(#returned)), ret.span()),
        (false, false) => located_at(quote!(#private::output(#returned)), ret.span()),
        (true, true) => located_at(quote!(#private::ask_outcome(#returned)), ret.span()),
        (true, false) => located_at(quote!(#private::ask_output(#returned)), ret.span()),
    };
    // A business key is read from the typed fields (so serde's renames do
    // not hide it), before the handler takes the parameters.
    let business_key = private_ident("__idem_business_key");
    let take_business_key = match &tool.scope {
        Scope::BusinessKey { fields, .. } => {
            let values = business_key_values(fields, &params_ident, &private);
            quote!(let #business_key = #values;)
        }
        Scope::Window(_) | Scope::ByConstruction(_) => quote!(let #business_key = [];),
    };
    let typed = typed_body(
        &unpack,
        ret.to_token_stream(),
        &method.block,
        &returned,
        &finish,
    );

    if tool.task {
        return expand_task(
            method,
            TaskParts {
                private: &private,
                tool_name: &tool_name,
                scope: &scope,
                status_tool,
                client_key: &client_key,
                take_business_key,
                arguments,
                business_key,
                params_ident,
                params_value: params,
                request_ident,
                params_ty,
                typed,
                asks: tool.returns.asks,
            },
        );
    }

    if tool.returns.asks {
        return expand_asking(
            method,
            AskingParts {
                private: &private,
                tool_name: &tool_name,
                scope: &scope,
                status_tool,
                client_key: &client_key,
                take_business_key,
                arguments,
                business_key,
                params_ident,
                params_value: params,
                request_ident,
                params_ty,
                typed,
                asks: true,
            },
        );
    }

    method.block = parse_quote!({
        #take_business_key
        #private::call(
            self,
            #request_ident,
            #private::ToolSpec {
                tool: #tool_name,
                scope: #scope,
                status_tool: #status_tool,
                client_key: #client_key,
            },
            #arguments,
            #business_key,
            #params,
            move |#params_ident: #params_ty| async move { #typed },
        )
        .await
    });
    method.into_token_stream()
}

/// The user's body, run and turned into the tool's outcome. The declared
/// return type types the body through a return that never runs, so a wrong
/// value is reported at the user's line (tracing-attributes' trick). Written
/// once for the tool run inline and for a task's body method.
fn typed_body(
    unpack: &TokenStream,
    ret: TokenStream,
    block: &syn::Block,
    returned: &Ident,
    finish: &TokenStream,
) -> TokenStream {
    let fake_return = private_ident("__idem_fake_return");
    quote! {
        let #returned = async move {
            #unpack
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::let_with_type_underscore,
                clippy::needless_return,
                clippy::unreachable
            )]
            if false {
                let #fake_return: #ret = loop {};
                return #fake_return;
            }
            #block
        }
        .await;
        #finish
    }
}

/// What the expansion of a tool that asks takes over from [`expand`]: the
/// same parts as a task's.
type AskingParts<'a> = TaskParts<'a>;

/// A tool whose handler returns `Ask<..>`: the method also takes rmcp's
/// `RequestState` and `InputResponses` extractors, hands them to
/// `call_asking`, and returns rmcp's `CallToolResponse` (a result, or
/// `input_required`).
fn expand_asking(mut method: ImplItemFn, parts: AskingParts<'_>) -> TokenStream {
    let TaskParts {
        private,
        tool_name,
        scope,
        status_tool,
        client_key,
        take_business_key,
        arguments,
        business_key,
        params_ident,
        params_value,
        request_ident,
        params_ty,
        typed,
        asks: _,
    } = parts;
    let state_ident = private_ident("__idem_request_state");
    let responses_ident = private_ident("__idem_input_responses");
    method
        .sig
        .inputs
        .push(parse_quote!(#state_ident: #private::RequestStateArg));
    method
        .sig
        .inputs
        .push(parse_quote!(#responses_ident: #private::InputResponsesArg));
    method.sig.output = parse_quote!(
        -> ::core::result::Result<#private::CallToolResponse, #private::ErrorData>
    );
    method.block = parse_quote!({
        #take_business_key
        #private::call_asking(
            self,
            #request_ident,
            #private::ToolSpec {
                tool: #tool_name,
                scope: #scope,
                status_tool: #status_tool,
                client_key: #client_key,
            },
            #arguments,
            #business_key,
            #state_ident,
            #responses_ident,
            #params_value,
            move |#params_ident: #params_ty| async move { #typed },
        )
        .await
    });
    method.into_token_stream()
}

/// What the task expansion takes over from [`expand`].
struct TaskParts<'a> {
    private: &'a TokenStream,
    tool_name: &'a str,
    scope: &'a TokenStream,
    status_tool: &'a str,
    client_key: &'a TokenStream,
    take_business_key: TokenStream,
    arguments: TokenStream,
    business_key: Ident,
    params_ident: Ident,
    /// What the tool passes as its parameters: `__idem_params`, or `()`.
    params_value: TokenStream,
    request_ident: Ident,
    params_ty: TokenStream,
    /// The body as [`typed_body`] writes it.
    typed: TokenStream,
    /// The body returns `Ask<..>`: it may ask before its effect.
    asks: bool,
}

/// A tool with `task = "optional"`: the body moves to a hidden method of
/// its own, so that a call answered with a task can run it on an owned
/// clone of the server after the answer has gone out; the tool method
/// returns rmcp's `CallToolResponse` (a result, or a task).
fn expand_task(mut method: ImplItemFn, parts: TaskParts<'_>) -> TokenStream {
    let TaskParts {
        private,
        tool_name,
        scope,
        status_tool,
        client_key,
        take_business_key,
        arguments,
        business_key,
        params_ident,
        params_value,
        request_ident,
        params_ty,
        typed,
        asks,
    } = parts;
    let body_ident = Ident::new(
        &format!("__idem_task_body_{}", method.sig.ident),
        method.sig.ident.span(),
    );
    // The tool's other arguments (a `RequestContext`, an `Extension<T>`)
    // travel with the parameters: each is bound to a plain name in the tool
    // method and destructured again, as written, in the body method.
    let mut extra_names: Vec<Ident> = Vec::new();
    let mut extra_args: Vec<syn::PatType> = Vec::new();
    for input in method.sig.inputs.iter_mut() {
        let syn::FnArg::Typed(typed) = input else {
            continue;
        };
        let ours = matches!(
            &*typed.pat,
            syn::Pat::Ident(p) if p.ident == params_ident || p.ident == request_ident
        );
        if ours {
            continue;
        }
        let name = private_ident(&format!("__idem_arg_{}", extra_names.len()));
        extra_args.push(typed.clone());
        *typed.pat = parse_quote!(#name);
        extra_names.push(name);
    }
    // A body that may ask returns `Ask<CallToolResult>`, and the tool
    // method takes the continuation's `requestState` and `inputResponses`.
    let body_output = if asks {
        quote!(#private::Ask<#private::CallToolResult>)
    } else {
        quote!(#private::CallToolResult)
    };
    let body: ImplItemFn = parse_quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        async fn #body_ident(
            &self,
            #params_ident: #params_ty,
            #(#extra_args),*
        ) -> ::core::result::Result<#body_output, #private::HandlerFailure> {
            #typed
        }
    };
    let state_ident = private_ident("__idem_request_state");
    let responses_ident = private_ident("__idem_input_responses");
    let (runner, continuation) = if asks {
        method
            .sig
            .inputs
            .push(parse_quote!(#state_ident: #private::RequestStateArg));
        method
            .sig
            .inputs
            .push(parse_quote!(#responses_ident: #private::InputResponsesArg));
        (
            quote!(#private::call_task_asking),
            quote!(#state_ident, #responses_ident,),
        )
    } else {
        (quote!(#private::call_task), TokenStream::new())
    };
    method.sig.output = parse_quote!(
        -> ::core::result::Result<#private::CallToolResponse, #private::ErrorData>
    );
    let owned = private_ident("__idem_owned");
    let server_clone = located_at(
        quote!(#private::owned_server(self)),
        method.sig.ident.span(),
    );
    method.block = parse_quote!({
        #take_business_key
        #runner(
            self,
            #request_ident,
            #private::ToolSpec {
                tool: #tool_name,
                scope: #scope,
                status_tool: #status_tool,
                client_key: #client_key,
            },
            #arguments,
            #business_key,
            #continuation
            (#params_value, #(#extra_names),*),
            move |(#params_ident, #(#extra_names),*)| self.#body_ident(#params_ident, #(#extra_names),*),
            move |(#params_ident, #(#extra_names),*)| {
                let #owned = #server_clone;
                async move { #owned.#body_ident(#params_ident, #(#extra_names),*).await }
            },
        )
        .await
    });
    let mut out = method.into_token_stream();
    out.extend(body.into_token_stream());
    out
}

/// A tool idempotent by construction: the method is kept as written (no
/// claim, no store call), and its `#[tool(...)]` gets `idempotent_hint =
/// true` and, in its `_meta`, the reason, for `audit_hints` and reviewers.
fn by_construction(tool: Tool, reason: &LitStr) -> TokenStream {
    let private = {
        let krate = &tool.krate;
        quote!(#krate::__private)
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut has_annotations = false;
    let mut has_meta = false;
    for meta in &tool.tool_args.items {
        match meta {
            Meta::List(list) if list.path.is_ident("annotations") => {
                has_annotations = true;
                items.push(with_hint(list));
            }
            Meta::NameValue(nv) if nv.path.is_ident("meta") => {
                has_meta = true;
                let user = &nv.value;
                items.push(quote! {
                    meta = #private::construction_tool_meta(::core::option::Option::Some(#user), #reason)
                });
            }
            other => items.push(other.to_token_stream()),
        }
    }
    if !has_annotations {
        items.push(quote!(annotations(idempotent_hint = true)));
    }
    if !has_meta {
        items.push(quote! {
            meta = #private::construction_tool_meta(::core::option::Option::None, #reason)
        });
    }
    let mut method = tool.method;
    let path = method.attrs[tool.tool_index].path().clone();
    method.attrs[tool.tool_index] = parse_quote!(#[#path(#(#items),*)]);
    method.into_token_stream()
}

/// `annotations(...)` with `idempotent_hint = true` added, unless written.
fn with_hint(list: &syn::MetaList) -> TokenStream {
    let mut annotations: Punctuated<Meta, Token![,]> = list
        .parse_args_with(Punctuated::parse_terminated)
        .unwrap_or_default();
    if !annotations
        .iter()
        .any(|m| m.path().is_ident("idempotent_hint"))
    {
        annotations.push(parse_quote!(idempotent_hint = true));
    }
    let path = &list.path;
    quote!(#path(#annotations))
}

/// The same tokens, reported at `span` but resolved as before: what a
/// failed bound inside them says lands on the user's type.
pub(crate) fn located_at(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut relocated = Group::new(group.delimiter(), located_at(group.stream(), span));
                relocated.set_span(group.span().located_at(span));
                token = TokenTree::Group(relocated);
            } else {
                token.set_span(token.span().located_at(span));
            }
            token
        })
        .collect()
}

/// `ScopeSpec::Window(..)` or `ScopeSpec::BusinessKey { .. }`.
fn scope(scope: &Scope, private: &TokenStream) -> TokenStream {
    let seconds = |window: &Window| {
        let seconds = window.seconds;
        quote_spanned!(window.lit.span()=> #private::Duration::from_secs(#seconds))
    };
    match scope {
        Scope::BusinessKey {
            fields, retention, ..
        } => {
            let fields = fields.iter().map(LitStr::value);
            let retention = match retention {
                Some(window) => {
                    let duration = seconds(window);
                    quote!(::core::option::Option::Some(#duration))
                }
                None => quote!(::core::option::Option::None),
            };
            quote! {
                #private::ScopeSpec::BusinessKey {
                    fields: &[#(#fields),*],
                    retention: #retention,
                }
            }
        }
        Scope::Window(window) => {
            let duration = seconds(window);
            quote!(#private::ScopeSpec::Window(#duration))
        }
        // Expanded by `by_construction`, which names no scope.
        Scope::ByConstruction(_) => TokenStream::new(),
    }
}

/// `Some(ClientKeyMode::..)` for a tool with `client_key = "..."`, else `None`.
fn client_key_mode(mode: Option<ClientKey>, private: &TokenStream) -> TokenStream {
    match mode {
        Some(ClientKey::Optional) => {
            quote!(::core::option::Option::Some(#private::ClientKeyMode::Optional))
        }
        Some(ClientKey::Required) => {
            quote!(::core::option::Option::Some(#private::ClientKeyMode::Required))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// rmcp's `#[tool(...)]` with `idempotent_hint = true` merged into its
/// annotations, the output schema of a `Json<T>` result kept, and the wrapper
/// marker that `audit_hints` looks for added to its `_meta`.
fn tool_attribute(tool: &Tool, private: &TokenStream, scope: &TokenStream) -> syn::Attribute {
    let status_tool = &tool.status_tool;
    // A tool that answers with tasks says so in its marker.
    let tool_meta = if tool.task {
        quote!(#private::task_tool_meta)
    } else {
        quote!(#private::tool_meta)
    };
    // A tool that accepts client keys says so in its marker too.
    let marked = |meta: TokenStream| match tool.client_key {
        None => meta,
        Some(_) => {
            let mode = client_key_mode(tool.client_key, private);
            quote!(#private::with_client_key(#meta, #mode))
        }
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut has_annotations = false;
    let mut has_meta = false;
    for meta in &tool.tool_args.items {
        match meta {
            Meta::List(list) if list.path.is_ident("annotations") => {
                has_annotations = true;
                let mut annotations: Punctuated<Meta, Token![,]> = list
                    .parse_args_with(Punctuated::parse_terminated)
                    .unwrap_or_default();
                if !annotations
                    .iter()
                    .any(|m| m.path().is_ident("idempotent_hint"))
                {
                    annotations.push(parse_quote!(idempotent_hint = true));
                }
                let path = &list.path;
                items.push(quote!(#path(#annotations)));
            }
            Meta::NameValue(nv) if nv.path.is_ident("meta") => {
                has_meta = true;
                let user = &nv.value;
                let meta = marked(quote!(
                    #tool_meta(::core::option::Option::Some(#user), #scope, #status_tool)
                ));
                items.push(quote!(meta = #meta));
            }
            other => items.push(other.to_token_stream()),
        }
    }
    if !has_annotations {
        items.push(quote!(annotations(idempotent_hint = true)));
    }
    if !has_meta {
        let meta = marked(quote!(
            #tool_meta(::core::option::Option::None, #scope, #status_tool)
        ));
        items.push(quote!(meta = #meta));
    }
    // rmcp derives the output schema from a `Json<T>` return type; the
    // rewritten method returns `CallToolResult`, so the schema is named here.
    if let Some(json) = &tool.returns.json {
        if tool.tool_args.value("output_schema").is_none() {
            items.push(quote!(output_schema = #private::schema_for_output::<#json>()));
        }
    }
    let path = tool.method.attrs[tool.tool_index].path();
    parse_quote!(#[#path(#(#items),*)])
}

/// The business key's values, taken from the typed fields before the
/// handler consumes them: `[("order_id", value of args.order_id), ...]`.
/// Each access is spanned on its string, so a field the type lacks, or one
/// that is an `Option`, is reported there.
fn business_key_values(fields: &[LitStr], params: &Ident, private: &TokenStream) -> TokenStream {
    let values = fields.iter().map(|lit| {
        let name = lit.value();
        // At the string, but from the macro: rustc reports a missing field
        // there without offering to rewrite the string into an ident.
        let span = lit.span().resolved_at(Span::mixed_site());
        let path = name.split('.').map(|part| match part.strip_prefix("r#") {
            Some(raw) => Ident::new_raw(raw, span),
            None => Ident::new(part, span),
        });
        // `&&KeyField` first tries `OptionalKeyField` (implemented for
        // `&KeyField<Option<T>>`, refused at compile time), then
        // `KeyFieldValue` one reference down.
        let value = located_at(
            quote!((&&#private::KeyField(&#params.0 #(.#path)*)).business_key_value()),
            lit.span(),
        );
        quote!((#name, #value))
    });
    quote! {
        {
            use #private::{KeyFieldValue as _, OptionalKeyField as _};
            [#(#values),*]
        }
    }
}
