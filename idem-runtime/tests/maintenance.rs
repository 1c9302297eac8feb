//! Sweep, reconcile, purge and the maintenance task, against MemoryStore.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_runtime::store::Upkeep;
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    maintenance::{
        purge, reconcile, resolve_by_hand, sweep, Maintenance, MaintenanceConfig, Outcome,
        ReconcileConfig, Reconciler, Reconciliation, ResolveError,
    },
    store::{Claim, ClaimRequest, Record, RecordState},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};

/// A processor's view: which references it has charged.
#[derive(Debug)]
struct Ledger {
    answer: Reconciliation,
    asked: AtomicUsize,
}

#[async_trait]
impl Reconciler for Ledger {
    async fn reconcile(
        &self,
        _: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(self.answer.clone())
    }
}

/// Claims like a process that then dies: no heartbeat, short lease.
async fn abandoned_claim(store: &dyn IdempotencyStore) -> ClaimRequest {
    let mut req = idem_runtime::store::conformance::claim_request(Duration::from_secs(900));
    req.lease = Duration::from_millis(100);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    req
}

/// Reconciliation that trusts "not performed" at once: these tests are about
/// the jobs, not the settle period (see `not_performed_waits_for_the_settle_period`).
fn trusting() -> ReconcileConfig {
    ReconcileConfig::default().with_settle(Duration::ZERO)
}

