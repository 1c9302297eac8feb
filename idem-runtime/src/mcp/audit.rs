//! The start-up audit: every `idempotentHint` on a router is backed by a
//! wrapper, and every wrapper's status tool is there.

use std::fmt;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use serde_json::Value;

use super::TOOL_META_KEY;

/// A tool that claims `idempotentHint: true` with no `#[idempotent]` wrapper
/// behind it, as found by [`audit_hints`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HintProblem {
    /// The tool says repeating it is safe, and nothing makes it so: the hint
    /// was set by hand (rmcp's builder API, or a `#[tool]` the macros did not see).
    UnbackedHint {
        /// The tool's name.
        tool: String,
    },
    /// A wrapped tool names a status tool the router does not have, so its
    /// in-progress and unknown answers send the model to a tool that is not there.
    MissingStatusTool {
        /// The wrapped tool.
        tool: String,
        /// The status tool it names.
        status_tool: String,
    },
}

impl fmt::Display for HintProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HintProblem::UnbackedHint { tool } => write!(
                f,
                "tool `{tool}` claims idempotentHint: true but no #[idempotent] wrapper backs it; \
                 wrap it or remove the hint"
            ),
            HintProblem::MissingStatusTool { tool, status_tool } => write!(
                f,
                "tool `{tool}` sends models to status tool `{status_tool}`, which this router \
                 does not have; add it (idem_runtime::mcp::status_tool) or name another"
            ),
        }
    }
}

impl std::error::Error for HintProblem {}

/// What makes one tool's `idempotentHint: true` true, as
/// [`hint_report`] finds it: the question a reviewer asks of every hint is
/// which lines of the handler make it true.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HintBacking {
    /// `#[idempotent]` with a window or a business key: idem claims and
    /// records each operation.
    Wrapper {
        /// The tool's name.
        tool: String,
    },
    /// `#[idempotent(by_construction = "...")]`: the tool's own code makes a
    /// repeat harmless, for this reason; idem stores nothing. Hold the
    /// reason against the handler's code.
    ByConstruction {
        /// The tool's name.
        tool: String,
        /// The reason, as written in the attribute.
        reason: String,
    },
    /// Nothing: the hint was set by hand (see [`HintProblem::UnbackedHint`]).
    Unbacked {
        /// The tool's name.
        tool: String,
    },
}

impl fmt::Display for HintBacking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HintBacking::Wrapper { tool } => {
                write!(f, "tool `{tool}`: idempotentHint backed by #[idempotent] (claimed and recorded)")
            }
            HintBacking::ByConstruction { tool, reason } => write!(
                f,
                "tool `{tool}`: idempotentHint idempotent by construction, not recorded: \"{reason}\"; \
                 check that the handler's code makes this true"
            ),
            HintBacking::Unbacked { tool } => write!(
                f,
                "tool `{tool}`: idempotentHint claimed with nothing behind it"
            ),
        }
    }
}

/// Every tool of a router that claims `idempotentHint: true`, with what
/// backs the claim, sorted by name: the list a reviewer reads, and the one
/// to log at start-up beside [`audit_hints`]. A tool idempotent by
/// construction shows the reason its attribute gives.
pub fn hint_report<S>(router: &ToolRouter<S>) -> Vec<HintBacking> {
    let mut routes: Vec<&ToolRoute<S>> = router.map.values().collect();
    routes.sort_by(|a, b| a.attr.name.cmp(&b.attr.name));
    routes
        .into_iter()
        .filter(|route| {
            route
                .attr
                .annotations
                .as_ref()
                .and_then(|a| a.idempotent_hint)
                .unwrap_or(false)
        })
        .map(|route| {
            let tool = route.attr.name.to_string();
            let marker = route
                .attr
                .meta
                .as_ref()
                .and_then(|meta| meta.get(TOOL_META_KEY));
            match marker {
                None => HintBacking::Unbacked { tool },
                Some(marker) => match marker.get("byConstruction").and_then(Value::as_str) {
                    Some(reason) => HintBacking::ByConstruction {
                        tool,
                        reason: reason.to_owned(),
                    },
                    None => HintBacking::Wrapper { tool },
                },
            }
        })
        .collect()
}

