//! One schedule: callers, maintenance and an operator against a store,
//! driven by one seed, with the oracles checked after every event.
//!
//! One job, over 700 lines: running a schedule and checking its oracles.
//! What a caller was told is judged in `answers.rs`, the operator is in
//! `operator.rs`, oracle 10's reads in `references.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::store::conformance::FaultyStore;
use idem_runtime::{
    maintenance::{purge, reconcile_with, sweep, ReconcileConfig, SettleClock},
    store::RecordState,
    Answer, Caller, Executor, IdempotencyStore, Operation, OperationContext, ScopeSpec, ToolError,
};
use tokio::time::Instant;

use super::answers::{after_window, judge};
use super::operator::{manual_leftovers, operate};
use super::processor::{ProcAnswer, Processor, SimReconciler};
use super::stores::{plan, Observer, Recorder};
use super::timing::Timing;
use super::world::{
    CallPlan, CallRec, OpSpec, PanicAt, Receipt, RequestPlan, RunRec, Sabotage, Sim, Stats, Tool,
};

const STATUS_TOOL: &str = "get_operation_status";
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
const SUBJECTS: [&str; 2] = ["alice", "bob"];
const REPLICAS: usize = 2;

/// Where calls go: the replicas (the last one may die), and word of its
/// death.
#[derive(Clone)]
struct Callers {
    replicas: Vec<Executor>,
    /// Woken when the last replica dies (a `Notify`: it wakes its waiters
    /// in a fixed order, where a watch channel's shards pick one at random
    /// and a seed would not replay).
    died: Arc<tokio::sync::Notify>,
}

/// What a schedule found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub log: Vec<String>,
    pub stats: Stats,
}

