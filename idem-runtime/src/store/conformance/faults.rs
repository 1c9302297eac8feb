//! [`FaultyStore`]: a store wrapped to inject faults call by call.

use super::*;
use std::time::SystemTime;

/// A store call, as [`FaultyStore`]'s plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// [`IdempotencyStore::claim`].
    Claim,
    /// [`IdempotencyStore::complete`].
    Complete,
    /// [`IdempotencyStore::release`].
    Release,
    /// [`IdempotencyStore::mark_unknown`].
    MarkUnknown,
    /// [`Upkeep::mark_lapsed`].
    MarkLapsed,
    /// [`Upkeep::resolve`].
    Resolve,
    /// [`Upkeep::defer_check`].
    DeferCheck,
    /// [`Upkeep::take_check`].
    TakeCheck,
    /// [`IdempotencyStore::heartbeat`].
    Heartbeat,
    /// [`IdempotencyStore::lookup`].
    Lookup,
    /// [`Upkeep::purge_expired`].
    Purge,
    /// [`Upkeep::list_lapsed`].
    ListLapsed,
    /// [`Upkeep::list_unknown`].
    ListUnknown,
    /// [`Inspect::list_records`].
    ListRecords,
    /// [`Inspect::count_records`].
    CountRecords,
    /// [`FollowOnStore::complete_with_follow_ons`] (with follow-ons; with none
    /// it is [`Call::Complete`]).
    CompleteWithFollowOns,
    /// [`FollowOnStore::resolve_with_follow_ons`] (with follow-ons).
    ResolveWithFollowOns,
    /// [`FollowOnStore::lease_follow_ons`].
    LeaseJobs,
    /// [`FollowOnStore::finish_follow_on`].
    FinishJob,
    /// [`FollowOnStore::retry_follow_on`].
    RetryJob,
    /// [`FollowOnStore::bury_follow_on`].
    BuryJob,
    /// [`FollowOnStore::list_follow_ons`].
    ListJobs,
    /// [`FollowOnStore::redrive_follow_on`].
    RedriveJob,
    /// [`FollowOnStore::count_due_follow_ons`].
    CountDueJobs,
}

/// What [`FaultyStore`] does to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Pass it through.
    None,
    /// Fail with `Unavailable` before reaching the store: nothing changed.
    Unreachable,
    /// Run it, then fail with `Unavailable` anyway: the change took effect
    /// but its answer was lost (a timeout after the commit).
    AnswerLost,
    /// Wait this long, then pass it through.
    Delay(Duration),
    /// Pass it through, then wait this long before answering: the change
    /// took effect while the caller still waits (and may give up).
    SlowAnswer(Duration),
    /// Answer success without running it: a completion the store
    /// acknowledged and then lost in a crash (an asynchronous commit not yet
    /// flushed, a relaxed completion). For [`Call::Complete`] and
    /// [`Call::CompleteWithFollowOns`]; any other call is
    /// [`Fault::Unreachable`].
    WriteLost,
    /// Fail with `Unavailable` after `gave_up` (the client's timeout fired),
    /// while the store still applies the request after `lands`, both counted
    /// from the call: a server that finishes a request its client stopped
    /// waiting for (PostgreSQL's statement that waited on a lock, a Redis
    /// script already in the server's buffer, a DynamoDB request whose
    /// answer was lost). For [`Call::Claim`]; any other call is
    /// [`Fault::Unreachable`].
    LandsLate {
        /// When the caller is answered `Unavailable`.
        gave_up: Duration,
        /// When the store applies the claim.
        lands: Duration,
    },
}

/// Decides the fault of each call.
pub type FaultPlan = Arc<dyn Fn(Call) -> Fault + Send + Sync>;

/// A store that forwards to `inner`, with faults injected by a plan: the one
/// fault-injecting wrapper of the tests, the benches and the simulation.
pub struct FaultyStore<S> {
    // Shared with the claims that land after their caller gave up
    // ([`Fault::LandsLate`]).
    inner: Arc<S>,
    plan: FaultPlan,
}

impl<S> Clone for FaultyStore<S> {
    fn clone(&self) -> Self {
        FaultyStore {
            inner: self.inner.clone(),
            plan: self.plan.clone(),
        }
    }
}

