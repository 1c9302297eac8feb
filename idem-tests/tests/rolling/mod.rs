//! A rolling deploy, as a test: a replica of an earlier version of a store
//! (each store's tests say how it is replayed, and why faithfully) and a
//! replica of this one serve one store at once, then the old one stops;
//! nothing is lost, nothing runs twice, and every reference a caller was
//! given reads true.
//!
//! Each replica runs what a server runs, through this version's executor,
//! maintenance and follow-ons over its store: calls (completed with a receipt
//! to send, replayed, declined, unknown, slow enough to send heartbeats,
//! repeated after their window), claims left by a replica that died (its
//! handler charged first, or not), the sweep, the reconciler, the purge
//! and the follow-on dispatcher. The far side is a card processor that charges once per
//! key it is given (the operation's reference) and a mailer that sends once
//! per downstream key; both count what reached them.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::follow_ons::{
    follow_on_fn, FollowOn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers, FollowOnRun,
};
use idem_runtime::maintenance::{
    Maintenance, MaintenanceConfig, Outcome, ReconcileConfig, Reconciler, Reconciliation,
};
use idem_runtime::store::{Attempt, Claim, ClaimRequest, Record, RecordState};
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    key::{IdempotencyKey, Scope},
    Caller, Executor, IdempotencyStore, Reference, ToolError,
};

/// The tenant and the tool of every call.
const TENANT: &str = "acme";
const TOOL: &str = "charge_card";
/// A call's window, unless it is one repeated after its window.
const WINDOW: Duration = Duration::from_secs(600);
/// The window of the calls repeated after it.
const SHORT_WINDOW: Duration = Duration::from_millis(300);
/// The executors' lease: a slow call heartbeats every third of it.
const LEASE: Duration = Duration::from_millis(900);
/// The lease a dead replica's claim was given.
const DEAD_LEASE: Duration = Duration::from_millis(200);

/// The card processor: one charge per key it is given, whatever repeats it;
/// it remembers which card each charge was for.
#[derive(Debug, Default)]
pub struct Processor {
    charges: Mutex<HashMap<String, String>>,
    requests: Mutex<usize>,
}

impl Processor {
    /// Charges `card` under `key` (once), and answers the charge's id.
    fn charge(&self, key: &Reference, card: &str) -> String {
        *self.requests.lock().unwrap() += 1;
        self.charges
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_insert_with(|| card.to_owned());
        charge_id(key)
    }

    /// The card charged under `key`, if any.
    fn charged(&self, key: &Reference) -> Option<String> {
        self.charges.lock().unwrap().get(&key.to_string()).cloned()
    }

    /// How many charges each card got.
    fn charges_by_card(&self) -> BTreeMap<String, usize> {
        let mut by_card = BTreeMap::new();
        for card in self.charges.lock().unwrap().values() {
            *by_card.entry(card.clone()).or_default() += 1;
        }
        by_card
    }
}

/// The charge id the processor answers for `key`.
fn charge_id(key: &Reference) -> String {
    format!("ch_{key}")
}

/// The response a completed charge stores: the handler's `String`, as JSON.
fn stored(key: &Reference) -> String {
    serde_json::to_string(&charge_id(key)).unwrap()
}

/// The mailer: sends once per downstream key, counting every request.
#[derive(Debug, Default)]
pub struct Mailer {
    requests: Mutex<BTreeMap<String, usize>>,
}

impl Mailer {
    fn send(&self, key: &str) {
        *self
            .requests
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default() += 1;
    }

    /// The downstream keys sent.
    fn sent(&self) -> BTreeSet<String> {
        self.requests.lock().unwrap().keys().cloned().collect()
    }
}

/// The receipt a charge's operation sends: its job, and the reconciler's
/// after the outcome was lost.
fn receipt(card: &str) -> FollowOn {
    FollowOn::new("receipt", &serde_json::json!({ "card": card })).unwrap()
}

/// Asks the processor by the operation's reference: charged, with the
/// receipt still to send; else not performed.
#[derive(Debug)]
struct AskTheProcessor(Arc<Processor>);

#[async_trait::async_trait]
impl Reconciler for AskTheProcessor {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match self.0.charged(&record.reference) {
            Some(card) => Reconciliation::Found(Outcome::completed_with(
                stored(&record.reference),
                vec![receipt(&card)],
            )),
            None => Reconciliation::not_performed(),
        })
    }
}

