//! When a repeat of a running call should ask again: the hint an
//! in-progress answer gives (`retryAfterSeconds`), from how long the call
//! has run and how long the tool's recent calls took.
//!
//! A model obeys the hint. What remains of the lease (up to 30 s) says only
//! when the claim would be given up for dead, so a repeat of a 400 ms tool
//! waited 29 s for a result that was ready at once. The estimate is per
//! process (each [`Executor`](super::Executor) and its clones keep their
//! own) and costs nothing in the store; another replica, without history of
//! the tool, still knows how long the call has run (the record's claim
//! time).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// The shortest hint: a hint is in whole seconds, and zero would invite a
/// repeat at once.
const SHORTEST: Duration = Duration::from_secs(1);

/// The most tools whose durations are kept: tools are few, and a caller of
/// `Executor::run` with made-up names must not grow the table without end.
const MOST_TOOLS: usize = 1024;

/// The most slots a thread keeps at hand (see [`ToolDurations::record`]);
/// past it, the thread's list starts over.
const MOST_AT_HAND: usize = 64;

/// Each tool's recent handler durations, as a moving estimate.
#[derive(Debug)]
pub(super) struct ToolDurations {
    /// Which table this is, for the threads' lists of slots at hand: never
    /// reused, unlike an address.
    id: u64,
    /// Microseconds, an exponentially weighted average of the tool's
    /// handler runs (each new run weighs a quarter).
    tools: RwLock<HashMap<Box<str>, Arc<AtomicU64>>>,
}

impl Default for ToolDurations {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        ToolDurations {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            tools: RwLock::default(),
        }
    }
}

/// One step of the moving estimate: the sample weighs a quarter. Two runs
/// ending at once may each overwrite the other's step (an estimate, not a
/// count); an unchanged estimate is not written.
fn step(average: &AtomicU64, sample: u64) {
    let old = average.load(Ordering::Relaxed);
    let new = old - old / 4 + sample / 4;
    if new != old {
        average.store(new, Ordering::Relaxed);
    }
}

/// A slot a thread keeps at hand: (table, tool, its estimate).
type AtHand = (u64, Box<str>, Arc<AtomicU64>);

thread_local! {
    static AT_HAND: RefCell<Vec<AtHand>> = const { RefCell::new(Vec::new()) };
}

impl ToolDurations {
    /// Notes that a run of `tool`'s handler took `took`.
    ///
    /// Called once per call that ran, from every worker thread, so it
    /// writes nothing shared that it need not: a thread finds the tool's
    /// slot in its own list (the table's lock, taken by every call, kept
    /// two cores passing its cache line back and forth; BENCHMARKS.md, "The
    /// executor on MemoryStore"), and the estimate is stored only when it
    /// changed.
    pub(super) fn record(&self, tool: &str, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        // The slot is borrowed where the thread keeps it: a clone of its
        // `Arc` would be a shared write of its own.
        let noted = AT_HAND.with(|list| {
            let list = list.try_borrow().ok()?;
            let (_, _, average) = list
                .iter()
                .find(|(id, name, _)| *id == self.id && **name == *tool)?;
            step(average, sample);
            Some(())
        });
        if noted.is_none() {
            self.record_in_table(tool, sample);
        }
    }

    /// [`ToolDurations::record`] through the table, once per thread and
    /// tool: the tool's slot (added with `sample` as its estimate if it is
    /// new and there is room), then kept at hand by this thread.
    fn record_in_table(&self, tool: &str, sample: u64) {
        let slot = {
            let mut tools = self.tools.write().unwrap_or_else(PoisonError::into_inner);
            match tools.get(tool) {
                Some(slot) => {
                    step(slot, sample);
                    slot.clone()
                }
                None if tools.len() < MOST_TOOLS => {
                    let slot = Arc::new(AtomicU64::new(sample));
                    tools.insert(tool.into(), slot.clone());
                    slot
                }
                None => return,
            }
        };
        AT_HAND.with(|list| {
            if let Ok(mut list) = list.try_borrow_mut() {
                if list.len() >= MOST_AT_HAND {
                    list.clear();
                }
                list.push((self.id, tool.into(), slot));
            }
        });
    }

    /// How long `tool`'s handler usually takes, if it ran here before.
    pub(super) fn expected(&self, tool: &str) -> Option<Duration> {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        tools
            .get(tool)
            .map(|average| Duration::from_micros(average.load(Ordering::Relaxed)))
    }

