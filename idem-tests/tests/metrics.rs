//! What idem emits through the `metrics` facade, counted by a test recorder
//! (metrics-util's `DebuggingRecorder`, installed for this thread only, on a
//! current-thread runtime so every task runs under it); and, counted so,
//! two replicas' maintenance loops on one store (SQLite; PostgreSQL when
//! `IDEM_TEST_DATABASE_URL` is set).

mod durable;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    follow_ons::{follow_on_fn, FollowOn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers},
    maintenance::{
        purge, reconcile, resolve_by_hand, sweep, Outcome, ReconcileConfig, Reconciler,
        Reconciliation,
    },
    store::{Claim, Record},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};
use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use serde_json::json;

type Seen = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

/// The tests of this file run one at a time. tracing caches whether anyone
/// listens to a span's callsite for the whole process: a call made on
/// another test's thread, which has no subscriber, while the span test sets
/// its thread's subscriber could leave `idem.call` cached as unheard, and
/// that test would miss a span (it did, about one run in three on a busy
/// 2-core machine).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `work` with a fresh recorder for this thread; returns what it saw
/// (one snapshot: taking one drains the counters).
fn recorded<F: std::future::Future<Output = ()>>(work: impl FnOnce() -> F) -> Seen {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(work()));
    snapshotter.snapshot().into_vec()
}

/// The value of the metric `name` with exactly `labels`.
fn value<'s>(seen: &'s Seen, name: &str, labels: &[(&str, &str)]) -> Option<&'s DebugValue> {
    seen.iter()
        .find(|(key, _, _, _)| {
            let key = key.key();
            let mut found: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let mut want = labels.to_vec();
            found.sort();
            want.sort();
            key.name() == name && found == want
        })
        .map(|(_, _, _, value)| value)
}

fn counter(snapshotter: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snapshotter, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

fn samples(snapshotter: &Seen, name: &str, labels: &[(&str, &str)]) -> usize {
    match value(snapshotter, name, labels) {
        Some(DebugValue::Histogram(v)) => v.len(),
        None => 0,
        other => panic!("{name} {labels:?} is not a histogram: {other:?}"),
    }
}

async fn charge(exec: &Executor, amount: u64, fail: bool) -> &'static str {
    let caller = Caller::new("acme", "alice");
    let args = json!({ "card": "4242", "amount_cents": amount });
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    let answer: Answer<serde_json::Value, ToolError> = exec
        .run(op, |_| async move {
            if fail {
                Err(ToolError::rejected("card declined"))
            } else {
                Ok(json!({ "charge_id": "ch_1" }))
            }
        })
        .await;
    answer.state().as_str()
}

#[test]
fn calls_are_counted_by_tool_and_state_and_store_steps_are_timed() {
    let _serial = one_at_a_time();
    let seen = recorded(|| async {
        let exec = Executor::new(Arc::new(MemoryStore::new()));
        assert_eq!(charge(&exec, 100, false).await, "executed");
        assert_eq!(charge(&exec, 100, false).await, "replayed");
        assert_eq!(charge(&exec, 100, false).await, "replayed");
        assert_eq!(charge(&exec, 200, true).await, "rejected");
    });
    let calls = |state| {
        counter(
            &seen,
            "idem_calls_total",
            &[("tool", "charge_card"), ("state", state)],
        )
    };
    assert_eq!(calls("executed"), 1);
    assert_eq!(calls("replayed"), 2);
    assert_eq!(calls("rejected"), 1);
    assert_eq!(calls("conflict"), 0);
    let step = |op| {
        samples(
            &seen,
            "idem_store_seconds",
            &[("store", "memory"), ("op", op)],
        )
    };
    assert_eq!(step("claim"), 4, "every call claims");
    assert_eq!(step("complete"), 1, "only the executed call completes");
}

