//! [`DynamoDbStoreBuilder`]: the client, the table and the clock; the
//! table's creation; and the store a `dynamodb://` URL names.

use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;

use super::layout::{attr, Projected, INDEXES, LAPSED_INDEX, LEASES_INDEX, TTL_ATTRIBUTE};
use super::DynamoDbStore;
use crate::store::StoreError;

/// The clocks' spread a store assumes unless told.
const DEFAULT_CLOCK_SPREAD: Duration = Duration::from_secs(1);

/// What a store knows of the table's `lapsed` index: not asked yet, there,
/// gone.
pub(super) const LAPSED_UNASKED: u8 = 0;
const LAPSED_PRESENT: u8 = 1;
const LAPSED_ABSENT: u8 = 2;

/// Configures a [`DynamoDbStore`]: the table and where the store reads the
/// time.
#[derive(Clone)]
pub struct DynamoDbStoreBuilder {
    client: Client,
    table: String,
    clock: Option<super::Clock>,
    clock_spread: Duration,
}

impl std::fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStoreBuilder")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStoreBuilder {
    pub(super) fn new(client: Client, table: String) -> Self {
        DynamoDbStoreBuilder {
            client,
            table,
            clock: None,
            clock_spread: DEFAULT_CLOCK_SPREAD,
        }
    }

    /// Reads the time from `clock` instead of the process clock: a
    /// simulation runs leases, windows and settle periods on its own time.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How far the replicas' clocks may disagree (default 1 s; keep it far
    /// below the lease, as docs/decisions.md's "Clocks" says). The sweep
    /// walks the `leases` index from a cursor another replica may have
    /// moved on its own clock; each walk starts this far behind the cursor,
    /// so a claim written on a clock that far behind is still found. Each
    /// round reads the records of that span again (half a read unit each):
    /// raise it only with the clocks' real spread.
    pub fn clock_spread(mut self, spread: Duration) -> Self {
        self.clock_spread = spread;
        self
    }

    /// The store. Sends nothing to DynamoDB. Errors: `Config` for a table
    /// name DynamoDB would refuse (3 to 255 characters from `A-Z a-z 0-9 _
    /// - .`).
    pub fn build(self) -> Result<DynamoDbStore, StoreError> {
        check_table_name(&self.table)?;
        Ok(DynamoDbStore {
            client: self.client,
            table: self.table.into(),
            clock: self.clock,
            clock_spread: self.clock_spread,
            lapsed_index: Arc::new(AtomicU8::new(LAPSED_UNASKED)),
        })
    }
}

fn check_table_name(table: &str) -> Result<(), StoreError> {
    let valid = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(StoreError::Config(format!(
            "invalid DynamoDB table name {table:?}: use 3 to 255 characters from A-Z a-z 0-9 _ - ."
        )))
    }
}

impl DynamoDbStore {
    /// A store over `client` and `table`, after checking that the table
    /// exists. Errors: `Config` when it does not (create it with
    /// [`create_table`](DynamoDbStore::create_table) or from
    /// [`TABLE_DEFINITION`](super::TABLE_DEFINITION)), `Unavailable`.
    pub async fn connect(client: Client, table: &str) -> Result<Self, StoreError> {
        let store = Self::builder(client, table).build()?;
        store.check_table().await?;
        Ok(store)
    }

    /// Asks DynamoDB for the table: `Config` when it does not exist, or
    /// when it was created before the `leases` index and not migrated.
    pub(crate) async fn check_table(&self) -> Result<(), StoreError> {
        if !self.index_names().await?.iter().any(|n| n == LEASES_INDEX) {
            return Err(StoreError::Config(format!(
                "the DynamoDB table {:?} has no `leases` index: it was created by an earlier \
                 version of idem. Add it before serving with this one: \
                 DynamoDbStore::migrate, or `idem --store dynamodb://{}?region=… create-table` \
                 (it migrates a table that exists)",
                self.table, self.table
            )));
        }
        Ok(())
    }

