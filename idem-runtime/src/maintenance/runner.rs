//! The maintenance loop: a task that runs the rounds (purge, sweep,
//! reconcile) every interval, and one round on demand.

use std::sync::Arc;
use std::time::Duration;

use super::reconcile::{reconcile, ReconcileConfig, ReconcileReport, Reconciler};
use super::rounds::{purge, sweep};
use crate::answer::Resolver;
use crate::store::IdempotencyStore;

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
    /// Expired records (and delivered follow-ons) purged.
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
/// an [`Outcome::Completed`](super::Outcome::Completed)'s follow-ons written once), each expired record
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
