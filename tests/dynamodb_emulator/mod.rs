//! What the DynamoDB tests share: the emulator (`IDEM_TEST_DYNAMODB_ENDPOINT`),
//! a client for it, and stores on fresh tables deleted afterwards.
#![allow(dead_code)]

use std::io::Write;
use std::time::Duration;

use idem_runtime::{store::Attempt, DynamoDbStore};

/// Whether this run is CI's, where a missing emulator fails instead of
/// skipping.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The emulator's endpoint, from `IDEM_TEST_DYNAMODB_ENDPOINT`. `None`
/// (after saying so on stderr, once) when it is unset outside CI; under
/// `CI=true` a missing variable is a failure.
pub fn endpoint() -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if under_ci() => panic!(
            "IDEM_TEST_DYNAMODB_ENDPOINT is not set, and CI=true: the DynamoDbStore tests need \
             an emulator (scripts/dynamodb-emulator start, then \
             IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:4567)"
        ),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the DynamoDbStore tests did not run: IDEM_TEST_DYNAMODB_ENDPOINT is \
                     not set. Start the emulator with scripts/dynamodb-emulator start and set \
                     IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:4567 (scripts/test does both \
                     when the emulator answers)"
                );
            });
            None
        }
    }
}

/// A client for the emulator at `endpoint`: test credentials, plain HTTP,
/// short timeouts.
pub fn client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{timeout::TimeoutConfig, BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// A fresh table name: parallel tests never see each other's records.
pub fn fresh_table() -> String {
    format!("idem-t-{:016x}", Attempt::random().get())
}

/// A DynamoDbStore on a fresh table of the emulator, deleted when this is
/// dropped.
#[derive(Debug)]
pub struct Table {
    pub store: DynamoDbStore,
    pub endpoint: String,
}

impl Table {
    /// `None` when the tests are skipped (see [`endpoint`]).
    pub async fn new() -> Option<Table> {
        let endpoint = endpoint()?;
        Some(Self::on(&endpoint).await)
    }

    /// A store on a fresh table at `endpoint`, created.
    pub async fn on(endpoint: &str) -> Table {
        let store = DynamoDbStore::builder(client(endpoint), fresh_table())
            .build()
            .unwrap();
        store.create_table().await.expect("create the table");
        Table {
            store,
            endpoint: endpoint.to_owned(),
        }
    }
}

impl std::ops::Deref for Table {
    type Target = DynamoDbStore;
    fn deref(&self) -> &DynamoDbStore {
        &self.store
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // The table goes with the test, on a thread of its own: drop may
        // run inside a runtime, which cannot block on another.
        let store = self.store.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), store.delete_table()).await
                });
            }
        })
        .join();
    }
}
