//! The executor's side of MCP tasks: the claim and the run, split so that an
//! answer can go out once the claim is durable while the handler runs on;
//! a rejection recorded durably rather than released; and the cancellation
//! signals of the handlers this process runs.
//!
//! Nothing here is on the path of a call answered inline: that path is
//! [`Executor::run_json`], unchanged.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::claim::{Claimed, Won};
use super::pace::ToolDurations;
use super::{existing, timed, Completes, Executor, OnRejected, Operation, OperationContext};
use crate::answer::{Answer, Classify, Resolver};
use crate::key::{IdempotencyKey, Reference};
use crate::store::{IdempotencyStore, Record, RecordState, Resolution};
use crate::telemetry;

/// What a claim made for a task found.
#[derive(Debug)]
pub(crate) enum TaskClaim<T, E> {
    /// This call owns the operation: run it with [`Executor::run_claimed`].
    Claimed(ClaimedOperation),
    /// A live record of the same operation, not completed: its task is the
    /// answer (the same task id, nothing runs).
    Running(Record),
    /// Answered without a task: refused, the store unreachable, a conflict,
    /// or a completed operation's stored result.
    Answered(Answer<T, E>),
}

/// An operation this call has claimed and must now run.
#[derive(Debug)]
pub(crate) struct ClaimedOperation {
    won: Won,
    context: OperationContext,
    status_tool: String,
}

impl ClaimedOperation {
    /// The operation's reference: the task id.
    pub(crate) fn reference(&self) -> Reference {
        self.won.reference
    }

    /// The claim's lease.
    pub(crate) fn lease(&self) -> Duration {
        self.won.lease()
    }

    /// How long a completed record answers (the window).
    pub(crate) fn window(&self) -> Duration {
        self.won.request.window
    }
}

/// The note (who and why) kept on a record a handler rejected while it ran
/// as a task. [`crate::mcp`] tells a rejection from a reconciler's "not
/// performed" by it.
pub(crate) const REJECTED_RESOLUTION: &str = crate::store::resolved_by::REJECTED;

impl Executor {
    /// Claims the operation for a task: the key is derived and the claim made
    /// exactly as [`Executor::run_json`] does, but nothing runs yet.
    pub(crate) async fn claim_task<T, E>(
        &self,
        op: Operation<'_, serde_json::Value>,
        keyed: super::Keyed<'_>,
    ) -> TaskClaim<T, E>
    where
        T: DeserializeOwned,
    {
        let request = match self.claim_request(&op, keyed) {
            Ok(request) => request,
            Err(why) => return TaskClaim::Answered(why.answer(op.tool)),
        };
        let key = request.key;
        match self.claim(request, op.tool).await {
            Claimed::Unavailable(error) => TaskClaim::Answered(Answer::unclaimed(error)),
            Claimed::Existing(record) => {
                match repeat(record, &key, op.status_tool, &self.durations, self.resolver) {
                    TaskClaim::Answered(answer) => {
                        TaskClaim::Answered(super::for_scope(answer, op.scope))
                    }
                    other => other,
                }
            }
            Claimed::Won(won) => TaskClaim::Claimed(ClaimedOperation {
                context: OperationContext::new(won.reference, op.caller, op.tool),
                won,
                status_tool: op.status_tool.to_owned(),
            }),
        }
    }

    /// Runs `handler` under a claim [`Executor::claim_task`] made, and records
    /// its outcome as [`Executor::run_json`] would, with one difference: a
    /// rejection is kept as NOT_PERFORMED with the handler's message (what
    /// `tasks/get` answers "failed" from) instead of deleting the record.
    /// The next claim of the operation takes such a record over, as it would
    /// have found none.
    pub(crate) async fn run_claimed<T, E, Fut>(
        &self,
        claimed: ClaimedOperation,
        handler: Fut,
    ) -> Answer<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + std::fmt::Display,
        Fut: Future<Output = Result<T, E>>,
    {
        let tool = claimed.context.tool().to_owned();
        let answer = self
            .execute(
                &claimed.won,
                std::time::Instant::now(),
                &claimed.status_tool,
                OnRejected::Record,
                Completes::Inline,
                handler,
            )
            .await;
        telemetry::call(&tool, answer.state());
        answer
    }

