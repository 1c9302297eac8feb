//! The dispatcher: leases due follow-ons, runs their handlers, and
//! finishes, retries or buries each one, fenced by its lease's attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::future::{join_all, panic_message, CatchUnwind};
use crate::key::Reference;
use crate::store::follow_ons::MAX_FOLLOW_ON_ERROR;
use crate::store::{Attempt, FollowOnRecord, FollowOnStore, IdempotencyStore, StoreError};
use crate::telemetry;

/// What a follow-on's handler failed with; the dispatcher keeps its text as the
/// follow-on's `last_error` (see [`MAX_FOLLOW_ON_ERROR`]).
pub type FollowOnHandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The text kept of a failed run's error: NUL bytes written as `\0`, and
/// at most [`MAX_FOLLOW_ON_ERROR`] bytes.
fn kept_error(error: &str) -> String {
    let text = if error.contains('\0') {
        error.replace('\0', "\\0")
    } else {
        error.to_owned()
    };
    if text.len() <= MAX_FOLLOW_ON_ERROR {
        return text;
    }
    let mark = |cut: usize| format!(" [… {cut} more bytes]");
    // The mark is at most this long for any cut a `usize` can count.
    let room = MAX_FOLLOW_ON_ERROR - mark(usize::MAX).len();
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut kept = text[..end].to_owned();
    kept.push_str(&mark(text.len() - end));
    kept
}

/// One run of a follow-on, as its handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowOnRun {
    /// The tenant of the operation the follow-on follows.
    pub tenant: String,
    /// The operation's reference.
    pub reference: Reference,
    /// The follow-on's name.
    pub name: String,
    /// The payload the handler declared, as JSON text.
    pub payload: String,
    /// Which run this is: 1 for the first (again 1 after a re-drive).
    pub run: u32,
    /// The idempotency key to give the far side (the mailer, the
    /// warehouse): the reference and the name, the same on every run, so a
    /// repeat after a crash or a lost answer is dropped there.
    pub downstream_key: String,
}

impl FollowOnRun {
    fn of(job: &FollowOnRecord) -> Self {
        FollowOnRun {
            tenant: job.id.tenant.clone(),
            reference: job.id.reference,
            name: job.id.name.clone(),
            payload: job.payload.clone(),
            run: job.runs,
            downstream_key: job.id.downstream_key(),
        }
    }

    /// The payload, deserialized.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }
}

/// Runs the follow-ons of one name. It may run more than once for one
/// follow-on (at least once: a crash after the far side acted and before the follow-on
/// was finished runs it again), so pass [`FollowOnRun::downstream_key`] on and
/// let the far side drop repeats. `Err` retries the follow-on with a backoff, and
/// after the most runs sends it to the dead letter.
#[async_trait]
pub trait FollowOnHandler: Send + Sync + std::fmt::Debug {
    /// Runs one follow-on.
    async fn run(&self, job: &FollowOnRun) -> Result<(), FollowOnHandlerError>;
}

/// A [`FollowOnHandler`] from an async closure ([`follow_on_fn`]).
pub struct FollowOnFn<F>(F);

impl<F> std::fmt::Debug for FollowOnFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobFn")
    }
}

/// A [`FollowOnHandler`] that calls `f` with each run.
///
/// ```
/// let handler = idem_runtime::follow_ons::follow_on_fn(|follow_on: idem_runtime::follow_ons::FollowOnRun| async move {
///     println!("mail {} with key {}", follow_on.payload, follow_on.downstream_key);
///     Ok(())
/// });
/// let handlers = idem_runtime::follow_ons::FollowOnHandlers::new().on("send_receipt", handler);
/// # let _ = handlers;
/// ```
pub fn follow_on_fn<F, Fut>(f: F) -> FollowOnFn<F>
where
    F: Fn(FollowOnRun) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), FollowOnHandlerError>> + Send,
{
    FollowOnFn(f)
}

#[async_trait]
impl<F, Fut> FollowOnHandler for FollowOnFn<F>
where
    F: Fn(FollowOnRun) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), FollowOnHandlerError>> + Send,
{
    async fn run(&self, job: &FollowOnRun) -> Result<(), FollowOnHandlerError> {
        (self.0)(job.clone()).await
    }
}

/// The handler of each follow-on name a dispatcher runs. A follow-on whose name has no
/// handler here is never leased by it: it waits (reported each round), for
/// this dispatcher once a handler is added, or for another that has one.
#[derive(Clone, Debug, Default)]
pub struct FollowOnHandlers {
    by_name: BTreeMap<String, Arc<dyn FollowOnHandler>>,
}

impl FollowOnHandlers {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the follow-ons named `name` with `handler` (replacing an earlier one).
    pub fn on(mut self, name: &str, handler: impl FollowOnHandler + 'static) -> Self {
        self.by_name.insert(name.to_owned(), Arc::new(handler));
        self
    }

    /// The names handled.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    fn get(&self, name: &str) -> Option<&Arc<dyn FollowOnHandler>> {
        self.by_name.get(name)
    }
}

