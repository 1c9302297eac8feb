//! A payment processor with a real one's semantics, and the reconciler that
//! asks it about UNKNOWN records.
//!
//! - Idempotent by the reference the handler passes, for a day, like
//!   Stripe: a request whose reference the processor took in less than
//!   `processor_keeps_keys` (24 h) before gets that charge (once it has
//!   landed), never a second one. The key is held from the moment the
//!   first request arrives, and forgotten 24 h later: a request after that
//!   is charged anew.
//! - A request reaches the processor after a network delay, lands after a
//!   processing latency and shows in the lookup some time after landing
//!   (eventual consistency). It lands whether or not the handler still
//!   waits: a handler that timed out or was dropped does not unsend it.
//! - Some requests are declined on arrival, before any effect.
//! - The lookup answers "completed" for a visible charge, "still unknown"
//!   for one in flight, and "not performed" for everything else, including
//!   a charge that landed but does not show yet, and a request still on
//!   the wire: that is what the settle period is for.

use std::sync::Arc;

use async_trait::async_trait;
use idem_runtime::follow_ons::FollowOn;
use idem_runtime::maintenance::{Outcome as Found, Reconciler, Reconciliation};
use idem_runtime::store::Record;
use idem_runtime::Reference;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::buggify::Point;
use super::world::{
    Charge, Entry, Outcome, Receipt, RequestPlan, RequestRec, Sabotage, Sim, World,
};

#[derive(Debug)]
pub enum ProcAnswer {
    Charged(Receipt),
    Declined,
}

pub trait Processor {
    fn send(
        &self,
        run: usize,
        reference: Reference,
        amount: u64,
        plan: RequestPlan,
    ) -> oneshot::Receiver<ProcAnswer>;
}

impl Processor for Arc<Sim> {
    fn send(
        &self,
        run: usize,
        reference: Reference,
        amount: u64,
        plan: RequestPlan,
    ) -> oneshot::Receiver<ProcAnswer> {
        let (tx, rx) = oneshot::channel();
        let request = {
            let mut w = self.world();
            let (tenant, epoch) = {
                let r = &w.runs[run];
                (r.tenant.clone(), r.epoch)
            };
            let i = w.requests.len();
            w.requests.push(RequestRec {
                run,
                reference,
                tenant,
                epoch,
                amount,
                plan,
                sent: Instant::now(),
                outcome: Outcome::Pending,
            });
            w.runs[run].request = Some(i);
            w.pending_tasks += 1;
            self.log(&mut w, || {
                format!("processor: run {run} sends {reference} ({plan:?})")
            });
            i
        };
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(plan.arrive).await;
            let (answer, at) = sim.arrive(request);
            tokio::time::sleep_until(at).await;
            let _ = tx.send(answer);
            sim.world().pending_tasks -= 1;
        });
        rx
    }
}

impl Sim {
    /// A request reaches the processor: the answer, and when it is sent back.
    fn arrive(&self, request: usize) -> (ProcAnswer, Instant) {
        let now = Instant::now();
        let mut w = self.world();
        let (reference, tenant, amount, plan, run) = {
            let r = &w.requests[request];
            (r.reference, r.tenant.clone(), r.amount, r.plan, r.run)
        };
        // The key, if the processor still holds it.
        let held = w
            .entries
            .get(&reference)
            .filter(|e| now < e.since + self.timing.processor_keeps_keys)
            .map(|e| e.charge);
        if self.sabotage != Sabotage::NoDedupe {
            if let Some(c) = held {
                let first = w.charges[c].run;
                self.same_instance(&mut w, reference, first, run);
                w.requests[request].outcome = Outcome::Charged {
                    charge: c,
                    new: false,
                };
                w.stats.bump("processor deduplicated a request");
                self.on_charged(&mut w, request, c, false);
                let charge = &w.charges[c];
                let (receipt, at) = (charge.receipt(), charge.lands_at.max(now));
                self.log(&mut w, || {
                    format!(
                        "processor: {reference} again, answered with {}",
                        receipt.charge_id
                    )
                });
                return (ProcAnswer::Charged(receipt), at);
            }
        }
        // A key whose first request was declined answers every repeat with
        // the decline, for a day (like Stripe, which keeps the first result
        // of a key, an error included).
        let refused = w
            .declined
            .get(&reference)
            .filter(|(since, _)| now < *since + self.timing.processor_keeps_keys)
            .filter(|_| self.sabotage != Sabotage::NoDedupe)
            .map(|(_, first)| *first);
        if plan.decline || refused.is_some() {
            w.requests[request].outcome = Outcome::Declined;
            match refused {
                Some(first) => self.same_instance(&mut w, reference, first, run),
                None => {
                    w.declined.insert(reference, (now, run));
                }
            }
            self.log(&mut w, || format!("processor: {reference} declined"));
            return (ProcAnswer::Declined, now);
        }
        let c = w.charges.len();
        let charge = Charge {
            id: format!("ch_{}", c + 1),
            reference,
            tenant,
            amount,
            run,
            arrived: now,
            lands_at: now + plan.latency,
            visible_at: now + plan.latency + plan.lag,
        };
        let (receipt, at) = (charge.receipt(), charge.lands_at);
        w.charges.push(charge);
        if held.is_none() {
            w.entries.insert(
                reference,
                Entry {
                    charge: c,
                    since: now,
                },
            );
        }
        w.requests[request].outcome = Outcome::Charged {
            charge: c,
            new: true,
        };
        w.stats.bump("charges");
        self.log(&mut w, || {
            format!(
                "processor: {reference} charged {} (lands in {:?})",
                receipt.charge_id, plan.latency
            )
        });
        self.on_charged(&mut w, request, c, true);
        (ProcAnswer::Charged(receipt), at)
    }

