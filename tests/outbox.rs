//! Follow-on jobs end to end, in one process: what the executor writes (only
//! with a completion, never for a replay, a rejection, an unknown outcome or
//! a panic; bad declarations refused where they are made), and what the
//! dispatcher does with it (retries with backoff, the dead letter and its
//! re-drive, jobs nobody handles, two dispatchers on one store). Every
//! assertion is about what a mailer stub saw: it counts attempts, dedupes by
//! the downstream key from the moment a request arrives, and counts how many
//! runs of one key overlap.
//!
//! One job, over 700 lines: the in-process outbox cases, one function each.

mod durable;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    follow_on,
    outbox::{job_fn, FollowOnError, JobHandlers, JobRun, Outbox, OutboxConfig},
    store::{JobFilter, JobState},
    Answer, Caller, Executor, IdempotencyStore, MemoryStore, Operation, Recording, ScopeSpec,
    SqliteStore, ToolError,
};
use serde_json::{json, Value};

const STATUS_TOOL: &str = "get_operation_status";

/// What the mailer saw of one downstream key.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Requests that arrived, failed ones included.
    attempts: usize,
    /// Mails actually sent: at most one per key, whatever arrives.
    deliveries: usize,
    /// Runs of this key in flight right now, and the most ever at once.
    in_flight: usize,
    max_in_flight: usize,
    /// When each request arrived.
    arrivals: Vec<Instant>,
    /// The attempt numbers the dispatcher gave.
    attempt_numbers: Vec<u32>,
}

