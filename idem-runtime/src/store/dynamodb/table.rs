//! The table's life: its creation ([`DynamoDbStore::create_table`]), its
//! migration from the layout before the `leases` index
//! ([`DynamoDbStore::migrate`]), the check a store makes before it serves,
//! and what a store knows of the `lapsed` index of tables created before
//! `leases`.
//!
//! Several starters may run each step at once (the replicas of a rolling
//! deploy, `idem create-table`, a test's setup). Each judges by what
//! `DescribeTable` shows, never by whether its own request was the one
//! DynamoDB took: a starter that loses the race to create the table or to
//! add the index waits for the winner's work and succeeds like it. DynamoDB
//! makes one change to a table at a time, and refuses a second one while
//! the first is under way (`ResourceInUseException`, and
//! `LimitExceededException` for a second index), or an index that exists
//! already (`ValidationException`; the emulator answers HTTP 500); every
//! starter then looks at the table again and waits.

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement, KeyType,
    Projection, ProjectionType, ScalarAttributeType, TableDescription, TableStatus,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use tokio::time::Instant;

use super::layout::{attr, Projected, INDEXES, LAPSED_INDEX, LEASES_INDEX, TTL_ATTRIBUTE};
use super::DynamoDbStore;
use crate::store::StoreError;

/// What a store knows of the table's `lapsed` index: not asked yet, there,
/// gone.
pub(super) const LAPSED_UNASKED: u8 = 0;
const LAPSED_PRESENT: u8 = 1;
const LAPSED_ABSENT: u8 = 2;

/// The first pause between two looks at a table DynamoDB is changing; each
/// next one is twice as long, up to [`MOST_BETWEEN_LOOKS`].
const FIRST_BETWEEN_LOOKS: Duration = Duration::from_millis(250);
const MOST_BETWEEN_LOOKS: Duration = Duration::from_secs(5);

impl DynamoDbStore {
    /// A store over `client` and `table`, after checking that the table
    /// exists and has this version's indexes (waiting, up to the
    /// [`migrate_timeout`](super::DynamoDbStoreBuilder::migrate_timeout),
    /// for a `leases` index another starter is adding). Errors: `Config`
    /// when it does not exist (create it with
    /// [`create_table`](DynamoDbStore::create_table) or from
    /// [`TABLE_DEFINITION`](super::TABLE_DEFINITION)) or was created by an
    /// earlier version and not migrated ([`migrate`](DynamoDbStore::migrate)),
    /// `Unavailable`.
    pub async fn connect(client: Client, table: &str) -> Result<Self, StoreError> {
        let store = Self::builder(client, table).build()?;
        store.check_table().await?;
        Ok(store)
    }

    /// Asks DynamoDB for the table: `Config` when it does not exist, or
    /// when it was created before the `leases` index and not migrated. A
    /// `leases` index another starter is adding is waited for until it is
    /// active (the sweep reads it, and DynamoDB refuses a read of an index
    /// it is still filling), up to the migrate timeout.
    pub(crate) async fn check_table(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.migrate_timeout;
        let table = self.describe().await?;
        match index_status(&table, LEASES_INDEX) {
            Some(IndexStatus::Active) => Ok(()),
            Some(_) => self.wait_for_leases(deadline).await,
            None => Err(StoreError::Config(format!(
                "the DynamoDB table {:?} has no `leases` index: it was created by an earlier \
                 version of idem, which may go on serving it. Migrate it before this version \
                 serves it: `idem --store 'dynamodb://{}?region=…' create-table` (it migrates \
                 a table that exists, and waits until the index is built), or \
                 DynamoDbStore::migrate; IAM: dynamodb:UpdateTable and dynamodb:DescribeTable",
                self.table, self.table
            ))),
        }
    }

