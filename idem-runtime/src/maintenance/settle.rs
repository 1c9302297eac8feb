//! The settle period on the reconciling process's own monotonic clock.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::Reference;
use crate::store::{Attempt, Record};

/// The most records one [`SettleClock`] remembers. Past it, the records
/// seen longest ago are forgotten first: each then waits its settle period
/// again, from when it is next seen (later, never sooner).
const MAX_RECORDS: usize = 100_000;

/// When this process first saw each UNKNOWN record, on its own monotonic
/// clock.
///
/// "Not performed" is trusted only for a record that has been unchanged for
/// the settle period on the store's clock (its `updated_at`, checked by the
/// store when it resolves) *and* that this process has seen UNKNOWN for the
/// settle period on its own monotonic clock. The second holds whatever the
/// clocks of the replicas say: a replica whose wall clock runs ahead of the
/// one that marked the record cannot shorten it, and neither can a store
/// that takes its times from the writing process (SQLite, DynamoDB). The
/// price: a record this process first sees long after it was marked (a
/// replica that just started, say) waits one settle period more before a
/// "not performed" is trusted. A "completed" answer never waits.
///
/// [`reconcile`](super::reconcile) and [`Maintenance`](super::Maintenance)
/// use the process's own ([`SettleClock::process`]), which lives as long as
/// the process: on AWS Lambda, as long as the warm instance that runs the
/// scheduled rounds. A process that never lives a settle period (an
/// instance recycled on every invocation) never trusts "not performed": its
/// records stay UNKNOWN, never resolved wrongly, until an operator resolves
/// them (`idem resolve`). [`reconcile_with`](super::reconcile_with) takes
/// one of the caller's (a simulation of several processes in one, say).
#[derive(Debug, Default)]
pub struct SettleClock {
    seen: Mutex<HashMap<Seen, Sighting>>,
}

/// One record's operation instance: its tenant, reference and attempt (a
/// record claimed again is a new instance, seen anew).
type Seen = (String, Reference, Attempt);

#[derive(Clone, Copy, Debug)]
struct Sighting {
    first: Instant,
    last: Instant,
}

impl SettleClock {
    /// A clock that has seen nothing yet.
    pub fn new() -> Self {
        SettleClock::default()
    }

    /// The process's own clock, which [`reconcile`](super::reconcile) and
    /// [`Maintenance`](super::Maintenance) use.
    pub fn process() -> &'static SettleClock {
        static PROCESS: OnceLock<SettleClock> = OnceLock::new();
        PROCESS.get_or_init(SettleClock::new)
    }

    /// How many records it remembers.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Notes that `record` was seen UNKNOWN now; how long this process has
    /// seen it so (zero the first time).
    pub(crate) fn seen_for(&self, record: &Record) -> Duration {
        let now = Instant::now();
        let mut seen = self.lock();
        if seen.len() >= MAX_RECORDS && !seen.contains_key(&id(record)) {
            if let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
            {
                seen.remove(&oldest);
            }
        }
        let sighting = seen.entry(id(record)).or_insert(Sighting {
            first: now,
            last: now,
        });
        sighting.last = now;
        now.saturating_duration_since(sighting.first)
    }

    /// Forgets `record`: it was resolved, or is no longer UNKNOWN.
    pub(crate) fn forget(&self, record: &Record) {
        self.lock().remove(&id(record));
    }

    /// Forgets the records not seen for `unseen`: resolved elsewhere (by
    /// another replica, a late completion, an operator) or purged. One
    /// still UNKNOWN but unseen so long waits its settle period again.
    pub(crate) fn forget_unseen(&self, unseen: Duration) {
        let now = Instant::now();
        self.lock()
            .retain(|_, s| now.saturating_duration_since(s.last) < unseen);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Seen, Sighting>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn id(record: &Record) -> Seen {
    (record.tenant.clone(), record.reference, record.attempt)
}
