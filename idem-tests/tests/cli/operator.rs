//! What the cases share: `idem` runs the command line in process, `fill`
//! gives a store three records to read, and `operate` is everything an
//! operator does, on any store.

use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, ClaimRequest, RecordState},
    IdempotencyStore,
};
use serde_json::{json, Value};

/// What one run of the command line did.
#[derive(Debug)]
pub struct Ran {
    pub code: u8,
    pub out: String,
    pub err: String,
}

impl Ran {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.out).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// `idem --store STORE ARGS...`, run in process.
pub async fn idem(store: &str, args: &[&str]) -> Ran {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv: Vec<&str> = ["idem", "--store", store]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let code = idem_cli::run(argv, &mut out, &mut err).await;
    Ran {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

/// Three records in one fresh tenant: a completed charge, an UNKNOWN one, a
/// running shipment; returned in that order.
pub async fn fill(store: &dyn IdempotencyStore) -> Vec<ClaimRequest> {
    let first = claim_request(Duration::from_secs(900));
    let tenant = first.tenant.clone();
    let mut reqs = vec![first];
    for tool in ["charge_card", "create_shipment"] {
        tokio::time::sleep(Duration::from_millis(5)).await;
        reqs.push(ClaimRequest {
            tenant: tenant.clone(),
            tool: tool.to_owned(),
            ..claim_request(Duration::from_secs(900))
        });
    }
    for req in &reqs {
        assert!(matches!(
            store.claim(req).await.unwrap(),
            Claim::Claimed { .. }
        ));
    }
    store
        .complete(
            &reqs[0].key,
            reqs[0].attempt,
            r#"{"charge_id":"ch_secret_card"}"#,
        )
        .await
        .unwrap();
    store
        .mark_unknown(&reqs[1].key, reqs[1].attempt, "the processor timed out")
        .await
        .unwrap();
    reqs
}

/// Everything an operator does, on a store behind `url` that `store` (the
/// same one) was filled through.
pub async fn operate(url: &str, store: &dyn IdempotencyStore) {
    let reqs = fill(store).await;
    let tenant = reqs[0].tenant.as_str();
    let refs: Vec<String> = reqs.iter().map(|r| r.reference.to_string()).collect();

    // list: the newest claim first, aligned, no response in it; under it,
    // who resolves the one whose outcome is unknown (the command line cannot
    // know whether the servers run a reconciler, so it says both).
    let listed = idem(url, &["list", "--tenant", tenant]).await;
    assert_eq!(listed.code, EXIT_OK, "{listed:?}");
    let lines: Vec<&str> = listed.out.lines().collect();
    assert!(lines[0].starts_with("REFERENCE"), "{}", listed.out);
    assert_eq!(lines.len(), 5, "{}", listed.out);
    assert!(
        lines[4].starts_with("1 operation listed has an unknown outcome")
            && lines[4].contains("reconciler")
            && lines[4].contains("idem show REFERENCE"),
        "{}",
        listed.out
    );
    let lines = &lines[..4];
    for (line, (reference, state)) in lines[1..].iter().zip([
        (&refs[2], "IN_PROGRESS"),
        (&refs[1], "UNKNOWN"),
        (&refs[0], "COMPLETED"),
    ]) {
        assert!(
            line.starts_with(reference.as_str()) && line.contains(state),
            "{line}"
        );
    }
    let tool_column = lines[0].find("TOOL").unwrap();
    assert!(
        lines[1..].iter().all(|l| l[tool_column..].starts_with("c")),
        "aligned: {}",
        listed.out
    );
    assert!(!listed.out.contains("ch_secret_card"));

    let unknown = idem(
        url,
        &["--json", "list", "--tenant", tenant, "--state", "unknown"],
    )
    .await;
    assert_eq!(unknown.code, EXIT_OK, "{unknown:?}");
    let unknown = unknown.json();
    assert_eq!(unknown.as_array().unwrap().len(), 1, "{unknown}");
    assert_eq!(unknown[0]["reference"], json!(refs[1]));
    assert_eq!(unknown[0]["note"], json!("the processor timed out"));
    let next_step = unknown[0]["next_step"].as_str().unwrap();
    assert!(
        next_step.contains("a reconciler resolves it if the servers run one")
            && next_step.contains(&format!("idem resolve {} --tenant", refs[1])),
        "{next_step}"
    );
    // show: an unknown outcome says who resolves it, and the command.
    let shown = idem(url, &["show", &refs[1], "--tenant", tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(
        shown.out.contains("next_step:")
            && shown
                .out
                .contains(&format!("idem resolve {} --tenant {tenant:?}", refs[1])),
        "{}",
        shown.out
    );
    let shipments = idem(
        url,
        &[
            "--json",
            "list",
            "--tenant",
            tenant,
            "--tool",
            "create_shipment",
            "--limit",
            "5",
        ],
    )
    .await;
    assert_eq!(shipments.json()[0]["reference"], json!(refs[2]));

    // show: the response only when asked; no next step for what is known.
    let shown = idem(url, &["show", &refs[0], "--tenant", tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(
        shown.out.contains("COMPLETED") && !shown.out.contains("ch_secret_card"),
        "{}",
        shown.out
    );
    assert!(!shown.out.contains("next_step"), "{}", shown.out);
    assert!(
        shown.out.contains("--response"),
        "says how to see it: {}",
        shown.out
    );
    let with_response = idem(
        url,
        &["--json", "show", &refs[0], "--tenant", tenant, "--response"],
    )
    .await;
    assert_eq!(
        with_response.json()["response"],
        json!({ "charge_id": "ch_secret_card" })
    );
    let elsewhere = idem(url, &["show", &refs[0], "--tenant", "another-tenant"]).await;
    assert_eq!(elsewhere.code, EXIT_OPERATOR, "{elsewhere:?}");
    assert!(
        elsewhere.err.contains("no operation with reference"),
        "{}",
        elsewhere.err
    );
    let malformed = idem(url, &["show", "not-a-reference", "--tenant", tenant]).await;
    assert_eq!(malformed.code, EXIT_USAGE, "{malformed:?}");

    // stats
    let stats = idem(url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    let stats = stats.json();
    for state in ["IN_PROGRESS", "COMPLETED", "UNKNOWN"] {
        assert!(stats[state].as_u64().unwrap() >= 1, "{stats}");
    }
    let table = idem(url, &["stats"]).await;
    assert!(
        table.out.starts_with("STATE") && table.out.contains("total"),
        "{}",
        table.out
    );

    // resolve: only an UNKNOWN record, with a note; read back through the store.
    let note = "ops: alice, the processor's dashboard shows ch_42";
    let resolved = idem(
        url,
        &[
            "resolve",
            &refs[1],
            "--tenant",
            tenant,
            "--completed",
            r#"{"charge_id":"ch_42"}"#,
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");
    assert!(resolved.out.contains("COMPLETED"), "{}", resolved.out);
    let record = store
        .lookup(tenant, &reqs[1].reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: idem_runtime::mcp::stored_response(rmcp::handler::server::wrapper::Json(
                json!({"charge_id": "ch_42"})
            ))
            .unwrap()
        },
        "the tool's result, as the tool would have returned it"
    );
    assert_eq!(record.resolution.as_deref(), Some(note));
    let not_unknown = idem(
        url,
        &[
            "resolve",
            &refs[0],
            "--tenant",
            tenant,
            "--not-performed",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(not_unknown.code, EXIT_OPERATOR, "{not_unknown:?}");
    assert!(
        not_unknown.err.contains("not UNKNOWN"),
        "{}",
        not_unknown.err
    );
    let not_json = idem(
        url,
        &[
            "resolve",
            &refs[2],
            "--tenant",
            tenant,
            "--completed",
            "{oops",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(not_json.code, EXIT_USAGE, "{not_json:?}");
    let both = idem(
        url,
        &[
            "resolve",
            &refs[2],
            "--tenant",
            tenant,
            "--completed",
            "1",
            "--not-performed",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(both.code, EXIT_USAGE, "{both:?}");
    let neither = idem(
        url,
        &["resolve", &refs[2], "--tenant", tenant, "--note", note],
    )
    .await;
    assert_eq!(neither.code, EXIT_USAGE, "{neither:?}");

    let purged = idem(url, &["--json", "purge"]).await;
    assert_eq!(purged.code, EXIT_OK, "{purged:?}");
    assert!(purged.json()["purged"].is_u64());
}
