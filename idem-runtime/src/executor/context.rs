//! What the handler can see of its operation.

use std::cell::RefCell;
use std::sync::Arc;

use crate::key::{Caller, Reference};

/// What the handler can see of its operation.
#[derive(Clone, Debug)]
pub struct OperationContext {
    reference: Reference,
    identity: Arc<Identity>,
}

/// Who called which tool: shared by the contexts of one caller's calls of
/// one tool on a thread (see [`OperationContext::new`]).
#[derive(Debug)]
struct Identity {
    caller: Caller,
    tool: String,
}

impl OperationContext {
    /// The context of `caller`'s call of `tool`. A thread keeps the last
    /// caller and tool it built one for and hands the same copy to the next
    /// call of theirs: copying the caller and the tool's name cost three
    /// allocations a call, which a context the handler never reads does not
    /// need. (The copy is never shared between threads by the cache, so its
    /// reference count stays in one core's cache.)
    pub(super) fn new(reference: Reference, caller: &Caller, tool: &str) -> Self {
        thread_local! {
            static LAST: RefCell<Option<Arc<Identity>>> = const { RefCell::new(None) };
        }
        let fresh = || {
            Arc::new(Identity {
                caller: caller.clone(),
                tool: tool.to_owned(),
            })
        };
        let identity = LAST.with(|last| {
            let Ok(mut last) = last.try_borrow_mut() else {
                return fresh();
            };
            match &*last {
                Some(same) if same.caller == *caller && same.tool == tool => same.clone(),
                _ => last.insert(fresh()).clone(),
            }
        });
        OperationContext {
            reference,
            identity,
        }
    }

    /// The operation's reference: what [`current_reference`] answers in the
    /// handler's task, as a value the closure can move into tasks of its
    /// own.
    pub fn reference(&self) -> Reference {
        self.reference
    }

    /// The caller.
    pub fn caller(&self) -> &Caller {
        &self.identity.caller
    }

    /// The tool.
    pub fn tool(&self) -> &str {
        &self.identity.tool
    }
}

tokio::task_local! {
    /// The reference of the operation whose handler runs in this task.
    pub(crate) static CURRENT_REFERENCE: Reference;
}

/// The reference of the operation whose handler is running: inside an
/// `#[idempotent]` tool's body, or the handler of [`Executor::run`];
/// `None` anywhere else. Pass it to the processor as its own idempotency
/// key, so the guarantee reaches across that boundary.
///
/// It is a task-local: a task spawned by the handler does not see it, so
/// read it first and move the value in.
///
/// [`Executor::run`]: crate::Executor::run
pub fn current_reference() -> Option<Reference> {
    CURRENT_REFERENCE.try_with(|reference| *reference).ok()
}
