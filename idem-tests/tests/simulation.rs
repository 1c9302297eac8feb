//! A deterministic simulation of the whole lifecycle of an operation: many
//! callers repeating calls at random times, a store that delays, fails and
//! loses answers, handlers that time out (their client sending the request
//! again under the same reference first), panic, are dropped mid-call or
//! outlive their lease while heartbeats fail, a processor that deduplicates
//! by reference for a day (like Stripe), lands requests late and shows them
//! later still, purchases repeated after their window (a new operation the
//! user wants), and the maintenance jobs (sweep, reconcile with settle and
//! backoff, purge) on every replica and an operator resolving by hand, on
//! their timers. In half the schedules the replicas' clocks are skewed
//! (`replica_clocks`; drifting in a quarter), and in half they answer repeats from a replay cache
//! (`Sim::replay_cache`).
//!
//! One seed drives one schedule: on MemoryStore, a single-threaded tokio
//! runtime on a paused clock (simulated minutes cost nothing) with every
//! decision drawn from the seed's generator, so a seed replays exactly. The
//! same schedule runs against SqliteStore, PostgresStore and DynamoDbStore
//! (on the emulator, fewer seeds) in real time,
//! with short durations.
//!
//! After every event (an answer, a maintenance step, a resolution by hand,
//! each write that takes effect) and at the end, the oracles check:
//!
//! 1. effects at the processor: at most one per operation instance (the
//!    same call within its window: a claim taking over an expired record
//!    starts a new one), across every reference claimed inside it (a run
//!    released and run again under a new reference is the same instance);
//!    no two handlers of one operation at once; no live record taken over;
//! 2. a caller told Executed or Replayed got that effect (its charge id);
//! 3. a caller told that nothing was executed (refused, store unavailable,
//!    rejected, in progress, conflict) caused no effect by its own call;
//! 4. a live handler whose heartbeats land is never UNKNOWN;
//! 5. every UNKNOWN record a reconciler can resolve is resolved within its
//!    bound once the processor is consistent;
//! 6. nothing of one tenant is readable by another;
//! 7. a record resolved NOT_PERFORMED had no effect (and none on its way);
//! 8. a wanted operation gets its own effect, none is suppressed: every
//!    instance of a window-scoped operation that is answered as executed or
//!    stored as COMPLETED holds a charge made by its own handler runs (so no
//!    two operations are credited with one charge), and a call made after
//!    the window of its operation's COMPLETED instance (the window the
//!    executor asked for, counted from the claim, never from the record's
//!    expiry, with a margin) is not answered with that operation's charge
//!    or an earlier one, however late that instance was completed;
//! 9. follow-ons: each delivered exactly once, under its own key;
//! 10. every reference a caller was given reads, until its retention ends
//!     (counted from its claim), as what really happened: COMPLETED with a
//!     charge made under it when the processor holds one, NOT_PERFORMED or
//!     not found only when nothing was sent under it, never another
//!     operation's record, even once a new operation took its key; and
//!     settled once everything is reconciled. Read through the status tool
//!     and `lookup`, now and then during the schedule (old references
//!     included) and at its end (`simulation/references.rs`);
//! 11. the processor is asked about one operation by one replica at a time:
//!     every replica maintains, and no replica asks about a record while
//!     another's lookup of it is in flight (asked, its answer not yet acted
//!     on or given up), so a processor's rate-limited lookup API sees one
//!     question per check, not one per replica;
//! 12. nothing ran stays true: a claim whose caller was told nothing ran
//!     (BUGGIFY's `ClaimLandsLate`: the store applies it after its caller
//!     gave up) is never presented to a call made more than two leases
//!     after its send, and within that bound only as in progress with a
//!     retry-after ending within it (or a held business key);
//! 13. client keys (`simulation/client_keys.rs`): some callers' hosts send
//!     an idempotency key, kept by their retries; a wanted repeat comes under
//!     a new key, and some keys are reused with other arguments or by
//!     another caller. One effect per client key per caller; an answer with
//!     a charge carries one made for this caller, key and arguments (a new
//!     key runs); a conflict runs nothing and answers only a key that was
//!     sent with other arguments too.
//!
//! Beside them, the recording store checks every write that takes effect
//! against a model of the record (a claim takes over only an expired or
//! NOT_PERFORMED record, a sweep marks only a lapsed lease, NOT_PERFORMED
//! only after the settle period, no record vanishes before its retention
//! ends).
//! `simulation_oracles_catch_sabotage` shows that each oracle can fail: each
//! switch in `Sabotage` breaks one thing on purpose and must be caught.
//!
//! Environment: `IDEM_SIM_SEED=n` runs seed n only (and prints its trace
//! when it fails, or with `IDEM_SIM_TRACE=1`); `IDEM_SIM_SEEDS=n` sets how
//! many seeds each store runs; `IDEM_SIM_START=n` the first seed;
//! `IDEM_SIM_STATS=1` prints what the schedules covered;
//! `IDEM_SIM_SABOTAGE_SCAN=n` prints how many of n schedules
//! catch each sabotage.
//!
//! The memory run needs tokio's `test-util` feature (the paused clock).