    /// Creates the table as [`TABLE_DEFINITION`](super::TABLE_DEFINITION)
    /// describes it (on-demand billing, the four sparse indexes) and turns
    /// on its TTL, then waits until it is active: for tests and first runs.
    /// A table that exists already, or that another starter is creating, is
    /// migrated ([`migrate`](DynamoDbStore::migrate): it waits for the
    /// other's work) and otherwise left as it is. Waits up to the
    /// [`migrate_timeout`](super::DynamoDbStoreBuilder::migrate_timeout).
    /// Errors: `Unavailable` (also when the wait runs out), `Config`
    /// (credentials or IAM actions refused).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::operation::create_table::CreateTableError;
        let deadline = Instant::now() + self.migrate_timeout;
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
        let mut between = FIRST_BETWEEN_LOOKS;
        loop {
            let table = self.describe().await?;
            let active = table.as_ref().is_some_and(|t| {
                t.table_status() == Some(&TableStatus::Active)
                    && t.global_secondary_indexes()
                        .iter()
                        .all(|i| i.index_status() == Some(&IndexStatus::Active))
            });
            if active {
                break;
            }
            self.pause(&mut between, deadline, || {
                format!(
                    "the DynamoDB table {:?} was created but was not active after {:?}; run \
                     `idem create-table` (or create_table) again to wait for it, then it turns \
                     on its TTL",
                    self.table, self.migrate_timeout
                )
            })
            .await?;
        }
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
    /// version's layout: adds `leases` with one `UpdateTable`, and returns
    /// once DynamoDB has built it (`ACTIVE`; it fills a new index from
    /// every item of the table, and none carries its hash attribute `mq`,
    /// so it starts empty), so that the sweep can read it.
    ///
    /// Nothing else is changed: the old `lapsed` index and every item stay
    /// as they are, replicas of the earlier version go on serving meanwhile,
    /// and this version reads what they write. Run it before the new
    /// version takes traffic (`idem create-table` does, on a table that
    /// exists); running it again changes nothing.
    ///
    /// Several starters may run it at once: one adds the index, and every
    /// one returns once it is active. While DynamoDB changes the table
    /// (this index, or another change under way), it looks again, at most
    /// every 5 s, for up to the
    /// [`migrate_timeout`](super::DynamoDbStoreBuilder::migrate_timeout)
    /// (10 minutes by default). IAM: `dynamodb:DescribeTable` and
    /// `dynamodb:UpdateTable`.
    ///
    /// Returns whether this call added the index. Errors: `Config` when
    /// the table does not exist or the credentials may not change it,
    /// `Unavailable` when DynamoDB did not answer, or had not finished
    /// within the timeout (the index goes on being built; call it again to
    /// wait for it).
    pub async fn migrate(&self) -> Result<bool, StoreError> {
        let deadline = Instant::now() + self.migrate_timeout;
        let mut added = false;
        let mut between = FIRST_BETWEEN_LOOKS;
        loop {
            let table = self.describe().await?;
            if index_status(&table, LEASES_INDEX).is_some() {
                self.wait_for_leases(deadline).await?;
                return Ok(added);
            }
            let status = table.as_ref().and_then(|t| t.table_status());
            if status != Some(&TableStatus::Active) {
                // Another change under way (DynamoDB takes one at a time),
                // or a table another starter is still creating.
                self.pause(&mut between, deadline, || {
                    format!(
                        "the DynamoDB table {:?} was {} for {:?}, so the `leases` index could \
                         not be added yet (DynamoDB makes one change to a table at a time). \
                         Run the migration again once `aws dynamodb describe-table` shows the \
                         table ACTIVE",
                        self.table,
                        status.map_or("not described", |s| s.as_str()),
                        self.migrate_timeout
                    )
                })
                .await?;
                continue;
            }
            match self.add_leases()?.send().await {
                Ok(_) => added = true,
                // A change that started since the look: wait for it.
                Err(e) if busy(e.code()) => {
                    self.pause(&mut between, deadline, || {
                        format!(
                            "the DynamoDB table {:?} kept refusing the `leases` index for {:?} \
                             because another change to it was under way ({}); run the \
                             migration again once it is done",
                            self.table,
                            self.migrate_timeout,
                            e.code().unwrap_or_default()
                        )
                    })
                    .await?
                }
                // Another starter's index, added since the look, is
                // refused as existing; anything else is this starter's
                // problem, said with what to do.
                Err(e) => {
                    let now = self.describe().await?;
                    if index_status(&now, LEASES_INDEX).is_none() {
                        return Err(adding_leases(&self.table, self.err(e)));
                    }
                }
            }
        }
    }