/// The follow-on dispatcher counts what it enqueued and how each run ended, and gauges
/// the due jobs no handler runs.
#[test]
fn the_outbox_counts_enqueued_delivered_retried_buried_and_unhandled() {
    let _serial = one_at_a_time();
    let seen = recorded(|| async {
        let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
        let exec = Executor::new(store.clone());
        let caller = Caller::new("acme", "alice");
        for (card, jobs) in [
            ("1", &["send_receipt", "send_fax"][..]),
            ("2", &["flaky"][..]),
        ] {
            let args = json!({ "card": card });
            let op = Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            };
            let answer: Answer<String, ToolError> = exec
                .run(op, |_| async move {
                    for job in jobs {
                        idem_runtime::follow_on(job, &1).unwrap();
                    }
                    Ok("ok".to_owned())
                })
                .await;
            assert_eq!(answer.state().as_str(), "executed");
        }
        let handlers = FollowOnHandlers::new()
            .on("send_receipt", follow_on_fn(|_| async { Ok(()) }))
            .on("flaky", follow_on_fn(|_| async { Err("down".into()) }));
        let config = FollowOnConfig::default()
            .with_max_runs(2)
            .with_first_backoff(Duration::ZERO);
        for _ in 0..3 {
            FollowOnDispatcher::round(&*store, &handlers, &config)
                .await
                .unwrap();
        }
    });
    assert_eq!(counter(&seen, "idem_outbox_enqueued_total", &[]), 3);
    let jobs = |job, outcome| {
        counter(
            &seen,
            "idem_outbox_jobs_total",
            &[("job", job), ("outcome", outcome)],
        )
    };
    assert_eq!(jobs("send_receipt", "delivered"), 1);
    assert_eq!(jobs("flaky", "retried"), 1);
    assert_eq!(jobs("flaky", "buried"), 1);
    match value(&seen, "idem_outbox_unhandled_jobs", &[("job", "send_fax")]) {
        Some(DebugValue::Gauge(n)) => assert_eq!(n.into_inner(), 1.0),
        other => panic!("the unhandled gauge: {other:?}"),
    }
}

#[derive(Debug)]
struct Happened;

#[async_trait]
impl Reconciler for Happened {
    async fn reconcile(
        &self,
        _: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Reconciliation::completed("{\"charge_id\":\"ch_r\"}"))
    }
}

