//! The follow-on dispatcher in the simulation: the charge and ship handlers (and the
//! reconciler, when it finds a charge) declare a follow-on with the
//! completion; a dispatcher on each replica leases due jobs and runs them
//! against a mailer that, like a real one, deduplicates by the downstream
//! key for a day, fails now and then, and sometimes acts and loses its
//! answer (the job then runs again, and the mailer drops the repeat).
//!
//! Oracle 9: every follow-on a completion wrote is delivered exactly
//! once at the mailer, with its own payload under its own downstream key; a
//! job of one operation never carries, or is dropped as, another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    follow_ons::{
        follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlerError, FollowOnHandlers,
        FollowOnRun,
    },
    store::{FollowOnFilter, FollowOnState},
    IdempotencyStore,
};
use tokio::time::Instant;

use super::buggify::Point;
use super::world::{MailRec, Receipt, Sim};

/// The follow-on a tool declares after its side effect, if any.
pub fn job_name(tool: &str) -> Option<&'static str> {
    match tool {
        "charge" => Some("send_receipt"),
        "ship" => Some("notify_warehouse"),
        _ => None,
    }
}

/// The dispatchers' settings: a run may take `job_timeout`, the lease is
/// twice that, and a failing job comes back within seconds; so many
/// attempts that no job reaches the dead letter while the faults last.
pub fn config(sim: &Sim) -> FollowOnConfig {
    let t = &sim.timing;
    FollowOnConfig::default()
        .with_interval(t.dispatch_every)
        .with_batch(8)
        .with_timeout(t.job_timeout)
        .with_max_runs(1_000)
        .with_first_backoff(t.job_timeout / 4)
        .with_max_backoff(t.job_timeout * 2)
}

/// The handlers of both job names: the mailer.
pub fn handlers(sim: &Arc<Sim>) -> FollowOnHandlers {
    let mut handlers = FollowOnHandlers::new();
    for name in ["send_receipt", "notify_warehouse"] {
        let sim = sim.clone();
        handlers = handlers.on(
            name,
            follow_on_fn(move |job: FollowOnRun| {
                let sim = sim.clone();
                async move { mail(&sim, &job).await }
            }),
        );
    }
    handlers
}

/// The mailer: acts on a job's request unless it acted on its downstream
/// key within the day, and answers after a latency (which BUGGIFY may
/// stretch past the run's timeout).
async fn mail(sim: &Arc<Sim>, job: &FollowOnRun) -> Result<(), FollowOnHandlerError> {
    let (latency, fail, lose, late) = {
        let w = sim.world();
        let mut rng = sim.rng();
        let t = &sim.timing;
        let latency = rng.between(t.mailer_latency.0, t.mailer_latency.1);
        let faults = w.faults_on;
        let fail = faults && rng.chance(0.1);
        let lose = faults && rng.chance(0.1);
        drop(rng);
        let late = faults && {
            let mut b = sim.buggify();
            b.fires(Point::Mailer)
                .then(|| b.between(Duration::ZERO, t.job_timeout * 2))
        }
        .is_some();
        (latency, fail, lose, late)
    };
    if fail {
        tokio::time::sleep(latency).await;
        return Err("the mailer is unavailable".into());
    }
    tokio::time::sleep(latency / 2).await;
    deliver(sim, job);
    let rest = if late {
        sim.world().stats.bump(Point::Mailer.name());
        sim.timing.job_timeout * 2
    } else {
        latency - latency / 2
    };
    tokio::time::sleep(rest).await;
    if lose {
        return Err("the mailer's answer was lost".into());
    }
    Ok(())
}

