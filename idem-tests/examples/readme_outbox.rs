use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    executor::{Operation, ScopeSpec},
    follow_on,
    outbox::{job_fn, JobHandlers, Outbox, OutboxConfig},
    Caller, Executor, MemoryStore, ToolError,
};
use serde_json::json;

#[tokio::main]
async fn main() {
    let store = Arc::new(MemoryStore::new());

    // The dispatcher: each job at least once, with a key the mailer dedupes by.
    let handlers = JobHandlers::new().on(
        "send_receipt",
        job_fn(|job| async move {
            println!(
                "mail {} (run {}, key {})",
                job.payload, job.run, job.downstream_key
            );
            Ok(())
        }),
    );
    // A store that keeps no follow-on jobs is refused here, not at the first charge.
    let outbox = Outbox::spawn(store.clone(), handlers, OutboxConfig::default())
        .expect("MemoryStore keeps follow-on jobs");

    // A wrapped handler declares the job; in an #[idempotent] tool it is the same call.
    let executor = Executor::new(store);
    let caller = Caller::new("acme", "alice");
    let args = json!({ "card": "4242", "amount_cents": 1999 });
    let charge = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    executor
        .run(charge, |_context| async {
            // ... charge the card, then queue the receipt (nothing is sent here):
            follow_on("send_receipt", &json!({ "to": "alice@example.com" }))
                .map_err(|e| ToolError::unknown(e.to_string()))?;
            Ok::<_, ToolError>("charged".to_owned())
        })
        .await;

    tokio::time::sleep(Duration::from_millis(1500)).await;
    outbox.stop().await;
}
