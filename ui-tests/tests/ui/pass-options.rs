//! Every option, every supported return type, and merging into what the
//! user wrote in `#[tool(...)]`.
mod common;
use common::*;

use idem_runtime as renamed_idem;
use rmcp::model::{ContentBlock, MetaObject};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

#[idem_runtime::tool_router(router = payments_router, vis = "pub(crate)")]
impl Shop {
    #[idempotent(window = "1h30m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            return Err(ToolError::rejected("amount must be positive"));
        }
        let _reference = idem_runtime::current_reference();
        Ok(Json(Receipt {
            charge_id: args.card,
        }))
    }

    #[idempotent(
        business_key = "order_id",
        window = "7d",
        status_tool = "shipment_status"
    )]
    #[tool(
        name = "ship",
        description = "Create a shipment",
        annotations(title = "Ship", destructive_hint = false, idempotent_hint = true),
        meta = MetaObject::new()
    )]
    async fn create_shipment(
        &self,
        Parameters(ShipmentArgs { order_id, customer }): Parameters<ShipmentArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _ = context.id;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "{order_id} for {}",
            customer.id
        ))]))
    }

    #[idempotent(business_key = ["order_id", "customer"], crate = "renamed_idem")]
    #[renamed_idem::__private::rmcp::tool(description = "Reserve stock")]
    async fn reserve(&self, Parameters(args): Parameters<ShipmentArgs>) -> Result<String, String> {
        Ok(args.order_id)
    }

    #[idempotent(window = "90s")]
    #[tool(description = "Leave a note")]
    async fn note(&self, Parameters(args): Parameters<ChargeArgs>) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::text(args.card)])
    }

    #[idempotent(window = "48h")]
    #[tool(description = "Quote")]
    async fn quote(&self, Parameters(args): Parameters<ChargeArgs>) -> Json<Receipt> {
        Json(Receipt {
            charge_id: args.card,
        })
    }

    #[idempotent(window = "2d")]
    #[tool(description = "Echo", output_schema = rmcp::handler::server::tool::schema_for_output::<Receipt>())]
    async fn echo(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<String, rmcp::ErrorData> {
        Ok(args.card)
    }

    #[tool(
        description = "Count",
        annotations(read_only_hint = true, idempotent_hint = false)
    )]
    async fn count(&self) -> String {
        "0".to_owned()
    }
}

/// Also accepted: above rmcp's own `#[tool_router]`.
struct Other;

impl IdempotentServer for Other {
    fn executor(&self) -> &Executor {
        unimplemented!()
    }
}

#[idem_runtime::tool_router]
#[rmcp::tool_router]
impl Other {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt {
            charge_id: args.card,
        }))
    }
}

fn main() {
    let tools = Shop::payments_router().list_all();
    // Seven tools, and the two status tools they name.
    assert_eq!(tools.len(), 9);
    let _ = Other::tool_router();
}
