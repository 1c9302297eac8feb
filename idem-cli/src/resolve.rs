//! `resolve`: an UNKNOWN operation resolved by hand, with a note saying who
//! and why, its outcome stored as the tool would have stored it.

use rmcp::handler::server::wrapper::Json;
use rmcp::model::CallToolResult;
use serde_json::{json, Value};

use crate::args::{parse_reference, Resolve};
use crate::escape::shown;
use crate::render::{json_text, record_json};
use crate::{Failure, EXIT_USAGE};
use idem_runtime::follow_ons::FollowOn;
use idem_runtime::maintenance::{resolve_by_hand, Outcome};
use idem_runtime::mcp::stored_response;
use idem_runtime::store::IdempotencyStore;

/// `resolve`: the outcome given (`--completed`, `--completed-result` or
/// `--not-performed`) written to the UNKNOWN record, with the follow-on
/// follow-ons given for a completion; every argument is checked before the store
/// is written.
pub(super) async fn resolve(
    store: &dyn IdempotencyStore,
    args: Resolve,
    json: bool,
) -> Result<String, Failure> {
    let Resolve {
        reference,
        tenant,
        completed,
        completed_result,
        not_performed: _,
        follow_on,
        note,
    } = args;
    let reference = parse_reference(&reference)?;
    let follow_ons = follow_on
        .iter()
        .map(|given| parse_follow_on(given))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, job) in follow_ons.iter().enumerate() {
        if follow_ons[..i].iter().any(|j| j.name() == job.name()) {
            return Err(Failure(
                EXIT_USAGE,
                format!(
                    "--follow-on names the follow-on `{}` twice; an operation has one follow-on \
                     of each name, so give each once; nothing was changed",
                    job.name()
                ),
            ));
        }
    }
    let names: Vec<String> = follow_ons.iter().map(|j| j.name().to_owned()).collect();
    let outcome = match (completed, completed_result) {
        (Some(value), _) => Outcome::completed_with(structured_response(&value)?, follow_ons),
        (None, Some(result)) => Outcome::completed_with(whole_response(&result)?, follow_ons),
        (None, None) if !follow_ons.is_empty() => {
            return Err(Failure(
                EXIT_USAGE,
                "--follow-ons follow only a completed operation: resolve it with \
                 --completed or --completed-result, or give no --follow-on; nothing \
                 was changed"
                    .to_owned(),
            ))
        }
        (None, None) => Outcome::NotPerformed,
    };
    let record = resolve_by_hand(store, &tenant, &reference, &outcome, &note).await?;
    if json {
        let mut value = record_json(&record, false);
        value["follow_ons"] = json!(names);
        return Ok(json_text(&value));
    }
    let mut text = format!(
        "resolved {reference} in tenant {tenant:?}: {} ({})\n",
        record.state.name(),
        shown(record.resolution.as_deref().unwrap_or_default())
    );
    if !names.is_empty() {
        text.push_str(&format!(
            "follow-ons written with it: {}\n",
            names.join(", ")
        ));
    }
    Ok(text)
}

/// One `--follow-on NAME=JSON`: the follow-on, or why it is refused.
fn parse_follow_on(given: &str) -> Result<FollowOn, Failure> {
    let usage = |problem: String| Failure(EXIT_USAGE, format!("{problem}; nothing was changed"));
    let (name, payload) = given.split_once('=').ok_or_else(|| {
        usage(format!(
            "--follow-on {given:?} is not NAME=JSON: write the follow-on's name, `=`, and its \
             payload as JSON, e.g. --follow-on 'send_receipt={{\"to\":\"a@example.com\"}}'"
        ))
    })?;
    let payload: Value = serde_json::from_str(payload).map_err(|e| {
        usage(format!(
            "--follow-on {given:?}: the payload after `=` is not JSON ({e}); quote it for \
             the shell, e.g. --follow-on '{name}={{\"to\":\"a@example.com\"}}'"
        ))
    })?;
    FollowOn::new(name, &payload).map_err(|e| usage(format!("--follow-on {given:?}: {e}")))
}

/// What a tool that returned `text` (`--completed`: its structured result,
/// a JSON object) would have stored: the tool result `Json(value)` makes,
/// as [`stored_response`] writes it. A whole tool result given here is
/// refused, as is anything that is not a JSON object: either would replay
/// something the tool never returned.
fn structured_response(text: &str) -> Result<String, Failure> {
    let usage = |problem: String| {
        Failure(
            EXIT_USAGE,
            format!(
                "--completed {text:?} {problem}; nothing was changed. --completed takes the \
                 value the tool returned as its structured result, a JSON object such as \
                 '{{\"charge_id\":\"ch_42\"}}'; a tool whose result is text, or a whole \
                 tool result, goes in --completed-result '{{\"content\":[{{\"type\":\"text\",\
                 \"text\":\"...\"}}]}}'"
            ),
        )
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| usage(format!("is not JSON ({e})")))?;
    if !value.is_object() {
        return Err(usage("is not a JSON object".to_owned()));
    }
    if serde_json::from_value::<CallToolResult>(value.clone()).is_ok() {
        return Err(usage(
            "is a whole tool result (it has content, structuredContent or isError), not the \
             tool's structured value; to store it as given, pass it with --completed-result"
                .to_owned(),
        ));
    }
    stored_response(Json(value)).map_err(|e| usage(format!("cannot be stored ({e})")))
}

/// What a tool that returned the whole tool result `text`
/// (`--completed-result`) would have stored, as [`stored_response`] writes
/// it; refused unless MCP reads it as a tool result.
fn whole_response(text: &str) -> Result<String, Failure> {
    let usage = |problem: String| {
        Failure(
            EXIT_USAGE,
            format!(
                "--completed-result {text:?} {problem}; nothing was changed. Give the whole \
                 MCP tool result, e.g. '{{\"content\":[{{\"type\":\"text\",\"text\":\
                 \"charged ch_42\"}}]}}', or the tool's structured value with --completed"
            ),
        )
    };
    let result: CallToolResult =
        serde_json::from_str(text).map_err(|e| usage(format!("is not a tool result ({e})")))?;
    stored_response(result).map_err(|e| usage(format!("cannot be stored ({e})")))
}