/// Settings of a [`FollowOnDispatcher`]: the defaults, changed with the
/// `with_*` methods (`FollowOnConfig::default().with_max_runs(5)`), so that
/// an option added later breaks no configuration.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FollowOnConfig {
    /// The pause between rounds that found less than a full batch
    /// (default 1 s).
    pub interval: Duration,
    /// The most follow-ons leased, and run at once, per round (default 32).
    pub batch: usize,
    /// The longest one run of a follow-on may take (default 30 s): then it is
    /// cancelled and counts as failed. The lease is twice this, so a run
    /// always ends (and is finished or retried) while its lease holds, and
    /// no other dispatcher runs the follow-on meanwhile.
    pub timeout: Duration,
    /// After this many failed runs a follow-on goes to the dead letter (default 8).
    pub max_runs: u32,
    /// The pause after the first failure; it doubles with each further one
    /// (default 1 s), with jitter.
    pub first_backoff: Duration,
    /// The longest pause between two runs (default 10 minutes).
    pub max_backoff: Duration,
}

impl Default for FollowOnConfig {
    fn default() -> Self {
        FollowOnConfig {
            interval: Duration::from_secs(1),
            batch: 32,
            timeout: Duration::from_secs(30),
            max_runs: 8,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(600),
        }
    }
}

impl FollowOnConfig {
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

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`max_runs`](Self::max_runs).
    #[must_use]
    pub fn with_max_runs(mut self, max_runs: u32) -> Self {
        self.max_runs = max_runs;
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

    /// The timeout of one run, at least a millisecond.
    fn run_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_millis(1))
    }

    /// The lease of a follow-on: twice the timeout of one run.
    pub fn lease(&self) -> Duration {
        self.run_timeout().saturating_mul(2)
    }

    /// The pause after the `attempt`-th failed run: `first_backoff ×
    /// 2^(attempt-1)`, at most `max_backoff`, of which a random part up to
    /// half is taken off ("equal jitter"), so follow-ons that failed together do
    /// not all come back at the same moment.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1).min(31))
            .unwrap_or(u32::MAX);
        let full = self
            .first_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        let half = full / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = match nanos {
            0 => 0,
            n => Attempt::random().get() % (n + 1),
        };
        full - half + Duration::from_nanos(jitter)
    }
}

/// What one dispatch round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchReport {
    /// Follow-ons leased this round.
    pub leased: usize,
    /// Follow-ons whose handler succeeded and that were finished.
    pub delivered: usize,
    /// Follow-ons that failed and will run again after a backoff.
    pub retried: usize,
    /// Follow-ons that failed their last attempt and went to the dead letter.
    pub buried: usize,
    /// Due follow-ons by name that no handler of this dispatcher runs: they wait.
    pub unhandled: BTreeMap<String, u64>,
}

