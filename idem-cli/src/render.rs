//! How records and follow-ons read on the command line: as JSON, or as the cells
//! of an aligned table whose text is [`shown`] escaped.

use serde_json::{json, Value};

use crate::escape::shown;
use idem_runtime::store::rfc3339;
use idem_runtime::store::{
    CompletedBy, FollowOnRecord, FollowOnState, Reading, Record, RecordState,
};

/// Rows as columns padded to their widest cell, each cell [`shown`] escaped.
pub(super) fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<std::borrow::Cow<'_, str>>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| shown(cell)).collect())
        .collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// `value` as pretty JSON, one line at the end.
pub(super) fn json_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// The state, with a lapsed claim (its process presumably dead) said so.
pub(super) fn state_label(record: &Record) -> String {
    if record.is_lapsed() {
        format!("{} (lapsed)", record.state.name())
    } else {
        record.state.name().to_owned()
    }
}

/// What an operator does about a record whose outcome is unknown (UNKNOWN,
/// or IN_PROGRESS with its lease run out); `None` for any other.
///
/// The command line cannot know whether the servers run a reconciler, so
/// it says both: a reconciler resolves it where one runs, and otherwise,
/// or when the reconciler cannot tell, the operator does, with the command
/// written out. (The servers' answers say the one their
/// [`Resolver`](crate::answer::Resolver) names.)
pub(super) fn next_step(r: &Record) -> Option<String> {
    outcome_unknown(r).then(|| {
        format!(
            "the outcome is unknown and every repeat is refused until it is resolved: a \
             reconciler resolves it if the servers run one; if none runs, or it cannot tell, \
             find out at the processor and resolve it by hand: idem resolve {} --tenant {:?} \
             with --completed VALUE_JSON, --completed-result RESULT_JSON or --not-performed, \
             and --note WHO_AND_WHY",
            r.reference, r.tenant
        )
    })
}

/// Who brought `r` to COMPLETED or NOT_PERFORMED, in words
/// ([`Record::completed_by`]); `None` while its outcome is not settled.
pub(super) fn completed_by(r: &Record) -> Option<&'static str> {
    Some(match r.completed_by()? {
        CompletedBy::Handler => "the handler",
        CompletedBy::Reconciler => "the reconciler",
        CompletedBy::Operator => "an operator (idem resolve)",
        _ if matches!(r.state, RecordState::Completed { .. }) => {
            "unknown: the handler, completing after the record was marked UNKNOWN, or a \
             reconciler of an earlier idem, which left no note"
        }
        _ => "unknown: its notes are none that idem writes",
    })
}

/// Whether `r`'s outcome is unknown: UNKNOWN, or IN_PROGRESS with its lease
/// run out.
pub(super) fn outcome_unknown(r: &Record) -> bool {
    matches!(r.reading(), Reading::Unknown { .. })
}

/// The line under a listing that holds `unknown` records whose outcome is
/// unknown: who resolves them, and where to read how.
pub(super) fn unknown_footer(unknown: usize) -> String {
    let (n, them) = match unknown {
        1 => ("1 operation listed has".to_owned(), "it"),
        n => (format!("{n} operations listed have"), "each"),
    };
    format!(
        "{n} an unknown outcome: a reconciler resolves {them} if the servers run one; if \
         not, resolve {them} by hand (`idem show REFERENCE` says how)\n"
    )
}

/// A record as JSON: never the arguments (a record has none), the response
/// only when `response`; `next_step` when its outcome is unknown
/// ([`next_step`]).
pub(super) fn record_json(r: &Record, response: bool) -> Value {
    let (note, stored) = match &r.state {
        RecordState::InProgress => (None, None),
        RecordState::Completed { response } => (None, Some(response.as_str())),
        RecordState::Unknown { note } | RecordState::NotPerformed { note } => {
            (Some(note.as_str()), None)
        }
    };
    let mut value = json!({
        "reference": r.reference.to_string(),
        "tenant": r.tenant,
        "tool": r.tool,
        "state": r.state.name(),
        "lapsed": r.is_lapsed(),
        "note": note,
        "resolution": r.resolution,
        "completed_by": r.completed_by().map(CompletedBy::as_str),
        "claimed_at": rfc3339(r.claimed_at),
        "updated_at": rfc3339(r.updated_at),
        "lease_until": rfc3339(r.lease_until),
        "expires_at": rfc3339(r.expires_at),
        "retain_until": rfc3339(r.retain_until),
        "next_check_at": rfc3339(r.next_check_at),
        "checks": r.checks,
        "next_step": next_step(r),
    });
    if response {
        value["response"] = stored
            .map(|s| serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned())))
            .unwrap_or(Value::Null);
    }
    value
}

