//! An expansion of `#[idempotent]` compiles under `deny(warnings)` and
//! `unused_qualifications`, and (through `cargo clippy --all-targets -- -D
//! warnings`) is clippy-clean: the generated code is quiet in user crates.
#![deny(warnings, unused_qualifications)]

use idem_runtime::{idempotent, Executor, IdempotentServer, MemoryStore, ToolError};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_handler, ServerHandler};
use serde::{Deserialize, Serialize};

/// Charge arguments.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The order.
    pub order_id: String,
    /// The amount.
    pub amount_cents: u64,
}

/// A receipt.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The charge.
    pub charge_id: String,
}

/// A server under every lint.
#[derive(Clone)]
pub struct Linted {
    executor: Executor,
}

impl IdempotentServer for Linted {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router]
impl Linted {
    /// Charges a card.
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card")]
    pub async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            return Err(ToolError::rejected("the amount must be positive"));
        }
        Ok(Json(Receipt {
            charge_id: format!("ch_{}", args.order_id),
        }))
    }

    /// Ships an order.
    #[idempotent(business_key = ["order_id"], window = "48h", status_tool = "status")]
    #[tool(description = "Ship", annotations(title = "Ship"))]
    pub async fn ship(&self, Parameters(args): Parameters<ChargeArgs>) -> CallToolResult {
        CallToolResult::success(vec![rmcp::model::ContentBlock::text(args.order_id)])
    }

    /// Rotates the key: no arguments.
    #[idempotent(window = "15m")]
    #[tool(description = "Rotate the key")]
    pub async fn rotate_key(&self) -> Result<String, ToolError> {
        Ok("key_2".to_owned())
    }
}

#[tool_handler]
impl ServerHandler for Linted {}

#[test]
fn the_linted_server_builds_its_router() {
    let server = Linted {
        executor: Executor::new(std::sync::Arc::new(MemoryStore::new())),
    };
    let _ = server.executor();
    // The three tools, and the status tool each names.
    let router = Linted::tool_router();
    let mut names: Vec<String> = router
        .list_all()
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "charge_card",
            "get_operation_status",
            "rotate_key",
            "ship",
            "status"
        ]
    );
}
