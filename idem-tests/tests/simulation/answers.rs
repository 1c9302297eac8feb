//! What a caller was told, against what happened: oracles 2 and 3 (an
//! answer's effect, or its absence) and oracle 8 from the caller's side (a
//! call after its operation's window is a new operation).

use idem_runtime::{
    answer::{Answer, Disposition, Recording},
    store::RecordState,
    ToolError,
};

use super::world::{AfterWindow, Outcome, Receipt, Sim, Tool, World};

/// Oracle 8: whether `call`, made now, comes after the window of its
/// operation's latest instance, which ended COMPLETED: the window the
/// executor asked for, counted from the instance's claim, ended more than
/// the margin ago by the store's clock, so the call is a new operation
/// whatever the clocks' grain. However late the instance was completed (a
/// late handler, a reconciler, an operator), its window ends there: the
/// record's own `expires_at` is not read, so a store that stretched it
/// cannot hide a suppressed purchase. A call nearer the edge may
/// legitimately be either, and is not judged; nor is one after an UNKNOWN
/// or IN_PROGRESS instance (kept past its window until resolved) or of a
/// business key.
pub fn after_window(sim: &Sim, w: &World, call: usize) -> Option<AfterWindow> {
    let op = w.calls[call].plan.op;
    w.ops[op].tool.window()?;
    let key = *w.op_keys.get(&op)?;
    let m = w.keys.get(&key)?;
    let record = m.snapshot.as_ref()?;
    let RecordState::Completed { response } = &record.state else {
        return None;
    };
    let late_by = (sim.clock)().duration_since(m.window_ends).ok()?;
    if late_by < sim.timing.window_margin {
        return None;
    }
    let charge = serde_json::from_str::<Receipt>(response)
        .ok()
        .map(|r| r.charge_id);
    Some(AfterWindow {
        key,
        epoch: m.epoch,
        charge,
        late_by,
    })
}

/// Oracle 8, from the caller's side: a call made after its operation's
/// window, answered with a charge, got a charge of a later instance than
/// the one whose window had ended, not that one's again.
fn judge_after_window(
    sim: &Sim,
    w: &mut World,
    call: usize,
    kind: &str,
    id: &str,
) -> Option<String> {
    let after = w.calls[call].after.clone()?;
    w.stats
        .bump("calls after their operation's window, answered with a charge");
    let (_, key, epoch) = sim.charge_by_id(w, id)?;
    if key == after.key && epoch > after.epoch {
        return None;
    }
    Some(format!(
        "oracle 8 (no wanted operation is suppressed): the call was made {:?} after the window of instance {} of its operation (COMPLETED with {}) had ended, counted from its claim: a new operation the user wanted; it was answered {kind} with {id}, a charge of {}",
        after.late_by,
        after.epoch,
        after.charge.as_deref().unwrap_or("?"),
        if key == after.key {
            format!("instance {epoch}")
        } else {
            "another operation".to_owned()
        },
    ))
}

/// Oracle 12 (nothing ran stays true): a caller told that nothing ran,
/// because its claim failed or was given up on, may have left a claim the
/// store applies later. Nobody was given that operation, so no call made
/// past two leases of the claim's send (a claim lands within its lease, and
/// holds for one lease more at most) is told of it, and a call made inside
/// that bound may only find it holding the key: in progress, with a
/// retry-after that ends within the bound (counted from the call, whose
/// answer a slow store may bring late), or a conflict of another business
/// key's arguments; the retry after that finds nothing of it. Excused when
/// the releases on their way while the landed claim could still be taken
/// back all failed or were slow: the store could not be told to take it
/// back. A release still on its way when the call is answered is judged by
/// how it ended, at the end of the schedule ([`final_check`]).
fn judge_unconfirmed(
    sim: &Sim,
    w: &mut World,
    call: usize,
    answer: &Answer<Receipt, ToolError>,
) -> Option<String> {
    let reference = answer.reference()?;
    let claim = *w.unconfirmed.get(&reference)?;
    let now = tokio::time::Instant::now();
    let made = w.calls[call].made.unwrap_or(now);
    let t = &sim.timing;
    let bound = claim.sent + t.lease * 2 + t.tolerance + t.slack;
    let problem = match answer {
        Answer::InProgress { retry_after, .. } if made + *retry_after <= bound => {
            w.stats
                .bump("unconfirmed claims met in progress within the bound");
            return None;
        }
        Answer::Conflict { .. } | Answer::ClientKeyConflict { .. } if made <= bound => {
            w.stats
                .bump("unconfirmed claims met as a conflict within the bound");
            return None;
        }
        Answer::InProgress { retry_after, .. } => format!(
            "oracle 12 (nothing ran stays true): {reference} was claimed {:?} before a call by a caller told nothing ran; the call was told it is in progress, with a retry-after of {retry_after:?}, past the bound of two leases",
            made - claim.sent
        ),
        other => format!(
            "oracle 12 (nothing ran stays true): {reference} was claimed {:?} before a call by a caller told nothing ran; the call was told {}",
            made - claim.sent,
            other.name()
        ),
    };
    // The excuse: the landed claim could be taken back from its landing
    // until the call, or the end of its lease if that came first (the
    // executor's to send), and every release on its way in that time failed
    // or was slow. None on its way is no excuse. With skewed clocks, the
    // lease ends as the fastest replica's clock has it: up to `tolerance`
    // earlier (docs/clocks.md), so a release sent after that came too late
    // for a call read on that clock.
    let landed = w
        .claims_landed
        .get(&(claim.key, claim.attempt))
        .copied()
        .unwrap_or(made);
    let until = made.min(landed + t.lease.saturating_sub(t.tolerance));
    let unconfirmed = PendingUnconfirmed {
        call,
        key: claim.key,
        attempt: claim.attempt,
        landed,
        until,
        at: sim.elapsed(),
        problem,
    };
    match excused(sim, w, &unconfirmed, false) {
        Some(true) => {
            w.stats.bump(EXCUSED);
            None
        }
        Some(false) => Some(unconfirmed.problem),
        None => {
            w.pending_unconfirmed.push(unconfirmed);
            None
        }
    }
}