/// A follow-on as JSON, its payload included (a follow-on's payload is what its handler
/// needs, declared by the tool's own code). `last_error_is_current` says
/// whether `last_error` is the follow-on's present trouble (a dead follow-on's, or a
/// waiting or running follow-on's last failed run since it was written or
/// re-driven) rather than the trace of an earlier run.
pub(super) fn job_json(j: &FollowOnRecord) -> Value {
    json!({
        "reference": j.id.reference.to_string(),
        "name": j.id.name,
        "state": j.state().as_str(),
        "tenant": j.id.tenant,
        "downstream_key": j.id.downstream_key(),
        "runs": j.runs,
        "earlier_runs": j.earlier_runs,
        "all_runs": j.all_runs(),
        "dead": j.dead,
        "leased": j.attempt.is_some(),
        "next_run_at": rfc3339(j.next_run_at),
        "last_error": j.last_error,
        "last_error_is_current": j.last_error.is_some() && j.state() != FollowOnState::Delivered,
        "error_before_redrive": j.error_before_redrive,
        "redriven": redriven(j),
        "created_at": rfc3339(j.created_at),
        "updated_at": rfc3339(j.updated_at),
        "delivered_at": j.delivered_at.map(rfc3339),
        "kept_until": j.kept_until.map(rfc3339),
        "payload": serde_json::from_str::<Value>(&j.payload)
            .unwrap_or_else(|_| Value::String(j.payload.clone())),
    })
}

/// Whether the follow-on was ever re-driven, as far as its fields tell (a follow-on
/// re-driven by a store written before 0.2 shows none of it).
fn redriven(j: &FollowOnRecord) -> bool {
    j.earlier_runs > 0 || j.error_before_redrive.is_some()
}

/// The RUNS cell: how many times the follow-on ran in all, and, for a re-driven
/// follow-on, how many of those since its last re-drive (the count its retries
/// and its dead letter go by).
pub(super) fn job_runs(j: &FollowOnRecord) -> String {
    if redriven(j) {
        format!("{} ({} since a re-drive)", j.all_runs(), j.runs)
    } else {
        j.runs.to_string()
    }
}

/// The time that matters for a follow-on in its state: when it was delivered,
/// when it is due (waiting) or its lease runs out (running); none for a
/// dead follow-on, which waits for a person.
pub(super) fn job_when(j: &FollowOnRecord) -> String {
    match (j.state(), j.delivered_at) {
        (FollowOnState::Delivered, Some(at)) => rfc3339(at),
        (FollowOnState::Dead, _) => String::new(),
        _ => rfc3339(j.next_run_at),
    }
}

/// The LAST ERROR cell, never an old failure shown as the current one: a
/// waiting, running or dead follow-on's `last_error` is its last failed run since
/// it was written or re-driven, shown as it is; a delivered follow-on's is from a
/// run before the one that delivered it; a re-driven follow-on with no failed run
/// since shows the error it died of as from before the re-drive.
pub(super) fn job_error(j: &FollowOnRecord) -> String {
    match (&j.last_error, &j.error_before_redrive) {
        (Some(error), _) if j.state() == FollowOnState::Delivered => {
            format!("an earlier run: {error}")
        }
        (Some(error), _) => error.clone(),
        (None, Some(error)) => format!("before the re-drive: {error}"),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["A".to_owned(), "BB".to_owned(), "C".to_owned()],
            vec!["long".to_owned(), "x".to_owned(), "y".to_owned()],
        ];
        assert_eq!(table(&rows), "A     BB  C\nlong  x   y\n");
    }

    #[test]
    fn cells_show_control_and_invisible_characters_escaped() {
        assert_eq!(shown("plain, ünïcode"), "plain, ünïcode");
        assert_eq!(shown("a\nb\r\t\u{1b}[2J\u{7f}"), r"a\nb\r\t\u{1b}[2J\u{7f}");
        assert_eq!(shown("x\u{202e}y\u{200b}"), r"x\u{202e}y\u{200b}");
        assert_eq!(
            shown("a\u{61c}b\u{e0041}c\u{2028}d\u{2029}"),
            r"a\u{61c}b\u{e0041}c\u{2028}d\u{2029}"
        );
        let rows = vec![vec![
            "note:".to_owned(),
            "one\nresolution: forged".to_owned(),
        ]];
        assert_eq!(table(&rows), "note:  one\\nresolution: forged\n");
    }
}
