//! The store stack of a schedule:
//!
//! ```text
//! Executor, maintenance, operator
//!   → Observer      sees every won claim and every heartbeat, per key (oracle 4)
//!   → FaultyStore   delays, unreachable, answer lost; heartbeat outages
//!   → Recorder      sees every write that took effect: the model of each record
//!   → the store under test
//! ```
//!
//! One job, over 700 lines: the stack of wrappers and the model they keep.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::store::conformance::{Call, Fault};
use idem_runtime::{
    outbox::{FollowOn, FollowOns},
    store::{
        Attempt, Claim, ClaimRequest, FollowOnStore, Job, JobFilter, JobId, Record, RecordFilter,
        RecordState, Resolution, StateCounts,
    },
    IdempotencyKey, IdempotencyStore, Reference, StoreError,
};
use tokio::time::Instant;

use super::buggify::Point;
use super::timing::Mode;
use super::world::{HeartbeatRec, JobRec, KeyModel, Receipt, ResolutionRec, Sim, Tool};

/// The fault plan of one replica's connection to the store: only while
/// faults are on, drawn from the schedule's generator; nothing gets through
/// once the replica died or while the store is down.
pub fn plan(sim: Arc<Sim>, replica: usize) -> impl Fn(Call) -> Fault + Send + Sync + 'static {
    move |call| {
        let (on, outage, store_outage, dead) = {
            let w = sim.world();
            (
                w.faults_on,
                w.outage,
                w.store_outage,
                w.dead.get(replica).copied().unwrap_or(false),
            )
        };
        if dead {
            return Fault::Unreachable;
        }
        if !on {
            return Fault::None;
        }
        let now = Instant::now();
        let within = |period: Option<(Instant, Instant)>| {
            period.is_some_and(|(from, to)| now >= from && now < to)
        };
        if within(store_outage) || (call == Call::Heartbeat && within(outage)) {
            return Fault::Unreachable;
        }
        // BUGGIFY first, from its own generator (so with it off the
        // schedule draws what it always drew).
        let buggified = sim.buggify().fault(call, &sim.timing);
        if let Some((point, fault)) = buggified {
            sim.world().stats.bump(point.name());
            return fault;
        }
        let mut rng = sim.rng();
        match rng.below(1000) {
            0..=29 => Fault::Unreachable,
            30..=49 => Fault::AnswerLost,
            50..=149 => {
                Fault::Delay(rng.between(Duration::from_millis(1), sim.timing.store_delay_max))
            }
            _ => Fault::None,
        }
    }
}

/// Outermost: records when each claim that won and each heartbeat that
/// landed was sent, per key.
#[derive(Debug)]
pub struct Observer<S> {
    pub inner: S,
    pub sim: Arc<Sim>,
    /// The recording store under the faults: a heartbeat BUGGIFY sends on
    /// its own (`HeartbeatDetached`) lands there even after its caller
    /// gave up, as a request already on the wire does.
    pub wire: Arc<dyn IdempotencyStore>,
}

