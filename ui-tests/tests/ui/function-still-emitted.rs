mod common;
use common::*;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m", ttl = "1h")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt { charge_id: args.card }))
    }
}

fn main() {
    // The attribute is wrong, yet the method, its tool metadata and the
    // router all exist: the only error is the attribute's.
    let shop = shop();
    let _future = shop.charge_card(Parameters(ChargeArgs {
        card: "4242".to_owned(),
        amount_cents: 100,
    }));
    let _tool = Shop::charge_card_tool_attr();
    let _router = Shop::tool_router();
}