/// A mailer stand-in: dedupes by the downstream key, fails the first
/// `fail_first` requests of each key, takes `delay` per request.
#[derive(Clone, Default)]
struct Mailer {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    fail_first: Arc<AtomicUsize>,
    delay: Duration,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Mailer {
    fn new(delay: Duration, fail_first: usize) -> Self {
        Mailer {
            delay,
            fail_first: Arc::new(AtomicUsize::new(fail_first)),
            ..Mailer::default()
        }
    }

    async fn send(&self, job: JobRun) -> Result<(), idem_runtime::outbox::JobError> {
        let attempts = {
            let mut seen = self.seen.lock().unwrap();
            let s = seen.entry(job.downstream_key.clone()).or_default();
            s.attempts += 1;
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            s.arrivals.push(Instant::now());
            s.attempt_numbers.push(job.run);
            s.attempts
        };
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut seen = self.seen.lock().unwrap();
        let s = seen.get_mut(&job.downstream_key).unwrap();
        s.in_flight -= 1;
        if attempts <= self.fail_first.load(Ordering::SeqCst) {
            return Err(format!("mailer down (request {attempts})").into());
        }
        // Deduped by the downstream key: a repeat is acknowledged, not sent.
        if s.deliveries == 0 {
            s.deliveries = 1;
        }
        Ok(())
    }

    fn handlers(&self) -> JobHandlers {
        let mailer = self.clone();
        JobHandlers::new().on(
            "send_receipt",
            job_fn(move |job| {
                let mailer = mailer.clone();
                async move { mailer.send(job).await }
            }),
        )
    }

    fn seen(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn deliveries(&self) -> usize {
        self.seen().values().map(|s| s.deliveries).sum()
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn operation<'a>(caller: &'a Caller, args: &'a Value) -> Operation<'a, Value> {
    Operation {
        caller,
        tool: "charge_card",
        args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    }
}

fn memory() -> Arc<dyn IdempotencyStore> {
    Arc::new(MemoryStore::new())
}

/// The jobs not delivered yet: waiting, running or dead.
async fn jobs(store: &dyn IdempotencyStore) -> Vec<idem_runtime::store::Job> {
    store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_jobs(&JobFilter {
            states: vec![JobState::Waiting, JobState::Running, JobState::Dead],
            limit: 1000,
            ..JobFilter::default()
        })
        .await
        .unwrap()
}

/// A charge that declares a receipt, through the free function.
async fn charge(
    executor: &Executor,
    args: &Value,
    charges: &AtomicUsize,
) -> Answer<String, ToolError> {
    let caller = alice();
    executor
        .run(operation(&caller, args), |ctx| async move {
            charges.fetch_add(1, Ordering::SeqCst);
            follow_on(
                "send_receipt",
                &json!({"to": "alice@example.com", "ref": ctx.reference().to_string()}),
            )
            .map_err(|e| ToolError::unknown(e.to_string()))?;
            Ok("charged".to_owned())
        })
        .await
}

fn config() -> OutboxConfig {
    OutboxConfig {
        interval: Duration::from_millis(20),
        batch: 8,
        timeout: Duration::from_secs(5),
        max_runs: 5,
        first_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(2),
    }
}

async fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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
    let report = Outbox::round(&*store, &mailer.handlers(), &config())
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
    Outbox::round(&*store, &mailer.handlers(), &config())
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
        .run(operation(&caller, &args), |ctx| async move {
            let mut errors = seen.lock().unwrap().clone();
            ctx.follow_on("send_receipt", &json!({"n": 1})).unwrap();
            errors.push(ctx.follow_on("send_receipt", &json!({"n": 2})).unwrap_err());
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

/// A failing mailer is retried with a growing backoff until it takes the
/// mail: three requests, one delivery, the same downstream key each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_job_is_retried_with_backoff_then_delivered() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let mailer = Mailer::new(Duration::ZERO, 2);
    let outbox = Outbox::spawn(store.clone(), mailer.handlers(), config())
        .expect("the store keeps follow-on jobs");
    wait_until("the receipt is delivered", Duration::from_secs(10), || {
        mailer.deliveries() == 1
    })
    .await;
    outbox.stop().await;
    let seen = mailer.seen();
    assert_eq!(seen.len(), 1, "one downstream key: {seen:?}");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempts, 3);
    assert_eq!(s.attempt_numbers, [1, 2, 3]);
    // Equal jitter keeps at least half of each pause: 100 ms, then 200 ms.
    let gaps: Vec<Duration> = s.arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(50), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(100), "{gaps:?}");
    assert!(jobs(&*store).await.is_empty());
}

/// After its last attempt a job goes to the dead letter, where it is listed
/// with its error and left alone; re-driven, it is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_then_redrive() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let mailer = Mailer::new(Duration::ZERO, usize::MAX);
    let config = OutboxConfig {
        max_runs: 2,
        first_backoff: Duration::from_millis(10),
        ..config()
    };
    let outbox = Outbox::spawn(store.clone(), mailer.handlers(), config.clone())
        .expect("the store keeps follow-on jobs");
    let dead = JobFilter {
        states: vec![JobState::Dead],
        limit: 10,
        ..JobFilter::default()
    };
    let started = Instant::now();
    loop {
        if !store
            .follow_ons()
            .expect("the store keeps jobs")
            .list_jobs(&dead)
            .await
            .unwrap()
            .is_empty()
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never buried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let buried = store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_jobs(&dead)
        .await
        .unwrap();
    assert_eq!(buried[0].runs, 2);
    assert!(buried[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("mailer down"));
    // Buried means left alone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(mailer.seen().values().next().unwrap().attempts, 2);

    mailer.fail_first.store(0, Ordering::SeqCst);
    assert!(store
        .follow_ons()
        .expect("the store keeps jobs")
        .redrive_job(&buried[0].id)
        .await
        .unwrap());
    wait_until(
        "the re-driven receipt is delivered",
        Duration::from_secs(10),
        || mailer.deliveries() == 1,
    )
    .await;
    outbox.stop().await;
    let s = mailer.seen().into_values().next().unwrap();
    assert_eq!(s.attempts, 3);
    assert_eq!(
        s.attempt_numbers,
        [1, 2, 1],
        "re-driven from its first attempt"
    );
    assert!(store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_jobs(&dead)
        .await
        .unwrap()
        .is_empty());
}

/// A job whose name no handler runs waits, reported each round, and is
/// delivered by a dispatcher that has the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_without_a_handler_waits_and_is_reported() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let caller = alice();
    let args = json!({"card": "4242"});
    let answer: Answer<String, ToolError> = executor
        .run(operation(&caller, &args), |_| async {
            follow_on("send_fax", &json!({"to": "+1 555"})).unwrap();
            follow_on("send_receipt", &json!({"to": "a@example.com"})).unwrap();
            Ok("charged".to_owned())
        })
        .await;
    assert!(matches!(answer, Answer::Executed { .. }));
    let mailer = Mailer::new(Duration::ZERO, 0);
    for _ in 0..3 {
        let report = Outbox::round(&*store, &mailer.handlers(), &config())
            .await
            .unwrap();
        assert_eq!(report.unhandled.get("send_fax"), Some(&1), "{report:?}");
    }
    assert_eq!(mailer.deliveries(), 1, "the receipt went out");
    let waiting = jobs(&*store).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].id.name.as_str(), waiting[0].runs),
        ("send_fax", 0)
    );

