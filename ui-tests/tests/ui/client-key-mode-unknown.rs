mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m", client_key = "always")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.card }))
    }
}

fn main() {}