    /// The hint for a repeat of `tool`'s call that has run for `elapsed`,
    /// with `lease_left` of its lease to go: see [`retry_hint`].
    pub(super) fn retry_hint(
        &self,
        tool: &str,
        elapsed: Duration,
        lease_left: Duration,
    ) -> Duration {
        retry_hint(elapsed, self.expected(tool), lease_left)
    }
}

/// When to ask again about a call that has run for `elapsed`, of a tool
/// whose runs take `expected` (if known), whose lease holds `lease_left`
/// more:
///
/// - with history, what remains of the usual duration;
/// - with none, or once the call has outrun it, as long again as it has run
///   so far: a model then asks at most about twice the true duration, and
///   a long call is asked about a number of times that grows with the
///   logarithm of its duration, never once a second;
///
/// never under 1 s, and never past the lease (after it, the record reads
/// as unknown, and the status tool says so).
pub(super) fn retry_hint(
    elapsed: Duration,
    expected: Option<Duration>,
    lease_left: Duration,
) -> Duration {
    let guess = match expected {
        Some(expected) if expected > elapsed => expected - elapsed,
        _ => elapsed,
    };
    guess.max(SHORTEST).min(lease_left.max(SHORTEST))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_hint_is_what_remains_of_the_usual_duration_or_as_long_again() {
        let lease = MS(29_700);
        // 300 ms into a tool whose runs take 400 ms: ask again at once.
        assert_eq!(retry_hint(MS(300), Some(MS(400)), lease), MS(1000));
        // 1 s into a tool whose runs take 10 s: 9 s more.
        assert_eq!(retry_hint(MS(1000), Some(MS(10_000)), lease), MS(9000));
        // No history: as long again as it has run, at least 1 s.
        assert_eq!(retry_hint(MS(300), None, lease), MS(1000));
        assert_eq!(retry_hint(MS(5000), None, lease), MS(5000));
        // Past its usual duration: as long again.
        assert_eq!(retry_hint(MS(6000), Some(MS(400)), lease), MS(6000));
        // Never past the lease, never under 1 s.
        assert_eq!(retry_hint(MS(20_000), None, MS(4000)), MS(4000));
        assert_eq!(retry_hint(MS(20_000), None, MS(200)), MS(1000));
    }

    #[test]
    fn the_estimate_follows_the_recent_runs() {
        let durations = ToolDurations::default();
        assert_eq!(durations.expected("charge"), None);
        durations.record("charge", MS(400));
        assert_eq!(durations.expected("charge"), Some(MS(400)));
        for _ in 0..20 {
            durations.record("charge", MS(2000));
        }
        let now = durations.expected("charge").unwrap();
        assert!(now > MS(1950) && now <= MS(2000), "{now:?}");
        assert_eq!(durations.expected("refund"), None, "per tool");
    }

    #[test]
    fn each_table_keeps_its_own_estimates_whatever_the_threads_kept_at_hand() {
        // One thread records into two tables in turn, then into a new table
        // made after one was dropped: no slot of another table is used.
        let a = ToolDurations::default();
        let b = ToolDurations::default();
        for _ in 0..3 {
            a.record("charge", MS(400));
            b.record("charge", MS(8000));
        }
        assert_eq!(a.expected("charge"), Some(MS(400)));
        assert_eq!(b.expected("charge"), Some(MS(8000)));
        drop(a);
        let c = ToolDurations::default();
        assert_eq!(c.expected("charge"), None);
        c.record("charge", MS(1000));
        c.record("charge", MS(1000));
        assert_eq!(c.expected("charge"), Some(MS(1000)));
        // Another thread's records land in the same table.
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..40 {
                    c.record("charge", MS(3000));
                }
            });
        });
        let now = c.expected("charge").unwrap();
        assert!(now > MS(2950) && now <= MS(3000), "{now:?}");
        // More tools than a thread keeps at hand.
        for i in 0..(MOST_AT_HAND + 8) {
            c.record(&format!("tool{i}"), MS(i as u64 + 1));
            c.record(&format!("tool{i}"), MS(i as u64 + 1));
        }
        for i in 0..(MOST_AT_HAND + 8) {
            assert_eq!(c.expected(&format!("tool{i}")), Some(MS(i as u64 + 1)));
        }
    }
}
