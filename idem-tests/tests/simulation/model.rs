//! The model of each record the recorder keeps: every write that took
//! effect is checked against the transitions a record may make (a claim
//! takes over only an expired or NOT_PERFORMED record, a sweep marks only a
//! lapsed lease, NOT_PERFORMED only after the settle period).

use std::time::{Duration, SystemTime};

use idem_runtime::{
    follow_ons::FollowOn,
    key::IdempotencyKey,
    store::{Attempt, ClaimRequest, Record, RecordState},
    IdempotencyStore, Reference,
};

use super::recorder::Recorder;
use super::world::{JobRec, KeyModel, Receipt, ResolutionRec, Sim, Tool};

fn expired(r: &Record, now: SystemTime, slack: Duration) -> bool {
    // `now + slack`: the judgement leans towards "expired", so clock grain
    // in real time never makes a legitimate takeover look wrong.
    let now = now + slack;
    match r.state {
        RecordState::Completed { .. } => r.expires_at <= now,
        _ => r.retain_until <= now && r.lease_until <= now,
    }
}

/// Whether a record last read as `before` is past its life at `now` once
/// `what` took effect on it (`Record::is_expired`): its retention ended,
/// and its lease too unless the write settled it. A heartbeat's new lease
/// is not known here: it is never past its life after one.
fn past_life(before: Option<&Record>, what: Write, now: SystemTime) -> bool {
    let Some(b) = before else {
        return false;
    };
    match what {
        Write::Heartbeat => false,
        Write::Complete | Write::Resolve { .. } => b.retain_until <= now,
        _ => b.retain_until <= now && b.lease_until <= now,
    }
}

fn claimable(r: &Record, now: SystemTime) -> bool {
    matches!(r.state, RecordState::NotPerformed { .. })
        || match r.state {
            RecordState::Completed { .. } => r.expires_at <= now,
            _ => r.retain_until <= now && r.lease_until <= now,
        }
}

fn close(a: SystemTime, b: SystemTime, tolerance: Duration) -> bool {
    let d = if a > b {
        a.duration_since(b)
    } else {
        b.duration_since(a)
    };
    d.unwrap_or_default() <= tolerance
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    Complete,
    Release,
    MarkUnknown,
    MarkLapsed,
    Resolve {
        not_performed: bool,
        settle: Duration,
    },
    Defer,
    TakeCheck,
    Heartbeat,
}

impl Recorder {
    /// The tenant of the record of `key`, and the reference of its current
    /// operation.
    fn tenant_of(sim: &Sim, key: &IdempotencyKey) -> Option<(String, Reference)> {
        sim.world()
            .keys
            .get(key.as_bytes())
            .map(|m| (m.tenant.clone(), m.reference))
    }

    /// After a write that took effect: read the record back, check the
    /// transition, keep it as the model.
    pub(super) async fn wrote(
        inner: &dyn IdempotencyStore,
        sim: &Sim,
        key: &IdempotencyKey,
        attempt: Attempt,
        what: Write,
    ) {
        Self::wrote_with_jobs(inner, sim, key, attempt, what, &[]).await
    }

