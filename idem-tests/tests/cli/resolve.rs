//! `resolve` as the far side and the executor see it: a repeat replays the
//! resolution as the tool's result, and follow-ons given with it are
//! written with it and delivered once.

use std::sync::Arc;
use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, FollowOnStore, RecordState},
    IdempotencyStore, SqliteStore,
};
use serde_json::{json, Value};

use crate::durable::temp_dir;
use crate::operator::idem;

/// A charge whose outcome the processor left unknown, through the executor
/// as the rmcp glue runs it (the tool's result is a `CallToolResult`), on a
/// SQLite file; returns its reference. `runs` counts the handler's runs.
async fn unknown_charge(
    executor: &idem_runtime::Executor,
    caller: &idem_runtime::Caller,
    cents: u64,
    runs: &std::sync::atomic::AtomicUsize,
) -> idem_runtime::answer::Answer<rmcp::model::CallToolResult, idem_runtime::ToolError> {
    use std::sync::atomic::Ordering;
    let args = json!({"card": "4242", "cents": cents});
    let op = idem_runtime::executor::Operation {
        caller,
        tool: "charge_card",
        args: &args,
        scope: idem_runtime::executor::ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    executor
        .run(op, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(idem_runtime::ToolError::unknown("the processor timed out"))
        })
        .await
}

