//! Claim, execute, record.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::answer::{note, Answer, Classify, Disposition, Recording, Resolver, StatusReport};
use crate::follow_ons::{Declared, DECLARED};
use crate::key::{is_empty_business_key, Caller, IdempotencyKey, Reference, Scope};
use crate::store::{
    complete_with_follow_ons, Attempt, ClaimRequest, IdempotencyStore, Room, StoreError,
    DEFAULT_MAX_PAYLOAD,
};
use crate::telemetry::{self, Step};

mod background;
mod claim;
mod client_keys;
mod context;
mod from_record;
mod guard;
mod pace;
mod replay_cache;
mod running;
// Used by the rmcp glue only.
#[cfg_attr(not(feature = "rmcp"), allow(dead_code, unused_imports))]
mod detached;
mod execute;
mod tool_scopes;

use crate::future::{panic_message, CatchUnwind};
use background::{Background, Completion};
use claim::{Claimed, Won};
pub(crate) use context::CURRENT_REFERENCE;
pub use context::{current_reference, OperationContext};
pub use detached::TaskCancellation;
#[cfg(feature = "rmcp")]
pub(crate) use detached::{TaskClaim, REJECTED_RESOLUTION};
use from_record::{existing, keep_replay, replay};
use guard::{mark, mark_refused, UnknownOnDrop};
use pace::ToolDurations;
use replay_cache::Replays;
use running::{Found, RunningClaims};
use tool_scopes::ToolScopes;
pub use tool_scopes::{ConfigError, MAX_TOOL_WINDOW};

/// The default lease: how long a claim holds without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default retention of a business-key record, and of any record whose
/// outcome is unknown.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(48 * 3600);
/// The default retention of a client key: how long the same key with the
/// same arguments is one operation, counted from its claim.
pub const DEFAULT_CLIENT_KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What makes two calls the same operation, as a tool declares it. The
/// executor turns it into a [`Scope`] once it has the serialized arguments.
#[derive(Clone, Copy, Debug)]
pub enum ScopeSpec<'a> {
    /// A sliding window over the caller and the canonical arguments.
    Window(Duration),
    /// A business key: these argument fields (one field is keyed by its value,
    /// several by an object of them). `retention` defaults to 48 h.
    BusinessKey {
        /// The argument fields that form the business key.
        fields: &'a [&'a str],
        /// How long the record is kept.
        retention: Option<Duration>,
    },
    /// A key the client sent outside the arguments (MCP:
    /// `_meta["idem/idempotency-key"]` or the `Idempotency-Key` header), for
    /// a tool whose scope is otherwise `window`. Per caller, the same key
    /// and arguments are one operation for the key's retention
    /// ([`Executor::with_client_key_retention`], 24 h by default, and never
    /// less than `window`); the same key with other arguments is a conflict
    /// ([`Answer::ClientKeyConflict`]); another key is another operation,
    /// even inside the window. An invalid key (not 1 to 255 visible ASCII
    /// characters) is refused before anything runs.
    ClientKey {
        /// The client's key, as sent.
        key: &'a str,
        /// The tool's window: identical arguments under another key inside
        /// it are counted and logged (a host that sends a fresh key per
        /// retry), never merged.
        window: Duration,
    },
}

