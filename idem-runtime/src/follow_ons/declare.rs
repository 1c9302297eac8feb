//! Declaring follow-ons inside a running handler: a task-local list the
//! executor sets around the handler's future and reads once it returned.

use std::cell::RefCell;

use serde::Serialize;

use crate::store::{FollowOn, FollowOnError, JobTooLarge, Room};

/// The follow-ons one handler declared so far, and what a declaration
/// is checked against.
#[derive(Debug)]
pub(crate) struct Declared {
    jobs: Vec<FollowOn>,
    max_payload: usize,
    /// The most follow-ons one completion may write, and the store's kind to say
    /// so: `None` where the store sets no limit.
    max_jobs: Option<(usize, &'static str)>,
    /// The most payload bytes the follow-ons of one completion may carry, and the
    /// store's kind to say so: `None` where the store sets no limit.
    max_bytes: Option<(usize, &'static str)>,
    /// The store's limits on one item, and the bytes of the operation's
    /// tenant: each follow-on's own item is judged at its declaration.
    item: (Room, usize),
    /// The payload bytes declared so far.
    bytes: usize,
    /// `None` when the store keeps follow-ons; else its kind, to say so.
    unsupported_by: Option<&'static str>,
}

impl Declared {
    /// An empty list (no allocation until the first declaration).
    pub(crate) fn new(
        max_payload: usize,
        max_jobs: Option<(usize, &'static str)>,
        max_bytes: Option<(usize, &'static str)>,
        item: (Room, usize),
        unsupported_by: Option<&'static str>,
    ) -> Self {
        Declared {
            jobs: Vec::new(),
            max_payload,
            max_jobs,
            max_bytes,
            item,
            bytes: 0,
            unsupported_by,
        }
    }

    /// The follow-ons declared, in declaration order.
    pub(crate) fn into_jobs(self) -> Vec<FollowOn> {
        self.jobs
    }

    fn declare<P: Serialize + ?Sized>(
        &mut self,
        name: &str,
        payload: &P,
    ) -> Result<(), FollowOnError> {
        if let Some(store) = self.unsupported_by {
            return Err(FollowOnError::Unsupported {
                name: name.to_owned(),
                store,
            });
        }
        if self.jobs.iter().any(|job| job.name() == name) {
            return Err(FollowOnError::Duplicate {
                name: name.to_owned(),
            });
        }
        // Refused here, while the handler can still act, not at the
        // completion after its side effect.
        if let Some((limit, store)) = self.max_jobs {
            if self.jobs.len() >= limit {
                return Err(FollowOnError::TooMany {
                    name: name.to_owned(),
                    limit,
                    store,
                });
            }
        }
        let job = FollowOn::with_limit(name, payload, self.max_payload)?;
        let (limits, tenant) = self.item;
        match limits.job(tenant, name.len(), job.payload().len()) {
            Ok(()) => {}
            Err(JobTooLarge::Payload { limit, store }) => {
                return Err(FollowOnError::ItemTooLarge {
                    name: name.to_owned(),
                    size: job.payload().len(),
                    limit,
                    store,
                })
            }
            Err(JobTooLarge::Key {
                bytes,
                limit,
                store,
            }) => {
                return Err(FollowOnError::NameTooLong {
                    name: name.to_owned(),
                    bytes,
                    limit,
                    store,
                })
            }
        }
        let total = self.bytes + job.payload().len();
        if let Some((limit, store)) = self.max_bytes {
            if total > limit {
                return Err(FollowOnError::TooMuch {
                    name: name.to_owned(),
                    total,
                    limit,
                    store,
                });
            }
        }
        self.bytes = total;
        self.jobs.push(job);
        Ok(())
    }
}

tokio::task_local! {
    /// The running handler's declarations; set by the executor.
    pub(crate) static DECLARED: RefCell<Declared>;
}

/// Declares a follow-on of the operation whose handler is running: it is
/// written with the operation's COMPLETED record, in the same transaction,
/// and a dispatcher ([`FollowOnDispatcher`](crate::follow_ons::FollowOnDispatcher)) runs it afterwards, at least
/// once, with a stable downstream key (reference and name). Nothing runs
/// here, and nothing is written unless the handler returns `Ok`: a rejected
/// or unknown outcome, a panic or a cancellation drops the declarations, and
/// a replay never runs the handler at all.
///
/// ```
/// # use std::sync::Arc;
/// # use idem_runtime::{Caller, Executor, MemoryStore, executor::{Operation, ScopeSpec}, ToolError};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let executor = Executor::new(Arc::new(MemoryStore::new()));
/// # let caller = Caller::new("acme", "alice");
/// # let op = Operation { caller: &caller, tool: "charge_card", args: &serde_json::json!({"cents": 500}),
/// #     scope: ScopeSpec::Window(std::time::Duration::from_secs(900)), status_tool: "get_operation_status" };
/// let answer = executor
///     .run(op, |_context| async {
///         // ... charge the card, then:
///         idem_runtime::follow_on("send_receipt", &serde_json::json!({"to": "alice@example.com"}))
///             .map_err(|e| ToolError::unknown(e.to_string()))?;
///         Ok::<_, ToolError>("charged".to_owned())
///     })
///     .await;
/// # assert!(matches!(answer, idem_runtime::answer::Answer::Executed { .. }));
/// # }
/// ```
///
/// Errors, each leaving the operation's outcome to the handler: the name
/// declared already for this operation ([`FollowOnError::Duplicate`]), a
/// payload that does not serialize or is over the executor's limit (64 KiB
/// by default, [`Executor::with_max_follow_on_payload`]), a bad name
/// ([`FollowOnError::BadName`]), more follow-ons than the store writes with one
/// completion ([`FollowOnError::TooMany`]: 99 on DynamoDB), more payload
/// bytes in all than the store writes with one completion
/// ([`FollowOnError::TooMuch`]: 3 MiB on DynamoDB), a follow-on whose own item
/// the store cannot hold ([`FollowOnError::ItemTooLarge`] and
/// [`FollowOnError::NameTooLong`]: on DynamoDB, 400 KB with its tenant,
/// name and other fields), a store that
/// keeps no follow-ons, or a
/// call outside a wrapped handler (or from a task it spawned: the list is
/// task-local).
///
/// A name is 1 to 128 characters, each an ASCII letter or digit, `_`, `-`
/// or `.` (`send_receipt`, `notify-warehouse.v2`): what every store can
/// keep, in a PostgreSQL text column as in a Redis key name, and what reads
/// cleanly in the downstream key `<reference>:<name>`. Anything else (a
/// space, a `:`, a control character, a NUL byte, a non-ASCII letter) is
/// refused here, before the completion that would carry it, so a name can
/// never make the completion fail after the side effect
/// ([`is_valid_follow_on_name`] checks one ahead of time).
///
/// [`Executor::with_max_follow_on_payload`]: crate::Executor::with_max_follow_on_payload
/// [`is_valid_follow_on_name`]: crate::follow_ons::is_valid_follow_on_name
pub fn follow_on<P: Serialize + ?Sized>(name: &str, payload: &P) -> Result<(), FollowOnError> {
    DECLARED
        .try_with(|declared| declared.borrow_mut().declare(name, payload))
        .unwrap_or_else(|_| {
            Err(FollowOnError::OutsideHandler {
                name: name.to_owned(),
            })
        })
}
