use std::sync::Arc;

use idem_runtime::{
    audit_hints, current_reference, idempotent, Caller, Executor, IdempotentServer, SqliteStore,
    ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, ServiceExt};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The card to charge (a token, never a card number).
    card: String,
    /// The amount, in cents.
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Clone)]
struct Payments {
    executor: Executor,
    local_user: Caller,
}

impl IdempotentServer for Payments {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    // A stdio server serves one local user. Over HTTP, leave this out and
    // have your auth layer put an idem_runtime::Caller in the request.
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.local_user)
    }
}

// Instead of rmcp's #[tool_router]: it adds the status tool
// (get_operation_status) and, with server_handler, serves this router.
#[idem_runtime::tool_router(server_handler)]
impl Payments {
    #[idempotent(window = "15m")] // above rmcp's #[tool]
    #[tool(description = "Charge a card. Safe to repeat within 15 minutes.")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            // Nothing happened: the claim is released, a corrected call runs.
            return Err(ToolError::rejected("the amount must be positive"));
        }
        // Give the processor the reference as its own idempotency key.
        let reference = current_reference().expect("inside #[idempotent]");
        processor_charge(&args, &reference.to_string())
            .await
            .map(Json)
    }
}

/// Your processor client. Return `ToolError::unknown(..)` when the outcome
/// is unknown (a timeout): the call is then never run again until reconciled.
async fn processor_charge(args: &ChargeArgs, reference: &str) -> Result<Receipt, ToolError> {
    Ok(Receipt {
        charge_id: format!("ch_{reference}"),
        amount_cents: args.amount_cents,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Refuse to start if a hint on the served router is not backed.
    if let Err(problems) = audit_hints(&Payments::tool_router()) {
        return Err(format!("refusing to start: {problems:?}").into());
    }
    let store = Arc::new(SqliteStore::open("idem.sqlite3").await?);
    let server = Payments {
        executor: Executor::new(store),
        local_user: Caller::new("local", "me"),
    };
    server
        .serve(rmcp::transport::stdio())
        .await?
        .waiting()
        .await?;
    Ok(())
}
