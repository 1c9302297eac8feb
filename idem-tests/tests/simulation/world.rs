//! What the simulation knows: the ground truth of every call, handler run
//! and processor request, the model of every record (kept by the recording
//! store), and the oracle checks over them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use idem_runtime::{
    store::{Attempt, Record, RecordState},
    IdempotencyStore, Reference,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::buggify::Buggify;
use super::rng::Rng;
use super::timing::{Mode, Timing};

/// What the tools return: the processor's charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Receipt {
    pub charge_id: String,
    pub amount_cents: u64,
    pub reference: String,
}

/// Things broken on purpose, to show that the oracles can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    None,
    /// The processor charges every request, deduplicating nothing.
    NoDedupe,
    /// A charge shows in the lookup long after the settle period.
    LateVisibility,
    /// The reconciler says "not performed" for requests in flight, and the
    /// settle period is zero.
    InFlightNotPerformed,
    /// The handler says "rejected" although its request took effect.
    RejectAfterEffect,
    /// The reconciler stores another charge's id.
    WrongCompletion,
    /// The reconciler never resolves anything.
    ReconcilerStuck,
    /// The oracle's store view finds references in any tenant.
    LeakyLookup,
    /// The heartbeat outage is not reported to the live-handler oracle.
    HideHeartbeatFailures,
    /// The handler passes the processor the reference its operation's first
    /// run got, whatever operation it runs for now: the processor replays
    /// the first purchase for a later one.
    StaleReference,
    /// The oracle's reads of a reference forget an operation once a new one
    /// took its key (as a store that keeps no superseded operation would).
    ForgetSuperseded,
    /// Every replica's store answers that the check is its to take, so every
    /// replica asks the processor about each record it lists.
    EveryReplicaAsks,
    /// The server ignores client keys: keyed calls are keyed by their
    /// arguments within the window, so a wanted repeat under a new key is
    /// answered with the first key's charge.
    IgnoreClientKey,
}

impl Sabotage {
    pub const ALL: [Sabotage; 12] = [
        Sabotage::NoDedupe,
        Sabotage::LateVisibility,
        Sabotage::InFlightNotPerformed,
        Sabotage::RejectAfterEffect,
        Sabotage::WrongCompletion,
        Sabotage::ReconcilerStuck,
        Sabotage::LeakyLookup,
        Sabotage::HideHeartbeatFailures,
        Sabotage::StaleReference,
        Sabotage::ForgetSuperseded,
        Sabotage::EveryReplicaAsks,
        Sabotage::IgnoreClientKey,
    ];
}

/// The tools of the simulated server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// A payment, window-scoped.
    Charge { window: Duration },
    /// A shipment, one per order (business key `order_id`).
    Ship { retention: Option<Duration> },
    /// A window-scoped tool whose processor the reconciler cannot ask
    /// (`NotMine`, or `StillUnknown` forever): only an operator resolves it.
    Legacy { window: Duration },
}

impl Tool {
    pub fn name(&self) -> &'static str {
        match self {
            Tool::Charge { .. } => "charge",
            Tool::Ship { .. } => "ship",
            Tool::Legacy { .. } => "legacy_refund",
        }
    }

    pub fn reconcilable(name: &str) -> bool {
        name != "legacy_refund"
    }

    /// The window of a window-scoped tool (a business key has none: its
    /// reference stays the business key's).
    pub fn window(&self) -> Option<Duration> {
        match self {
            Tool::Charge { window } | Tool::Legacy { window } => Some(*window),
            Tool::Ship { .. } => None,
        }
    }

    /// Whether the tool of this name is window-scoped.
    pub fn windowed(name: &str) -> bool {
        name != "ship"
    }
}

/// One operation a caller may ask for, again and again.
#[derive(Clone, Debug)]
pub struct OpSpec {
    pub tenant: String,
    pub subject: String,
    pub tool: Tool,
    pub args: serde_json::Value,
    pub amount: u64,
    /// The idempotency key the caller's host sends with every call of this
    /// operation (`simulation/client_keys.rs`); `None`: no key.
    pub client_key: Option<String>,
}

