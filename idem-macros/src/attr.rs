//! The arguments of `#[idempotent(...)]`, parsed and checked on their own:
//! each value, each option at most once, and a scope.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{bracketed, Ident, LitBool, LitStr, Path, Token, Visibility};

/// Every option, declared once. `crate` is a Rust keyword and parsed as
/// `Token![crate]`.
mod kw {
    syn::custom_keyword!(window);
    syn::custom_keyword!(business_key);
    syn::custom_keyword!(status_tool);
    syn::custom_keyword!(task);
    syn::custom_keyword!(by_construction);
    syn::custom_keyword!(client_key);
    // `#[idem_runtime::tool_router(...)]`: rmcp's options, then `status_tool`
    // and `crate` again.
    syn::custom_keyword!(router);
    syn::custom_keyword!(vis);
    syn::custom_keyword!(server_handler);
    syn::custom_keyword!(allow_empty);
}

/// The list shown when an option is unknown.
const ACCEPTED: &str = "`window = \"15m\"`, `business_key = \"order_id\"` (or `[\"a\", \"b\"]`), \
                        `status_tool = \"get_operation_status\"`, `task = \"optional\"` (or `\"never\"`), \
                        `client_key = \"optional\"` (or `\"required\"`), `crate = \"path\"`, \
                        `by_construction = \"sets the status to the given value\"`";

/// The list shown when an option of the impl-level macro is unknown.
const ROUTER_ACCEPTED: &str = "rmcp's `router = name`, `vis = \"pub(crate)\"`, `server_handler` \
                               and `allow_empty`, and `status_tool = false`, `crate = \"path\"`";

/// The status tool named in in-flight and unknown answers when the attribute
/// names none.
pub(crate) const DEFAULT_STATUS_TOOL: &str = "get_operation_status";

/// `#[idempotent(...)]` after parsing: every value checked, every span kept.
pub(crate) struct Args {
    pub(crate) scope: Scope,
    pub(crate) status_tool: Option<LitStr>,
    pub(crate) krate: Option<Path>,
    /// `task = "optional"`: answer with an MCP task when the request
    /// declares the tasks extension. `None` and `task = "never"`: never.
    pub(crate) task: Option<TaskSupport>,
    /// `client_key = "optional" | "required"`: a call's client key names
    /// its operation. `None`: the tool ignores client keys.
    pub(crate) client_key: Option<ClientKey>,
}

/// `client_key = "..."`: whether a call may, or must, carry a client key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientKey {
    /// A call may carry one; without it, the window decides.
    Optional,
    /// A call without one is refused.
    Required,
}

/// What `client_key` accepts, for its errors.
const CLIENT_KEY_VALUES: &str = "`client_key = \"optional\"` (a call may carry a key in \
    `_meta[\"idem/idempotency-key\"]` or the `Idempotency-Key` header; without one, the window \
    decides) or `client_key = \"required\"` (a call without a key is refused)";

/// `client_key = "optional"` or `client_key = "required"`.
fn parse_client_key(lit: &LitStr) -> syn::Result<ClientKey> {
    match lit.value().as_str() {
        "optional" => Ok(ClientKey::Optional),
        "required" => Ok(ClientKey::Required),
        other => Err(syn::Error::new_spanned(
            lit,
            format!("`client_key = {other:?}` is not a client key mode; write {CLIENT_KEY_VALUES}"),
        )),
    }
}

/// `task = "..."`: whether a call may be answered with an MCP task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskSupport {
    /// A task when the request declares `io.modelcontextprotocol/tasks`,
    /// the result inline when it does not.
    Optional,
    /// Always the result inline (the default).
    Never,
}

/// What `task` accepts, for its errors.
const TASK_VALUES: &str = "`task = \"optional\"` (a request that declares the \
    `io.modelcontextprotocol/tasks` extension gets a task, any other the result inline) or \
    `task = \"never\"` (always the result inline, the default)";