/// Oracle 12's count of the calls its excuse let pass.
const EXCUSED: &str = "unconfirmed claims met while their releases failed (excused)";

/// A call oracle 12 judged against a landed claim whose releases were still
/// on their way when it was answered.
#[derive(Clone, Debug)]
pub struct PendingUnconfirmed {
    call: usize,
    key: [u8; 32],
    attempt: u64,
    landed: tokio::time::Instant,
    until: tokio::time::Instant,
    /// When the call was answered (time into the schedule).
    at: std::time::Duration,
    problem: String,
}

/// Whether the releases of `p`'s claim that were on its way between its
/// landing and `p.until` all failed or were slow (more than a quarter of
/// the lease, or never answered): `None` when that turns on a release still
/// on its way, unless `finally`, when one never answered was given up.
fn excused(sim: &Sim, w: &World, p: &PendingUnconfirmed, finally: bool) -> Option<bool> {
    let slow = sim.timing.lease / 4;
    let Some(sent) = w.releases.get(&(p.key, p.attempt)) else {
        return Some(false);
    };
    let on_its_way: Vec<_> = sent
        .iter()
        .filter(|(at, answered)| *at < p.until && answered.is_none_or(|(when, _)| when >= p.landed))
        .collect();
    if on_its_way.is_empty() {
        return Some(false);
    }
    let mut open = false;
    for (at, answered) in on_its_way {
        match answered {
            Some((when, ok)) => {
                if *ok && *when - *at <= slow {
                    return Some(false);
                }
            }
            None if finally => {}
            None => open = true,
        }
    }
    if open {
        None
    } else {
        Some(true)
    }
}

/// Oracle 12's calls answered while a release of their claim was on its
/// way, judged now that every release has ended.
pub fn final_check(sim: &Sim) {
    let mut w = sim.world();
    let pending = std::mem::take(&mut w.pending_unconfirmed);
    for p in pending {
        if excused(sim, &w, &p, true) == Some(true) {
            w.stats.bump(EXCUSED);
            continue;
        }
        sim.violation_at(&mut w, p.at, format!("call {}: {}", p.call, p.problem));
    }
}