/// What the world saw: the far sides, and what each handler run and each
/// caller was told.
#[derive(Debug, Default)]
pub struct World {
    pub processor: Arc<Processor>,
    pub mailer: Arc<Mailer>,
    /// Handler runs, by card.
    runs: Mutex<BTreeMap<String, usize>>,
    /// Every reference a caller was given (or a dead replica's claim
    /// held), with its card.
    given: Mutex<BTreeMap<Reference, String>>,
}

impl World {
    fn ran(&self, card: &str) {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(card.to_owned())
            .or_default() += 1;
    }

    fn given(&self, reference: Reference, card: &str) {
        self.given
            .lock()
            .unwrap()
            .insert(reference, card.to_owned());
    }
}

/// One replica: an executor, and its maintenance and follow-on rounds, over
/// `store`.
pub struct Replica {
    pub name: &'static str,
    pub store: Arc<dyn IdempotencyStore>,
    executor: Executor,
    maintenance: MaintenanceConfig,
    handlers: FollowOnHandlers,
    /// Whether it keeps an operation for its window only
    /// ([`Replica::window_only`]).
    window_only: bool,
}

impl Replica {
    pub fn new(name: &'static str, store: Arc<dyn IdempotencyStore>, world: &World) -> Replica {
        let maintenance = MaintenanceConfig::default()
            .with_interval(Duration::from_millis(100))
            .with_batch(100)
            .with_reconciler(Arc::new(AskTheProcessor(world.processor.clone())))
            .with_reconcile(
                ReconcileConfig::default()
                    .with_settle(Duration::from_millis(300))
                    .with_first_backoff(Duration::from_millis(100))
                    .with_max_backoff(Duration::from_millis(400))
                    .with_batch(100)
                    .with_lookup_timeout(Duration::from_secs(2)),
            );
        let mailer = world.mailer.clone();
        let handlers = FollowOnHandlers::new().on(
            "receipt",
            follow_on_fn(move |run: FollowOnRun| {
                let mailer = mailer.clone();
                async move {
                    mailer.send(&run.downstream_key);
                    Ok(())
                }
            }),
        );
        Replica {
            name,
            executor: Executor::new(store.clone())
                .with_lease(LEASE)
                .with_retention(Duration::from_secs(3600))
                .with_resolver(maintenance.resolver()),
            store,
            maintenance,
            handlers,
            window_only: false,
        }
    }

    /// This replica keeps an operation for its window only, as versions
    /// before the window and the retention were two lives did: a record it
    /// completes ends with its window, and a claim of it after the window
    /// replaces the operation it finds rather than keeping it. The
    /// references of the calls repeated after their window may then read
    /// nothing.
    pub fn window_only(mut self) -> Replica {
        self.window_only = true;
        self
    }

    /// One maintenance round and one follow-on round; `Err` says what failed.
    pub async fn upkeep(&self) -> Result<(), String> {
        let round = Maintenance::round(&*self.store, &self.maintenance).await;
        let dispatcher = FollowOnConfig::default()
            .with_timeout(Duration::from_secs(2))
            .with_first_backoff(Duration::from_millis(50));
        let dispatched = FollowOnDispatcher::round(&*self.store, &self.handlers, &dispatcher).await;
        match (round.errors, dispatched) {
            (0, Ok(_)) => Ok(()),
            (errors, dispatched) => Err(format!(
                "{}: {errors} maintenance steps failed; follow-ons: {dispatched:?}",
                self.name
            )),
        }
    }

    /// A charge of `card`, which says how its handler ends: `ok` (charges,
    /// declares its receipt), `slow` (the same after 700 ms, past two
    /// heartbeats), `unknown` (charges, then times out), `lost` (times out
    /// before it charged), `declined` (refused before any effect); `short`
    /// in it gives the call a 300 ms window.
    async fn charge(&self, world: &World, card: &str) -> Answer<String, ToolError> {
        let caller = Caller::new(TENANT, "alice");
        let args = serde_json::json!({ "card": card });
        let window = if card.contains("short") {
            SHORT_WINDOW
        } else {
            WINDOW
        };
        let processor = world.processor.clone();
        let answer = self
            .executor
            .run(
                Operation {
                    caller: &caller,
                    tool: TOOL,
                    args: &args,
                    scope: ScopeSpec::Window(window),
                    status_tool: "get_operation_status",
                },
                |ctx| async move {
                    world.ran(card);
                    if card.starts_with("slow") {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                    }
                    if card.starts_with("declined") {
                        return Err(ToolError::rejected("card declined"));
                    }
                    if card.starts_with("lost") {
                        return Err(ToolError::unknown("the processor timed out"));
                    }
                    let id = processor.charge(&ctx.reference(), card);
                    if card.starts_with("unknown") {
                        return Err(ToolError::unknown("the processor timed out"));
                    }
                    idem_runtime::follow_on("receipt", &serde_json::json!({ "card": card }))
                        .unwrap();
                    Ok(id)
                },
            )
            .await;
        if let Some(reference) = answer.reference() {
            world.given(reference, card);
        }
        answer
    }