/// Innermost: every write runs one at a time, in real time on a task of its
/// own (so a dropped call cannot cut the bookkeeping off from a write that
/// took effect), and the record after it is kept as the model.
#[derive(Debug)]
pub struct Recorder {
    pub inner: Arc<dyn IdempotencyStore>,
    pub sim: Arc<Sim>,
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

fn expired(r: &Record, now: SystemTime, slack: Duration) -> bool {
    // `now + slack`: the judgement leans towards "expired", so clock grain
    // in real time never makes a legitimate takeover look wrong.
    let now = now + slack;
    match r.state {
        RecordState::Completed { .. } => r.expires_at <= now,
        _ => r.retain_until <= now && r.lease_until <= now,
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
enum Write {
    Complete,
    Release,
    MarkUnknown,
    MarkLapsed,
    Resolve {
        not_performed: bool,
        settle: Duration,
    },
    Defer,
    Heartbeat,
}

impl Recorder {
    pub fn new(inner: Arc<dyn IdempotencyStore>, sim: Arc<Sim>) -> Self {
        Recorder {
            inner,
            sim,
            lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Runs `work` (a write) on its own task, holding the write lock, then
    /// `after` with its result.
    async fn write<T, F, Fut>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn IdempotencyStore>, Arc<Sim>) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let lock = self.lock.clone();
        let fut = work(self.inner.clone(), self.sim.clone());
        let write = async move {
            let _held = lock.lock().await;
            fut.await
        };
        if self.sim.timing.mode == Mode::Paused {
            // MemoryStore's writes finish in the poll that starts them, so
            // a dropped call cannot cut one off.
            return write.await;
        }
        let task = tokio::spawn(write);
        match task.await {
            Ok(out) => out,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

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
    async fn wrote(
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
    async fn wrote_with_jobs(
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
        let mut w = sim.world();
        let tol = sim.timing.tolerance;
        let epoch;
        let before;
        {
            let Some(m) = w.keys.get_mut(key.as_bytes()) else {
                return;
            };
            epoch = m.epoch;
            before = m.snapshot.take();
            m.snapshot = after.clone();
            if matches!(what, Write::Release) {
                m.released = true;
            }
        }
        let reference = key;
        let mut problems = Vec::new();
        match (&after, what) {
            (None, Write::Release) => {}
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
            (Some(r), Write::MarkUnknown | Write::MarkLapsed)
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
        if let (Some(r), false) = (&after, jobs.is_empty()) {
            if matches!(r.state, RecordState::Completed { .. }) && r.attempt == attempt {
                for job in jobs {
                    w.jobs.push(JobRec {
                        tenant: r.tenant.clone(),
                        reference: r.reference,
                        name: job.name().to_owned(),
                        payload: job.payload().to_owned(),
                        epoch,
                    });
                    w.stats.bump("follow-on jobs written");
                }
            }
        }
        if let (Some(r), Write::MarkLapsed, Some(b)) = (&after, what, &before) {
            if b.lease_until > r.updated_at + tol {
                problems.push("the sweep marked a record whose lease had not run out".to_owned());
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

    async fn claimed(
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
        let retention = t.retention.max(req.window);
        if req.retention != retention {
            problems.push(format!(
                "the executor claimed with retention {:?}, not {retention:?}",
                req.retention
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
            Some(prev) if expired(prev, now, tol) => true,
            // Within its window a NOT_PERFORMED operation is tried again;
            // after it, the claim is a new operation
            // (`Record::takeover_reference`).
            Some(prev) if matches!(prev.state, RecordState::NotPerformed { .. }) => {
                prev.expires_at <= now
            }
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

    fn existing(sim: &Sim, req: &ClaimRequest, found: &Record) {
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

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl IdempotencyStore for Recorder {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let req = req.clone();
        self.write(|inner, sim| async move {
            // No later than the store's own reading of its clock.
            let sent = (sim.clock)();
            let out = inner.claim(&req).await;
            match &out {
                Ok(Claim::Claimed { reference }) => {
                    Self::claimed(&*inner, &sim, &req, *reference, sent).await
                }
                Ok(Claim::Existing { record }) => Self::existing(&sim, &req, record),
                Err(_) => {}
            }
            out
        })
        .await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        let (key, response) = (*key, response.to_owned());
        self.write(|inner, sim| async move {
            let out = inner.complete(&key, attempt, &response).await;
            if out.is_ok() {
                Self::wrote(&*inner, &sim, &key, attempt, Write::Complete).await;
            }
            out
        })
        .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = *key;
        self.write(|inner, sim| async move {
            let out = inner.release(&key, attempt).await;
            if out.is_ok() {
                Self::wrote(&*inner, &sim, &key, attempt, Write::Release).await;
            }
            out
        })
        .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let (key, note) = (*key, note.to_owned());
        self.write(|inner, sim| async move {
            let out = inner.mark_unknown(&key, attempt, &note).await;
            if out.is_ok() {
                Self::wrote(&*inner, &sim, &key, attempt, Write::MarkUnknown).await;
            }
            out
        })
        .await
    }

    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let (key, note) = (*key, note.to_owned());
        self.write(|inner, sim| async move {
            let out = inner.mark_lapsed(&key, attempt, &note).await;
            if matches!(out, Ok(true)) {
                Self::wrote(&*inner, &sim, &key, attempt, Write::MarkLapsed).await;
            }
            out
        })
        .await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let key = *key;
        let note = note.map(str::to_owned);
        let (response, np_note, settle) = match resolution {
            Resolution::Completed { response } => {
                (Some(response.to_owned()), String::new(), Duration::ZERO)
            }
            Resolution::NotPerformed { note, settle } => (None, note.to_owned(), settle),
        };
        self.write(|inner, sim| async move {
            let resolution = match &response {
                Some(response) => Resolution::Completed { response },
                None => Resolution::NotPerformed {
                    note: &np_note,
                    settle,
                },
            };
            let out = inner
                .resolve(&key, attempt, resolution, note.as_deref())
                .await;
            if out.is_ok() {
                let what = Write::Resolve {
                    not_performed: response.is_none(),
                    settle,
                };
                Self::wrote(&*inner, &sim, &key, attempt, what).await;
                if response.is_none() {
                    sim.check_not_performed(*key.as_bytes());
                }
            }
            out
        })
        .await
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        let key = *key;
        self.write(|inner, sim| async move {
            let out = inner.defer_check(&key, attempt, delay).await;
            if out.is_ok() {
                Self::wrote(&*inner, &sim, &key, attempt, Write::Defer).await;
            }
            out
        })
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = *key;
        self.write(|inner, sim| async move {
            let out = inner.heartbeat(&key, attempt, lease).await;
            if out.is_ok() {
                Self::wrote(&*inner, &sim, &key, attempt, Write::Heartbeat).await;
            }
            out
        })
        .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.lookup(tenant, reference).await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.write(|inner, sim| async move {
            let out = inner.purge_expired(batch).await;
            if let Ok(n) = out {
                let mut w = sim.world();
                for _ in 0..n {
                    w.stats.bump("purged");
                }
            }
            out
        })
        .await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_lapsed(limit).await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_unknown(limit).await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.inner.list_records(filter).await
    }
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        self.inner.find_by_reference(reference).await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_records().await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        // Completions with jobs are recorded as completions are.
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }
    fn max_response_bytes(&self) -> Option<usize> {
        self.inner.max_response_bytes()
    }
}

/// The inner store's jobs: only reached once `follow_ons()` said there are
/// some.
fn jobs_of(store: &dyn IdempotencyStore) -> &dyn FollowOnStore {
    store
        .follow_ons()
        .expect("follow_ons() is Some only when the inner store keeps jobs")
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl FollowOnStore for Recorder {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let (key, response, jobs) = (*key, response.to_owned(), jobs.to_vec());
        self.write(|inner, sim| async move {
            let out = jobs_of(&*inner)
                .complete_with_follow_ons(
                    &key,
                    attempt,
                    &response,
                    idem_runtime::store::FollowOns::new(&jobs).unwrap(),
                )
                .await;
            if out.is_ok() {
                Self::wrote_with_jobs(&*inner, &sim, &key, attempt, Write::Complete, &jobs).await;
            }
            out
        })
        .await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            let completed = Resolution::Completed { response };
            return self.resolve(key, attempt, completed, note).await;
        }
        let (key, response, jobs) = (*key, response.to_owned(), jobs.to_vec());
        let note = note.map(str::to_owned);
        self.write(|inner, sim| async move {
            let out = jobs_of(&*inner)
                .resolve_with_follow_ons(
                    &key,
                    attempt,
                    &response,
                    note.as_deref(),
                    idem_runtime::store::FollowOns::new(&jobs).unwrap(),
                )
                .await;
            if out.is_ok() {
                let what = Write::Resolve {
                    not_performed: false,
                    settle: Duration::ZERO,
                };
                Self::wrote_with_jobs(&*inner, &sim, &key, attempt, what, &jobs).await;
            }
            out
        })
        .await
    }

    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<Job>, StoreError> {
        // Under the write lock: a job is leased only once the completion
        // that wrote it has been recorded (in real time a dispatcher could
        // otherwise deliver it before the bookkeeping knew of it).
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        self.write(|inner, _| async move {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            jobs_of(&*inner)
                .lease_jobs(&names, limit, lease, token)
                .await
        })
        .await
    }

    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        jobs_of(&*self.inner).finish_job(id, token).await
    }

    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&*self.inner)
            .retry_job(id, token, delay, error)
            .await
    }

    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        jobs_of(&*self.inner).bury_job(id, token, error).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        jobs_of(&*self.inner).list_jobs(filter).await
    }

    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        jobs_of(&*self.inner).redrive_job(id).await
    }

    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        jobs_of(&*self.inner).count_due_jobs().await
    }

    fn max_follow_ons_per_completion(&self) -> Option<usize> {
        jobs_of(&*self.inner).max_follow_ons_per_completion()
    }
    fn max_follow_on_bytes_per_completion(&self) -> Option<usize> {
        jobs_of(&*self.inner).max_follow_on_bytes_per_completion()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for Observer<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let sent = Instant::now();
        let out = self.inner.claim(req).await;
        if let Ok(Claim::Claimed { .. }) = out {
            let mut w = self.sim.world();
            w.claims_sent
                .entry(*req.key.as_bytes())
                .or_default()
                .push(sent);
        }
        out
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.inner.complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.inner.release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.inner.mark_unknown(key, attempt, note).await
    }
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.inner.mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
    ) -> Result<(), StoreError> {
        self.inner.defer_check(key, attempt, delay).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let sent = Instant::now();
        let index = {
            let mut w = self.sim.world();
            let lease_until = w
                .keys
                .get(key.as_bytes())
                .and_then(|m| m.snapshot.as_ref())
                .filter(|r| r.attempt == attempt && r.state == RecordState::InProgress)
                .map(|r| r.lease_until);
            self.sim
                .check_heartbeat_send(&mut w, key.as_bytes(), attempt, lease_until);
            let sent = w.hb_sent.entry(*key.as_bytes()).or_default();
            sent.push(HeartbeatRec {
                attempt,
                lease_until,
                landed: None,
            });
            sent.len() - 1
        };
        let detached = {
            let mut b = self.sim.buggify();
            b.fires(Point::HeartbeatDetached)
                .then(|| b.between(lease / 3, lease * 3))
        };
        let out = match detached {
            None => self.inner.heartbeat(key, attempt, lease).await,
            Some(delay) => {
                self.sim.world().stats.bump(Point::HeartbeatDetached.name());
                let (wire, key) = (self.wire.clone(), *key);
                let on_wire = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    wire.heartbeat(&key, attempt, lease).await
                });
                match on_wire.await {
                    Ok(out) => out,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
        };
        let now = Instant::now();
        let landed = (self.sim.clock)();
        let mut w = self.sim.world();
        if let Some(h) = w
            .hb_sent
            .get_mut(key.as_bytes())
            .and_then(|sent| sent.get_mut(index))
        {
            h.landed = Some(landed);
        }
        match &out {
            Ok(()) => w
                .hb_landed
                .entry(*key.as_bytes())
                .or_default()
                .push((sent, now)),
            Err(StoreError::Unavailable(_)) => {
                w.hb_failures.entry(*key.as_bytes()).or_default().push(now);
                w.stats.bump("heartbeat failed");
            }
            // Fenced or finished: the handler is not the owner any more.
            Err(_) => {}
        }
        out
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.lookup(tenant, reference).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_unknown(limit).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.inner.list_records(filter).await
    }
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        self.inner.find_by_reference(reference).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_records().await
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }
    fn max_response_bytes(&self) -> Option<usize> {
        self.inner.max_response_bytes()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> FollowOnStore for Observer<S> {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        jobs_of(&self.inner)
            .complete_with_follow_ons(key, attempt, response, jobs)
            .await
    }
    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        jobs_of(&self.inner)
            .resolve_with_follow_ons(key, attempt, response, note, jobs)
            .await
    }
    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<Job>, StoreError> {
        jobs_of(&self.inner)
            .lease_jobs(names, limit, lease, token)
            .await
    }
    async fn finish_job(&self, id: &JobId, token: Attempt) -> Result<(), StoreError> {
        jobs_of(&self.inner).finish_job(id, token).await
    }
    async fn retry_job(
        &self,
        id: &JobId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&self.inner)
            .retry_job(id, token, delay, error)
            .await
    }
    async fn bury_job(&self, id: &JobId, token: Attempt, error: &str) -> Result<(), StoreError> {
        jobs_of(&self.inner).bury_job(id, token, error).await
    }
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        jobs_of(&self.inner).list_jobs(filter).await
    }
    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        jobs_of(&self.inner).redrive_job(id).await
    }
    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        jobs_of(&self.inner).count_due_jobs().await
    }

    fn max_follow_ons_per_completion(&self) -> Option<usize> {
        jobs_of(&self.inner).max_follow_ons_per_completion()
    }
    fn max_follow_on_bytes_per_completion(&self) -> Option<usize> {
        jobs_of(&self.inner).max_follow_on_bytes_per_completion()
    }
}
