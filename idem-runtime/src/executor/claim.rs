//! The claim step, written once for inline calls and MCP tasks: the claim
//! sent under a guard that releases it if its answer never comes, the
//! instant its lease counts from, and the late-claim check.

use std::time::Duration;

use super::guard::ReleaseOnDrop;
use super::Executor;
use crate::key::Reference;
use crate::store::{Claim, ClaimRequest, Record, StoreError};
use crate::telemetry::Step;

/// A claim this call won: it must now run the operation.
#[derive(Debug)]
pub(crate) struct Won {
    pub(crate) request: ClaimRequest,
    /// The reference the operation runs under, as the store granted it.
    pub(crate) reference: Reference,
    /// When the claim was sent, on the timer's clock: the operation's
    /// window counts from here at the latest.
    pub(crate) sent: tokio::time::Instant,
    /// When the lease was last renewed at the latest: the claim's send, or
    /// the send of the heartbeat that confirmed a slow claim
    /// ([`Executor::reconfirm`]). The store's lease cannot have started
    /// before, so the heartbeats and the running-claims table count from
    /// here.
    pub(crate) lease_from: tokio::time::Instant,
    /// When the claim's answer was read (the late-claim check's reading):
    /// the handler's run is timed from here, without a clock read of its
    /// own.
    pub(crate) answered: tokio::time::Instant,
}

impl Won {
    /// When the claim's lease runs out at the latest, without a heartbeat.
    pub(crate) fn held_until(&self) -> tokio::time::Instant {
        self.lease_from + self.request.lease
    }

    /// The claim's lease.
    pub(crate) fn lease(&self) -> Duration {
        self.request.lease
    }
}

/// What claiming an operation found.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// This call owns the operation.
    Won(Won),
    /// A live record of the operation: the answer comes from it.
    Existing(Record),
    /// The store could not confirm the claim in time: nothing may run.
    Unavailable(StoreError),
}

impl Executor {
    /// Claims `request`'s operation: the one claim protocol of every path.
    ///
    /// - A guard is armed while the claim is in flight: if its answer is
    ///   lost (a timeout after the commit) or the call is dropped before it
    ///   comes, the claim may have landed, or may still land, and nothing
    ///   would ever run under it, so dropping the guard retracts it: it is
    ///   released, fenced by its attempt, again and again in the
    ///   background until its lease counted from its send has run out
    ///   ([`ReleaseOnDrop`]).
    /// - The send instant is read before the claim goes out: the store's
    ///   lease cannot run out before one counted from it.
    /// - A claim confirmed only after that lease ran out is not confirmed
    ///   ([`late_claim`]): it may already have been swept, reconciled and
    ///   taken over, so it is released and nothing runs.
    /// - A claim confirmed after its first heartbeat was due (a third of
    ///   the lease) is confirmed again by that heartbeat before anything
    ///   runs ([`Executor::reconfirm`]): a replica whose clock runs ahead,
    ///   within the bound, may have swept it meanwhile, and a handler that
    ///   started under a record already UNKNOWN would send its request
    ///   after the mark, which the settle period does not cover.
    pub(crate) async fn claim(&self, request: ClaimRequest, tool: &str) -> Claimed {
        let sent = tokio::time::Instant::now();
        let mut unconfirmed = ReleaseOnDrop::new(
            &self.store,
            request.key,
            request.attempt,
            sent,
            request.lease,
        );
        let answer = self.dyn_store().claim(&request).await;
        // One reading after the answer serves the late-claim check, the
        // step's timer and the handler's (a clock read's cost is in
        // BENCHMARKS.md, "The executor on MemoryStore").
        let answered = tokio::time::Instant::now();
        let claimed = late_claim(answer, answered, sent + request.lease);
        self.steps.record_took(Step::Claim, answered - sent);
        match claimed {
            Err(error) => {
                // The store's whole error, for the operator: the model's
                // answer says only what happened and what to do.
                tracing::warn!(tool, reference = %request.reference, %error, "claim failed; not running");
                match error {
                    // The store refused the claim as misconfigured: it did
                    // nothing, and a release would be refused the same way.
                    StoreError::Config(_) => unconfirmed.disarm(),
                    // Dropping the guard retracts the claim, which may land.
                    _ => drop(unconfirmed),
                }
                Claimed::Unavailable(error)
            }
            Ok(Claim::Existing { record }) => {
                unconfirmed.disarm();
                Claimed::Existing(record)
            }
            Ok(Claim::Claimed { reference }) if answered - sent < request.lease / 3 => {
                unconfirmed.disarm();
                Claimed::Won(Won {
                    request,
                    reference,
                    sent,
                    lease_from: sent,
                    answered,
                })
            }
            Ok(Claim::Claimed { reference }) => match self.reconfirm(&request).await {
                Ok((lease_from, answered)) => {
                    unconfirmed.disarm();
                    Claimed::Won(Won {
                        request,
                        reference,
                        sent,
                        lease_from,
                        answered,
                    })
                }
                Err(error) => {
                    tracing::warn!(tool, reference = %reference, %error,
                        "a slow claim could not be confirmed again; not running");
                    // Dropping the guard retracts the claim: nothing ran.
                    drop(unconfirmed);
                    Claimed::Unavailable(error)
                }
            },
        }
    }

    /// Confirms a claim that was answered slowly with its first heartbeat:
    /// the lease then counts from the heartbeat's send, which is returned
    /// with the instant its answer came. A heartbeat refused (the record
    /// was swept, resolved or taken over), failed, or itself answered
    /// after the lease it renews ran out is not a confirmation.
    async fn reconfirm(
        &self,
        request: &ClaimRequest,
    ) -> Result<(tokio::time::Instant, tokio::time::Instant), StoreError> {
        let sent = tokio::time::Instant::now();
        let renewed = self
            .dyn_store()
            .heartbeat(&request.key, request.attempt, request.lease)
            .await;
        let answered = tokio::time::Instant::now();
        match renewed {
            Ok(()) if answered - sent < request.lease => Ok((sent, answered)),
            Ok(()) | Err(StoreError::Fenced) | Err(StoreError::WrongState { .. }) => {
                Err(StoreError::Unavailable(
                    "the store confirmed the claim slowly, and it could not be confirmed \
                     again before the tool ran (the store or this server was too slow), so \
                     the tool was not run"
                        .into(),
                ))
            }
            Err(error) => Err(error),
        }
    }
}

/// A claim that won but whose answer came (at `answered`) after its lease
/// ran out (on the timer's clock, counted from before the claim was sent)
/// is treated as not confirmed: the record may already have been swept,
/// reconciled and taken over by a repeat, so no handler starts under it.
/// The caller releases it (fenced by its attempt: nothing ran) and answers
/// that nothing ran.
fn late_claim(
    claimed: Result<Claim, StoreError>,
    answered: tokio::time::Instant,
    held_until: tokio::time::Instant,
) -> Result<Claim, StoreError> {
    match claimed {
        Ok(Claim::Claimed { .. }) if answered >= held_until => Err(StoreError::Unavailable(
            "the store confirmed the claim only after its lease had run out (the store or \
                 this server was too slow), so the tool was not run"
                .into(),
        )),
        other => other,
    }
}