    /// Oracle 8 at the processor: a request answered from the key another
    /// run's request created (a charge or a decline replayed) belongs to
    /// the same operation instance; a later operation the user wanted,
    /// answered with an earlier one's outcome, is suppressed.
    fn same_instance(&self, w: &mut World, reference: Reference, first: usize, run: usize) {
        let (a, b) = (&w.runs[first], &w.runs[run]);
        if (a.key, a.epoch) == (b.key, b.epoch) {
            return;
        }
        let (ea, eb) = (a.epoch, b.epoch);
        self.violation(
            w,
            format!(
                "oracle 8 (a wanted operation gets its own effect): run {run} (instance {eb}) sent {reference}, the reference of instance {ea}'s run {first}, and the processor answered it with that instance's outcome"
            ),
        );
    }

    /// Oracle 7: a NOT_PERFORMED resolution of instance `epoch`, made when
    /// `runs_before` handler runs had started, is wrong if a request of one
    /// of those runs took (or will take) effect, or if one of them is still
    /// running and may yet send.
    pub fn not_performed_problem(
        &self,
        w: &World,
        key: &[u8; 32],
        epoch: u32,
        runs_before: usize,
    ) -> Option<String> {
        let reference = w.keys.get(key)?.reference;
        for (i, r) in w.requests.iter().enumerate() {
            if r.reference != reference || r.epoch != epoch || r.run >= runs_before {
                continue;
            }
            match r.outcome {
                Outcome::Charged { charge, .. } => {
                    let c = &w.charges[charge];
                    return Some(format!(
                        "request {i} of run {} took effect as {} (a charge made by run {}; sent at {:.3}s, landed at {:.3}s, visible at {:.3}s)",
                        r.run,
                        c.id,
                        c.run,
                        r.sent.duration_since(self.t0).as_secs_f64(),
                        c.lands_at.duration_since(self.t0).as_secs_f64(),
                        c.visible_at.duration_since(self.t0).as_secs_f64(),
                    ));
                }
                Outcome::Pending if !r.plan.decline || w.entries.contains_key(&reference) => {
                    return Some(format!(
                        "request {i} of run {} is on its way and will take effect",
                        r.run
                    ))
                }
                _ => {}
            }
        }
        for (i, run) in w.runs.iter().enumerate().take(runs_before) {
            if run.reference == reference && run.epoch == epoch && run.live && run.request.is_none()
            {
                return Some(format!(
                    "run {i} is still running and has not sent its request yet"
                ));
            }
        }
        None
    }

    pub fn check_not_performed(&self, key: [u8; 32]) {
        let mut w = self.world();
        let Some(epoch) = w.keys.get(&key).map(|m| m.epoch) else {
            return;
        };
        if let Some(p) = self.not_performed_problem(&w, &key, epoch, w.runs.len()) {
            let reference = w.keys[&key].reference;
            self.violation(
                &mut w,
                format!("oracle 7 (not performed means not performed): {reference} was resolved NOT_PERFORMED, but {p}"),
            );
        }
    }
}

/// Looks records up at the processor. The legacy tool is not its own: it
/// answers `NotMine` (or, in some schedules, `StillUnknown` forever).
#[derive(Debug)]
pub struct SimReconciler {
    pub sim: Arc<Sim>,
    pub legacy_not_mine: bool,
    /// The replica whose maintenance asks.
    pub replica: usize,
}

/// Oracle 11: one replica's lookup of one reference in flight, from the
/// question to the moment its answer is acted on or given up (dropped).
struct Asking {
    sim: Arc<Sim>,
    replica: usize,
    reference: Reference,
}

