//! The small future combinators the crate shares: every future of a list
//! polled to completion on the current task, and a panic inside a future
//! turned into an error. A leaf module: it imports nothing of the crate.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls every future to completion on the current task, as
/// `futures::future::join_all` does, and returns their outputs in order.
/// The futures may borrow (a store, the handlers), so they cannot be
/// spawned.
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (fut, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|o| o.expect("polled to completion"))
        .collect()
}

/// Turns a panic inside a pinned future (a handler's, a follow-on's) into an `Err`.
pub(crate) struct CatchUnwind<'a, F>(pub(crate) Pin<&'a mut F>);

impl<F: Future> Future for CatchUnwind<'_, F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic".to_owned()
    }
}
