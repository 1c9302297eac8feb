mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: "ch_1".to_owned() }))
    }
}

fn main() {}