/// A business key's `(field, value)` pairs, taken by the caller from the
/// typed arguments, or `None` to read the fields from the JSON arguments.
pub(crate) type Keyed<'a> = Option<&'a [(&'a str, serde_json::Value)]>;

/// One call to run as an operation.
#[derive(Debug)]
pub struct Operation<'a, A: ?Sized> {
    /// The authenticated caller.
    pub caller: &'a Caller,
    /// The tool's name.
    pub tool: &'a str,
    /// The typed arguments, after deserialization (defaults filled in,
    /// unknown fields dropped).
    pub args: &'a A,
    /// The scope.
    pub scope: ScopeSpec<'a>,
    /// The tool a model calls with a reference to learn an operation's fate.
    pub status_tool: &'a str,
}

/// Runs operations against a store: claim before the side effect, record the
/// outcome after it, answer repeats from the record.
#[derive(Clone, Debug)]
pub struct Executor {
    store: Arc<dyn IdempotencyStore>,
    lease: Duration,
    retention: Duration,
    /// The cancellation signals of the handlers it runs as MCP tasks.
    tasks: Arc<detached::TaskSignals>,
    max_follow_on_payload: usize,
    /// `None` when the store keeps follow-ons, else its backend: read
    /// once here, not on every call.
    follow_ons_unsupported_by: Option<&'static str>,
    /// The store's limit of follow-ons per completion, and its backend: read once
    /// here too.
    max_follow_ons: Option<(usize, &'static str)>,
    /// The store's limit of follow-on payload bytes per completion, and its kind.
    max_follow_on_bytes: Option<(usize, &'static str)>,
    /// The store's limits on a response and on one item.
    limits: Room,
    /// The claims this executor's handlers are running under, shared by its
    /// clones: a repeat of one is answered in progress without the store.
    running: Arc<RunningClaims>,
    /// How long each tool's handler usually runs, shared by its clones: an
    /// in-progress answer's hint of when to ask again.
    durations: Arc<ToolDurations>,
    /// The store steps' metric keys, built once.
    steps: Arc<telemetry::StoreSteps>,
    /// `Some` when completions are written after the answer
    /// ([`Executor::with_background_completions`]): the ones in flight.
    background: Option<Arc<Background>>,
    /// `Some` when repeats of completed operations are answered from memory
    /// ([`Executor::with_replay_cache`]), shared by its clones.
    replays: Option<Arc<Replays>>,
    /// Who resolves an unknown outcome, as the answers say it
    /// ([`Executor::with_resolver`]).
    resolver: Resolver,
    /// How long a client key names its operation
    /// ([`Executor::with_client_key_retention`]).
    client_key_retention: Duration,
    /// The client keys seen per caller and arguments, shared by its clones:
    /// a new key for identical arguments inside the window is reported.
    new_key_repeats: Arc<client_keys::NewKeyRepeats>,
    /// The windows and business-key retentions set per tool at start-up
    /// ([`Executor::with_window`]), shared by its clones.
    tool_scopes: Arc<ToolScopes>,
}

/// Whether a call's completion may be written after its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Completes {
    /// Before the answer, always (an MCP task's result is read from the
    /// record).
    Inline,
    /// As the executor is configured.
    AsConfigured,
}

/// What a handler's rejection does to its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnRejected {
    /// Delete it: nothing happened, a corrected call may run.
    Release,
    /// Keep it as NOT_PERFORMED with the handler's message, which the next
    /// claim takes over: what an MCP task's `tasks/get` answers from.
    Record,
}

impl Executor {
    /// An executor over `store`, with a 30 s lease and 48 h retention.
    pub fn new(store: Arc<dyn IdempotencyStore>) -> Self {
        let follow_ons_unsupported_by = store.follow_ons().is_none().then(|| store.backend());
        let limits = Room::of(&*store);
        let declared = limits.limits();
        let max_follow_ons = store
            .follow_ons()
            .and(declared.max_follow_ons_per_completion)
            .map(|limit| (limit, store.backend()));
        let max_follow_on_bytes = store
            .follow_ons()
            .and(declared.max_follow_on_bytes_per_completion)
            .map(|limit| (limit, store.backend()));
        let steps = Arc::new(telemetry::StoreSteps::new(store.backend()));
        Executor {
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            tasks: Arc::default(),
            max_follow_on_payload: DEFAULT_MAX_PAYLOAD,
            follow_ons_unsupported_by,
            max_follow_ons,
            max_follow_on_bytes,
            limits,
            running: Arc::default(),
            durations: Arc::default(),
            steps,
            background: None,
            replays: None,
            resolver: Resolver::default(),
            client_key_retention: DEFAULT_CLIENT_KEY_RETENTION,
            new_key_repeats: Arc::default(),
            tool_scopes: Arc::default(),
        }
    }

    /// Sets `tool`'s window at start-up, in place of the one its attribute
    /// declares (`#[idempotent(window = "15m")]`, which stays the default):
    /// an operator tunes a window per deployment without a rebuild.
    ///
    /// Everything the tool serves follows it: which repeats are the same
    /// operation, how long a completed answer is replayed, the listing's
    /// `windowSeconds` in `_meta["idem/idempotent"]` (through the router a
    /// [`tool_router(server_handler)`](crate::tool_router) impl serves, or
    /// [`list_tools`](crate::mcp::list_tools) for a handler of your own), and
    /// the window of a client key's tool (whose key's retention stays at
    /// least this window). `tool` is the name the tool is listed under.
    ///
    /// ```
    /// # fn demo() -> Result<(), idem_runtime::executor::ConfigError> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use idem_runtime::{Executor, MemoryStore};
    ///
    /// let executor = Executor::new(Arc::new(MemoryStore::new()))
    ///     .with_window("charge_card", Duration::from_secs(5 * 60))?;
    /// assert_eq!(executor.window_of("charge_card"), Some(Duration::from_secs(300)));
    /// # Ok(()) }
    /// # demo().unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A window under 1 s, with a fraction of a second, or over a year
    /// ([`MAX_TOOL_WINDOW`], a unit mistake), or an empty tool name: the
    /// [`ConfigError`] says which, and what to pass.
    pub fn with_window(mut self, tool: &str, window: Duration) -> Result<Self, ConfigError> {
        Arc::make_mut(&mut self.tool_scopes).set_window(tool, window)?;
        Ok(self)
    }

    /// Sets how long `tool`'s business-key records are kept, at start-up,
    /// in place of its attribute's `retention` (or, without one, the
    /// executor's [`with_retention`](Executor::with_retention)): the
    /// listing's `retentionSeconds` and the records follow it.
    ///
    /// # Errors
    ///
    /// As [`with_window`](Executor::with_window): under 1 s, a fraction of
    /// a second, over a year, or an empty tool name.
    pub fn with_business_key_retention(
        mut self,
        tool: &str,
        retention: Duration,
    ) -> Result<Self, ConfigError> {
        Arc::make_mut(&mut self.tool_scopes).set_retention(tool, retention)?;
        Ok(self)
    }

    /// `tool`'s window as set by [`with_window`](Executor::with_window);
    /// `None`: the attribute's.
    pub fn window_of(&self, tool: &str) -> Option<Duration> {
        self.tool_scopes.window(tool)
    }

    /// `tool`'s business-key retention as set by
    /// [`with_business_key_retention`](Executor::with_business_key_retention);
    /// `None`: the attribute's, or the executor's retention.
    pub fn business_key_retention_of(&self, tool: &str) -> Option<Duration> {
        self.tool_scopes.retention(tool)
    }

    /// The scope `tool` runs under: `declared` (its attribute's) with the
    /// window or retention start-up set for it.
    pub fn scope_of<'a>(&self, tool: &str, declared: ScopeSpec<'a>) -> ScopeSpec<'a> {
        match self.tool_scopes.apply(tool, declared) {
            ScopeSpec::BusinessKey {
                fields,
                retention: None,
            } => ScopeSpec::BusinessKey {
                fields,
                retention: Some(self.retention),
            },
            scope => scope,
        }
    }

    /// Sets how long a client key names its operation, counted from the
    /// claim (default 24 h; never less than the tool's window): within it,
    /// the same caller's same key with the same arguments gets the stored
    /// answer (or "in progress"), with other arguments a conflict. After
    /// it, the key is free again, and the call runs as a new operation. An
    /// engine that retries a step hours later needs the retention to cover
    /// its longest retry schedule.
    pub fn with_client_key_retention(mut self, retention: Duration) -> Self {
        self.client_key_retention = retention;
        self
    }

    /// How long a client key names its operation
    /// ([`Executor::with_client_key_retention`]).
    pub fn client_key_retention(&self) -> Duration {
        self.client_key_retention
    }

    /// Says who resolves an operation whose outcome is unknown, in every
    /// answer that reports one: the repeat's, the failed call's, the status
    /// tool's and `tasks/get`'s (default [`Resolver::Operator`]: an
    /// operator, with `idem resolve` and the reference).
    ///
    /// Set [`Resolver::Reconciler`] when a
    /// [`Reconciler`](crate::maintenance::Reconciler) runs against this
    /// executor's store, in this process or in another replica sharing the
    /// store; [`Maintenance::resolver`](crate::maintenance::Maintenance::resolver)
    /// gives the setting that matches a maintenance task:
    ///
    /// ```no_run
    /// # async fn demo(store: std::sync::Arc<dyn idem_runtime::IdempotencyStore>) {
    /// use idem_runtime::maintenance::{Maintenance, MaintenanceConfig};
    /// use idem_runtime::Executor;
    ///
    /// let maintenance = Maintenance::spawn(store.clone(), MaintenanceConfig::default());
    /// let executor = Executor::new(store).with_resolver(maintenance.resolver());
    /// # }
    /// ```
    ///
    /// What it says is this server's configuration, not a look at the
    /// other replicas: configure every replica of one store alike
    /// ([`Resolver`] says why).
    pub fn with_resolver(mut self, resolver: Resolver) -> Self {
        self.resolver = resolver;
        self
    }

    /// Who resolves an unknown outcome, as the answers say it
    /// ([`Executor::with_resolver`]).
    pub fn resolver(&self) -> Resolver {
        self.resolver
    }

    /// Answers repeats of completed operations from memory, within their
    /// window, holding at most `max_bytes` of responses (default: off; 0
    /// turns it off).
    ///
    /// Without it every repeat asks the store, which answers with the
    /// stored response: a round trip, and on DynamoDB a refused conditional
    /// write, billed as a write. With it, once this executor has seen an
    /// operation completed (its own completion landed, or the store
    /// answered a claim with the completed record), a repeat of it with the
    /// same arguments, from the same tenant, is answered with the same
    /// response, the same reference and `Replayed`, with no store call, until
    /// the operation's window ends. The window is counted from before the
    /// claim was sent, on this process's monotonic clock, so the cache
    /// stops answering no later than the store would, and the call after
    /// the window asks the store, which starts a new operation. A COMPLETED
    /// record is final until then (nothing resolves, releases or purges
    /// it), so what the cache answers is what the store would answer; only
    /// a repeat on another replica, or one whose entry was dropped, asks
    /// the store.
    ///
    /// The budget counts each response and tenant and about 160 bytes per
    /// entry; past it, the entry used least recently goes first (by a
    /// sixteenth of the budget at a time, per shard), and a response larger
    /// than a sixteenth of the budget is not kept. Metrics:
    /// `idem_replay_cache_total{result}`, `idem_replay_cache_evicted_total`,
    /// `idem_replay_cache_bytes`. Clones share the cache.
    pub fn with_replay_cache(mut self, max_bytes: usize) -> Self {
        self.replays = (max_bytes > 0).then(|| Arc::new(Replays::new(max_bytes)));
        self
    }

    /// Answers before the completion is written (default: off).
    ///
    /// With it on, an inline call's caller gets the handler's result as soon
    /// as the handler returns; the completion (with its follow-ons) is
    /// written by a task of its own, retried while the store is unavailable
    /// (for up to 10 minutes), and the heartbeat keeps the claim's lease
    /// until it lands. Meanwhile a repeat on this executor is answered with
    /// the response from memory, and one on another replica is told the
    /// operation is in progress. The answer says
    /// [`Recording::Pending`] (`_meta`:
    /// `"recorded": false, "recording": "pending"`).
    ///
    /// What a crash may lose: a completion this process had not written yet.
    /// The record then stays in progress until its lease runs out, the sweep
    /// marks it UNKNOWN, and the reconciler finds the effect (or an operator
    /// resolves it): a repeat meanwhile is told "in progress", then
    /// "unknown", and the status tool says the same; it is never run again.
    /// Call [`Executor::drain`] before a planned shutdown, so a deploy loses
    /// nothing. An MCP task's completion is always written before the task
    /// ends (its result is read from the record). docs/states.md ("Answering before
    /// the completion") says why this is off by default, and why it does not pay on `SqliteStore`,
    /// whose relaxed completion costs the caller a few µs already.
    ///
    /// # Not on AWS Lambda
    ///
    /// Lambda freezes the process once the handler has answered, so a
    /// completion written after the answer would wait, frozen, until the
    /// next invocation (or forever, when the environment is reclaimed), and
    /// every such call would end UNKNOWN. Where the process runs under
    /// Lambda (the `AWS_LAMBDA_RUNTIME_API` environment variable is set),
    /// this setting is ignored: completions stay inline, written before the
    /// answer, and the first executor so configured says so once with a
    /// `tracing` warning. The builder does not fail, so one configuration
    /// serves both a long-lived service and a function (docs/states.md,
    /// "On AWS Lambda").
    pub fn with_background_completions(mut self, on: bool) -> Self {
        if on && background::frozen_after_answer() {
            background::say_refused_once();
            self.background = None;
            return self;
        }
        self.background = on.then(Arc::default);
        self
    }

    /// Waits until every completion this executor (or a clone) writes in
    /// the background has landed or given up, or `timeout` passes, and
    /// returns how many are still pending (0: none). Call it before a
    /// planned shutdown; without background completions it returns 0 at once.
    pub async fn drain(&self, timeout: Duration) -> usize {
        match &self.background {
            Some(background) => background.drain(timeout).await,
            None => 0,
        }
    }

    /// How many completions are being written in the background now.
    pub fn pending_completions(&self) -> usize {
        self.background.as_ref().map_or(0, |b| b.pending())
    }

    /// Sets the largest payload of a follow-on, as JSON text (default
    /// 64 KiB); a larger one is refused at its declaration.
    pub fn with_max_follow_on_payload(mut self, bytes: usize) -> Self {
        self.max_follow_on_payload = bytes;
        self
    }

    /// Sets the lease. A running handler renews it every third of the lease,
    /// so a live call is never taken for dead; a dead process's call is
    /// reported UNKNOWN once its lease runs out.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(30));
        self
    }

    /// Sets how long UNKNOWN records and business keys are kept (at least the
    /// window).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.store
    }

    /// The store, called through its `dyn` rather than through `Arc`'s own
    /// implementation of the trait, which would box a second future around
    /// the store's on every call.
    fn dyn_store(&self) -> &dyn IdempotencyStore {
        &*self.store
    }

    /// Runs `handler` at most once for this operation and answers every
    /// repeat from the record. See [`Answer`] for what comes back.
    pub async fn run<A, T, E, F, Fut>(&self, op: Operation<'_, A>, handler: F) -> Answer<T, E>
    where
        A: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: Classify + std::fmt::Display,
        F: FnOnce(OperationContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let args = match serde_json::to_value(op.args) {
            Ok(args) => args,
            Err(e) => {
                telemetry::call(op.tool, crate::answer::AnswerState::Refused);
                return Answer::Refused {
                    reason: format!("the arguments cannot be serialized ({e})"),
                };
            }
        };
        let op = Operation {
            caller: op.caller,
            tool: op.tool,
            args: &args,
            scope: op.scope,
            status_tool: op.status_tool,
        };
        self.run_json(op, None, handler).await
    }

    /// [`Executor::run`] for arguments already written as JSON (the rmcp
    /// glue has them so), without serializing them a second time.
    ///
    /// One `idem.call` span per call (tool, tenant, then the reference and
    /// the answer's state once known; never the arguments or the response),
    /// and one count of `idem_calls_total` by tool and state.
    pub(crate) async fn run_json<T, E, F, Fut>(
        &self,
        op: Operation<'_, serde_json::Value>,
        keyed: Keyed<'_>,
        handler: F,
    ) -> Answer<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + std::fmt::Display,
        F: FnOnce(OperationContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = tracing::info_span!(
            "idem.call",
            tool = op.tool,
            tenant = op.caller.tenant(),
            reference = tracing::field::Empty,
            state = tracing::field::Empty,
        );
        let tool = op.tool;
        // Without a subscriber that wants it, the call is not wrapped at all.
        let answer = if span.is_disabled() {
            self.answer(op, keyed, handler).await
        } else {
            self.answer(op, keyed, handler)
                .instrument(span.clone())
                .await
        };
        let state = answer.state();
        span.record("state", state.as_str());
        telemetry::call(tool, state);
        answer
    }

    /// Everything [`Executor::run_json`] does but the span and the count.
    async fn answer<T, E, F, Fut>(
        &self,
        op: Operation<'_, serde_json::Value>,
        keyed: Keyed<'_>,
        handler: F,
    ) -> Answer<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + std::fmt::Display,
        F: FnOnce(OperationContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let request = match self.claim_request(&op, keyed) {
            Ok(request) => request,
            Err(why) => return why.answer(op.tool),
        };
        let key = request.key;
        // A repeat of a call this executor is running: the store would
        // answer the same (see `running`), so it is not asked.
        match self.running.running(&key) {
            None => {}
            Some(Found::Running(reference, lease_left)) => {
                tracing::Span::current().record("reference", tracing::field::display(reference));
                // The table's lease is this executor's, counted from the claim.
                let elapsed = self.lease.saturating_sub(lease_left);
                return Answer::InProgress {
                    reference,
                    status_tool: op.status_tool.to_owned(),
                    retry_after: self.durations.retry_hint(op.tool, elapsed, lease_left),
                };
            }
            // Its completion is being written: the response the store will
            // hold, as a replay from the store would give it.
            Some(Found::Completing(reference, response)) => {
                tracing::Span::current().record("reference", tracing::field::display(reference));
                return replay(
                    &response,
                    reference,
                    op.status_tool.to_owned(),
                    self.resolver,
                );
            }
        }
        // A repeat of an operation this executor saw completed, within its
        // window: the store would replay the same response.
        let tenant = op.caller.tenant();
        if let Some(replays) = &self.replays {
            if let Some((reference, response)) = replays.get(&key, tenant) {
                tracing::Span::current().record("reference", tracing::field::display(reference));
                return replay(
                    &response,
                    reference,
                    op.status_tool.to_owned(),
                    self.resolver,
                );
            }
        }
        // Read only for the replay cache: no clock read on a call without it.
        let asked = self
            .replays
            .as_ref()
            .map(|r| (r, tokio::time::Instant::now()));
        match self.claim(request, op.tool).await {
            Claimed::Unavailable(error) => Answer::unclaimed(error),
            Claimed::Existing(record) => {
                tracing::Span::current()
                    .record("reference", tracing::field::display(record.reference));
                if let Some((replays, asked)) = asked {
                    keep_replay(replays, &record, &key, tenant, asked);
                }
                for_scope(
                    existing(record, &key, op.status_tool, &self.durations, self.resolver),
                    op.scope,
                )
            }
            Claimed::Won(won) => {
                let reference = won.reference;
                tracing::Span::current().record("reference", tracing::field::display(reference));
                let context = OperationContext::new(reference, op.caller, op.tool);
                let handler = self.running.run(
                    key,
                    reference,
                    won.request.attempt,
                    won.held_until(),
                    CURRENT_REFERENCE.scope(reference, handler(context)),
                );
                self.execute(
                    &won,
                    won.answered.into_std(),
                    op.status_tool,
                    OnRejected::Release,
                    Completes::AsConfigured,
                    handler,
                )
                .await
            }
        }
    }

    /// What a claim of `op` asks the store for: the key derived from the
    /// scope, the lease, the window and the retention. `Err` is why the call
    /// is refused (a business key missing or empty, a key not derivable, a
    /// tenant and tool too long for the store's record), before anything is
    /// written.
    ///
    /// `keyed` is a business key's `(field, value)` pairs when the caller
    /// took them from the typed arguments (the rmcp glue does); `None` reads
    /// the fields from the JSON arguments.
    fn claim_request(
        &self,
        op: &Operation<'_, serde_json::Value>,
        keyed: Keyed<'_>,
    ) -> Result<ClaimRequest, Unclaimable> {
        let args = op.args;
        let scope = self.scope_of(op.tool, op.scope);
        // `window` ends a COMPLETED record; an IN_PROGRESS or UNKNOWN one is
        // kept for the executor's retention whatever the scope, because its
        // side effect may have happened (a business key's `window` shortens
        // how long its result answers, never how long a doubt is kept).
        let (scope, window) = match (scope, keyed) {
            (ScopeSpec::Window(window), _) => (Scope::Window(window), window),
            // The values the caller took from the typed arguments itself
            // (what `#[idempotent]` does, so a field renamed by serde is
            // still found), keyed exactly as the same names and values
            // found in the JSON arguments.
            (ScopeSpec::BusinessKey { retention, .. }, Some(values)) => {
                let found = values.iter().map(|(field, value)| (*field, Some(value)));
                (
                    Scope::BusinessKey(business_key(found)?),
                    retention.unwrap_or(self.retention),
                )
            }
            (ScopeSpec::BusinessKey { fields, retention }, None) => {
                let found = fields.iter().map(|&field| (field, args.get(field)));
                (
                    Scope::BusinessKey(business_key(found)?),
                    retention.unwrap_or(self.retention),
                )
            }
            // The key's retention, not the tool's window, ends a completed
            // record: the host says which calls are one operation, and an
            // engine may retry a step hours later.
            (ScopeSpec::ClientKey { key, window }, _) => (
                Scope::ClientKey(key.to_owned()),
                self.client_key_retention.max(window),
            ),
        };
        let key =
            IdempotencyKey::derive(op.caller, op.tool, args, &scope).map_err(|e| e.to_string())?;
        let reference = Reference::new_operation(&key);
        if let ScopeSpec::ClientKey { window, .. } = self.scope_of(op.tool, op.scope) {
            self.new_key_repeats
                .observe(op.caller, op.tool, &key, reference, window);
        }
        // Judged now, before the handler's side effect: the store would
        // refuse the completion after it.
        self.limits
            .claim(op.caller.tenant(), op.tool)
            .map_err(Unclaimable::Unrecordable)?;
        Ok(ClaimRequest {
            key,
            reference,
            tenant: op.caller.tenant().to_owned(),
            tool: op.tool.to_owned(),
            attempt: Attempt::random(),
            lease: self.lease,
            window,
            retention: self.retention,
        })
    }

    /// The status of the operation with this reference, in the caller's
    /// tenant. `None` when there is none (or it belongs to another tenant, or
    /// the reference is malformed).
    pub async fn status(
        &self,
        caller: &Caller,
        reference: &str,
    ) -> Result<Option<StatusReport>, StoreError> {
        let Some(reference) = Reference::parse(reference) else {
            return Ok(None);
        };
        Ok(self
            .dyn_store()
            .lookup(caller.tenant(), &reference)
            .await?
            .map(|r| StatusReport::from_record(&r, self.resolver)))
    }
}

