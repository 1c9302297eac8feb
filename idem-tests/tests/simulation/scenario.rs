//! One schedule: callers, maintenance and an operator against a store,
//! driven by one seed, with the oracles checked after every event.
//!
//! Running a schedule and drawing its plan are here; the callers are in
//! `callers.rs`, maintenance and the final checks in `maintenance.rs`. What
//! a caller was told is judged in `answers.rs`, the operator is in
//! `operator.rs`, oracle 10's reads in `references.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::store::conformance::FaultyStore;
use idem_runtime::{maintenance::ReconcileConfig, Executor, IdempotencyStore};
use tokio::time::Instant;

use super::callers::{spawn_call, Callers};
use super::maintenance::{final_checks, maintain};
use super::observer::Observer;
use super::operator::{manual_leftovers, operate};
use super::processor::SimReconciler;
use super::recorder::Recorder;
use super::stores::plan;
use super::timing::Timing;
use super::world::{CallPlan, OpSpec, PanicAt, RequestPlan, Sabotage, Sim, Stats, Tool};

pub(super) const STATUS_TOOL: &str = "get_operation_status";
pub(super) const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
const SUBJECTS: [&str; 2] = ["alice", "bob"];
pub const REPLICAS: usize = 2;

/// What a schedule found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub log: Vec<String>,
    pub stats: Stats,
}

/// Runs one schedule against `inner` (a fresh store), reading the store's
/// clock through `clock`. Each replica reaches the store through its own
/// view in `views` (a clock of its own: skew), or through `inner` when
/// `views` is empty.
pub async fn run(
    seed: u64,
    timing: Timing,
    sabotage: Sabotage,
    trace: bool,
    inner: Arc<dyn IdempotencyStore>,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    views: Vec<Arc<dyn IdempotencyStore>>,
) -> Report {
    timing.assert_consistent();
    let sim = Arc::new(Sim::new(
        seed,
        timing,
        sabotage,
        trace,
        inner.clone(),
        clock,
    ));
    let limit = Duration::from_secs(3600);
    let views = if views.is_empty() {
        vec![inner; REPLICAS]
    } else {
        views
    };
    assert_eq!(views.len(), REPLICAS, "one view per replica");
    let finished = tokio::time::timeout(limit, schedule(sim.clone(), views)).await;
    if finished.is_err() {
        sim.violate(format!(
            "the schedule did not finish within {limit:?}: something hangs"
        ));
    }
    let mut w = sim.world();
    Report {
        violations: std::mem::take(&mut w.violations),
        log: std::mem::take(&mut w.log),
        stats: std::mem::take(&mut w.stats),
    }
}

pub(super) type Stack = Arc<dyn IdempotencyStore>;

