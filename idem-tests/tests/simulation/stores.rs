//! The store stack of a schedule:
//!
//! ```text
//! Executor, maintenance, operator
//!   → Observer      sees every won claim and every heartbeat, per key (oracle 4)
//!   → FaultyStore   delays, unreachable, answer lost; heartbeat outages
//!   → Recorder      sees every write that took effect: the model of each record
//!   → the store under test
//! ```
//!
//! The fault plan and what the layers share are here; each layer has its
//! module (`observer`, `recorder`, and `model` for the checks it makes).

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::conformance::{Call, Fault};
use idem_runtime::{store::FollowOnStore, IdempotencyStore};
use tokio::time::Instant;

use super::world::Sim;

/// The fault plan of one replica's connection to the store: only while
/// faults are on, drawn from the schedule's generator; nothing gets through
/// once the replica died or while the store is down.
pub fn plan(sim: Arc<Sim>, replica: usize) -> impl Fn(Call) -> Fault + Send + Sync + 'static {
    move |call| {
        let (on, outage, store_outage, dead) = {
            let w = sim.world();
            (
                w.faults_on,
                w.outage,
                w.store_outage,
                w.dead.get(replica).copied().unwrap_or(false),
            )
        };
        if dead {
            return Fault::Unreachable;
        }
        if !on {
            return Fault::None;
        }
        let now = Instant::now();
        let within = |period: Option<(Instant, Instant)>| {
            period.is_some_and(|(from, to)| now >= from && now < to)
        };
        if within(store_outage) || (call == Call::Heartbeat && within(outage)) {
            return Fault::Unreachable;
        }
        // BUGGIFY first, from its own generator (so with it off the
        // schedule draws what it always drew).
        let buggified = sim.buggify().fault(call, &sim.timing);
        if let Some((point, fault)) = buggified {
            sim.world().stats.bump(point.name());
            return fault;
        }
        let mut rng = sim.rng();
        match rng.below(1000) {
            0..=29 => Fault::Unreachable,
            30..=49 => Fault::AnswerLost,
            50..=149 => {
                Fault::Delay(rng.between(Duration::from_millis(1), sim.timing.store_delay_max))
            }
            _ => Fault::None,
        }
    }
}

/// The inner store's jobs: only reached once `follow_ons()` said there are
/// some.
pub(super) fn jobs_of(store: &dyn IdempotencyStore) -> &dyn FollowOnStore {
    store
        .follow_ons()
        .expect("follow_ons() is Some only when the inner store keeps jobs")
}
