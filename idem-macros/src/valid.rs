//! Checks that need the whole method: the attribute order, `async`, `&self`,
//! the `Parameters<T>` argument, the scope and the hint.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, ImplItemFn};

use crate::ast::{self, ParamsArg, Returns, ToolArgs};
use crate::attr::Args;

/// A method that passed every check: what the expansion needs from it.
pub(crate) struct Tool {
    /// The position of `#[tool(...)]` among the method's attributes.
    pub(crate) tool_index: usize,
    pub(crate) tool_args: ToolArgs,
    pub(crate) params: ParamsArg,
    pub(crate) returns: Returns,
}

/// Why `#[idempotent]` below `#[tool]` cannot work, said once for both macros.
pub(crate) const BELOW_TOOL: &str =
    "`#[idempotent]` must sit above `#[tool(...)]`: attributes expand from the top, \
     so below `#[tool]` it runs after rmcp has already built the tool's metadata without the hint. \
     Move `#[idempotent(...)]` to the line above `#[tool(...)]`";

/// Runs every check and reports all that fail at once.
pub(crate) fn check(args: &Args, item: &ImplItemFn) -> syn::Result<Tool> {
    let sig = &item.sig;
    let Some(tool_index) = ast::tool_attr_index(&item.attrs) else {
        let message = if sig.asyncness.is_none() && ast::is_pinned_box(&sig.output) {
            BELOW_TOOL.to_owned()
        } else {
            "`#[idempotent]` wraps an rmcp tool: put `#[tool(...)]` on the line below it".to_owned()
        };
        return Err(syn::Error::new(Span::call_site(), message));
    };

    let mut errors: Vec<syn::Error> = Vec::new();

    // A second `#[idempotent]` would wrap the wrapper: two claims per call.
    if let Some(again) = item
        .attrs
        .iter()
        .find(|attr| ast::is_attr(attr, "idempotent"))
    {
        errors.push(syn::Error::new_spanned(
            again,
            "`#[idempotent]` is given twice on this tool; keep one, with all its options",
        ));
    }

    if args.window.is_none() && args.business_key.is_none() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "`#[idempotent]` needs a scope: write `#[idempotent(window = \"15m\")]` (repeats of the same call within 15 minutes are one operation) \
             or `#[idempotent(business_key = \"order_id\")]` (one operation per order id)",
        ));
    }

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "`#[idempotent]` wraps an async tool: write `async fn`",
        ));
    }

    match sig.inputs.first() {
        Some(FnArg::Receiver(receiver))
            if receiver.reference.is_some() && receiver.mutability.is_none() => {}
        _ => errors.push(syn::Error::new_spanned(
            &sig.ident,
            "`#[idempotent]` takes its store from the server value: the tool needs a `&self` receiver",
        )),
    }

    let params = ast::params_arg(&sig.inputs);
    if params.is_none() {
        errors.push(syn::Error::new(
            sig.paren_token.span.join(),
            "`#[idempotent]` keys each operation on the tool's typed arguments: add an argument \
             `Parameters(args): Parameters<Args>` whose type derives `Serialize`, `Deserialize` and `JsonSchema`",
        ));
    }

    let tool_args = match ToolArgs::from_attr(&item.attrs[tool_index]) {
        Ok(tool_args) => Some(tool_args),
        Err(error) => {
            errors.push(error);
            None
        }
    };
    if let Some(tool_args) = &tool_args {
        match tool_args.hint() {
            Ok(Some(hint)) if hint.value != Some(true) => errors.push(syn::Error::new_spanned(
                &hint.tokens,
                "`#[idempotent]` sets `idempotent_hint = true` itself, and that is what makes the hint true: \
                 remove this `idempotent_hint`",
            )),
            Ok(_) => {}
            Err(error) => errors.push(error),
        }
    }

    if let Some(combined) = errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    }) {
        return Err(combined);
    }
    let (Some(tool_args), Some(params)) = (tool_args, params) else {
        // Unreachable: both were checked above.
        return Err(syn::Error::new(
            item.span(),
            "`#[idempotent]` could not read this tool",
        ));
    };
    Ok(Tool {
        tool_index,
        tool_args,
        params,
        returns: ast::returns(&sig.output),
    })
}
