//! `create-table` on the DynamoDB emulator (`IDEM_TEST_DYNAMODB_ENDPOINT`).

use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{store::Claim, IdempotencyStore};
use serde_json::json;

use crate::dynamodb_emulator;
use crate::operator::idem;

/// `create-table` makes a DynamoDB table the store can use at once (on the
/// emulator, `IDEM_TEST_DYNAMODB_ENDPOINT`); before it, the store is
/// refused; other stores are told they need no such step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_makes_a_dynamodb_table() {
    let not_dynamodb = idem("sqlite:/tmp/none.sqlite3", &["create-table"]).await;
    assert_eq!(not_dynamodb.code, EXIT_USAGE, "{not_dynamodb:?}");
    assert!(
        not_dynamodb.err.contains("not a dynamodb:// URL"),
        "{}",
        not_dynamodb.err
    );
    let Some(endpoint) = dynamodb_emulator::endpoint() else {
        return;
    };
    // The emulator takes any credentials.
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let table = dynamodb_emulator::fresh_table();
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");

    let before = idem(&url, &["stats"]).await;
    assert_ne!(before.code, EXIT_OK, "no table yet: {before:?}");

    let made = idem(&url, &["create-table"]).await;
    assert_eq!(made.code, EXIT_OK, "{made:?}");
    assert!(made.out.contains(&table), "{}", made.out);
    let again = idem(&url, &["--json", "create-table"]).await;
    assert_eq!(again.code, EXIT_OK, "an existing table is kept: {again:?}");
    assert_eq!(again.json()["table"], json!(table));

    let stats = idem(&url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(0));
    // The store works on it: a claim, seen by the command line.
    let store = idem_runtime::DynamoDbStore::from_url(&url)
        .unwrap()
        .build()
        .unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let shown = idem(&url, &["--json", "show", &req.reference.to_string()]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert_eq!(shown.json()["tenant"], json!(req.tenant));
    let _ = store.delete_table().await;
}