/// `step`, a store call, timed as `op` of the store's kind.
async fn timed<O>(
    store: &dyn IdempotencyStore,
    op: &'static str,
    step: impl Future<Output = O>,
) -> O {
    let started = Instant::now();
    let out = step.await;
    telemetry::store_step(store.backend(), op, started);
    out
}

/// The business key from each field's name and value (`None` when the
/// arguments lack it): one field is keyed by its value, several by an object
/// of them under their names. Every field must be present, non-null and
/// non-empty: with one field empty, different orders (`{"warehouse": "w1",
/// "order_id": ""}`) would collide as one.
fn business_key<'v>(
    fields: impl Iterator<Item = (&'v str, Option<&'v serde_json::Value>)>,
) -> Result<serde_json::Value, String> {
    let pick = |field: &'v str, value: Option<&serde_json::Value>| match value {
        None | Some(serde_json::Value::Null) => Err(format!(
            "the business key field `{field}` is missing; give it a value"
        )),
        Some(v) if is_empty_business_key(v) => Err(format!(
            "the business key field `{field}` is empty; give it a value"
        )),
        Some(v) => Ok((field, v.clone())),
    };
    let mut picked = fields
        .map(|(field, value)| pick(field, value))
        .collect::<Result<Vec<_>, _>>()?;
    match picked.len() {
        0 => Err("the tool declares an empty business key".to_owned()),
        1 => Ok(picked.remove(0).1),
        _ => Ok(serde_json::Value::Object(
            picked
                .into_iter()
                .map(|(field, value)| (field.to_owned(), value))
                .collect(),
        )),
    }
}

