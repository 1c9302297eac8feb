//! The commands on follow-on jobs: `jobs` lists them, `redrive` takes one
//! out of the dead letter.

use serde_json::{json, Value};

use crate::args::{parse_reference, Jobs, Redrive};
use crate::render::{job_error, job_json, job_runs, job_when, json_text, table};
use crate::{Failure, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::store::{FollowOnStore, IdempotencyStore, JobFilter, JobId, JobState};

/// `jobs`: the jobs waiting or running, or those in the state asked for,
/// the oldest first.
pub(super) async fn list(
    store: &dyn IdempotencyStore,
    args: Jobs,
    json: bool,
) -> Result<String, Failure> {
    let Jobs {
        state,
        dead,
        tenant,
        reference,
        name,
        limit,
    } = args;
    let filter = JobFilter {
        tenant,
        reference: reference.as_deref().map(parse_reference).transpose()?,
        name,
        states: match (state, dead) {
            (Some(state), _) => vec![state.into()],
            (None, true) => vec![JobState::Dead],
            (None, false) => vec![JobState::Waiting, JobState::Running],
        },
        limit,
    };
    let jobs = follow_ons(store)?.list_jobs(&filter).await?;
    if json {
        return Ok(json_text(&Value::Array(
            jobs.iter().map(job_json).collect(),
        )));
    }
    let mut rows = vec![[
        "REFERENCE",
        "NAME",
        "TENANT",
        "STATE",
        "RUNS",
        "WHEN",
        "LAST ERROR",
    ]
    .map(str::to_owned)
    .to_vec()];
    rows.extend(jobs.iter().map(|j| {
        vec![
            j.id.reference.to_string(),
            j.id.name.clone(),
            j.id.tenant.clone(),
            j.state().as_str().to_owned(),
            job_runs(j),
            job_when(j),
            job_error(j),
        ]
    }));
    Ok(table(&rows))
}

/// `redrive`: a dead job runs again from its first attempt; refused when
/// the job is not in the dead letter.
pub(super) async fn redrive(
    store: &dyn IdempotencyStore,
    args: Redrive,
    json: bool,
) -> Result<String, Failure> {
    let Redrive {
        reference,
        name,
        tenant,
    } = args;
    let id = JobId {
        reference: parse_reference(&reference)?,
        name,
        tenant,
    };
    if !follow_ons(store)?.redrive_job(&id).await? {
        return Err(Failure(
            EXIT_OPERATOR,
            format!(
                "no dead job {} in tenant {:?}; `idem jobs --state dead` lists them",
                id, id.tenant
            ),
        ));
    }
    Ok(if json {
        json_text(&json!({ "redriven": id.to_string(), "tenant": id.tenant }))
    } else {
        format!(
            "re-drove {id} in tenant {:?}: it runs again from its first attempt\n",
            id.tenant
        )
    })
}

/// The store's follow-on jobs, or why there are none to show.
fn follow_ons(store: &dyn IdempotencyStore) -> Result<&dyn FollowOnStore, Failure> {
    store.follow_ons().ok_or_else(|| {
        Failure(
            EXIT_USAGE,
            format!(
                "the {} store keeps no follow-on jobs; point --store at the store your servers \
                 write their jobs to",
                store.backend()
            ),
        )
    })
}
