//! What the executor writes: a job only with a completion (a resolution by
//! hand or a reconciler's included), never for a replay, a rejection, an
//! unknown outcome or a panic; bad declarations refused where they are made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    answer::{Answer, Recording},
    follow_on,
    follow_ons::{FollowOnConfig, FollowOnDispatcher, FollowOnError},
    Executor, IdempotencyStore, ToolError,
};
use serde_json::{json, Value};

use crate::{alice, charge, config, jobs, memory, operation, Mailer};

/// A job is written with the completion, once; a replay writes nothing more
/// and the dispatcher delivers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_is_written_with_the_completion_and_delivered_once() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    let args = json!({"card": "4242", "cents": 500});
    let first = charge(&executor, &args, &charges).await;
    let reference = match &first {
        Answer::Executed {
            reference,
            recording: Recording::Stored,
            ..
        } => *reference,
        other => panic!("{other:?}"),
    };
    let written = jobs(&*store).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].id.reference, reference);
    assert_eq!(written[0].id.name, "send_receipt");
    assert_eq!(written[0].id.tenant, "acme");
    let payload: Value = serde_json::from_str(&written[0].payload).unwrap();
    assert_eq!(payload["to"], "alice@example.com");

    // Replays run nothing and write nothing.
    for _ in 0..3 {
        assert!(matches!(
            charge(&executor, &args, &charges).await,
            Answer::Replayed { .. }
        ));
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!(jobs(&*store).await, written, "a replay changed the jobs");

    let mailer = Mailer::new(Duration::ZERO, 0);
    let report = FollowOnDispatcher::round(&*store, &mailer.handlers(), &config())
        .await
        .unwrap();
    assert_eq!((report.leased, report.delivered), (1, 1));
    let seen = mailer.seen();
    let key = format!("{reference}:send_receipt");
    assert_eq!(seen[&key].attempts, 1);
    assert_eq!(seen[&key].deliveries, 1);
    assert_eq!(seen[&key].attempt_numbers, [1]);
    assert!(
        jobs(&*store).await.is_empty(),
        "a delivered job is finished"
    );
    // Another round and another replay: still one delivery.
    assert!(matches!(
        charge(&executor, &args, &charges).await,
        Answer::Replayed { .. }
    ));
    FollowOnDispatcher::round(&*store, &mailer.handlers(), &config())
        .await
        .unwrap();
    assert_eq!(mailer.seen()[&key].attempts, 1);
}

/// A handler that declares and then ends rejected, unknown, or panics,
/// enqueues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_unknown_and_panicking_handlers_enqueue_nothing() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    for (i, ending) in ["rejected", "unknown", "panic", "classified"]
        .into_iter()
        .enumerate()
    {
        let args = json!({"case": i});
        let answer: Answer<String, ToolError> = executor
            .run(operation(&caller, &args), |_| async move {
                follow_on("send_receipt", &json!({"case": i})).unwrap();
                match ending {
                    "rejected" => Err(ToolError::rejected("card declined")),
                    "unknown" => Err(ToolError::unknown("processor timed out")),
                    "panic" => panic!("handler bug"),
                    _ => Err(ToolError::unknown("unclassified")),
                }
            })
            .await;
        assert!(
            !matches!(answer, Answer::Executed { .. }),
            "{ending}: {answer:?}"
        );
        assert!(jobs(&*store).await.is_empty(), "{ending} enqueued a job");
    }
}

/// A name declared twice, a payload over the limit or that does not
/// serialize, and a declaration outside a handler are refused where they are
/// made; the handler's outcome is its own, and only the valid job is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_declarations_are_refused_at_the_call() {
    let store = memory();
    let executor = Executor::new(store.clone()).with_max_follow_on_payload(100);
    let caller = alice();
    let args = json!({"card": "4242"});
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async move {
            let mut errors = seen.lock().unwrap().clone();
            follow_on("send_receipt", &json!({"n": 1})).unwrap();
            errors.push(follow_on("send_receipt", &json!({"n": 2})).unwrap_err());
            errors.push(follow_on("notify", &"x".repeat(200)).unwrap_err());
            let mut odd = HashMap::new();
            odd.insert((1, 2), 3);
            errors.push(follow_on("audit", &odd).unwrap_err());
            errors.push(follow_on("", &1).unwrap_err());
            // A task the handler spawns has no declarations of its own.
            let spawned = tokio::spawn(async { follow_on("late", &1) }).await.unwrap();
            errors.push(spawned.unwrap_err());
            *seen.lock().unwrap() = errors;
            Ok("charged".to_owned())
        })
        .await;
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
    let errors = errors.lock().unwrap().clone();
    assert!(
        matches!(&errors[0], FollowOnError::Duplicate { name } if name == "send_receipt"),
        "{errors:?}"
    );
    assert!(
        matches!(
            &errors[1],
            FollowOnError::TooLarge {
                size: 202,
                limit: 100,
                ..
            }
        ),
        "{errors:?}"
    );
    assert!(
        matches!(&errors[2], FollowOnError::Unserializable { .. }),
        "{errors:?}"
    );
    assert!(
        matches!(&errors[3], FollowOnError::BadName { .. }),
        "{errors:?}"
    );
    assert!(
        matches!(&errors[4], FollowOnError::OutsideHandler { .. }),
        "{errors:?}"
    );
    for e in &errors {
        assert!(!e.to_string().is_empty());
    }
    let written = jobs(&*store).await;
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(
        written[0].payload, r#"{"n":1}"#,
        "the first declaration stands"
    );
    // Outside any handler.
    assert!(matches!(
        follow_on("send_receipt", &1),
        Err(FollowOnError::OutsideHandler { .. })
    ));
}

