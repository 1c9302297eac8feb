//! The operator: resolves by hand, from the legacy processor's ledger, the
//! records no reconciler can ask about, on a timer and once more at the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use idem_runtime::{
    maintenance::{resolve_by_hand, Outcome as Found, ResolveError},
    store::RecordState,
};
use tokio::time::Instant;

use super::world::{Outcome, Sim, Tool};

type Stack = Arc<dyn idem_runtime::IdempotencyStore>;

/// The truth about a legacy record, as an operator finds it at the
/// processor: performed, not performed, or not known yet.
fn truth(sim: &Sim, key: &[u8; 32]) -> Option<Found> {
    let w = sim.world();
    let m = w.keys.get(key)?;
    let now = Instant::now();
    if let Some(c) = sim.charge_of(&w, &m.reference) {
        return (now >= c.lands_at).then(|| {
            Found::completed(serde_json::to_string(&c.receipt()).expect("a receipt serializes"))
        });
    }
    let pending = w
        .requests
        .iter()
        .any(|r| r.reference == m.reference && r.outcome == Outcome::Pending);
    let live = w.runs.iter().any(|r| r.key == *key && r.live);
    (!pending && !live).then_some(Found::NotPerformed)
}

/// Resolves, by hand and from the truth, legacy records in doubt; returns
/// the keys it resolved.
async fn resolve_legacy(sim: &Arc<Sim>, store: &Stack, all: bool) -> Vec<[u8; 32]> {
    let candidates: Vec<([u8; 32], String, idem_runtime::Reference)> = {
        let w = sim.world();
        w.keys
            .iter()
            .filter(|(_, m)| !Tool::reconcilable(&m.tool))
            .map(|(k, m)| (*k, m.tenant.clone(), m.reference))
            .collect()
    };
    let mut resolved = Vec::new();
    for (key, tenant, reference) in candidates {
        let Some(record) = sim.peek(&tenant, &reference).await else {
            continue;
        };
        let in_doubt = matches!(record.state, RecordState::Unknown { .. }) || record.is_lapsed();
        if !in_doubt || (!all && !sim.rng().chance(0.5)) {
            continue;
        }
        let Some(outcome) = truth(sim, &key) else {
            continue;
        };
        let note = format!(
            "operator (seed {}): checked the legacy processor's ledger",
            sim.seed
        );
        let resolutions = |sim: &Sim| {
            sim.world()
                .resolutions
                .iter()
                .filter(|r| r.key == key)
                .count()
        };
        {
            let mut w = sim.world();
            let state = format!("{:?} lapsed={}", record.state.kind(), record.is_lapsed());
            sim.log(&mut w, || {
                format!("operator: {reference} seen {state}, found {outcome:?}; resolving")
            });
        }
        let before = resolutions(sim);
        let answer = resolve_by_hand(&**store, &tenant, &reference, &outcome, &note).await;
        let took_effect = resolutions(sim) > before;
        match answer {
            Ok(record) => {
                let ok = match (&record.state, &outcome) {
                    (RecordState::Completed { response }, Found::Completed { response: r, .. }) => response == r,
                    (RecordState::NotPerformed { .. }, Found::NotPerformed) => true,
                    _ => false,
                } && record.resolution.as_deref() == Some(note.as_str());
                if !ok {
                    sim.violate(format!("resolve_by_hand of {reference} answered {record:?} for {outcome:?}"));
                }
                sim.world().stats.bump("resolved by hand");
                resolved.push(key);
            }
            // The resolution took effect: resolve_by_hand must say so, even
            // when a purge or a new claim gets to the record before it reads
            // it back (found by seed 2586 and others; fixed).
            Err(e @ (ResolveError::NotFound { .. } | ResolveError::NotUnknown { .. })) if took_effect => {
                sim.violate(format!("resolve_by_hand of {reference} took effect, then answered: {e}"));
                resolved.push(key);
            }
            // A late completion or another resolution came first, or a
            // delayed release or purge removed it; or its handler came
            // back and ended UNKNOWN after the operator looked (found by
            // seed 56709; fixed); or the store failed (while faults are
            // on).
            Err(ResolveError::NotUnknown { .. } | ResolveError::NotFound { .. } | ResolveError::Changed { .. } | ResolveError::Store(_)) if !all => {}
            Err(e) => sim.violate(format!("resolve_by_hand of {reference} failed with the store healthy and nothing else running: {e}")),
        }
        sim.check_live("a resolution by hand").await;
    }
    resolved
}

pub async fn operate(sim: Arc<Sim>, store: Stack, stop: Arc<AtomicBool>) {
    let t = sim.timing.clone();
    loop {
        let pause = sim.rng().between(t.operator_every.0, t.operator_every.1);
        tokio::time::sleep(pause).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        resolve_legacy(&sim, &store, false).await;
    }
}

/// The legacy operations left in doubt, resolved by hand: returns one
/// operation per resolved record, to be called again.
pub async fn manual_leftovers(sim: &Arc<Sim>, store: &Stack) -> Vec<usize> {
    let resolved = resolve_legacy(sim, store, true).await;
    let w = sim.world();
    resolved
        .iter()
        .filter_map(|key| {
            let run = w.runs.iter().rev().find(|r| r.key == *key)?;
            Some(w.calls[run.call].plan.op)
        })
        .collect()
}