    /// Creates the table as [`TABLE_DEFINITION`](super::TABLE_DEFINITION)
    /// describes it (on-demand billing, the four sparse indexes) and turns
    /// on its TTL, then waits until it is active: for tests and first runs.
    /// A table that exists already is migrated ([`migrate`](DynamoDbStore::migrate))
    /// and otherwise left as it is. Errors: `Unavailable`, `Config`
    /// (credentials refused).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::operation::create_table::CreateTableError;
        let built = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .map_err(built)
        };
        let mut create = self
            .client
            .create_table()
            .table_name(&*self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(key(attr::PK, KeyType::Hash)?)
            .key_schema(key(attr::SK, KeyType::Range)?);
        let binary = [attr::PK, attr::SK].map(|a| (a, ScalarAttributeType::B));
        let numbers = INDEXES.iter().flat_map(|(_, hash, range, _)| {
            [
                (*hash, ScalarAttributeType::N),
                (*range, ScalarAttributeType::N),
            ]
        });
        for (name, kind) in binary.into_iter().chain(numbers) {
            create = create.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(kind)
                    .build()
                    .map_err(built)?,
            );
        }
        for (name, hash, range, projected) in INDEXES {
            create = create.global_secondary_indexes(index(name, hash, range, projected)?);
        }
        match create.send().await {
            Ok(_) => {}
            Err(e) => match e.as_service_error() {
                Some(CreateTableError::ResourceInUseException(_)) => {
                    self.migrate().await?;
                    return Ok(());
                }
                _ => return Err(self.err(e)),
            },
        }
        self.wait_active().await?;
        self.client
            .update_time_to_live()
            .table_name(&*self.table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(TTL_ATTRIBUTE)
                    .build()
                    .map_err(built)?,
            )
            .send()
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Brings a table created before the `leases` index (see "Tables
    /// created before the `leases` index" in the layout's notes) to this
    /// version's layout: adds `leases` with one `UpdateTable` and waits
    /// until DynamoDB has built it (from existing items: none carries its
    /// hash attribute `mq`, so it starts empty and is quick to build).
    /// Nothing else is changed: the old `lapsed` index and every item stay
    /// as they are, and this version reads them where they are. Run it
    /// before the new version takes traffic (`idem create-table` does, on a
    /// table that exists); running it again changes nothing. Returns
    /// whether it added the index. Errors: `Config` when the table does not
    /// exist, `Unavailable`.
    pub async fn migrate(&self) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::types::{
            CreateGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate,
        };
        let names = self.index_names().await?;
        if names.iter().any(|n| n == LEASES_INDEX) {
            return Ok(false);
        }
        let built = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let (name, hash, range, projected) = INDEXES[0];
        let created = index(name, hash, range, projected)?;
        let action = CreateGlobalSecondaryIndexAction::builder()
            .index_name(name)
            .set_key_schema(Some(created.key_schema().to_vec()))
            .set_projection(created.projection().cloned())
            .build()
            .map_err(built)?;
        let definition = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::N)
                .build()
                .map_err(built)
        };
        self.client
            .update_table()
            .table_name(&*self.table)
            .attribute_definitions(definition(hash)?)
            .attribute_definitions(definition(range)?)
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder().create(action).build(),
            )
            .send()
            .await
            .map_err(|e| self.err(e))?;
        self.wait_active().await?;
        Ok(true)
    }

    /// The names of the table's global secondary indexes. Errors:
    /// `Config` when the table does not exist, `Unavailable`.
    pub(super) async fn index_names(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .describe()
            .await?
            .iter()
            .flat_map(|t| t.global_secondary_indexes())
            .filter_map(|i| i.index_name().map(str::to_owned))
            .collect())
    }

    /// Whether the table still has the `lapsed` index of tables created
    /// before `leases`: asked once per store and remembered, until
    /// [`lapsed_index_gone`](Self::lapsed_index_gone) finds it deleted.
    pub(super) async fn has_lapsed_index(&self) -> Result<bool, StoreError> {
        use std::sync::atomic::Ordering;
        match self.lapsed_index.load(Ordering::Relaxed) {
            LAPSED_PRESENT => return Ok(true),
            LAPSED_ABSENT => return Ok(false),
            _ => {}
        }
        let has = self.index_names().await?.iter().any(|n| n == LAPSED_INDEX);
        let known = if has { LAPSED_PRESENT } else { LAPSED_ABSENT };
        self.lapsed_index.store(known, Ordering::Relaxed);
        Ok(has)
    }

    /// After a read of `lapsed` failed: whether the operator has deleted
    /// the index meanwhile (then it is not read again). Errors: those of
    /// `DescribeTable`.
    pub(super) async fn lapsed_index_gone(&self) -> Result<bool, StoreError> {
        self.lapsed_index
            .store(LAPSED_UNASKED, std::sync::atomic::Ordering::Relaxed);
        Ok(!self.has_lapsed_index().await?)
    }

    /// Deletes the table and everything in it: for tests.
    pub async fn delete_table(&self) -> Result<(), StoreError> {
        self.client
            .delete_table()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The table as DynamoDB describes it. Errors: `Config` when it does
    /// not exist, `Unavailable`.
    async fn describe(
        &self,
    ) -> Result<Option<aws_sdk_dynamodb::types::TableDescription>, StoreError> {
        Ok(self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| self.err(e))?
            .table)
    }

    /// Waits (up to two minutes) until the table and its indexes are
    /// active.
    async fn wait_active(&self) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::types::{IndexStatus, TableStatus};
        for _ in 0..240 {
            let table = self.describe().await?;
            let active = table.as_ref().is_some_and(|t| {
                t.table_status() == Some(&TableStatus::Active)
                    && t.global_secondary_indexes()
                        .iter()
                        .all(|i| i.index_status() == Some(&IndexStatus::Active))
            });
            if active {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(StoreError::Unavailable(format!(
            "the DynamoDB table {:?} was not active after two minutes",
            self.table
        )))
    }
}

