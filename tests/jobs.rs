//! Sweep, reconcile, purge and the maintenance task, against MemoryStore.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_runtime::{
    purge, reconcile, sweep, Answer, Caller, Claim, ClaimRequest, Executor, IdempotencyStore,
    Maintenance, MaintenanceConfig, MemoryStore, Operation, ReconcileConfig, Reconciler,
    Reconciliation, Record, RecordState, ScopeSpec, ToolError,
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
    let mut req = idem_runtime::conformance::claim_request(Duration::from_secs(900));
    req.lease = Duration::from_millis(100);
    assert_eq!(store.claim(&req).await.unwrap(), Claim::Claimed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    req
}

/// Reconciliation that trusts "not performed" at once: these tests are about
/// the jobs, not the settle period (see `not_performed_waits_for_the_settle_period`).
fn trusting() -> ReconcileConfig {
    ReconcileConfig {
        settle: Duration::ZERO,
        ..ReconcileConfig::default()
    }
}

async fn state(store: &dyn IdempotencyStore, req: &ClaimRequest) -> Option<RecordState> {
    store
        .lookup(&req.tenant, &req.key.reference())
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
        answer: Reconciliation::Completed {
            response: "{\"charge_id\":\"ch_9\"}".into(),
        },
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
    assert_eq!(repeat.kind(), "unknown", "{repeat:?}");
    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    let ledger = Ledger {
        answer: Reconciliation::NotPerformed,
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
    assert_eq!(after.kind(), "executed", "{after:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn sweep_leaves_live_and_finished_records_alone() {
    let store = MemoryStore::new();
    let live = idem_runtime::conformance::claim_request(Duration::from_secs(900));
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
        let req = idem_runtime::conformance::claim_request(Duration::from_millis(50));
        store.claim(&req).await.unwrap();
        store.complete(&req.key, req.attempt, "1").await.unwrap();
    }
    let keep = idem_runtime::conformance::claim_request(Duration::from_secs(900));
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
        answer: Reconciliation::Completed {
            response: "\"ok\"".into(),
        },
        asked: AtomicUsize::new(0),
    });
    let task = Maintenance::spawn(
        store.clone(),
        MaintenanceConfig {
            interval: Duration::from_millis(50),
            batch: 10,
            reconciler: Some(ledger.clone()),
            reconcile: trusting(),
        },
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.stop().await;
    assert!(matches!(
        state(&*store, &req).await,
        Some(RecordState::Completed { .. })
    ));
    assert_eq!(ledger.asked.load(Ordering::SeqCst), 1);
}
