//! The two rounds that need no one's answer: the purge of expired records
//! and the sweep of lapsed claims to UNKNOWN.

use crate::answer::note;
use crate::store::{IdempotencyStore, StoreError};

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
        crate::telemetry::purged(n);
        if n < batch {
            return Ok(total);
        }
        tokio::time::sleep(started.elapsed()).await;
    }
}

/// Marks UNKNOWN every IN_PROGRESS record whose lease ran out (at most
/// `limit`); returns how many it marked. A record that completed or changed
/// owner in the meantime is left alone (the mark is fenced by the attempt
/// that was listed), and so is one whose handler renewed its lease after the
/// listing: the mark re-checks the lease in the same atomic step.
pub async fn sweep(store: &dyn IdempotencyStore, limit: usize) -> Result<usize, StoreError> {
    let mut marked = 0;
    for record in store.list_lapsed(limit).await? {
        match store
            .mark_lapsed(&record.key, record.attempt, note::SWEPT)
            .await
        {
            Ok(true) => {
                tracing::warn!(reference = %record.reference, tool = %record.tool, "swept: outcome unknown");
                marked += 1;
            }
            Ok(false) | Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    crate::telemetry::swept(marked);
    Ok(marked)
}
