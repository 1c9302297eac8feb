//! What a far side or a caller wrote (a note, a job's error, a tenant, a
//! tool's name), escaped in every table and exact in JSON.

use std::time::Duration;

use idem_cli::EXIT_OK;
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, ClaimRequest, FollowOnStore},
    IdempotencyStore, SqliteStore,
};
use serde_json::json;

use crate::durable::temp_dir;
use crate::operator::idem;

/// A note or a job's error from a far side may hold newlines and terminal
/// escape sequences: `show` and `jobs` print them escaped, one row each, so
/// they can neither forge a row (a `resolution:` the record does not have)
/// nor drive the operator's terminal; `--json` keeps them exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_escape_what_a_far_side_wrote() {
    let dir = temp_dir("cli-escape");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let forged = "processor said: timeout\nresolution:  alice: refunded, all fine\u{1b}[2J\u{7}\r";
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let receipt =
        idem_runtime::follow_ons::FollowOn::new("send_receipt", &json!({"to": "a@b"})).unwrap();
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&[receipt]).unwrap(),
        )
        .await
        .unwrap();
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_follow_ons(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store
        .bury_follow_on(&leased[0].id, token, forged)
        .await
        .unwrap();
    let unknown = ClaimRequest {
        tenant: req.tenant.clone(),
        ..claim_request(Duration::from_secs(900))
    };
    assert!(matches!(
        store.claim(&unknown).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&unknown.key, unknown.attempt, forged)
        .await
        .unwrap();
    let reference = unknown.reference.to_string();

    let shown = idem(&url, &["show", &reference, "--tenant", &req.tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let lines: Vec<&str> = shown.out.lines().collect();
    assert!(
        !lines.iter().any(|l| l.starts_with("resolution:")),
        "a forged row: {}",
        shown.out
    );
    let note = lines
        .iter()
        .find(|l| l.starts_with("note:"))
        .unwrap_or_else(|| panic!("{}", shown.out));
    assert!(
        note.contains(r"timeout\nresolution:") && note.contains(r"\u{1b}[2J\u{7}\r"),
        "{note}"
    );
    assert!(
        !shown.out.contains(['\u{1b}', '\u{7}', '\r']),
        "{:?}",
        shown.out
    );

    let dead = idem(&url, &["jobs", "--dead", "--tenant", &req.tenant]).await;
    assert_eq!(dead.code, EXIT_OK, "{dead:?}");
    assert_eq!(
        dead.out.lines().count(),
        2,
        "a header and one job: {}",
        dead.out
    );
    assert!(dead.out.contains(r"timeout\nresolution:"), "{}", dead.out);
    assert!(
        !dead.out.contains(['\u{1b}', '\u{7}', '\r']),
        "{:?}",
        dead.out
    );

    let exact = idem(
        &url,
        &["--json", "show", &reference, "--tenant", &req.tenant],
    )
    .await;
    assert_eq!(exact.json()["note"], json!(forged));
    let exact = idem(&url, &["--json", "jobs", "--dead", "--tenant", &req.tenant]).await;
    assert_eq!(exact.json()[0]["last_error"], json!(forged));
}

/// A tenant or a tool name may hold format characters that reorder or hide
/// what a terminal prints (U+061C, the tag characters): `show` and `list`
/// print them escaped; `--json` keeps them exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_escape_format_characters_in_tenants_and_tools() {
    let dir = temp_dir("cli-format");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let base = claim_request(Duration::from_secs(900));
    let tenant = format!("{}\u{61c}acme\u{e0041}", base.tenant);
    let escaped_tenant = format!(r"{}\u{{61c}}acme\u{{e0041}}", base.tenant);
    let req = ClaimRequest {
        tenant: tenant.clone(),
        tool: "charge\u{e0041}_card\u{61c}".to_owned(),
        ..base
    };
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .complete(&req.key, req.attempt, "\"paid\"")
        .await
        .unwrap();
    let reference = req.reference.to_string();
    let escaped_tool = r"charge\u{e0041}_card\u{61c}";

    let shown = idem(&url, &["show", &reference, "--tenant", &tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(shown.out.contains(escaped_tool), "{}", shown.out);
    assert!(shown.out.contains(&escaped_tenant), "{}", shown.out);
    assert!(
        !shown.out.contains(['\u{61c}', '\u{e0041}']),
        "{:?}",
        shown.out
    );

    let listed = idem(&url, &["list", "--tenant", &tenant]).await;
    assert_eq!(listed.code, EXIT_OK, "{listed:?}");
    assert_eq!(listed.out.lines().count(), 2, "{}", listed.out);
    assert!(listed.out.contains(escaped_tool), "{}", listed.out);
    assert!(
        !listed.out.contains(['\u{61c}', '\u{e0041}']),
        "{:?}",
        listed.out
    );

    let exact = idem(&url, &["--json", "show", &reference, "--tenant", &tenant]).await;
    assert_eq!(exact.json()["tool"], json!(req.tool));
    assert_eq!(exact.json()["tenant"], json!(tenant));
}