async fn state(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Option<RecordState> {
    store
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .map(|r| r.state)
}

#[tokio::test]
async fn sweep_then_reconcile_completes_a_dead_call() {
    let store = MemoryStore::new();
    let req = abandoned_claim(&store).await;
    assert_eq!(sweep(&store, 100).await.unwrap(), 1);
    assert!(matches!(
        state(&store, &req).await,
        Some(RecordState::Unknown { .. })
    ));
    let ledger = Ledger {
        answer: Reconciliation::completed("{\"charge_id\":\"ch_9\"}"),
        asked: AtomicUsize::new(0),
    };
    let report = reconcile(&store, &ledger, &trusting()).await.unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(
        state(&store, &req).await,
        Some(RecordState::Completed {
            response: "{\"charge_id\":\"ch_9\"}".into()
        })
    );
}

#[tokio::test]
async fn reconcile_releases_what_never_happened_so_it_can_run() {
    let store = Arc::new(MemoryStore::new());
    let exec = Executor::new(store.clone()).with_lease(Duration::from_millis(100));
    let caller = Caller::new("acme", "alice");
    let calls = Arc::new(AtomicUsize::new(0));
    let run = |calls: Arc<AtomicUsize>, hang: bool| {
        let exec = exec.clone();
        let caller = caller.clone();
        async move {
            let op = Operation {
                caller: &caller,
                tool: "charge_card",
                args: &serde_json::json!({"amount_cents": 5}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            };
            let answer: Answer<String, ToolError> = exec
                .run(op, move |_| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok("charged".to_owned())
                })
                .await;
            answer
        }
    };
    // The first call's process "dies": its future is forgotten mid-handler,
    // so neither its drop guard nor its heartbeat ever runs again.
    let mut dying = Box::pin(run(calls.clone(), true));
    assert!(futures::poll!(dying.as_mut()).is_pending());
    std::mem::forget(dying);
    tokio::time::sleep(Duration::from_millis(250)).await;

    let repeat = run(calls.clone(), false).await;
    assert_eq!(repeat.name(), "unknown", "{repeat:?}");
    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    let ledger = Ledger {
        answer: Reconciliation::not_performed(),
        asked: AtomicUsize::new(0),
    };
    assert_eq!(
        reconcile(&*store, &ledger, &trusting())
            .await
            .unwrap()
            .not_performed,
        1
    );
    let after = run(calls.clone(), false).await;
    assert_eq!(after.name(), "executed", "{after:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn sweep_leaves_live_and_finished_records_alone() {
    let store = MemoryStore::new();
    let live = idem_runtime::store::conformance::claim_request(Duration::from_secs(900));
    store.claim(&live).await.unwrap();
    let done = abandoned_claim(&store).await;
    store.complete(&done.key, done.attempt, "1").await.unwrap();
    assert_eq!(sweep(&store, 100).await.unwrap(), 0);
    assert_eq!(state(&store, &live).await, Some(RecordState::InProgress));
}

#[tokio::test]
async fn purge_removes_every_expired_record() {
    let store = MemoryStore::new();
    for _ in 0..25 {
        // Past its retention, not only its window: a completed record is
        // kept, readable by its reference, until its retention ends.
        let req = idem_runtime::store::ClaimRequest {
            retention: Duration::from_millis(50),
            ..idem_runtime::store::conformance::claim_request(Duration::from_millis(50))
        };
        store.claim(&req).await.unwrap();
        store.complete(&req.key, req.attempt, "1").await.unwrap();
    }
    let keep = idem_runtime::store::conformance::claim_request(Duration::from_secs(900));
    store.claim(&keep).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(purge(&store, 4).await.unwrap(), 25);
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn maintenance_runs_in_the_background_and_stops() {
    let store = Arc::new(MemoryStore::new());
    let req = abandoned_claim(&*store).await;
    let ledger = Arc::new(Ledger {
        answer: Reconciliation::completed("\"ok\""),
        asked: AtomicUsize::new(0),
    });
    let task = Maintenance::spawn(
        store.clone(),
        MaintenanceConfig::default()
            .with_interval(Duration::from_millis(50))
            .with_batch(10)
            .with_reconciler(ledger.clone())
            .with_reconcile(trusting()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.stop().await;
    assert!(matches!(
        state(&*store, &req).await,
        Some(RecordState::Completed { .. })
    ));
    assert_eq!(ledger.asked.load(Ordering::SeqCst), 1);
}

/// A reconciler that answers by tool: it resolves `charge_card` records as
/// `answer` says, and does not know `create_shipment` (a carrier without a
/// lookup API): "still unknown" or "not mine".
#[derive(Debug)]
struct ByTool {
    answer: Reconciliation,
    shipment: Reconciliation,
    asked: std::sync::Mutex<Vec<String>>,
}

#[async_trait]
impl Reconciler for ByTool {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        self.asked.lock().unwrap().push(record.tool.clone());
        Ok(match record.tool.as_str() {
            "charge_card" => self.answer.clone(),
            _ => self.shipment.clone(),
        })
    }
}

/// An UNKNOWN record of `tool`, claimed now.
async fn unknown_record(store: &dyn IdempotencyStore, tool: &str) -> ClaimRequest {
    let req = ClaimRequest {
        tool: tool.to_owned(),
        ..idem_runtime::store::conformance::claim_request(Duration::from_secs(900))
    };
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&req.key, req.attempt, "timed out")
        .await
        .unwrap();
    req
}

/// (a) "Not performed" from the processor is trusted only for a record that
/// has been unchanged for the settle period: a request still in flight may
/// not show yet. Before that, the record stays UNKNOWN and is asked again.
#[tokio::test]
async fn not_performed_waits_for_the_settle_period() {
    let store = MemoryStore::new();
    let req = unknown_record(&store, "charge_card").await;
    let ledger = Ledger {
        answer: Reconciliation::not_performed(),
        asked: AtomicUsize::new(0),
    };
    let config = ReconcileConfig::default()
        .with_settle(Duration::from_millis(300))
        .with_first_backoff(Duration::from_millis(50));
    let early = reconcile(&store, &ledger, &config).await.unwrap();
    assert_eq!(early.not_performed, 0, "{early:?}");
    assert_eq!(early.still_unknown, 1, "{early:?}");
    assert!(matches!(
        state(&store, &req).await,
        Some(RecordState::Unknown { .. })
    ));
    // Asked again only once it settled.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        reconcile(&store, &ledger, &config).await.unwrap(),
        Default::default()
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let settled = reconcile(&store, &ledger, &config).await.unwrap();
    assert_eq!(settled.not_performed, 1, "{settled:?}");
    assert!(matches!(
        state(&store, &req).await,
        Some(RecordState::NotPerformed { .. })
    ));
    assert_eq!(ledger.asked.load(Ordering::SeqCst), 2);
}

/// (c) Records the reconciler cannot resolve (every shipment, here) are put
/// off with a backoff, so a newer charge it can resolve is looked at in the
/// next round instead of waiting behind them for the retention.
#[tokio::test]
async fn unresolvable_records_do_not_starve_the_others() {
    for shipment in [Reconciliation::StillUnknown, Reconciliation::NotMine] {
        let store = MemoryStore::new();
        for _ in 0..30 {
            unknown_record(&store, "create_shipment").await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let charge = unknown_record(&store, "charge_card").await;
        let reconciler = ByTool {
            answer: Reconciliation::completed("\"ch_1\""),
            shipment: shipment.clone(),
            asked: Default::default(),
        };
        let config = ReconcileConfig::default().with_batch(10);
        let mut rounds = 0;
        while !matches!(
            state(&store, &charge).await,
            Some(RecordState::Completed { .. })
        ) {
            rounds += 1;
            assert!(rounds <= 4, "{shipment:?}: the charge starved");
            reconcile(&store, &reconciler, &config).await.unwrap();
        }
        // Each shipment was asked once: the backoff keeps them out of the
        // following rounds.
        let asked = reconciler.asked.lock().unwrap().clone();
        assert_eq!(asked.iter().filter(|t| *t == "create_shipment").count(), 30);
        assert_eq!(asked.iter().filter(|t| *t == "charge_card").count(), 1);
        let deferred = store.list_unknown(100).await.unwrap();
        assert!(deferred.is_empty(), "all put off: {}", deferred.len());
    }
}

/// The backoff doubles per fruitless check and stops at the maximum.
#[test]
fn backoff_doubles_up_to_the_maximum() {
    let config = ReconcileConfig::default()
        .with_first_backoff(Duration::from_secs(30))
        .with_max_backoff(Duration::from_secs(3600));
    let pauses: Vec<u64> = (0..9).map(|n| config.backoff(n).as_secs()).collect();
    assert_eq!(pauses, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
    assert_eq!(config.backoff(u32::MAX), Duration::from_secs(3600));
}

/// A person resolves an operation nobody can reconcile: the status tool
/// answers from the resolution, repeats replay it, and saying it again is
/// harmless.
#[tokio::test]
async fn an_operator_resolves_an_unknown_operation_by_hand() {
    let store = Arc::new(MemoryStore::new());
    let exec = Executor::new(store.clone());
    let caller = Caller::new("acme", "alice");
    let runs = Arc::new(AtomicUsize::new(0));
    let ship = |runs: Arc<AtomicUsize>, outcome: Result<String, ToolError>| {
        let (exec, caller) = (exec.clone(), caller.clone());
        async move {
            let op = Operation {
                caller: &caller,
                tool: "create_shipment",
                args: &serde_json::json!({"order_id": "o-1"}),
                scope: ScopeSpec::BusinessKey {
                    fields: &["order_id"],
                    retention: None,
                },
                status_tool: "get_operation_status",
            };
            let answer: Answer<String, ToolError> = exec
                .run(op, move |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    outcome
                })
                .await;
            answer
        }
    };
    let first = ship(
        runs.clone(),
        Err(ToolError::unknown("the carrier timed out")),
    )
    .await;
    let reference = first.reference().unwrap();

    let completed = Outcome::completed("\"1Z999\"");
    let note = "ops/ana: the carrier's portal shows 1Z999";
    // Bad input changes nothing.
    assert!(matches!(
        resolve_by_hand(&*store, "acme", &reference, &completed, "  ").await,
        Err(ResolveError::EmptyNote)
    ));
    let not_json = Outcome::completed("1Z999");
    assert!(matches!(
        resolve_by_hand(&*store, "acme", &reference, &not_json, note).await,
        Err(ResolveError::InvalidResponse(_))
    ));
    assert!(matches!(
        resolve_by_hand(&*store, "globex", &reference, &completed, note).await,
        Err(ResolveError::NotFound { .. })
    ));

    let resolved = resolve_by_hand(&*store, "acme", &reference, &completed, note)
        .await
        .unwrap();
    assert_eq!(resolved.resolution.as_deref(), Some(note));
    // Idempotent: the same resolution again answers the same record.
    resolve_by_hand(&*store, "acme", &reference, &completed, note)
        .await
        .unwrap();
    // Another resolution of a resolved record is refused, and changes nothing.
    let err = resolve_by_hand(&*store, "acme", &reference, &Outcome::NotPerformed, note)
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::NotUnknown { .. }), "{err}");
    assert!(err.to_string().contains("left as it was"), "{err}");

    let status = exec
        .status(&caller, &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::Completed
    );
    assert_eq!(status.resolution.as_deref(), Some(note));
    assert_eq!(status.response, Some(serde_json::json!("1Z999")));
    let repeat = ship(runs.clone(), Ok("never".into())).await;
    assert_eq!(repeat.name(), "replayed", "{repeat:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the carrier was asked once");
}

/// An operator looks at a record whose lease ran out and finds nothing at
/// the processor; before the resolution's mark lands, the handler's
/// heartbeat does (it was slow, not dead), it sends its request and ends
/// with an unknown outcome. The operator's "not performed" predates that
/// request: the record is left UNKNOWN and the operator told to look
/// again, so the retry that a NOT_PERFORMED would invite cannot charge
/// twice. Looked at again, an UNKNOWN record is resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_comes_back_is_not_resolved_on_an_earlier_look() {
    use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), |call| match call {
        Call::MarkLapsed => Fault::Delay(Duration::from_millis(300)),
        _ => Fault::None,
    }));
    let req = abandoned_claim(&*store).await;
    let resolving = {
        let store = store.clone();
        let (tenant, reference) = (req.tenant.clone(), req.reference);
        tokio::spawn(async move {
            resolve_by_hand(
                &*store,
                &tenant,
                &reference,
                &Outcome::NotPerformed,
                "ops/ana: nothing at the processor",
            )
            .await
        })
    };
    // The handler comes back inside the mark's delay: its heartbeat lands,
    // its request goes out, and it ends with an unknown outcome.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let inner = store.inner();
    inner
        .heartbeat(&req.key, req.attempt, Duration::from_secs(1))
        .await
        .unwrap();
    inner
        .mark_unknown(&req.key, req.attempt, "the processor timed out")
        .await
        .unwrap();
    let refused = resolving.await.unwrap().unwrap_err();
    assert!(matches!(refused, ResolveError::Changed { .. }), "{refused}");
    assert!(
        refused.to_string().contains("check the processor again"),
        "{refused}"
    );
    assert!(
        matches!(
            state(&*store, &req).await,
            Some(RecordState::Unknown { .. })
        ),
        "left UNKNOWN"
    );
    // Looked at again, as UNKNOWN from the start: resolved.
    let resolved = resolve_by_hand(
        &*store,
        &req.tenant,
        &req.reference,
        &Outcome::NotPerformed,
        "ops/ana: looked again after it settled",
    )
    .await
    .unwrap();
    assert!(matches!(resolved.state, RecordState::NotPerformed { .. }));
}

