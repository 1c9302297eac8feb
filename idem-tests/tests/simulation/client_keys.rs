//! Client keys in the schedules (issue 47): callers whose host sends an
//! idempotency key, and oracle 13, which judges them by what users are
//! promised.
//!
//! Each schedule adds, most of the time, one or two hosts' keyed charges,
//! drawn from a generator of their own (so the rest of the schedule is
//! planned as before): a charge under key `k` (its calls, and the harness's
//! retries of them, keep `k`); a wanted repeat of it, the same arguments
//! under a new key, inside the tool's window; the same key reused with
//! other arguments (a conflict, unless it comes first); and the same key
//! sent by another caller (its own operation).
//!
//! Oracle 13 (client keys):
//! - one effect per client key per caller: the processor holds at most one
//!   charge made for calls of one caller under one key;
//! - an answer with a charge carries a charge made for this caller, this
//!   key and these arguments: a new key runs, and is never answered with
//!   another key's charge;
//! - a conflict runs nothing (oracle 3 as well), and is answered only where
//!   the caller sent the key with other arguments too.

use idem_runtime::{answer::Answer, ToolError};

use super::rng::Rng;
use super::scenario::{call_plan, TENANTS};
use super::timing::Timing;
use super::world::{CallPlan, OpSpec, Receipt, Sabotage, Sim, Tool, World};

/// The keyed operations and their calls, appended to a schedule's `ops`
/// and `planned`.
pub(super) fn plan(
    seed: u64,
    t: &Timing,
    sabotage: Sabotage,
    ops: &mut Vec<OpSpec>,
    planned: &mut Vec<CallPlan>,
) {
    let mut rng = Rng::new(seed ^ 0x006b_6579_732d_3437);
    let hosts = if rng.chance(0.2) { 0 } else { rng.range(1, 2) };
    for host in 0..hosts {
        let tenant = (*rng.pick(&TENANTS)).to_owned();
        let window = *rng.pick(&t.windows);
        let amount = *rng.pick(&[500u64, 700, 1200]);
        let keyed = |subject: &str, key: String, amount: u64| OpSpec {
            tenant: tenant.clone(),
            subject: subject.to_owned(),
            tool: Tool::Charge { window },
            args: serde_json::json!({"card": "4242", "amount_cents": amount}),
            amount,
            client_key: Some(key),
        };
        let key = format!("host{host}/step-{}", rng.below(1 << 20));
        let first = ops.len();
        ops.push(keyed("alice", key.clone(), amount));
        // A wanted repeat: the same arguments, a new key.
        ops.push(keyed("alice", format!("{key}/again"), amount));
        // The key reused with other arguments.
        ops.push(keyed("alice", key.clone(), amount + 1));
        // Another caller's identical key.
        ops.push(keyed("bob", key, amount));

        let room = t.horizon.saturating_sub(window);
        let at = rng.between(std::time::Duration::ZERO, room);
        // The first charge, and its retries under the same key.
        for c in 0..rng.range(1, 3) {
            let at = at + c as u32 * rng.between(std::time::Duration::ZERO, window);
            planned.push(call_plan(&mut rng, t, sabotage, first, at, 0));
        }
        // The repeat, inside the first one's window.
        let gap = rng.between(window / 10, window / 2);
        planned.push(call_plan(&mut rng, t, sabotage, first + 1, at + gap, 0));
        for op in [first + 2, first + 3] {
            if rng.chance(0.7) {
                let at = rng.between(std::time::Duration::ZERO, t.horizon);
                planned.push(call_plan(&mut rng, t, sabotage, op, at, 0));
            }
        }
    }
}

/// Who sent which key: `(tenant, subject, key)`.
fn key_of(op: &OpSpec) -> Option<(&str, &str, &str)> {
    Some((&op.tenant, &op.subject, op.client_key.as_deref()?))
}

/// The operation a charge was made for.
fn op_of_charge(w: &World, charge: usize) -> &OpSpec {
    &w.ops[w.calls[w.runs[w.charges[charge].run].call].plan.op]
}

/// Oracle 13 on one answer of a keyed call.
pub(super) fn judge(
    sim: &Sim,
    w: &mut World,
    call: usize,
    answer: &Answer<Receipt, ToolError>,
    problems: &mut Vec<String>,
) {
    let op = &w.ops[w.calls[call].plan.op];
    let Some(this) = key_of(op) else {
        if matches!(answer, Answer::ClientKeyConflict { .. }) {
            problems.push(format!(
                "oracle 13 (client keys): a client key conflict answered a call without a key, {}",
                op.args
            ));
        }
        return;
    };
    let args = op.args.clone();
    w.stats.bump(match answer {
        Answer::Executed { .. } => "keyed calls answered executed",
        Answer::Replayed { .. } => "keyed calls answered replayed",
        Answer::InProgress { .. } => "keyed calls answered in progress",
        Answer::ClientKeyConflict { .. } => "keyed calls answered a client key conflict",
        _ => "keyed calls answered otherwise",
    });
    match answer {
        Answer::Executed { value, .. } | Answer::Replayed { value, .. } => {
            let Some((charge, _, _)) = sim.charge_by_id(w, &value.charge_id) else {
                return; // oracle 2 says so
            };
            let made_for = op_of_charge(w, charge);
            if key_of(made_for) != Some(this) || made_for.args != args {
                problems.push(format!(
                    "oracle 13 (client keys): a call of {this:?} with {args} was answered {} with {}, charged for {:?} with {}",
                    answer.name(),
                    value.charge_id,
                    key_of(made_for),
                    made_for.args
                ));
            }
        }
        Answer::ClientKeyConflict { .. } => {
            let rival = w
                .ops
                .iter()
                .any(|o| key_of(o) == Some(this) && o.args != args);
            if !rival {
                problems.push(format!(
                    "oracle 13 (client keys): a conflict answered {this:?} with {args}, a key this caller sent with no other arguments"
                ));
            }
        }
        Answer::Conflict { .. } => problems.push(format!(
            "oracle 13 (client keys): a keyed call of {this:?} was answered a business-key conflict"
        )),
        _ => {}
    }
}

/// Oracle 13 at the end: at most one charge per caller and key.
pub(super) fn final_check(sim: &Sim) {
    let mut w = sim.world();
    let mut seen: Vec<((String, String, String), String)> = Vec::new();
    let mut problems = Vec::new();
    for charge in 0..w.charges.len() {
        let Some((tenant, subject, key)) = key_of(op_of_charge(&w, charge)) else {
            continue;
        };
        let who = (tenant.to_owned(), subject.to_owned(), key.to_owned());
        let id = w.charges[charge].id.clone();
        match seen.iter().find(|(k, _)| *k == who) {
            Some((_, first)) if *first != id => problems.push(format!(
                "oracle 13 (client keys): one key, two effects: {who:?} charged {first} and {id}"
            )),
            Some(_) => {}
            None => seen.push((who, id)),
        }
    }
    if !seen.is_empty() {
        w.stats.bump("schedules with keyed charges");
    }
    for p in problems {
        sim.violation(&mut w, p);
    }
}
