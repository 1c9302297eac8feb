//! What a store cannot hold, on every store: a response over the store's
//! declared limit ([`Limits::max_response_bytes`]) and follow-on
//! jobs over its byte total per completion
//! ([`Limits::max_follow_on_bytes_per_completion`]). A response that
//! cannot be stored still reaches its caller (the effect happened), and the
//! record reads UNKNOWN with a note that says why, never IN_PROGRESS until
//! the sweep calls the process dead; jobs past the total are refused at
//! their declaration, while the handler can still act.
//!
//! A store whose limit is on one item, every field counted
//! ([`Limits::item`], DynamoDB's 400 KB), has each write
//! judged as the item it makes: a claim whose tenant leaves too little room
//! is refused before its handler runs, a response is judged beside its
//! record's tenant and tool, and a job against its own item at its
//! declaration.
//!
//! On MemoryStore and SqliteStore behind a wrapper that declares small
//! limits; the stores' own limits are checked as declared.

mod durable;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::follow_ons::{FollowOn, FollowOns};
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore,
    Inspect, ItemLimit, Limits, Record, RecordFilter, RecordState, Resolution, StateCounts, Upkeep,
};
use idem_runtime::{
    answer::{Answer, Recording},
    async_trait,
    executor::{Operation, ScopeSpec},
    key::IdempotencyKey,
    Caller, Executor, IdempotencyStore, MemoryStore, Reference, SqliteStore, StoreError, ToolError,
};

/// `inner`, declaring `response` bytes as its largest response,
/// `follow_on_bytes` as its most follow-on payload bytes per completion and
/// `item` as its limit on one item; with `refuse`, every completion is
/// refused as invalid (as DynamoDB refuses an item over 400 KB), nothing
/// written.
#[derive(Debug)]
struct Limited<S> {
    inner: S,
    response: usize,
    follow_on_bytes: usize,
    item: Option<ItemLimit>,
    refuse: bool,
    /// Holds every `mark_unknown` until it is opened, and counts those
    /// that arrived.
    marks: Option<Arc<MarkGate>>,
}

/// A gate on a store's UNKNOWN marks: each waits until `open`.
#[derive(Debug, Default)]
struct MarkGate {
    arrived: AtomicUsize,
    open: tokio::sync::Notify,
}

impl<S> Limited<S> {
    fn new(inner: S) -> Self {
        Limited {
            inner,
            response: 1000,
            follow_on_bytes: 1000,
            item: None,
            refuse: false,
            marks: None,
        }
    }

    /// `inner` with an item of 10,000 bytes, of which a record's other
    /// fields take 500 and a job's 500, and no other limit.
    fn by_item(inner: S) -> Self {
        Limited {
            response: usize::MAX,
            follow_on_bytes: usize::MAX,
            item: Some(ItemLimit::new(10_000, 500, 500)),
            ..Limited::new(inner)
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
        if let Some(gate) = &self.marks {
            let opened = gate.open.notified();
            gate.arrived.fetch_add(1, Ordering::SeqCst);
            opened.await;
        }
        self.inner.mark_unknown(key, attempt, note).await
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
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }

    fn limits(&self) -> Limits {
        let mut limits = self.inner.limits();
        limits.max_response_bytes = Some(self.response);
        limits.max_follow_on_bytes_per_completion = Some(self.follow_on_bytes);
        limits.item = self.item;
        limits
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: FollowOnStore> Upkeep for Limited<S> {
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
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(batch).await
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
impl<S: FollowOnStore> Inspect for Limited<S> {
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
    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        self.inner
            .lease_follow_ons(names, limit, lease, attempt)
            .await
    }
    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        self.inner.finish_follow_on(id, attempt).await
    }
    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.inner.retry_follow_on(id, attempt, delay, error).await
    }
    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        self.inner.bury_follow_on(id, attempt, error).await
    }
    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        self.inner.list_follow_ons(filter).await
    }
    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        self.inner.redrive_follow_on(id).await
    }
    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.inner.count_due_follow_ons().await
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

