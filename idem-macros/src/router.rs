//! The impl-level companion: sees every method of the `#[tool_router]` impl,
//! so a hint no wrapper backs, or an `#[idempotent]` below `#[tool]`, is a
//! compile error before rmcp or the method attributes run; and it adds the
//! status tool the wrapped tools name to the router it generates, so the
//! router served is the router audited.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{parse_quote, Attribute, ImplItem, ItemImpl, Path};

use crate::ast::{self, ToolArgs, BELOW_TOOL};
use crate::attr::{Args, RouterArgs, Scope};
use crate::expand::{located_at, with_error};

const UNBACKED_HINT: &str = "`idempotent_hint = true` on a tool that `#[idempotent]` does not wrap: \
     clients would repeat this call believing it safe, and nothing makes it so. \
     Put `#[idempotent(window = \"15m\")]` (or `business_key = \"...\"`) on the line above `#[tool(...)]`, \
     or remove the hint";

/// The name of a router fn as rmcp's `#[tool_router]` writes it (a fully
/// qualified `ToolRouter::<Self>::new()`), if this item is one.
fn rmcp_generated_router(item: &ImplItem) -> Option<String> {
    let ImplItem::Fn(method) = item else {
        return None;
    };
    // Compared without whitespace: how tokens print depends on where they came from.
    let body: String = method
        .block
        .to_token_stream()
        .to_string()
        .split_whitespace()
        .collect();
    let generated = method.sig.receiver().is_none()
        && body.contains("rmcp::handler::server::router::tool::ToolRouter::<Self>::new()");
    generated.then(|| method.sig.ident.to_string())
}

/// `#[tool_router(args)] impl ... { ... }`.
pub(crate) fn tool_router(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut item_impl: ItemImpl = match syn::parse2(item.clone()) {
        Ok(item_impl) => item_impl,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[idem_runtime::tool_router]` goes on the impl block that holds the `#[tool]` methods",
            );
            return with_error(item, error);
        }
    };
    let mut errors: Vec<syn::Error> = Vec::new();

    // rmcp's `#[tool_router(...)]` below this attribute: its options are
    // taken over, so the router fn it writes can be wrapped.
    let rmcp_router = item_impl
        .attrs
        .iter()
        .position(|attr| ast::is_attr(attr, "tool_router"));
    let mut all_args = args;
    if let Some(index) = rmcp_router {
        let attr = item_impl.attrs.remove(index);
        let theirs = rmcp_router_args(&attr);
        if !all_args.is_empty() && !theirs.is_empty() {
            all_args.extend(quote!(,));
        }
        all_args.extend(theirs);
    }
    let router_args: RouterArgs = match syn::parse2(all_args) {
        Ok(router_args) => router_args,
        Err(error) => {
            errors.push(error);
            RouterArgs::default()
        }
    };

    // rmcp's `#[tool_router]` above this attribute has already run: its
    // router fn is here, and adding another would define it twice.
    if rmcp_router.is_none() {
        if let Some(generated) = item_impl.items.iter().find_map(rmcp_generated_router) {
            let error = syn::Error::new(
                Span::call_site(),
                format!(
                    "rmcp's `#[tool_router]` above this attribute has already generated `{generated}`: \
                     put `#[idem_runtime::tool_router]` above rmcp's `#[tool_router]`, or use it instead of it"
                ),
            );
            return with_error(item, error);
        }
    }

    let mut wrapped = Wrapped::default();
    for impl_item in &mut item_impl.items {
        let ImplItem::Fn(method) = impl_item else {
            continue;
        };
        let Some(tool_index) = ast::tool_attr_index(&method.attrs) else {
            continue;
        };
        let idempotent_index = method
            .attrs
            .iter()
            .position(|attr| ast::is_attr(attr, "idempotent"));
        match idempotent_index {
            Some(index) if index > tool_index => {
                errors.push(syn::Error::new_spanned(&method.attrs[index], BELOW_TOOL));
                // Reported here once; the method is emitted as a plain tool.
                method.attrs.remove(index);
            }
            Some(index) => wrapped.add(&method.attrs[index]),
            None => {
                // A `#[tool]` rmcp cannot read is rmcp's error to report.
                let Ok(tool_args) = ToolArgs::from_attr(&method.attrs[tool_index]) else {
                    continue;
                };
                if let Ok(Some(hint)) = tool_args.hint() {
                    if hint.value != Some(false) {
                        errors.push(syn::Error::new_spanned(&hint.tokens, UNBACKED_HINT));
                    }
                }
            }
        }
    }

    if let (Some(key), Some(_)) = (&router_args.server_handler, &item_impl.trait_) {
        errors.push(syn::Error::new_spanned(
            key,
            "`server_handler` writes `impl ServerHandler` for the type of an inherent impl: \
             put the tools in `impl MyServer { ... }`, or write `#[tool_handler] impl ServerHandler for MyServer {}` yourself",
        ));
    }

    let mut output = expand(item_impl, &router_args, &wrapped);
    for error in errors {
        output.extend(error.into_compile_error());
    }
    output
}