/// How the processor will treat one request.
#[derive(Clone, Copy, Debug)]
pub struct RequestPlan {
    pub arrive: Duration,
    pub latency: Duration,
    pub lag: Duration,
    pub decline: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanicAt {
    Never,
    BeforeSend,
    AfterAnswer,
}

/// What one call will do, drawn when it is planned.
#[derive(Clone, Debug)]
pub struct CallPlan {
    pub op: usize,
    pub at: Duration,
    pub cancel_after: Option<Duration>,
    pub prework: Duration,
    pub panic: PanicAt,
    /// The handler refuses the input before sending anything.
    pub invalid: bool,
    pub handler_timeout: Duration,
    /// The handler's client resends its request, under the same reference,
    /// when the processor has not answered within half the timeout.
    pub resend: bool,
    pub postwork: Duration,
    pub request: RequestPlan,
    /// A retry made by the harness (after an answer), not planned.
    pub retry_depth: u32,
    /// A purchase repeated after its window: a new operation the user wants.
    pub repeat: bool,
}

#[derive(Debug)]
pub struct CallRec {
    pub plan: CallPlan,
    pub run: Option<usize>,
    pub answer: Option<&'static str>,
    /// Made after the window of its operation's COMPLETED instance had ended
    /// by more than the margin (oracle 8): a new operation.
    pub after: Option<AfterWindow>,
    /// When the call was made.
    pub made: Option<Instant>,
}

/// A call made after its operation's window: which instance it follows.
#[derive(Clone, Debug)]
pub struct AfterWindow {
    pub key: [u8; 32],
    /// The COMPLETED instance whose window had ended.
    pub epoch: u32,
    /// Its charge, as its record holds it.
    pub charge: Option<String>,
    /// How long after that instance's window ended (counted from its
    /// claim) the call was made.
    pub late_by: Duration,
}

#[derive(Debug)]
pub struct RunRec {
    pub call: usize,
    pub key: [u8; 32],
    pub reference: Reference,
    pub tenant: String,
    pub epoch: u32,
    pub attempt: Option<Attempt>,
    pub started: Instant,
    pub live: bool,
    pub request: Option<usize>,
    pub panicked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Declined,
    Charged { charge: usize, new: bool },
}

#[derive(Debug)]
pub struct RequestRec {
    pub run: usize,
    pub reference: Reference,
    pub tenant: String,
    pub epoch: u32,
    pub amount: u64,
    pub plan: RequestPlan,
    pub sent: Instant,
    pub outcome: Outcome,
}

#[derive(Clone, Debug)]
pub struct Charge {
    pub id: String,
    pub reference: Reference,
    pub tenant: String,
    pub amount: u64,
    pub run: usize,
    /// When the request that made it arrived.
    pub arrived: Instant,
    pub lands_at: Instant,
    pub visible_at: Instant,
}

/// The processor's idempotency entry for one reference: its charge, and
/// when the request that created the key arrived (the key is forgotten
/// `processor_keeps_keys` later).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub charge: usize,
    pub since: Instant,
}

impl Charge {
    pub fn receipt(&self) -> Receipt {
        Receipt {
            charge_id: self.id.clone(),
            amount_cents: self.amount,
            reference: self.reference.to_string(),
        }
    }
}

/// The model of one record: what the recording store saw take effect.
#[derive(Debug)]
pub struct KeyModel {
    pub tenant: String,
    pub tool: String,
    pub reference: Reference,
    /// Operation instance: a claim that takes over an expired record (or
    /// finds none that was never released) starts a new one; a claim after a
    /// release or a NOT_PERFORMED resolution continues it.
    pub epoch: u32,
    /// The record after the last write that took effect; `None` once
    /// released.
    pub snapshot: Option<Record>,
    pub released: bool,
    pub attempt: Option<Attempt>,
    /// When the window of the current claim ends by the store's clock:
    /// the claim's answer plus the window the executor asked for (no
    /// earlier than the store counts it from the claim). Oracle 8.
    pub window_ends: SystemTime,
}

#[derive(Debug)]
pub struct ResolutionRec {
    pub key: [u8; 32],
    pub epoch: u32,
    pub not_performed: bool,
    /// How many handler runs had started when it was resolved.
    pub runs_before: usize,
}

