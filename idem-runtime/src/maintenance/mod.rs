//! The rounds that keep records honest over time: purge, sweep, reconcile.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

mod settle;

pub use settle::SettleClock;

use crate::answer::{note, Resolver};
use crate::key::Reference;
use crate::store::{
    resolve_with_follow_ons, FollowOn, IdempotencyStore, Record, RecordState, RecordStateKind,
    Resolution, StoreError,
};

/// What became of an operation whose outcome was unknown, whoever found it
/// out: a [`Reconciler`] ([`Reconciliation::Found`]) or an operator
/// ([`resolve_by_hand`]). The store writes it as a
/// [`Resolution`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It happened: store `response` so repeats replay it, and write
    /// `follow_ons` (the jobs the handler would have declared after it, lost
    /// with its outcome: the receipt never sent) in the same atomic step.
    Completed {
        /// The response to store: JSON text, exactly what the tool would
        /// have returned. For an rmcp tool, build it with `stored_response`
        /// (`stored_response(Json(receipt))`): anything else would not
        /// replay, and each repeat would answer "unknown".
        response: String,
        /// The follow-on jobs, each name once (usually none). Build each
        /// with [`FollowOn::new`].
        follow_ons: Vec<FollowOn>,
    },
    /// It did not happen: the record becomes NOT_PERFORMED, so the next
    /// call of the operation runs.
    NotPerformed,
}

impl Outcome {
    /// It happened, with `response` and no follow-on jobs.
    pub fn completed(response: impl Into<String>) -> Self {
        Outcome::Completed {
            response: response.into(),
            follow_ons: Vec::new(),
        }
    }

    /// It happened, with `response` and the follow-on jobs still to do.
    pub fn completed_with(response: impl Into<String>, follow_ons: Vec<FollowOn>) -> Self {
        Outcome::Completed {
            response: response.into(),
            follow_ons,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "completed",
            Outcome::NotPerformed => "not_performed",
        }
    }
}

/// What a [`Reconciler`] says about an operation whose outcome was unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconciliation {
    /// The processor knows: resolve the record with this outcome. A
    /// [`Outcome::NotPerformed`] is trusted only once the record has been
    /// unchanged for the settle period ([`ReconcileConfig::settle`]) when
    /// the question was asked (it was listed that long after its last
    /// change); until then the record is asked about again.
    Found(Outcome),
    /// The processor does not know yet (or the request is still in flight
    /// there); ask again after a backoff.
    StillUnknown,
    /// This reconciler does not handle the record's tool; another may. The
    /// record is put off for the longest backoff, so it never holds up the
    /// records this reconciler can resolve.
    NotMine,
}

impl Reconciliation {
    /// Found completed, with `response` and no follow-on jobs
    /// ([`Outcome::completed`]). For a tool that declares jobs, answer
    /// `Reconciliation::Found(Outcome::completed_with(response, jobs))`:
    /// otherwise they are never sent.
    pub fn completed(response: impl Into<String>) -> Self {
        Reconciliation::Found(Outcome::completed(response))
    }

    /// Found not performed.
    pub fn not_performed() -> Self {
        Reconciliation::Found(Outcome::NotPerformed)
    }
}

