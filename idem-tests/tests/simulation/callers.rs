//! The callers of a schedule: each call on a replica, its handler run
//! against the processor, and the client's retries.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    answer::Answer,
    executor::{Operation, OperationContext, ScopeSpec},
    Caller, Executor, ToolError,
};
use tokio::time::Instant;

use super::answers::{after_window, judge};
use super::processor::{ProcAnswer, Processor};
use super::scenario::{call_plan, STATUS_TOOL, TENANTS};
use super::world::{CallPlan, CallRec, PanicAt, Receipt, RunRec, Sabotage, Sim, Tool};

/// Where calls go: the replicas (the last one may die), and word of its
/// death.
#[derive(Clone)]
pub(super) struct Callers {
    pub(super) replicas: Vec<Executor>,
    /// Woken when the last replica dies (a `Notify`: it wakes its waiters
    /// in a fixed order, where a watch channel's shards pick one at random
    /// and a seed would not replay).
    pub(super) died: Arc<tokio::sync::Notify>,
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

pub(super) fn spawn_call(
    sim: &Arc<Sim>,
    callers: &Callers,
    plan: CallPlan,
) -> tokio::task::JoinHandle<()> {
    let call = {
        let mut w = sim.world();
        w.outstanding_calls += 1;
        w.calls.push(CallRec {
            plan,
            run: None,
            answer: None,
            after: None,
            made: None,
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
        w.calls[call].made = Some(tokio::time::Instant::now());
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
    let scope = match (op.tool, op.client_key.as_deref()) {
        (Tool::Charge { window }, Some(key)) if sim.sabotage != Sabotage::IgnoreClientKey => {
            ScopeSpec::ClientKey { key, window }
        }
        (Tool::Charge { window } | Tool::Legacy { window }, _) => ScopeSpec::Window(window),
        (Tool::Ship { retention }, _) => ScopeSpec::BusinessKey {
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
            // follow-ons, written with the completion.
            let tool = sim.world().ops[plan.op].tool;
            if let Some(name) = super::follow_ons::job_name(tool.name()) {
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