    /// What a replica that died mid-call left: its claim of a charge of
    /// `card` (a 200 ms lease), after its handler charged (`charged`) or
    /// before.
    async fn died(&self, world: &World, card: &str, charged: bool) {
        let caller = Caller::new(TENANT, "alice");
        let args = serde_json::json!({ "card": card });
        let key = IdempotencyKey::derive(&caller, TOOL, &args, &Scope::Window(WINDOW)).unwrap();
        let req = ClaimRequest {
            key,
            reference: Reference::new_operation(&key),
            tenant: TENANT.to_owned(),
            tool: TOOL.to_owned(),
            attempt: Attempt::random(),
            lease: DEAD_LEASE,
            window: WINDOW,
            retention: Duration::from_secs(3600),
        };
        // The reference the claim answered, under which its handler charged
        // (a store from before references had tags answers the key's first
        // eight bytes).
        let claim = self.store.claim(&req).await.unwrap();
        let Claim::Claimed { reference } = claim else {
            panic!("{claim:?}")
        };
        world.given(reference, card);
        if charged {
            world.ran(card);
            world.processor.charge(&reference, card);
        }
    }
}

/// What the callers of one phase do on `replica`, at once.
async fn calls(replica: &Replica, world: &World, cards: &[&str]) -> Vec<Answer<String, ToolError>> {
    futures::future::join_all(cards.iter().map(|card| replica.charge(world, card))).await
}

fn names(answers: &[Answer<String, ToolError>]) -> Vec<&'static str> {
    answers.iter().map(|a| a.name()).collect()
}