/// A line on the process's own stderr: the test harness captures `println!`
/// of passing tests, and each store's summary line must show in CI's log.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{IdempotencyStore, MemoryStore};

#[path = "durable/mod.rs"]
mod durable;
#[path = "dynamodb_emulator/mod.rs"]
mod dynamodb_emulator;
#[path = "redis_server/mod.rs"]
mod redis_server;

mod simulation {
    pub mod answers;
    pub mod buggify;
    pub mod callers;
    pub mod client_keys;
    pub mod continuations;
    pub mod durable_runs;
    pub mod follow_ons;
    pub mod maintenance;
    pub mod model;
    pub mod observer;
    pub mod operator;
    pub mod processor;
    pub mod recorder;
    pub mod references;
    pub mod rng;
    pub mod scenario;
    pub mod stores;
    pub mod timing;
    pub mod world;
}

use simulation::scenario::{self, Report};
use simulation::timing::Timing;
use simulation::world::{Sabotage, Stats};

/// The tests of this file run one at a time: each uses every core, and the
/// real-time ones must not be starved by the others.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    quiet_sim_panics();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handlers panic on purpose ("sim-panic"); the executor catches them. Keep
/// the default hook's message for every other panic.
fn quiet_sim_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = panic_text(info.payload());
            if !text.contains("sim-panic") {
                previous(info);
            }
        }));
    });
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_owned()
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
    )
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Which seeds to run: `IDEM_SIM_SEED` alone, or `IDEM_SIM_SEEDS` (or
/// `default`) from `IDEM_SIM_START` (or 0).
fn seeds(default: u64) -> (Vec<u64>, bool) {
    if let Some(seed) = env_u64("IDEM_SIM_SEED") {
        return (vec![seed], true);
    }
    let n = env_u64("IDEM_SIM_SEEDS").unwrap_or(default);
    let start = env_u64("IDEM_SIM_START").unwrap_or(0);
    ((start..start + n).collect(), false)
}

/// One schedule on MemoryStore, on its own paused single-threaded runtime.
fn memory_seed(seed: u64, sabotage: Sabotage, trace: bool) -> Report {
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            // The references a schedule's operations get are drawn on this
            // thread: from the seed, so that the schedule replays exactly.
            idem_runtime::store::conformance::seed_this_thread(
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            );
            let start = tokio::time::Instant::now();
            let base = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let clock: Arc<dyn Fn() -> SystemTime + Send + Sync> =
                Arc::new(move || base + start.elapsed());
            let store_clock = clock.clone();
            let memory = MemoryStore::with_clock(move || store_clock());
            // Each replica's own clock, off the true one by an offset drawn
            // from the seed that drifts as the schedule goes (none in half
            // the schedules).
            let mut timing = Timing::paused();
            let clocks = replica_clocks(seed, &mut timing);
            let views: Vec<Arc<dyn IdempotencyStore>> = clocks
                .iter()
                .map(|&own| {
                    let clock = clock.clone();
                    Arc::new(memory.sharing_with_clock(move || {
                        let now = clock();
                        skewed(
                            now,
                            own.offset_ms(now.duration_since(base).unwrap_or_default()),
                        )
                    })) as Arc<dyn IdempotencyStore>
                })
                .collect();
            let store: Arc<dyn IdempotencyStore> = Arc::new(memory);
            let mut report =
                scenario::run(seed, timing, sabotage, trace, store, clock, views).await;
            if clocks.iter().any(|c| !c.is_true()) {
                report.stats.bump("schedules with skewed clocks");
            }
            if clocks.iter().any(|c| c.drift_ppm != 0) {
                report.stats.bump("schedules with drifting clocks");
            }
            report
        })
    }));
    run.unwrap_or_else(|panic| Report {
        violations: vec![format!("the schedule panicked: {}", panic_text(&*panic))],
        ..Report::default()
    })
}