/// Oracles 2 and 3: what the caller was told against what happened.
pub fn judge(sim: &Sim, call: usize, answer: Option<&Answer<Receipt, ToolError>>) {
    let mut w = sim.world();
    let kind = answer.map_or("dropped", |a| a.name());
    w.calls[call].answer = Some(kind);
    w.stats.bump(kind);
    let run = w.calls[call].run;
    sim.log(&mut w, || {
        format!("call {call} answered {kind} (run {run:?})")
    });
    let Some(answer) = answer else { return };
    if let Some(r) = answer.reference() {
        super::references::given(&mut w, r);
    }
    let mut problems = Vec::new();
    problems.extend(judge_unconfirmed(sim, &mut w, call, answer));
    let nothing_ran = |what: &str, problems: &mut Vec<String>| {
        if let Some(r) = run {
            problems.push(format!(
                "oracle 3 (nothing executed means nothing executed): the caller was told {what}, but its handler ran (run {r})"
            ));
        }
    };
    match answer {
        Answer::Executed {
            value,
            reference,
            recording,
        } => {
            match recording {
                Recording::Stored => {}
                Recording::Pending => w.stats.bump("executed, completion in the background"),
                Recording::Failed => w.stats.bump("executed, completion not recorded"),
            }
            let own = run.and_then(|r| w.runs[r].request.map(|q| (r, q)));
            match own.map(|(_, q)| &w.requests[q].outcome) {
                Some(Outcome::Charged { charge, .. }) if w.charges[*charge].id == value.charge_id => {}
                other => problems.push(format!(
                    "oracle 2 (executed means this effect): the caller got {value:?}, but its own request ended {other:?}"
                )),
            }
            match sim.charge_of(&w, reference) {
                Some(c) if c.id == value.charge_id && value.reference == reference.to_string() => {}
                other => problems.push(format!(
                    "oracle 2 (executed means this effect): the caller got {value:?} for {reference}, the processor holds {other:?}"
                )),
            }
        }
        Answer::Replayed {
            value,
            stored,
            reference,
        } => {
            nothing_ran("it was replayed", &mut problems);
            match sim.charge_of(&w, reference) {
                Some(c) if c.id == value.charge_id && value.reference == reference.to_string() => {}
                other => problems.push(format!(
                    "oracle 2 (replayed means this effect): the caller got {value:?} for {reference}, the processor holds {other:?}"
                )),
            }
            if serde_json::from_str::<Receipt>(stored).ok().as_ref() != Some(value) {
                problems.push(format!(
                    "the replay's stored text {stored} is not its value"
                ));
            }
            // The replayed charge was made for these arguments: a call with
            // other arguments under the same key is a conflict, never
            // another operation's result.
            if let Some((c, _, _)) = sim.charge_by_id(&w, &value.charge_id) {
                let ran = &w.ops[w.calls[w.runs[w.charges[c].run].call].plan.op];
                let this = &w.ops[w.calls[call].plan.op];
                if ran.tenant != this.tenant || ran.args != this.args {
                    problems.push(format!(
                        "oracle 2 (replayed means this effect): a call with {} of {} got the replay of {}, charged for {} of {}: a conflict answered as a replay",
                        this.args, this.tenant, value.charge_id, ran.args, ran.tenant
                    ));
                }
            }
        }
        Answer::InProgress { .. } => nothing_ran("it is in progress", &mut problems),
        Answer::Conflict { .. } => {
            nothing_ran("of a conflict", &mut problems);
            // Only a business key taken by other arguments is a conflict.
            let op = &w.ops[w.calls[call].plan.op];
            let rival = w.ops.iter().any(|o| {
                matches!(o.tool, Tool::Ship { .. })
                    && o.tenant == op.tenant
                    && o.args["order_id"] == op.args["order_id"]
                    && o.args != op.args
            });
            if !matches!(op.tool, Tool::Ship { .. }) || !rival {
                problems.push(format!(
                    "a conflict answered for {:?}, whose key no other arguments share",
                    op.args
                ));
            }
        }
        // Oracle 13 judges whose key it is.
        Answer::ClientKeyConflict { .. } => nothing_ran("of a conflict", &mut problems),
        Answer::Refused { .. } => nothing_ran("it was refused", &mut problems),
        Answer::StoreUnavailable { .. } => nothing_ran("the store was unavailable", &mut problems),
        Answer::Unknown { .. } => {
            if let Some(r) = run {
                if !w.runs[r].panicked {
                    problems.push(format!("the caller was told unknown, but its handler (run {r}) ran and did not panic"));
                }
            }
        }
        Answer::Failed {
            disposition: Disposition::Rejected,
            ..
        } => match run {
            None => problems.push("a rejection without a handler run".to_owned()),
            Some(r) => {
                if let Some(q) = w.runs[r].request {
                    if let Outcome::Charged { charge, .. } = w.requests[q].outcome {
                        problems.push(format!(
                            "oracle 3 (nothing executed means nothing executed): the caller was told \"rejected, nothing was executed\", but its request took effect as {}",
                            w.charges[charge].id
                        ));
                    }
                }
            }
        },
        Answer::Failed { .. } => {
            if run.is_none() {
                problems.push("a failure without a handler run".to_owned());
            }
        }
        _ => problems.push(format!("an answer the simulation does not know: {kind}")),
    }
    super::client_keys::judge(sim, &mut w, call, answer, &mut problems);
    // Oracle 8: an operation answered as executed got its own charge, and
    // a call after its operation's window got a new operation's.
    let charged = match answer {
        Answer::Executed { value, .. } | Answer::Replayed { value, .. } => Some(&value.charge_id),
        _ => None,
    };
    if let Some(id) = charged {
        problems.extend(judge_after_window(sim, &mut w, call, kind, id));
    }
    if let (Answer::Executed { value, .. }, Some(r)) = (answer, run) {
        let (key, epoch) = (w.runs[r].key, w.runs[r].epoch);
        let how = format!("answered executed to call {call}");
        sim.credit(&mut w, &value.charge_id, key, epoch, &how);
    }
    for p in problems {
        sim.violation(&mut w, format!("call {call}: {p}"));
    }
}