    let faxes = Arc::new(AtomicUsize::new(0));
    let counted = faxes.clone();
    let with_fax = JobHandlers::new().on(
        "send_fax",
        job_fn(move |_| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }),
    );
    let report = Outbox::round(&*store, &with_fax, &config()).await.unwrap();
    assert_eq!(report.delivered, 1);
    assert!(report.unhandled.is_empty());
    assert_eq!(faxes.load(Ordering::SeqCst), 1);
    assert!(jobs(&*store).await.is_empty());
}

/// Two dispatchers on one store, twenty jobs and a slow mailer: they work at
/// once (the mailer sees runs overlap, and each dispatcher delivers some),
/// yet no job ever runs in both at the same time, and each is delivered once.
async fn two_dispatchers_share_no_job(
    first: Arc<dyn IdempotencyStore>,
    second: Arc<dyn IdempotencyStore>,
) {
    let executor = Executor::new(first.clone());
    let charges = AtomicUsize::new(0);
    for i in 0..20 {
        let answer = charge(&executor, &json!({"card": "4242", "i": i}), &charges).await;
        assert!(matches!(
            answer,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ));
    }
    let mailer = Mailer::new(Duration::from_millis(40), 0);
    let by_dispatcher: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
    let handlers = |n: Arc<AtomicUsize>| {
        let mailer = mailer.clone();
        JobHandlers::new().on(
            "send_receipt",
            job_fn(move |job| {
                let (mailer, n) = (mailer.clone(), n.clone());
                async move {
                    mailer.send(job).await?;
                    n.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }),
        )
    };
    let config = OutboxConfig {
        batch: 3,
        ..config()
    };
    let a = Outbox::spawn(
        first.clone(),
        handlers(by_dispatcher[0].clone()),
        config.clone(),
    )
    .expect("the store keeps follow-on jobs");
    let b = Outbox::spawn(second, handlers(by_dispatcher[1].clone()), config)
        .expect("the store keeps follow-on jobs");
    wait_until(
        "every receipt is delivered",
        Duration::from_secs(20),
        || mailer.deliveries() == 20,
    )
    .await;
    a.stop().await;
    b.stop().await;
    let seen = mailer.seen();
    assert_eq!(seen.len(), 20);
    for (key, s) in &seen {
        assert_eq!(s.max_in_flight, 1, "{key} ran in two dispatchers at once");
        assert_eq!(s.attempts, 1, "{key} ran twice: {s:?}");
        assert_eq!(s.deliveries, 1);
    }
    assert!(
        mailer.max_in_flight.load(Ordering::SeqCst) >= 2,
        "the dispatchers never overlapped"
    );
    for (i, n) in by_dispatcher.iter().enumerate() {
        assert!(
            n.load(Ordering::SeqCst) > 0,
            "dispatcher {i} delivered nothing"
        );
    }
    assert!(jobs(&*first).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_one_memory_store() {
    let store = memory();
    two_dispatchers_share_no_job(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_one_sqlite_file() {
    let dir = durable::temp_dir("outbox-two");
    let path = dir.join("idem.sqlite3");
    let a: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let b: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    two_dispatchers_share_no_job(a, b).await;
}

/// A run that outlasts the timeout is cancelled and counts as failed; the
/// next run carries the same downstream key, and the mailer delivers once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_timeout_runs_again_with_the_same_key() {
    let store = memory();
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    charge(&executor, &json!({"card": "4242"}), &charges).await;
    let slow = Mailer::new(Duration::from_millis(300), 0);
    let config = OutboxConfig {
        timeout: Duration::from_millis(100),
        first_backoff: Duration::from_millis(10),
        ..config()
    };
    let report = Outbox::round(&*store, &slow.handlers(), &config)
        .await
        .unwrap();
    assert_eq!(report.retried, 1, "{report:?}");
    let left = jobs(&*store).await;
    assert!(
        left[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("longer than"),
        "{left:?}"
    );
    let quick = Mailer {
        delay: Duration::ZERO,
        ..slow.clone()
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = Outbox::round(&*store, &quick.handlers(), &config)
        .await
        .unwrap();
    assert_eq!(report.delivered, 1, "{report:?}");
    let seen = slow.seen();
    assert_eq!(seen.len(), 1, "one downstream key across both runs");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempt_numbers, [1, 2]);
    assert_eq!(s.deliveries, 1);
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
        idem_runtime::outbox::FollowOn::new("send_receipt", &json!({"to": "a@example.com"}))
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
    Outbox::round(&*store, &mailer.handlers(), &config())
        .await
        .unwrap();
    assert_eq!(mailer.deliveries(), 1);
}

/// The store down during dispatch: nothing runs and nothing is lost while
/// it is down, and the job is delivered once when it is back. A finish whose
/// write never reached the store leaves the job leased; when the lease runs
/// out it runs again with the same downstream key, and the mailer's dedupe
/// keeps it to one delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_during_dispatch_loses_nothing() {
    use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
    use std::sync::atomic::AtomicBool;

    let inner = Arc::new(MemoryStore::new());
    let down = Arc::new(AtomicBool::new(false));
    let lost_finishes = Arc::new(AtomicUsize::new(0));
    let (is_down, finishes) = (down.clone(), lost_finishes.clone());
    let store: Arc<dyn IdempotencyStore> = Arc::new(FaultyStore::new(inner.clone(), move |call| {
        if is_down.load(Ordering::SeqCst) {
            return Fault::Unreachable;
        }
        match call {
            // The first finish never reaches the store.
            Call::FinishJob if finishes.fetch_add(1, Ordering::SeqCst) == 0 => Fault::Unreachable,
            _ => Fault::None,
        }
    }));
    let executor = Executor::new(store.clone());
    let charges = AtomicUsize::new(0);
    let answer = charge(&executor, &json!({"card": "4242"}), &charges).await;
    assert!(matches!(
        answer,
        Answer::Executed {
            recording: Recording::Stored,
            ..
        }
    ));

    down.store(true, Ordering::SeqCst);
    let mailer = Mailer::new(Duration::ZERO, 0);
    let config = OutboxConfig {
        timeout: Duration::from_millis(150),
        ..config()
    };
    let outbox = Outbox::spawn(store.clone(), mailer.handlers(), config)
        .expect("the store keeps follow-on jobs");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        mailer.seen().is_empty(),
        "nothing ran while the store was down"
    );
    assert_eq!(jobs(&*inner).await.len(), 1, "the job is still there");

    down.store(false, Ordering::SeqCst);
    wait_until("the job is finished", Duration::from_secs(10), || {
        lost_finishes.load(Ordering::SeqCst) >= 2
    })
    .await;
    outbox.stop().await;
    assert!(jobs(&*inner).await.is_empty());
    let seen = mailer.seen();
    assert_eq!(seen.len(), 1, "one downstream key: {seen:?}");
    let s = seen.values().next().unwrap();
    assert_eq!(s.attempt_numbers, [1, 2], "run again after the lost finish");
    assert_eq!(s.deliveries, 1, "delivered once");
}

/// A reconciler that finds an UNKNOWN charge performed writes its receipt
/// job with the resolution; one that declares a name twice resolves nothing
/// (the record stays UNKNOWN, asked again later) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_writes_follow_ons_with_its_resolution() {
    use idem_runtime::{
        maintenance::{reconcile, Outcome, ReconcileConfig, Reconciler, Reconciliation},
        outbox::FollowOn,
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
    let config = ReconcileConfig {
        first_backoff: Duration::ZERO,
        ..config
    };
    store
        .defer_check(&record.key, record.attempt, Duration::ZERO)
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
    Outbox::round(&*store, &mailer.handlers(), &OutboxConfig::default())
        .await
        .unwrap();
    assert_eq!(mailer.deliveries(), 1);
}