/// The most a replica's clock is off the true one, in milliseconds: two
/// replicas differ by at most twice this, 1.3 s, inside the stated bound
/// (docs/clocks.md: under 0.7 of the 2 s lease, the sweep's).
const MAX_OFFSET_MS: i64 = 650;

/// How far off the true clock a replica is in a tight schedule: two replicas
/// 660 ms apart, under a third of the 2 s lease (the sweep's bound,
/// docs/clocks.md).
const TIGHT_OFFSET_MS: i64 = 330;

/// A replica's own clock: off the true one by `start_ms` at the start, and
/// drifting by `drift_ppm` (millionths of the elapsed time, either way),
/// turning back at ±[`MAX_OFFSET_MS`] as a clock that a time daemon steers
/// back does, so it never leaves the bound and never runs backwards.
#[derive(Clone, Copy, Debug)]
struct OwnClock {
    start_ms: i64,
    drift_ppm: i64,
}

impl OwnClock {
    const TRUE: OwnClock = OwnClock {
        start_ms: 0,
        drift_ppm: 0,
    };

    fn is_true(&self) -> bool {
        self.start_ms == 0 && self.drift_ppm == 0
    }

    /// How far the clock is off the true one `elapsed` into the schedule:
    /// a triangle wave between the bounds.
    fn offset_ms(&self, elapsed: Duration) -> i64 {
        let moved = (elapsed.as_micros() as i64).saturating_mul(self.drift_ppm) / 1_000_000_000;
        let span = 2 * MAX_OFFSET_MS;
        // Position on a line of length 2 * span folded back on itself.
        let at = (self.start_ms + MAX_OFFSET_MS + moved).rem_euclid(2 * span);
        let folded = if at <= span { at } else { 2 * span - at };
        folded - MAX_OFFSET_MS
    }
}