/// Runs the deploy: `old` alone; then this version's replica starts
/// (`start_new`: a store's migration, if it has one); `old` and it at once;
/// then it alone; checks the end (see the module's notes).
pub async fn rolling_deploy(
    old: Replica,
    start_new: impl std::future::Future<Output = Replica>,
    world: Arc<World>,
) {
    let window_only = old.window_only;
    // The old version alone.
    let first = calls(
        &old,
        &world,
        &[
            "ok-1",
            "ok-2",
            "unknown-1",
            "lost-1",
            "declined-1",
            "slow-1",
            "short-1",
        ],
    )
    .await;
    assert_eq!(
        names(&first),
        [
            "executed",
            "executed",
            "failed_unknown",
            "failed_unknown",
            "rejected",
            "executed",
            "executed"
        ],
        "{first:?}"
    );
    old.died(&world, "died-1", true).await;
    old.died(&world, "died-2", false).await;
    let new = start_new.await;

    // Both at once: each replica's upkeep every 100 ms, while the callers
    // go to either.
    let stop = tokio::sync::watch::channel(false);
    let callers = async {
        let (on_new, on_old) = tokio::join!(
            calls(
                &new,
                &world,
                &[
                    "ok-1",
                    "ok-2",
                    "ok-3",
                    "unknown-2",
                    "lost-2",
                    "slow-2",
                    "short-2"
                ]
            ),
            calls(&old, &world, &["ok-4", "ok-5", "unknown-3", "declined-2"]),
        );
        assert_eq!(
            names(&on_new),
            [
                "replayed",
                "replayed",
                "executed",
                "failed_unknown",
                "failed_unknown",
                "executed",
                "executed"
            ],
            "{on_new:?}"
        );
        assert_eq!(
            names(&on_old),
            ["executed", "executed", "failed_unknown", "rejected"],
            "{on_old:?}"
        );
        new.died(&world, "died-3", true).await;
        new.died(&world, "died-4", false).await;
        old.died(&world, "died-5", true).await;
        // Each replica's calls repeated on the other, and the short ones
        // after their window, each on the other replica (a new operation,
        // the first one kept).
        let (on_new, on_old) = tokio::join!(
            calls(&new, &world, &["ok-4", "ok-5", "short-1"]),
            calls(&old, &world, &["ok-3", "slow-2", "ok-1", "short-2"]),
        );
        assert_eq!(
            names(&on_new),
            ["replayed", "replayed", "executed"],
            "{on_new:?}"
        );
        assert_eq!(
            names(&on_old),
            ["replayed", "replayed", "replayed", "executed"],
            "{on_old:?}"
        );
        // Long enough for the sweep and the reconciler on both.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Repeats of what the reconcilers settled, on both.
        let settled = ["unknown-1", "died-1", "unknown-3", "died-5"];
        let (on_new, on_old) =
            tokio::join!(calls(&new, &world, &settled), calls(&old, &world, &settled));
        for answer in on_new.iter().chain(&on_old) {
            assert!(
                ["replayed", "in_progress", "unknown"].contains(&answer.name()),
                "{answer:?}"
            );
        }
        // The old replica's last call, cut short as it stops: only the new
        // one is left to find it.
        old.died(&world, "died-6", true).await;
        let _ = stop.0.send(true);
    };
    let (old_failed, new_failed, ()) = tokio::join!(
        upkeep(&old, stop.1.clone()),
        upkeep(&new, stop.1.clone()),
        callers
    );
    assert!(old_failed.is_empty(), "{old_failed:#?}");
    assert!(new_failed.is_empty(), "{new_failed:#?}");

    // The old version stops; the new one alone, until nothing is left to
    // do (each call settled, each receipt sent), at most 10 s.
    drop(old);
    let started = tokio::time::Instant::now();
    loop {
        new.upkeep().await.unwrap();
        let open = open_operations(&new, &world).await;
        let unsent = unsent_receipts(&new, &world).await;
        if open.is_empty() && unsent.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still open: {open:?}; receipts not sent: {unsent:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Nothing ran twice: one handler run per operation, one charge each.
    let runs = world.runs.lock().unwrap().clone();
    for (card, n) in &runs {
        let operations = if card.contains("short") { 2 } else { 1 };
        assert_eq!(*n, operations, "{card} ran {n} times: {runs:?}");
    }
    for (card, charges) in world.processor.charges_by_card() {
        let operations = if card.contains("short") { 2 } else { 1 };
        assert_eq!(charges, operations, "{card}");
    }
    // Every reference reads true, on the new version: what the processor
    // charged under it is COMPLETED with the charge; what it did not charge
    // is NOT_PERFORMED, or gone when it was declined.
    let given = world.given.lock().unwrap().clone();
    for (reference, card) in &given {
        let found = new.store.lookup(TENANT, reference).await.unwrap();
        let state = found.as_ref().map(|r| r.state.clone());
        match world.processor.charged(reference) {
            // Kept by the old replica for its window only, which has
            // ended.
            Some(_) if window_only && card.contains("short") && state.is_none() => {}
            Some(_) => assert_eq!(
                state,
                Some(RecordState::Completed {
                    response: stored(reference)
                }),
                "{card} ({reference})"
            ),
            None if card.starts_with("declined") => assert_eq!(state, None, "{card}"),
            None => assert!(
                matches!(state, Some(RecordState::NotPerformed { .. })),
                "{card} ({reference}): {state:?}"
            ),
        }
    }
    // Nothing lost: each charge's receipt sent, and nothing else.
    let charged: BTreeSet<String> = given
        .keys()
        .filter(|r| world.processor.charged(r).is_some())
        .map(|r| format!("{r}:receipt"))
        .collect();
    assert_eq!(world.mailer.sent(), charged);
    assert_eq!(charged.len(), 18, "{charged:?}");
}

/// `replica`'s maintenance and follow-on rounds, every 100 ms until `stopped`:
/// what failed.
async fn upkeep(replica: &Replica, mut stopped: tokio::sync::watch::Receiver<bool>) -> Vec<String> {
    let mut failures = Vec::new();
    loop {
        if let Err(e) = replica.upkeep().await {
            failures.push(e);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stopped.changed() => return failures,
        }
    }
}

/// The references given whose record is still IN_PROGRESS or UNKNOWN.
async fn open_operations(replica: &Replica, world: &World) -> Vec<String> {
    let given = world.given.lock().unwrap().clone();
    let mut open = Vec::new();
    for (reference, card) in given {
        let record = replica.store.lookup(TENANT, &reference).await.unwrap();
        if let Some(record) = record {
            if matches!(
                record.state,
                RecordState::InProgress | RecordState::Unknown { .. }
            ) {
                open.push(format!("{card} {:?}", record.state.kind()));
            }
        }
    }
    open
}

/// The receipts of the charges that the mailer has not been sent.
async fn unsent_receipts(_replica: &Replica, world: &World) -> Vec<String> {
    let given = world.given.lock().unwrap().clone();
    let sent = world.mailer.sent();
    given
        .iter()
        .filter(|(r, _)| world.processor.charged(r).is_some())
        .map(|(r, card)| (format!("{r}:receipt"), card))
        .filter(|(key, _)| !sent.contains(key))
        .map(|(_, card)| card.clone())
        .collect()
}
