//! The commands on records: `list`, `show`, `stats` and `purge`.

use serde_json::{json, Value};

use crate::args::{parse_reference, List, Purge, Show};
use crate::escape::shown;
use crate::render::{
    completed_by, job_error, job_json, job_runs, job_when, json_text, outcome_unknown, record_json,
    state_label, table, unknown_footer,
};
use crate::{Failure, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::maintenance;
use idem_runtime::store::rfc3339;
use idem_runtime::store::{
    FollowOnFilter, IdempotencyStore, Record, RecordFilter, RecordState, RecordStateKind,
};
use idem_runtime::Reference;

/// `list`: the newest records first (by claim), filtered.
pub(super) async fn list(
    store: &dyn IdempotencyStore,
    args: List,
    json: bool,
) -> Result<String, Failure> {
    let List {
        state,
        tenant,
        tool,
        limit,
    } = args;
    let filter = RecordFilter {
        state: state.map(Into::into),
        tenant,
        tool,
        limit,
    };
    let records = store.list_records(&filter).await?;
    if json {
        return Ok(json_text(&Value::Array(
            records.iter().map(|r| record_json(r, false)).collect(),
        )));
    }
    let mut rows = vec![
        ["REFERENCE", "TENANT", "TOOL", "STATE", "CLAIMED", "UPDATED"]
            .map(str::to_owned)
            .to_vec(),
    ];
    rows.extend(records.iter().map(|r| {
        vec![
            r.reference.to_string(),
            r.tenant.clone(),
            r.tool.clone(),
            state_label(r),
            rfc3339(r.claimed_at),
            rfc3339(r.updated_at),
        ]
    }));
    let mut text = table(&rows);
    let unknown = records.iter().filter(|r| outcome_unknown(r)).count();
    if unknown > 0 {
        text.push_str(&unknown_footer(unknown));
    }
    Ok(text)
}

/// `show`: one record, in full (its response only when asked), and its
/// follow-ons.
pub(super) async fn show(
    store: &dyn IdempotencyStore,
    args: Show,
    json: bool,
) -> Result<String, Failure> {
    let Show {
        reference,
        tenant,
        response,
    } = args;
    let reference = parse_reference(&reference)?;
    let record = match tenant {
        Some(tenant) => store.lookup(&tenant, &reference).await?.ok_or_else(|| {
            Failure(
                EXIT_OPERATOR,
                format!(
                    "no operation with reference {reference} in tenant {tenant:?}; check \
                     both (without --tenant, every tenant is searched)"
                ),
            )
        })?,
        None => find_anywhere(store, &reference).await?,
    };
    let tenant = record.tenant.clone();
    // The operation's follow-ons: waiting, running, dead or
    // delivered (kept as long as the record).
    let jobs = match store.follow_ons() {
        Some(follow_ons) => {
            follow_ons
                .list_follow_ons(&FollowOnFilter {
                    tenant: Some(tenant.clone()),
                    reference: Some(reference),
                    limit: 1000,
                    ..FollowOnFilter::default()
                })
                .await?
        }
        None => Vec::new(),
    };
    if json {
        let mut value = record_json(&record, response);
        value["jobs"] = Value::Array(jobs.iter().map(job_json).collect());
        return Ok(json_text(&value));
    }
    let value = record_json(&record, response);
    let rows: Vec<Vec<String>> = value
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let shown = match v {
                _ if k == "completed_by" => completed_by(&record).unwrap_or_default().to_owned(),
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            vec![format!("{k}:"), shown]
        })
        .collect();
    let mut text = table(&rows);
    if !response && matches!(record.state, RecordState::Completed { .. }) {
        text.push_str("(the response is not shown; --response prints it)\n");
    }
    if jobs.is_empty() {
        text.push_str("follow-ons: none\n");
    } else {
        let mut rows = vec![["FOLLOW-ON", "STATE", "RUNS", "WHEN", "LAST ERROR"]
            .map(str::to_owned)
            .to_vec()];
        rows.extend(jobs.iter().map(|j| {
            vec![
                j.id.name.clone(),
                j.state().as_str().to_owned(),
                job_runs(j),
                job_when(j),
                job_error(j),
            ]
        }));
        text.push_str(&table(&rows));
    }
    Ok(text)
}

/// The record with `reference` in whichever tenant holds it; refused when
/// none does, or when several do (then `--tenant` says which).
async fn find_anywhere(
    store: &dyn IdempotencyStore,
    reference: &Reference,
) -> Result<Record, Failure> {
    let mut found = store.find_by_reference(reference).await?;
    match found.len() {
        0 => Err(Failure(
            EXIT_OPERATOR,
            format!("no operation with reference {reference} in any tenant; check the reference"),
        )),
        1 => Ok(found.remove(0)),
        _ => {
            let mut tenants: Vec<&str> = found.iter().map(|r| r.tenant.as_str()).collect();
            tenants.sort_unstable();
            tenants.dedup();
            Err(Failure(
                EXIT_USAGE,
                format!(
                    "the reference {reference} is held by {} tenants ({}); say which with \
                     --tenant",
                    tenants.len(),
                    tenants
                        .iter()
                        .map(|t| format!("{:?}", shown(t)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    }
}

/// `stats`: how many records are in each state.
pub(super) async fn stats(store: &dyn IdempotencyStore, json: bool) -> Result<String, Failure> {
    let counts = store.count_records().await?;
    if json {
        let mut by_state = serde_json::Map::new();
        for kind in RecordStateKind::ALL {
            by_state.insert(kind.as_str().to_owned(), counts.get(kind).into());
        }
        by_state.insert("total".to_owned(), counts.total().into());
        return Ok(json_text(&Value::Object(by_state)));
    }
    let mut rows = vec![vec!["STATE".to_owned(), "RECORDS".to_owned()]];
    for kind in RecordStateKind::ALL {
        rows.push(vec![kind.as_str().to_owned(), counts.get(kind).to_string()]);
    }
    rows.push(vec!["total".to_owned(), counts.total().to_string()]);
    Ok(table(&rows))
}

/// `purge`: every expired record deleted, `batch` records per statement.
pub(super) async fn purge(
    store: &dyn IdempotencyStore,
    args: Purge,
    json: bool,
) -> Result<String, Failure> {
    let purged = maintenance::purge(store, args.batch).await?;
    Ok(if json {
        json_text(&json!({ "purged": purged }))
    } else {
        format!("purged {purged} expired records\n")
    })
}
