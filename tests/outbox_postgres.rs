//! The outbox on PostgreSQL, in one process: what a far side or a handler
//! hands over that PostgreSQL cannot keep as given (a NUL byte in a text
//! column) never leaves a job running for ever nor a record in progress.
//!
//! Needs `IDEM_TEST_DATABASE_URL` (see `durable::database_url`): skipped with
//! a message without it, failed under `CI=true`.

mod durable;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::PgSchema;
use idem_runtime::{
    job_fn, FollowOn, IdempotencyStore, JobFilter, JobHandlers, Outbox, OutboxConfig,
};
use serde_json::json;

/// Dispatch settings that run a job's attempts in quick succession: a
/// failed run is retried after a millisecond, and a lease runs out after
/// half a second.
fn quick(max_attempts: u32) -> OutboxConfig {
    OutboxConfig {
        interval: Duration::from_millis(10),
        batch: 8,
        timeout: Duration::from_millis(250),
        max_attempts,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    }
}

async fn all_jobs(store: &dyn IdempotencyStore, tenant: &str) -> Vec<idem_runtime::OutboxJob> {
    store
        .list_jobs(&JobFilter {
            tenant: Some(tenant.to_owned()),
            limit: 100,
            ..JobFilter::default()
        })
        .await
        .unwrap()
}

/// A mailer whose error text carries a NUL byte (and is long): PostgreSQL
/// cannot keep it in a text column as given. The dispatcher still records
/// every failure, so the mailer is called exactly `max_attempts` times and
/// the job lands in the dead letter, with a readable, bounded error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_text_with_a_nul_byte_still_ends_in_the_dead_letter() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let store: &dyn IdempotencyStore = &pg.store;
    let req = durable::request(Duration::from_secs(60), Duration::from_secs(900));
    store.claim(&req).await.unwrap();
    let job = FollowOn::new("send_receipt", &json!({ "to": "a@example.com" })).unwrap();
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &[job])
        .await
        .unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handlers = JobHandlers::new().on(
        "send_receipt",
        job_fn(move |_| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Err(format!("mailer said: bad\0byte; {}", "x".repeat(100_000)).into())
            }
        }),
    );
    let config = quick(3);
    let started = Instant::now();
    // Long enough for several lease periods: a failure the store refused to
    // record would run again each time a lease ran out.
    while started.elapsed() < Duration::from_secs(3) {
        Outbox::round(store, &handlers, &config).await.unwrap();
        let jobs = all_jobs(store, &req.tenant).await;
        if jobs.iter().all(|j| j.dead) && calls.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Rounds past two lease periods more: a dead job is never run again.
    let settled = Instant::now();
    while settled.elapsed() < config.lease() * 2 {
        Outbox::round(store, &handlers, &config).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let jobs = all_jobs(store, &req.tenant).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the mailer is called exactly max_attempts times; jobs: {jobs:?}"
    );
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].dead, "the job is in the dead letter: {:?}", jobs[0]);
    let error = jobs[0].last_error.as_deref().expect("its error is kept");
    assert!(!error.contains('\0'), "{error:?}");
    assert!(error.starts_with("mailer said: bad"), "{error:?}");
    assert!(
        error.len() <= idem_runtime::MAX_JOB_ERROR,
        "the kept error is bounded: {} bytes",
        error.len()
    );
}
