//! Oracle 10: every reference a caller was given reads, until its retention
//! ends, as what really happened to that operation: COMPLETED with its own
//! charge when the processor holds one, NOT_PERFORMED or not found only when
//! nothing was sent under it, and never another operation's record, even
//! once a new operation took its key. Read through the status tool and
//! through `lookup`, during the schedule (a reader that asks about old
//! references now and then, late ones included) and at its end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use idem_runtime::store::{RecordState, RecordStateKind};
use idem_runtime::{Caller, Executor, Reference};

use super::rng::Rng;
use super::world::{Outcome, Receipt, Sabotage, Sim, Tool, World};

/// What the harness knows of a reference a claim took: whose it is, and
/// until when it must read (its latest claim's send plus the retention the
/// executor asked for: no later than the store counts it).
#[derive(Clone, Debug)]
pub struct RefLife {
    pub key: [u8; 32],
    pub tenant: String,
    pub tool: String,
    pub reads_until: SystemTime,
}

/// One read of a reference, through the status tool or `lookup`.
#[derive(Debug)]
struct Read {
    reference: String,
    /// The record's tenant and key (a lookup shows them, the status tool
    /// does not).
    owner: Option<(String, [u8; 32])>,
    state: RecordStateKind,
    response: Option<String>,
}

/// A caller was handed `reference` in an answer.
pub fn given(w: &mut World, reference: Reference) {
    if w.refs.contains_key(&reference) && !w.given.contains(&reference) {
        w.given.push(reference);
        w.stats.bump("references handed to callers");
    }
}

/// What happened under `reference` before a read: the charges the
/// processor made for it, and the requests sent under it still on their
/// way (one that was declined since counts as nothing).
struct Happened {
    charges: Vec<String>,
    on_its_way: Vec<usize>,
}

fn happened(w: &World, reference: &Reference) -> Happened {
    Happened {
        charges: w
            .charges
            .iter()
            .filter(|c| c.reference == *reference)
            .map(|c| c.id.clone())
            .collect(),
        on_its_way: w
            .requests
            .iter()
            .enumerate()
            .filter(|(_, r)| r.reference == *reference && r.outcome == Outcome::Pending)
            .map(|(i, _)| i)
            .collect(),
    }
}

/// Reads `reference` as its owner would (`status`: through the status
/// tool, else `lookup`), on the store without faults.
async fn read(
    sim: &Sim,
    status: &Executor,
    life: &RefLife,
    reference: Reference,
    tool: bool,
) -> Option<Read> {
    if sim.sabotage == Sabotage::ForgetSuperseded {
        let w = sim.world();
        let current = w.keys.get(&life.key).map(|m| m.reference);
        if current != Some(reference) {
            return None;
        }
    }
    if tool {
        let caller = Caller::new(life.tenant.clone(), "status-reader");
        match status.status(&caller, &reference.to_string()).await {
            Ok(found) => found.map(|s| Read {
                reference: s.reference,
                owner: None,
                state: s.state,
                response: s.response.map(|v| v.to_string()),
            }),
            Err(e) => {
                sim.violate(format!(
                    "the status tool failed on {reference} with the store healthy: {e}"
                ));
                None
            }
        }
    } else {
        let record = sim.peek(&life.tenant, &reference).await?;
        let response = match &record.state {
            RecordState::Completed { response } => Some(response.clone()),
            _ => None,
        };
        let state = if record.is_lapsed() {
            RecordStateKind::Unknown
        } else {
            record.state.kind()
        };
        Some(Read {
            reference: record.reference.to_string(),
            owner: Some((record.tenant.clone(), *record.key.as_bytes())),
            state,
            response,
        })
    }
}

