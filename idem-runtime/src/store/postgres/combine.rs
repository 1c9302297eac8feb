//! Completions written together: while one completion is in flight on this
//! store (and its clones), the ones that arrive meanwhile wait in a queue,
//! and a task of their own writes them all in one `UPDATE … FROM unnest(…)`
//! statement, one commit. Each is fenced by its own attempt, as alone.
//!
//! Why: a completion is a statement of its own, and under concurrency the
//! server's work per statement (parse, plan, its transaction, its WAL
//! flush request) is what a call pays beside its claim. Batched, N
//! completions cost one statement; a lone completion (nothing else in
//! flight) is written at once, as before, so a call at concurrency 1 waits
//! for no queue.
//!
//! What a waiter is told: `true` its row was completed by the batch;
//! `false` it was not: the batch left it alone (another attempt owns the
//! record, or it is in a state the completion does not leave) or the
//! batch's statement failed. Then the store runs the completion's single
//! statement, which completes it or refuses it with the reason
//! ([`rows::fenced`](super::rows::fenced)), exactly as without the batch:
//! after a batch that committed and whose answer was lost, the single
//! statement finds the row COMPLETED and says so, as a retry would.
//!
//! The writer is a task, not a waiter's future: a caller that stops
//! waiting (its call cancelled) takes no other completion down with it.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::PostgresStore;
use crate::key::IdempotencyKey;
use crate::store::Attempt;

/// At most this many completions in one statement: the arrays' size stays
/// far under the protocol's limits for any response the store accepts.
const MAX_BATCH: usize = 128;

/// The completions waiting for the writer, and whether one is in flight.
#[derive(Default)]
pub(super) struct Combiner {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Completions written one at a time right now.
    alone: usize,
    /// Whether the writer task runs.
    writing: bool,
    waiting: Vec<Waiting>,
}

struct Waiting {
    key: IdempotencyKey,
    attempt: Attempt,
    response: Box<str>,
    done: oneshot::Sender<bool>,
}

/// What a completion does: written alone, or queued for the writer.
pub(super) enum Turn {
    /// Write it alone; the guard counts it in flight until dropped.
    Alone(Alone),
    /// Queued: the writer's answer (an error: the writer stopped; the
    /// completion is not written).
    Queued(oneshot::Receiver<bool>),
}

/// A completion written alone, counted while in flight.
pub(super) struct Alone(Arc<Combiner>);

impl Drop for Alone {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().alone -= 1;
    }
}

impl Combiner {
    /// Whether the completion of `key` by `attempt` goes alone or waits;
    /// `spawn` is told to start the writer when it is not running.
    pub(super) fn turn(
        self: &Arc<Self>,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        spawn: impl FnOnce(),
    ) -> Turn {
        let mut state = self.state.lock().unwrap();
        if state.alone == 0 && !state.writing {
            state.alone += 1;
            return Turn::Alone(Alone(self.clone()));
        }
        let (done, answer) = oneshot::channel();
        state.waiting.push(Waiting {
            key: *key,
            attempt,
            response: response.into(),
            done,
        });
        if !state.writing {
            state.writing = true;
            drop(state);
            spawn();
        }
        Turn::Queued(answer)
    }

    /// The next batch, or `None` (the writer stops) when none waits.
    fn next_batch(&self) -> Option<Vec<Waiting>> {
        let mut state = self.state.lock().unwrap();
        if state.waiting.is_empty() {
            state.writing = false;
            return None;
        }
        let n = state.waiting.len().min(MAX_BATCH);
        Some(state.waiting.drain(..n).collect())
    }
}

impl PostgresStore {
    /// The writer: batches until the queue is empty.
    pub(super) async fn write_completions(self) {
        let Some(combiner) = self.combiner.clone() else {
            return;
        };
        while let Some(batch) = combiner.next_batch() {
            let keys: Vec<&[u8]> = batch.iter().map(|w| &w.key.as_bytes()[..]).collect();
            let attempts: Vec<i64> = batch.iter().map(|w| w.attempt.get() as i64).collect();
            let bodies: Vec<&[u8]> = batch.iter().map(|w| w.response.as_bytes()).collect();
            let bodies = super::exec::Redacted(bodies);
            let written = self
                .with(async |db, sql| {
                    let rows = db
                        .query(&sql.complete_many, &[&keys, &attempts, &bodies])
                        .await?;
                    Ok(rows
                        .iter()
                        .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, i64>(1)))
                        .collect::<Vec<_>>())
                })
                .await;
            if let Err(error) = &written {
                tracing::debug!(%error, n = batch.len(), "batched completion failed; each is written alone");
            }
            for w in batch {
                let landed = written.as_ref().is_ok_and(|rows| {
                    rows.iter().any(|(key, attempt)| {
                        key[..] == w.key.as_bytes()[..] && *attempt == w.attempt.get() as i64
                    })
                });
                // A waiter that stopped waiting has nothing to be told.
                let _ = w.done.send(landed);
            }
        }
    }
}
