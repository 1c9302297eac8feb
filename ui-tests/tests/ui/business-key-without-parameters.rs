mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(business_key = "key_id")]
    #[tool(description = "Rotate the API key")]
    async fn rotate_api_key(&self) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: "key_2".to_owned() }))
    }
}

fn main() {}
