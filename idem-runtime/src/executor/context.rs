//! What the handler can see of its operation.

use std::cell::RefCell;
use std::sync::Arc;

use serde::Serialize;

use crate::key::{Caller, Reference};
use crate::store::FollowOnError;

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

    /// The operation's reference. Pass it to the processor as its own
    /// idempotency reference, so the guarantee reaches across that boundary.
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

    /// Declares a follow-on of this operation, written with its
    /// completion: [`follow_on`](crate::follow_on), which see. Call it from
    /// the handler's own task (the declarations are task-local).
    pub fn follow_on<P: Serialize + ?Sized>(
        &self,
        name: &str,
        payload: &P,
    ) -> Result<(), FollowOnError> {
        crate::follow_ons::follow_on(name, payload)
    }
}