/// Checks a finished router: every tool that claims `idempotentHint: true`
/// must be wrapped by `#[idempotent]`, and every wrapped tool's status tool
/// must be in the router. Call it at start-up, on the router the server
/// will serve (after every `+`, `merge` and `with_route`), and refuse to
/// start on an error:
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{audit_hints, idempotent, Executor, IdempotentServer, MemoryStore, ToolError};
/// use rmcp::handler::server::wrapper::{Json, Parameters};
/// use rmcp::tool;
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct ChargeArgs {
///     order_id: String,
///     amount_cents: u64,
/// }
///
/// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// struct Receipt {
///     charge_id: String,
/// }
///
/// struct Payments {
///     executor: Executor,
/// }
///
/// impl IdempotentServer for Payments {
///     fn executor(&self) -> &Executor {
///         &self.executor
///     }
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
///         Ok(Json(Receipt { charge_id: format!("ch_{}", args.order_id) }))
///     }
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     // The router the server will serve (the impl macro added the status tool).
///     let router = Payments::tool_router();
///     if let Err(problems) = audit_hints(&router) {
///         for problem in &problems {
///             eprintln!("{problem}");
///         }
///         return Err("refusing to start: a tool's idempotentHint is not backed".into());
///     }
///     // ... serve `Payments { executor: Executor::new(Arc::new(MemoryStore::new())) }`
///     # let _ = Payments { executor: Executor::new(Arc::new(MemoryStore::new())) };
///     Ok(())
/// }
/// ```
///
/// The macros already refuse a hand-written hint on a `#[tool]` they can
/// see; this finds the rest, such as a hint set through rmcp's builder API
/// (`ToolRoute::new`, `.annotation(..)`). A wrapped tool is recognised by
/// the `_meta` entry its wrapper adds ([`TOOL_META_KEY`]); disabled routes
/// are checked too, since they may be enabled later. A tool
/// `#[idempotent(by_construction = "...")]` marks passes, and each one's
/// reason is logged (at `info`) so that it is read: [`hint_report`] lists
/// them for a reviewer. A route built by hand
/// from a wrapped tool's definition with some other handler carries that
/// entry and passes: the audit catches slips, not forgery.
pub fn audit_hints<S>(router: &ToolRouter<S>) -> Result<(), Vec<HintProblem>> {
    let mut routes: Vec<&ToolRoute<S>> = router.map.values().collect();
    routes.sort_by(|a, b| a.attr.name.cmp(&b.attr.name));
    let mut problems = Vec::new();
    for route in routes {
        let tool = &route.attr;
        let claims = tool
            .annotations
            .as_ref()
            .and_then(|a| a.idempotent_hint)
            .unwrap_or(false);
        let marker = tool.meta.as_ref().and_then(|meta| meta.get(TOOL_META_KEY));
        match marker {
            None if claims => problems.push(HintProblem::UnbackedHint {
                tool: tool.name.to_string(),
            }),
            None => {}
            Some(marker) => {
                if let Some(reason) = marker.get("byConstruction").and_then(Value::as_str) {
                    tracing::info!(
                        tool = %tool.name,
                        reason,
                        "idempotentHint backed by construction, not recorded by idem: check that the handler makes it true"
                    );
                }
                let status_tool = marker.get("statusTool").and_then(Value::as_str);
                if let Some(status_tool) = status_tool {
                    if !router.map.contains_key(status_tool) {
                        problems.push(HintProblem::MissingStatusTool {
                            tool: tool.name.to_string(),
                            status_tool: status_tool.to_owned(),
                        });
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}
