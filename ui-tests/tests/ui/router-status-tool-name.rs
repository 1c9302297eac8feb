mod common;
use common::*;

#[idem_runtime::tool_router(status_tool = "payment_status")]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.card }))
    }
}

fn main() {}