/// `resolve --completed '{"charge_id":"ch_42"}'`, as the README writes it,
/// stores what the tool would have returned: a repeat of the call replays
/// that value as the tool's structured result, the handler does not run
/// again, and the status tool answers the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_by_hand_is_replayed_as_the_tools_result() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = temp_dir("cli-replay");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let executor = idem_runtime::Executor::new(store.clone());
    let caller = idem_runtime::Caller::new("acme", "alice");
    let runs = AtomicUsize::new(0);
    let first = unknown_charge(&executor, &caller, 500, &runs).await;
    let reference = match &first {
        idem_runtime::answer::Answer::Failed { reference, .. }
        | idem_runtime::answer::Answer::Unknown { reference, .. } => reference.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let resolved = idem(
        &url,
        &[
            "resolve",
            &reference,
            "--tenant",
            "acme",
            "--completed",
            r#"{"charge_id":"ch_42"}"#,
            "--note",
            "alice: the processor's dashboard shows ch_42",
        ],
    )
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");

    let again = unknown_charge(&executor, &caller, 500, &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );
    match again {
        idem_runtime::answer::Answer::Replayed { value, .. } => {
            assert_eq!(
                value.structured_content,
                Some(json!({"charge_id": "ch_42"}))
            );
            assert_eq!(value.is_error, Some(false));
        }
        other => panic!("a repeat is replayed with the resolution: {other:?}"),
    }
    let status = executor
        .status(&caller, &reference)
        .await
        .unwrap()
        .expect("the status tool finds it");
    let response = status.response.expect("a completed status has a response");
    assert_eq!(response["structuredContent"], json!({"charge_id": "ch_42"}));

    // A text tool's whole result goes in --completed-result; what would not
    // replay is refused, and the record stays UNKNOWN.
    let other = unknown_charge(&executor, &caller, 700, &runs).await;
    let other = other.reference().unwrap();
    for (flag, given, says) in [
        ("--completed", r#""charged""#, "not a JSON object"),
        ("--completed", "[1, 2]", "not a JSON object"),
        ("--completed", "{oops", "not JSON"),
        (
            "--completed",
            r#"{"content":[{"type":"text","text":"charged"}]}"#,
            "--completed-result",
        ),
        (
            "--completed-result",
            r#"{"charge_id":"ch_43"}"#,
            "not a tool result",
        ),
    ] {
        let refused = idem(
            &url,
            &[
                "resolve",
                &other.to_string(),
                "--tenant",
                "acme",
                flag,
                given,
                "--note",
                "ops",
            ],
        )
        .await;
        assert_eq!(refused.code, EXIT_USAGE, "{flag} {given}: {refused:?}");
        assert!(
            refused.err.contains(says),
            "{flag} {given}: {}",
            refused.err
        );
        assert!(
            matches!(
                store.lookup("acme", &other).await.unwrap().unwrap().state,
                RecordState::Unknown { .. }
            ),
            "{flag} {given} changed the record"
        );
    }
    let whole = idem(
        &url,
        &[
            "resolve",
            &other.to_string(),
            "--tenant",
            "acme",
            "--completed-result",
            r#"{"content":[{"type":"text","text":"charged ch_43"}]}"#,
            "--note",
            "ops: ch_43 on the dashboard",
        ],
    )
    .await;
    assert_eq!(whole.code, EXIT_OK, "{whole:?}");
    match unknown_charge(&executor, &caller, 700, &runs).await {
        idem_runtime::answer::Answer::Replayed { value, .. } => {
            assert_eq!(value.content.len(), 1);
            assert_eq!(
                value.content[0].as_text().map(|t| t.text.as_str()),
                Some("charged ch_43")
            );
        }
        other => panic!("a repeat is replayed with the resolution: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one run per operation");
}

/// `resolve --completed ... --follow-on NAME=JSON` writes the jobs the
/// handler would have declared, with the resolution; a dispatcher then runs
/// each once. With `--not-performed`, or malformed, the option is refused
/// and nothing is written: the record stays UNKNOWN and no job exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ons_are_written_with_a_resolution_by_hand() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = temp_dir("cli-follow-ons");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&req.key, req.attempt, "the processor timed out")
        .await
        .unwrap();
    let reference = req.reference.to_string();
    let tenant = req.tenant.as_str();
    let jobs = || async {
        store
            .list_follow_ons(&idem_runtime::store::FollowOnFilter {
                tenant: Some(tenant.to_owned()),
                states: vec![
                    idem_runtime::store::FollowOnState::Waiting,
                    idem_runtime::store::FollowOnState::Running,
                    idem_runtime::store::FollowOnState::Dead,
                ],
                limit: 10,
                ..idem_runtime::store::FollowOnFilter::default()
            })
            .await
            .unwrap()
    };
    let resolve = |extra: &'static [&'static str]| {
        let mut args = vec![
            "resolve",
            reference.as_str(),
            "--tenant",
            tenant,
            "--note",
            "ops: ch_42 on the dashboard",
        ];
        args.extend_from_slice(extra);
        let url = url.clone();
        async move { idem(&url, &args).await }
    };

    for (extra, says) in [
        (
            &[
                "--not-performed",
                "--follow-on",
                r#"send_receipt={"to":"a@example.com"}"#,
            ][..],
            "cannot be used with",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt",
            ][..],
            "NAME=JSON",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt={to",
            ][..],
            "not JSON",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send receipt=1",
            ][..],
            "A-Z a-z 0-9",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt=1",
                "--follow-on",
                "send_receipt=2",
            ][..],
            "twice",
        ),
    ] {
        let refused = resolve(extra).await;
        assert_ne!(refused.code, EXIT_OK, "{extra:?}: {refused:?}");
        assert!(refused.err.contains(says), "{extra:?}: {}", refused.err);
        let record = store.lookup(tenant, &req.reference).await.unwrap();
        assert!(
            matches!(record.unwrap().state, RecordState::Unknown { .. }),
            "{extra:?} changed the record"
        );
        assert!(jobs().await.is_empty(), "{extra:?} wrote a job");
    }

    let resolved = resolve(&[
        "--completed",
        r#"{"charge_id":"ch_42"}"#,
        "--follow-on",
        r#"send_receipt={"to":"a@example.com","charge_id":"ch_42"}"#,
        "--follow-on",
        r#"notify_warehouse=["w1"]"#,
    ])
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");
    assert!(resolved.out.contains("send_receipt"), "{}", resolved.out);
    let written = jobs().await;
    let mut payloads: Vec<(String, Value)> = written
        .iter()
        .map(|j| (j.id.name.clone(), serde_json::from_str(&j.payload).unwrap()))
        .collect();
    payloads.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        payloads,
        [
            ("notify_warehouse".to_owned(), json!(["w1"])),
            (
                "send_receipt".to_owned(),
                json!({"to": "a@example.com", "charge_id": "ch_42"})
            ),
        ]
    );

    // The far side: a dispatcher runs each job once.
    let sent = Arc::new(AtomicUsize::new(0));
    let handler = || {
        let counted = sent.clone();
        idem_runtime::follow_ons::follow_on_fn(move |_| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    };
    let handlers = idem_runtime::follow_ons::FollowOnHandlers::new()
        .on("send_receipt", handler())
        .on("notify_warehouse", handler());
    let config = idem_runtime::follow_ons::FollowOnConfig::default();
    for _ in 0..3 {
        idem_runtime::follow_ons::FollowOnDispatcher::round(&store, &handlers, &config)
            .await
            .unwrap();
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    assert!(jobs().await.is_empty(), "both delivered");
}
