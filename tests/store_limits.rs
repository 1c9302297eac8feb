//! What a store cannot hold, on every store: a response over the store's
//! declared limit ([`IdempotencyStore::max_response_bytes`]) and follow-on
//! jobs over its byte total per completion
//! ([`FollowOnStore::max_follow_on_bytes_per_completion`]). A response that
//! cannot be stored still reaches its caller (the effect happened), and the
//! record reads UNKNOWN with a note that says why, never IN_PROGRESS until
//! the sweep calls the process dead; jobs past the total are refused at
//! their declaration, while the handler can still act.
//!
//! On MemoryStore and SqliteStore behind a wrapper that declares small
//! limits; the stores' own limits are checked as declared.

mod durable;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::outbox::{FollowOn, FollowOns};
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnStore, Job, JobFilter, JobId, Record, RecordFilter,
    RecordState, Resolution, StateCounts,
};
use idem_runtime::{
    async_trait, Answer, Caller, Executor, IdempotencyKey, IdempotencyStore, MemoryStore,
    Operation, Recording, Reference, ScopeSpec, SqliteStore, StoreError, ToolError,
};

/// `inner`, declaring `response` bytes as its largest response and
/// `job_bytes` as its most follow-on payload bytes per completion; with
/// `refuse`, every completion is refused as invalid (as DynamoDB refuses an
/// item over 400 KB), nothing written.
#[derive(Debug)]
struct Limited<S> {
    inner: S,
    response: usize,
    job_bytes: usize,
    refuse: bool,
}

impl<S> Limited<S> {
    fn new(inner: S) -> Self {
        Limited {
            inner,
            response: 1000,
            job_bytes: 1000,
            refuse: false,
        }
    }

    fn refused(&self) -> Result<(), StoreError> {
        match self.refuse {
            true => Err(StoreError::Invalid(
                "the store refused the item: Item size has exceeded the maximum allowed size"
                    .to_owned(),
            )),
            false => Ok(()),
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: FollowOnStore> IdempotencyStore for Limited<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.refused()?;
        self.inner.complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.inner.release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.inner.mark_unknown(key, attempt, note).await
    }
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
        self.inner.take_check(key, attempt, hold).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.lookup(tenant, reference).await
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
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.inner.list_records(filter).await
    }
    async fn find_by_reference(
        &self,
        reference: &idem_runtime::Reference,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.find_by_reference(reference).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.inner.count_records().await
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
    fn max_response_bytes(&self) -> Option<usize> {
        Some(self.response)
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: FollowOnStore> FollowOnStore for Limited<S> {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.refused()?;
        self.inner
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
        self.inner
            .resolve_with_follow_ons(key, attempt, response, note, jobs)
            .await
    }
    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<Job>, StoreError> {
        self.inner.lease_jobs(names, limit, lease, attempt).await
    }
    async fn finish_job(&self, id: &JobId, attempt: Attempt) -> Result<(), StoreError> {
        self.inner.finish_job(id, attempt).await
    }
    async fn retry_job(
        &self,
        id: &JobId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.inner.retry_job(id, attempt, delay, error).await
    }
    async fn bury_job(&self, id: &JobId, attempt: Attempt, error: &str) -> Result<(), StoreError> {
        self.inner.bury_job(id, attempt, error).await
    }
    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        self.inner.list_jobs(filter).await
    }
    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        self.inner.redrive_job(id).await
    }
    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.inner.count_due_jobs().await
    }
    fn max_follow_ons_per_completion(&self) -> Option<usize> {
        self.inner.max_follow_ons_per_completion()
    }
    fn max_follow_on_bytes_per_completion(&self) -> Option<usize> {
        Some(self.job_bytes)
    }
}

const STATUS_TOOL: &str = "get_operation_status";

/// A processor stand-in that counts its charges.
#[derive(Clone, Default)]
struct Processor {
    charges: Arc<AtomicUsize>,
}