/// `task = "optional"` or `task = "never"`.
fn parse_task(lit: &LitStr) -> syn::Result<TaskSupport> {
    match lit.value().as_str() {
        "optional" => Ok(TaskSupport::Optional),
        "never" => Ok(TaskSupport::Never),
        "required" | "always" => Err(syn::Error::new_spanned(
            lit,
            format!(
                "`task = {:?}` is not offered: a client without the tasks extension would get an \
                 error and nothing would run, though idem can always answer it inline. Write {TASK_VALUES}",
                lit.value()
            ),
        )),
        other => Err(syn::Error::new_spanned(
            lit,
            format!("`task = {other:?}` is not a task mode; write {TASK_VALUES}"),
        )),
    }
}

/// What makes two calls one operation. An attribute without one does not
/// parse, so there is no third case.
pub(crate) enum Scope {
    /// `window = "15m"` alone: this caller, this tool, these arguments,
    /// within the window.
    Window(Window),
    /// `business_key = ...`: the key's value within the caller's tenant,
    /// kept for `retention` (`window`, if given; the runtime's default if not).
    BusinessKey {
        /// Each field, as written: a field of the parameter type, or a path
        /// into one (`"customer.id"`).
        fields: Vec<LitStr>,
        retention: Option<Window>,
        /// The `business_key` keyword, for errors about the option as a whole.
        keyword: Span,
    },
    /// `by_construction = "..."`: the tool's own code makes a repeat
    /// harmless, for the reason given; no claim, no store.
    ByConstruction(LitStr),
}

/// `window = "1h30m"`: the duration in seconds and the literal it came from.
pub(crate) struct Window {
    pub(crate) seconds: u64,
    pub(crate) lit: LitStr,
}

impl Args {
    /// The status tool's name: as written, or [`DEFAULT_STATUS_TOOL`].
    pub(crate) fn status_tool(&self) -> String {
        self.status_tool
            .as_ref()
            .map_or_else(|| DEFAULT_STATUS_TOOL.to_owned(), LitStr::value)
    }

