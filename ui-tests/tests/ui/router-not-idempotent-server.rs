mod common;
use common::*;

/// Wrapped tools, on a server that does not say where its executor is.
pub struct Bare;

#[idem_runtime::tool_router]
impl Bare {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.card }))
    }
}

fn main() {}
