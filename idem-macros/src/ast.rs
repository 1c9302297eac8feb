//! The model of a wrapped tool: the method under `#[idempotent]`, read into
//! rmcp's `#[tool(...)]` attribute and its annotations, the `Parameters<T>`
//! argument and the return type. Built here, checked in `valid.rs`, expanded
//! in `expand.rs`; the router reads tools with the same pieces.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::{
    parse_quote, Attribute, Expr, FnArg, GenericArgument, ImplItemFn, Lit, LitStr, Meta, PatType,
    Path, PathArguments, Token, Type,
};

use crate::attr::{Args, Scope, TaskSupport};

/// Why `#[idempotent]` below `#[tool]` cannot work, said once for both macros.
pub(crate) const BELOW_TOOL: &str =
    "`#[idempotent]` must sit above `#[tool(...)]`: attributes expand from the top, \
     so below `#[tool]` it runs after rmcp has already built the tool's metadata without the hint. \
     Move `#[idempotent(...)]` to the line above `#[tool(...)]`";

/// A tool method under `#[idempotent(...)]`: what the expansion needs from
/// it, every part found.
pub(crate) struct Tool {
    /// What makes two calls one operation.
    pub(crate) scope: Scope,
    /// The tool named in in-flight and outcome-unknown answers.
    pub(crate) status_tool: String,
    /// The path idem-runtime is reachable at.
    pub(crate) krate: Path,
    /// The method as written.
    pub(crate) method: ImplItemFn,
    /// The position of `#[tool(...)]` among the method's attributes.
    pub(crate) tool_index: usize,
    pub(crate) tool_args: ToolArgs,
    /// The `Parameters<T>` argument; `None` for a tool that takes no
    /// arguments, keyed on the caller and the tool alone.
    pub(crate) params: Option<ParamsArg>,
    pub(crate) returns: Returns,
    /// Whether a request that declares the tasks extension gets a task.
    pub(crate) task: bool,
    /// `client_key = "..."`: whether a call's client key names its
    /// operation.
    pub(crate) client_key: Option<crate::attr::ClientKey>,
}

impl Tool {
    /// Reads the method `#[idempotent(args)]` is on. Fails when a part the
    /// expansion needs is missing: `#[tool(...)]`, or a readable one.
    pub(crate) fn from_syn(args: Args, method: ImplItemFn) -> syn::Result<Self> {
        let sig = &method.sig;
        let Some(tool_index) = tool_attr_index(&method.attrs) else {
            // rmcp's `#[tool]` turns an `async fn` into a `fn` returning a
            // pinned box: that is `#[idempotent]` written below it.
            let message = if sig.asyncness.is_none() && is_pinned_box(&sig.output) {
                BELOW_TOOL
            } else {
                "`#[idempotent]` wraps an rmcp tool: put `#[tool(...)]` on the line below it"
            };
            return Err(syn::Error::new(Span::call_site(), message));
        };

        let params = ParamsArg::find(&sig.inputs);
        let tool_args = ToolArgs::from_attr(&method.attrs[tool_index])?;

        let status_tool = args.status_tool();
        let krate = args.krate.unwrap_or_else(|| parse_quote!(::idem_runtime));
        let returns = Returns::from_syn(&sig.output);
        let task = args.task == Some(TaskSupport::Optional);
        Ok(Tool {
            task,
            client_key: args.client_key,
            scope: args.scope,
            status_tool,
            krate,
            method,
            tool_index,
            tool_args,
            params,
            returns,
        })
    }
}

/// Whether an attribute's path ends in `name` (`tool`, `rmcp::tool`, ...).
pub(crate) fn is_attr(attr: &Attribute, name: &str) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|segment| segment.ident == name)
}

/// The position of rmcp's `#[tool]` among a method's attributes.
pub(crate) fn tool_attr_index(attrs: &[Attribute]) -> Option<usize> {
    attrs.iter().position(|attr| is_attr(attr, "tool"))
}

/// rmcp's `#[tool(...)]`, read as a list of `key = value` / `key(...)` / `key`.
pub(crate) struct ToolArgs {
    pub(crate) items: Punctuated<Meta, Token![,]>,
}

/// `idempotent_hint` as written inside `annotations(...)`.
pub(crate) struct Hint {
    /// `Some(b)` for a literal `true`/`false` (or a bare `idempotent_hint`,
    /// which rmcp reads as `true`); `None` for any other expression.
    pub(crate) value: Option<bool>,
    /// The whole `idempotent_hint = ...`, for errors.
    pub(crate) tokens: TokenStream,
}

