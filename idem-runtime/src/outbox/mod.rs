//! Follow-on work: jobs a handler declares ([`follow_on`]), written with its
//! completion, and the dispatcher that runs them at least once ([`Outbox`]).

mod declare;
mod dispatch;

pub use crate::store::outbox::{
    is_valid_job_name, FollowOn, FollowOnError, FollowOns, DEFAULT_MAX_PAYLOAD, MAX_JOB_ERROR,
    MAX_JOB_NAME,
};
pub use declare::follow_on;
pub(crate) use declare::{Declared, DECLARED};
pub use dispatch::{
    job_fn, DispatchReport, JobError, JobFn, JobHandler, JobHandlers, JobRun, Outbox, OutboxConfig,
};
