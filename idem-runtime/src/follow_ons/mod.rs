//! Follow-on work: follow-ons a handler declares ([`follow_on`]), written with its
//! completion, and the dispatcher that runs them at least once ([`FollowOnDispatcher`]).

mod declare;
mod dispatch;

pub use crate::store::follow_ons::{
    is_valid_follow_on_name, FollowOn, FollowOnError, FollowOns, DEFAULT_MAX_PAYLOAD,
    MAX_FOLLOW_ON_ERROR, MAX_FOLLOW_ON_NAME,
};
pub use declare::follow_on;
pub(crate) use declare::{Declared, DECLARED};
pub use dispatch::{
    follow_on_fn, DispatchReport, FollowOnConfig, FollowOnDispatcher, FollowOnFn, FollowOnHandler,
    FollowOnHandlerError, FollowOnHandlers, FollowOnRun,
};
