//! The command line under the grants docs/deploying.md gives its two
//! roles: reading (`list`, `show`, `stats`, `jobs`) and resolving
//! (`resolve`, `purge`, `redrive`). On Redis as the ACL users it gives
//! (`idem-reader`, `idem-resolver`) on a server of the test's own; on
//! DynamoDB, whose emulator checks no IAM, with the actions each role's
//! requests need counted through a proxy and held to its IAM statement.

use std::collections::BTreeSet;
use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_USAGE};
use idem_runtime::follow_ons::FollowOn;
use idem_runtime::store::conformance::claim_request;
use idem_runtime::store::{Attempt, ClaimRequest, FollowOns, RecordStateKind};
use idem_runtime::{IdempotencyStore, RedisStore};

use crate::dynamodb_proxy::{documented_actions, Proxy};
use crate::operator::idem;
use crate::{dynamodb_emulator, redis_server};

/// What the roles work on, in one tenant: an operation whose job is in the
/// dead letter, one whose outcome is unknown, and one whose replica died
/// and whose life ends 300 ms after the fill (for the purge).
pub(crate) struct Filled {
    pub(crate) dead: ClaimRequest,
    pub(crate) unknown: ClaimRequest,
}

pub(crate) async fn fill(store: &dyn IdempotencyStore) -> Filled {
    let dead = claim_request(Duration::from_secs(900));
    let unknown = ClaimRequest {
        tenant: dead.tenant.clone(),
        ..claim_request(Duration::from_secs(900))
    };
    let dispatcher = store.follow_ons().unwrap();
    store.claim(&dead).await.unwrap();
    let receipt = FollowOn::new("receipt", &serde_json::json!({"to": "a@example.com"})).unwrap();
    dispatcher
        .complete_with_follow_ons(
            &dead.key,
            dead.attempt,
            "\"paid\"",
            FollowOns::new(std::slice::from_ref(&receipt)).unwrap(),
        )
        .await
        .unwrap();
    let token = Attempt::random();
    let leased = dispatcher
        .lease_follow_ons(&["receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    dispatcher
        .bury_follow_on(&leased[0].id, token, "no such address")
        .await
        .unwrap();
    store.claim(&unknown).await.unwrap();
    store
        .mark_unknown(&unknown.key, unknown.attempt, "the processor timed out")
        .await
        .unwrap();
    let died = ClaimRequest {
        lease: Duration::from_millis(100),
        retention: Duration::from_millis(300),
        ..claim_request(Duration::from_millis(300))
    };
    store.claim(&died).await.unwrap();
    Filled { dead, unknown }
}

/// Each reading command, answered.
pub(crate) async fn read(url: &str, filled: &Filled) {
    let tenant = filled.dead.tenant.as_str();
    let dead = filled.dead.reference.to_string();
    let unknown = filled.unknown.reference.to_string();
    for args in [
        &["list", "--tenant", tenant][..],
        &["show", &unknown],
        &["show", &dead, "--tenant", tenant, "--response"],
        &["stats"],
        &["follow-ons", "--dead"],
        &["follow-ons", "--reference", &dead],
    ] {
        let ran = idem(url, args).await;
        assert_eq!(ran.code, EXIT_OK, "idem {args:?}: {ran:?}");
    }
}

/// The resolving commands: the unknown outcome resolved with a job, the
/// dead job re-driven, a purge (once the dead replica's record has ended).
pub(crate) async fn resolve(url: &str, filled: &Filled) {
    tokio::time::sleep(Duration::from_millis(400)).await;
    let tenant = filled.dead.tenant.as_str();
    let dead = filled.dead.reference.to_string();
    let unknown = filled.unknown.reference.to_string();
    for args in [
        &resolution(&unknown, tenant)[..],
        &["redrive", &dead, "receipt", "--tenant", tenant],
        &["purge"],
    ] {
        let ran = idem(url, args).await;
        assert_eq!(ran.code, EXIT_OK, "idem {args:?}: {ran:?}");
    }
}

pub(crate) fn resolution<'a>(reference: &'a str, tenant: &'a str) -> [&'a str; 9] {
    [
        "resolve",
        reference,
        "--tenant",
        tenant,
        "--completed",
        "{\"charge_id\":\"ch_42\"}",
        "--follow-on",
        "receipt={\"to\":\"a@example.com\"}",
        "--note=the processor shows the charge (ops, ticket 12)",
    ]
}

/// On Redis: `idem-reader` reads everything and may change nothing (a
/// resolution is refused as a configuration error, the record left
/// UNKNOWN); `idem-resolver` reads and resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_runs_as_the_documented_redis_users() {
    let Some(server) = redis_server::Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let store = RedisStore::builder(&url).unwrap().build().unwrap();
    store.load_library().await.unwrap();
    let filled = fill(&store).await;
    let reader = redis_server::documented_user(&url, "idem-reader", "idem:*").await;
    let resolver = redis_server::documented_user(&url, "idem-resolver", "idem:*").await;

    read(&reader, &filled).await;
    let tenant = filled.unknown.tenant.as_str();
    let unknown = filled.unknown.reference.to_string();
    let refused = idem(&reader, &resolution(&unknown, tenant)).await;
    assert_eq!(refused.code, EXIT_USAGE, "{refused:?}");
    assert!(refused.err.contains("NOPERM"), "{}", refused.err);
    let record = store
        .lookup(tenant, &filled.unknown.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Unknown);

    read(&resolver, &filled).await;
    resolve(&resolver, &filled).await;
    let record = store
        .lookup(tenant, &filled.unknown.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Completed);
}

/// On DynamoDB: the reading commands need exactly the actions of
/// `IdemRead`; the resolving ones, with them, exactly those of
/// `IdemResolve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_needs_only_the_documented_actions_on_dynamodb() {
    let Some(endpoint) = dynamodb_emulator::endpoint() else {
        return;
    };
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let table = dynamodb_emulator::Table::on(&endpoint).await;
    let filled = fill(&table.store).await;
    let proxy = Proxy::start(&endpoint).await;
    let actions = proxy.record_actions();
    let url = format!(
        "dynamodb://{}?region=us-east-1&endpoint={}",
        table.table(),
        proxy.url
    );
    let taken = || std::mem::take(&mut *actions.lock().unwrap());

    read(&url, &filled).await;
    let reading = taken();
    assert_eq!(reading, documented_actions("IdemRead"));
    resolve(&url, &filled).await;
    let resolving: BTreeSet<String> = reading.union(&taken()).cloned().collect();
    assert_eq!(resolving, documented_actions("IdemResolve"));
    let record = table
        .lookup(&filled.unknown.tenant, &filled.unknown.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Completed);
}
