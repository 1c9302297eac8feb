//! The records' commands on a SQLite store: `operate`'s round, and `show`
//! finding a reference in whichever tenant holds it.

use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, ClaimRequest},
    IdempotencyStore, SqliteStore,
};
use serde_json::json;

use crate::durable::temp_dir;
use crate::operator::{fill, idem, operate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_on_a_sqlite_store() {
    let dir = temp_dir("cli-sqlite");
    let path = dir.join("idem.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();
    operate(&format!("sqlite:{}", path.display()), &store).await;
}

/// `show REF` finds the reference in whichever tenant holds it; asks for
/// `--tenant` only when two tenants hold it, and says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_finds_a_reference_without_its_tenant() {
    let dir = temp_dir("cli-show-anywhere");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let reqs = fill(&store).await;
    let reference = reqs[1].reference.to_string();

    let shown = idem(&url, &["--json", "show", &reference]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let shown = shown.json();
    assert_eq!(shown["tenant"], json!(reqs[1].tenant), "{shown}");
    assert_eq!(shown["state"], json!("UNKNOWN"), "{shown}");
    let table = idem(&url, &["show", &reference]).await;
    assert_eq!(table.code, EXIT_OK, "{table:?}");
    assert!(table.out.contains(&reqs[1].tenant), "{}", table.out);

    // Another tenant's record under the same reference (a reference is the
    // key's first eight bytes and the operation's tag): ambiguous.
    let mut bytes = *reqs[1].key.as_bytes();
    bytes[31] ^= 0xff;
    let key = idem_runtime::key::IdempotencyKey::from_parts(bytes, bytes);
    let copy = ClaimRequest {
        tenant: "globex".to_owned(),
        key,
        reference: idem_runtime::Reference::with_tag(&key, reqs[1].reference.tag()),
        ..claim_request(Duration::from_secs(900))
    };
    assert_eq!(copy.reference, reqs[1].reference);
    assert!(matches!(
        store.claim(&copy).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let ambiguous = idem(&url, &["show", &reference]).await;
    assert_eq!(ambiguous.code, EXIT_USAGE, "{ambiguous:?}");
    assert!(
        ambiguous.err.contains("2 tenants")
            && ambiguous.err.contains("--tenant")
            && ambiguous.err.contains("\"globex\"")
            && ambiguous.err.contains(&format!("{:?}", reqs[1].tenant)),
        "{}",
        ambiguous.err
    );
    let chosen = idem(&url, &["--json", "show", &reference, "--tenant", "globex"]).await;
    assert_eq!(chosen.code, EXIT_OK, "{chosen:?}");
    assert_eq!(chosen.json()["state"], json!("IN_PROGRESS"));

    // A reference nobody holds.
    let nobody = claim_request(Duration::from_secs(900))
        .reference
        .to_string();
    let missing = idem(&url, &["show", &nobody]).await;
    assert_eq!(missing.code, EXIT_OPERATOR, "{missing:?}");
    assert!(missing.err.contains("in any tenant"), "{}", missing.err);
}
