//! The impl-level companion: sees every method of the `#[tool_router]` impl,
//! so a hint no wrapper backs, or an `#[idempotent]` below `#[tool]`, is a
//! compile error before rmcp or the method attributes run.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::{ImplItem, ItemImpl};

use crate::ast::{self, ToolArgs, BELOW_TOOL};
use crate::expand::with_error;

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

    let rmcp_router = item_impl
        .attrs
        .iter()
        .any(|attr| ast::is_attr(attr, "tool_router"));
    if rmcp_router && !args.is_empty() {
        errors.push(syn::Error::new_spanned(
            &args,
            "rmcp's `#[tool_router]` is on this impl too: give the options to it and write \
             `#[idem_runtime::tool_router]` without any",
        ));
    }

    // rmcp's `#[tool_router]` above this attribute has already run: its
    // router fn is here, and adding another would define it twice.
    if !rmcp_router {
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
            Some(_) => {}
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

    if !rmcp_router {
        item_impl
            .attrs
            .push(syn::parse_quote!(#[rmcp::tool_router(#args)]));
    }
    let mut output = item_impl.into_token_stream();
    for error in errors {
        output.extend(error.into_compile_error());
    }
    quote!(#output)
}

#[cfg(test)]
mod tests {
    use quote::quote;

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
