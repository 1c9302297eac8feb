//! The executor against MemoryStore, with a processor stub that counts its
//! invocations: every assertion is about how often the side effect ran.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::store::{Inspect, Upkeep};
use idem_runtime::{
    answer::{Answer, Recording},
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};
use serde::{Deserialize, Serialize};

const STATUS_TOOL: &str = "get_operation_status";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Charge {
    card: String,
    amount_cents: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    processor_reference: String,
}

/// A payment processor stand-in: counts charges, takes `delay` per charge.
#[derive(Clone, Default)]
struct Processor {
    charges: Arc<AtomicUsize>,
    delay: Duration,
}

impl Processor {
    fn sleeping(delay: Duration) -> Self {
        Processor {
            charges: Arc::default(),
            delay,
        }
    }

    fn count(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    async fn charge(&self, ctx: OperationContext, args: Charge) -> Result<Receipt, ToolError> {
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        Ok(Receipt {
            charge_id: format!("ch_{n}"),
            amount_cents: args.amount_cents,
            processor_reference: ctx.reference().to_string(),
        })
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn visa(amount_cents: u64) -> Charge {
    Charge {
        card: "4242".into(),
        amount_cents,
    }
}

async fn charge(
    exec: &Executor,
    caller: &Caller,
    args: &Charge,
    processor: &Processor,
) -> Answer<Receipt, ToolError> {
    let op = Operation {
        caller,
        tool: "charge_card",
        args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    let p = processor.clone();
    let a = args.clone();
    exec.run(op, move |ctx| async move { p.charge(ctx, a).await })
        .await
}

fn spawn_charge(
    exec: &Executor,
    args: Charge,
    processor: &Processor,
) -> tokio::task::JoinHandle<Answer<Receipt, ToolError>> {
    let (exec, processor) = (exec.clone(), processor.clone());
    tokio::spawn(async move { charge(&exec, &alice(), &args, &processor).await })
}

/// A MemoryStore whose clock is tokio's (paused in these tests), so leases
/// run out exactly when the test's timers say.
fn on_tokio_clock() -> Arc<MemoryStore> {
    let (origin, base) = (tokio::time::Instant::now(), std::time::SystemTime::now());
    Arc::new(MemoryStore::with_clock(move || {
        base + (tokio::time::Instant::now() - origin)
    }))
}

fn memory() -> Executor {
    Executor::new(Arc::new(MemoryStore::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_identical_calls_charge_once() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::from_secs(2));
    let first = spawn_charge(&exec, visa(500), &processor);
    // Let the first claim land, then fire the repeat while it sleeps.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = spawn_charge(&exec, visa(500), &processor);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());

    assert_eq!(processor.count(), 1, "the processor was charged once");
    let Answer::Executed {
        value,
        reference,
        recording,
    } = &first
    else {
        panic!("first call should run: {first:?}");
    };
    assert_eq!(*recording, Recording::Stored);
    assert_eq!(value.processor_reference, reference.to_string());
    match &second {
        Answer::InProgress {
            reference: r,
            status_tool,
            retry_after,
        } => {
            assert_eq!(r, reference);
            assert_eq!(status_tool, STATUS_TOOL);
            // 200 ms into a tool with no history: the shortest hint.
            assert_eq!(*retry_after, Duration::from_secs(1));
        }
        other => panic!("the repeat should be told it is in flight, got {other:?}"),
    }
    let message = second.message().unwrap();
    assert!(message.contains(&reference.to_string()), "{message}");
    assert!(
        message.contains("do not submit it again") || message.contains("Do not submit it again")
    );
    assert!(message.contains(STATUS_TOOL), "{message}");
}

fn retry_after(answer: &Answer<Receipt, ToolError>) -> Duration {
    match answer {
        Answer::InProgress { retry_after, .. } => *retry_after,
        other => panic!("a repeat while it runs is in progress, not {other:?}"),
    }
}

/// An in-progress answer tells a repeat to ask again when the call should
/// be done, not when its 30 s lease would run out (a model waits as told):
/// 300 ms into a call of a tool whose recent calls took 400 ms, 1 s, on the
/// replica that runs it and on another that shares the store (which knows
/// the call's claim time from the record, and no history).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_is_told_to_ask_again_when_the_call_should_be_done() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let (exec, replica) = (Executor::new(store.clone()), Executor::new(store));
    let processor = Processor::sleeping(Duration::from_millis(400));
    for amount in 1..=3 {
        let ran = charge(&exec, &alice(), &visa(amount), &processor).await;
        assert_eq!(ran.name(), "executed", "{ran:?}");
    }
    let first = spawn_charge(&exec, visa(500), &processor);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let here = charge(&exec, &alice(), &visa(500), &processor).await;
    let there = charge(&replica, &alice(), &visa(500), &processor).await;
    assert_eq!(retry_after(&here), Duration::from_secs(1), "{here:?}");
    assert_eq!(retry_after(&there), Duration::from_secs(1), "{there:?}");
    assert!(
        here.message().unwrap().contains("ask again within 1 s"),
        "{here:?}"
    );
    assert_eq!(first.await.unwrap().name(), "executed");
    assert_eq!(processor.count(), 4, "the repeats ran nothing");
}

/// A tool with no history: the hint is as long again as the call has run
/// (2.2 s into a 3 s call, 2.2 s), never the lease's remainder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_of_a_tool_without_history_waits_as_long_again() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let (exec, replica) = (Executor::new(store.clone()), Executor::new(store));
    let processor = Processor::sleeping(Duration::from_secs(3));
    let first = spawn_charge(&exec, visa(500), &processor);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    for (who, answer) in [
        (
            "here",
            charge(&exec, &alice(), &visa(500), &processor).await,
        ),
        (
            "there",
            charge(&replica, &alice(), &visa(500), &processor).await,
        ),
    ] {
        let hint = retry_after(&answer);
        // About 2.2 s: the claim lands a moment after the spawn, and a
        // loaded machine stretches the sleep; far from the lease's 27.8 s.
        assert!(
            hint >= Duration::from_millis(1800) && hint < Duration::from_secs(8),
            "{who}: {hint:?}"
        );
    }
    assert_eq!(first.await.unwrap().name(), "executed");
    assert_eq!(processor.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_completion_replays_the_stored_response() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::from_secs(2));
    let first = charge(&exec, &alice(), &visa(500), &processor).await;
    let second = charge(&exec, &alice(), &visa(500), &processor).await;
    assert_eq!(processor.count(), 1);
    let Answer::Executed {
        value: original, ..
    } = first
    else {
        panic!("{first:?}")
    };
    let Answer::Replayed { value, stored, .. } = second else {
        panic!("{second:?}")
    };
    assert_eq!(
        stored,
        serde_json::to_string(&original).unwrap(),
        "byte for byte"
    );
    assert_eq!(value, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_identical_calls_charge_once() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::from_secs(2));
    let calls: Vec<_> = (0..100)
        .map(|_| spawn_charge(&exec, visa(700), &processor))
        .collect();
    let mut executed = 0;
    let mut in_flight = 0;
    for call in calls {
        match call.await.unwrap() {
            Answer::Executed { .. } => executed += 1,
            Answer::InProgress { .. } => in_flight += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(processor.count(), 1);
    assert_eq!((executed, in_flight), (1, 99));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_arguments_or_other_callers_are_other_operations() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::ZERO);
    charge(&exec, &alice(), &visa(500), &processor).await;
    charge(&exec, &alice(), &visa(501), &processor).await;
    charge(&exec, &Caller::new("acme", "bob"), &visa(500), &processor).await;
    charge(
        &exec,
        &Caller::new("globex", "alice"),
        &visa(500),
        &processor,
    )
    .await;
    assert_eq!(processor.count(), 4);
}

/// MemoryStore with one fault on the calls of one kind (or on the first
/// only): the completion write failing (the store went away after the side
/// effect), or the first claim landing but answering with an error (the
/// connection dropped after the commit).
fn faulty(fault: Call, how: Fault, first_only: bool) -> FaultyStore<MemoryStore> {
    let seen = AtomicUsize::new(0);
    FaultyStore::new(MemoryStore::new(), move |call| {
        if call == fault && (!first_only || seen.fetch_add(1, Ordering::SeqCst) == 0) {
            how
        } else {
            Fault::None
        }
    })
}

/// Every call fails: the database is unreachable.
fn unreachable() -> FaultyStore<MemoryStore> {
    FaultyStore::new(MemoryStore::new(), |_| Fault::Unreachable)
}

/// The handler of `Executor::run` reads its reference as a tool's body
/// does (`current_reference`), the same one the context carries and the
/// answer names; outside a handler there is none.
#[tokio::test]
async fn the_handler_of_run_reads_its_reference_as_a_tool_does() {
    let exec = memory();
    assert_eq!(idem_runtime::current_reference(), None);
    let op = Operation {
        caller: &alice(),
        tool: "charge_card",
        args: &visa(1200),
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    let answer: Answer<(String, String), ToolError> = exec
        .run(op, |ctx| async move {
            let read = idem_runtime::current_reference().expect("inside the handler");
            Ok((read.to_string(), ctx.reference().to_string()))
        })
        .await;
    let reference = answer.reference().expect("a reference").to_string();
    let Answer::Executed { value, .. } = answer else {
        panic!("executed: {answer:?}");
    };
    assert_eq!(value, (reference.clone(), reference));
    assert_eq!(idem_runtime::current_reference(), None);
}

#[tokio::test]
async fn an_unreachable_store_fails_closed() {
    let exec = Executor::new(Arc::new(unreachable()));
    let processor = Processor::sleeping(Duration::ZERO);
    let answer = charge(&exec, &alice(), &visa(500), &processor).await;
    assert_eq!(processor.count(), 0, "the processor was never called");
    assert!(
        matches!(answer, Answer::StoreUnavailable { .. }),
        "{answer:?}"
    );
    let message = answer.message().unwrap();
    assert!(message.starts_with("Nothing was executed"), "{message}");
}

#[tokio::test]
async fn a_failed_completion_write_still_returns_the_real_result() {
    let store = Arc::new(faulty(Call::Complete, Fault::Unreachable, false));
    let exec = Executor::new(store.clone());
    let processor = Processor::sleeping(Duration::ZERO);
    let first = charge(&exec, &alice(), &visa(500), &processor).await;
    let Answer::Executed {
        value,
        recording,
        reference,
    } = first
    else {
        panic!("{first:?}")
    };
    assert_eq!(recording, Recording::Failed);
    assert_eq!(value.amount_cents, 500);
    // The record stays claimed: a repeat does not charge again.
    let again = charge(&exec, &alice(), &visa(500), &processor).await;
    assert!(matches!(again, Answer::InProgress { .. }), "{again:?}");
    assert_eq!(processor.count(), 1);
    let status = exec
        .status(&alice(), &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::InProgress
    );
}

async fn run_with(
    exec: &Executor,
    processor: &Processor,
    outcome: Result<(), ToolError>,
) -> Answer<Receipt, ToolError> {
    let p = processor.clone();
    let caller = alice();
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &visa(900),
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    exec.run(op, move |ctx| async move {
        let receipt = p.charge(ctx, visa(900)).await?;
        outcome.map(|()| receipt)
    })
    .await
}

#[tokio::test]
async fn a_rejected_call_releases_so_a_corrected_call_runs() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::ZERO);
    let first = run_with(
        &exec,
        &processor,
        Err(ToolError::rejected("The card was declined.")),
    )
    .await;
    assert_eq!(first.name(), "rejected");
    let message = first.message().unwrap();
    assert!(message.contains("The card was declined.") && message.contains("Nothing was executed"));
    let second = run_with(&exec, &processor, Ok(())).await;
    assert!(matches!(second, Answer::Executed { .. }), "{second:?}");
    assert_eq!(processor.count(), 2, "the corrected call ran");
}

#[tokio::test]
async fn an_unknown_outcome_is_never_run_again() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::ZERO);
    let first = run_with(
        &exec,
        &processor,
        Err(ToolError::unknown("The processor timed out.")),
    )
    .await;
    assert_eq!(first.name(), "failed_unknown");
    let reference = first.reference().unwrap();
    let again = run_with(&exec, &processor, Ok(())).await;
    match &again {
        Answer::Unknown {
            reference: r, note, ..
        } => {
            assert_eq!(*r, reference);
            assert_eq!(note, "The processor timed out.");
        }
        other => panic!("{other:?}"),
    }
    assert!(again.message().unwrap().contains(STATUS_TOOL));
    assert_eq!(processor.count(), 1);
    let status = exec
        .status(&alice(), &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, idem_runtime::store::RecordStateKind::Unknown);
}

#[tokio::test]
async fn an_unclassified_error_counts_as_unknown() {
    let exec = memory();
    let calls = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let calls = calls.clone();
        let op = Operation {
            caller: &alice(),
            tool: "send_message",
            args: &serde_json::json!({"to": "bob", "text": "hi"}),
            scope: ScopeSpec::Window(Duration::from_secs(60)),
            status_tool: STATUS_TOOL,
        };
        let answer: Answer<String, String> = exec
            .run(op, move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<String, String>("connection reset by peer".into())
            })
            .await;
        assert!(
            matches!(answer, Answer::Failed { .. } | Answer::Unknown { .. }),
            "{answer:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_leaves_the_record_unknown() {
    let exec = memory();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut answers = Vec::new();
    for _ in 0..2 {
        let calls = calls.clone();
        let op = Operation {
            caller: &alice(),
            tool: "ship",
            args: &serde_json::json!({"parcel": 1}),
            scope: ScopeSpec::Window(Duration::from_secs(60)),
            status_tool: STATUS_TOOL,
        };
        let answer: Answer<String, ToolError> = exec
            .run(op, move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if calls.load(Ordering::SeqCst) > 0 {
                    panic!("carrier client bug");
                }
                Ok("never".to_owned())
            })
            .await;
        answers.push(answer);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    match &answers[0] {
        Answer::Unknown { note, .. } => assert!(note.contains("carrier client bug"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(answers[1], Answer::Unknown { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_the_record_unknown() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::from_secs(30));
    let call = spawn_charge(&exec, visa(100), &processor);
    tokio::time::sleep(Duration::from_millis(200)).await;
    call.abort();
    let _ = call.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = charge(
        &exec,
        &alice(),
        &visa(100),
        &Processor::sleeping(Duration::ZERO),
    )
    .await;
    match &again {
        Answer::Unknown { note, .. } => assert!(note.contains("cancelled"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(processor.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_handler_renews_its_lease() {
    let exec = memory().with_lease(Duration::from_millis(300));
    let processor = Processor::sleeping(Duration::from_millis(1500));
    let first = spawn_charge(&exec, visa(42), &processor);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Well past the first lease: without a heartbeat this would say UNKNOWN.
    let repeat = charge(&exec, &alice(), &visa(42), &processor).await;
    assert!(matches!(repeat, Answer::InProgress { .. }), "{repeat:?}");
    assert!(matches!(
        first.await.unwrap(),
        Answer::Executed {
            recording: Recording::Stored,
            ..
        }
    ));
    assert_eq!(processor.count(), 1);
}

/// A claim that took effect but whose answer came late (a slow server, a
/// busy runtime) still gets its first heartbeat a third of a lease after the
/// claim was sent. Counted from the answer, the first heartbeat came after
/// the store's lease (counted from the claim) had run out, and a sweep in
/// between would call a live charge UNKNOWN.
#[tokio::test(start_paused = true)]
async fn a_late_claim_answer_does_not_delay_the_first_heartbeat() {
    let lease = Duration::from_millis(300);
    let memory = on_tokio_clock();
    let slow = {
        let memory = memory.clone();
        FaultyStore::new(memory, |call| match call {
            Call::Claim => Fault::SlowAnswer(Duration::from_millis(240)),
            _ => Fault::None,
        })
    };
    let exec = Executor::new(Arc::new(slow)).with_lease(lease);
    let processor = Processor::sleeping(Duration::from_millis(1000));
    let first = spawn_charge(&exec, visa(42), &processor);
    // The claim landed at 0 (lease until 300) and its answer came at 240.
    // At 320 the lease must have been renewed.
    tokio::time::sleep(Duration::from_millis(320)).await;
    let lapsed = memory.list_lapsed(10).await.unwrap();
    assert!(
        lapsed.is_empty(),
        "a running charge's lease ran out: {lapsed:?}"
    );
    assert!(matches!(
        first.await.unwrap(),
        Answer::Executed {
            recording: Recording::Stored,
            ..
        }
    ));
    assert_eq!(processor.count(), 1);
}

/// A claim whose answer comes only after its lease ran out may already have
/// been swept, reconciled and taken over by a repeat: the handler does not
/// start under it. The claim is released (nothing ran), the caller is told
/// nothing ran and to call again, and that call runs.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_its_lease_ran_out_runs_nothing() {
    let lease = Duration::from_millis(300);
    let memory = on_tokio_clock();
    let claims = Arc::new(AtomicUsize::new(0));
    let slow = {
        let claims = claims.clone();
        FaultyStore::new(memory.clone(), move |call| match call {
            // The first claim's answer comes 400 ms after it landed.
            Call::Claim if claims.fetch_add(1, Ordering::SeqCst) == 0 => {
                Fault::SlowAnswer(Duration::from_millis(400))
            }
            _ => Fault::None,
        })
    };
    let exec = Executor::new(Arc::new(slow)).with_lease(lease);
    let processor = Processor::sleeping(Duration::from_millis(50));
    let late = charge(&exec, &alice(), &visa(7), &processor).await;
    match &late {
        Answer::StoreUnavailable { error } => {
            assert!(error.to_string().contains("lease"), "{error}")
        }
        other => panic!("a late claim ran its handler: {other:?}"),
    }
    assert_eq!(processor.count(), 0, "nothing ran under the late claim");
    // The release runs in the background.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let again = charge(&exec, &alice(), &visa(7), &processor).await;
    assert!(
        matches!(
            again,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(processor.count(), 1);
}

/// A claim its caller gave up on, which the store applies later anyway (a
/// statement that waited on a lock): the caller was told nothing ran, so
/// the claim is retracted once it lands. A repeat that meets it before is
/// told it is in progress, with a retry-after that ends within two leases
/// of the first call's claim; the retry after it runs the charge, once,
/// and nothing ever reads as unknown.
#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_after_its_caller_gave_up_is_retracted() {
    let lease = Duration::from_millis(3_000);
    let memory = on_tokio_clock();
    let (claims, releases) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let store = {
        let (claims, releases) = (claims.clone(), releases.clone());
        FaultyStore::new(memory.clone(), move |call| match call {
            Call::Claim if claims.fetch_add(1, Ordering::SeqCst) == 0 => Fault::LandsLate {
                gave_up: Duration::from_millis(1_000),
                lands: Duration::from_millis(2_500),
            },
            Call::Release => {
                releases.fetch_add(1, Ordering::SeqCst);
                Fault::None
            }
            _ => Fault::None,
        })
    };
    let exec = Executor::new(Arc::new(store)).with_lease(lease);
    let processor = Processor::sleeping(Duration::from_millis(50));
    let sent = tokio::time::Instant::now();
    let first = charge(&exec, &alice(), &visa(9), &processor).await;
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    // Just after the claim landed, the repeats begin.
    tokio::time::sleep_until(sent + Duration::from_millis(2_520)).await;
    let bound = sent + lease * 2;
    loop {
        let answer = charge(&exec, &alice(), &visa(9), &processor).await;
        let now = tokio::time::Instant::now();
        match answer {
            Answer::Executed { .. } => break,
            Answer::InProgress { retry_after, .. } => {
                assert!(
                    now + retry_after <= bound,
                    "told to come back {retry_after:?} after {:?}, past the bound of two leases",
                    now - sent
                );
                tokio::time::sleep(retry_after).await;
            }
            other => panic!(
                "{:?} after the first call was told nothing ran: {other:?}",
                now - sent
            ),
        }
    }
    assert_eq!(processor.count(), 1);
    // Long after: one record, the charge's, and the watch has ended.
    tokio::time::sleep(lease * 10).await;
    let records = memory
        .list_records(&idem_runtime::store::RecordFilter::default())
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].state.name(), "COMPLETED");
    let sent_releases = releases.load(Ordering::SeqCst);
    assert!(
        (2..=16).contains(&sent_releases),
        "the watch of one unconfirmed claim sent {sent_releases} releases"
    );
}

/// A claim answered slowly, after its first heartbeat was due, may have
/// been swept meanwhile by a replica whose clock runs ahead (within the
/// bound): the handler must not start under a record already UNKNOWN, whose
/// settle period counts from the mark, before its request left. The claim
/// is confirmed by a heartbeat first; refused, nothing runs, the caller is
/// told so, and the retry runs once.
#[tokio::test(start_paused = true)]
async fn a_slow_claim_swept_meanwhile_runs_nothing() {
    let lease = Duration::from_millis(3_000);
    let memory = on_tokio_clock();
    let claims = Arc::new(AtomicUsize::new(0));
    let slow = {
        let claims = claims.clone();
        FaultyStore::new(memory.clone(), move |call| match call {
            // The first claim lands at once and is answered at 1.5 s, half
            // its lease: after its first heartbeat was due (1 s).
            Call::Claim if claims.fetch_add(1, Ordering::SeqCst) == 0 => {
                Fault::SlowAnswer(Duration::from_millis(1_500))
            }
            _ => Fault::None,
        })
    };
    let exec = Executor::new(Arc::new(slow)).with_lease(lease);
    let processor = Processor::sleeping(Duration::from_millis(50));
    let call = {
        let (exec, processor) = (exec.clone(), processor.clone());
        tokio::spawn(async move { charge(&exec, &alice(), &visa(11), &processor).await })
    };
    // A sweep on a replica whose clock runs ahead marks the claim at
    // 0.5 s, before its answer came.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claimed = memory
        .list_records(&idem_runtime::store::RecordFilter::default())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    memory
        .mark_unknown(
            &claimed[0].key,
            claimed[0].attempt,
            "swept by a replica ahead",
        )
        .await
        .unwrap();
    let answer = call.await.unwrap();
    assert_eq!(
        processor.count(),
        0,
        "the handler ran under a claim swept before its answer came: {answer:?}"
    );
    assert_eq!(answer.name(), "store_unavailable", "{answer:?}");
    // The claim is retracted in the background; the retry runs, once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = charge(&exec, &alice(), &visa(11), &processor).await;
    assert!(matches!(again, Answer::Executed { .. }), "{again:?}");
    assert_eq!(processor.count(), 1);
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Shipment {
    order_id: String,
    address: String,
}

async fn ship(
    exec: &Executor,
    caller: &Caller,
    args: &Shipment,
    carrier: &Arc<AtomicUsize>,
) -> Answer<String, ToolError> {
    let carrier = carrier.clone();
    let op = Operation {
        caller,
        tool: "create_shipment",
        args,
        scope: ScopeSpec::BusinessKey {
            fields: &["order_id"],
            retention: None,
        },
        status_tool: STATUS_TOOL,
    };
    exec.run(op, move |ctx| async move {
        carrier.fetch_add(1, Ordering::SeqCst);
        Ok(format!("TRACK-{}", ctx.reference()))
    })
    .await
}

#[tokio::test]
async fn a_business_key_reused_with_other_arguments_is_a_conflict() {
    let exec = memory();
    let carrier = Arc::new(AtomicUsize::new(0));
    let order = Shipment {
        order_id: "ord_1".into(),
        address: "1 Main St".into(),
    };
    let first = ship(&exec, &alice(), &order, &carrier).await;
    // Another user of the same tenant, same order: the same shipment.
    let same = ship(&exec, &Caller::new("acme", "bob"), &order, &carrier).await;
    let moved = Shipment {
        address: "2 Side St".into(),
        ..order.clone()
    };
    let conflict = ship(&exec, &alice(), &moved, &carrier).await;
    assert_eq!(carrier.load(Ordering::SeqCst), 1);
    let (Answer::Executed { value: a, .. }, Answer::Replayed { value: b, .. }) = (&first, &same)
    else {
        panic!("{first:?} / {same:?}")
    };
    assert_eq!(a, b, "the same tracking number");
    assert_eq!(conflict.name(), "conflict");
    assert_eq!(conflict.reference(), first.reference());
    assert!(conflict.message().unwrap().contains("Nothing was executed"));
    // Another tenant has its own order namespace.
    let other = ship(&exec, &Caller::new("globex", "alice"), &order, &carrier).await;
    assert!(matches!(other, Answer::Executed { .. }));
    assert_eq!(carrier.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_missing_business_key_is_refused_before_anything_runs() {
    let exec = memory();
    let carrier = Arc::new(AtomicUsize::new(0));
    let c = carrier.clone();
    let op = Operation {
        caller: &alice(),
        tool: "create_shipment",
        args: &serde_json::json!({"address": "1 Main St"}),
        scope: ScopeSpec::BusinessKey {
            fields: &["order_id"],
            retention: None,
        },
        status_tool: STATUS_TOOL,
    };
    let answer: Answer<String, ToolError> = exec
        .run(op, move |_| async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(String::new())
        })
        .await;
    assert_eq!(answer.name(), "refused");
    assert!(answer.message().unwrap().contains("order_id"));
    assert_eq!(carrier.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn status_answers_from_the_record_within_the_tenant_only() {
    let exec = memory();
    let processor = Processor::sleeping(Duration::ZERO);
    let first = charge(&exec, &alice(), &visa(500), &processor).await;
    let Answer::Executed {
        value, reference, ..
    } = first
    else {
        panic!()
    };
    let status = exec
        .status(&alice(), &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::Completed
    );
    assert_eq!(status.tool, "charge_card");
    assert_eq!(
        status.response.unwrap(),
        serde_json::to_value(&value).unwrap()
    );
    let stranger = Caller::new("globex", "mallory");
    assert!(exec
        .status(&stranger, &reference.to_string())
        .await
        .unwrap()
        .is_none());
    assert!(exec
        .status(&alice(), "idem_nonsense")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_does_not_block_the_retry() {
    let exec = Executor::new(Arc::new(faulty(Call::Claim, Fault::AnswerLost, true)));
    let processor = Processor::sleeping(Duration::ZERO);
    let first = charge(&exec, &alice(), &visa(500), &processor).await;
    assert_eq!(first.name(), "store_unavailable");
    assert_eq!(processor.count(), 0);
    // The background release of the orphaned claim.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = charge(&exec, &alice(), &visa(500), &processor).await;
    assert!(matches!(retry, Answer::Executed { .. }), "{retry:?}");
    assert_eq!(processor.count(), 1);
}

/// `store`, counting every call made to it.
fn counted(store: Arc<dyn IdempotencyStore>) -> (Arc<dyn IdempotencyStore>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let store = FaultyStore::new(store, move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Fault::None
    });
    (Arc::new(store), calls)
}

/// A retry storm after the first call completed: 1,000 identical calls at
/// once on the replica that answered it make no store call with the replay
/// cache on (each is answered with the first charge), and one claim each
/// without it. A second replica asks the store once, then answers from its
/// own cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_after_the_first_answer_costs_the_store_nothing() {
    let shared: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    for cache in [true, false] {
        let (store, calls) = counted(shared.clone());
        let bytes = if cache { 1 << 20 } else { 0 };
        let exec = Executor::new(store.clone()).with_replay_cache(bytes);
        let processor = Processor::default();
        let args = visa(if cache { 700 } else { 701 });
        let first = charge(&exec, &alice(), &args, &processor).await;
        let Answer::Executed { value, .. } = &first else {
            panic!("{first:?}")
        };
        let before = calls.load(Ordering::SeqCst);
        let storm: Vec<_> = (0..1000)
            .map(|_| spawn_charge(&exec, args.clone(), &processor))
            .collect();
        for repeat in storm {
            match repeat.await.unwrap() {
                Answer::Replayed {
                    value: replayed,
                    reference,
                    ..
                } => {
                    assert_eq!(&replayed, value);
                    assert_eq!(Some(reference), first.reference());
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(processor.count(), 1, "charged once");
        let storm_calls = calls.load(Ordering::SeqCst) - before;
        if cache {
            assert_eq!(storm_calls, 0, "the store was not asked");
            // Another replica, on the same store, with a cache of its own.
            let (store, calls) = counted(shared.clone());
            let other = Executor::new(store).with_replay_cache(1 << 20);
            for _ in 0..1000 {
                let repeat = charge(&other, &alice(), &args, &processor).await;
                assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
            }
            assert_eq!(calls.load(Ordering::SeqCst), 1, "one claim, then the cache");
        } else {
            assert_eq!(storm_calls, 1000, "one claim per repeat without the cache");
        }
    }
}

/// The protocol's own paths (client keys, questions asked before the
/// effect) cost the calls that do not use them nothing: a first call is
/// one claim and one completion, a replay one claim, as they were; a
/// first call under a client key is the same two, and its replay, with
/// the replay cache on, reaches the store not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_paths_add_no_store_call_to_the_calls_that_do_not_use_them() {
    let shared: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let processor = Processor::default();
    let (store, calls) = counted(shared.clone());
    let exec = Executor::new(store);
    let counted_call = async |args: &Charge| {
        let before = calls.load(Ordering::SeqCst);
        let answer = charge(&exec, &alice(), args, &processor).await;
        (answer, calls.load(Ordering::SeqCst) - before)
    };
    let (first, n) = counted_call(&visa(1_100)).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    assert_eq!(n, 2, "a first call: its claim and its completion");
    let (replay, n) = counted_call(&visa(1_100)).await;
    assert!(matches!(replay, Answer::Replayed { .. }), "{replay:?}");
    assert_eq!(n, 1, "a replay: its claim");

    // Under a client key, on an executor with the replay cache on.
    let (store, calls) = counted(shared);
    let exec = Executor::new(store).with_replay_cache(1 << 20);
    let args = visa(1_101);
    let keyed = async || {
        let caller = alice();
        let op = Operation {
            caller: &caller,
            tool: "charge_card",
            args: &args,
            scope: ScopeSpec::ClientKey {
                key: "order-1101-attempt",
                window: Duration::from_secs(900),
            },
            status_tool: STATUS_TOOL,
        };
        let (p, a) = (processor.clone(), args.clone());
        let before = calls.load(Ordering::SeqCst);
        let answer = exec
            .run(op, move |ctx| async move { p.charge(ctx, a).await })
            .await;
        (answer, calls.load(Ordering::SeqCst) - before)
    };
    let (first, n) = keyed().await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    assert_eq!(
        n, 2,
        "a first call under a client key: its claim and its completion"
    );
    for _ in 0..100 {
        let (replay, n) = keyed().await;
        assert!(matches!(replay, Answer::Replayed { .. }), "{replay:?}");
        assert_eq!(n, 0, "a replay under a client key, from the replay cache");
    }
    assert_eq!(processor.count(), 2, "one charge per operation");
}

/// The replay cache answers only what the store would: not after the
/// window (counted from the claim), not for another tenant, not for other
/// arguments under one business key. Each of those calls reaches the store
/// and gets the store's answer: a new charge, another tenant's own charge,
/// a conflict.
#[tokio::test(start_paused = true)]
async fn the_replay_cache_answers_within_the_window_tenant_and_arguments_only() {
    let exec = Executor::new(on_tokio_clock()).with_replay_cache(1 << 20);
    let processor = Processor::default();
    let args = visa(900);
    let window = Duration::from_secs(10);
    let run = |caller: Caller| {
        let (exec, processor, args) = (exec.clone(), processor.clone(), args.clone());
        async move {
            let op = Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(window),
                status_tool: STATUS_TOOL,
            };
            let p = processor.clone();
            let a = args.clone();
            exec.run(op, move |ctx| async move { p.charge(ctx, a).await })
                .await
        }
    };
    let first = run(alice()).await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    tokio::time::advance(Duration::from_secs(9)).await;
    let inside = run(alice()).await;
    assert!(matches!(inside, Answer::Replayed { .. }), "{inside:?}");
    assert_eq!(processor.count(), 1);
    // Another tenant: its own operation.
    let other = run(Caller::new("globex", "alice")).await;
    assert!(matches!(other, Answer::Executed { .. }), "{other:?}");
    assert_eq!(processor.count(), 2);
    // The window is over: a new operation, a new charge, a new reference.
    tokio::time::advance(Duration::from_secs(1)).await;
    let after = run(alice()).await;
    let Answer::Executed { value, .. } = &after else {
        panic!("{after:?}")
    };
    assert_eq!(processor.count(), 3);
    assert_ne!(after.reference(), first.reference());
    assert_eq!(value.charge_id, "ch_3");

    // Other arguments under one business key: the store says conflict.
    let carrier = Arc::new(AtomicUsize::new(0));
    let order = Shipment {
        order_id: "ord_9".into(),
        address: "1 Main St".into(),
    };
    let shipped = ship(&exec, &alice(), &order, &carrier).await;
    let again = ship(&exec, &alice(), &order, &carrier).await;
    assert!(matches!(again, Answer::Replayed { .. }), "{again:?}");
    let moved = Shipment {
        address: "2 Side St".into(),
        ..order
    };
    let conflict = ship(&exec, &alice(), &moved, &carrier).await;
    assert_eq!(conflict.name(), "conflict");
    assert_eq!(conflict.reference(), shipped.reference());
    assert_eq!(carrier.load(Ordering::SeqCst), 1);
}
