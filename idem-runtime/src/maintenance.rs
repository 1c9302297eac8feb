//! The jobs that keep records honest over time: purge, sweep, reconcile.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::answer::note;
use crate::store::{IdempotencyStore, Record, StoreError};

/// What a processor says about an operation whose outcome was unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconciliation {
    /// It happened: store this response (JSON text, exactly what the tool
    /// would have returned) so repeats replay it.
    Completed {
        /// The response to store.
        response: String,
    },
    /// It did not happen: release the record so the call can run again.
    NotPerformed,
    /// The processor does not know yet; ask again on the next round.
    StillUnknown,
}

/// Looks an operation up at the processor by its reference (the one the
/// handler passed on as the processor's own idempotency reference).
#[async_trait]
pub trait Reconciler: Send + Sync + std::fmt::Debug {
    /// What became of `record`'s operation. An error leaves it UNKNOWN.
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>>;
}

/// Deletes every expired record, `batch` at a time; returns how many.
///
/// Each batch is its own short statement, and after each one the task rests
/// as long as the batch took, so the purge never holds more than half of the
/// store's attention: claims running meanwhile keep their latency (on
/// PostgreSQL, a million expired rows purged in batches of 250 moved the
/// claims' p99 by about 1.25×; back to back, by 2–4×; see BENCHMARKS.md).
pub async fn purge(store: &dyn IdempotencyStore, batch: usize) -> Result<usize, StoreError> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let started = std::time::Instant::now();
        let n = store.purge_expired(batch).await?;
        total += n;
        if n < batch {
            return Ok(total);
        }
        tokio::time::sleep(started.elapsed()).await;
    }
}

/// Marks UNKNOWN every IN_PROGRESS record whose lease ran out (at most
/// `limit`); returns how many it marked. A record that completed or changed
/// owner in the meantime is left alone: the mark is fenced by the attempt
/// that was listed.
pub async fn sweep(store: &dyn IdempotencyStore, limit: usize) -> Result<usize, StoreError> {
    let mut marked = 0;
    for record in store.list_lapsed(limit).await? {
        match store
            .mark_unknown(&record.key, record.attempt, note::SWEPT)
            .await
        {
            Ok(()) => {
                tracing::warn!(reference = %record.reference(), tool = %record.tool, "swept: outcome unknown");
                marked += 1;
            }
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(marked)
}

/// How a reconcile round went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Records resolved to COMPLETED.
    pub completed: usize,
    /// Records released (the operation had not happened).
    pub released: usize,
    /// Records still UNKNOWN (the processor did not know, or failed).
    pub still_unknown: usize,
}

/// Asks `reconciler` about at most `limit` UNKNOWN records and resolves them.
pub async fn reconcile(
    store: &dyn IdempotencyStore,
    reconciler: &dyn Reconciler,
    limit: usize,
) -> Result<ReconcileReport, StoreError> {
    let mut report = ReconcileReport::default();
    for record in store.list_unknown(limit).await? {
        let reference = record.reference();
        let resolved = match reconciler.reconcile(&record).await {
            Ok(Reconciliation::Completed { response }) => store
                .complete(&record.key, record.attempt, &response)
                .await
                .map(|()| &mut report.completed),
            Ok(Reconciliation::NotPerformed) => store
                .release(&record.key, record.attempt)
                .await
                .map(|()| &mut report.released),
            Ok(Reconciliation::StillUnknown) => Ok(&mut report.still_unknown),
            Err(error) => {
                tracing::warn!(%reference, %error, "reconciler failed; the record stays UNKNOWN");
                Ok(&mut report.still_unknown)
            }
        };
        match resolved {
            Ok(counter) => *counter += 1,
            // Resolved by someone else meanwhile (a late completion, another replica).
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}

/// Settings of the background [`Maintenance`] task.
#[derive(Clone, Debug)]
pub struct MaintenanceConfig {
    /// Time between rounds.
    pub interval: Duration,
    /// Purge batch size, and the most records swept or reconciled per round
    /// (default 250: small batches keep claims fast while a purge runs).
    pub batch: usize,
    /// Resolves UNKNOWN records, if given.
    pub reconciler: Option<Arc<dyn Reconciler>>,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: Duration::from_secs(30),
            batch: 250,
            reconciler: None,
        }
    }
}

/// A tokio task that runs sweep, reconcile and purge every interval, and
/// stops cleanly (between rounds, never in the middle of a write).
#[derive(Debug)]
pub struct Maintenance {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Maintenance {
    /// Starts the task on the current tokio runtime.
    pub fn spawn(store: Arc<dyn IdempotencyStore>, config: MaintenanceConfig) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                Self::round(&*store, &config).await;
                tokio::select! {
                    _ = tokio::time::sleep(config.interval) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Maintenance { stop, task }
    }

    /// One round; store errors are logged and the next round tries again.
    pub async fn round(store: &dyn IdempotencyStore, config: &MaintenanceConfig) {
        if let Err(error) = sweep(store, config.batch).await {
            tracing::warn!(%error, "sweep failed");
        }
        if let Some(reconciler) = &config.reconciler {
            if let Err(error) = reconcile(store, &**reconciler, config.batch).await {
                tracing::warn!(%error, "reconcile failed");
            }
        }
        if let Err(error) = purge(store, config.batch).await {
            tracing::warn!(%error, "purge failed");
        }
    }

    /// Stops the task and waits for the round in progress to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
