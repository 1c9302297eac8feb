//! Tools that may ask before their effect: `Result<Ask<T>, E>` and
//! `Ask<T>`, with a window, a business key, a task, and other arguments.
mod common;
use common::*;

use idem_runtime::{mcp::current_continuation, Ask};
use rmcp::model::ElicitationSchema;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

fn confirm() -> ElicitationSchema {
    ElicitationSchema::builder()
        .required_bool("confirm")
        .build()
        .unwrap()
}

#[derive(Clone)]
pub struct Till {
    executor: Executor,
}

impl IdempotentServer for Till {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router]
impl Till {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Ask<Json<Receipt>>, ToolError> {
        if current_continuation()
            .and_then(|c| c.elicitation("confirm"))
            .is_none()
        {
            return Ok(Ask::elicit("confirm", "Charge?", confirm()).with_state("step-1"));
        }
        Ok(Ask::Done(Json(Receipt {
            charge_id: args.card,
        })))
    }

    #[idempotent(business_key = "order_id", task = "optional")]
    #[tool(description = "Ship an order")]
    async fn ship(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Ask<String>, ToolError> {
        let _ = context.id;
        Ok(Ask::Done(args.order_id))
    }

    #[idempotent(window = "1m")]
    #[tool(description = "Ring the bell")]
    async fn ring(&self) -> Ask<CallToolResult> {
        Ask::Done(CallToolResult::success(Vec::new()))
    }
}

fn main() {
    let router = Till::tool_router();
    assert!(router.map.contains_key("get_operation_status"));
    // The output schema of `Json<Receipt>` inside `Ask` is kept.
    assert!(router.map["charge_card"].attr.output_schema.is_some());
    idem_runtime::audit_hints(&router).expect("every hint backed");
    let _ = Till {
        executor: shop().executor,
    };
}
