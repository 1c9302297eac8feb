//! Checks on the model of a wrapped tool: one `#[idempotent]`, `async`, a
//! `&self` receiver, no `idempotent_hint` of the user's own, and arguments
//! for a business key to be found in.

use syn::FnArg;

use crate::ast::{self, Tool};
use crate::attr::Scope;

/// Runs every check and reports all that fail at once.
pub(crate) fn check(tool: &Tool) -> syn::Result<()> {
    let attrs = &tool.method.attrs;
    let sig = &tool.method.sig;
    let mut errors: Vec<syn::Error> = Vec::new();

    // A second `#[idempotent]` would wrap the wrapper: two claims per call.
    if let Some(again) = attrs.iter().find(|attr| ast::is_attr(attr, "idempotent")) {
        errors.push(syn::Error::new_spanned(
            again,
            "`#[idempotent]` is given twice on this tool; keep one, with all its options",
        ));
    }

    // A tool idempotent by construction is not rewritten: it may be any
    // tool rmcp takes.
    let wrapped = !matches!(tool.scope, Scope::ByConstruction(_));

    if wrapped && sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "`#[idempotent]` wraps an async tool: write `async fn`",
        ));
    }

    match sig.inputs.first() {
        _ if !wrapped => {}
        Some(FnArg::Receiver(receiver))
            if receiver.reference.is_some() && receiver.mutability.is_none() => {}
        _ => errors.push(syn::Error::new_spanned(
            &sig.ident,
            "`#[idempotent]` takes its store from the server value: the tool needs a `&self` receiver",
        )),
    }

    // A tool without arguments is keyed on the caller and the tool within
    // its window; a business key has nothing to be taken from.
    if let (Scope::BusinessKey { keyword, .. }, None) = (&tool.scope, &tool.params) {
        errors.push(syn::Error::new(
            *keyword,
            format!(
                "`business_key` names fields of the tool's arguments, and `{}` takes none: add an argument \
                 `Parameters(args): Parameters<Args>` with the field, or write `window = \"15m\"` to make \
                 repeats by the same caller within the window one operation",
                sig.ident
            ),
        ));
    }

    match tool.tool_args.hint() {
        Ok(Some(hint)) if hint.value != Some(true) => errors.push(syn::Error::new_spanned(
            &hint.tokens,
            "`#[idempotent]` sets `idempotent_hint = true` itself, and that is what makes the hint true: \
             remove this `idempotent_hint`",
        )),
        Ok(_) => {}
        Err(error) => errors.push(error),
    }

    match errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    }) {
        Some(combined) => Err(combined),
        None => Ok(()),
    }
}