/// Looks an operation up at the processor by its reference (the one the
/// handler passed on as the processor's own idempotency reference).
///
/// Give it to [`Maintenance`] in [`MaintenanceConfig::reconciler`]. The
/// method is `async`: implement it in an `impl` block under
/// [`#[idem_runtime::async_trait]`](crate::async_trait) (the `async-trait`
/// crate's attribute, re-exported; no dependency of your own needed). A
/// "performed" answer carries the tool's result as the tool would have
/// returned it: build it with `idem_runtime::mcp::stored_response`, from the
/// value the handler returns on success (`Json(receipt)` for a tool that
/// returns `Result<Json<Receipt>, _>`).
///
/// **A "performed" answer carries the follow-on jobs too.** The handler's
/// own jobs (the receipt e-mail it declared with
/// [`follow_on`](crate::follow_on)) were lost with its outcome: nothing
/// sends them unless the reconciler declares them again, with
/// [`Outcome::completed_with`] and one [`FollowOn`]
/// each. They are written with the resolution, in the same atomic step, and
/// the [`Outbox`](crate::outbox::Outbox) runs them as it runs the handler's.
/// [`Reconciliation::completed`] is for a tool that declares no jobs.
///
/// ```
/// use idem_runtime::maintenance::{MaintenanceConfig, Outcome, Reconciler, Reconciliation};
/// use idem_runtime::outbox::FollowOn;
/// use idem_runtime::store::Record;
/// use idem_runtime::{async_trait, mcp::stored_response};
/// use rmcp::handler::server::wrapper::Json;
///
/// #[derive(serde::Serialize, schemars::JsonSchema)]
/// struct Receipt {
///     charge_id: String,
/// }
///
/// /// A charge as the processor reports it.
/// struct Charge {
///     id: String,
///     email: String,
/// }
///
/// /// Your processor's client.
/// #[derive(Debug)]
/// struct Processor;
///
/// impl Processor {
///     /// The charge made under this idempotency key, if any.
///     async fn charge_by_key(&self, _key: &str) -> Result<Option<Charge>, std::io::Error> {
///         Ok(Some(Charge { id: "ch_42".to_owned(), email: "alice@example.com".to_owned() }))
///     }
/// }
///
/// #[async_trait]
/// impl Reconciler for Processor {
///     async fn reconcile(
///         &self,
///         record: &Record,
///     ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
///         if record.tool != "charge_card" {
///             return Ok(Reconciliation::NotMine);
///         }
///         // The handler gave the processor current_reference() as its key.
///         Ok(match self.charge_by_key(&record.reference.to_string()).await? {
///             Some(charge) => {
///                 // Exactly what charge_card stores when it returns Json(receipt)...
///                 let response = stored_response(Json(Receipt { charge_id: charge.id }))?;
///                 // ...and the job charge_card declares after charging:
///                 // follow_on("send_receipt", &email). Without it, no receipt is sent.
///                 let receipt = FollowOn::new("send_receipt", &charge.email)?;
///                 Reconciliation::Found(Outcome::completed_with(response, vec![receipt]))
///             }
///             // Trusted only once the record has settled (ReconcileConfig::settle).
///             None => Reconciliation::not_performed(),
///         })
///     }
/// }
///
/// let config = MaintenanceConfig::default().with_reconciler(std::sync::Arc::new(Processor));
/// # let _ = config;
/// ```
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

/// How reconciliation trusts answers and paces its questions: the
/// defaults, changed with the `with_*` methods
/// (`ReconcileConfig::default().with_settle(Duration::from_secs(600))`), so
/// that an option added later breaks no configuration.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReconcileConfig {
    /// "Not performed" is trusted only for a record unchanged this long: a
    /// processor may not show a request still in flight (replication lag,
    /// an eventually consistent lookup, a slow request that lands late).
    /// Default 5 minutes; set it to at least your longest handler timeout.
    pub settle: Duration,
    /// The pause after the first answer that resolves nothing; it doubles
    /// with each further one (default 30 s).
    pub first_backoff: Duration,
    /// The longest pause between two checks of one record, and the pause
    /// after a "not mine" (default 1 hour).
    pub max_backoff: Duration,
    /// The most records looked at per round (default 250).
    pub batch: usize,
    /// The longest one lookup at the processor may take (default 30 s).
    /// Before it asks, a replica takes the record's check in the store for
    /// this long ([`Upkeep::take_check`](crate::store::Upkeep::take_check)), so the other replicas
    /// skip the record meanwhile and the processor is asked once per check,
    /// not once per replica; a lookup that has not answered by then is
    /// given up (counted as a failed lookup). The check is held twice this
    /// long, so no two replicas' lookups of one record overlap while their
    /// clocks differ by less than this (PostgreSQL and Redis read the
    /// server's clock).
    pub lookup_timeout: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            settle: Duration::from_secs(300),
            first_backoff: Duration::from_secs(30),
            max_backoff: Duration::from_secs(3600),
            batch: 250,
            lookup_timeout: Duration::from_secs(30),
        }
    }
}

