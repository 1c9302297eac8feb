//! The execute step of every path: the handler run under its claim, the
//! lease renewed beside it, and its outcome recorded (inline, in the
//! background, or as a task's).

use std::future::Future;
use std::task::Poll;

use super::*;

impl Executor {
    /// Runs `handler` under the claim `won`, heartbeating until it ends,
    /// and records its outcome: the execute step of every path.
    ///
    /// `started` is when the handler starts, as a reading the caller already
    /// has: an inline call's claim answer.
    pub(super) async fn execute<T, E, Fut>(
        &self,
        won: &Won,
        started: Instant,
        status_tool: &str,
        on_rejected: OnRejected,
        completes: Completes,
        handler: Fut,
    ) -> Answer<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + std::fmt::Display,
        Fut: Future<Output = Result<T, E>>,
    {
        let (claim, reference) = (&won.request, won.reference);
        let mut guard = UnknownOnDrop {
            store: Some(&self.store),
            key: claim.key,
            reference,
            attempt: claim.attempt,
        };
        // The handler's follow-on declarations, read once it returned: an
        // empty list allocates nothing.
        let declared = Declared::new(
            self.max_follow_on_payload,
            self.max_follow_ons,
            self.max_follow_on_bytes,
            (self.limits, claim.tenant.len()),
            self.follow_ons_unsupported_by,
        );
        let mut handler = std::pin::pin!(DECLARED.scope(RefCell::new(declared), handler));
        let outcome = self
            .with_heartbeat(won, CatchUnwind(handler.as_mut()))
            .await;
        // The handler's run, timed from `started` (a reading the caller had).
        if outcome.is_ok() {
            self.durations.record(&claim.tool, started.elapsed());
        }
        let store: &dyn IdempotencyStore = &**guard.disarm();
        let (key, attempt) = (&claim.key, claim.attempt);
        match outcome {
            Ok(Ok(value)) => {
                let jobs = handler
                    .as_mut()
                    .take_value()
                    .map(|d| d.into_inner().into_jobs())
                    .unwrap_or_default();
                let background = match completes {
                    Completes::AsConfigured => self.background.as_ref(),
                    Completes::Inline => None,
                };
                let text = serde_json::to_string(&value)
                    .map_err(note::unstorable)
                    .and_then(|text| {
                        // Judged against the record it goes into: its
                        // tenant and tool count in the store's item.
                        match self.limits.response(&claim.tenant, &claim.tool, None) {
                            // Never written: the store would refuse it after
                            // the side effect, or keep it only in part.
                            Some(limit) if text.len() > limit => {
                                Err(note::too_large(text.len(), limit))
                            }
                            _ => Ok(text),
                        }
                    });
                // The window counted from the claim's send: a store may count
                // it from the claim, and a repeat after it is a new operation.
                // The response answers repeats from memory until then at most.
                let until = won.sent + claim.window;
                let recording = match (text, background) {
                    (Ok(text), Some(background)) => {
                        // The response answers repeats here until it lands.
                        let response: Arc<str> = text.into();
                        let entry = self.running.hold_completing(
                            *key,
                            reference,
                            attempt,
                            response.clone(),
                            until,
                        );
                        self.complete_in_background(
                            background,
                            Completion {
                                key: *key,
                                reference,
                                attempt,
                                response,
                                jobs,
                                sent: won.lease_from,
                                entry,
                                replay: self
                                    .replays
                                    .clone()
                                    .map(|replays| (replays, claim.tenant.clone().into(), until)),
                            },
                        );
                        Recording::Pending
                    }
                    (Ok(text), None) => {
                        // The follow-ons are written with the completion, or not at
                        // all: if this write fails, the record stays
                        // IN_PROGRESS for the sweep, and a reconciler that
                        // finds the operation performed declares them again.
                        // Timed from here, after the response's
                        // serialization: the metric is the store's step.
                        let started = Instant::now();
                        let n = jobs.len();
                        let completed =
                            complete_with_follow_ons(store, key, attempt, &text, &jobs).await;
                        if n > 0 && completed.is_ok() {
                            telemetry::follow_ons_enqueued(n);
                        }
                        self.steps.record(Step::Complete, started);
                        match completed {
                            Ok(()) => {
                                if let Some(replays) = &self.replays {
                                    replays.insert(
                                        key,
                                        &claim.tenant,
                                        reference,
                                        text.into(),
                                        until,
                                    );
                                }
                                Recording::Stored
                            }
                            // The store cannot hold it, now or ever: the
                            // record says so rather than waiting for the
                            // sweep to call the process dead.
                            Err(StoreError::Invalid(error)) => {
                                mark_refused(store, key, reference, attempt, error).await;
                                Recording::Failed
                            }
                            Err(error) => {
                                // The side effect happened: the caller gets its real
                                // result; the record stays IN_PROGRESS and the sweep
                                // resolves it.
                                tracing::error!(%reference, %error, "completion write failed after the side effect");
                                Recording::Failed
                            }
                        }
                    }
                    (Err(note), _) => {
                        tracing::error!(%reference, %note, "response not stored after the side effect");
                        mark(store, key, reference, attempt, &note).await;
                        Recording::Failed
                    }
                };
                Answer::Executed {
                    value,
                    reference,
                    recording,
                }
            }
            Ok(Err(error)) => {
                let disposition = error.disposition();
                match disposition {
                    Disposition::Rejected if on_rejected == OnRejected::Record => {
                        detached::record_rejection(
                            store,
                            key,
                            reference,
                            attempt,
                            &error.to_string(),
                        )
                        .await;
                    }
                    Disposition::Rejected => {
                        if let Err(e) = store.release(key, attempt).await {
                            tracing::error!(%reference, error = %e, "release after a rejected call failed");
                        }
                    }
                    Disposition::Unknown => {
                        mark(store, key, reference, attempt, &error.to_string()).await;
                    }
                }
                Answer::Failed {
                    error,
                    reference,
                    disposition,
                    status_tool: status_tool.to_owned(),
                    resolver: self.resolver,
                }
            }
            Err(panic) => {
                let note = note::panicked(&panic_message(&panic));
                tracing::error!(%reference, %note);
                mark(store, key, reference, attempt, &note).await;
                Answer::Unknown {
                    reference,
                    status_tool: status_tool.to_owned(),
                    note,
                    resolver: self.resolver,
                }
            }
        }
    }

