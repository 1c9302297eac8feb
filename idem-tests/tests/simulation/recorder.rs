//! The innermost layer of a schedule's store stack: it runs the writes one
//! at a time and reads each that took effect back into the model (`model.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::{
    follow_ons::FollowOns,
    key::IdempotencyKey,
    store::{
        Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore,
        Record, RecordFilter, Resolution, StateCounts,
    },
    IdempotencyStore, Reference, StoreError,
};

use super::model::Write;
use super::stores::jobs_of;
use super::timing::Mode;
use super::world::Sim;
use idem_runtime::store::{Inspect, Limits, Upkeep};
use tokio::time::Instant;

/// Innermost: every write runs one at a time, in real time on a task of its
/// own (so a dropped call cannot cut the bookkeeping off from a write that
/// took effect), and the record after it is kept as the model.
#[derive(Debug)]
pub struct Recorder {
    pub inner: Arc<dyn IdempotencyStore>,
    pub sim: Arc<Sim>,
    /// Shared by every replica's recorder: one write at a time.
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

impl Recorder {
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
                    sim.world()
                        .claims_landed
                        .insert((*req.key.as_bytes(), req.attempt.get()), Instant::now());
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

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        // Completions with jobs are recorded as completions are.
        self.inner.follow_ons().map(|_| self as &dyn FollowOnStore)
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Upkeep for Recorder {
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
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = *key;
        self.write(|inner, sim| async move {
            let out = inner.defer_check(&key, attempt, delay, taken).await;
            if let Ok(true) = out {
                Self::wrote(&*inner, &sim, &key, attempt, Write::Defer).await;
            }
            out
        })
        .await
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let key = *key;
        self.write(|inner, sim| async move {
            let out = inner.take_check(&key, attempt, hold).await;
            if let Ok(Some(_)) = out {
                Self::wrote(&*inner, &sim, &key, attempt, Write::TakeCheck).await;
            }
            out
        })
        .await
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
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Inspect for Recorder {
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

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        token: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        // Under the write lock: a job is leased only once the completion
        // that wrote it has been recorded (in real time a dispatcher could
        // otherwise deliver it before the bookkeeping knew of it).
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        self.write(|inner, _| async move {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            jobs_of(&*inner)
                .lease_follow_ons(&names, limit, lease, token)
                .await
        })
        .await
    }

    async fn finish_follow_on(&self, id: &FollowOnId, token: Attempt) -> Result<(), StoreError> {
        jobs_of(&*self.inner).finish_follow_on(id, token).await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        token: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&*self.inner)
            .retry_follow_on(id, token, delay, error)
            .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        token: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        jobs_of(&*self.inner).bury_follow_on(id, token, error).await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        jobs_of(&*self.inner).list_follow_ons(filter).await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        jobs_of(&*self.inner).redrive_follow_on(id).await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        jobs_of(&*self.inner).count_due_follow_ons().await
    }
}