/// A tokio task that drains due follow-ons, at least once each, beside
/// [`Maintenance`](crate::maintenance::Maintenance). Several may run against one store
/// (in one process or many): each follow-on is leased to one of them at a time.
#[derive(Debug)]
pub struct FollowOnDispatcher {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FollowOnDispatcher {
    /// Starts the dispatcher on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] when the store keeps no follow-ons
    /// ([`IdempotencyStore::follow_ons`] is `None`): nothing is started.
    pub fn spawn(
        store: Arc<dyn IdempotencyStore>,
        handlers: FollowOnHandlers,
        config: FollowOnConfig,
    ) -> Result<Self, StoreError> {
        jobs_of(&*store)?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut reported = BTreeSet::new();
            loop {
                let full = match Self::round(&*store, &handlers, &config).await {
                    Ok(report) => {
                        report_unhandled(&mut reported, &report.unhandled);
                        report.leased >= config.batch.max(1)
                    }
                    Err(error) => {
                        // Nothing is lost: the follow-ons stay in the store, and
                        // a lease that was taken runs out.
                        tracing::warn!(%error, "follow-on round failed; trying again");
                        false
                    }
                };
                if full && !*stopped.borrow() {
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep(config.interval) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Ok(FollowOnDispatcher { stop, task })
    }

    /// One round: leases up to a batch of due follow-ons whose names have a
    /// handler, runs them at once, and finishes, retries or buries each;
    /// then counts the due follow-ons nobody here handles, and reports them (a
    /// warning and the `idem_outbox_unhandled_jobs` gauge). A store error on
    /// leasing ends the round (nothing was run); one on finishing a follow-on
    /// leaves it leased until its lease runs out, and then it runs again.
    /// A store that keeps no follow-ons answers
    /// [`StoreError::Unsupported`] at once.
    ///
    /// Where no task can run between calls (AWS Lambda freezes the process
    /// after each answer), call this from a scheduled invocation instead of
    /// [`FollowOnDispatcher::spawn`], until it leases less than a batch:
    /// docs/deploying.md shows how.
    pub async fn round(
        store: &dyn IdempotencyStore,
        handlers: &FollowOnHandlers,
        config: &FollowOnConfig,
    ) -> Result<DispatchReport, StoreError> {
        let store = jobs_of(store)?;
        let names: Vec<&str> = handlers.names().collect();
        let mut report = DispatchReport::default();
        if !names.is_empty() {
            let attempt = Attempt::random();
            let jobs = store
                .lease_follow_ons(&names, config.batch.max(1), config.lease(), attempt)
                .await?;
            report.leased = jobs.len();
            let runs = jobs
                .iter()
                .map(|job| run_one(store, handlers, config, job, attempt));
            for outcome in join_all(runs).await {
                match outcome {
                    Some(Ran::Delivered) => report.delivered += 1,
                    Some(Ran::Retried) => report.retried += 1,
                    Some(Ran::Buried) => report.buried += 1,
                    None => {}
                }
            }
        }
        let due = store.count_due_follow_ons().await?;
        report.unhandled = due
            .into_iter()
            .filter(|(name, _)| handlers.get(name).is_none())
            .collect();
        for (name, n) in &report.unhandled {
            tracing::warn!(job = %name, waiting = n, "follow-ons wait: no handler for this name here");
            telemetry::outbox_unhandled(name, *n);
        }
        Ok(report)
    }

    /// Stops the task and waits for the round in progress to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The store's follow-ons, or `Unsupported` when it keeps none.
fn jobs_of(store: &dyn IdempotencyStore) -> Result<&dyn FollowOnStore, StoreError> {
    store.follow_ons().ok_or(StoreError::Unsupported(
        "keep follow-ons (no follow-on dispatcher can run on it)",
    ))
}

/// Sets the gauge of a name that waited in an earlier round and no longer
/// does back to zero ([`FollowOnDispatcher::round`] reports the ones that wait).
fn report_unhandled(reported: &mut BTreeSet<String>, unhandled: &BTreeMap<String, u64>) {
    for gone in reported.iter().filter(|n| !unhandled.contains_key(*n)) {
        telemetry::outbox_unhandled(gone, 0);
    }
    *reported = unhandled.keys().cloned().collect();
}

enum Ran {
    Delivered,
    Retried,
    Buried,
}

/// Runs one leased follow-on and records how it went; `None` when the store could
/// not be told (the lease runs out and the follow-on runs again).
async fn run_one(
    store: &dyn FollowOnStore,
    handlers: &FollowOnHandlers,
    config: &FollowOnConfig,
    job: &FollowOnRecord,
    attempt: Attempt,
) -> Option<Ran> {
    let handler = handlers.get(&job.id.name)?;
    let run = FollowOnRun::of(job);
    let (name, reference, run_number) = (&job.id.name, job.id.reference, job.runs);
    let work = std::pin::pin!(handler.run(&run));
    let failure = match tokio::time::timeout(config.run_timeout(), CatchUnwind(work)).await {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(error))) => Some(kept_error(&error.to_string())),
        Ok(Err(panic)) => Some(kept_error(&format!(
            "the follow-on's handler panicked: {}",
            panic_message(&panic)
        ))),
        Err(_) => Some(format!(
            "the follow-on's handler took longer than {:?} and was cancelled",
            config.run_timeout()
        )),
    };
    let (ran, written) = match failure {
        None => (
            Ran::Delivered,
            store.finish_follow_on(&job.id, attempt).await,
        ),
        Some(error) if job.runs >= config.max_runs => {
            tracing::error!(job = %name, %reference, run = run_number, %error, "follow-on failed its last attempt: dead letter");
            (
                Ran::Buried,
                store.bury_follow_on(&job.id, attempt, &error).await,
            )
        }
        Some(error) => {
            let delay = config.backoff(job.runs);
            tracing::warn!(job = %name, %reference, run = run_number, %error, ?delay, "follow-on failed; retrying");
            (
                Ran::Retried,
                store.retry_follow_on(&job.id, attempt, delay, &error).await,
            )
        }
    };
    let outcome = match ran {
        Ran::Delivered => "delivered",
        Ran::Retried => "retried",
        Ran::Buried => "buried",
    };
    telemetry::outbox_job(&job.id.name, outcome);
    match written {
        Ok(()) => Some(ran),
        Err(error) => {
            // Fenced: the lease ran out and another dispatcher has the follow-on.
            // Unavailable: the lease runs out and the follow-on runs again.
            tracing::warn!(job = %name, %reference, %error, outcome, "could not record the follow-on's run; it will run again");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{kept_error, MAX_FOLLOW_ON_ERROR};

    #[test]
    fn a_kept_error_has_no_nul_and_is_bounded() {
        assert_eq!(kept_error("plain"), "plain");
        assert_eq!(kept_error("a\0b"), "a\\0b");
        // Multi-byte characters across the cut: cut on a boundary.
        for long in ["é".repeat(5000), "x".repeat(100_000), "\0".repeat(3000)] {
            let kept = kept_error(&long);
            assert!(kept.len() <= MAX_FOLLOW_ON_ERROR, "{}", kept.len());
            assert!(!kept.contains('\0'));
            assert!(kept.ends_with("more bytes]"), "{kept}");
        }
    }
}
