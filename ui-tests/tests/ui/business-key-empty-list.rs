mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(business_key = [])]
    #[tool(description = "Create a shipment")]
    async fn create_shipment(&self, Parameters(args): Parameters<ShipmentArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.order_id }))
    }
}

fn main() {}
