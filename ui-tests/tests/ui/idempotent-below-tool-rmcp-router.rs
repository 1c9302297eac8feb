mod common;
use common::*;

#[rmcp::tool_router]
impl Shop {
    #[tool(description = "Charge a card")]
    #[idempotent(window = "15m")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.card }))
    }
}

fn main() {}