    fn set<T>(slot: &mut Option<T>, value: T, key: &impl Spanned, name: &str) -> syn::Result<()> {
        if slot.is_some() {
            return Err(syn::Error::new(
                key.span(),
                format!("`{name}` is given twice; keep one `{name} = ...`"),
            ));
        }
        *slot = Some(value);
        Ok(())
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut window: Option<Window> = None;
        let mut business_key: Option<(Vec<LitStr>, Span)> = None;
        let mut status_tool: Option<LitStr> = None;
        let mut krate: Option<Path> = None;
        let mut task: Option<TaskSupport> = None;
        let mut by_construction: Option<(LitStr, Span)> = None;
        // The options given so far that `by_construction` excludes.
        let mut recorded: Vec<String> = Vec::new();
        let mut client_key: Option<(ClientKey, Span)> = None;
        while !input.is_empty() {
            check_by_construction(input, by_construction.as_ref(), &mut recorded)?;
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::window) {
                let key: kw::window = input.parse()?;
                input.parse::<Token![=]>()?;
                let value = parse_window(&input.parse()?)?;
                Args::set(&mut window, value, &key, "window")?;
            } else if lookahead.peek(kw::business_key) {
                let key: kw::business_key = input.parse()?;
                input.parse::<Token![=]>()?;
                let fields = parse_business_key(input)?;
                Args::set(&mut business_key, (fields, key.span), &key, "business_key")?;
            } else if lookahead.peek(kw::status_tool) {
                let key: kw::status_tool = input.parse()?;
                input.parse::<Token![=]>()?;
                let name: LitStr = input.parse()?;
                check_tool_name(&name)?;
                Args::set(&mut status_tool, name, &key, "status_tool")?;
            } else if lookahead.peek(kw::task) {
                let key: kw::task = input.parse()?;
                input.parse::<Token![=]>()?;
                if !input.peek(LitStr) {
                    return Err(input.error(format!("`task` takes a string: {TASK_VALUES}")));
                }
                let value = parse_task(&input.parse()?)?;
                Args::set(&mut task, value, &key, "task")?;
            } else if lookahead.peek(kw::by_construction) {
                let key: kw::by_construction = input.parse()?;
                if !input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        key.span,
                        "`by_construction` needs its reason: write `by_construction = \"...\"` with the lines \
                         of the handler that make a repeat harmless, e.g. \
                         `by_construction = \"sets the status to the given value; a repeat writes the same value\"`",
                    ));
                }
                input.parse::<Token![=]>()?;
                let reason = parse_reason(input)?;
                Args::set(
                    &mut by_construction,
                    (reason, key.span),
                    &key,
                    "by_construction",
                )?;
            } else if lookahead.peek(kw::client_key) {
                let key: kw::client_key = input.parse()?;
                input.parse::<Token![=]>()?;
                if !input.peek(LitStr) {
                    return Err(
                        input.error(format!("`client_key` takes a string: {CLIENT_KEY_VALUES}"))
                    );
                }
                let value = parse_client_key(&input.parse()?)?;
                Args::set(&mut client_key, (value, key.span), &key, "client_key")?;
            } else if lookahead.peek(Token![crate]) {
                let key: Token![crate] = input.parse()?;
                input.parse::<Token![=]>()?;
                let path = parse_crate(input)?;
                Args::set(&mut krate, path, &key, "crate")?;
            } else if input.peek(Ident) {
                let unknown: Ident = input.parse()?;
                return Err(syn::Error::new_spanned(
                    &unknown,
                    format!("unknown option `{unknown}`; `#[idempotent]` accepts {ACCEPTED}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        // A business key already names the operation, whoever asks: a
        // client key beside it would name it twice.
        if let (Some((_, keyword)), Some(_)) = (&client_key, &business_key) {
            return Err(syn::Error::new(
                *keyword,
                "`client_key` names an operation by the key the host sends, and `business_key` by a field of \
                 the arguments: a tool takes one of them. Keep `business_key` (one operation per value, whoever \
                 asks), or write `window = \"15m\", client_key = \"optional\"`",
            ));
        }
        // With a business key, `window` is how long the record is kept.
        let scope = match (business_key, window) {
            (Some((fields, keyword)), retention) => Scope::BusinessKey {
                fields,
                retention,
                keyword,
            },
            (None, Some(window)) => Scope::Window(window),
            (None, None) if client_key.is_some() => {
                return Err(syn::Error::new(
                    Span::call_site(),
                    "`client_key` needs a window for calls without a key, and to tell when identical arguments \
                     arrive under a new key: write `#[idempotent(window = \"15m\", client_key = \"optional\")]`",
                ))
            }
            // `by_construction` stands alone: no window, no business key.
            (None, None) => match by_construction {
                Some((reason, _)) => Scope::ByConstruction(reason),
                None => return Err(syn::Error::new(
                    Span::call_site(),
                    "`#[idempotent]` needs a scope: write `#[idempotent(window = \"15m\")]` (repeats of the same call within 15 minutes are one operation) \
                     or `#[idempotent(business_key = \"order_id\")]` (one operation per order id); \
                     for a tool whose own code makes a repeat harmless, `#[idempotent(by_construction = \"why\")]`",
                )),
            },
        };
        Ok(Args {
            scope,
            status_tool,
            krate,
            task,
            client_key: client_key.map(|(mode, _)| mode),
        })
    }
}

/// `#[idem_runtime::tool_router(...)]` after parsing: rmcp's own options,
/// which it hands on, and its own.
#[derive(Default)]
pub(crate) struct RouterArgs {
    /// `router = name`: the name of the router fn (rmcp's default, `tool_router`).
    pub(crate) router: Option<Ident>,
    /// `vis = "pub(crate)"`: the router fn's visibility.
    pub(crate) vis: Option<Visibility>,
    /// `server_handler`: also write `impl ServerHandler` over the router.
    pub(crate) server_handler: Option<kw::server_handler>,
    /// `allow_empty`: an impl without `#[tool]` fns is not an error.
    pub(crate) allow_empty: Option<kw::allow_empty>,
    /// `status_tool = false`: the router gets no status tool.
    pub(crate) status_tool: Option<LitBool>,
    /// `crate = "path"`: where idem-runtime is.
    pub(crate) krate: Option<Path>,
}

impl RouterArgs {
    /// Whether the router gets the status tools its wrapped tools name.
    pub(crate) fn adds_status_tool(&self) -> bool {
        self.status_tool.as_ref().is_none_or(LitBool::value)
    }
}

impl Parse for RouterArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = RouterArgs::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::router) {
                let key: kw::router = input.parse()?;
                input.parse::<Token![=]>()?;
                let name = if input.peek(LitStr) {
                    let lit: LitStr = input.parse()?;
                    lit.parse::<Ident>().map_err(|_| {
                        syn::Error::new_spanned(
                            &lit,
                            "`router` takes the router fn's name: `router = my_router`",
                        )
                    })?
                } else {
                    input.parse::<Ident>().map_err(|error| {
                        syn::Error::new(
                            error.span(),
                            "`router` takes the router fn's name: `router = my_router`",
                        )
                    })?
                };
                Args::set(&mut args.router, name, &key, "router")?;
            } else if lookahead.peek(kw::vis) {
                let key: kw::vis = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let vis = lit.parse::<Visibility>().map_err(|_| {
                    syn::Error::new_spanned(
                        &lit,
                        "`vis` takes the router fn's visibility: `vis = \"pub(crate)\"`",
                    )
                })?;
                Args::set(&mut args.vis, vis, &key, "vis")?;
            } else if lookahead.peek(kw::server_handler) {
                let key: kw::server_handler = input.parse()?;
                Args::set(&mut args.server_handler, key, &key, "server_handler")?;
            } else if lookahead.peek(kw::allow_empty) {
                let key: kw::allow_empty = input.parse()?;
                Args::set(&mut args.allow_empty, key, &key, "allow_empty")?;
            } else if lookahead.peek(kw::status_tool) {
                let key: kw::status_tool = input.parse()?;
                input.parse::<Token![=]>()?;
                if !input.peek(LitBool) {
                    return Err(input.error(
                        "the router adds the status tool each `#[idempotent]` tool names; here `status_tool` only \
                         turns that off: `status_tool = false`. To name the status tool, write \
                         `#[idempotent(..., status_tool = \"name\")]` on the tools",
                    ));
                }
                let value: LitBool = input.parse()?;
                Args::set(&mut args.status_tool, value, &key, "status_tool")?;
            } else if lookahead.peek(Token![crate]) {
                let key: Token![crate] = input.parse()?;
                input.parse::<Token![=]>()?;
                let path = parse_crate(input)?;
                Args::set(&mut args.krate, path, &key, "crate")?;
            } else if input.peek(Ident) {
                let unknown: Ident = input.parse()?;
                return Err(syn::Error::new_spanned(
                    &unknown,
                    format!("unknown option `{unknown}`; `#[idem_runtime::tool_router]` accepts {ROUTER_ACCEPTED}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `by_construction = "..."`: the reason, a non-empty string.
fn parse_reason(input: ParseStream<'_>) -> syn::Result<LitStr> {
    const EXAMPLE: &str = "`by_construction = \"sets the status to the given value; a repeat writes the same value\"`";
    if !input.peek(LitStr) {
        return Err(input.error(format!(
            "`by_construction` takes the reason a repeat of this tool is harmless, in words: {EXAMPLE}"
        )));
    }
    let reason: LitStr = input.parse()?;
    if reason.value().trim().is_empty() {
        return Err(syn::Error::new_spanned(
            &reason,
            format!(
                "the reason is empty: say which lines of the handler make a repeat harmless, so a reviewer \
                 can hold the hint against them, e.g. {EXAMPLE}"
            ),
        ));
    }
    Ok(reason)
}

/// The options of a tool idem claims and records, which a tool idempotent
/// by construction has no use for.
const RECORDED_ONLY: [&str; 5] = [
    "window",
    "business_key",
    "client_key",
    "status_tool",
    "task",
];

/// Before each option: `by_construction` together with an option of
/// [`RECORDED_ONLY`], in either order, is an error on the second one. Done
/// on the option's name, before it is parsed, so that the error is the same
/// whatever the option's own parser says of its value.
fn check_by_construction(
    input: ParseStream<'_>,
    by_construction: Option<&(LitStr, Span)>,
    recorded: &mut Vec<String>,
) -> syn::Result<()> {
    let Ok(option) = input.fork().call(Ident::parse_any) else {
        return Ok(());
    };
    let name = option.to_string();
    if name == "by_construction" {
        if let Some(other) = recorded.first() {
            return Err(by_construction_with(option.span(), other));
        }
    } else if RECORDED_ONLY.contains(&name.as_str()) {
        if by_construction.is_some() {
            return Err(by_construction_with(option.span(), &name));
        }
        recorded.push(name);
    }
    Ok(())
}

/// `by_construction` given with an option of a wrapped tool, which it
/// would silently ignore: a tool idempotent by construction has no claim,
/// no record and no operation to name.
fn by_construction_with(span: Span, other: &str) -> syn::Error {
    syn::Error::new(
        span,
        format!(
            "`by_construction` says the tool's own code makes a repeat harmless, so idem neither claims \
             nor records its calls, and `{other}` would have no effect. Keep `by_construction = \"...\"` \
             alone, or remove it and keep `{other}` to have idem record each operation"
        ),
    )
}

/// `crate = "path"`: the path idem-runtime is reachable at.
fn parse_crate(input: ParseStream<'_>) -> syn::Result<Path> {
    let lit: LitStr = input.parse()?;
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new_spanned(
            &lit,
            "`crate` takes the path idem-runtime is imported as, e.g. `crate = \"::idem_runtime\"`",
        )
    })
}

/// `business_key = "order_id"` or `business_key = ["a", "b"]`: the fields,
/// each named once.
fn parse_business_key(input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
    let fields: Vec<LitStr> = if input.peek(syn::token::Bracket) {
        let content;
        let brackets = bracketed!(content in input);
        let list = content.parse_terminated(<LitStr as Parse>::parse, Token![,])?;
        if list.is_empty() {
            return Err(syn::Error::new(
                brackets.span.join(),
                "`business_key = []` names no field; name at least one, e.g. `business_key = \"order_id\"`",
            ));
        }
        list.into_iter().collect()
    } else if input.peek(LitStr) {
        vec![input.parse()?]
    } else {
        return Err(input.error(
            "`business_key` takes a field name or a list of them: `business_key = \"order_id\"` or `business_key = [\"tenant_ref\", \"order_id\"]`",
        ));
    };
    let mut seen: Vec<String> = Vec::new();
    for field in &fields {
        check_field_path(field)?;
        let name = field.value();
        if seen.contains(&name) {
            return Err(syn::Error::new_spanned(
                field,
                format!("`{name}` is named twice in `business_key`; name each field once"),
            ));
        }
        seen.push(name);
    }
    Ok(fields)
}

/// A business key field: the Rust name of a field of the parameter type,
/// or a dotted path into one (`"customer.id"`), each part a field name.
fn check_field_path(lit: &LitStr) -> syn::Result<()> {
    let value = lit.value();
    if value.trim().is_empty() {
        return Err(syn::Error::new_spanned(
            lit,
            "the business key field is empty; name a field of the parameter type, e.g. `business_key = \"order_id\"`",
        ));
    }
    let is_field_name = |part: &str| {
        let plain = part.strip_prefix("r#").unwrap_or(part);
        plain
            .chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_alphabetic())
            && plain.chars().all(|c| c == '_' || c.is_alphanumeric())
    };
    if !value.split('.').all(is_field_name) {
        return Err(syn::Error::new_spanned(
            lit,
            format!(
                "`{value}` is not a field name; write the Rust name of a field of the parameter type, \
                 e.g. `\"order_id\"`, or a path into one, e.g. `\"customer.id\"`"
            ),
        ));
    }
    Ok(())
}

/// A tool name as MCP allows it: 1 to 128 of `A-Z a-z 0-9 _ - .`.
fn check_tool_name(lit: &LitStr) -> syn::Result<()> {
    let name = lit.value();
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        Ok(())
    } else {
        Err(syn::Error::new_spanned(
            lit,
            "`status_tool` names the tool that reports an operation's state; write a tool name such as `status_tool = \"get_operation_status\"`",
        ))
    }
}

/// Parses `window = "..."`: one or more `<number><unit>` parts, units `d`,
/// `h`, `m`, `s`, largest first, each at most once, total above zero.
pub(crate) fn parse_window(lit: &LitStr) -> syn::Result<Window> {
    let seconds = parse_duration(&lit.value()).map_err(|message| {
        syn::Error::new_spanned(
            lit,
            format!("{message}; write e.g. `window = \"15m\"`, `\"48h\"` or `\"1h30m\"`"),
        )
    })?;
    Ok(Window {
        seconds,
        lit: lit.clone(),
    })
}

/// The duration text to seconds, or a message saying what is wrong with it.
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    const UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];
    if text.trim().is_empty() {
        return Err("the window is empty".to_owned());
    }
    let mut total: u64 = 0;
    let mut smallest_so_far = usize::MAX; // index into UNITS of the last unit seen
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(format!(
                "`{text}` is not a duration: each part is a number and a unit"
            ));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.len()
            - after
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .len();
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!("`{text}` has no unit: add `s`, `m`, `h` or `d`"));
        }
        let Some(index) = UNITS
            .iter()
            .position(|&(u, _)| unit.len() == 1 && unit.starts_with(u))
        else {
            return Err(format!(
                "`{unit}` in `{text}` is not a unit: use `s`, `m`, `h` or `d`"
            ));
        };
        if smallest_so_far != usize::MAX && index <= smallest_so_far {
            return Err(format!(
                "`{text}` repeats a unit or puts a smaller one first: write the largest unit first, each once"
            ));
        }
        smallest_so_far = index;
        let value: u64 = number
            .parse()
            .map_err(|_| format!("`{text}` is too long a window"))?;
        total = value
            .checked_mul(UNITS[index].1)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("`{text}` is too long a window"))?;
        rest = after;
    }
    if total == 0 {
        return Err(format!(
            "a window of `{text}` is zero: every call would be a new operation"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::{check_field_path, parse_duration, RouterArgs, ACCEPTED};

    /// The attribute's reference page (its doc comment in lib.rs) has a
    /// section for every option the attribute accepts.
    #[test]
    fn every_option_is_documented_on_the_attribute() {
        let docs = include_str!("lib.rs");
        let options: Vec<&str> = ACCEPTED
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|code| code.split_once(" = ").map(|(name, _)| name))
            .collect();
        assert_eq!(options.len(), 7, "{options:?}");
        for option in options {
            assert!(
                docs.contains(&format!("/// ## `{option} = ")),
                "the docs of #[idempotent] have no section `## `{option} = ...``"
            );
        }
    }
    use proc_macro2::Span;
    use syn::LitStr;

    #[test]
    fn field_paths() {
        for good in ["order_id", "customer.id", "r#type", "a.b.c", "_x"] {
            let lit = LitStr::new(good, Span::call_site());
            assert!(check_field_path(&lit).is_ok(), "{good:?} was refused");
        }
        for bad in [
            "",
            " ",
            "customer..id",
            ".id",
            "customer.",
            "order-id",
            "0",
            "a.1",
        ] {
            let lit = LitStr::new(bad, Span::call_site());
            assert!(check_field_path(&lit).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn router_args() {
        let args: RouterArgs = syn::parse_quote!(
            router = payments_router,
            vis = "pub(crate)",
            server_handler,
            allow_empty,
            status_tool = false,
            crate = "::idem_runtime"
        );
        assert_eq!(args.router.as_ref().unwrap(), "payments_router");
        assert!(args.vis.is_some() && args.server_handler.is_some() && args.allow_empty.is_some());
        assert!(!args.adds_status_tool());
        assert!(args.krate.is_some());

        let args: RouterArgs = syn::parse_quote!(router = "named");
        assert_eq!(args.router.as_ref().unwrap(), "named");
        assert!(args.adds_status_tool());

        for bad in [
            quote::quote!(status_tool = "payment_status"),
            quote::quote!(router = a, router = b),
            quote::quote!(routr = a),
            quote::quote!(vis = "pub(nowhere"),
        ] {
            assert!(
                syn::parse2::<RouterArgs>(bad.clone()).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("48h"), Ok(172_800));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_duration("1d2h3m4s"), Ok(93_784));
    }

    #[test]
    fn bad_durations() {
        for bad in [
            "",
            " ",
            "15",
            "15x",
            "15 m",
            "m",
            "0s",
            "0h0m",
            "30m1h",
            "1h1h",
            "15ms",
            "-5m",
            "99999999999999999999d",
            "1.5h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
