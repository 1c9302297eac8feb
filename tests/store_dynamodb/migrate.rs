//! Migrating a table created before the `leases` index while other
//! starters migrate it too.

use idem_runtime::{DynamoDbStore, StoreError};

use crate::create_table_before_leases;
use crate::dynamodb_emulator::{client, endpoint};

/// How a starter brings the table to this version's layout.
#[derive(Clone, Copy, Debug)]
enum Starter {
    Migrate,
    CreateTable,
    OpenStoreCreate,
    CommandLine,
}

const STARTERS: [Starter; 4] = [
    Starter::Migrate,
    Starter::CreateTable,
    Starter::OpenStoreCreate,
    Starter::CommandLine,
];

/// One starter on `table` at `endpoint`, on a client of its own: `Err`
/// with what it said when it failed.
async fn start(starter: Starter, endpoint: &str, table: &str) -> Result<(), String> {
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");
    let store = || {
        DynamoDbStore::builder(client(endpoint), table)
            .build()
            .unwrap()
    };
    let said = |e: StoreError| format!("{e:?}");
    match starter {
        Starter::Migrate => store().migrate().await.map(drop).map_err(said),
        Starter::CreateTable => store().create_table().await.map_err(said),
        Starter::OpenStoreCreate => idem_runtime::open_store(&format!("{url}&create=true"))
            .await
            .map(drop)
            .map_err(said),
        Starter::CommandLine => {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = idem_runtime::cli::run(
                ["idem", "--store", &url, "create-table"],
                &mut out,
                &mut err,
            )
            .await;
            if code == idem_runtime::cli::EXIT_OK {
                Ok(())
            } else {
                Err(format!("exit {code}: {}", String::from_utf8_lossy(&err)))
            }
        }
    }
}

/// The emulator takes any credentials; a `dynamodb://` URL reads them from
/// the environment.
fn test_credentials() {
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
}

/// Four starters at once on a table from before `leases`, each its own
/// way (`migrate`, `create_table`, `open_store` with `create=true`, `idem
/// create-table`), on three tables: every one of them succeeds, and the
/// table then serves (`connect` finds `leases`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starters_migrating_at_once_all_succeed() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    test_credentials();
    let mut failures = Vec::new();
    for _ in 0..3 {
        let table = create_table_before_leases(&endpoint).await;
        let (endpoint, name) = (endpoint.as_str(), table.table());
        // One task polls the four: their requests are in flight together.
        let ran = futures::future::join_all(
            STARTERS.map(|starter| async move { (starter, start(starter, endpoint, name).await) }),
        )
        .await;
        for (starter, result) in ran {
            if let Err(e) = result {
                failures.push(format!("{starter:?}: {e}"));
            }
        }
        DynamoDbStore::connect(client(endpoint), name)
            .await
            .expect("migrated, it serves");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
