//! The unknown-outcome lifecycle at the executor: each test reproduces one
//! way an operation could run twice, be lost, or be described falsely, and
//! asserts on what the processor stub really did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::store::Upkeep;
use idem_runtime::{
    answer::Answer,
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, MemoryStore, ToolError,
};
use serde::{Deserialize, Serialize};

const STATUS_TOOL: &str = "get_operation_status";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
    reference: String,
}

/// A processor stand-in that behaves like a real one: idempotent by the
/// reference it is given, from the moment a request arrives. It counts the
/// requests that reach it and the charges it really makes.
#[derive(Clone, Default)]
struct Processor {
    requests: Arc<AtomicUsize>,
    charges: Arc<Mutex<HashMap<String, String>>>,
}

impl Processor {
    /// Charges actually made (one per reference at most, by construction:
    /// what the tests assert is how many references were charged).
    fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    async fn charge(&self, ctx: OperationContext) -> Result<Receipt, ToolError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let reference = ctx.reference().to_string();
        let charge_id = {
            let mut charges = self.charges.lock().unwrap();
            let next = format!("ch_{}", charges.len() + 1);
            charges.entry(reference.clone()).or_insert(next).clone()
        };
        Ok(Receipt {
            charge_id,
            reference,
        })
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

async fn charge(
    exec: &Executor,
    scope: ScopeSpec<'_>,
    args: &serde_json::Value,
    processor: &Processor,
) -> Answer<Receipt, ToolError> {
    let op = Operation {
        caller: &alice(),
        tool: "charge_card",
        args,
        scope,
        status_tool: STATUS_TOOL,
    };
    let p = processor.clone();
    exec.run(op, move |ctx| async move { p.charge(ctx).await })
        .await
}

const WINDOW: ScopeSpec<'static> = ScopeSpec::Window(Duration::from_secs(900));

/// (d) A claim whose process died (its lease ran out, maintenance not
/// running) reads as outcome unknown in the status report, not "still
/// running, ask again in a few seconds" forever.
#[tokio::test]
async fn a_lapsed_claim_reads_as_unknown_in_the_status_report() {
    let store = Arc::new(MemoryStore::new());
    let exec = Executor::new(store.clone()).with_lease(Duration::from_millis(90));
    let args = serde_json::json!({"amount_cents": 500});
    let op = Operation {
        caller: &alice(),
        tool: "charge_card",
        args: &args,
        scope: WINDOW,
        status_tool: STATUS_TOOL,
    };
    // The process "dies" mid-handler: its future is forgotten, so neither
    // its heartbeat nor its drop guard ever runs again.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let saw = seen.clone();
    let mut dying = Box::pin(exec.run(op, move |ctx| {
        *saw.lock().unwrap() = Some(ctx.reference());
        async { std::future::pending::<Result<Receipt, ToolError>>().await }
    }));
    assert!(futures::poll!(dying.as_mut()).is_pending());
    std::mem::forget(dying);
    assert!(store.list_lapsed(10).await.unwrap().is_empty(), "live");
    let reference = seen
        .lock()
        .unwrap()
        .expect("the handler started")
        .to_string();
    let live = exec.status(&alice(), &reference).await.unwrap().unwrap();
    assert_eq!(live.state, idem_runtime::store::RecordStateKind::InProgress);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = exec.status(&alice(), &reference).await.unwrap().unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::Unknown,
        "{status:?}"
    );
    assert!(
        status.next_step.contains("Do not submit it again"),
        "{status:?}"
    );
    assert!(!status.next_step.contains("still running"), "{status:?}");
}

/// (e) With a business key and a short `window`, an UNKNOWN record is kept
/// for the retention (48 h), not dropped with the window: a shipment that
/// may have happened does not run again.
#[tokio::test]
async fn a_business_key_unknown_outlives_its_window() {
    // A short lease, so that only the retention can keep the record (with
    // the default 30 s lease, the lease would outlast this test's window).
    let exec = Executor::new(Arc::new(MemoryStore::new())).with_lease(Duration::from_millis(60));
    let scope = ScopeSpec::BusinessKey {
        fields: &["order_id"],
        retention: Some(Duration::from_millis(150)),
    };
    let args = serde_json::json!({"order_id": "o-1", "address": "1 Main St"});
    let timed_out = Processor::default();
    let p = timed_out.clone();
    let op = Operation {
        caller: &alice(),
        tool: "create_shipment",
        args: &args,
        scope,
        status_tool: STATUS_TOOL,
    };
    let first: Answer<Receipt, ToolError> = exec
        .run(op, move |ctx| async move {
            p.charge(ctx).await?;
            Err(ToolError::unknown("the carrier did not answer in time"))
        })
        .await;
    assert_eq!(first.name(), "failed_unknown", "{first:?}");

    tokio::time::sleep(Duration::from_millis(400)).await;
    let p = timed_out.clone();
    let op = Operation {
        caller: &alice(),
        tool: "create_shipment",
        args: &args,
        scope,
        status_tool: STATUS_TOOL,
    };
    let again: Answer<Receipt, ToolError> = exec
        .run(op, move |ctx| async move { p.charge(ctx).await })
        .await;
    assert_eq!(again.name(), "unknown", "{again:?}");
    assert_eq!(timed_out.requests(), 1, "the carrier was asked once");
}

