//! A tool with a side effect and no arguments is wrapped: it is keyed on
//! the caller and the tool within the window.
mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Rotate the API key")]
    async fn rotate_api_key(&self) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt {
            charge_id: "key_2".to_owned(),
        }))
    }

    #[idempotent(window = "1h")]
    #[tool(description = "Flush the cache")]
    async fn flush_cache(
        &self,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> String {
        let _ = context.id;
        "flushed".to_owned()
    }
}

fn main() {
    let router = Shop::tool_router();
    assert!(router.get("rotate_api_key").is_some());
}
