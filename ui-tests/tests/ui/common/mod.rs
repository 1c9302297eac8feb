//! What every ui case shares: a server, its parameter and result types.
#![allow(dead_code, unused_imports)]

pub use idem_runtime::{idempotent, Executor, IdempotentServer, MemoryStore, ToolError};
pub use rmcp::handler::server::wrapper::{Json, Parameters};
pub use rmcp::model::CallToolResult;
pub use rmcp::tool;
pub use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    pub card: String,
    pub amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentArgs {
    pub order_id: String,
    pub customer: Customer,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Customer {
    pub id: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    pub charge_id: String,
}

pub struct Shop {
    pub executor: Executor,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

pub fn shop() -> Shop {
    Shop {
        executor: Executor::new(std::sync::Arc::new(MemoryStore::new())),
    }
}
