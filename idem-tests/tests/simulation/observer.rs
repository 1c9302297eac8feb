//! The outermost layer of a schedule's store stack: it sees every claim
//! that won and every heartbeat that landed, per key (oracle 4).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::{
    follow_ons::FollowOns,
    key::IdempotencyKey,
    store::{
        Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore,
        Record, RecordFilter, RecordState, Resolution, StateCounts,
    },
    IdempotencyStore, Reference, StoreError,
};
use tokio::time::Instant;

use super::buggify::Point;
use super::stores::jobs_of;
use super::world::{HeartbeatRec, Sabotage, Sim, Unconfirmed};
use idem_runtime::store::{Inspect, Limits, Upkeep};

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

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for Observer<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let sent = Instant::now();
        let out = self.inner.claim(req).await;
        match out {
            Ok(Claim::Claimed { .. }) => {
                let mut w = self.sim.world();
                w.claims_sent
                    .entry(*req.key.as_bytes())
                    .or_default()
                    .push(sent);
            }
            // Its caller is told nothing ran, though the claim may have
            // landed or land later (oracle 12).
            Err(ref e) => {
                {
                    let mut w = self.sim.world();
                    self.sim.log(&mut w, || {
                        format!(
                            "claim {} attempt {} sent at {:?} lease {:?} failed: {e}",
                            req.reference,
                            req.attempt.get(),
                            sent - self.sim.t0,
                            req.lease
                        )
                    });
                }
                self.sim.world().unconfirmed.insert(
                    req.reference,
                    Unconfirmed {
                        key: *req.key.as_bytes(),
                        attempt: req.attempt.get(),
                        sent,
                    },
                );
            }
            Ok(Claim::Existing { .. }) => {}
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
        // Oracle 12's excuse: a release that failed or was slow (or is
        // still on its way) could not retract a claim that landed.
        let id = (*key.as_bytes(), attempt.get());
        let sent = Instant::now();
        self.sim
            .world()
            .releases
            .entry(id)
            .or_default()
            .push((sent, None));
        let out = self.inner.release(key, attempt).await;
        let ok = !matches!(out, Err(StoreError::Unavailable(_)));
        {
            let mut w = self.sim.world();
            self.sim.log(&mut w, || {
                format!(
                    "release {} attempt {} sent at {:?}: {out:?}",
                    key,
                    attempt.get(),
                    sent - self.sim.t0
                )
            });
        }
        if let Some(rec) = self
            .sim
            .world()
            .releases
            .get_mut(&id)
            .and_then(|v| v.iter_mut().rev().find(|(s, _)| *s == sent))
        {
            rec.1 = Some((Instant::now(), ok));
        }
        out
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.inner.mark_unknown(key, attempt, note).await
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
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> Upkeep for Observer<S> {
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
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.inner.defer_check(key, attempt, delay, taken).await
    }
    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let taken = self.inner.take_check(key, attempt, hold).await;
        if self.sim.sabotage == Sabotage::EveryReplicaAsks {
            // Asks whether or not the check was due; a check not taken has
            // no hold's end to answer, so its deferral is held back.
            return taken.map(|t| Some(t.unwrap_or(SystemTime::UNIX_EPOCH)));
        }
        taken
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
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore> Inspect for Observer<S> {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.inner.list_records(filter).await
    }
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        self.inner.find_by_reference(reference).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_records().await
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
    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        jobs_of(&self.inner)
            .lease_follow_ons(names, limit, lease, token)
            .await
    }
    async fn finish_follow_on(&self, id: &FollowOnId, token: Attempt) -> Result<(), StoreError> {
        jobs_of(&self.inner).finish_follow_on(id, token).await
    }
    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&self.inner)
            .retry_follow_on(id, token, delay, error)
            .await
    }
    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        token: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&self.inner).bury_follow_on(id, token, error).await
    }
    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        jobs_of(&self.inner).list_follow_ons(filter).await
    }
    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        jobs_of(&self.inner).redrive_follow_on(id).await
    }
    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        jobs_of(&self.inner).count_due_follow_ons().await
    }
}