/// The replicas' own clocks, from the seed through a generator of their own
/// (so the rest of the schedule draws what it drew before skew existed): in
/// half the schedules true; in the others each replica's clock starts within
/// ±650 ms of the true one, and in half of those it drifts, up to 2 % either
/// way, turning back at the bound (far faster than a real clock, so that one
/// schedule's minute sweeps the whole range and every pair of replicas meets
/// at the extremes of the bound). Two replicas
/// differ by at most 1.3 s, inside the stated bound and past the margin the
/// settle period leaves over the time a request takes to show (down to
/// 0.1 s here), which only the reconciling process's own clock covers. A
/// quarter of the skewed schedules are tight: the replicas' clocks at
/// opposite ends of the sweep's bound (660 ms apart), maintenance every 250 ms, a processor that
/// shows nothing until it is visible and is slow to show what landed,
/// long requests and impatient clients, so that a reconciler acts the
/// moment a record seems settled by a clock ahead while a request sent just
/// before the record was marked does not show yet. `timing` takes the consequences the docs state: the model's comparisons
/// across clocks allow the spread, and oracle 8 does not judge a call within
/// twice the spread of its window's end (a replica ahead takes a record
/// over that much early; one behind answers that much late).
fn replica_clocks(seed: u64, timing: &mut Timing) -> Vec<OwnClock> {
    let mut rng = simulation::rng::Rng::new(seed ^ 0xC10C_5E3D_0FF5_E75A);
    if !rng.chance(0.5) {
        return vec![OwnClock::TRUE; scenario::REPLICAS];
    }
    let mut clocks: Vec<OwnClock> = (0..scenario::REPLICAS)
        .map(|_| OwnClock {
            start_ms: rng.below(2 * MAX_OFFSET_MS as u64 + 1) as i64 - MAX_OFFSET_MS,
            drift_ppm: 0,
        })
        .collect();
    // A generator of its own again: the offsets above are drawn as before
    // drift existed.
    let mut drift = simulation::rng::Rng::new(seed ^ 0xD21F_7C10_C5A1_0E77);
    if drift.chance(0.5) {
        for clock in &mut clocks {
            clock.drift_ppm = drift.below(40_001) as i64 - 20_000;
        }
    }
    if drift.chance(0.25) {
        // Tight: the replicas at opposite ends of the sweep's bound (two
        // clocks under a third of the lease apart: no live handler is
        // swept), so that every promise holds, "not performed" included;
        // maintenance every 250 ms; a processor that shows nothing until it is
        // visible, slow to show what landed; a store slow to answer claims
        // (answered after their first heartbeat was due, in time); long
        // requests at the top of their range, and impatient clients that drop calls soon after
        // they were made, so a record is marked unknown with its request
        // still on its way.
        let ahead = if drift.chance(0.5) { 1 } else { -1 };
        for (i, clock) in clocks.iter_mut().enumerate() {
            clock.start_ms = if i % 2 == 0 { ahead } else { -ahead } * TIGHT_OFFSET_MS;
            clock.drift_ppm = 0;
        }
        timing.interval = Duration::from_millis(250);
        timing.jitter = Duration::from_millis(50);
        timing.lag_min = timing.lag_max * 9 / 10;
        timing.hides_in_flight = true;
        timing.slow_claims = true;
        timing.long_rate = 0.6;
        timing.latency_long.0 = timing.latency_long.1 * 9 / 10;
        timing.prework_max = Duration::from_millis(200);
        timing.cancel_rate = 0.5;
        timing.cancel_max = Duration::from_millis(1_000);
    }
    let spread = if clocks.iter().any(|c| c.drift_ppm != 0) {
        2 * MAX_OFFSET_MS
    } else {
        let starts = || clocks.iter().map(|c| c.start_ms).chain([0]);
        starts().max().unwrap() - starts().min().unwrap()
    };
    timing.tolerance = Duration::from_millis(spread as u64);
    timing.window_margin = timing
        .window_margin
        .max(timing.tolerance * 2 + Duration::from_millis(50));
    clocks
}

/// `t` moved by `offset_ms`.
fn skewed(t: SystemTime, offset_ms: i64) -> SystemTime {
    let by = Duration::from_millis(offset_ms.unsigned_abs());
    if offset_ms >= 0 {
        t + by
    } else {
        t - by
    }
}

/// Prints the store's line (and the failing seeds) and returns how many
/// violations were found.
pub fn summarize(
    store: &str,
    test: &str,
    results: &[(u64, Report)],
    schedules: usize,
    single: bool,
) -> usize {
    let mut stats = Stats::default();
    let mut violations = 0;
    for (seed, report) in results {
        stats.add(&report.stats);
        if report.violations.is_empty() {
            continue;
        }
        violations += report.violations.len();
        say!(
            "simulation: {store}: seed {seed}: {} violation(s):",
            report.violations.len()
        );
        for v in report.violations.iter().take(8) {
            say!("    {v}");
        }
        say!(
            "  replay: IDEM_SIM_SEED={seed} cargo test --test simulation {test} -- --nocapture{}",
            if store == "memory" {
                ""
            } else {
                "  (real time: the same schedule; the interleaving may differ)"
            }
        );
    }
    for (seed, report) in results {
        if single && (env_flag("IDEM_SIM_TRACE") || !report.violations.is_empty()) {
            say!("simulation: {store}: trace of seed {seed}:");
            for line in &report.log {
                say!("  {line}");
            }
        }
    }
    say!("simulation: {store}: {schedules} schedules, {violations} violations");
    if violations > 0 {
        // Which oracles failed, over every violation (not only those shown).
        let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
        for v in results.iter().flat_map(|(_, r)| &r.violations) {
            let oracle = v
                .find("oracle ")
                .and_then(|i| v[i..].find(" (").map(|j| &v[i..i + j]))
                .unwrap_or("other");
            *by.entry(oracle).or_default() += 1;
        }
        let line: Vec<String> = by.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        say!(
            "simulation: {store}: violations by oracle: {}",
            line.join(", ")
        );
    }
    if env_flag("IDEM_SIM_STATS") || single {
        let line: Vec<String> = stats
            .counts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        say!("simulation: {store}: covered: {}", line.join(", "));
    }
    violations
}

