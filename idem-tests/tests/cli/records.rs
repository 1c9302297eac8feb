//! The records' commands on a SQLite store: `operate`'s round, and `show`
//! finding a reference in whichever tenant holds it and saying who
//! completed a record.

use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::maintenance::{reconcile, ReconcileConfig, Reconciler, Reconciliation};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::store::{Record, Resolution, Upkeep};
use idem_runtime::{
    store::{Claim, ClaimRequest},
    IdempotencyStore, SqliteStore,
};
use serde_json::{json, Value};

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

/// What `show` says completed a record, in its table and in `--json`: the
/// line, or `None` while the record's outcome is not settled.
async fn completed_by(url: &str, tenant: &str, reference: &str) -> (Option<String>, Value) {
    let table = idem(url, &["show", reference, "--tenant", tenant]).await;
    assert_eq!(table.code, EXIT_OK, "{table:?}");
    let line = table
        .out
        .lines()
        .find_map(|l| l.strip_prefix("completed_by:"))
        .map(|by| by.trim().to_owned());
    let json = idem(url, &["--json", "show", reference, "--tenant", tenant]).await;
    assert_eq!(json.code, EXIT_OK, "{json:?}");
    (line, json.json()["completed_by"].clone())
}

/// A reconciler that finds every charge performed and every shipment not.
#[derive(Debug)]
struct Processor;

#[idem_runtime::async_trait]
impl Reconciler for Processor {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match record.tool.as_str() {
            "charge_card" => Reconciliation::completed(r#"{"charge_id":"ch_found"}"#),
            _ => Reconciliation::not_performed(),
        })
    }
}

/// `show` says who completed a record, from what the record holds: its
/// handler, the reconciler (completed or not performed), or an operator
/// with `idem resolve`; a record resolved as a reconciler before this
/// version resolved it (no note) says that it cannot tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_says_who_completed_a_record() {
    let dir = temp_dir("cli-completed-by");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    // A completed charge, an UNKNOWN one, a running shipment.
    let reqs = fill(&store).await;
    let tenant = reqs[0].tenant.clone();
    let refs: Vec<String> = reqs.iter().map(|r| r.reference.to_string()).collect();

    let (line, json) = completed_by(&url, &tenant, &refs[0]).await;
    assert_eq!(line.as_deref(), Some("the handler"));
    assert_eq!(json, json!("handler"));
    // Running, or unknown: nobody yet.
    for reference in [&refs[1], &refs[2]] {
        let (line, json) = completed_by(&url, &tenant, reference).await;
        assert_eq!(line, None);
        assert_eq!(json, Value::Null);
    }

    // An operator resolves the unknown charge. A note idem writes itself
    // is not an operator's.
    let resolve = |note: &'static str| {
        let (url, tenant, reference) = (url.clone(), tenant.clone(), refs[1].clone());
        async move {
            idem(
                &url,
                &[
                    "resolve",
                    &reference,
                    "--tenant",
                    &tenant,
                    "--completed",
                    r#"{"charge_id":"ch_1"}"#,
                    "--note",
                    note,
                ],
            )
            .await
        }
    };
    let reserved = resolve("resolved by the reconciler, from what the processor reports").await;
    assert_eq!(reserved.code, EXIT_USAGE, "{reserved:?}");
    let resolved = resolve("alice: the processor's dashboard shows ch_1").await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");
    let (line, json) = completed_by(&url, &tenant, &refs[1]).await;
    assert_eq!(line.as_deref(), Some("an operator (idem resolve)"));
    assert_eq!(json, json!("operator"));

    // The reconciler finds a charge performed and a shipment not.
    let mut unknown = Vec::new();
    for tool in ["charge_card", "create_shipment", "charge_card"] {
        let req = ClaimRequest {
            tenant: tenant.clone(),
            tool: tool.to_owned(),
            ..claim_request(Duration::from_secs(900))
        };
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            Claim::Claimed { .. }
        ));
        store
            .mark_unknown(&req.key, req.attempt, "the processor timed out")
            .await
            .unwrap();
        unknown.push(req);
    }
    // The last charge is resolved as a reconciler of an earlier version
    // resolved one: completed, with no note.
    let old = unknown.pop().unwrap();
    let completed = Resolution::Completed {
        response: r#"{"charge_id":"ch_old"}"#,
    };
    store
        .resolve(&old.key, old.attempt, completed, None)
        .await
        .unwrap();
    let config = ReconcileConfig::default().with_settle(Duration::ZERO);
    let report = reconcile(&store, &Processor, &config).await.unwrap();
    assert_eq!(
        (report.completed, report.not_performed),
        (1, 1),
        "{report:?}"
    );
    for req in &unknown {
        let (line, json) = completed_by(&url, &tenant, &req.reference.to_string()).await;
        assert_eq!(line.as_deref(), Some("the reconciler"), "{}", req.tool);
        assert_eq!(json, json!("reconciler"));
    }
    let (line, json) = completed_by(&url, &tenant, &old.reference.to_string()).await;
    let line = line.unwrap();
    assert!(
        line.starts_with("unknown: the handler") && line.contains("earlier idem"),
        "{line}"
    );
    assert_eq!(json, json!("unknown"));
}