    /// The cancellation signals of the handlers this executor runs as tasks.
    pub(crate) fn task_signals(&self) -> &Arc<TaskSignals> {
        &self.tasks
    }
}

/// A repeat's answer: the stored result of a completed operation (docs/tasks.md,
/// "Tasks: why they work as they do"), a conflict as ever, and the same task for
/// anything else.
fn repeat<T: DeserializeOwned, E>(
    record: Record,
    key: &IdempotencyKey,
    status_tool: &str,
    durations: &ToolDurations,
    resolver: Resolver,
) -> TaskClaim<T, E> {
    let completed = matches!(record.state, RecordState::Completed { .. });
    if completed || record.key.fingerprint() != key.fingerprint() {
        TaskClaim::Answered(existing(record, key, status_tool, durations, resolver))
    } else {
        TaskClaim::Running(record)
    }
}

/// Keeps a rejection durably: IN_PROGRESS → UNKNOWN → NOT_PERFORMED with
/// the handler's message, both steps fenced by the attempt. Should the
/// second step fail, the claim is released as it is without a task (so a
/// corrected call is never blocked), and `tasks/get` then answers "not
/// found" rather than a failure it cannot show.
pub(super) async fn record_rejection(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    reference: Reference,
    attempt: crate::store::Attempt,
    message: &str,
) {
    let marked = timed(
        store,
        "mark_unknown",
        store.mark_unknown(key, attempt, message),
    )
    .await;
    let resolved = match marked {
        Ok(()) => {
            let resolution = Resolution::NotPerformed {
                note: message,
                settle: Duration::ZERO,
            };
            timed(
                store,
                "resolve",
                store.resolve(key, attempt, resolution, Some(REJECTED_RESOLUTION)),
            )
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(error) = resolved {
        tracing::warn!(%reference, %error, "could not keep a rejected task as not performed; releasing it");
        if let Err(e) = store.release(key, attempt).await {
            tracing::error!(%reference, error = %e, "release after a rejected task failed");
        }
    }
}

/// A cancellation request for a handler running as a task, as the handler
/// sees it
#[cfg_attr(feature = "rmcp", doc = "([`crate::mcp::current_cancellation`]).")]
#[cfg_attr(
    not(feature = "rmcp"),
    doc = "(`current_cancellation`, feature `rmcp`)."
)]
/// Cooperative: the handler decides whether and when to stop, and how its
/// call ended (a rejection if nothing happened, an unknown outcome if
/// something may have).
#[derive(Clone, Debug, Default)]
pub struct TaskCancellation {
    inner: Arc<CancelInner>,
}

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    notify: tokio::sync::Notify,
}

impl TaskCancellation {
    /// Whether `tasks/cancel` was received for this task.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Resolves once `tasks/cancel` is received (at once if it was).
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }
}

/// The cancellation signals of the handlers this process runs as tasks, by
/// tenant and reference. An entry lives while its handler runs.
#[derive(Debug, Default)]
pub(crate) struct TaskSignals {
    running: Mutex<HashMap<(String, Reference), TaskCancellation>>,
}

impl TaskSignals {
    /// Registers a handler about to run; the guard removes it when dropped.
    pub(crate) fn register(self: &Arc<Self>, tenant: &str, reference: Reference) -> SignalGuard {
        let signal = TaskCancellation::default();
        let slot = (tenant.to_owned(), reference);
        self.lock().insert(slot.clone(), signal.clone());
        SignalGuard {
            signals: self.clone(),
            slot,
            signal,
        }
    }