#[test]
fn simulation_memory() {
    let _serial = serial();
    // CI's count; the long runs (RELIABILITY.md) set IDEM_SIM_SEEDS.
    let (seeds, single) = seeds(10_000);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let next = AtomicU64::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                let Some(&seed) = seeds.get(i) else { break };
                let report = memory_seed(seed, Sabotage::None, single);
                let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
                results.push((seed, report));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(seed, _)| *seed);
    let violations = summarize("memory", "simulation_memory", &results, seeds.len(), single);
    assert_eq!(violations, 0, "the simulation found violations (see above)");
}

/// Seeds that the long runs (RELIABILITY.md) found violating a promise,
/// each kept after its fix: CI's 10,000 schedules do not reach them.
/// - 109844, 148661, 242939: a NOT_PERFORMED record taken over by a
///   replica whose clock was behind, within the clocks' spread of its
///   window's end, continued the first operation under its reference, as
///   the store's rule allows there; the simulation's model counted a new
///   operation and oracle 8 saw the processor answer it with the first
///   try's decline. The model now takes the store's answer at that edge.
/// - 89407, 34891: a claim given up on landed while every release of it
///   on its way stalled (an injected write stall past the release's own
///   timeout, then the store unreachable); a repeat found its lease run
///   out and was told `unknown`. Oracle 12 excuses that (the store could
///   not be told to take the claim back), but judged a release still on
///   its way when the call was answered as not slow yet, and left out one
///   sent just before the claim landed and stalled across it. It now
///   counts every release on its way while the claim could be taken back,
///   and judges one still open by how it ended.
const KNOWN_SEEDS: [u64; 5] = [109844, 148661, 242939, 89407, 34891];

#[test]
fn simulation_memory_known_seeds() {
    let _serial = serial();
    let results: Vec<(u64, Report)> = KNOWN_SEEDS
        .iter()
        .map(|&seed| (seed, memory_seed(seed, Sabotage::None, false)))
        .collect();
    let violations = summarize(
        "memory",
        "simulation_memory_known_seeds",
        &results,
        KNOWN_SEEDS.len(),
        false,
    );
    assert_eq!(violations, 0, "a known seed found violations (see above)");
}

/// A seed replays exactly: the same trace, event for event.
#[test]
fn simulation_replays_a_seed_exactly() {
    let _serial = serial();
    for seed in 0..20 {
        let a = memory_seed(seed, Sabotage::None, true);
        let b = memory_seed(seed, Sabotage::None, true);
        assert!(a.log.len() > 20, "seed {seed} traced too little");
        if a.log != b.log {
            let at = a.log.iter().zip(&b.log).position(|(x, y)| x != y);
            panic!(
                "seed {seed} did not replay: first difference at event {at:?}: {:?} / {:?}",
                at.map(|i| &a.log[i]),
                at.map(|i| &b.log[i])
            );
        }
    }
}

