//! The demo: a card charge made safe to repeat, with no server to set up.
//!
//! Run it with `cargo run --example demo`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Answer, Caller, Executor, MemoryStore, Operation, ScopeSpec, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
    currency: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    processor_reference: String,
}

/// The stand-in processor: counts the charges it really made.
#[derive(Clone, Default)]
struct Processor {
    charges: Arc<AtomicUsize>,
}

async fn charge_card(
    exec: &Executor,
    processor: &Processor,
    caller: &Caller,
    args: &ChargeArgs,
) -> Answer<Receipt, ToolError> {
    let op = Operation {
        caller,
        tool: "charge_card",
        args,
        scope: ScopeSpec::Window(Duration::from_secs(15 * 60)),
        status_tool: "get_operation_status",
    };
    let (processor, amount_cents) = (processor.clone(), args.amount_cents);
    exec.run(op, move |ctx| async move {
        let n = processor.charges.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Receipt {
            charge_id: format!("ch_{n:04}"),
            amount_cents,
            processor_reference: ctx.reference().to_string(),
        })
    })
    .await
}

fn show(step: &str, answer: &Answer<Receipt, ToolError>) {
    println!("\n-- {step}");
    match answer {
        Answer::Executed { value, .. } => println!("   executed: {value:?}"),
        Answer::Replayed { stored, .. } => println!("   replayed (not charged again): {stored}"),
        other => println!("   {}", other.message().unwrap_or_default()),
    }
}

#[tokio::main]
async fn main() {
    let exec = Executor::new(Arc::new(MemoryStore::new()));
    let processor = Processor::default();
    let caller = Caller::new("acme", "alice");
    let args = ChargeArgs {
        card: "4242".into(),
        amount_cents: 1999,
        currency: "usd".into(),
    };

    let (first, repeat) = tokio::join!(charge_card(&exec, &processor, &caller, &args), async {
        // The host times out and retries while the charge is still running.
        tokio::time::sleep(Duration::from_millis(100)).await;
        charge_card(&exec, &processor, &caller, &args).await
    });
    show("a charge", &first);
    show("the same charge retried while it runs", &repeat);
    let replay = charge_card(&exec, &processor, &caller, &args).await;
    show("the same charge retried after it finished", &replay);

    println!(
        "\nThe processor was charged {} time(s) for 3 calls.",
        processor.charges.load(Ordering::SeqCst)
    );
}