    /// [`Recorder::wrote`] for a completion or resolution that wrote
    /// `jobs` with it: they are the mailer's to get (oracle 9).
    pub(super) async fn wrote_with_jobs(
        inner: &dyn IdempotencyStore,
        sim: &Sim,
        key: &IdempotencyKey,
        attempt: Attempt,
        what: Write,
        jobs: &[FollowOn],
    ) {
        let Some((tenant, current)) = Self::tenant_of(sim, key) else {
            sim.violate(format!(
                "the store accepted {what:?} on {} that was never claimed",
                key
            ));
            return;
        };
        let after = if matches!(what, Write::Release) {
            None
        } else {
            match inner.lookup(&tenant, &current).await {
                Ok(r) => r,
                Err(e) => {
                    sim.violate(format!("read-back after {what:?} failed: {e}"));
                    return;
                }
            }
        };
        let read_at = (sim.clock)();
        let mut w = sim.world();
        let tol = sim.timing.tolerance;
        let epoch;
        let before;
        // A store may read a record past its life as gone before the purge
        // deletes it (DynamoDB does: its TTL may delete it any time), so a
        // write that took effect as its retention ended can read back gone;
        // its jobs were written all the same.
        let gone_past_life;
        {
            let Some(m) = w.keys.get_mut(key.as_bytes()) else {
                return;
            };
            epoch = m.epoch;
            before = m.snapshot.take();
            gone_past_life = after.is_none()
                && !matches!(what, Write::Release)
                && past_life(before.as_ref(), what, read_at + tol);
            // Such a record keeps what the model knew of it (its retention,
            // its lease), for the writes that still land on it until the
            // purge deletes it.
            m.snapshot = if gone_past_life {
                before.clone()
            } else {
                after.clone()
            };
            if matches!(what, Write::Release) {
                m.released = true;
            }
        }
        let reference = key;
        let mut problems = Vec::new();
        match (&after, what) {
            (None, Write::Release) => {}
            (None, _) if gone_past_life => {}
            (None, _) => problems.push(format!(
                "{what:?} took effect, and then the record was gone"
            )),
            (Some(r), _) if r.attempt != attempt => problems.push(format!(
                "{what:?} by attempt {attempt:?} took effect on a record of attempt {:?}",
                r.attempt
            )),
            (Some(r), Write::Complete) if !matches!(r.state, RecordState::Completed { .. }) => {
                problems.push(format!("complete left the record {}", r.state.name()))
            }
            (Some(r), Write::MarkUnknown | Write::MarkLapsed | Write::TakeCheck)
                if !matches!(r.state, RecordState::Unknown { .. }) =>
            {
                problems.push(format!("{what:?} left the record {}", r.state.name()))
            }
            (
                Some(r),
                Write::Resolve {
                    not_performed,
                    settle,
                },
            ) => {
                let ok = if not_performed {
                    matches!(r.state, RecordState::NotPerformed { .. })
                } else {
                    matches!(r.state, RecordState::Completed { .. })
                };
                if !ok {
                    problems.push(format!("resolve left the record {}", r.state.name()));
                }
                if not_performed {
                    if let Some(b) = &before {
                        if b.updated_at + settle > r.updated_at + tol {
                            problems.push(format!(
                                "NOT_PERFORMED accepted {:?} after the last change, before its settle period of {settle:?}",
                                r.updated_at.duration_since(b.updated_at).unwrap_or_default()
                            ));
                        }
                    }
                }
                let runs_before = w.runs.len();
                w.resolutions.push(ResolutionRec {
                    key: *key.as_bytes(),
                    epoch,
                    not_performed,
                    runs_before,
                });
                w.stats.bump(if not_performed {
                    "resolved not performed"
                } else {
                    "resolved completed"
                });
            }
            (Some(r), Write::MarkLapsed) => {
                let _ = r;
            }
            _ => {}
        }
        // Oracle 8: the charge an instance is COMPLETED with is its own.
        if let (Some(r), Write::Complete | Write::Resolve { .. }) = (&after, what) {
            if let RecordState::Completed { response } = &r.state {
                if let Ok(receipt) = serde_json::from_str::<Receipt>(response) {
                    let how = if matches!(what, Write::Complete) {
                        "completed by its handler"
                    } else {
                        "resolved COMPLETED"
                    };
                    sim.credit(&mut w, &receipt.charge_id, *key.as_bytes(), epoch, how);
                }
            }
        }
        let wrote_jobs = match &after {
            Some(r) => matches!(r.state, RecordState::Completed { .. }) && r.attempt == attempt,
            None => gone_past_life,
        };
        if wrote_jobs {
            for job in jobs {
                w.jobs.push(JobRec {
                    tenant: tenant.clone(),
                    reference: current,
                    name: job.name().to_owned(),
                    payload: job.payload().to_owned(),
                    epoch,
                });
                w.stats.bump("follow-ons written");
            }
        }
        if let (Some(r), Write::MarkLapsed, Some(b)) = (&after, what, &before) {
            if b.lease_until > r.updated_at + tol {
                problems.push("the sweep marked a record whose lease had not run out".to_owned());
            }
            // Marked within the clocks' spread of the lease's end: what a
            // sweep whose clock runs ahead may do (docs/clocks.md).
            if !tol.is_zero() && r.updated_at < b.lease_until + tol {
                w.early_marks.insert((*key.as_bytes(), attempt.get()));
            }
            w.stats.bump("swept");
        }
        sim.log(&mut w, || {
            format!(
                "store: {what:?} {reference} -> {}",
                after.as_ref().map_or("deleted", |r| r.state.name())
            )
        });
        for p in problems {
            sim.violation(&mut w, format!("model ({reference}): {p}"));
        }
    }