/// Judges one read of `reference` against what happened before it (and
/// the charges made since, for a COMPLETED record's). `settled`: at the
/// end, when every operation a reconciler can ask about is resolved.
fn judge(
    w: &World,
    reference: &Reference,
    life: &RefLife,
    before: &Happened,
    read: Option<&Read>,
    settled: bool,
) -> Option<String> {
    let on_its_way = before
        .on_its_way
        .iter()
        .any(|i| w.requests[*i].outcome != Outcome::Declined);
    let something = !before.charges.is_empty() || on_its_way;
    let what = || {
        if before.charges.is_empty() {
            "a request sent under it is still on its way".to_owned()
        } else {
            format!(
                "the processor holds its charge {}",
                before.charges.join(", ")
            )
        }
    };
    let Some(read) = read else {
        return something.then(|| format!("it reads \"not found\", but {}", what()));
    };
    if read.reference != reference.to_string() {
        return Some(format!("it reads as the record of {}", read.reference));
    }
    if let Some((tenant, key)) = &read.owner {
        if *tenant != life.tenant || *key != life.key {
            return Some(
                "it reads as the record of another operation (another key or tenant)".to_owned(),
            );
        }
    }
    match read.state {
        RecordStateKind::NotPerformed if something => {
            Some(format!("it reads NOT_PERFORMED, but {}", what()))
        }
        RecordStateKind::Completed => {
            let receipt: Option<Receipt> = read
                .response
                .as_deref()
                .and_then(|r| serde_json::from_str(r).ok());
            let own = receipt.as_ref().is_some_and(|r| {
                r.reference == reference.to_string()
                    && w.charges
                        .iter()
                        .any(|c| c.id == r.charge_id && c.reference == *reference)
            });
            (!own).then(|| {
                format!(
                    "it reads COMPLETED with {receipt:?}, not a charge made under it (the processor holds {:?} for it)",
                    w.charges
                        .iter()
                        .filter(|c| c.reference == *reference)
                        .map(|c| &c.id)
                        .collect::<Vec<_>>()
                )
            })
        }
        RecordStateKind::InProgress | RecordStateKind::Unknown
            if settled && Tool::reconcilable(&life.tool) =>
        {
            Some(format!(
                "it still reads {} once everything was reconciled",
                read.state
            ))
        }
        _ => None,
    }
}

/// Reads `reference` and judges the read, unless its retention may have
/// ended (by the store's clock, with the clocks' tolerance).
async fn check(sim: &Sim, status: &Executor, reference: Reference, tool: bool, settled: bool) {
    let (life, before) = {
        let w = sim.world();
        let Some(life) = w.refs.get(&reference).cloned() else {
            return;
        };
        (life, happened(&w, &reference))
    };
    let tol = sim.timing.tolerance;
    if (sim.clock)() + tol >= life.reads_until {
        return;
    }
    let found = read(sim, status, &life, reference, tool).await;
    let mut w = sim.world();
    // Still within the retention after the read.
    if (sim.clock)() + tol >= life.reads_until {
        return;
    }
    w.stats.bump(if tool {
        "references read through the status tool"
    } else {
        "references read through lookup"
    });
    let superseded = w
        .keys
        .get(&life.key)
        .is_some_and(|m| m.reference != reference);
    if superseded {
        w.stats
            .bump("references read after a new operation took their key");
    }
    if let Some(problem) = judge(&w, &reference, &life, &before, found.as_ref(), settled) {
        let how = if tool { "the status tool" } else { "lookup" };
        sim.violation(
            &mut w,
            format!(
                "oracle 10 (every reference reads true): {reference} ({}), given to a caller, read through {how}{}: {problem}",
                life.tool,
                if superseded { " after a new operation took its key" } else { "" }
            ),
        );
    }
}

/// Oracle 10 during the schedule: now and then a caller asks about a
/// reference it was given earlier, half the time one whose key a new
/// operation took since. Its own generator: the schedule draws what it
/// always drew.
pub async fn reader(sim: Arc<Sim>, stop: Arc<AtomicBool>) {
    let t = sim.timing.clone();
    let mut rng = Rng::new(sim.seed ^ 0x0010_5eed_0010_5eed);
    let status = Executor::new(sim.inner.clone());
    loop {
        let pause = rng.between(t.interval / 4, t.interval);
        tokio::time::sleep(pause).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let (all, old): (Vec<Reference>, Vec<Reference>) = {
            let w = sim.world();
            let now = (sim.clock)();
            let all: Vec<Reference> = w
                .given
                .iter()
                .filter(|r| w.refs.get(r).is_some_and(|l| now < l.reads_until))
                .copied()
                .collect();
            let old = all
                .iter()
                .filter(|r| {
                    let key = w.refs[*r].key;
                    w.keys.get(&key).is_some_and(|m| m.reference != **r)
                })
                .copied()
                .collect();
            (all, old)
        };
        for _ in 0..2 {
            let from = if !old.is_empty() && rng.chance(0.5) {
                &old
            } else {
                &all
            };
            if from.is_empty() {
                break;
            }
            let reference = *rng.pick(from);
            let tool = rng.chance(0.5);
            check(&sim, &status, reference, tool, false).await;
        }
    }
}

/// Oracle 10 at the end, once everything is reconciled: every reference
/// handed to a caller whose retention has not ended reads what happened.
pub async fn final_check(sim: &Sim) {
    let status = Executor::new(sim.inner.clone());
    let given = sim.world().given.clone();
    for reference in given {
        check(sim, &status, reference, false, true).await;
        check(sim, &status, reference, true, true).await;
    }
}