    /// Drives `work` while renewing the claim's lease every third of it.
    ///
    /// The heartbeat runs beside the handler, not inside its turn: both are
    /// polled whenever the task wakes, so a store that is slow to answer a
    /// renewal never pauses the side effect.
    pub(super) async fn with_heartbeat<O>(&self, won: &Won, work: impl Future<Output = O>) -> O {
        let (claim, reference) = (&won.request, won.reference);
        let mut work = std::pin::pin!(work);
        // A handler that finishes on its first poll never needs a heartbeat;
        // not arming a timer for it keeps the timer wheel off the fast path.
        if let Poll::Ready(out) =
            std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await
        {
            return out;
        }
        let beat = heartbeats(
            self.dyn_store(),
            &claim.key,
            reference,
            claim.attempt,
            self.lease,
            won.lease_from,
        );
        let mut beat = std::pin::pin!(beat);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            // Never ready: it loops until the handler is done and it is dropped.
            let _ = beat.as_mut().poll(cx);
            Poll::Pending
        })
        .await
    }
}

/// Renews the claim `attempt` on `key` every third of `lease`, on the
/// schedule counted from the claim's send (`sent`), never returning: the
/// heartbeat of a running handler, and of a completion written in the
/// background.
///
/// Counted from the claim's send, not from its answer: an answer that came
/// late must not push the first heartbeat past the lease the store counts
/// from the claim. A tick already due fires at once: after a late claim
/// answer, and when a completion in the background picks the schedule up
/// (the handler's last renewal may have been cut off in flight when it
/// returned, so the next tick is not skipped).
pub(super) async fn heartbeats(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    reference: Reference,
    attempt: Attempt,
    lease: Duration,
    sent: tokio::time::Instant,
) {
    let period = lease / 3;
    let mut ticks = tokio::time::interval_at(sent + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(error) = store.heartbeat(key, attempt, lease).await {
            tracing::warn!(%reference, %error, "lease renewal failed");
        }
    }
}
