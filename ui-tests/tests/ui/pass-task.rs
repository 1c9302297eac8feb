//! `task = "optional"` on a `Clone` server: with the parameters alone, with
//! other arguments beside them, on a business key, with none at all; and
//! `task = "never"`.
mod common;
use common::*;

use rmcp::service::RequestContext;
use rmcp::RoleServer;

#[derive(Clone)]
struct Payments {
    executor: Executor,
}

impl IdempotentServer for Payments {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router]
impl Payments {
    #[idempotent(window = "15m", task = "optional")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if let Some(cancel) = idem_runtime::mcp::current_cancellation() {
            if cancel.is_cancelled() {
                return Err(ToolError::rejected("cancelled before the charge"));
            }
        }
        let _reference = idem_runtime::current_reference();
        Ok(Json(Receipt {
            charge_id: args.card,
        }))
    }

    #[idempotent(
        business_key = "order_id",
        task = "optional",
        status_tool = "shipment_status"
    )]
    #[tool(description = "Create a shipment")]
    async fn create_shipment(
        &self,
        Parameters(ShipmentArgs { order_id, customer }): Parameters<ShipmentArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _ = context.id;
        Ok(CallToolResult::success(vec![
            rmcp::model::ContentBlock::text(format!("{order_id} for {}", customer.id)),
        ]))
    }

    #[idempotent(window = "1h", task = "optional")]
    #[tool(description = "Rotate the key")]
    async fn rotate(&self) -> Result<String, ToolError> {
        Ok("rotated".to_owned())
    }

    #[idempotent(window = "1h", task = "never")]
    #[tool(description = "Quote")]
    async fn quote(&self, Parameters(args): Parameters<ChargeArgs>) -> Json<Receipt> {
        Json(Receipt {
            charge_id: args.card,
        })
    }
}

fn main() {
    let server = Payments {
        executor: Executor::new(std::sync::Arc::new(MemoryStore::new())),
    };
    let router = Payments::tool_router();
    assert!(idem_runtime::audit_hints(&router).is_ok());
    let _ = server;
}
