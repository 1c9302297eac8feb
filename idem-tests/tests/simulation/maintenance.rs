//! The maintenance of a schedule on its timer (sweep, reconcile, purge),
//! and the checks at its end: oracle 5 and the model against the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    maintenance::{purge, reconcile_with, sweep, ReconcileConfig, SettleClock},
    store::RecordState,
};

use super::processor::SimReconciler;
use super::scenario::Stack;
use super::world::{Receipt, Sim, Tool};

/// One replica's maintenance (`reconciler.replica`), until `stop` or the
/// replica dies.
pub(super) async fn maintain(
    sim: Arc<Sim>,
    store: Stack,
    reconciler: SimReconciler,
    config: ReconcileConfig,
    stop: Arc<AtomicBool>,
) {
    let replica = reconciler.replica;
    let t = sim.timing.clone();
    // The maintaining process's own monotonic clock (the paused one).
    let settle_clock = SettleClock::new();
    loop {
        let pause = t.interval + sim.rng().between(Duration::ZERO, t.jitter);
        tokio::time::sleep(pause).await;
        let dead = sim.world().dead.get(replica).copied().unwrap_or(false);
        if stop.load(Ordering::SeqCst) || dead {
            return;
        }
        let swept = sweep(&*store, 250).await;
        let reconciled = reconcile_with(&*store, &reconciler, &config, &settle_clock).await;
        let purged = purge(&*store, 250).await;
        sim.check_live("a maintenance round").await;
        let mut w = sim.world();
        w.stats.bump("maintenance rounds");
        for failed in [swept.is_err(), reconciled.is_err(), purged.is_err()] {
            if failed {
                w.stats.bump("maintenance job failed");
            }
        }
        if let Ok(r) = reconciled {
            for _ in 0..r.not_mine {
                w.stats.bump("reconciler: not mine");
            }
            for _ in 0..r.checked_elsewhere {
                w.stats.bump("reconcile: checked by another replica");
            }
        }
    }
}

/// Oracle 5 (every UNKNOWN record a reconciler can resolve is resolved within
/// the bound), the stored responses (oracle 2), and the model against the
/// store.
pub(super) async fn final_checks(sim: &Arc<Sim>) {
    let keys: Vec<_> = {
        let w = sim.world();
        w.keys
            .iter()
            .map(|(k, m)| {
                (
                    *k,
                    m.tenant.clone(),
                    m.tool.clone(),
                    m.reference,
                    m.snapshot.clone(),
                )
            })
            .collect()
    };
    let tol = sim.timing.tolerance;
    for (_key, tenant, tool, reference, snapshot) in keys {
        let actual = sim.peek(&tenant, &reference).await;
        // Judged at the read (or just after it), not at the start of the
        // checks: in real time, hundreds of reads take long enough for a
        // record's retention to end meanwhile, and a store may stop
        // returning a record the moment its life ends, purged or not.
        let now = (sim.clock)();
        let mut problems = Vec::new();
        match (&actual, &snapshot) {
            (None, None) => {}
            (None, Some(s)) => {
                // An operation's record reads until its retention ends,
                // however it settled.
                let end = match s.state {
                    RecordState::Completed { .. } | RecordState::NotPerformed { .. } => {
                        s.retain_until
                    }
                    _ => s.retain_until.max(s.lease_until),
                };
                if end > now + tol {
                    problems.push(format!(
                        "the {} record is gone {:?} before it expires",
                        s.state.name(),
                        end.duration_since(now).unwrap_or_default()
                    ));
                }
            }
            (Some(a), None) => problems.push(format!(
                "the store holds a {} record the model released",
                a.state.name()
            )),
            (Some(a), Some(s)) => {
                if a.attempt != s.attempt || a.state.kind() != s.state.kind() {
                    problems.push(format!(
                        "the store holds {} of {:?}, the model {} of {:?}",
                        a.state.name(),
                        a.attempt,
                        s.state.name(),
                        s.attempt
                    ));
                }
            }
        }
        if let Some(a) = &actual {
            if Tool::reconcilable(&tool) {
                match &a.state {
                    RecordState::Unknown { note } => problems.push(format!(
                        "oracle 5 (reconciled within the bound): still UNKNOWN ({note}) {:?} after the processor became consistent; checked {} times, next check in {:?}",
                        sim.timing.reconcile_bound(),
                        a.checks,
                        a.next_check_at.duration_since(a.observed_at).unwrap_or_default()
                    )),
                    RecordState::InProgress => problems.push(format!(
                        "oracle 5 (reconciled within the bound): still IN_PROGRESS, lease {} at the end",
                        if a.is_lapsed() { "lapsed" } else { "live" }
                    )),
                    _ => {}
                }
            }
            if let RecordState::Completed { response } = &a.state {
                let w = sim.world();
                let stored: Option<Receipt> = serde_json::from_str(response).ok();
                match (stored, sim.charge_of(&w, &reference)) {
                    (Some(s), Some(c)) if s.charge_id == c.id && s.reference == reference.to_string() => {}
                    (s, c) => problems.push(format!(
                        "oracle 2 (a replay is this effect): COMPLETED with {s:?}, the processor holds {c:?}"
                    )),
                }
            }
        }
        let mut w = sim.world();
        for p in problems {
            sim.violation(&mut w, format!("{reference} ({tool}): {p}"));
        }
    }
}