/// A heartbeat the executor sent: by which attempt, the lease the record
/// had when it was sent (store clock; `None` when the record was not that
/// attempt's IN_PROGRESS one), and when its answer came (store clock).
#[derive(Clone, Copy, Debug)]
pub struct HeartbeatRec {
    pub attempt: Attempt,
    pub lease_until: Option<SystemTime>,
    pub landed: Option<SystemTime>,
}

/// A follow-on a write that took effect put in the store: the job the
/// mailer must get exactly once (oracle 9).
#[derive(Clone, Debug)]
pub struct JobRec {
    pub tenant: String,
    pub reference: Reference,
    pub name: String,
    pub payload: String,
    /// The instance of its operation that wrote it.
    pub epoch: u32,
}

impl JobRec {
    pub fn downstream_key(&self) -> String {
        format!("{}:{}", self.reference, self.name)
    }
}

/// What the mailer did under one downstream key: the first request it
/// acted on (and when, for its day of deduplication), and how many times it
/// acted (more than once only a day apart).
#[derive(Clone, Debug)]
pub struct MailRec {
    pub since: Instant,
    pub payload: String,
    pub effects: u32,
}

/// Counters over a schedule, summed over a run for the coverage line.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub counts: BTreeMap<&'static str, u64>,
}

impl Stats {
    pub fn bump(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    pub fn add(&mut self, other: &Stats) {
        for (k, v) in &other.counts {
            *self.counts.entry(k).or_default() += v;
        }
    }
}

#[derive(Debug, Default)]
pub struct World {
    pub violations: Vec<String>,
    pub log: Vec<String>,
    pub faults_on: bool,
    /// Every heartbeat fails in this period.
    pub outage: Option<(Instant, Instant)>,
    /// Every store call fails in this period.
    pub store_outage: Option<(Instant, Instant)>,
    /// Which replicas (processes) have died: their store calls fail from then
    /// on, and the calls they were serving are gone.
    pub dead: Vec<bool>,
    pub ops: Vec<OpSpec>,
    pub keys: BTreeMap<[u8; 32], KeyModel>,
    pub by_ref: BTreeMap<Reference, [u8; 32]>,
    pub calls: Vec<CallRec>,
    pub runs: Vec<RunRec>,
    pub requests: Vec<RequestRec>,
    pub charges: Vec<Charge>,
    /// The processor's idempotency: reference → its latest charge, and
    /// since when it holds the key.
    pub entries: BTreeMap<Reference, Entry>,
    /// Declined requests' keys, as a real processor keeps them (a request
    /// under a key whose first request was declined gets the decline again,
    /// for a day): reference → (since when, the run whose request it was).
    pub declined: BTreeMap<Reference, (Instant, usize)>,
    /// Oracle 8: charge → the operation instance (key, epoch) it was
    /// credited to (answered as executed, or stored as COMPLETED).
    pub credits: BTreeMap<usize, ([u8; 32], u32)>,
    /// Instances oracle 8 found without their own effect (reported once).
    pub suppressed: BTreeSet<([u8; 32], u32)>,
    /// The key of each operation spec, once one of its handlers ran.
    pub op_keys: BTreeMap<usize, [u8; 32]>,
    /// The reference each operation spec's first run got
    /// (`Sabotage::StaleReference`).
    pub first_refs: BTreeMap<usize, Reference>,
    /// Which runs' requests took effect, per operation instance (key,
    /// epoch), whatever reference each ran under.
    pub accepted: BTreeMap<([u8; 32], u32), BTreeSet<usize>>,
    pub pending_tasks: usize,
    pub outstanding_calls: usize,
    pub hb_failures: BTreeMap<[u8; 32], Vec<Instant>>,
    /// Heartbeats that landed, per key: when each was sent and when its
    /// answer came back (the store applied it somewhere between the two).
    pub hb_landed: BTreeMap<[u8; 32], Vec<(Instant, Instant)>>,
    /// When each claim that won was sent, per key: the store's lease counts
    /// from no earlier.
    pub claims_sent: BTreeMap<[u8; 32], Vec<Instant>>,
    pub resolutions: Vec<ResolutionRec>,
    pub stats: Stats,
    /// Every heartbeat sent, per key (oracle 4 at the send, and its excuse
    /// for a lease lapsed while a heartbeat was slow).
    pub hb_sent: BTreeMap<[u8; 32], Vec<HeartbeatRec>>,
    /// The follow-ons the store was given (oracle 9).
    pub jobs: Vec<JobRec>,
    /// The mailer's ledger, by downstream key.
    pub mailer: BTreeMap<String, MailRec>,
    /// Every reference a claim took (oracle 10).
    pub refs: BTreeMap<Reference, super::references::RefLife>,
    /// The references handed to callers, in the order first given.
    pub given: Vec<Reference>,
    /// Oracle 11: the replica whose lookup of a reference is in flight
    /// (asked, its answer not yet acted on or given up).
    pub asking: BTreeMap<Reference, usize>,
    /// (key, attempt) of records a sweep marked within the clocks' spread
    /// of their lease's end (skewed schedules only): oracle 4's excuse.
    pub early_marks: BTreeSet<([u8; 32], u64)>,
    /// Oracle 12: the claims whose caller was told nothing ran (the store
    /// failed or gave up), by the reference they offered; each may have
    /// landed, or land later.
    pub unconfirmed: BTreeMap<Reference, Unconfirmed>,
    /// When each claim that won took effect, per (key, attempt).
    pub claims_landed: BTreeMap<([u8; 32], u64), Instant>,
    /// Every release sent, per (key, attempt) (oracle 12's excuse).
    pub releases: BTreeMap<([u8; 32], u64), Vec<ReleaseRec>>,
    /// Oracle 12's calls waiting on a release still on its way.
    pub pending_unconfirmed: Vec<super::answers::PendingUnconfirmed>,
}

/// A release sent: when, and when it was answered and whether the store
/// answered (not `Unavailable`); `None` while it is on its way.
pub type ReleaseRec = (Instant, Option<(Instant, bool)>);

/// A claim whose caller was told nothing ran (oracle 12).
#[derive(Clone, Copy, Debug)]
pub struct Unconfirmed {
    pub key: [u8; 32],
    pub attempt: u64,
    /// When it was sent.
    pub sent: Instant,
}

/// One schedule's shared state.
pub struct Sim {
    pub seed: u64,
    pub timing: Timing,
    pub sabotage: Sabotage,
    pub trace: bool,
    pub t0: Instant,
    pub rng: Mutex<Rng>,
    pub w: Mutex<World>,
    /// The store without faults, for the oracles.
    pub inner: Arc<dyn IdempotencyStore>,
    /// The store's clock (for the final expiry judgements).
    pub clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    /// BUGGIFY's points and decisions (see `buggify.rs`).
    pub buggify: Mutex<Buggify>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sim {
    pub fn new(
        seed: u64,
        timing: Timing,
        sabotage: Sabotage,
        trace: bool,
        inner: Arc<dyn IdempotencyStore>,
        clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    ) -> Self {
        let mode = timing.mode;
        Sim {
            seed,
            timing,
            sabotage,
            trace,
            t0: Instant::now(),
            rng: Mutex::new(Rng::new(seed)),
            w: Mutex::new(World {
                faults_on: true,
                ..World::default()
            }),
            inner,
            clock,
            buggify: Mutex::new(Buggify::new(seed, super::buggify::enabled_by_env(), mode)),
        }
    }

    /// Whether the replicas answer before their completions are written
    /// (`Executor::with_background_completions`): on odd seeds, so half the
    /// schedules run each way without drawing from any generator.
    pub fn background_completions(&self) -> bool {
        self.seed % 2 == 1
    }

    /// Whether the replicas answer repeats of completed operations from
    /// memory (`Executor::with_replay_cache`): on seeds whose second bit is
    /// set, so each pairing with background completions comes up.
    pub fn replay_cache(&self) -> bool {
        self.seed & 2 == 2
    }

    pub fn buggify(&self) -> MutexGuard<'_, Buggify> {
        lock(&self.buggify)
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.w)
    }

