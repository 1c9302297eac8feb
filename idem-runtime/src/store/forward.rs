//! A shared store is a store: the traits of the store contract forwarded
//! through an `Arc`, so `Arc<MemoryStore>` and `Arc<dyn IdempotencyStore>`
//! are stores too.
//!
//! Every method is forwarded, provided ones included: one left out would
//! silently answer its default instead of the store's
//! (`clippy::missing_trait_methods` is denied on each impl).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore,
    FollowOns, IdempotencyStore, Inspect, Limits, Record, RecordFilter, Resolution, StateCounts,
    StoreError, Upkeep,
};
use crate::key::{IdempotencyKey, Reference};

/// A shared store is a store: `Arc<MemoryStore>`, `Arc<dyn IdempotencyStore>`.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for Arc<S> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        (**self).claim(req).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        (**self).complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        (**self).release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        (**self).mark_unknown(key, attempt, note).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        (**self).heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        (**self).lookup(tenant, reference).await
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        (**self).follow_ons()
    }
    fn limits(&self) -> Limits {
        (**self).limits()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: Upkeep + ?Sized> Upkeep for Arc<S> {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        (**self).mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        (**self).resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        (**self).defer_check(key, attempt, delay, taken).await
    }
    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        (**self).take_check(key, attempt, hold).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        (**self).purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        (**self).list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        (**self).list_unknown(limit).await
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: Inspect + ?Sized> Inspect for Arc<S> {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        (**self).list_records(filter).await
    }
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        (**self).find_by_reference(reference).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        (**self).count_records().await
    }
}

/// A shared store that keeps follow-ons keeps them:
/// `Arc<MemoryStore>`, `Arc<dyn FollowOnStore>`.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: FollowOnStore + ?Sized> FollowOnStore for Arc<S> {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        (**self)
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
        (**self)
            .resolve_with_follow_ons(key, attempt, response, note, jobs)
            .await
    }
    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        (**self)
            .lease_follow_ons(names, limit, lease, attempt)
            .await
    }
    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        (**self).finish_follow_on(id, attempt).await
    }
    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        (**self).retry_follow_on(id, attempt, delay, error).await
    }
    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        (**self).bury_follow_on(id, attempt, error).await
    }
    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        (**self).list_follow_ons(filter).await
    }
    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        (**self).redrive_follow_on(id).await
    }
    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        (**self).count_due_follow_ons().await
    }
}