    /// Signals the handler of this tenant's task if it runs here. Whether
    /// one did.
    pub(crate) fn cancel(&self, tenant: &str, reference: Reference) -> bool {
        match self.lock().get(&(tenant.to_owned(), reference)) {
            Some(signal) => {
                signal.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Reference), TaskCancellation>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running task's entry in [`TaskSignals`].
#[derive(Debug)]
pub(crate) struct SignalGuard {
    signals: Arc<TaskSignals>,
    slot: (String, Reference),
    signal: TaskCancellation,
}

impl SignalGuard {
    /// The signal the handler sees.
    pub(crate) fn signal(&self) -> TaskCancellation {
        self.signal.clone()
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut running = self.signals.lock();
        // Only this run's entry: a later run of the operation has its own.
        if running
            .get(&self.slot)
            .is_some_and(|s| Arc::ptr_eq(&s.inner, &self.signal.inner))
        {
            running.remove(&self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::ToolError;
    use crate::executor::ScopeSpec;
    use crate::key::Caller;
    use crate::store::MemoryStore;

    fn op<'a>(caller: &'a Caller, args: &'a serde_json::Value) -> Operation<'a, serde_json::Value> {
        Operation {
            caller,
            tool: "charge",
            args,
            scope: ScopeSpec::Window(Duration::from_secs(900)),
            status_tool: "get_operation_status",
        }
    }

    #[tokio::test]
    async fn a_claimed_task_runs_once_and_repeats_see_it_running_then_completed() {
        let executor = Executor::new(Arc::new(MemoryStore::new()));
        let caller = Caller::new("acme", "alice");
        let args = serde_json::json!({ "cents": 500 });
        let TaskClaim::<String, ToolError>::Claimed(claimed) =
            executor.claim_task(op(&caller, &args), None).await
        else {
            panic!("the first claim owns the operation");
        };
        let reference = claimed.reference();
        match executor
            .claim_task::<String, ToolError>(op(&caller, &args), None)
            .await
        {
            TaskClaim::Running(record) => assert_eq!(record.reference, reference),
            other => panic!("a repeat while it runs is the same task, got {other:?}"),
        }
        let answer: Answer<String, ToolError> = executor
            .run_claimed(claimed, async { Ok("ch_1".to_owned()) })
            .await;
        assert!(matches!(answer, Answer::Executed { .. }), "{answer:?}");
        match executor
            .claim_task::<String, ToolError>(op(&caller, &args), None)
            .await
        {
            TaskClaim::Answered(Answer::Replayed { value, .. }) => assert_eq!(value, "ch_1"),
            other => panic!("a completed operation answers its result, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_rejected_task_is_kept_as_not_performed_and_the_next_claim_runs() {
        let store = Arc::new(MemoryStore::new());
        let executor = Executor::new(store.clone());
        let caller = Caller::new("acme", "alice");
        let args = serde_json::json!({ "cents": 0 });
        let TaskClaim::<String, ToolError>::Claimed(claimed) =
            executor.claim_task(op(&caller, &args), None).await
        else {
            panic!("the first claim owns the operation");
        };
        let reference = claimed.reference();
        let _: Answer<String, ToolError> = executor
            .run_claimed(claimed, async {
                Err(ToolError::rejected("amount must be positive"))
            })
            .await;
        let record = store
            .lookup("acme", &reference)
            .await
            .unwrap()
            .expect("a rejected task keeps its record");
        assert_eq!(
            record.state,
            RecordState::NotPerformed {
                note: "amount must be positive".to_owned()
            }
        );
        assert_eq!(record.resolution.as_deref(), Some(REJECTED_RESOLUTION));
        assert!(matches!(
            executor
                .claim_task::<String, ToolError>(op(&caller, &args), None)
                .await,
            TaskClaim::Claimed(_)
        ));
    }

    #[test]
    fn a_signal_reaches_only_its_own_running_task() {
        let signals = Arc::new(TaskSignals::default());
        let reference = Reference::parse("idem_3f9a0c1d2e4b5a69c07e51d2a8f4e913").unwrap();
        let guard = signals.register("acme", reference);
        let signal = guard.signal();
        assert!(!signals.cancel("globex", reference));
        assert!(!signal.is_cancelled());
        assert!(signals.cancel("acme", reference));
        assert!(signal.is_cancelled());
        drop(guard);
        assert!(
            !signals.cancel("acme", reference),
            "gone once the handler ended"
        );
    }
}
