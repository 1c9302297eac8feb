mod common;
use common::*;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct RefundArgs {
    pub order_id: Option<String>,
    pub amount_cents: u64,
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(business_key = "order_id")]
    #[tool(description = "Refund an order")]
    async fn refund(&self, Parameters(args): Parameters<RefundArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.order_id.unwrap_or_default() }))
    }
}

fn main() {}
