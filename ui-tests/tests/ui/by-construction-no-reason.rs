mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(by_construction)]
    #[tool(description = "Set a card's nickname")]
    async fn set_nickname(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<String, ToolError> {
        Ok(args.card)
    }
}

fn main() {}
