use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    executor::{Operation, ScopeSpec},
    follow_on,
    follow_ons::{follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers},
    Caller, Executor, MemoryStore, ToolError,
};
use serde_json::json;

#[tokio::main]
async fn main() {
    let store = Arc::new(MemoryStore::new());

    // The dispatcher: each follow-on at least once, with a key the mailer dedupes by.
    let handlers = FollowOnHandlers::new().on(
        "send_receipt",
        follow_on_fn(|follow_on| async move {
            println!(
                "mail {} (run {}, key {})",
                follow_on.payload, follow_on.run, follow_on.downstream_key
            );
            Ok(())
        }),
    );
    // A store that keeps no follow-ons is refused here, not at the first charge.
    let dispatcher = FollowOnDispatcher::spawn(store.clone(), handlers, FollowOnConfig::default())
        .expect("MemoryStore keeps follow-ons");

    // A wrapped handler declares the follow-on; in an #[idempotent] tool it is the same call.
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
    dispatcher.stop().await;
}