impl ToolArgs {
    /// Reads the arguments of a `#[tool]` attribute; `#[tool]` alone has none.
    pub(crate) fn from_attr(attr: &Attribute) -> syn::Result<Self> {
        let items = match &attr.meta {
            Meta::Path(_) => Punctuated::new(),
            Meta::List(list) => list.parse_args_with(Punctuated::parse_terminated)?,
            Meta::NameValue(nv) => {
                return Err(syn::Error::new_spanned(
                    nv,
                    "write rmcp's attribute as `#[tool(...)]`",
                ))
            }
        };
        Ok(ToolArgs { items })
    }

    /// The value of `key = value`, if written.
    pub(crate) fn value(&self, key: &str) -> Option<&Expr> {
        self.items.iter().find_map(|meta| match meta {
            Meta::NameValue(nv) if nv.path.is_ident(key) => Some(&nv.value),
            _ => None,
        })
    }

    /// `name = "..."`: the tool's name when it is not the method's.
    pub(crate) fn name(&self) -> Option<LitStr> {
        match self.value("name")? {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Str(s) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    /// The items of `annotations(...)`, if written.
    pub(crate) fn annotations(&self) -> syn::Result<Option<Punctuated<Meta, Token![,]>>> {
        for meta in &self.items {
            if let Meta::List(list) = meta {
                if list.path.is_ident("annotations") {
                    return list.parse_args_with(Punctuated::parse_terminated).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// `idempotent_hint` inside `annotations(...)`, if written.
    pub(crate) fn hint(&self) -> syn::Result<Option<Hint>> {
        let Some(annotations) = self.annotations()? else {
            return Ok(None);
        };
        Ok(annotations.iter().find_map(hint_of))
    }
}

fn hint_of(meta: &Meta) -> Option<Hint> {
    if !meta.path().is_ident("idempotent_hint") {
        return None;
    }
    let value = match meta {
        Meta::Path(_) => Some(true),
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Bool(b) => Some(b.value),
                _ => None,
            },
            _ => None,
        },
        Meta::List(_) => None,
    };
    Some(Hint {
        value,
        tokens: meta.to_token_stream(),
    })
}

/// The method's `Parameters<T>` argument.
pub(crate) struct ParamsArg {
    /// Where it stands among the inputs.
    pub(crate) index: usize,
    /// The argument as written: its pattern and its `Parameters<T>` type.
    pub(crate) arg: PatType,
}

impl ParamsArg {
    /// Finds the argument typed `Parameters<T>`, the way rmcp's `#[tool]`
    /// does (by the last segment of the type's path).
    fn find(inputs: &Punctuated<FnArg, Token![,]>) -> Option<Self> {
        inputs.iter().enumerate().find_map(|(index, input)| {
            let FnArg::Typed(arg) = input else {
                return None;
            };
            single_type_arg(&arg.ty, "Parameters")?;
            Some(ParamsArg {
                index,
                arg: arg.clone(),
            })
        })
    }
}

/// `T` in `Name<T>` (by the path's last segment).
fn single_type_arg<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(inner) => Some(inner),
        _ => None,
    }
}

/// How the method returns, which decides how its outcome is classified and
/// what schema its output has.
pub(crate) struct Returns {
    /// The declared type; `()` when none is written.
    pub(crate) ty: Type,
    /// `Result<..>`: the error decides between released and unknown.
    pub(crate) fallible: bool,
    /// `T` of a `Json<T>` success value: the tool's output schema.
    pub(crate) json: Option<Type>,
    /// The success value is `Ask<..>`: the tool may ask before its effect.
    pub(crate) asks: bool,
}

impl Returns {
    fn from_syn(output: &syn::ReturnType) -> Self {
        let ty: Type = match output {
            syn::ReturnType::Default => parse_quote!(()),
            syn::ReturnType::Type(_, ty) => (**ty).clone(),
        };
        let ok = single_type_arg(&ty, "Result");
        let value = ok.unwrap_or(&ty);
        let asked = single_type_arg(value, "Ask");
        let json = single_type_arg(asked.unwrap_or(value), "Json").cloned();
        Returns {
            fallible: ok.is_some(),
            json,
            asks: asked.is_some(),
            ty,
        }
    }
}

/// Whether a return type is `Pin<Box<...>>`: what rmcp's `#[tool]` leaves
/// behind after rewriting an `async fn`.
fn is_pinned_box(output: &syn::ReturnType) -> bool {
    match output {
        syn::ReturnType::Type(_, ty) => single_type_arg(ty, "Pin").is_some(),
        syn::ReturnType::Default => false,
    }
}
