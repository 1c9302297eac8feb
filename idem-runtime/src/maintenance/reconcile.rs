//! Reconciliation: what a processor says became of an unknown outcome,
//! and when its "not performed" is trusted.

use std::time::Duration;

use async_trait::async_trait;

use super::settle::SettleClock;
use crate::answer::note;
use crate::store::{
    resolve_with_follow_ons, FollowOn, IdempotencyStore, Record, Resolution, StoreError,
};

/// What became of an operation whose outcome was unknown, whoever found it
/// out: a [`Reconciler`] ([`Reconciliation::Found`]) or an operator
/// ([`resolve_by_hand`](super::resolve_by_hand)). The store writes it as a
/// [`Resolution`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It happened: store `response` so repeats replay it, and write
    /// `follow_ons` (the follow-ons the handler would have declared after it, lost
    /// with its outcome: the receipt never sent) in the same atomic step.
    Completed {
        /// The response to store: JSON text, exactly what the tool would
        /// have returned. For an rmcp tool, build it with `stored_response`
        /// (`stored_response(Json(receipt))`): anything else would not
        /// replay, and each repeat would answer "unknown".
        response: String,
        /// The follow-ons, each name once (usually none). Build each
        /// with [`FollowOn::new`].
        follow_ons: Vec<FollowOn>,
    },
    /// It did not happen: the record becomes NOT_PERFORMED, so the next
    /// call of the operation runs.
    NotPerformed,
}

impl Outcome {
    /// It happened, with `response` and no follow-ons.
    pub fn completed(response: impl Into<String>) -> Self {
        Outcome::Completed {
            response: response.into(),
            follow_ons: Vec::new(),
        }
    }

    /// It happened, with `response` and the follow-ons still to do.
    pub fn completed_with(response: impl Into<String>, follow_ons: Vec<FollowOn>) -> Self {
        Outcome::Completed {
            response: response.into(),
            follow_ons,
        }
    }

    pub(super) fn name(&self) -> &'static str {
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
    /// Found completed, with `response` and no follow-ons
    /// ([`Outcome::completed`]). For a tool that declares follow-ons, answer
    /// `Reconciliation::Found(Outcome::completed_with(response, follow_ons))`:
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
/// Give it to [`Maintenance`](super::Maintenance) in [`MaintenanceConfig::reconciler`](super::MaintenanceConfig::reconciler). The
/// method is `async`: implement it in an `impl` block under
/// [`#[idem_runtime::async_trait]`](crate::async_trait) (the `async-trait`
/// crate's attribute, re-exported; no dependency of your own needed). A
/// "performed" answer carries the tool's result as the tool would have
/// returned it: build it with `idem_runtime::mcp::stored_response`, from the
/// value the handler returns on success (`Json(receipt)` for a tool that
/// returns `Result<Json<Receipt>, _>`).
///
/// **A "performed" answer carries the follow-ons too.** The handler's
/// own follow-ons (the receipt e-mail it declared with
/// [`follow_on`](crate::follow_on)) were lost with its outcome: nothing
/// sends them unless the reconciler declares them again, with
/// [`Outcome::completed_with`] and one [`FollowOn`]
/// each. They are written with the resolution, in the same atomic step, and
/// the [`FollowOnDispatcher`](crate::follow_ons::FollowOnDispatcher) runs them as it runs the handler's.
/// [`Reconciliation::completed`] is for a tool that declares no follow-ons.
///
/// ```
/// use idem_runtime::maintenance::{MaintenanceConfig, Outcome, Reconciler, Reconciliation};
/// use idem_runtime::follow_ons::FollowOn;
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
///                 // ...and the follow-on charge_card declares after charging:
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
                let resolved = resolve_with_follow_ons(
                    store,
                    &record,
                    &response,
                    Some(note::RECONCILED),
                    &follow_ons,
                );
                match resolved.await {
                    Ok(()) => {
                        if !follow_ons.is_empty() {
                            crate::telemetry::follow_ons_enqueued(follow_ons.len());
                        }
                        Ok(&mut report.completed)
                    }
                    Err(StoreError::Invalid(error)) => {
                        // The reconciler's own mistake: nothing was written; ask
                        // again later rather than resolve without the follow-ons.
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
                let noted = Some(note::RECONCILED);
                match store.resolve(key, attempt, not_performed, noted).await {
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
