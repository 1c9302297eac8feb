//! The commands on follow-ons: `follow-ons` lists them, `redrive` takes one
//! out of the dead letter.

use serde_json::{json, Value};

use crate::args::{parse_reference, FollowOns, Redrive};
use crate::render::{job_error, job_json, job_runs, job_when, json_text, table};
use crate::{Failure, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::store::{
    FollowOnFilter, FollowOnId, FollowOnState, FollowOnStore, IdempotencyStore,
};

/// `follow-ons`: the follow-ons waiting or running, or those in the state asked for,
/// the oldest first.
pub(super) async fn list(
    store: &dyn IdempotencyStore,
    args: FollowOns,
    json: bool,
) -> Result<String, Failure> {
    let FollowOns {
        state,
        dead,
        tenant,
        reference,
        name,
        limit,
    } = args;
    let filter = FollowOnFilter {
        tenant,
        reference: reference.as_deref().map(parse_reference).transpose()?,
        name,
        states: match (state, dead) {
            (Some(state), _) => vec![state.into()],
            (None, true) => vec![FollowOnState::Dead],
            (None, false) => vec![FollowOnState::Waiting, FollowOnState::Running],
        },
        limit,
    };
    let jobs = follow_ons(store)?.list_follow_ons(&filter).await?;
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

/// `redrive`: a dead follow-on runs again from its first attempt; refused when
/// the follow-on is not in the dead letter.
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
    let id = FollowOnId {
        reference: parse_reference(&reference)?,
        name,
        tenant,
    };
    if !follow_ons(store)?.redrive_follow_on(&id).await? {
        return Err(Failure(
            EXIT_OPERATOR,
            format!(
                "no dead follow-on {} in tenant {:?}; `idem follow-ons --state dead` lists them",
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

/// The store's follow-ons, or why there are none to show.
fn follow_ons(store: &dyn IdempotencyStore) -> Result<&dyn FollowOnStore, Failure> {
    store.follow_ons().ok_or_else(|| {
        Failure(
            EXIT_USAGE,
            format!(
                "the {} store keeps no follow-ons; point --store at the store your servers \
                 write their follow-ons to",
                store.backend()
            ),
        )
    })
}