/// Resolved by hand as not performed: the status tool says so, and the next
/// identical call runs.
#[tokio::test]
async fn an_operation_resolved_as_not_performed_runs_again() {
    let store = Arc::new(MemoryStore::new());
    let req = unknown_record(&*store, "charge_card").await;
    let reference = req.reference;
    let note = "ops/ana: no such charge in the processor's dashboard";
    let resolved = resolve_by_hand(
        &*store,
        &req.tenant,
        &reference,
        &Outcome::NotPerformed,
        note,
    )
    .await
    .unwrap();
    assert!(matches!(resolved.state, RecordState::NotPerformed { .. }));
    // The takeover within the window continues the same operation.
    assert_eq!(
        store
            .claim(&idem_runtime::store::conformance::new_operation(&req))
            .await
            .unwrap(),
        Claim::Claimed { reference }
    );
}

/// A processor whose lookups take a while, counting them per reference.
#[derive(Debug)]
struct SlowLookup {
    takes: Duration,
    asked: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
}

impl SlowLookup {
    fn new(takes: Duration) -> Self {
        SlowLookup {
            takes,
            asked: Default::default(),
        }
    }

    fn asked(&self) -> std::collections::BTreeMap<String, usize> {
        self.asked.lock().unwrap().clone()
    }
}

