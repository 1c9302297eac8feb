//! Pause points inside a store's own code, for a simulation that injects
//! delays (BUGGIFY, after FoundationDB's): where one store call is two
//! statements, a reader of the first and an action on what it read, the
//! gap between them is a window a store wrapper
//! ([`FaultyStore`](crate::store::conformance::FaultyStore)) cannot widen,
//! so the store asks a hook how long to wait there.
//!
//! The hook is given to the store's builder
//! ([`PostgresStoreBuilder::pause_hook`](crate::store::PostgresStoreBuilder::pause_hook)),
//! so it reaches that store only; a store built without one (every
//! deployment) asks nothing, and a point costs one check of an `Option`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A place in a store's code where a pause may be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PausePoint {
    /// PostgresStore's claim, between its `INSERT … ON CONFLICT` (which
    /// found a live record) and the read of that record: a record whose
    /// window ends in between must be claimed, not answered.
    PostgresClaimRead,
}

/// Decides how long to pause at a point (`None`: not at all).
pub type PauseHook = Arc<dyn Fn(PausePoint) -> Option<Duration> + Send + Sync>;

/// A store's pause hook, when its builder was given one.
#[derive(Clone, Default)]
pub(crate) struct Pauses(Option<PauseHook>);

impl fmt::Debug for Pauses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "Pauses(hook)",
            None => "Pauses(none)",
        })
    }
}

impl Pauses {
    /// Pauses asked of `hook`.
    pub(crate) fn new(hook: PauseHook) -> Self {
        Pauses(Some(hook))
    }

    /// Pauses at `point` as long as the hook says; at once without one.
    pub(crate) async fn at(&self, point: PausePoint) {
        if let Some(wait) = self.0.as_ref().and_then(|hook| hook(point)) {
            tokio::time::sleep(wait).await;
        }
    }
}