/// The oracles can fail: each sabotage is caught, by the oracle meant to
/// catch it, within a few schedules.
#[test]
fn simulation_oracles_catch_sabotage() {
    let _serial = serial();
    let expected = |s: Sabotage| -> &'static [&'static str] {
        match s {
            Sabotage::None => &[],
            Sabotage::NoDedupe => &["oracle 1"],
            Sabotage::LateVisibility | Sabotage::InFlightNotPerformed => &["oracle 7", "oracle 1"],
            Sabotage::RejectAfterEffect => &["oracle 3"],
            Sabotage::WrongCompletion => &["oracle 2"],
            Sabotage::ReconcilerStuck => &["oracle 5"],
            Sabotage::LeakyLookup => &["oracle 6"],
            Sabotage::HideHeartbeatFailures => &["oracle 4"],
            Sabotage::StaleReference => &["oracle 8"],
            Sabotage::ForgetSuperseded => &["oracle 10"],
            Sabotage::EveryReplicaAsks => &["oracle 11"],
            Sabotage::IgnoreClientKey => &["oracle 13"],
        }
    };
    // IDEM_SIM_SABOTAGE_SCAN=n: how many of n schedules catch each one.
    let scan = env_u64("IDEM_SIM_SABOTAGE_SCAN");
    for sabotage in Sabotage::ALL {
        let catches = |seed: u64| {
            let report = memory_seed(seed, sabotage, false);
            report
                .violations
                .iter()
                .find(|v| expected(sabotage).iter().any(|o| v.contains(o)))
                .cloned()
        };
        if let Some(n) = scan {
            let caught = (0..n).filter(|seed| catches(*seed).is_some()).count();
            println!("simulation: sabotage {sabotage:?}: caught in {caught} of {n} schedules");
            continue;
        }
        match (0..300).find_map(|seed| catches(seed).map(|v| (seed, v))) {
            Some((seed, v)) => {
                println!("simulation: sabotage {sabotage:?}: caught by seed {seed}: {v}")
            }
            None => panic!(
                "sabotage {sabotage:?} went unnoticed by {:?} in 300 schedules",
                expected(sabotage)
            ),
        }
    }
}

/// The processor keeps an idempotency key for a day from the arrival of the
/// request that created it, like Stripe: a request arriving while the first
/// is processed, or up to 24 h after it arrived, gets the first charge back;
/// one arriving 24 h after is charged anew, and later ones get that charge.
#[test]
fn simulation_processor_keeps_keys_for_a_day() {
    let _serial = serial();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let start = tokio::time::Instant::now();
        let base = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let clock: Arc<dyn Fn() -> SystemTime + Send + Sync> =
            Arc::new(move || base + start.elapsed());
        let store_clock = clock.clone();
        let store: Arc<dyn IdempotencyStore> =
            Arc::new(MemoryStore::with_clock(move || store_clock()));
        let sim = Arc::new(simulation::world::Sim::new(
            0,
            Timing::paused(),
            Sabotage::None,
            true,
            store,
            clock,
        ));
        // Any reference will do (16 or 32 hex digits, whichever this
        // version prints).
        let reference = [8, 16]
            .iter()
            .find_map(|n| idem_runtime::Reference::parse(&format!("idem_{}", "ab".repeat(*n))))
            .expect("a reference");
        let ms = Duration::from_millis;
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(Timing::paused().processor_keeps_keys, day);
        // (sent at, network delay): the first arrives at 0.1 s and lands at
        // 2.1 s.
        let ids = simulation::processor::ledger_over_a_day(
            &sim,
            reference,
            &[
                (Duration::ZERO, ms(100)),
                (ms(500), Duration::ZERO),
                (day, ms(99)),
                (day, ms(100)),
                (day + ms(1_000), Duration::ZERO),
            ],
        )
        .await;
        let w = sim.world();
        assert_eq!(
            ids,
            ["ch_1", "ch_1", "ch_1", "ch_2", "ch_2"],
            "{:#?}",
            w.log
        );
        assert_eq!(w.charges.len(), 2);
        assert!(w.violations.is_empty(), "{:?}", w.violations);
    });
}

#[test]
fn simulation_sqlite() {
    let _serial = serial();
    simulation::durable_runs::sqlite();
}

#[test]
fn simulation_postgres() {
    let _serial = serial();
    simulation::durable_runs::postgres();
}

#[test]
fn simulation_redis() {
    let _serial = serial();
    simulation::durable_runs::redis();
}

#[test]
fn simulation_dynamodb() {
    let _serial = serial();
    simulation::durable_runs::dynamodb();
}