    /// The `UpdateTable` that adds the `leases` index and its keys'
    /// attribute definitions.
    fn add_leases(
        &self,
    ) -> Result<
        aws_sdk_dynamodb::operation::update_table::builders::UpdateTableFluentBuilder,
        StoreError,
    > {
        use aws_sdk_dynamodb::types::{
            CreateGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate,
        };
        let built = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let (name, hash, range, projected) = INDEXES[0];
        debug_assert_eq!(name, LEASES_INDEX);
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
        Ok(self
            .client
            .update_table()
            .table_name(&*self.table)
            .attribute_definitions(definition(hash)?)
            .attribute_definitions(definition(range)?)
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder().create(action).build(),
            ))
    }

    /// Waits until the `leases` index is active, until `deadline`.
    async fn wait_for_leases(&self, deadline: Instant) -> Result<(), StoreError> {
        let mut between = FIRST_BETWEEN_LOOKS;
        loop {
            let table = self.describe().await?;
            let status = index_status(&table, LEASES_INDEX);
            if status == Some(IndexStatus::Active) {
                return Ok(());
            }
            self.pause(&mut between, deadline, || {
                format!(
                    "the `leases` index of the DynamoDB table {:?} was still {} after {:?}: \
                     DynamoDB fills a new index from every item of the table, which takes \
                     longer on a large one. Nothing is lost, and replicas of the earlier version \
                     serve meanwhile. Run the migration again to wait for it (`idem --store \
                     'dynamodb://{}?region=…' create-table`, or DynamoDbStore::migrate; \
                     DynamoDbStoreBuilder::migrate_timeout waits longer)",
                    self.table,
                    status.as_ref().map_or("missing", |s| s.as_str()),
                    self.migrate_timeout,
                    self.table
                )
            })
            .await?;
        }
    }

    /// Sleeps `between` (then doubled, up to [`MOST_BETWEEN_LOOKS`]) before
    /// the next look at a table DynamoDB is changing; `Unavailable`, saying
    /// `why`, when that would pass `deadline`.
    async fn pause(
        &self,
        between: &mut Duration,
        deadline: Instant,
        why: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        if Instant::now() + *between > deadline {
            return Err(StoreError::Unavailable(why()));
        }
        tokio::time::sleep(*between).await;
        *between = (*between * 2).min(MOST_BETWEEN_LOOKS);
        Ok(())
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
        self.lapsed_index.store(LAPSED_UNASKED, Ordering::Relaxed);
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
    async fn describe(&self) -> Result<Option<TableDescription>, StoreError> {
        Ok(self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| self.err(e))?
            .table)
    }
}

/// The status of the index `name` of `table`, `None` when it has none
/// such.
fn index_status(table: &Option<TableDescription>, name: &str) -> Option<IndexStatus> {
    table
        .iter()
        .flat_map(|t| t.global_secondary_indexes())
        .find(|i| i.index_name() == Some(name))
        .map(|i| i.index_status().cloned().unwrap_or(IndexStatus::Creating))
}

/// Whether DynamoDB refused a change to a table because another one is
/// under way: `ResourceInUseException` ("Attempt to change a resource
/// which is still in use"), or `LimitExceededException` (one index
/// created at a time per table).
fn busy(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("ResourceInUseException" | "LimitExceededException")
    )
}

/// A failed `UpdateTable` that adds `leases`, said as what it was for and
/// what to do.
fn adding_leases(table: &str, e: StoreError) -> StoreError {
    let say = |m: String, then: &str| {
        format!(
            "could not add the `leases` index to the DynamoDB table {table:?} ({m}); nothing \
             was changed, and replicas of the earlier version serve it meanwhile. {then}"
        )
    };
    let again = "Run the migration again (`idem create-table`, or DynamoDbStore::migrate)";
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(say(m, again)),
        StoreError::Config(m) => StoreError::Config(say(
            m,
            "Migrating needs the IAM actions dynamodb:DescribeTable and dynamodb:UpdateTable \
             on the table; grant them to the role that migrates, then run the migration again",
        )),
        StoreError::Invalid(m) => StoreError::Invalid(say(m, again)),
        e => e,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_under_way_is_waited_for() {
        assert!(busy(Some("ResourceInUseException")));
        assert!(busy(Some("LimitExceededException")));
        for other in [None, Some(""), Some("ValidationException")] {
            assert!(!busy(other), "{other:?}");
        }
    }
}