#[test]
fn maintenance_counts_what_it_swept_reconciled_resolved_and_purged() {
    let _serial = one_at_a_time();
    let seen = recorded(|| async {
        let store = MemoryStore::new();
        // Two calls whose process died: their leases run out.
        let mut dead = Vec::new();
        for _ in 0..2 {
            let mut req = claim_request(Duration::from_millis(30));
            req.lease = Duration::from_millis(10);
            req.retention = Duration::from_millis(30);
            assert!(matches!(
                store.claim(&req).await.unwrap(),
                Claim::Claimed { .. }
            ));
            dead.push(req);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(sweep(&store, 100).await.unwrap(), 2);
        // One is resolved by hand, the other by the reconciler.
        let by_hand = &dead[0];
        resolve_by_hand(
            &store,
            &by_hand.tenant,
            &by_hand.reference,
            &Outcome::NotPerformed,
            "ops: bob, the processor has no such charge",
        )
        .await
        .unwrap();
        let report = reconcile(&store, &Happened, &ReconcileConfig::default())
            .await
            .unwrap();
        assert_eq!(report.completed, 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(purge(&store, 10).await.unwrap(), 2);
    });
    assert_eq!(counter(&seen, "idem_swept_total", &[]), 2);
    assert_eq!(
        counter(
            &seen,
            "idem_resolved_by_hand_total",
            &[("outcome", "not_performed")]
        ),
        1
    );
    assert_eq!(
        counter(&seen, "idem_reconciled_total", &[("outcome", "completed")]),
        1
    );
    assert_eq!(counter(&seen, "idem_purged_total", &[]), 2);
}

/// A writer into a shared buffer, for the tracing subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Each call runs in one `idem.call` span with its tool, tenant, reference
/// and final state; the arguments and the response are never in it.
#[test]
fn each_call_has_a_span_with_its_reference_and_state() {
    let _serial = one_at_a_time();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
    runtime.block_on(async {
        let exec = Executor::new(Arc::new(MemoryStore::new()));
        assert_eq!(charge(&exec, 987_654_321, false).await, "executed");
        assert_eq!(charge(&exec, 987_654_321, false).await, "replayed");
    });
    drop(guard);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let closed: Vec<&str> = log.lines().filter(|l| l.contains("idem.call")).collect();
    assert_eq!(closed.len(), 2, "{log}");
    for (line, state) in closed.iter().zip(["executed", "replayed"]) {
        assert!(
            line.contains("tool=\"charge_card\"") || line.contains("tool=charge_card"),
            "{line}"
        );
        assert!(
            line.contains("tenant=\"acme\"") || line.contains("tenant=acme"),
            "{line}"
        );
        assert!(
            line.contains(&format!("state=\"{state}\""))
                || line.contains(&format!("state={state}")),
            "{line}"
        );
        assert!(line.contains("reference="), "{line}");
    }
    assert!(!log.contains("987654321"), "no arguments: {log}");
    assert!(!log.contains("ch_1"), "no response: {log}");
}

/// A processor's lookup, counted per reference: even-numbered charges were
/// made (their receipt job is written with the resolution), odd ones never
/// arrived. Each lookup takes a few milliseconds, so two loops' batches
/// overlap.
#[derive(Debug, Default)]
struct CountingProcessor {
    made: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    lookups: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

#[async_trait]
impl Reconciler for CountingProcessor {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        let reference = record.reference.to_string();
        *self
            .lookups
            .lock()
            .unwrap()
            .entry(reference.clone())
            .or_default() += 1;
        tokio::time::sleep(Duration::from_millis(3)).await;
        let made = self.made.lock().unwrap().get(&reference).copied();
        Ok(match made {
            Some(true) => Reconciliation::Found(Outcome::completed_with(
                r#"{"charge_id":"ch_1"}"#,
                vec![FollowOn::new("send_receipt", &reference)?],
            )),
            Some(false) => Reconciliation::not_performed(),
            None => Reconciliation::NotMine,
        })
    }
}

/// Two replicas' `Maintenance` loops, running at once on one store with
/// lapsed claims to sweep and reconcile: each record is swept once and
/// resolved once (the counters count only the marks and resolutions that
/// took), its receipt job written once, and the processor is asked about
/// each record once in all: one loop takes each check, the other skips it.
async fn two_maintenance_loops_resolve_each_record_once(store: Arc<dyn IdempotencyStore>) {
    use idem_runtime::maintenance::{Maintenance, MaintenanceConfig};
    use idem_runtime::store::{FollowOnFilter, RecordStateKind};
    const N: usize = 40;
    let processor = Arc::new(CountingProcessor::default());
    let tenant = format!(
        "replicas-{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    for i in 0..N {
        let req = idem_runtime::store::ClaimRequest {
            tenant: tenant.clone(),
            lease: Duration::from_millis(50),
            ..claim_request(Duration::from_secs(900))
        };
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            Claim::Claimed { .. }
        ));
        processor
            .made
            .lock()
            .unwrap()
            .insert(req.reference.to_string(), i % 2 == 0);
    }
    // The claims' process "died": their leases run out unrenewed.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let config = MaintenanceConfig::default()
        .with_interval(Duration::from_millis(20))
        .with_reconciler(processor.clone())
        .with_reconcile(
            ReconcileConfig::default()
                .with_settle(Duration::ZERO)
                .with_first_backoff(Duration::from_millis(10)),
        );
    let replicas = [
        Maintenance::spawn(store.clone(), config.clone()),
        Maintenance::spawn(store.clone(), config),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let counts = store.count_records().await.unwrap();
        let open = counts.get(RecordStateKind::InProgress) + counts.get(RecordStateKind::Unknown);
        if open == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} records still open after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for replica in replicas {
        replica.stop().await;
    }

    let counts = store.count_records().await.unwrap();
    assert_eq!(counts.get(RecordStateKind::Completed), (N / 2) as u64);
    assert_eq!(counts.get(RecordStateKind::NotPerformed), (N / 2) as u64);
    let jobs = store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(tenant),
            limit: 1000,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), N / 2, "one receipt per charge made: {jobs:?}");
    let lookups = processor.lookups.lock().unwrap();
    assert_eq!(lookups.len(), N, "every record was looked up");
    assert!(
        lookups.values().all(|&n| n == 1),
        "once per record, not once per loop: {lookups:?}"
    );
}

fn check_two_replicas(seen: &Seen) {
    const N: u64 = 40;
    assert_eq!(counter(seen, "idem_swept_total", &[]), N, "each swept once");
    assert_eq!(
        counter(seen, "idem_reconciled_total", &[("outcome", "completed")]),
        N / 2,
        "each charge made resolved once"
    );
    assert_eq!(
        counter(
            seen,
            "idem_reconciled_total",
            &[("outcome", "not_performed")]
        ),
        N / 2,
        "each charge never made resolved once"
    );
}

#[test]
fn two_maintenance_loops_on_one_sqlite_store_resolve_each_record_once() {
    let _serial = one_at_a_time();
    let dir = durable::temp_dir("replicas-sqlite");
    let path = dir.join("idem.sqlite3");
    let seen = recorded(|| async move {
        let store = idem_runtime::SqliteStore::open(&path).await.unwrap();
        two_maintenance_loops_resolve_each_record_once(Arc::new(store)).await;
    });
    check_two_replicas(&seen);
}

#[test]
fn two_maintenance_loops_on_one_postgres_store_resolve_each_record_once() {
    let _serial = one_at_a_time();
    let seen = recorded(|| async move {
        let Some(schema) = durable::PgSchema::new().await else {
            return;
        };
        two_maintenance_loops_resolve_each_record_once(Arc::new(schema.store.clone())).await;
    });
    if durable::database_url().is_some() {
        check_two_replicas(&seen);
    }
}