/// The arguments of rmcp's `#[tool_router(...)]`; none for `#[tool_router]`.
fn rmcp_router_args(attr: &Attribute) -> TokenStream {
    match &attr.meta {
        syn::Meta::List(list) => list.tokens.clone(),
        _ => TokenStream::new(),
    }
}

/// What the impl's `#[idempotent]` tools ask of the router: the status tools
/// they name, and the path idem-runtime is at.
#[derive(Default)]
struct Wrapped {
    status_tools: Vec<String>,
    krate: Option<Path>,
}

impl Wrapped {
    /// Reads one `#[idempotent(...)]`. One that does not parse is reported
    /// by `#[idempotent]` itself, and wraps nothing.
    fn add(&mut self, attr: &Attribute) {
        let Ok(args) = attr.parse_args::<Args>() else {
            return;
        };
        if self.krate.is_none() {
            self.krate.clone_from(&args.krate);
        }
        // A tool idempotent by construction has no operation to report on.
        if matches!(args.scope, Scope::ByConstruction(_)) {
            return;
        }
        let name = args.status_tool();
        if !self.status_tools.contains(&name) {
            self.status_tools.push(name);
        }
    }
}

/// The impl under rmcp's `#[tool_router]`. When the router gets status
/// tools, rmcp writes its router fn under a private name and a fn of the
/// name asked for wraps it: the same routes, plus the status tools.
fn expand(mut item_impl: ItemImpl, args: &RouterArgs, wrapped: &Wrapped) -> TokenStream {
    let router = args
        .router
        .clone()
        .unwrap_or_else(|| format_ident!("tool_router"));
    let vis = &args.vis;
    let allow_empty = args.allow_empty.map(|key| quote!(#key));
    let adds_status_tool = args.adds_status_tool() && !wrapped.status_tools.is_empty();

    let krate: Path = args
        .krate
        .clone()
        .or_else(|| wrapped.krate.clone())
        .unwrap_or_else(|| parse_quote!(::idem_runtime));
    let rmcp_args = if adds_status_tool {
        let routes = format_ident!("__idem_{}_routes", router.unraw());
        let names = &wrapped.status_tools;
        // Spanned on the type, so a server that is not an
        // `IdempotentServer` is reported there.
        let with_status_tools = located_at(
            quote!(#krate::__private::with_status_tools::<Self>),
            item_impl.self_ty.span(),
        );
        item_impl.items.push(parse_quote! {
            /// The tools of this impl, and the status tool their answers name.
            #vis fn #router() -> #krate::__private::rmcp::handler::server::router::tool::ToolRouter<Self> {
                #with_status_tools(Self::#routes(), &[#(#names),*])
            }
        });
        let items = [Some(quote!(router = #routes)), allow_empty];
        let items = items.iter().flatten();
        quote!(#(#items),*)
    } else {
        let vis = vis.as_ref().map(|vis| {
            let vis = vis.to_token_stream().to_string();
            quote!(vis = #vis)
        });
        let items = [Some(quote!(router = #router)), vis, allow_empty];
        let items = items.iter().flatten();
        quote!(#(#items),*)
    };
    item_impl
        .attrs
        .push(parse_quote!(#[rmcp::tool_router(#rmcp_args)]));

    // rmcp's `server_handler` would serve its own router fn, without the
    // status tools: the handler is written here, over the wrapping fn.
    let handler = args
        .server_handler
        .filter(|_| item_impl.trait_.is_none())
        .map(|_| {
            let self_ty = &item_impl.self_ty;
            let (impl_generics, ty_generics, where_clause) = item_impl.generics.split_for_impl();
            // A wrapped tool's window or retention may be set at start-up
            // (`Executor::with_window`): the listing shows the one served.
            let listing = |served: TokenStream| {
                (!wrapped.status_tools.is_empty()).then(|| {
                    quote! {
                        async fn list_tools(
                            &self,
                            _request: ::core::option::Option<rmcp::model::PaginatedRequestParams>,
                            context: rmcp::service::RequestContext<rmcp::RoleServer>,
                        ) -> ::core::result::Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
                            ::core::result::Result::Ok(
                                #krate::__private::served_tools(self, &#served, &context),
                            )
                        }
                        fn get_tool(&self, name: &str) -> ::core::option::Option<rmcp::model::Tool> {
                            #krate::__private::served_tool(self, &#served, name)
                        }
                    }
                })
            };
            if !item_impl.generics.params.is_empty() {
                // A static cannot name a generic type: built for each call,
                // as rmcp's own `server_handler` does.
                let served_listing = listing(quote!(Self::#router()));
                return quote! {
                    #[rmcp::tool_handler(router = Self::#router())]
                    impl #impl_generics rmcp::ServerHandler for #self_ty #ty_generics #where_clause {
                        #served_listing
                    }
                };
            }
            // rmcp's `server_handler` builds the router again for every call
            // (a third of a bare call's cost): the router fn is pure, so it is
            // built once, on the first request, and that router is served.
            let served = format_ident!("__idem_{}_served", router.unraw());
            let served_listing = listing(quote!(*Self::#served()));
            quote! {
                impl #self_ty {
                    #[doc(hidden)]
                    fn #served() -> &'static rmcp::handler::server::router::tool::ToolRouter<Self> {
                        static ROUTER: ::std::sync::OnceLock<
                            rmcp::handler::server::router::tool::ToolRouter<#self_ty>,
                        > = ::std::sync::OnceLock::new();
                        ROUTER.get_or_init(Self::#router)
                    }
                }
                #[rmcp::tool_handler(router = Self::#served())]
                impl rmcp::ServerHandler for #self_ty {
                    #served_listing
                }
            }
        });
    quote! {
        #item_impl
        #handler
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    #[test]
    fn adds_the_status_tools_the_wrapped_tools_name() {
        let item = quote! {
            impl Shop {
                #[idempotent(window = "15m")]
                #[tool(description = "Charge a card")]
                async fn charge_card(&self) {}
                #[idempotent(window = "15m", status_tool = "refund_status")]
                #[tool(description = "Refund")]
                async fn refund(&self) {}
                #[idempotent(window = "15m")]
                #[tool(description = "Void")]
                async fn void(&self) {}
            }
        };
        let out = super::tool_router(quote!(router = shop_router), item.clone()).to_string();
        assert!(out.contains("router = __idem_shop_router_routes"), "{out}");
        assert!(out.contains("fn shop_router"), "{out}");
        assert!(
            out.contains(r#"& ["get_operation_status" , "refund_status"]"#),
            "{out}"
        );

        let out = super::tool_router(quote!(status_tool = false), item).to_string();
        assert!(!out.contains("with_status_tools"), "{out}");
        assert!(out.contains("router = tool_router"), "{out}");
    }

    #[test]
    fn takes_over_rmcps_options_and_writes_the_server_handler() {
        let item = quote! {
            #[rmcp::tool_router(router = shop_router, server_handler)]
            impl Shop {
                #[idempotent(window = "15m")]
                #[tool(description = "Charge a card")]
                async fn charge_card(&self) {}
            }
        };
        let out = super::tool_router(quote!(), item).to_string();
        assert!(out.contains("router = __idem_shop_router_routes"), "{out}");
        assert!(
            out.contains("tool_handler (router = Self :: __idem_shop_router_served ())"),
            "{out}"
        );
        assert!(out.contains("get_or_init (Self :: shop_router)"), "{out}");
        assert!(!out.contains("server_handler"), "{out}");
    }

    #[test]
    fn refuses_to_follow_rmcps_router() {
        let item = quote! {
            impl Shop {
                #[idempotent(window = "15m")]
                #[tool(description = "Charge a card")]
                async fn charge_card(&self) {}
                fn tool_router() -> rmcp::handler::server::router::tool::ToolRouter<Self> {
                    rmcp::handler::server::router::tool::ToolRouter::<Self>::new()
                        .with_route((Self::charge_card_tool_attr(), Self::charge_card))
                }
            }
        };
        let out = super::tool_router(quote!(), item).to_string();
        assert!(out.contains("has already generated `tool_router`"), "{out}");
    }
}