async fn schedule(sim: Arc<Sim>, views: Vec<Arc<dyn IdempotencyStore>>) {
    let t = sim.timing.clone();
    // Two replicas (processes) share the store, each through a connection of
    // its own (and a clock of its own: `views`); the second may die. Each
    // runs maintenance; the operator runs on the first. One lock runs every
    // replica's writes one at a time.
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    let stacks: Vec<Stack> = views
        .into_iter()
        .enumerate()
        .map(|(replica, view)| {
            let recorder = Arc::new(Recorder {
                inner: view,
                sim: sim.clone(),
                lock: lock.clone(),
            });
            let faulty = FaultyStore::new(recorder.clone(), plan(sim.clone(), replica));
            Arc::new(Observer {
                inner: faulty,
                sim: sim.clone(),
                wire: recorder.clone(),
            }) as Stack
        })
        .collect();
    let replicas: Vec<Executor> = stacks
        .iter()
        .map(|stack| {
            Executor::new(stack.clone())
                .with_lease(t.lease)
                .with_retention(t.retention)
                .with_background_completions(sim.background_completions())
                .with_replay_cache(if sim.replay_cache() { 1 << 20 } else { 0 })
        })
        .collect();
    let stack = stacks[0].clone();
    let exec = replicas[0].clone();
    let died = Arc::new(tokio::sync::Notify::new());
    sim.world().dead = vec![false; REPLICAS];

    // The schedule: operations, calls, an outage of heartbeats.
    let (planned, legacy_not_mine, death_at) = {
        let mut rng = sim.rng();
        let mut ops = operations(&mut rng, &t);
        let mut planned = Vec::new();
        for _ in 0..rng.range(t.calls.0, t.calls.1) {
            let op = rng.below(ops.len() as u64) as usize;
            let at = rng.between(Duration::ZERO, t.horizon);
            // A retry storm: the same call two or three times at once.
            let copies = if rng.chance(0.2) { rng.range(2, 3) } else { 1 };
            for c in 0..copies {
                let at = at + Duration::from_millis(c * rng.below(50));
                planned.push(call_plan(&mut rng, &t, sim.sabotage, op, at, 0));
            }
        }
        // Purchases repeated after their window: the same call again once
        // the first one's window has ended, a new operation the user wants,
        // within the day the processor keeps the first one's key.
        let fits = |op: &OpSpec| {
            op.tool
                .window()
                .is_some_and(|w| w + t.repeat_gap.0 < t.horizon)
        };
        let windowed: Vec<usize> = (0..ops.len()).filter(|i| fits(&ops[*i])).collect();
        if !windowed.is_empty() {
            for _ in 0..rng.range(t.repeats.0, t.repeats.1) {
                let op = *rng.pick(&windowed);
                let window = ops[op].tool.window().unwrap_or_default();
                let room = t.horizon - window - t.repeat_gap.0;
                let at = rng.between(Duration::ZERO, room);
                let most = t.repeat_gap.1.min(t.horizon - window - at);
                let gap = rng.between(t.repeat_gap.0, most);
                planned.push(call_plan(&mut rng, &t, sim.sabotage, op, at, 0));
                let mut again = call_plan(&mut rng, &t, sim.sabotage, op, at + window + gap, 0);
                again.repeat = true;
                planned.push(again);
            }
        }
        // Keyed calls, planned from a generator of their own.
        super::client_keys::plan(sim.seed, &t, sim.sabotage, &mut ops, &mut planned);
        let outage = rng.chance(0.4).then(|| {
            let from = sim.t0 + rng.between(Duration::ZERO, t.horizon);
            (from, from + rng.between(t.outage.0, t.outage.1))
        });
        let store_outage = rng.chance(0.25).then(|| {
            let from = sim.t0 + rng.between(Duration::ZERO, t.horizon);
            (from, from + rng.between(t.store_outage.0, t.store_outage.1))
        });
        let death = rng
            .chance(0.3)
            .then(|| rng.between(t.horizon / 5, t.horizon * 4 / 5));
        let legacy_not_mine = rng.chance(0.5);
        drop(rng);
        let mut w = sim.world();
        w.ops = ops;
        w.outage = outage;
        w.store_outage = store_outage;
        for (what, happens) in [
            ("schedules with a heartbeat outage", outage.is_some()),
            ("schedules with a store outage", store_outage.is_some()),
            ("schedules where a replica dies", death.is_some()),
            (
                "schedules with background completions",
                sim.background_completions(),
            ),
            ("schedules with a replay cache", sim.replay_cache()),
        ] {
            if happens {
                w.stats.bump(what);
            }
        }
        (planned, legacy_not_mine, death)
    };
    let reaper = death_at.map(|at| {
        let (sim, died) = (sim.clone(), died.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(sim.t0 + at).await;
            {
                let mut w = sim.world();
                w.dead[REPLICAS - 1] = true;
                sim.log(&mut w, || "replica 1 dies".to_owned());
            }
            died.notify_waiters();
        })
    });

    // Maintenance on its timer.
    let stop = Arc::new(AtomicBool::new(false));
    let mut config = ReconcileConfig::default()
        .with_settle(t.settle)
        .with_first_backoff(t.first_backoff)
        .with_max_backoff(t.max_backoff)
        .with_batch(t.reconcile_batch)
        // Some lookups (BUGGIFY's slow answers) are given up.
        .with_lookup_timeout(t.settle * 3 / 4);
    if sim.sabotage == Sabotage::InFlightNotPerformed {
        config.settle = Duration::ZERO;
    }
    let maintenance: Vec<_> = stacks
        .iter()
        .enumerate()
        .map(|(replica, stack)| {
            let reconciler = SimReconciler {
                sim: sim.clone(),
                legacy_not_mine,
                replica,
            };
            tokio::spawn(maintain(
                sim.clone(),
                stack.clone(),
                reconciler,
                config.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let operator = tokio::spawn(operate(sim.clone(), stack.clone(), stop.clone()));
    let reader = tokio::spawn(super::references::reader(sim.clone(), stop.clone()));
    // A dispatcher on each replica, until every job is delivered.
    let stop_dispatch = Arc::new(AtomicBool::new(false));
    let dispatchers: Vec<_> = stacks
        .iter()
        .enumerate()
        .map(|(replica, stack)| {
            tokio::spawn(super::follow_ons::dispatch(
                sim.clone(),
                stack.clone(),
                replica,
                stop_dispatch.clone(),
            ))
        })
        .collect();

    // The callers.
    let mut calls = Vec::new();
    let callers = Callers {
        replicas: replicas.clone(),
        died: died.clone(),
    };
    for p in planned {
        calls.push(spawn_call(&sim, &callers, p));
    }
    for c in calls {
        if let Err(e) = c.await {
            sim.violate(format!("a caller task failed: {e}"));
        }
    }
    // Retries spawned by the callers.
    while sim.world().outstanding_calls > 0 {
        tokio::time::sleep(t.interval).await;
    }

    // Drain: the store heals, the requests land and show, and maintenance
    // gets the time the reconciliation bound allows.
    {
        let mut w = sim.world();
        w.faults_on = false;
        w.outage = None;
        w.store_outage = None;
        sim.log(&mut w, || "drain: faults off".to_owned());
    }
    while sim.world().pending_tasks > 0 {
        tokio::time::sleep(t.interval).await;
    }
    // Completions written in the background are waited for as calls still
    // in flight are (a stalled write lands when its stall ends); a dead
    // replica's never land, and its records are swept and reconciled.
    for (i, replica) in replicas.iter().enumerate() {
        if sim.world().dead[i] {
            continue;
        }
        let limit = t.retention * 2;
        let left = replica.drain(limit).await;
        if left > 0 {
            sim.violate(format!(
                "replica {i} still had {left} completion(s) pending in the background {limit:?} after the faults ended"
            ));
        }
    }
    let consistent = {
        let w = sim.world();
        w.charges
            .iter()
            .map(|c| c.visible_at)
            .max()
            .unwrap_or_else(Instant::now)
            .max(Instant::now())
    };
    tokio::time::sleep_until(consistent + t.reconcile_bound()).await;
    stop.store(true, Ordering::SeqCst);
    for task in maintenance.into_iter().chain([operator, reader]) {
        if let Err(e) = task.await {
            sim.violate(format!("a maintenance task failed: {e}"));
        }
    }
    sim.check_live("the drain").await;

    // Oracle 5, and the model against the store.
    final_checks(&sim).await;

    // What no reconciler can resolve, an operator does; a repeat then gets
    // the resolution.
    let leftovers = manual_leftovers(&sim, &stack).await;
    for op in leftovers {
        let p = {
            let mut rng = sim.rng();
            let mut p = call_plan(&mut rng, &t, Sabotage::None, op, Duration::ZERO, 9);
            p.cancel_after = None;
            p.panic = PanicAt::Never;
            p.invalid = false;
            p.postwork = Duration::ZERO;
            p.handler_timeout = t.handler_timeout.1;
            p.request = RequestPlan {
                arrive: Duration::ZERO,
                latency: t.latency_short.0,
                lag: Duration::ZERO,
                decline: false,
            };
            p
        };
        let callers = Callers {
            replicas: vec![exec.clone()],
            died: died.clone(),
        };
        if let Err(e) = spawn_call(&sim, &callers, p).await {
            sim.violate(format!("a caller task failed: {e}"));
        }
    }
    while sim.world().pending_tasks > 0 || sim.world().outstanding_calls > 0 {
        tokio::time::sleep(t.interval).await;
    }
    let references: Vec<_> = sim.world().keys.values().map(|m| m.reference).collect();
    for r in references {
        sim.check_tenants(&r).await;
    }
    super::references::final_check(&sim).await;
    // Oracle 9: the dispatchers deliver every job, then the mailer's ledger
    // is checked against the jobs written.
    let limit = t.reconcile_bound() * 4;
    if !super::follow_ons::drained(&sim, limit).await {
        sim.violate(format!(
            "oracle 9 (follow-ons): jobs were still in the store {limit:?} after the faults ended"
        ));
    }
    stop_dispatch.store(true, Ordering::SeqCst);
    for task in dispatchers {
        if let Err(e) = task.await {
            sim.violate(format!("a dispatcher task failed: {e}"));
        }
    }
    super::follow_ons::final_check(&sim);
    super::client_keys::final_check(&sim);
    super::answers::final_check(&sim);
    let mut w = sim.world();
    let not_performed: Vec<_> = w
        .resolutions
        .iter()
        .filter(|r| r.not_performed)
        .map(|r| (r.key, r.epoch, r.runs_before))
        .collect();
    for (key, epoch, runs_before) in not_performed {
        if let Some(p) = sim.not_performed_problem(&w, &key, epoch, runs_before) {
            let reference = w.keys[&key].reference;
            sim.violation(
                &mut w,
                format!("oracle 7 (not performed means not performed): {reference} was resolved NOT_PERFORMED, but {p}"),
            );
        }
    }
    if let Some(i) = w.runs.iter().position(|r| r.live) {
        sim.violation(&mut w, format!("run {i} is still live at the end"));
    }
    if let Some(reaper) = reaper {
        reaper.abort();
    }
}

fn operations(rng: &mut super::rng::Rng, t: &Timing) -> Vec<OpSpec> {
    let n = rng.range(5, 8);
    (0..n)
        .map(|_| {
            let tenant = (*rng.pick(&TENANTS)).to_owned();
            let subject = (*rng.pick(&SUBJECTS)).to_owned();
            let amount = *rng.pick(&[500u64, 700, 1200]);
            let roll = rng.below(100);
            let (tool, args) = if roll < 45 {
                let window = *rng.pick(&t.windows);
                (
                    Tool::Charge { window },
                    serde_json::json!({"card": "4242", "amount_cents": amount}),
                )
            } else if roll < 80 {
                // Few orders, so one order with two amounts (a conflict)
                // and one order asked for by two subjects both happen.
                let order = if rng.chance(0.05) {
                    ""
                } else {
                    *rng.pick(&["o-1", "o-2"])
                };
                let retention = *rng.pick(&t.ship_retention);
                (
                    Tool::Ship { retention },
                    serde_json::json!({"order_id": order, "amount_cents": amount}),
                )
            } else {
                (
                    Tool::Legacy {
                        window: t.windows[0],
                    },
                    serde_json::json!({"refund_cents": amount}),
                )
            };
            OpSpec {
                tenant,
                subject,
                tool,
                args,
                amount,
                client_key: None,
            }
        })
        .collect()
}

pub(super) fn call_plan(
    rng: &mut super::rng::Rng,
    t: &Timing,
    sabotage: Sabotage,
    op: usize,
    at: Duration,
    retry_depth: u32,
) -> CallPlan {
    let zero = Duration::ZERO;
    let mut lag = rng.between(t.lag_min, t.lag_max);
    if sabotage == Sabotage::LateVisibility {
        lag += t.settle;
    }
    CallPlan {
        op,
        at,
        cancel_after: rng
            .chance(t.cancel_rate)
            .then(|| rng.between(zero, t.cancel_max)),
        prework: if rng.chance(0.5) {
            zero
        } else {
            rng.between(zero, t.prework_max)
        },
        panic: match rng.below(100) {
            0..=2 => PanicAt::BeforeSend,
            3..=5 => PanicAt::AfterAnswer,
            _ => PanicAt::Never,
        },
        invalid: rng.chance(0.04),
        handler_timeout: rng.between(t.handler_timeout.0, t.handler_timeout.1),
        resend: rng.chance(0.3),
        postwork: if rng.chance(0.2) {
            rng.between(t.postwork.0, t.postwork.1)
        } else {
            zero
        },
        request: RequestPlan {
            arrive: rng.between(zero, t.arrive_max),
            latency: if rng.chance(t.long_rate) {
                rng.between(t.latency_long.0, t.latency_long.1)
            } else {
                rng.between(t.latency_short.0, t.latency_short.1)
            },
            lag,
            decline: rng.chance(0.1),
        },
        retry_depth,
        repeat: false,
    }
}
