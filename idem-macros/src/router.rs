//! The impl-level companion: sees every method of the `#[tool_router]` impl,
//! so a hint no wrapper backs, or an `#[idempotent]` below `#[tool]`, is a
//! compile error before rmcp or the method attributes run.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::{ImplItem, ItemImpl};

use crate::ast::{self, ToolArgs};
use crate::expand::with_error;
use crate::valid::BELOW_TOOL;

const UNBACKED_HINT: &str = "`idempotent_hint = true` on a tool that `#[idempotent]` does not wrap: \
     clients would repeat this call believing it safe, and nothing makes it so. \
     Put `#[idempotent(window = \"15m\")]` (or `business_key = \"...\"`) on the line above `#[tool(...)]`, \
     or remove the hint";

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