/// (f) Every field of a business key must be present, non-null and
/// non-empty: `{"warehouse": "w1", "order_id": ""}` would make every order
/// of the warehouse one operation. The refusal names the field.
#[tokio::test]
async fn every_business_key_field_must_be_non_empty() {
    let exec = Executor::new(Arc::new(MemoryStore::new()));
    let scope = ScopeSpec::BusinessKey {
        fields: &["warehouse", "order_id"],
        retention: None,
    };
    let processor = Processor::default();
    for (args, field) in [
        (
            serde_json::json!({"warehouse": "w1", "order_id": ""}),
            "order_id",
        ),
        (
            serde_json::json!({"warehouse": "", "order_id": "o-1"}),
            "warehouse",
        ),
        (
            serde_json::json!({"warehouse": "w1", "order_id": null}),
            "order_id",
        ),
        (serde_json::json!({"warehouse": "w1"}), "order_id"),
        (
            serde_json::json!({"warehouse": "w1", "order_id": []}),
            "order_id",
        ),
    ] {
        let answer = charge(&exec, scope, &args, &processor).await;
        let Answer::Refused { reason } = &answer else {
            panic!("{args}: {answer:?}");
        };
        assert!(reason.contains(&format!("`{field}`")), "{args}: {reason}");
    }
    assert_eq!(processor.requests(), 0, "nothing ran");
    let whole = serde_json::json!({"warehouse": "w1", "order_id": "o-1"});
    assert_eq!(
        charge(&exec, scope, &whole, &processor).await.name(),
        "executed"
    );
}

/// (g) The call is dropped while its claim is in flight, after the claim
/// landed: nothing ran under it, and the retry the caller makes runs, rather
/// than meeting the orphaned claim as "in progress" and then "unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_caller_gave_up_is_released_for_the_retry() {
    let slow_first = AtomicUsize::new(0);
    let store = FaultyStore::new(MemoryStore::new(), move |call| match call {
        Call::Claim if slow_first.fetch_add(1, Ordering::SeqCst) == 0 => {
            Fault::SlowAnswer(Duration::from_millis(300))
        }
        _ => Fault::None,
    });
    let exec = Executor::new(Arc::new(store));
    let processor = Processor::default();
    let args = serde_json::json!({"amount_cents": 500});
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        charge(&exec, WINDOW, &args, &processor),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the caller gave up while the claim was in flight"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(retry.name(), "executed", "{retry:?}");
    assert_eq!(processor.charges(), 1);
}

/// (g) The claim's answer is lost after the commit, and the store stays
/// away a while: the release of the orphan keeps trying until the store is
/// back, so the retry the answer invited runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_answer_is_released_once_the_store_is_back() {
    let (claims, releases) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let store = FaultyStore::new(MemoryStore::new(), move |call| match call {
        Call::Claim if claims.fetch_add(1, Ordering::SeqCst) == 0 => Fault::AnswerLost,
        // The store is away for the first releases.
        Call::Release if releases.fetch_add(1, Ordering::SeqCst) < 3 => Fault::Unreachable,
        _ => Fault::None,
    });
    let exec = Executor::new(Arc::new(store));
    let processor = Processor::default();
    let args = serde_json::json!({"amount_cents": 500});
    let first = charge(&exec, WINDOW, &args, &processor).await;
    assert_eq!(first.name(), "store_unavailable");
    let message = first.message().unwrap();
    assert!(message.starts_with("Nothing was executed"), "{message}");
    assert_eq!(processor.requests(), 0);

    let started = Instant::now();
    let retry = loop {
        let answer = charge(&exec, WINDOW, &args, &processor).await;
        if answer.name() != "in_progress" || started.elapsed() > Duration::from_secs(5) {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry.name(), "executed", "{retry:?}");
    assert_eq!(processor.charges(), 1);
}

/// (h) A store that is slow to answer a heartbeat never pauses the handler:
/// the renewal runs beside it, not inside its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_heartbeat_never_pauses_the_handler() {
    let store = FaultyStore::new(MemoryStore::new(), |call| match call {
        Call::Heartbeat => Fault::Delay(Duration::from_secs(3)),
        _ => Fault::None,
    });
    let exec = Executor::new(Arc::new(store)).with_lease(Duration::from_millis(90));
    let args = serde_json::json!({"amount_cents": 500});
    let op = Operation {
        caller: &alice(),
        tool: "charge_card",
        args: &args,
        scope: WINDOW,
        status_tool: STATUS_TOOL,
    };
    let started = Instant::now();
    let answer: Answer<u32, ToolError> = exec
        .run(op, |_| async {
            // Ten steps of a side effect, across several heartbeat periods.
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(1)
        })
        .await;
    assert_eq!(answer.name(), "executed");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the handler was paused by a heartbeat: {:?}",
        started.elapsed()
    );
}