/// The definition of the index `name` over `hash` and `range` (numbers),
/// holding `projected`.
fn index(
    name: &str,
    hash: &str,
    range: &str,
    projected: Projected,
) -> Result<GlobalSecondaryIndex, StoreError> {
    let built = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(built)
    };
    let projection = match projected {
        Projected::All => Projection::builder().projection_type(ProjectionType::All),
        Projected::Keys => Projection::builder().projection_type(ProjectionType::KeysOnly),
        Projected::Include(include) => Projection::builder()
            .projection_type(ProjectionType::Include)
            .set_non_key_attributes(Some(include.iter().map(|a| (*a).to_owned()).collect())),
    };
    GlobalSecondaryIndex::builder()
        .index_name(name)
        .key_schema(key(hash, KeyType::Hash)?)
        .key_schema(key(range, KeyType::Range)?)
        .projection(projection.build())
        .build()
        .map_err(built)
}

/// What a `dynamodb://TABLE?region=…&endpoint=…` URL names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) table: String,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
}

/// Parses `dynamodb://TABLE[?region=REGION][&endpoint=URL]`. Errors:
/// `Config`, saying what the URL should look like.
pub(crate) fn parse_url(url: &str) -> Result<Target, StoreError> {
    let usage = "use dynamodb://TABLE?region=REGION, and &endpoint=http://HOST:PORT for an \
                 emulator (e.g. dynamodb://idem?region=us-east-1&endpoint=http://127.0.0.1:4567)";
    let rest = url
        .strip_prefix("dynamodb://")
        .ok_or_else(|| StoreError::Config(format!("{url:?} is not a DynamoDB URL: {usage}")))?;
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err(StoreError::Config(format!(
            "{url:?} names no table: {usage}"
        )));
    }
    check_table_name(table)?;
    let mut target = Target {
        table: table.to_owned(),
        region: None,
        endpoint: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("region", v)) if !v.is_empty() => target.region = Some(v.to_owned()),
            Some(("endpoint", v)) if v.starts_with("http://") || v.starts_with("https://") => {
                target.endpoint = Some(v.to_owned())
            }
            _ => {
                return Err(StoreError::Config(format!(
                    "{url:?}: unknown or empty parameter {pair:?}; {usage}"
                )))
            }
        }
    }
    Ok(target)
}

/// An environment variable, `None` when unset or empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl DynamoDbStore {
    /// A builder for the table a `dynamodb://TABLE?region=…&endpoint=…`
    /// URL names, on a client of its own: the region from the URL (else
    /// `AWS_REGION`, else `AWS_DEFAULT_REGION`), the endpoint from the URL
    /// (else AWS's for the region; an emulator's is
    /// `endpoint=http://127.0.0.1:4567`), the credentials from
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`
    /// (there is no aws-config here: no profiles, no instance roles; for
    /// those, build the client with aws-config and call
    /// [`DynamoDbStore::builder`]), HTTPS by rustls, a 5-second timeout per
    /// attempt and a 3-second connect timeout. Sends nothing. Errors:
    /// `Config`, saying what to write.
    pub fn from_url(url: &str) -> Result<DynamoDbStoreBuilder, StoreError> {
        use aws_sdk_dynamodb::config::{
            timeout::TimeoutConfig, BehaviorVersion, Credentials, Region,
        };
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

        let target = parse_url(url)?;
        let region = target
            .region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or_else(|| {
                StoreError::Config(format!(
                    "{url:?} names no region: add ?region=REGION, or set AWS_REGION"
                ))
            })?;
        let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(StoreError::Config(
                "a dynamodb:// URL takes its credentials from AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), which are not set; an emulator \
                 takes any (e.g. testing/testing)"
                    .into(),
            ));
        };
        let credentials =
            Credentials::new(id, secret, env("AWS_SESSION_TOKEN"), None, "environment");
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
            .http_client(http)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(Duration::from_secs(5))
                    .build(),
            );
        if let Some(endpoint) = target.endpoint {
            config = config.endpoint_url(endpoint);
        }
        Ok(Self::builder(
            Client::from_conf(config.build()),
            target.table,
        ))
    }
}

/// The store a `dynamodb://` URL names ([`DynamoDbStore::from_url`]),
/// checked to exist. Errors: `Config`, `Unavailable`.
pub(crate) async fn open_url(url: &str) -> Result<DynamoDbStore, StoreError> {
    let store = DynamoDbStore::from_url(url)?.build()?;
    store.check_table().await?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_what_to_write() {
        assert_eq!(
            parse_url("dynamodb://idem?region=eu-west-1&endpoint=http://127.0.0.1:4567").unwrap(),
            Target {
                table: "idem".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:4567".into()),
            }
        );
        assert_eq!(
            parse_url("dynamodb://idem").unwrap(),
            Target {
                table: "idem".into(),
                region: None,
                endpoint: None,
            }
        );
        for bad in [
            "dynamodb://",
            "dynamodb://?region=x",
            "dynamodb://a",
            "dynamodb://idem?colour=blue",
            "dynamodb://idem?endpoint=127.0.0.1:4567",
            "dynamodb://bad table",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(
                e.contains("table") || e.contains("dynamodb://"),
                "{bad}: {e}"
            );
        }
    }
}