/// `answer` as a call under `scope` gets it: a conflict under a client key
/// says so (the key, not a business key, names the other operation).
pub(crate) fn for_scope<T, E>(answer: Answer<T, E>, scope: ScopeSpec<'_>) -> Answer<T, E> {
    match (answer, scope) {
        (
            Answer::Conflict {
                reference,
                status_tool,
            },
            ScopeSpec::ClientKey { .. },
        ) => Answer::ClientKeyConflict {
            reference,
            status_tool,
        },
        (answer, _) => answer,
    }
}

/// Why a call cannot be claimed, found before anything is sent to the store.
pub(crate) enum Unclaimable {
    /// Its arguments cannot form an operation: the caller corrects them.
    Refused(String),
    /// The store cannot hold its record (a tenant id or tool name too long
    /// for the store's item): calling again will not help until the
    /// server's operator changes that.
    Unrecordable(String),
}

impl From<String> for Unclaimable {
    fn from(reason: String) -> Self {
        Unclaimable::Refused(reason)
    }
}

impl Unclaimable {
    /// The answer: `refused` with the reason for the caller to correct,
    /// or `store_misconfigured` with the reason in the operator's log.
    pub(crate) fn answer<T, E>(self, tool: &str) -> Answer<T, E> {
        match self {
            Unclaimable::Refused(reason) => Answer::Refused { reason },
            Unclaimable::Unrecordable(reason) => {
                tracing::warn!(tool, %reason, "the store cannot record this call; not running");
                Answer::StoreMisconfigured {
                    error: StoreError::Config(reason),
                }
            }
        }
    }
}