#[async_trait]
impl Reconciler for SlowLookup {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        *self
            .asked
            .lock()
            .unwrap()
            .entry(record.reference.to_string())
            .or_default() += 1;
        tokio::time::sleep(self.takes).await;
        Ok(Reconciliation::completed("\"ch_1\""))
    }
}

/// Three replicas reconcile at once, each listing the same UNKNOWN records:
/// the processor is asked about each record once, not once per replica,
/// and every record is resolved.
#[tokio::test]
async fn three_replicas_ask_the_processor_once_per_record() {
    let store = Arc::new(MemoryStore::new());
    let mut reqs = Vec::new();
    for _ in 0..6 {
        reqs.push(unknown_record(&*store, "charge_card").await);
    }
    let processor = SlowLookup::new(Duration::from_millis(150));
    let config = ReconcileConfig::default();
    let round = || reconcile(&*store, &processor, &config);
    // Three rounds in flight together: each lists all six records while
    // the others' lookups sleep.
    let (a, b, c) = tokio::join!(round(), round(), round());
    let reports = [a.unwrap(), b.unwrap(), c.unwrap()];
    let asked = processor.asked();
    assert_eq!(asked.len(), 6, "{asked:?}");
    assert!(asked.values().all(|n| *n == 1), "{asked:?}");
    let completed: usize = reports.iter().map(|r| r.completed).sum();
    assert_eq!(completed, 6, "{reports:?}");
    assert!(
        reports.iter().all(|r| r.completed > 0),
        "the replicas shared the work: {reports:?}"
    );
    let skipped: usize = reports.iter().map(|r| r.checked_elsewhere).sum();
    assert!(skipped > 0, "the rounds overlapped: {reports:?}");
    for req in &reqs {
        assert!(matches!(
            state(&*store, req).await,
            Some(RecordState::Completed { .. })
        ));
    }
}