    pub fn rng(&self) -> MutexGuard<'_, Rng> {
        lock(&self.rng)
    }

    /// Simulated (or real) time since the schedule began.
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    pub fn log(&self, w: &mut World, msg: impl FnOnce() -> String) {
        if self.trace {
            let line = format!("{:>9.3}s {}", self.elapsed().as_secs_f64(), msg());
            w.log.push(line);
        }
    }

    pub fn violation(&self, w: &mut World, msg: String) {
        self.violation_at(w, self.elapsed(), msg);
    }

    /// A violation found now of what happened `at` into the schedule.
    pub fn violation_at(&self, w: &mut World, at: Duration, msg: String) {
        let line = format!("[{:.3}s] {msg}", at.as_secs_f64());
        if self.trace {
            w.log.push(format!("VIOLATION {line}"));
        }
        w.violations.push(line);
    }

    /// A library issue already reported: counted, and a violation only
    /// under `IDEM_SIM_STRICT=1` (to check a fix).
    pub fn violate(&self, msg: String) {
        let mut w = self.world();
        self.violation(&mut w, msg);
    }

    /// The oracle's view of a record (with the leak, when sabotaged).
    pub async fn peek(&self, tenant: &str, reference: &Reference) -> Option<Record> {
        let found = match self.inner.lookup(tenant, reference).await {
            Ok(found) => found,
            Err(e) => {
                self.violate(format!("oracle lookup of {reference} failed: {e}"));
                return None;
            }
        };
        if found.is_none() && self.sabotage == Sabotage::LeakyLookup {
            let owner = {
                let w = self.world();
                w.by_ref
                    .get(reference)
                    .and_then(|k| w.keys.get(k))
                    .map(|m| m.tenant.clone())
            };
            if let Some(owner) = owner {
                return self.inner.lookup(&owner, reference).await.ok().flatten();
            }
        }
        found
    }

    // ---- oracle 1: at most one effect per operation ----

    /// A request reached the processor and took effect (a new charge, or the
    /// existing one returned for its reference).
    pub fn on_charged(&self, w: &mut World, request: usize, charge: usize, new: bool) {
        let (reference, epoch, run) = {
            let r = &w.requests[request];
            (r.reference, r.epoch, r.run)
        };
        if new {
            // Charges under one reference a day apart are two: the
            // processor had forgotten the first one's key.
            let arrived = w.charges[charge].arrived;
            let keeps = self.timing.processor_keeps_keys;
            let held = w
                .charges
                .iter()
                .filter(|c| c.reference == reference && arrived.duration_since(c.arrived) < keeps)
                .count();
            if held > 1 {
                self.violation(
                    w,
                    format!(
                        "oracle 1 (effects <= 1 per operation): the processor holds {held} charges for reference {reference}"
                    ),
                );
            }
        }
        // One instance of an operation (the same call within its window)
        // has at most one effect, under whichever references its claims
        // ran: a handler run whose outcome was not known, followed by
        // another run under a new reference, charged twice.
        let key = w.runs[run].key;
        let runs = w.accepted.entry((key, epoch)).or_default();
        runs.insert(run);
        if runs.len() > 1 {
            let runs: Vec<usize> = runs.iter().copied().collect();
            let refs: BTreeSet<Reference> = runs.iter().map(|r| w.runs[*r].reference).collect();
            let refs: Vec<String> = refs.iter().map(Reference::to_string).collect();
            self.violation(
                w,
                format!(
                    "oracle 1 (effects <= 1 per operation): operation {reference} (instance {epoch}) reached the processor with effect from {} handler runs {runs:?}, under {}: it ran twice",
                    runs.len(),
                    refs.join(", ")
                ),
            );
        }
    }

    // ---- oracle 4: a live handler's record is never UNKNOWN ----

    /// Whether the run's heartbeats failed (or, in real time, landed late)
    /// at any time since it started: then its record may be swept.
    fn heartbeats_failed(&self, w: &World, run: &RunRec, now: Instant) -> bool {
        if self.sabotage == Sabotage::HideHeartbeatFailures {
            return false;
        }
        if w.hb_failures
            .get(&run.key)
            .is_some_and(|f| f.iter().any(|t| *t >= run.started))
        {
            return true;
        }
        // A heartbeat the store applied or answered after the lease it was
        // sent under ran out (BUGGIFY slowed it past the bound of the
        // timing): the lease may have lapsed through the store's delay, not
        // the library's. One still on its way past that lease counts too.
        // With skewed clocks, "ran out" is as the fastest replica's clock
        // has it: up to `tolerance` earlier.
        let store_now = (self.clock)();
        let tol = self.timing.tolerance;
        if w.hb_sent.get(&run.key).is_some_and(|sent| {
            sent.iter().any(|h| {
                Some(h.attempt) == run.attempt
                    && h.lease_until
                        .is_some_and(|l| h.landed.unwrap_or(store_now) + tol >= l)
            })
        }) {
            return true;
        }
        if self.timing.mode == Mode::Real {
            // In real time a starved scheduler delays heartbeats: a gap of
            // more than half a lease is not the library's. A heartbeat took
            // effect at some time between its send and its answer, so the
            // gap is measured from the previous one's send (the earliest it
            // can have extended the lease) to this one's answer, and to now
            // from the last one's send: an answer that comes back late
            // (a slow server, a task not polled) does not count as on time.
            let limit = self.timing.lease / 2;
            // The run's own claim was sent before it started, and its lease
            // counts from then (its answer may have come late).
            let mut since = w
                .claims_sent
                .get(&run.key)
                .and_then(|sent| sent.iter().rev().find(|t| **t <= run.started))
                .copied()
                .unwrap_or(run.started);
            let claimed = since;
            for (sent, landed) in w
                .hb_landed
                .get(&run.key)
                .into_iter()
                .flatten()
                .filter(|(sent, _)| *sent >= claimed)
            {
                if landed.duration_since(since) > limit {
                    return true;
                }
                since = *sent;
            }
            if now.duration_since(since) > limit {
                return true;
            }
        }
        false
    }

    /// Oracle 4 at a heartbeat's send: the handler of `attempt` is live
    /// and its record's lease (`lease_until`, as the model holds it) ran
    /// out before the executor renewed it, with no heartbeat failed or slow
    /// to excuse it: the record read as UNKNOWN meanwhile, and a sweep could
    /// have marked it. Judged on the paused clock only (the store's and the
    /// harness's clocks are one, but for the replicas' skew, which
    /// `tolerance` allows); real time has its own allowance.
    pub fn check_heartbeat_send(
        &self,
        w: &mut World,
        key: &[u8; 32],
        attempt: Attempt,
        lease_until: Option<SystemTime>,
    ) {
        if self.timing.mode != Mode::Paused {
            return;
        }
        let Some(lease_until) = lease_until else {
            return;
        };
        let now = (self.clock)();
        if lease_until + self.timing.tolerance > now {
            return;
        }
        let instant = Instant::now();
        let Some(i) = w.runs.iter().position(|r| {
            r.live
                && r.key == *key
                && r.attempt == Some(attempt)
                && !self.heartbeats_failed(w, r, instant)
        }) else {
            return;
        };
        let reference = w.runs[i].reference;
        let late = now.duration_since(lease_until).unwrap_or_default();
        self.violation(
            w,
            format!(
                "oracle 4 (a live handler is never UNKNOWN): run {i} of {reference} sent a heartbeat {late:?} after its lease had run out, with no heartbeat failed or slow: the record read as UNKNOWN meanwhile"
            ),
        );
    }

    pub async fn check_live(&self, event: &str) {
        let live: Vec<(usize, String, Reference)> = {
            let w = self.world();
            let now = Instant::now();
            w.runs
                .iter()
                .enumerate()
                .filter(|(_, r)| r.live && !self.heartbeats_failed(&w, r, now))
                .map(|(i, r)| (i, r.tenant.clone(), r.reference))
                .collect()
        };
        for (i, tenant, reference) in live {
            let found = self.peek(&tenant, &reference).await;
            let mut w = self.world();
            let now = Instant::now();
            let run = &w.runs[i];
            // Still live and still on time after the look-up.
            if !run.live || self.heartbeats_failed(&w, run, now) {
                continue;
            }
            let problem = match &found {
                None => Some("there is no record".to_owned()),
                Some(r) if Some(r.attempt) != run.attempt => Some(format!(
                    "the record belongs to another attempt ({:?})",
                    r.state
                )),
                // With skewed clocks, a sweep whose clock runs ahead marks a
                // lease up to the clocks' spread before it ends on the
                // writer's (the documented consequence), and what follows
                // the mark follows from it: a reconciler may resolve the
                // record while its handler still runs (the handler's own
                // completion then finds it settled; nothing runs twice).
                Some(r)
                    if Some(r.attempt) == run.attempt
                        && w.early_marks.contains(&(run.key, r.attempt.get())) =>
                {
                    None
                }
                Some(r) if !matches!(r.state, RecordState::InProgress) => {
                    Some(format!("the record is {}", r.state.name()))
                }
                // Written on one replica's clock, read on the true one.
                Some(r) if r.lease_until + self.timing.tolerance <= r.observed_at => Some(format!(
                    "its lease ran out {:?} ago (reads as UNKNOWN)",
                    r.observed_at
                        .duration_since(r.lease_until)
                        .unwrap_or_default()
                )),
                _ => None,
            };
            if let Some(problem) = problem {
                let msg = format!(
                    "oracle 4 (a live handler is never UNKNOWN): after {event}, run {i} of {reference} is running with all its heartbeats landed, but {problem}"
                );
                self.violation(&mut w, msg);
            }
        }
    }

    // ---- oracle 6: tenants ----

    pub async fn check_tenants(&self, reference: &Reference) {
        let (owner, tenants) = {
            let w = self.world();
            let Some(owner) = w
                .by_ref
                .get(reference)
                .and_then(|k| w.keys.get(k))
                .map(|m| m.tenant.clone())
            else {
                return;
            };
            let tenants: BTreeSet<String> = w.ops.iter().map(|o| o.tenant.clone()).collect();
            (owner, tenants)
        };
        for other in tenants.iter().filter(|t| **t != owner) {
            if let Some(r) = self.peek(other, reference).await {
                self.violate(format!(
                    "oracle 6 (tenants): tenant {other} read {reference} of tenant {owner}: {} record of tenant {}",
                    r.state.name(),
                    r.tenant
                ));
            }
        }
        if let Some(r) = self.peek(&owner, reference).await {
            if r.tenant != owner {
                self.violate(format!(
                    "oracle 6 (tenants): {reference} looked up in tenant {owner} returned a record of tenant {}",
                    r.tenant
                ));
            }
        }
    }

    /// The processor's charge for a reference, if any.
    pub fn charge_of(&self, w: &World, reference: &Reference) -> Option<Charge> {
        w.entries
            .get(reference)
            .map(|e| w.charges[e.charge].clone())
    }

    // ---- oracle 8: a wanted operation gets its own effect ----

    /// The charge with this id, and the operation instance (key, epoch)
    /// whose handler run's request created it.
    pub fn charge_by_id(&self, w: &World, id: &str) -> Option<(usize, [u8; 32], u32)> {
        let c = w.charges.iter().position(|c| c.id == id)?;
        let run = &w.runs[w.charges[c].run];
        Some((c, run.key, run.epoch))
    }

    /// Instance `epoch` of the window-scoped operation `key` was credited
    /// with charge `id` (`how`: answered as executed, or stored as its
    /// COMPLETED response). The charge must be its own: created by a
    /// request of one of its own handler runs, not an earlier operation's
    /// charge the processor replayed. Since each charge has one creator, no
    /// two operations are then credited with one charge.
    pub fn credit(&self, w: &mut World, id: &str, key: [u8; 32], epoch: u32, how: &str) {
        let Some(m) = w.keys.get(&key) else { return };
        if !Tool::windowed(&m.tool) {
            return;
        }
        let reference = m.reference;
        // An id the processor never issued is oracle 2's.
        let Some((c, ck, ce)) = self.charge_by_id(w, id) else {
            return;
        };
        let earlier = w.credits.get(&c).copied();
        if (ck, ce) != (key, epoch) {
            if !w.suppressed.insert((key, epoch)) {
                return;
            }
            let creator = if ck == key {
                format!("instance {ce} of the same operation")
            } else {
                "another operation".to_owned()
            };
            let also = match earlier {
                Some((k, e)) if k == key => format!(", already credited to instance {e}"),
                Some(_) => ", already credited to another operation".to_owned(),
                None => String::new(),
            };
            self.violation(
                w,
                format!(
                    "oracle 8 (a wanted operation gets its own effect): instance {epoch} of {reference} ({how}) got {id}, a charge made by {creator}{also}: the processor replayed it, and the purchase wanted after the window never happened"
                ),
            );
            return;
        }
        w.credits.entry(c).or_insert((key, epoch));
    }
}
