mod common;
use common::*;

#[derive(Deserialize, schemars::JsonSchema)]
pub struct RefundArgs {
    pub charge_id: String,
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Refund a charge")]
    async fn refund(&self, Parameters(args): Parameters<RefundArgs>) -> Result<String, ToolError> {
        Ok(args.charge_id)
    }
}

fn main() {}