impl Asking {
    fn start(sim: &Arc<Sim>, replica: usize, reference: Reference) -> Asking {
        let mut w = sim.world();
        if let Some(other) = w.asking.insert(reference, replica) {
            sim.violation(
                &mut w,
                format!(
                    "oracle 11 (one lookup at a time): replica {replica} asked the processor about \
                     {reference} while replica {other}'s lookup of it was in flight"
                ),
            );
        }
        Asking {
            sim: sim.clone(),
            replica,
            reference,
        }
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        let mut w = self.sim.world();
        if w.asking.get(&self.reference) == Some(&self.replica) {
            w.asking.remove(&self.reference);
        }
    }
}

#[async_trait]
impl Reconciler for SimReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        let sim = &self.sim;
        let _asking = Asking::start(sim, self.replica, record.reference);
        let (answer, delay) = {
            let mut w = sim.world();
            w.stats.bump("reconciler asked");
            if record.tool == "legacy_refund" {
                return Ok(if self.legacy_not_mine {
                    Reconciliation::NotMine
                } else {
                    Reconciliation::StillUnknown
                });
            }
            if sim.sabotage == Sabotage::ReconcilerStuck {
                return Ok(Reconciliation::StillUnknown);
            }
            if w.faults_on && sim.rng().chance(0.05) {
                return Err("the processor's lookup timed out".into());
            }
            let now = Instant::now();
            let reference = record.reference;
            let answer = match w.entries.get(&reference).map(|e| &w.charges[e.charge]) {
                Some(c) if c.tenant != record.tenant => Reconciliation::not_performed(),
                Some(c) if now < c.lands_at => {
                    // A processor that shows nothing until it is visible
                    // (within the settle period): only the settle period
                    // keeps "not performed" true.
                    if sim.sabotage == Sabotage::InFlightNotPerformed || sim.timing.hides_in_flight
                    {
                        Reconciliation::not_performed()
                    } else {
                        Reconciliation::StillUnknown
                    }
                }
                Some(c) if now >= c.visible_at => {
                    let mut receipt = c.receipt();
                    if sim.sabotage == Sabotage::WrongCompletion {
                        receipt.charge_id.push_str("_other");
                    }
                    let response = serde_json::to_string(&receipt).expect("a receipt serializes");
                    // What the handler would have declared after the charge.
                    match super::follow_ons::job_name(&record.tool) {
                        Some(name) => Reconciliation::Found(Found::completed_with(
                            response,
                            vec![FollowOn::new(name, &receipt).expect("a receipt is a valid job")],
                        )),
                        None => Reconciliation::completed(response),
                    }
                }
                // Landed, not visible yet; or unknown; or still on the wire.
                _ => Reconciliation::not_performed(),
            };
            sim.log(&mut w, || {
                format!(
                    "reconciler: {reference} ({}) -> {answer:?}",
                    record.state.name()
                )
            });
            let delay = if w.faults_on {
                let mut b = sim.buggify();
                b.fires(Point::ReconcilerAnswer)
                    .then(|| b.between(std::time::Duration::ZERO, sim.timing.settle))
            } else {
                None
            };
            if delay.is_some() {
                w.stats.bump(Point::ReconcilerAnswer.name());
            }
            (answer, delay)
        };
        // The lookup above describes the processor as it was; the answer
        // arrives this much later.
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        Ok(answer)
    }
}

/// The processor's idempotency over a day and a bit: requests under one
/// reference, sent by one run at `at` (from the schedule's start), each
/// arriving after `arrive`; the charge id or "declined" each got, in order.
pub async fn ledger_over_a_day(
    sim: &Arc<Sim>,
    reference: Reference,
    requests: &[(std::time::Duration, std::time::Duration)],
) -> Vec<String> {
    use super::world::RunRec;
    {
        let mut w = sim.world();
        w.runs.push(RunRec {
            call: 0,
            key: [0; 32],
            reference,
            tenant: "acme".to_owned(),
            epoch: 1,
            attempt: None,
            started: Instant::now(),
            live: false,
            request: None,
            panicked: false,
        });
    }
    let mut answers = Vec::new();
    for &(at, arrive) in requests {
        tokio::time::sleep_until(sim.t0 + at).await;
        let plan = RequestPlan {
            arrive,
            latency: std::time::Duration::from_secs(2),
            lag: std::time::Duration::ZERO,
            decline: false,
        };
        answers.push(sim.send(0, reference, 700, plan));
    }
    let mut ids = Vec::new();
    for answer in answers {
        ids.push(match answer.await {
            Ok(ProcAnswer::Charged(receipt)) => receipt.charge_id,
            Ok(ProcAnswer::Declined) => "declined".to_owned(),
            Err(_) => "dropped".to_owned(),
        });
    }
    ids
}
