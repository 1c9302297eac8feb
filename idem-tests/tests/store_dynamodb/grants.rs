//! The IAM actions each role's work needs, held to the lists
//! docs/deploying.md grants ("IAM"): the emulator checks no IAM, so a
//! proxy records what every request needs (a `TransactWriteItems` needs the
//! actions of the writes it holds).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::follow_ons::FollowOn;
use idem_runtime::store::conformance::{claim_request, new_operation};
use idem_runtime::store::{Attempt, Claim, FollowOns, Resolution, Upkeep};
use idem_runtime::{DynamoDbStore, IdempotencyStore};

use crate::create_table_before_leases;
use crate::dynamodb_emulator::{client, endpoint, fresh_table, Table};
use crate::dynamodb_proxy::{documented_actions, Actions, Proxy};

/// What the actions were, emptied for the next role.
fn taken(actions: &Actions) -> BTreeSet<String> {
    std::mem::take(&mut *actions.lock().unwrap())
}

/// Everything a server asks of its store, each method once or more: the
/// calls (a claim, its completion with a job, a replay, a rejection, a
/// heartbeat, a takeover that keeps the operation it replaces, the status
/// tool), the sweep, the reconciler (with a resolution that declares a
/// job), the purge and the follow-on dispatcher (a job delivered, one retried, one
/// buried, the due count).
async fn serve(store: &DynamoDbStore) {
    let jobs = |names: &[&str]| {
        names
            .iter()
            .map(|n| FollowOn::new(n, &serde_json::json!({"to": "a@example.com"})).unwrap())
            .collect::<Vec<_>>()
    };
    let dispatcher = store.follow_ons().unwrap();
    let claimed = |c: Claim| assert!(matches!(c, Claim::Claimed { .. }), "{c:?}");

    let paid = claim_request(Duration::from_secs(900));
    claimed(store.claim(&paid).await.unwrap());
    let receipts = jobs(&["receipt", "invoice", "ledger"]);
    dispatcher
        .complete_with_follow_ons(
            &paid.key,
            paid.attempt,
            "\"paid\"",
            FollowOns::new(&receipts).unwrap(),
        )
        .await
        .unwrap();
    let replay = store.claim(&new_operation(&paid)).await.unwrap();
    assert!(matches!(replay, Claim::Existing { .. }), "{replay:?}");
    assert!(store
        .lookup(&paid.tenant, &paid.reference)
        .await
        .unwrap()
        .is_some());

    let declined = claim_request(Duration::from_secs(900));
    claimed(store.claim(&declined).await.unwrap());
    store
        .release(&declined.key, declined.attempt)
        .await
        .unwrap();

    let mut short = claim_request(Duration::from_millis(300));
    short.lease = Duration::from_millis(200);
    short.retention = Duration::from_millis(300);
    claimed(store.claim(&short).await.unwrap());
    store
        .heartbeat(&short.key, short.attempt, Duration::from_millis(200))
        .await
        .unwrap();
    let timed_out = claim_request(Duration::from_secs(900));
    claimed(store.claim(&timed_out).await.unwrap());
    store
        .mark_unknown(&timed_out.key, timed_out.attempt, "the processor timed out")
        .await
        .unwrap();
    let refused = claim_request(Duration::from_secs(900));
    claimed(store.claim(&refused).await.unwrap());
    store
        .mark_unknown(&refused.key, refused.attempt, "the processor timed out")
        .await
        .unwrap();
    let mut window = claim_request(Duration::from_millis(200));
    window.retention = Duration::from_secs(3600);
    claimed(store.claim(&window).await.unwrap());
    store
        .complete(&window.key, window.attempt, "\"first\"")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The sweep.
    let lapsed = store.list_lapsed(100).await.unwrap();
    assert!(lapsed.iter().any(|r| r.key == short.key), "{lapsed:?}");
    assert!(store
        .mark_lapsed(&short.key, short.attempt, "the lease ran out")
        .await
        .unwrap());
    // The reconciler: a check taken, put off, then the answers.
    assert!(!store.list_unknown(100).await.unwrap().is_empty());
    let until = store
        .take_check(&timed_out.key, timed_out.attempt, Duration::from_secs(60))
        .await
        .unwrap();
    store
        .defer_check(&timed_out.key, timed_out.attempt, Duration::ZERO, until)
        .await
        .unwrap();
    dispatcher
        .resolve_with_follow_ons(
            &timed_out.key,
            timed_out.attempt,
            "\"charged\"",
            None,
            FollowOns::new(&jobs(&["receipt"])).unwrap(),
        )
        .await
        .unwrap();
    store
        .resolve(
            &refused.key,
            refused.attempt,
            Resolution::NotPerformed {
                note: "the processor has no such charge",
                settle: Duration::ZERO,
            },
            None,
        )
        .await
        .unwrap();
    // A call after the window: a new operation, the first one kept.
    claimed(store.claim(&new_operation(&window)).await.unwrap());
    // The purge (the record whose lease and retention ran out).
    tokio::time::sleep(Duration::from_millis(300)).await;
    while store.purge_expired(100).await.unwrap() > 0 {}

    // The follow-on dispatcher.
    assert!(!dispatcher.count_due_follow_ons().await.unwrap().is_empty());
    let token = Attempt::random();
    let leased = dispatcher
        .lease_follow_ons(
            &["receipt", "invoice", "ledger"],
            10,
            Duration::from_secs(60),
            token,
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 4, "{leased:?}");
    dispatcher
        .finish_follow_on(&leased[0].id, token)
        .await
        .unwrap();
    dispatcher
        .retry_follow_on(&leased[1].id, token, Duration::from_secs(1), "mailer busy")
        .await
        .unwrap();
    dispatcher
        .bury_follow_on(&leased[2].id, token, "no such address")
        .await
        .unwrap();
}

