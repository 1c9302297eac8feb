//! The impl-level macro's options, and the status tools it adds to the
//! router it generates.
mod common;
use common::*;

use idem_runtime as renamed_idem;

/// One status tool per name the wrapped tools give; a tool of that name the
/// impl has itself is kept.
#[idem_runtime::tool_router(router = shop_router, vis = "pub(crate)")]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt {
            charge_id: args.card,
        }))
    }

    #[idempotent(business_key = ["order_id", "customer.id"], status_tool = "shipment_status")]
    #[tool(description = "Create a shipment")]
    async fn ship(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        Ok(Json(Receipt {
            charge_id: args.order_id,
        }))
    }

    #[tool(
        description = "The shop's own status tool",
        annotations(read_only_hint = true)
    )]
    async fn shipment_status(&self) -> String {
        "shipped".to_owned()
    }
}

/// `status_tool = false`, with rmcp's own attribute below carrying rmcp's
/// options.
#[idem_runtime::tool_router(status_tool = false)]
#[rmcp::tool_router(router = bare_router)]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Refund a charge")]
    async fn refund(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<String, ToolError> {
        Ok(args.card)
    }
}

/// `server_handler`: the `ServerHandler` written for it serves the router
/// with the status tool.
pub struct Served {
    executor: Executor,
}

impl IdempotentServer for Served {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router(server_handler)]
impl Served {
    #[idempotent(window = "15m")]
    #[tool(description = "Rotate the API key")]
    async fn rotate_api_key(&self) -> Result<String, ToolError> {
        Ok("key_2".to_owned())
    }
}

/// The status tool reached through the path the tools give.
pub struct Renamed {
    executor: Executor,
}

impl IdempotentServer for Renamed {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router]
impl Renamed {
    #[idempotent(window = "15m", crate = "renamed_idem", status_tool = "check")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<String, ToolError> {
        Ok(args.card)
    }
}

fn names<S: Send + Sync + 'static>(
    router: rmcp::handler::server::router::tool::ToolRouter<S>,
) -> Vec<String> {
    let mut names: Vec<String> = router
        .list_all()
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    names.sort_unstable();
    names
}

fn serves<H: rmcp::ServerHandler>() {}

fn main() {
    assert_eq!(
        names(Shop::shop_router()),
        [
            "charge_card",
            "get_operation_status",
            "ship",
            "shipment_status"
        ]
    );
    let own = Shop::shop_router().get("shipment_status").cloned().unwrap();
    assert_eq!(
        own.description.as_deref(),
        Some("The shop's own status tool")
    );
    assert_eq!(names(Shop::bare_router()), ["refund"]);
    serves::<Served>();
    assert_eq!(
        names(Served::tool_router()),
        ["get_operation_status", "rotate_api_key"]
    );
    assert_eq!(names(Renamed::tool_router()), ["charge_card", "check"]);
    let _ = Served {
        executor: shop().executor,
    };
    let _ = Renamed {
        executor: shop().executor,
    };
}
