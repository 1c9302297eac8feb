//! The follow-on dispatcher on PostgreSQL, in one process: what a far side or a handler
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
    answer::{Answer, Recording},
    executor::{Operation, ScopeSpec},
    follow_on,
    follow_ons::{
        follow_on_fn, FollowOn, FollowOnConfig, FollowOnDispatcher, FollowOnError, FollowOnHandlers,
    },
    store::{FollowOnFilter, FollowOnStore, RecordState},
    Caller, Executor, IdempotencyStore, ToolError,
};
use serde_json::json;

/// Dispatch settings that run a job's attempts in quick succession: a
/// failed run is retried after a millisecond, and a lease runs out after
/// half a second.
fn quick(max_runs: u32) -> FollowOnConfig {
    FollowOnConfig::default()
        .with_interval(Duration::from_millis(10))
        .with_batch(8)
        .with_timeout(Duration::from_millis(250))
        .with_max_runs(max_runs)
        .with_first_backoff(Duration::from_millis(1))
        .with_max_backoff(Duration::from_millis(1))
}

async fn all_jobs(
    store: &dyn FollowOnStore,
    tenant: &str,
) -> Vec<idem_runtime::store::FollowOnRecord> {
    store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(tenant.to_owned()),
            limit: 100,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap()
}

/// A mailer whose error text carries a NUL byte (and is long): PostgreSQL
/// cannot keep it in a text column as given. The dispatcher still records
/// every failure, so the mailer is called exactly `max_runs` times and
/// the job lands in the dead letter, with a readable, bounded error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_text_with_a_nul_byte_still_ends_in_the_dead_letter() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let store: &dyn FollowOnStore = &pg.store;
    let req = durable::request(Duration::from_secs(60), Duration::from_secs(900));
    store.claim(&req).await.unwrap();
    let job = FollowOn::new("send_receipt", &json!({ "to": "a@example.com" })).unwrap();
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&[job]).unwrap(),
        )
        .await
        .unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handlers = FollowOnHandlers::new().on(
        "send_receipt",
        follow_on_fn(move |_| {
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
        FollowOnDispatcher::round(store, &handlers, &config)
            .await
            .unwrap();
        let jobs = all_jobs(store, &req.tenant).await;
        if jobs.iter().all(|j| j.dead) && calls.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Rounds past two lease periods more: a dead job is never run again.
    let settled = Instant::now();
    while settled.elapsed() < config.lease() * 2 {
        FollowOnDispatcher::round(store, &handlers, &config)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let jobs = all_jobs(store, &req.tenant).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the mailer is called exactly max_runs times; jobs: {jobs:?}"
    );
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].dead, "the job is in the dead letter: {:?}", jobs[0]);
    let error = jobs[0].last_error.as_deref().expect("its error is kept");
    assert!(!error.contains('\0'), "{error:?}");
    assert!(error.starts_with("mailer said: bad"), "{error:?}");
    assert!(
        error.len() <= idem_runtime::follow_ons::MAX_FOLLOW_ON_ERROR,
        "the kept error is bounded: {} bytes",
        error.len()
    );
}

/// A job name with a NUL byte, declared by a handler on PostgreSQL, is
/// refused at the declaration: the completion that would have carried it
/// (after the side effect) is never refused, and the record is COMPLETED,
/// not left IN_PROGRESS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_name_postgres_cannot_keep_is_refused_and_the_record_completes() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let store: Arc<dyn IdempotencyStore> = Arc::new(pg.store.clone());
    let executor = Executor::new(store.clone());
    let caller = Caller::new("acme", "alice");
    let args = json!({"card": "4242"});
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    let charges = AtomicUsize::new(0);
    let declared = std::sync::Mutex::new(None);
    let answer: Answer<String, ToolError> = executor
        .run(op, |_| async {
            charges.fetch_add(1, Ordering::SeqCst);
            *declared.lock().unwrap() =
                Some(follow_on("send\0receipt", &json!({"to": "a@example.com"})));
            Ok("charged".to_owned())
        })
        .await;
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let reference = answer.reference().expect("the call was claimed");
    let record = store.lookup("acme", &reference).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: "\"charged\"".to_owned()
        },
        "the answer was {answer:?}"
    );
    assert!(
        matches!(
            answer,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{answer:?}"
    );
    let declared = declared.into_inner().unwrap();
    assert!(
        matches!(declared, Some(Err(FollowOnError::BadName { .. }))),
        "{declared:?}"
    );
    assert!(all_jobs(store.follow_ons().unwrap(), "acme")
        .await
        .is_empty());
}
