//! An MCP server over stdio whose payment tools are safe to repeat.
//!
//! Run it with `cargo run --example mcp_server` and speak MCP on stdin, or
//! point an MCP host at that command. Calls come from one local user (the
//! default caller); records live in memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::{
    audit_hints, current_reference, idempotent, Caller, Executor, IdempotentServer, MemoryStore,
    ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_handler, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The card to charge (a token, never a card number).
    card: String,
    /// The amount, in cents.
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ShipmentArgs {
    /// One shipment per order.
    order_id: String,
    address: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Shipment {
    shipment_id: String,
}

#[derive(Clone)]
struct Payments {
    executor: Executor,
    local_user: Caller,
    charges: Arc<AtomicUsize>,
}

impl IdempotentServer for Payments {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.local_user)
    }
}

#[idem_runtime::tool_router]
impl Payments {
    #[idempotent(window = "15m")]
    #[tool(
        description = "Charge a card. Safe to repeat: a repeat within 15 minutes returns the first receipt."
    )]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            return Err(ToolError::rejected("the amount must be positive"));
        }
        // A real processor would get this as its idempotency key.
        let reference = current_reference()
            .map(|r| r.to_string())
            .unwrap_or_default();
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Receipt {
            charge_id: format!("ch_{n}_{reference}"),
            amount_cents: args.amount_cents,
        }))
    }

    #[idempotent(business_key = "order_id", window = "48h")]
    #[tool(description = "Create the shipment of an order; one per order.")]
    async fn create_shipment(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Json<Shipment>, ToolError> {
        Ok(Json(Shipment {
            shipment_id: format!("sh_{}", args.order_id),
        }))
    }

    #[tool(
        description = "How many charges were really made.",
        annotations(read_only_hint = true)
    )]
    async fn count_charges(&self) -> String {
        self.charges.load(Ordering::SeqCst).to_string()
    }
}

impl Payments {
    /// Every tool the server serves, the status tool included.
    fn router() -> ToolRouter<Self> {
        // `#[idem_runtime::tool_router]` has added the status tool.
        Self::tool_router()
    }
}

#[tool_handler(router = Self::router())]
impl ServerHandler for Payments {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Refuse to start if any tool claims idempotentHint without a wrapper.
    if let Err(problems) = audit_hints(&Payments::router()) {
        for problem in &problems {
            eprintln!("{problem}");
        }
        return Err("a tool's idempotentHint is not backed by #[idempotent]".into());
    }
    let server = Payments {
        executor: Executor::new(Arc::new(MemoryStore::new())),
        local_user: Caller::new("local", "stdio"),
        charges: Arc::new(AtomicUsize::new(0)),
    };
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
