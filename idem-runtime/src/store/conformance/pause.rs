//! Pause points inside a store's own code, for a simulation that injects
//! delays (BUGGIFY, after FoundationDB's): where one store call is two
//! statements, a reader of the first and an action on what it read, the
//! gap between them is a window a store wrapper ([`FaultyStore`]) cannot
//! widen, so the store asks a hook how long to wait there.
//!
//! Why a hook compiled only with the `conformance` feature: a library user
//! never builds the feature (it is the test kit's), so the hook costs a
//! production build nothing at all; where the feature is on (this
//! repository's tests, examples and benches) and no hook is installed, a
//! point costs one relaxed atomic load. A `cfg` of its own would add a
//! feature to every build matrix for the same effect.
//!
//! [`FaultyStore`]: super::FaultyStore

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
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

static INSTALLED: AtomicBool = AtomicBool::new(false);
static HOOK: RwLock<Option<PauseHook>> = RwLock::new(None);

/// Installs `hook` for the whole process (`None` removes it). For
/// simulations only: every store of the process consults it.
pub fn set_pause_hook(hook: Option<PauseHook>) {
    let mut slot = HOOK.write().unwrap_or_else(|e| e.into_inner());
    INSTALLED.store(hook.is_some(), Ordering::Relaxed);
    *slot = hook;
}

/// Pauses at `point` as long as the installed hook says; at once when none
/// is installed. (Only PostgresStore has a point so far.)
#[cfg(feature = "postgres")]
pub(crate) async fn pause(point: PausePoint) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return;
    }
    let wait = {
        let hook = HOOK.read().unwrap_or_else(|e| e.into_inner());
        hook.as_ref().and_then(|h| h(point))
    };
    if let Some(wait) = wait {
        tokio::time::sleep(wait).await;
    }
}