/// A job name a store cannot keep (a NUL byte, a control character, a
/// separator of the Redis layout, a space, a non-ASCII letter, empty, too
/// long) is refused where it is declared, with a message that gives the
/// rule; the handler's outcome is its own, and the record completes with
/// only the valid job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_names_a_store_cannot_keep_are_refused_at_the_declaration() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    let args = json!({"card": "4242"});
    let bad = [
        "send\0receipt".to_owned(),
        "send\nreceipt".to_owned(),
        "send\u{1b}[2Jreceipt".to_owned(),
        "send:receipt".to_owned(),
        "send receipt".to_owned(),
        "{send}receipt".to_owned(),
        "send*".to_owned(),
        "envoyer_reçu".to_owned(),
        String::new(),
        "x".repeat(129),
    ];
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let names = bad.clone();
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async move {
            let mut refusals = Vec::new();
            for name in &names {
                refusals.push((name.clone(), follow_on(name, &json!({"n": 1}))));
            }
            follow_on("send_receipt.v2", &json!({"n": 2})).unwrap();
            *seen.lock().unwrap() = refusals;
            Ok("charged".to_owned())
        })
        .await;
    let reference = match answer {
        Answer::Executed {
            recording: Recording::Stored,
            reference,
            ..
        } => reference,
        other => panic!("the record completes: {other:?}"),
    };
    for (name, refused) in refusals.lock().unwrap().iter() {
        match refused {
            Err(e @ FollowOnError::BadName { name: given }) => {
                assert_eq!(given, name);
                let message = e.to_string();
                assert!(
                    message.contains("A-Z a-z 0-9"),
                    "the message gives the rule: {message}"
                );
            }
            other => panic!("{name:?} was not refused as a bad name: {other:?}"),
        }
    }
    let record = store.lookup("acme", &reference).await.unwrap().unwrap();
    assert!(
        matches!(
            record.state,
            idem_runtime::store::RecordState::Completed { .. }
        ),
        "{record:?}"
    );
    let written = jobs(&*store).await;
    assert_eq!(
        written
            .iter()
            .map(|j| j.id.name.as_str())
            .collect::<Vec<_>>(),
        ["send_receipt.v2"]
    );
}

/// A reconciler or an operator that finds an UNKNOWN operation performed
/// writes the follow-ons with the resolution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_by_hand_writes_follow_ons() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    let args = json!({"card": "4242"});
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async {
            follow_on("send_receipt", &1).unwrap();
            Err(ToolError::unknown("processor timed out"))
        })
        .await;
    let reference = match answer {
        Answer::Failed { reference, .. } => reference,
        other => panic!("{other:?}"),
    };
    assert!(jobs(&*store).await.is_empty());
    let receipt =
        idem_runtime::follow_ons::FollowOn::new("send_receipt", &json!({"to": "a@example.com"}))
            .unwrap();
    // Jobs follow only a completed outcome: a not-performed one has none
    // to give (the type says so), and the completed one writes them.
    idem_runtime::maintenance::resolve_by_hand(
        &*store,
        "acme",
        &reference,
        &idem_runtime::maintenance::Outcome::completed_with("\"charged\"", vec![receipt]),
        "ops: seen at the processor",
    )
    .await
    .unwrap();
    let written = jobs(&*store).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].id.reference, reference);
    let mailer = Mailer::new(Duration::ZERO, 0);
    FollowOnDispatcher::round(&*store, &mailer.handlers(), &config())
        .await
        .unwrap();
    assert_eq!(mailer.deliveries(), 1);
}

/// A reconciler that finds an UNKNOWN charge performed writes its receipt
/// job with the resolution; one that declares a name twice resolves nothing
/// (the record stays UNKNOWN, asked again later) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_writes_follow_ons_with_its_resolution() {
    use idem_runtime::{
        follow_ons::FollowOn,
        maintenance::{reconcile, Outcome, ReconcileConfig, Reconciler, Reconciliation},
        store::Record,
    };

    #[derive(Debug)]
    struct Found(Vec<FollowOn>);

    #[async_trait::async_trait]
    impl Reconciler for Found {
        async fn reconcile(
            &self,
            _: &Record,
        ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
            Ok(Reconciliation::Found(Outcome::completed_with(
                "\"charged\"".to_owned(),
                self.0.clone(),
            )))
        }
    }

    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    let args = json!({"card": "4242"});
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async {
            Err(ToolError::unknown("processor timed out"))
        })
        .await;
    let reference = answer.reference().unwrap();
    let receipt = FollowOn::new("send_receipt", &json!({"to": "a@example.com"})).unwrap();
    let config = ReconcileConfig::default();

    let twice = Found(vec![receipt.clone(), receipt.clone()]);
    let report = reconcile(&*store, &twice, &config).await.unwrap();
    assert_eq!(
        (report.completed, report.still_unknown),
        (0, 1),
        "{report:?}"
    );
    assert!(jobs(&*store).await.is_empty());
    let record = store.lookup("acme", &reference).await.unwrap().unwrap();
    assert_eq!(record.state.name(), "UNKNOWN");

    // Deferred by the failed round: make it due again.
    let config = config.with_first_backoff(Duration::ZERO);
    store
        .defer_check(&record.key, record.attempt, Duration::ZERO, None)
        .await
        .unwrap();
    let report = reconcile(&*store, &Found(vec![receipt]), &config)
        .await
        .unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    let written = jobs(&*store).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].id.reference, reference);
    let mailer = Mailer::new(Duration::ZERO, 0);
    FollowOnDispatcher::round(&*store, &mailer.handlers(), &FollowOnConfig::default())
        .await
        .unwrap();
    assert_eq!(mailer.deliveries(), 1);
}