    pub(super) async fn claimed(
        inner: &dyn IdempotencyStore,
        sim: &Sim,
        req: &ClaimRequest,
        reference: Reference,
        sent: SystemTime,
    ) {
        // No earlier than the store's own reading of its clock.
        let answered = (sim.clock)();
        let after = match inner.lookup(&req.tenant, &reference).await {
            Ok(Some(r)) => r,
            other => {
                sim.violate(format!(
                    "claim of {reference} answered Claimed, then read back {other:?}"
                ));
                return;
            }
        };
        let t = &sim.timing;
        let tol = t.tolerance;
        let now = after.claimed_at;
        let mut problems = Vec::new();
        if after.attempt != req.attempt || after.state != RecordState::InProgress {
            problems.push(format!(
                "the claimed record is {} of attempt {:?}",
                after.state.name(),
                after.attempt
            ));
        }
        if after.tenant != req.tenant || after.tool != req.tool {
            problems.push("the claimed record has another tenant or tool".to_owned());
        }
        // A client key's window (its retention, a day) outlasts the
        // executor's retention: the record is kept for the longer of the two.
        let retention = t.retention.max(req.window);
        if req.retain_for() != retention {
            problems.push(format!(
                "the executor claimed with retention {:?}, not {retention:?}",
                req.retain_for()
            ));
        }
        if !close(after.expires_at, now + req.window, tol)
            || !close(after.retain_until, now + retention, tol)
            || !close(after.lease_until, now + req.lease, tol)
        {
            problems.push(format!("the claimed record's times are off: {after:?}"));
        }
        let mut w = sim.world();
        let m = w
            .keys
            .entry(*req.key.as_bytes())
            .or_insert_with(|| KeyModel {
                tenant: req.tenant.clone(),
                tool: req.tool.clone(),
                reference,
                epoch: 0,
                snapshot: None,
                released: false,
                attempt: None,
                window_ends: answered,
            });
        let new_epoch = match &m.snapshot {
            None => !m.released,
            // Within its window a NOT_PERFORMED operation is tried again;
            // after it, the claim is a new operation
            // (`Record::takeover_reference`). Its window's end is judged
            // on the claiming replica's clock: within the clocks' spread of
            // it either is right (docs/clocks.md), and the store's answer
            // says which it was.
            Some(prev) if matches!(prev.state, RecordState::NotPerformed { .. }) => {
                if now + tol < prev.expires_at {
                    false
                } else if now >= prev.expires_at + tol {
                    true
                } else {
                    reference != prev.reference
                }
            }
            Some(prev) if expired(prev, now, tol) => true,
            Some(prev) => {
                problems.push(format!(
                    "oracle 1 (effects <= 1 per operation): a claim took over a live {} record (claimed {:?} before, expires {:?} after, retained {:?} after)",
                    prev.state.name(),
                    now.duration_since(prev.claimed_at).unwrap_or_default(),
                    prev.expires_at.duration_since(now).unwrap_or_default(),
                    prev.retain_until.duration_since(now).unwrap_or_default(),
                ));
                false
            }
        };
        if new_epoch {
            m.epoch += 1;
        }
        let (epoch, prev_state) = (m.epoch, m.snapshot.as_ref().map(|p| p.state.name()));
        m.snapshot = Some(after);
        m.released = false;
        m.attempt = Some(req.attempt);
        m.reference = reference;
        m.window_ends = answered + req.window;
        w.by_ref.insert(reference, *req.key.as_bytes());
        // Oracle 10: the reference reads until its retention ends, counted
        // from the claim (no later than the store counts it).
        let life = w
            .refs
            .entry(reference)
            .or_insert_with(|| super::references::RefLife {
                key: *req.key.as_bytes(),
                tenant: req.tenant.clone(),
                tool: req.tool.clone(),
                reads_until: sent,
            });
        life.reads_until = life.reads_until.max(sent + retention);
        if new_epoch && epoch > 1 {
            w.stats.bump("expired record taken over");
            if prev_state == Some("COMPLETED") && Tool::windowed(&req.tool) {
                w.stats.bump("new operation after a completed one's window");
            }
        }
        if prev_state == Some("NOT_PERFORMED") {
            w.stats.bump("not-performed record claimed again");
        }
        sim.log(&mut w, || {
            format!("store: claimed {reference} (instance {epoch}, over {prev_state:?})")
        });
        for p in problems {
            sim.violation(&mut w, format!("model ({reference}): {p}"));
        }
    }

    pub(super) fn existing(sim: &Sim, req: &ClaimRequest, found: &Record) {
        let reference = found.reference;
        let mut w = sim.world();
        let tol = sim.timing.tolerance;
        let problem = match w.keys.get(req.key.as_bytes()).and_then(|m| m.snapshot.as_ref()) {
            None => Some("the store answered with a record the model has not got (released or never claimed)".to_owned()),
            Some(m) if m.reference != found.reference => Some(format!(
                "the store answered with reference {}, the model's operation has {}",
                found.reference, m.reference
            )),
            Some(m) if m.attempt != found.attempt || m.state.kind() != found.state.kind() => Some(format!(
                "the store answered a {} record of {:?}, the model has {} of {:?}",
                found.state.name(),
                found.attempt,
                m.state.name(),
                m.attempt
            )),
            Some(m) if claimable(m, found.observed_at.checked_sub(tol).unwrap_or(found.observed_at)) => Some(format!(
                "a claim was refused although the {} record could be taken over",
                m.state.name()
            )),
            Some(_) => None,
        };
        if let Some(p) = problem {
            sim.violation(&mut w, format!("model ({reference}): {p}"));
        }
    }
}