/// The record of `reference` once it has left IN_PROGRESS (a write in the
/// background lands in its own task), or as it reads after two seconds.
async fn record_once_settled(store: &dyn IdempotencyStore, reference: Reference) -> Record {
    let mut read = record(store, reference).await;
    for _ in 0..200 {
        if !matches!(read.state, RecordState::InProgress) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        read = record(store, reference).await;
    }
    read
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
    let read = record_once_settled(&*store, reference).await;
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

/// A completion written in the background and refused: from the moment
/// the write is refused, a repeat is never answered with the response as
/// if it were stored, even while the UNKNOWN mark is still on its way (the
/// record still reads IN_PROGRESS then: the repeat is told so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_background_completion_is_never_replayed() {
    let gate = Arc::new(MarkGate::default());
    let store = Arc::new(Limited {
        refuse: true,
        marks: Some(gate.clone()),
        ..Limited::new(MemoryStore::new())
    });
    let exec = Executor::new(store.clone()).with_background_completions(true);
    let processor = Processor::default();
    let first = charge(&exec, &processor, 100).await;
    assert!(
        matches!(
            first,
            Answer::Executed {
                recording: Recording::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    // The write was refused and its mark is held at the store.
    for _ in 0..500 {
        if gate.arrived.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gate.arrived.load(Ordering::SeqCst), 1, "the mark was sent");
    let meanwhile = charge(&exec, &processor, 100).await;
    assert!(
        matches!(meanwhile, Answer::InProgress { .. }),
        "a repeat while the mark is on its way: {meanwhile:?}"
    );
    gate.open.notify_waiters();
    let reference = first.reference().expect("a reference");
    let read = record_once_settled(&*store, reference).await;
    assert!(
        matches!(read.state, RecordState::Unknown { .. }),
        "{read:?}"
    );
    let after = charge(&exec, &processor, 100).await;
    assert!(matches!(after, Answer::Unknown { .. }), "{after:?}");
    assert_eq!(processor.count(), 1, "charged once");
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
        .list_follow_ons(&FollowOnFilter {
            reference: Some(reference),
            ..FollowOnFilter::default()
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
    assert_eq!(memory.limits(), Limits::NONE);
    let dir = durable::temp_dir("limits-declared");
    let sqlite = sqlite(&dir).unwrap();
    assert_eq!(sqlite.limits().max_response_bytes, Some(999_000_000));
    assert_eq!(sqlite.limits().max_follow_on_bytes_per_completion, None);
    // Forwarded by a shared store.
    let shared: Arc<dyn FollowOnStore> = Arc::new(Limited::new(MemoryStore::new()));
    assert_eq!(shared.limits().max_response_bytes, Some(1000));
    assert_eq!(
        shared.limits().max_follow_on_bytes_per_completion,
        Some(1000)
    );
}

/// A call of `charge_card` by a caller of `tenant` whose handler counts
/// its charges and answers `size` bytes of JSON text.
async fn charge_as(
    exec: &Executor,
    tenant: &str,
    processor: &Processor,
    size: usize,
) -> Answer<String, ToolError> {
    let caller = Caller::new(tenant, "alice");
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

/// A tenant id that leaves the record less than 4 KiB of its item for its
/// notes (6,000 bytes of 10,000, with 500 for the record's other fields):
/// the call is answered store_misconfigured before the handler runs, and
/// nothing is written.
async fn a_long_tenant_is_refused_before_the_handler(store: Arc<dyn IdempotencyStore>) {
    let exec = Executor::new(store.clone());
    let processor = Processor::default();
    let tenant = "t".repeat(6_000);
    let answer = charge_as(&exec, &tenant, &processor, 100).await;
    // The server's to fix, not the caller's: misconfigured, with the
    // reason for the operator.
    let Answer::StoreMisconfigured { error } = &answer else {
        panic!("refused before the handler, not {}", answer.name());
    };
    let reason = error.to_string();
    assert!(
        reason.contains("tenant id (6000 bytes) and tool name (11 bytes) are too long")
            && reason.contains("at most 5404 of them"),
        "{reason}"
    );
    assert_eq!(processor.count(), 0, "the handler never ran");
    let filter = RecordFilter {
        limit: usize::MAX,
        ..RecordFilter::default()
    };
    assert!(store.list_records(&filter).await.unwrap().is_empty());
    // 5,393 bytes of tenant id leave the notes their 4 KiB: it runs.
    let answer = charge_as(&exec, &"t".repeat(5_393), &processor, 100).await;
    assert_eq!(answer.name(), "executed");
    assert_eq!(processor.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_too_long_for_the_item_is_refused_before_the_handler_runs() {
    let dir = durable::temp_dir("limits-item-tenant");
    a_long_tenant_is_refused_before_the_handler(Arc::new(Limited::by_item(MemoryStore::new())))
        .await;
    a_long_tenant_is_refused_before_the_handler(Arc::new(Limited::by_item(sqlite(&dir).unwrap())))
        .await;
}

/// A response of 7,000 bytes fits a record of tenant `acme` (9,485 bytes
/// left), not one of a 3,000-byte tenant id (6,489 left): the second is
/// judged against its own record and never written, the caller gets its
/// result, and the record reads UNKNOWN with the room it had.
async fn a_response_is_judged_beside_its_tenant(store: Arc<dyn IdempotencyStore>) {
    let exec = Executor::new(store.clone());
    let processor = Processor::default();
    let answer = charge_as(&exec, "acme", &processor, 7_000).await;
    assert!(
        matches!(
            answer,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{}",
        answer.name()
    );
    let tenant = "t".repeat(3_000);
    let answer = charge_as(&exec, &tenant, &processor, 7_000).await;
    let Answer::Executed {
        reference,
        recording: Recording::Failed,
        ..
    } = answer
    else {
        panic!("the result, not stored: {}", answer.name());
    };
    let read = store.lookup(&tenant, &reference).await.unwrap().unwrap();
    let RecordState::Unknown { note } = &read.state else {
        panic!("UNKNOWN: {:?}", read.state.kind());
    };
    assert!(
        note.starts_with(
            "the response could not be stored: 7000 bytes, over the store's limit of 6489 bytes; "
        ),
        "{note}"
    );
    assert_eq!(processor.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_judged_against_its_own_record() {
    let dir = durable::temp_dir("limits-item-response");
    a_response_is_judged_beside_its_tenant(Arc::new(Limited::by_item(MemoryStore::new()))).await;
    a_response_is_judged_beside_its_tenant(Arc::new(Limited::by_item(sqlite(&dir).unwrap()))).await;
}

/// A job whose payload its own item cannot hold (6,000 bytes; the item
/// leaves 5,393 beside the tenant `acme`, the name `archive`, the job's
/// other fields and its two error texts of 2,048 bytes) is refused at its
/// declaration, while the handler can still act; the job that fits is
/// written with the completion.
async fn a_large_job_is_refused_at_declaration(store: Arc<dyn IdempotencyStore>) {
    let exec = Executor::new(store.clone()).with_max_follow_on_payload(1 << 20);
    let processor = Processor::default();
    let caller = Caller::new("acme", "alice");
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
            let mut refused = Vec::new();
            for (name, size) in [("archive", 6_000), ("notify", 100)] {
                if let Err(e) = idem_runtime::follow_on(name, &"x".repeat(size - 2)) {
                    refused.push(format!("{e:?}|{e}"));
                }
            }
            p.charges.fetch_add(1, Ordering::SeqCst);
            Ok(refused)
        })
        .await;
    let Answer::Executed {
        value: refused,
        reference,
        recording: Recording::Stored,
    } = answer
    else {
        panic!("executed and stored, not {}", answer.name());
    };
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0]
            .starts_with(r#"ItemTooLarge { name: "archive", size: 6000, limit: 5393, store: "#),
        "{refused:?}"
    );
    assert_eq!(processor.count(), 1);
    let jobs = store
        .follow_ons()
        .unwrap()
        .list_follow_ons(&FollowOnFilter {
            reference: Some(reference),
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    let names: Vec<&str> = jobs.iter().map(|j| j.id.name.as_str()).collect();
    assert_eq!(names, ["notify"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_large_for_its_item_is_refused_at_declaration() {
    let dir = durable::temp_dir("limits-item-job");
    a_large_job_is_refused_at_declaration(Arc::new(Limited::by_item(MemoryStore::new()))).await;
    a_large_job_is_refused_at_declaration(Arc::new(Limited::by_item(sqlite(&dir).unwrap()))).await;
}

/// A resolution is judged against its record too: its tenant, its tool
/// and the resolution note it is written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_is_judged_against_its_own_record() {
    let store = Limited::by_item(MemoryStore::new());
    let mut req = idem_runtime::store::conformance::claim_request(Duration::from_secs(900));
    req.tenant = "t".repeat(3_000);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&req.key, req.attempt, "the processor timed out")
        .await
        .unwrap();
    let resolve = |size: usize| {
        let (store, req) = (&store, &req);
        async move {
            let outcome = idem_runtime::maintenance::Outcome::Completed {
                response: format!("\"{}\"", "x".repeat(size - 2)),
                follow_ons: Vec::new(),
            };
            idem_runtime::maintenance::resolve_by_hand(
                store,
                &req.tenant,
                &req.reference,
                &outcome,
                "checked the processor",
            )
            .await
        }
    };
    // 10,000 - 500 - 3,000 - the tool - the note's 21 bytes.
    let room = 10_000 - 500 - 3_000 - req.tool.len() - "checked the processor".len();
    let refused = resolve(room + 1).await.unwrap_err().to_string();
    assert!(
        refused.contains(&format!(
            "{} bytes, over the memory store's limit of {room} bytes",
            room + 1
        )),
        "{refused}"
    );
    let read = store
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(read.state, RecordState::Unknown { .. }));
    resolve(room).await.unwrap();
    let read = store
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(read.state, RecordState::Completed { .. }));
}