/// The mailer acts (or drops a repeat), and oracle 9 checks the request
/// against the jobs the store was given.
fn deliver(sim: &Sim, job: &FollowOnRun) {
    let mut w = sim.world();
    let now = Instant::now();
    let key = job.downstream_key.clone();
    let mut problems = Vec::new();
    let expected = w
        .jobs
        .iter()
        .find(|j| j.tenant == job.tenant && j.reference == job.reference && j.name == job.name);
    match expected {
        None => problems.push(format!(
            "the mailer got job {key} of tenant {}, which no completion wrote under this reference",
            job.tenant
        )),
        Some(j) if j.payload != job.payload => problems.push(format!(
            "job {key} carries {}, its operation's completion wrote {}",
            job.payload, j.payload
        )),
        Some(j) if j.downstream_key() != key => problems.push(format!(
            "job {key}'s downstream key is not its operation's ({})",
            j.downstream_key()
        )),
        Some(_) => {}
    }
    if let Ok(receipt) = serde_json::from_str::<Receipt>(&job.payload) {
        if receipt.reference != job.reference.to_string() {
            problems.push(format!(
                "job {key} carries the receipt of operation {}",
                receipt.reference
            ));
        }
    }
    let keeps = sim.timing.processor_keeps_keys;
    let acted = match w.mailer.get_mut(&key) {
        Some(m) if now.duration_since(m.since) < keeps => {
            if m.payload != job.payload {
                problems.push(format!(
                    "the mailer dropped job {key} with {} as a repeat of {}",
                    job.payload, m.payload
                ));
            }
            false
        }
        Some(m) => {
            m.since = now;
            m.payload = job.payload.clone();
            m.effects += 1;
            true
        }
        None => {
            w.mailer.insert(
                key.clone(),
                MailRec {
                    since: now,
                    payload: job.payload.clone(),
                    effects: 1,
                },
            );
            true
        }
    };
    w.stats.bump(if acted {
        "mailer: delivered"
    } else {
        "mailer: repeat dropped"
    });
    sim.log(&mut w, || {
        format!(
            "mailer: {key} run {} {}",
            job.run,
            if acted { "delivered" } else { "dropped" }
        )
    });
    for p in problems {
        sim.violation(&mut w, format!("oracle 9 (follow-ons): {p}"));
    }
}

/// One replica's dispatcher: a round every `dispatch_every` (plus jitter)
/// until `stop`; nothing while its replica is dead.
pub async fn dispatch(
    sim: Arc<Sim>,
    store: Arc<dyn IdempotencyStore>,
    replica: usize,
    stop: Arc<AtomicBool>,
) {
    let handlers = handlers(&sim);
    let config = config(&sim);
    loop {
        let pause =
            sim.timing.dispatch_every + sim.rng().between(Duration::ZERO, sim.timing.jitter);
        tokio::time::sleep(pause).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if sim.world().dead.get(replica).copied().unwrap_or(false) {
            continue;
        }
        let report = FollowOnDispatcher::round(&*store, &handlers, &config).await;
        let mut w = sim.world();
        match report {
            Ok(r) if r.leased > 0 => w.stats.bump("outbox rounds with jobs"),
            Ok(_) => {}
            Err(_) => w.stats.bump("outbox round failed"),
        }
    }
}

/// Waits, with the faults off, until the store holds no job left to run
/// (each was delivered and finished), at most `limit`; false if some are
/// left.
pub async fn drained(sim: &Sim, limit: Duration) -> bool {
    let Some(jobs) = sim.inner.follow_ons() else {
        return true;
    };
    let until = Instant::now() + limit;
    loop {
        let left = FollowOnFilter {
            states: vec![
                FollowOnState::Waiting,
                FollowOnState::Running,
                FollowOnState::Dead,
            ],
            ..FollowOnFilter::default()
        };
        match jobs.list_follow_ons(&left).await {
            Ok(left) if left.is_empty() => return true,
            _ if Instant::now() >= until => return false,
            _ => tokio::time::sleep(sim.timing.dispatch_every).await,
        }
    }
}

/// Oracle 9 at the end: every job written was delivered exactly once.
pub fn final_check(sim: &Sim) {
    let mut w = sim.world();
    let mut problems = Vec::new();
    for j in &w.jobs {
        let key = j.downstream_key();
        match w.mailer.get(&key) {
            None => problems.push(format!(
                "job {key} (instance {} of its operation) was never delivered",
                j.epoch
            )),
            Some(m) if m.payload != j.payload => problems.push(format!(
                "job {key} was delivered with {}, not its own {}",
                m.payload, j.payload
            )),
            Some(m) if m.effects != 1 => {
                problems.push(format!("job {key} was delivered {} times", m.effects))
            }
            Some(_) => {}
        }
    }
    let written: std::collections::BTreeSet<String> =
        w.jobs.iter().map(|j| j.downstream_key()).collect();
    if written.len() != w.jobs.len() {
        problems.push("two completions wrote jobs under one downstream key".to_owned());
    }
    for p in problems {
        sim.violation(&mut w, format!("oracle 9 (follow-ons): {p}"));
    }
}