impl Processor {
    fn count(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// A charge whose response is `size` bytes of JSON text (a string of
/// `size - 2` characters and its quotes).
async fn charge(exec: &Executor, processor: &Processor, size: usize) -> Answer<String, ToolError> {
    let caller = alice();
    let args = serde_json::json!({"cents": 500, "size": size});
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    let processor = processor.clone();
    exec.run(op, move |_| async move {
        processor.charges.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ToolError>("x".repeat(size - 2))
    })
    .await
}

/// The record of `reference`, in alice's tenant.
async fn record(store: &dyn IdempotencyStore, reference: Reference) -> Record {
    store
        .lookup(alice().tenant(), &reference)
        .await
        .unwrap()
        .expect("the record reads")
}

/// A response the store cannot hold (`store` declares 1000 bytes, or
/// refuses the completion): the caller gets its result, recording Failed;
/// the record reads UNKNOWN with a note starting `expected`; a repeat is
/// told the outcome is unknown with the same note; one charge.
async fn an_unstorable_response_reads_unknown(
    store: Arc<dyn IdempotencyStore>,
    background: bool,
    size: usize,
    expected: &str,
) {
    let exec = Executor::new(store.clone()).with_background_completions(background);
    let processor = Processor::default();
    let answer = charge(&exec, &processor, size).await;
    let reference = match answer {
        Answer::Executed {
            value,
            reference,
            recording,
        } => {
            assert_eq!(value.len(), size - 2, "the caller gets its real result");
            // A write in the background is refused after the answer; a
            // response over the declared limit is never sent to it.
            let refused_after_the_answer = background && expected == REFUSED;
            let told = match refused_after_the_answer {
                true => Recording::Pending,
                false => Recording::Failed,
            };
            assert_eq!(recording, told);
            reference
        }
        other => panic!("expected Executed, got {other:?}"),
    };
    // A background write (when the store refuses it) lands in its own task.
    let mut read = record(&*store, reference).await;
    for _ in 0..200 {
        if !matches!(read.state, RecordState::InProgress) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        read = record(&*store, reference).await;
    }
    let note = match &read.state {
        RecordState::Unknown { note } => note.clone(),
        other => panic!("expected UNKNOWN, got {other:?}"),
    };
    assert!(note.starts_with(expected), "{note}");
    assert!(!note.contains("may have died"), "{note}");

    let repeat = charge(&exec, &processor, size).await;
    match repeat {
        Answer::Unknown {
            reference: told,
            note: repeated,
            ..
        } => {
            assert_eq!(told, reference);
            assert_eq!(repeated, note);
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(processor.count(), 1, "charged once");
    let status = exec
        .status(&alice(), &reference.to_string())
        .await
        .unwrap()
        .expect("the status reads");
    assert!(
        format!("{status:?}").contains("the response could not be stored"),
        "{status:?}"
    );
}

const OVER_LIMIT: &str =
    "the response could not be stored: 2000 bytes, over the store's limit of 1000 bytes; ";
const REFUSED: &str = "the response could not be stored: the store refused the item";

fn sqlite(dir: &durable::TempDir) -> Result<SqliteStore, StoreError> {
    let path = dir.join("idem.sqlite3");
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(SqliteStore::open(&path))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_limit_reads_unknown_on_memory() {
    for background in [false, true] {
        let store = Arc::new(Limited::new(MemoryStore::new()));
        an_unstorable_response_reads_unknown(store, background, 2000, OVER_LIMIT).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_limit_reads_unknown_on_sqlite() {
    for background in [false, true] {
        let dir = durable::temp_dir("limits-response");
        let store = Arc::new(Limited::new(sqlite(&dir).unwrap()));
        an_unstorable_response_reads_unknown(store, background, 2000, OVER_LIMIT).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_as_invalid_reads_unknown() {
    for background in [false, true] {
        let dir = durable::temp_dir("limits-refused");
        let stores: [Arc<dyn IdempotencyStore>; 2] = [
            Arc::new(Limited {
                refuse: true,
                ..Limited::new(MemoryStore::new())
            }),
            Arc::new(Limited {
                refuse: true,
                ..Limited::new(sqlite(&dir).unwrap())
            }),
        ];
        for store in stores {
            an_unstorable_response_reads_unknown(store, background, 100, REFUSED).await;
        }
    }
}

/// A response at the limit is stored and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_at_the_limit_is_stored() {
    let store = Arc::new(Limited::new(MemoryStore::new()));
    let exec = Executor::new(store.clone());
    let processor = Processor::default();
    let answer = charge(&exec, &processor, 1000).await;
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
    let repeat = charge(&exec, &processor, 1000).await;
    assert!(matches!(repeat, Answer::Replayed { .. }), "{repeat:?}");
    assert_eq!(processor.count(), 1);
}

/// Jobs past the store's byte total are refused at their declaration,
/// before the handler acts; the ones that fit are written with the
/// completion.
async fn jobs_past_the_total_are_refused_at_declaration(store: Arc<dyn IdempotencyStore>) {
    let exec = Executor::new(store.clone());
    let processor = Processor::default();
    let caller = alice();
    let args = serde_json::json!({"cents": 500});
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    let p = processor.clone();
    let answer: Answer<Vec<String>, ToolError> = exec
        .run(op, move |_| async move {
            // Three 402-byte payloads against a total of 1000 bytes.
            let mut refused = Vec::new();
            for name in ["receipt", "ledger", "warehouse"] {
                if let Err(e) = idem_runtime::follow_on(name, &"x".repeat(400)) {
                    refused.push(format!("{e:?}|{e}"));
                }
            }
            // The handler still acts, knowing what was refused.
            p.charges.fetch_add(1, Ordering::SeqCst);
            Ok(refused)
        })
        .await;
    let (refused, reference) = match answer {
        Answer::Executed {
            value,
            reference,
            recording: Recording::Stored,
        } => (value, reference),
        other => panic!("expected Executed and stored, got {other:?}"),
    };
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].starts_with(r#"TooMuch { name: "warehouse", total: 1206, limit: 1000"#),
        "{refused:?}"
    );
    assert!(refused[0].contains("1206 bytes"), "{refused:?}");
    assert_eq!(processor.count(), 1);
    assert!(matches!(
        record(&*store, reference).await.state,
        RecordState::Completed { .. }
    ));
    let jobs = store
        .follow_ons()
        .unwrap()
        .list_jobs(&JobFilter {
            reference: Some(reference),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    let mut names: Vec<&str> = jobs.iter().map(|j| j.id.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["ledger", "receipt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_the_byte_total_are_refused_at_declaration() {
    let dir = durable::temp_dir("limits-jobs");
    jobs_past_the_total_are_refused_at_declaration(Arc::new(Limited::new(MemoryStore::new())))
        .await;
    jobs_past_the_total_are_refused_at_declaration(Arc::new(Limited::new(sqlite(&dir).unwrap())))
        .await;
}

/// A resolution (the reconciler's, an operator's) past the limits is
/// refused as invalid before the store is asked, and the record stays
/// UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_past_the_limits_is_refused() {
    let store = Limited::new(MemoryStore::new());
    let req = idem_runtime::store::conformance::claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&req.key, req.attempt, "the processor timed out")
        .await
        .unwrap();
    let big = format!("\"{}\"", "x".repeat(2000));
    let resolved = idem_runtime::maintenance::resolve_by_hand(
        &store,
        &req.tenant,
        &req.reference,
        &idem_runtime::maintenance::Outcome::Completed {
            response: big,
            follow_ons: Vec::new(),
        },
        "checked the processor",
    )
    .await;
    let refused = resolved.unwrap_err().to_string();
    assert!(
        refused.contains("2002 bytes, over the memory store's limit of 1000 bytes"),
        "{refused}"
    );
    let jobs: Vec<FollowOn> = (0..3)
        .map(|i| FollowOn::new(&format!("job{i}"), &"x".repeat(400)).unwrap())
        .collect();
    let resolved = idem_runtime::maintenance::resolve_by_hand(
        &store,
        &req.tenant,
        &req.reference,
        &idem_runtime::maintenance::Outcome::Completed {
            response: "\"ok\"".to_owned(),
            follow_ons: jobs,
        },
        "checked the processor",
    )
    .await;
    let refused = resolved.unwrap_err().to_string();
    assert!(refused.contains("1206 bytes of payload"), "{refused}");
    let read = store
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(read.state, RecordState::Unknown { .. }),
        "{read:?}"
    );
}

/// What each store declares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_declare_their_limits() {
    let memory = MemoryStore::new();
    assert_eq!(memory.max_response_bytes(), None);
    assert_eq!(memory.max_follow_on_bytes_per_completion(), None);
    let dir = durable::temp_dir("limits-declared");
    let sqlite = sqlite(&dir).unwrap();
    assert_eq!(sqlite.max_response_bytes(), Some(999_000_000));
    assert_eq!(sqlite.max_follow_on_bytes_per_completion(), None);
    // Forwarded by a shared store.
    let shared: Arc<dyn FollowOnStore> = Arc::new(Limited::new(MemoryStore::new()));
    assert_eq!(shared.max_response_bytes(), Some(1000));
    assert_eq!(shared.max_follow_on_bytes_per_completion(), Some(1000));
}