impl<S> std::fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore + 'static> FaultyStore<S> {
    /// `inner` with the faults `plan` picks for each call.
    pub fn new(inner: S, plan: impl Fn(Call) -> Fault + Send + Sync + 'static) -> Self {
        FaultyStore {
            inner: Arc::new(inner),
            plan: Arc::new(plan),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn run<T>(
        &self,
        call: Call,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.run_fault((self.plan)(call), call, work).await
    }

    /// [`FaultyStore::run`] for a completion, which [`Fault::WriteLost`]
    /// acknowledges without running.
    async fn run_completion(
        &self,
        call: Call,
        work: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        match (self.plan)(call) {
            Fault::WriteLost => Ok(()),
            fault => self.run_fault(fault, call, work).await,
        }
    }

    async fn run_fault<T>(
        &self,
        fault: Fault,
        call: Call,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match fault {
            Fault::None => work.await,
            Fault::Unreachable | Fault::WriteLost | Fault::LandsLate { .. } => Err(
                StoreError::Unavailable(format!("injected: {call:?} did not reach the store")),
            ),
            Fault::AnswerLost => {
                let _ = work.await;
                Err(StoreError::Unavailable(format!(
                    "injected: the answer to {call:?} was lost after it took effect"
                )))
            }
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                work.await
            }
            Fault::SlowAnswer(d) => {
                let out = work.await;
                tokio::time::sleep(d).await;
                out
            }
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore + 'static> IdempotencyStore for FaultyStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        match (self.plan)(Call::Claim) {
            Fault::LandsLate { gave_up, lands } => {
                let (inner, req) = (self.inner.clone(), req.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(lands).await;
                    let _ = inner.claim(&req).await;
                });
                tokio::time::sleep(gave_up).await;
                Err(StoreError::Unavailable(
                    "injected: the claim was given up on; the store applies it later".into(),
                ))
            }
            fault => {
                self.run_fault(fault, Call::Claim, self.inner.claim(req))
                    .await
            }
        }
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.run_completion(Call::Complete, self.inner.complete(key, attempt, response))
            .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.run(Call::Release, self.inner.release(key, attempt))
            .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.run(
            Call::MarkUnknown,
            self.inner.mark_unknown(key, attempt, note),
        )
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.run(Call::Heartbeat, self.inner.heartbeat(key, attempt, lease))
            .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.run(Call::Lookup, self.inner.lookup(tenant, reference))
            .await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        // Faults reach the follow-ons too, when the store keeps them.
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore + 'static> Upkeep for FaultyStore<S> {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.run(Call::MarkLapsed, self.inner.mark_lapsed(key, attempt, note))
            .await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.run(
            Call::Resolve,
            self.inner.resolve(key, attempt, resolution, note),
        )
        .await
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.run(
            Call::DeferCheck,
            self.inner.defer_check(key, attempt, delay, taken),
        )
        .await
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.run(Call::TakeCheck, self.inner.take_check(key, attempt, hold))
            .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.run(Call::Purge, self.inner.purge_expired(batch)).await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListLapsed, self.inner.list_lapsed(limit))
            .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListUnknown, self.inner.list_unknown(limit))
            .await
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore + 'static> Inspect for FaultyStore<S> {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.run(Call::ListRecords, self.inner.list_records(filter))
            .await
    }

    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        // A listing, faulted as one.
        self.run(Call::ListRecords, self.inner.find_by_reference(reference))
            .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.run(Call::CountRecords, self.inner.count_records())
            .await
    }
}

impl<S: IdempotencyStore + 'static> FaultyStore<S> {
    /// The wrapped store's follow-ons: only reached once `follow_ons()` said
    /// there are some.
    fn jobs(&self) -> &dyn FollowOnStore {
        self.inner
            .follow_ons()
            .expect("FaultyStore::follow_ons() is Some only when the store keeps jobs")
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore + 'static> FollowOnStore for FaultyStore<S> {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let call = if jobs.is_empty() {
            Call::Complete
        } else {
            Call::CompleteWithFollowOns
        };
        self.run_completion(
            call,
            self.jobs()
                .complete_with_follow_ons(key, attempt, response, jobs),
        )
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
        let call = if jobs.is_empty() {
            Call::Resolve
        } else {
            Call::ResolveWithFollowOns
        };
        self.run(
            call,
            self.jobs()
                .resolve_with_follow_ons(key, attempt, response, note, jobs),
        )
        .await
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        self.run(
            Call::LeaseJobs,
            self.jobs().lease_follow_ons(names, limit, lease, attempt),
        )
        .await
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        self.run(Call::FinishJob, self.jobs().finish_follow_on(id, attempt))
            .await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.run(
            Call::RetryJob,
            self.jobs().retry_follow_on(id, attempt, delay, error),
        )
        .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        self.run(
            Call::BuryJob,
            self.jobs().bury_follow_on(id, attempt, error),
        )
        .await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        self.run(Call::ListJobs, self.jobs().list_follow_ons(filter))
            .await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        self.run(Call::RedriveJob, self.jobs().redrive_follow_on(id))
            .await
    }

    async fn count_due_follow_ons(
        &self,
    ) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        self.run(Call::CountDueJobs, self.jobs().count_due_follow_ons())
            .await
    }
}