/// A replica whose lookup hangs gives it up at the lookup timeout, and the
/// record is asked about again, by another replica, once the check it took
/// is no longer held: a hung replica holds a record back for a timeout, not
/// forever, and its late answer is never acted on.
#[tokio::test]
async fn a_hung_lookup_is_given_up_and_asked_again_elsewhere() {
    let store = Arc::new(MemoryStore::new());
    let req = unknown_record(&*store, "charge_card").await;
    let config = ReconcileConfig::default().with_lookup_timeout(Duration::from_millis(200));
    let hung = SlowLookup::new(Duration::from_secs(3600));
    let answering = SlowLookup::new(Duration::ZERO);
    let started = std::time::Instant::now();
    let first = reconcile(&*store, &hung, &config).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "given up");
    assert_eq!(first.still_unknown, 1, "{first:?}");
    assert_eq!(hung.asked().len(), 1);
    // The failed lookup put the record off by the first backoff (30 s):
    // nobody asks meanwhile.
    let meanwhile = reconcile(&*store, &answering, &config).await.unwrap();
    assert_eq!(meanwhile, Default::default());
    assert!(answering.asked().is_empty());
    // Due again: another replica asks, and resolves it.
    store
        .defer_check(&req.key, req.attempt, Duration::ZERO, None)
        .await
        .unwrap();
    let second = reconcile(&*store, &answering, &config).await.unwrap();
    assert_eq!(second.completed, 1, "{second:?}");
    assert_eq!(answering.asked().len(), 1);
}