/// Runs one schedule against `inner` (a fresh store), reading the store's
/// clock through `clock`.
pub async fn run(
    seed: u64,
    timing: Timing,
    sabotage: Sabotage,
    trace: bool,
    inner: Arc<dyn IdempotencyStore>,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
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
    let finished = tokio::time::timeout(limit, schedule(sim.clone(), inner)).await;
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

type Stack = Arc<dyn IdempotencyStore>;

async fn schedule(sim: Arc<Sim>, inner: Arc<dyn IdempotencyStore>) {
    let t = sim.timing.clone();
    // Two replicas (processes) share the store, each through a connection of
    // its own; the second may die. Maintenance and the operator run on the
    // first.
    let recorder = Arc::new(Recorder::new(inner, sim.clone()));
    let stacks: Vec<Stack> = (0..REPLICAS)
        .map(|replica| {
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
        })
        .collect();
    let stack = stacks[0].clone();
    let exec = replicas[0].clone();
    let died = Arc::new(tokio::sync::Notify::new());
    sim.world().dead = vec![false; REPLICAS];

    // The schedule: operations, calls, an outage of heartbeats.
    let (planned, legacy_not_mine, death_at) = {
        let mut rng = sim.rng();
        let ops = operations(&mut rng, &t);
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
    let mut config = ReconcileConfig {
        settle: t.settle,
        first_backoff: t.first_backoff,
        max_backoff: t.max_backoff,
        batch: t.reconcile_batch,
    };
    if sim.sabotage == Sabotage::InFlightNotPerformed {
        config.settle = Duration::ZERO;
    }
    let reconciler = SimReconciler {
        sim: sim.clone(),
        legacy_not_mine,
    };
    let maintenance = tokio::spawn(maintain(
        sim.clone(),
        stack.clone(),
        reconciler,
        config,
        stop.clone(),
    ));
    let operator = tokio::spawn(operate(sim.clone(), stack.clone(), stop.clone()));
    let reader = tokio::spawn(super::references::reader(sim.clone(), stop.clone()));
    // A dispatcher on each replica, until every job is delivered.
    let stop_dispatch = Arc::new(AtomicBool::new(false));
    let dispatchers: Vec<_> = stacks
        .iter()
        .enumerate()
        .map(|(replica, stack)| {
            tokio::spawn(super::outbox::dispatch(
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
    for task in [maintenance, operator, reader] {
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
    if !super::outbox::drained(&sim, limit).await {
        sim.violate(format!(
            "oracle 9 (follow-on jobs): jobs were still in the store {limit:?} after the faults ended"
        ));
    }
    stop_dispatch.store(true, Ordering::SeqCst);
    for task in dispatchers {
        if let Err(e) = task.await {
            sim.violate(format!("a dispatcher task failed: {e}"));
        }
    }
    super::outbox::final_check(&sim);
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
            }
        })
        .collect()
}

fn call_plan(
    rng: &mut super::rng::Rng,
    t: &Timing,
    sabotage: Sabotage,
    op: usize,
    at: Duration,
    retry_depth: u32,
) -> CallPlan {
    let zero = Duration::ZERO;
    let mut lag = rng.between(zero, t.lag_max);
    if sabotage == Sabotage::LateVisibility {
        lag += t.settle;
    }
    CallPlan {
        op,
        at,
        cancel_after: rng.chance(0.12).then(|| rng.between(zero, t.cancel_max)),
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
            latency: if rng.chance(0.3) {
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

/// Counts a caller task in and out (also when it panics).
struct Outstanding(Arc<Sim>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        let mut w = self.0.world();
        w.outstanding_calls -= 1;
        if std::thread::panicking() {
            self.0
                .violation(&mut w, "a caller task panicked".to_owned());
        }
    }
}

fn spawn_call(sim: &Arc<Sim>, callers: &Callers, plan: CallPlan) -> tokio::task::JoinHandle<()> {
    let call = {
        let mut w = sim.world();
        w.outstanding_calls += 1;
        w.calls.push(CallRec {
            plan,
            run: None,
            answer: None,
            after: None,
        });
        w.calls.len() - 1
    };
    let guard = Outstanding(sim.clone());
    let (sim, callers) = (sim.clone(), callers.clone());
    tokio::spawn(async move {
        let _guard = guard;
        let at = sim.world().calls[call].plan.at;
        tokio::time::sleep_until(sim.t0 + at).await;
        make_call(&sim, &callers, call).await;
    })
}

async fn make_call(sim: &Arc<Sim>, callers: &Callers, call: usize) {
    {
        let mut w = sim.world();
        let after = after_window(sim, &w, call);
        if after.is_some() {
            w.stats.bump("calls after their operation's window");
        }
        if w.calls[call].plan.repeat {
            w.stats.bump("purchases repeated after their window");
        }
        w.calls[call].after = after;
    }
    // A live replica serves the call; one that dies takes its calls along.
    let last = callers.replicas.len() - 1;
    let replica = {
        let dead = sim.world().dead.get(last).copied().unwrap_or(false);
        let n = if dead { last } else { last + 1 };
        sim.rng().below(n as u64) as usize
    };
    let exec = &callers.replicas[replica];
    let (plan, op) = {
        let w = sim.world();
        let plan = w.calls[call].plan.clone();
        (plan.clone(), w.ops[plan.op].clone())
    };
    let caller = Caller::new(op.tenant.clone(), op.subject.clone());
    let scope = match op.tool {
        Tool::Charge { window } | Tool::Legacy { window } => ScopeSpec::Window(window),
        Tool::Ship { retention } => ScopeSpec::BusinessKey {
            fields: &["order_id"],
            retention,
        },
    };
    let operation = Operation {
        caller: &caller,
        tool: op.tool.name(),
        args: &op.args,
        scope,
        status_tool: STATUS_TOOL,
    };
    let handler = {
        let (sim, plan, amount) = (sim.clone(), plan.clone(), op.amount);
        move |ctx: OperationContext| handler(sim, call, ctx, plan, amount)
    };
    let run = exec.run::<_, Receipt, ToolError, _, _>(operation, handler);
    let died = callers.died.clone();
    let mortal = replica == last && callers.replicas.len() > 1;
    let death = {
        let sim = sim.clone();
        async move {
            if !mortal {
                std::future::pending::<()>().await;
            }
            loop {
                let notified = died.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if sim.world().dead[last] {
                    return;
                }
                notified.await;
            }
        }
    };
    let served = async {
        tokio::select! {
            biased;
            answer = run => Some(answer),
            () = death => {
                sim.world().stats.bump("calls lost with their replica");
                None
            }
        }
    };
    let answer = match plan.cancel_after {
        Some(after) => tokio::time::timeout(after, served).await.ok().flatten(),
        None => served.await,
    };
    if answer.is_none() {
        let mut w = sim.world();
        w.stats.bump("call dropped mid-flight");
    }
    let reference = answer.as_ref().and_then(|a| a.reference());
    judge(sim, call, answer.as_ref());
    if let Some(r) = reference {
        sim.check_tenants(&r).await;
        if sim.rng().chance(0.2) {
            // The status tool, asked from another tenant.
            let other = Caller::new(
                TENANTS
                    .iter()
                    .find(|t| **t != op.tenant)
                    .copied()
                    .unwrap_or("x"),
                "mallory",
            );
            if let Ok(Some(status)) = exec.status(&other, &r.to_string()).await {
                sim.violate(format!(
                    "oracle 6 (tenants): the status tool told tenant {} about {r} of tenant {}: {}",
                    other.tenant(),
                    op.tenant,
                    status.state
                ));
            }
            // And from its own: a completed operation shows that effect.
            if let Ok(Some(status)) = exec.status(&caller, &r.to_string()).await {
                if status.state == idem_runtime::store::RecordStateKind::Completed {
                    let shown: Option<Receipt> =
                        status.response.and_then(|v| serde_json::from_value(v).ok());
                    let w = sim.world();
                    let held = sim.charge_of(&w, &r);
                    if shown.as_ref().map(|s| &s.charge_id) != held.as_ref().map(|c| &c.id) {
                        drop(w);
                        sim.violate(format!(
                            "oracle 2 (the status tool shows this effect): {r} shows {shown:?}, the processor holds {held:?}"
                        ));
                    }
                }
            }
        }
    }
    sim.check_live("an answer").await;
    retry(sim, callers, &plan, answer.as_ref());
}

/// A client that retries: after "in progress" once the lease may be over,
/// after an unknown or failed answer sometimes, and now and then anyway.
fn retry(
    sim: &Arc<Sim>,
    callers: &Callers,
    plan: &CallPlan,
    answer: Option<&Answer<Receipt, ToolError>>,
) {
    if plan.retry_depth >= 3 {
        return;
    }
    let t = &sim.timing;
    let next = {
        let mut rng = sim.rng();
        let later = match answer {
            Some(Answer::InProgress { retry_after, .. }) => rng
                .chance(0.5)
                .then(|| *retry_after + Duration::from_millis(100)),
            None
            | Some(Answer::Unknown { .. })
            | Some(Answer::StoreUnavailable { .. })
            | Some(Answer::Failed { .. }) => rng
                .chance(0.3)
                .then(|| rng.between(t.interval / 2, t.interval * 5)),
            _ => rng
                .chance(0.15)
                .then(|| rng.between(t.interval / 2, t.interval * 10)),
        };
        let Some(later) = later else { return };
        let at = sim.elapsed() + later;
        if at > t.horizon {
            return;
        }
        call_plan(&mut rng, t, sim.sabotage, plan.op, at, plan.retry_depth + 1)
    };
    drop(spawn_call(sim, callers, next));
}

/// Marks a handler run over when its future ends or is dropped.
struct Live(Arc<Sim>, usize);

impl Drop for Live {
    fn drop(&mut self) {
        let mut w = self.0.world();
        w.runs[self.1].live = false;
        let i = self.1;
        self.0.log(&mut w, || format!("run {i} ends"));
    }
}

async fn handler(
    sim: Arc<Sim>,
    call: usize,
    ctx: OperationContext,
    plan: CallPlan,
    amount: u64,
) -> Result<Receipt, ToolError> {
    let run = start_run(&sim, call, &ctx);
    let _live = Live(sim.clone(), run);
    tokio::time::sleep(plan.prework).await;
    if plan.panic == PanicAt::BeforeSend {
        sim.world().runs[run].panicked = true;
        panic!("sim-panic: the handler panicked before sending");
    }
    if plan.invalid {
        return Err(ToolError::rejected("the card number is not valid"));
    }
    let reference = if sim.sabotage == Sabotage::StaleReference {
        *sim.world()
            .first_refs
            .entry(plan.op)
            .or_insert(ctx.reference())
    } else {
        ctx.reference()
    };
    // Like a payment SDK, the client sends the request again, once and under
    // the same reference, when the processor has not answered within half
    // the timeout; the processor must deduplicate it (`Sabotage::NoDedupe`).
    // The whole wait stays within the handler's timeout.
    let mut first = sim.send(run, reference, amount, plan.request);
    let answer = if plan.resend {
        let half = plan.handler_timeout / 2;
        match tokio::time::timeout(half, &mut first).await {
            Ok(answer) => Ok(answer),
            Err(_) => {
                sim.world().stats.bump("requests sent again");
                let again = sim.send(run, reference, amount, plan.request);
                tokio::time::timeout(plan.handler_timeout - half, again).await
            }
        }
    } else {
        tokio::time::timeout(plan.handler_timeout, first).await
    };
    match answer {
        Ok(Ok(ProcAnswer::Charged(receipt))) => {
            if sim.sabotage == Sabotage::RejectAfterEffect && sim.rng().chance(0.5) {
                return Err(ToolError::rejected("declined (but it was charged)"));
            }
            // The receipt (or the warehouse's notice) goes out through the
            // outbox, written with the completion.
            let tool = sim.world().ops[plan.op].tool;
            if let Some(name) = super::outbox::job_name(tool.name()) {
                idem_runtime::follow_on(name, &receipt)
                    .map_err(|e| ToolError::unknown(e.to_string()))?;
            }
            tokio::time::sleep(plan.postwork).await;
            if plan.panic == PanicAt::AfterAnswer {
                sim.world().runs[run].panicked = true;
                panic!("sim-panic: the handler panicked after the processor answered");
            }
            Ok(receipt)
        }
        Ok(Ok(ProcAnswer::Declined)) => Err(ToolError::rejected("the card was declined")),
        Ok(Err(_)) => Err(ToolError::unknown("the processor connection dropped")),
        Err(_) => Err(ToolError::unknown("the processor did not answer in time")),
    }
}

fn start_run(sim: &Arc<Sim>, call: usize, ctx: &OperationContext) -> usize {
    let mut w = sim.world();
    let reference = ctx.reference();
    let now = Instant::now();
    let key = match w.by_ref.get(&reference) {
        Some(key) => *key,
        None => {
            sim.violation(
                &mut w,
                format!("a handler ran for {reference}, which was never claimed"),
            );
            [0; 32]
        }
    };
    let (epoch, attempt) = w.keys.get(&key).map_or((0, None), |m| (m.epoch, m.attempt));
    let op = w.calls[call].plan.op;
    w.op_keys.insert(op, key);
    if let Some(other) = w
        .runs
        .iter()
        .position(|r| r.live && r.key == key && r.epoch == epoch)
    {
        sim.violation(
            &mut w,
            format!("oracle 1 (effects <= 1 per operation): a handler of {reference} started while run {other} of the same operation is still running"),
        );
    }
    let run = w.runs.len();
    w.runs.push(RunRec {
        call,
        key,
        reference,
        tenant: ctx.caller().tenant().to_owned(),
        epoch,
        attempt,
        started: now,
        live: true,
        request: None,
        panicked: false,
    });
    w.calls[call].run = Some(run);
    w.stats.bump("handler runs");
    sim.log(&mut w, || {
        format!("run {run} of call {call} starts: {reference} instance {epoch}")
    });
    run
}

async fn maintain(
    sim: Arc<Sim>,
    store: Stack,
    reconciler: SimReconciler,
    config: ReconcileConfig,
    stop: Arc<AtomicBool>,
) {
    let t = sim.timing.clone();
    // The maintaining process's own monotonic clock (the paused one).
    let settle_clock = SettleClock::new();
    loop {
        let pause = t.interval + sim.rng().between(Duration::ZERO, t.jitter);
        tokio::time::sleep(pause).await;
        if stop.load(Ordering::SeqCst) {
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
        }
    }
}

/// Oracle 5 (every UNKNOWN record a reconciler can resolve is resolved within
/// the bound), the stored responses (oracle 2), and the model against the
/// store.
async fn final_checks(sim: &Arc<Sim>) {
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
    let now = (sim.clock)();
    let tol = sim.timing.tolerance;
    for (_key, tenant, tool, reference, snapshot) in keys {
        let actual = sim.peek(&tenant, &reference).await;
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