impl ReconcileConfig {
    /// Sets [`settle`](Self::settle).
    #[must_use]
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Sets [`first_backoff`](Self::first_backoff).
    #[must_use]
    pub fn with_first_backoff(mut self, first_backoff: Duration) -> Self {
        self.first_backoff = first_backoff;
        self
    }

    /// Sets [`max_backoff`](Self::max_backoff).
    #[must_use]
    pub fn with_max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// Sets [`batch`](Self::batch).
    #[must_use]
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Sets [`lookup_timeout`](Self::lookup_timeout).
    #[must_use]
    pub fn with_lookup_timeout(mut self, lookup_timeout: Duration) -> Self {
        self.lookup_timeout = lookup_timeout;
        self
    }

    /// The pause before the next check of a record already checked `checks`
    /// times without a resolution: `first_backoff × 2^checks`, at most
    /// `max_backoff`.
    pub fn backoff(&self, checks: u32) -> Duration {
        let factor = 1u32.checked_shl(checks.min(31)).unwrap_or(u32::MAX);
        self.first_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// How a reconcile round went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Records resolved to COMPLETED.
    pub completed: usize,
    /// Records resolved to NOT_PERFORMED (the operation had not happened).
    pub not_performed: usize,
    /// Records still UNKNOWN (the processor did not know, failed, or said
    /// "not performed" before the settle period), asked again later.
    pub still_unknown: usize,
    /// Records whose tool this reconciler does not handle.
    pub not_mine: usize,
    /// Records listed but not asked about: another replica had taken their
    /// check ([`ReconcileConfig::lookup_timeout`]).
    pub checked_elsewhere: usize,
}

/// Asks `reconciler` about the UNKNOWN records whose check is due (at most
/// `config.batch`) and resolves them; the others are put off with a backoff,
/// so records nobody can resolve never starve the rest. Each check is taken
/// in the store first, so of the replicas that list a record one asks. "Not performed" is
/// trusted once the record has settled on the store's clock and on this
/// process's own ([`SettleClock::process`], which see).
pub async fn reconcile(
    store: &dyn IdempotencyStore,
    reconciler: &dyn Reconciler,
    config: &ReconcileConfig,
) -> Result<ReconcileReport, StoreError> {
    reconcile_with(store, reconciler, config, SettleClock::process()).await
}

/// [`reconcile`], with the settle period also counted on `clock`: the
/// process's own ([`SettleClock::process`]), or one per simulated process.
pub async fn reconcile_with(
    store: &dyn IdempotencyStore,
    reconciler: &dyn Reconciler,
    config: &ReconcileConfig,
    clock: &SettleClock,
) -> Result<ReconcileReport, StoreError> {
    let mut report = ReconcileReport::default();
    // A record still UNKNOWN is listed again within max_backoff of its last
    // check; one not seen for twice that (and a settle period) was resolved
    // elsewhere or purged.
    clock.forget_unseen(config.settle + config.max_backoff.saturating_mul(2));
    // The shortest pause before a record not settled yet is asked again.
    let shortest = config.first_backoff.min(config.settle);
    for record in store.list_unknown(config.batch).await? {
        let settles_in = settle_left(&record, clock.seen_for(&record), config);
        let resolved_before = report.completed + report.not_performed;
        let reference = record.reference;
        let (key, attempt) = (&record.key, record.attempt);
        let backoff = config.backoff(record.checks);
        // The lookup is given up at its deadline, counted from before the
        // take; the check is held twice as long, so the lookup has ended
        // before another replica can take the check, for replicas whose
        // clocks (SqliteStore's, DynamoDbStore's) differ by less than the
        // lookup timeout.
        let deadline = tokio::time::Instant::now() + config.lookup_timeout;
        let hold = config.lookup_timeout.saturating_mul(2);
        let taken = match store.take_check(key, attempt, hold).await {
            Ok(Some(until)) => until,
            Ok(None) => {
                report.checked_elsewhere += 1;
                continue;
            }
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {
                clock.forget(&record);
                continue;
            }
            Err(e) => return Err(e),
        };
        // The answer puts off this check only: once its hold ran out (a slow
        // write) and another replica took the next one, a late deferral
        // would make the record due again while that replica asks.
        let defer = |delay| store.defer_check(key, attempt, delay, Some(taken));
        let asked = tokio::time::timeout_at(deadline, reconciler.reconcile(&record)).await;
        let answer = asked.unwrap_or_else(|_| {
            Err(format!(
                "no answer within the lookup timeout ({:?})",
                config.lookup_timeout
            )
            .into())
        });
        let outcome = match answer {
            Ok(Reconciliation::Found(Outcome::Completed {
                response,
                follow_ons,
            })) => {
                match resolve_with_follow_ons(store, &record, &response, None, &follow_ons).await {
                    Ok(()) => {
                        if !follow_ons.is_empty() {
                            crate::telemetry::follow_ons_enqueued(follow_ons.len());
                        }
                        Ok(&mut report.completed)
                    }
                    Err(StoreError::Invalid(error)) => {
                        // The reconciler's own mistake: nothing was written; ask
                        // again later rather than resolve without the jobs.
                        tracing::error!(%reference, %error, "reconciler declared invalid follow-ons; the record stays UNKNOWN");
                        defer(backoff).await.map(|_| &mut report.still_unknown)
                    }
                    Err(e) => Err(e),
                }
            }
            // The answer describes the processor as it was when asked, and
            // it was asked after the listing: it is trusted only if the
            // record had settled by the listing, on the store's clock and on
            // this process's own (`settle_left`). The store's own check at
            // the resolve is not enough: a slow answer can come back after
            // the settle period and still describe a moment inside it, when
            // a request in flight did not show yet.
            Ok(Reconciliation::Found(Outcome::NotPerformed)) if !settles_in.is_zero() => {
                defer(settles_in.max(shortest))
                    .await
                    .map(|_| &mut report.still_unknown)
            }
            Ok(Reconciliation::Found(Outcome::NotPerformed)) => {
                let not_performed = Resolution::NotPerformed {
                    note: note::RECONCILED_NOT_PERFORMED,
                    settle: config.settle,
                };
                match store.resolve(key, attempt, not_performed, None).await {
                    Ok(()) => Ok(&mut report.not_performed),
                    // Too soon to trust: ask again once it has settled.
                    Err(StoreError::NotSettled { until }) => {
                        let wait = until.duration_since(record.observed_at).unwrap_or_default();
                        defer(wait.max(shortest))
                            .await
                            .map(|_| &mut report.still_unknown)
                    }
                    Err(e) => Err(e),
                }
            }
            Ok(Reconciliation::StillUnknown) => {
                defer(backoff).await.map(|_| &mut report.still_unknown)
            }
            Ok(Reconciliation::NotMine) => defer(config.max_backoff)
                .await
                .map(|_| &mut report.not_mine),
            Err(error) => {
                tracing::warn!(%reference, %error, "reconciler failed; the record stays UNKNOWN");
                defer(backoff).await.map(|_| &mut report.still_unknown)
            }
        };
        match outcome {
            Ok(counter) => *counter += 1,
            // Resolved by someone else meanwhile (a late completion, another
            // replica, an operator).
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {
                clock.forget(&record);
            }
            Err(e) => return Err(e),
        }
        if resolved_before != report.completed + report.not_performed {
            clock.forget(&record);
        }
    }
    for (outcome, n) in [
        ("completed", report.completed),
        ("not_performed", report.not_performed),
        ("still_unknown", report.still_unknown),
        ("not_mine", report.not_mine),
        ("checked_elsewhere", report.checked_elsewhere),
    ] {
        if n > 0 {
            crate::telemetry::reconciled(outcome, n);
        }
    }
    Ok(report)
}

/// How long, from its listing, until `record` has been unchanged for the
/// settle period on the store's clock (its `updated_at` against the
/// listing's `observed_at`) and seen UNKNOWN for it by this process
/// (`seen_for`, on its own monotonic clock): zero once both hold.
fn settle_left(record: &Record, seen_for: Duration, config: &ReconcileConfig) -> Duration {
    let on_the_store = (record.updated_at + config.settle)
        .duration_since(record.observed_at)
        .unwrap_or_default();
    on_the_store.max(config.settle.saturating_sub(seen_for))
}

/// Why a resolution by hand was refused. Nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No record has this reference in this tenant.
    #[error("no operation with reference {reference} in tenant {tenant:?}; check both")]
    NotFound {
        /// The tenant asked.
        tenant: String,
        /// The reference asked.
        reference: Reference,
    },
    /// The record's outcome is known already (or it is still running), so
    /// there is nothing to resolve; it was left as it was.
    #[error(
        "operation {reference} is {state}, not UNKNOWN: only an operation whose outcome is \
         unknown can be resolved by hand; it was left as it was"
    )]
    NotUnknown {
        /// The reference.
        reference: Reference,
        /// The state found.
        state: RecordStateKind,
    },
    /// The note is empty.
    #[error("the note is empty: say who resolves the operation and why")]
    EmptyNote,
    /// The completed response is not JSON.
    #[error("the response is not JSON ({0}): give the tool's result as JSON text")]
    InvalidResponse(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The record as a resolution by hand left it. The resolution took effect,
/// so it is answered as such, whatever a purge or a new claim does to the
/// record a moment later: read back if still there, else as resolved.
async fn resolved_as(
    store: &dyn IdempotencyStore,
    tenant: &str,
    reference: &Reference,
    record: Record,
    outcome: &Outcome,
    note: &str,
) -> Record {
    match store.lookup(tenant, reference).await {
        Ok(Some(read)) if read.attempt == record.attempt => read,
        _ => Record {
            state: match outcome {
                Outcome::Completed { response, .. } => RecordState::Completed {
                    response: response.clone(),
                },
                Outcome::NotPerformed => RecordState::NotPerformed {
                    note: note::RESOLVED_BY_HAND_NOT_PERFORMED.to_owned(),
                },
            },
            resolution: Some(note.to_owned()),
            ..record
        },
    }
}

/// Resolves an UNKNOWN operation by hand: completed (with its response,
/// and the follow-on jobs the handler would have declared, written in the
/// same atomic step: the receipt that was never sent), or not performed,
/// with `note` (who and why) kept on the record, where the status tool shows
/// it. An IN_PROGRESS record whose lease ran out counts as UNKNOWN (its
/// process is presumed dead, as the sweep would conclude).
///
/// Fenced by the record's attempt, so it cannot overwrite a resolution or a
/// late completion that lands at the same moment; and idempotent: resolving
/// again the same way with the same note answers the resolved record. Any
/// other record is refused with [`ResolveError::NotUnknown`] and left as it
/// was; a repeated job name is refused with a store error `Invalid`, and
/// nothing is changed. Returns the record as resolved.
pub async fn resolve_by_hand(
    store: &dyn IdempotencyStore,
    tenant: &str,
    reference: &Reference,
    outcome: &Outcome,
    note: &str,
) -> Result<Record, ResolveError> {
    let follow_ons: &[FollowOn] = match outcome {
        Outcome::Completed { follow_ons, .. } => follow_ons,
        Outcome::NotPerformed => &[],
    };
    crate::store::FollowOns::new(follow_ons)?;
    let note = note.trim();
    if note.is_empty() {
        return Err(ResolveError::EmptyNote);
    }
    if let Outcome::Completed { response, .. } = outcome {
        serde_json::from_str::<serde_json::Value>(response)
            .map_err(|e| ResolveError::InvalidResponse(e.to_string()))?;
    }
    let not_found = || ResolveError::NotFound {
        tenant: tenant.to_owned(),
        reference: *reference,
    };
    let record = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    if record.is_lapsed() {
        // The sweep's own step, fenced and re-checked; a heartbeat that
        // lands first keeps the record running (and refused below).
        match store
            .mark_lapsed(&record.key, record.attempt, note::SWEPT)
            .await
        {
            Ok(_) | Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let record = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    let resolution = match outcome {
        Outcome::Completed { response, .. } => Resolution::Completed { response },
        Outcome::NotPerformed => Resolution::NotPerformed {
            note: note::RESOLVED_BY_HAND_NOT_PERFORMED,
            settle: Duration::ZERO,
        },
    };
    if matches!(record.state, RecordState::Unknown { .. }) {
        let resolved = match resolution {
            Resolution::Completed { response } => {
                resolve_with_follow_ons(store, &record, response, Some(note), follow_ons).await
            }
            not_performed => {
                store
                    .resolve(&record.key, record.attempt, not_performed, Some(note))
                    .await
            }
        };
        match resolved {
            Ok(()) => {
                if !follow_ons.is_empty() {
                    crate::telemetry::follow_ons_enqueued(follow_ons.len());
                }
                tracing::info!(%reference, tool = %record.tool, "resolved by hand");
                crate::telemetry::resolved_by_hand(outcome.name());
                return Ok(resolved_as(store, tenant, reference, record, outcome, note).await);
            }
            Err(StoreError::Fenced | StoreError::WrongState { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let resolved = store
        .lookup(tenant, reference)
        .await?
        .ok_or_else(not_found)?;
    let same = resolved.resolution.as_deref() == Some(note)
        && match (&resolved.state, outcome) {
            (RecordState::Completed { response }, Outcome::Completed { response: r, .. }) => {
                response == r
            }
            (RecordState::NotPerformed { .. }, Outcome::NotPerformed) => true,
            _ => false,
        };
    if same {
        Ok(resolved)
    } else {
        Err(ResolveError::NotUnknown {
            reference: *reference,
            state: resolved.state.kind(),
        })
    }
}

/// The warning of a maintenance task started without a reconciler: what
/// will happen to an unknown outcome, and the two ways to deal with it.
fn warn_no_reconciler() {
    tracing::warn!(
        "idem maintenance runs without a reconciler: a call whose process dies, or whose \
         handler fails in a way that may have taken effect, stays UNKNOWN, and every repeat of \
         it is refused, until an operator resolves it (or its retention ends). Give \
         MaintenanceConfig::reconciler a Reconciler that asks the processor, or resolve \
         each by hand: `idem list --state unknown` lists them, `idem resolve REFERENCE` \
         resolves one. Answers say an operator resolves them unless the executor is told \
         otherwise (Executor::with_resolver)."
    );
}

/// What one [`Maintenance::round`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Lapsed claims marked UNKNOWN by the sweep.
    pub swept: usize,
    /// What the reconciler resolved (all zero without one).
    pub reconciled: ReconcileReport,
    /// Expired records (and delivered jobs) purged.
    pub purged: usize,
    /// Steps that failed on a store error (logged; the next round tries
    /// again).
    pub errors: usize,
}

/// Settings of the background [`Maintenance`] task: the defaults, changed
/// with the `with_*` methods
/// (`MaintenanceConfig::default().with_reconciler(Arc::new(MyReconciler))`),
/// so that an option added later breaks no configuration.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MaintenanceConfig {
    /// Time between rounds.
    pub interval: Duration,
    /// Purge batch size, and the most records swept per round (default 250:
    /// small batches keep claims fast while a purge runs).
    pub batch: usize,
    /// Resolves UNKNOWN records, if given.
    pub reconciler: Option<Arc<dyn Reconciler>>,
    /// How the reconciler's answers are trusted and paced.
    pub reconcile: ReconcileConfig,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: Duration::from_secs(30),
            batch: 250,
            reconciler: None,
            reconcile: ReconcileConfig::default(),
        }
    }
}

impl MaintenanceConfig {
    /// Sets [`interval`](Self::interval).
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets [`batch`](Self::batch).
    #[must_use]
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Sets [`reconcile`](Self::reconcile).
    #[must_use]
    pub fn with_reconcile(mut self, reconcile: ReconcileConfig) -> Self {
        self.reconcile = reconcile;
        self
    }

    /// Sets the [`reconciler`](Self::reconciler) that resolves UNKNOWN
    /// records.
    #[must_use]
    pub fn with_reconciler(mut self, reconciler: Arc<dyn Reconciler>) -> Self {
        self.reconciler = Some(reconciler);
        self
    }

    /// Who resolves the UNKNOWN records with this configuration:
    /// [`Resolver::Reconciler`] with a [`reconciler`](Self::reconciler),
    /// [`Resolver::Operator`] without. Give it to
    /// [`Executor::with_resolver`](crate::Executor::with_resolver) where
    /// maintenance runs as rounds ([`Maintenance::round`]) rather than as a
    /// task.
    pub fn resolver(&self) -> Resolver {
        if self.reconciler.is_some() {
            Resolver::Reconciler
        } else {
            Resolver::Operator
        }
    }
}

/// A tokio task that runs sweep, reconcile and purge every interval, and
/// stops cleanly (between rounds, never in the middle of a write).
///
/// # Several replicas
///
/// Run it in every replica, beside the server, on the store they share:
/// nothing needs electing. Every change it makes is fenced by the record's
/// attempt in one atomic step, so when two replicas' rounds meet on a
/// record, one change lands and the other finds it done: each lapsed claim
/// is swept once, each UNKNOWN record resolved once (a response stored once,
/// an [`Outcome::Completed`]'s follow-on jobs written once), each expired record
/// purged once. (Two loops on one PostgreSQL or SQLite store with 40 lapsed
/// claims are tested so.) The question is shared too: before a replica asks
/// its reconciler about a record, it takes the record's check in the store
/// ([`Upkeep::take_check`](crate::store::Upkeep::take_check)), so of the replicas that list the
/// record one asks, once per check ([`ReconcileConfig::lookup_timeout`]).
#[derive(Debug)]
pub struct Maintenance {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    resolver: Resolver,
}

impl Maintenance {
    /// Starts the task on the current tokio runtime.
    ///
    /// Without a [`reconciler`](MaintenanceConfig::reconciler) it says so
    /// once, now, with a `tracing` warning: every call whose process dies,
    /// or whose handler fails in a way that may have taken effect, then
    /// stays UNKNOWN, refusing its repeats, until an operator resolves it.
    pub fn spawn(store: Arc<dyn IdempotencyStore>, config: MaintenanceConfig) -> Self {
        let resolver = config.resolver();
        if resolver == Resolver::Operator {
            warn_no_reconciler();
        }
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
        Maintenance {
            stop,
            task,
            resolver,
        }
    }

    /// Who resolves the UNKNOWN records this task leaves
    /// ([`MaintenanceConfig::resolver`]): give it to
    /// [`Executor::with_resolver`](crate::Executor::with_resolver), so the
    /// answers say what will happen.
    pub fn resolver(&self) -> Resolver {
        self.resolver
    }

    /// One round: sweep, reconcile (with a reconciler), purge; returns what
    /// it did. Store errors are logged (and counted in the report) and the
    /// next round tries again.
    ///
    /// Where no task can run between calls (AWS Lambda freezes the process
    /// after each answer), call this from a scheduled invocation instead of
    /// [`Maintenance::spawn`]: docs/deploying.md shows how.
    pub async fn round(store: &dyn IdempotencyStore, config: &MaintenanceConfig) -> RoundReport {
        let mut report = RoundReport::default();
        match sweep(store, config.batch).await {
            Ok(swept) => report.swept = swept,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%error, "sweep failed");
            }
        }
        if let Some(reconciler) = &config.reconciler {
            match reconcile(store, &**reconciler, &config.reconcile).await {
                Ok(reconciled) => report.reconciled = reconciled,
                Err(error) => {
                    report.errors += 1;
                    tracing::warn!(%error, "reconcile failed");
                }
            }
        }
        match purge(store, config.batch).await {
            Ok(purged) => report.purged = purged,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%error, "purge failed");
            }
        }
        report
    }

    /// Stops the task and waits for the round in progress to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