/// A server's work, from its start (`connect`), needs exactly the actions
/// docs/deploying.md grants a server (`IdemServe`): none missing, none
/// granted that it never needs (no `Scan`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_needs_exactly_the_documented_actions() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let table = Table::on(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await;
    let actions = proxy.record_actions();
    let store = DynamoDbStore::connect(client(&proxy.url), table.table())
        .await
        .unwrap();
    serve(&store).await;
    assert_eq!(taken(&actions), documented_actions("IdemServe"));
}

/// So does a server of this version on a table created before `leases`,
/// migrated, whose sweep and purge still read `lapsed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_a_migrated_table_needs_the_same_actions() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let table = create_table_before_leases(&endpoint).await;
    table.migrate().await.unwrap();
    let proxy = Proxy::start(&endpoint).await;
    let actions = proxy.record_actions();
    let store = Arc::new(
        DynamoDbStore::connect(client(&proxy.url), table.table())
            .await
            .unwrap(),
    );
    serve(&store).await;
    assert_eq!(taken(&actions), documented_actions("IdemServe"));
}

/// Creating a table (`idem create-table`), and migrating one created
/// before `leases`, need only the actions docs/deploying.md grants for it
/// (`IdemMigrate`), and between them every one of those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_and_migrating_need_the_documented_actions() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let proxy = Proxy::start(&endpoint).await;
    let actions = proxy.record_actions();
    let created = fresh_table();
    let url = |table: &str| format!("dynamodb://{table}?region=us-east-1&endpoint={}", proxy.url);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = idem_cli::run(
        ["idem", "--store", &url(&created), "create-table"],
        &mut out,
        &mut err,
    )
    .await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let _ = DynamoDbStore::builder(client(&endpoint), created)
        .build()
        .unwrap()
        .delete_table()
        .await;
    let old = create_table_before_leases(&endpoint).await;
    let code = idem_cli::run(
        ["idem", "--store", &url(old.table()), "create-table"],
        &mut out,
        &mut err,
    )
    .await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(taken(&actions), documented_actions("IdemMigrate"));
}
