//! [`DynamoDbStore`]: records and follow-ons in one DynamoDB table.
//!
//! One job, the store and its record contract; the requests it sends (the
//! conditions, the values, the calls) are in `requests.rs`, the follow-on
//! jobs in `jobs.rs`, the item keys, attribute names and indexes in
//! `layout.rs`, reading items back and the SDK's errors in `items.rs`, the
//! builder and `dynamodb://` URLs in `builder.rs`, the table's creation and
//! migration in `table.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
    Update,
};
use aws_sdk_dynamodb::Client;

use crate::future::join_all;
use crate::key::{IdempotencyKey, Reference};
use crate::store::{
    self as store, due_order, lease_names, listing_order, sort_leased, Attempt, Claim,
    ClaimRequest, FollowOn, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnStore, FollowOns,
    IdempotencyStore, Inspect, ItemLimit, Limits, Record, RecordFilter, RecordStateKind,
    Resolution, StateCounts, StoreError, Upkeep,
};

mod builder;
mod items;
mod jobs;
mod layout;
mod requests;
mod table;
mod walk;

pub(crate) use builder::open_url;
pub use builder::DynamoDbStoreBuilder;
use items::{micros, sdk_error, ttl_secs};
pub use layout::TABLE_DEFINITION;
use layout::{attr, blob, num, shard, Item, EXPIRY_INDEX, LAPSED_INDEX, SHARDS, UNKNOWN_INDEX};
use requests::*;

use RecordStateKind::{Completed, InProgress, NotPerformed, Unknown};

/// Where a [`DynamoDbStore`] reads the time.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The sort keys' tags of the records an operator reads: the keys' current
/// records and the superseded operations.
const RECORDS: &[u8] = &[layout::RECORD_TAG, layout::SUPERSEDED_TAG];

/// The most items one `TransactWriteItems` writes.
const TRANSACTION_ITEMS: usize = 100;

/// The most follow-ons one completion writes: a transaction's items
/// less the record's.
pub const DYNAMODB_MAX_FOLLOW_ONS: usize = TRANSACTION_ITEMS - 1;

/// A record's and a job's item, as DynamoDB counts them (`layout.rs`).
const ITEM_LIMIT: ItemLimit =
    ItemLimit::new(layout::MAX_ITEM, layout::RECORD_BYTES, layout::JOB_BYTES)
        .with_follow_on_key(layout::JOB_KEY_TEXTS);

/// Records and follow-ons in one DynamoDB table, for servers on AWS
/// (AWS Lambda above all) that have DynamoDB and no PostgreSQL.
///
/// Give it a configured `aws_sdk_dynamodb::Client` and a table name
/// ([`DynamoDbStore::builder`]); [`create_table`](DynamoDbStore::create_table)
/// creates the table for tests and first runs, and [`TABLE_DEFINITION`] is
/// the same table for infrastructure code. `open_store` and the `idem`
/// command line take `dynamodb://TABLE?region=…&endpoint=…`.
///
/// # One conditional write per transition
///
/// A claim is one `PutItem` whose `ConditionExpression` admits only an
/// absent record or one that no longer holds its key
/// ([`Record::holds_key`]) and whose retention is over, never a
/// check-then-insert; when the condition fails, DynamoDB returns the record
/// it found (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), so a repeat
/// costs the same one round trip. Every other change (complete, release,
/// mark_unknown, mark_lapsed, resolve, defer_check, heartbeat) is one
/// `UpdateItem` or `DeleteItem` whose condition names the attempt (the
/// fencing token) and the states it may leave, and, where the change
/// depends on it, the lease or the settle period; the refused change's old
/// item tells `Fenced` from `WrongState`. Two changes take a second step, both rare: a claim that
/// takes over a record still in its retention (COMPLETED past its window,
/// or NOT_PERFORMED), fenced by the attempt and state it read and under the
/// same condition; and a completion that arrives after the record became
/// UNKNOWN or NOT_PERFORMED (its window's end is not moved: past it, the
/// key is free at once).
///
/// # Superseded operations
///
/// When that takeover starts a new operation (a new reference) while the
/// record's retention has not ended ([`Record::outlives_takeover`]), the
/// record it replaces is kept as an item of its own in the same partition,
/// written in the same `TransactWriteItems` as the new record: a race
/// refuses the whole transaction, and the claim judges the record again.
/// [`lookup`](IdempotencyStore::lookup) reads the key's current record
/// first and then the superseded ones, `list_records` and `count_records`
/// include them, and the purge deletes them at their retention end.
/// Nothing changes them after: every fenced change names the key's current
/// record, so an old attempt is `Fenced`.
///
/// # Follow-ons
///
/// A completion with jobs reads its record (the jobs take the operation's
/// tenant and reference) and then writes the completion and every job in
/// one `TransactWriteItems`: the record's update under the same fencing
/// condition, each job as a `Put` only if absent. A transaction holds at
/// most 100 items, so one completion writes at most
/// [`DYNAMODB_MAX_FOLLOW_ONS`] (99) jobs, and the executor refuses the
/// hundredth at its declaration
/// ([`Limits::max_follow_ons_per_completion`]); a transaction is also
/// at most 4 MB in all. A job is leased by a conditional `UpdateItem` (due
/// at the time of the write, live) that sets the lease's attempt; finish,
/// retry and bury are conditional on that attempt.
///
/// # The clock
///
/// DynamoDB has no server clock: every time (claimed, lease, expiry,
/// settle, next run) is this process's clock (`SystemTime::now()`, or the
/// builder's [`clock`](DynamoDbStoreBuilder::clock)), read once per call and
/// written into the condition, so within one call the times agree. Several
/// replicas each use their own clock, as processes sharing a SQLite file
/// do. A replica whose clock is ahead by *d*:
///
/// - sees leases run out *d* early: its sweep marks a live handler UNKNOWN
///   up to *d* before its lease ends (the handler's completion still wins
///   over UNKNOWN, and an UNKNOWN record is never taken over, so nothing runs
///   twice), and it answers a repeat "outcome unknown" instead of "in
///   progress";
/// - takes over a COMPLETED record up to *d* before its window ends: a
///   repeat in that last *d* of the window runs as a new operation (and
///   keeps reading the old one by its reference);
/// - writes records and leases that end *d* late on the other replicas'
///   clocks (the mirror of the above, seen from the others);
/// - past the retention, could take an UNKNOWN record over; past a job's
///   lease, could lease a running job again.
///
/// "Not performed" is never trusted early, whatever the skew: the settle
/// period also runs on the reconciling process's own monotonic clock
/// ([`SettleClock`](crate::maintenance::SettleClock)). The bounds, in terms
/// of lease, window and settle period, are in docs/clocks.md.
/// Keep the replicas' clocks in sync (NTP, which AWS Lambda and EC2 keep to
/// well under a second), with windows, leases and the settle period far
/// longer than the skew.
///
/// # Expiry
///
/// A record past its life ([`Record::is_expired`]: at its retention end,
/// and an IN_PROGRESS or UNKNOWN one once its lease ran out too) reads as
/// purged: `lookup`, `claim`, `list_records` and `count_records` never
/// return it, whether or not it has been deleted yet. A record completed
/// on time is deleted by DynamoDB's TTL (the attribute `tt`, its retention
/// end): free of write units, "typically within a few days" of that end.
/// The purge deletes the rest with a condition that re-checks the life at
/// the delete: NOT_PERFORMED records, superseded operations and delivered
/// jobs through the `expiry` index, UNKNOWN records through `unknown`,
/// IN_PROGRESS ones through the sweep's walk over `leases`. So a first
/// call writes no index at its completion: 3 write units in all (the
/// claim's item and its `leases` entry, the completion's item), where
/// putting each completion into `expiry` for the purge took 2 more, and
/// its delete 2 more again. The table's size is bounded by the traffic of
/// the retention period plus TTL's delay. Tables created before the
/// `leases` index: [`migrate`](DynamoDbStore::migrate).
///
/// # Errors
///
/// Throttling (`ProvisionedThroughputExceededException`,
/// `ThrottlingException`, `RequestLimitExceeded`), a timeout or a failed
/// connection is [`StoreError::Unavailable`]: the executor then fails closed
/// and the call may be retried. A missing table is [`StoreError::Config`],
/// with what to do. A request DynamoDB finds invalid (an item over 400 KB,
/// also inside a transaction, where it is cancelled with the reason
/// `ValidationError`) is [`StoreError::Invalid`]: nothing was written, and
/// the same request again would be refused again; the executor judges each
/// write against the item's size before it sends it
/// ([`Limits::item`]: 400,000 bytes, every attribute's name
/// and value counted), so a handler never runs only to have its completion
/// refused for the record's tenant or tool. The SDK's own retries,
/// timeouts and credentials are the client's, as configured.
///
/// ```no_run
/// # async fn f(client: aws_sdk_dynamodb::Client) -> Result<(), idem_runtime::StoreError> {
/// let store = idem_runtime::DynamoDbStore::builder(client, "idem").build()?;
/// store.create_table().await?; // tests and first runs; else from TABLE_DEFINITION
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: Arc<str>,
    clock: Option<Clock>,
    /// How far the replicas' clocks may disagree: the sweep's walk starts
    /// this far behind its cursor.
    clock_spread: Duration,
    /// How long a migration waits for DynamoDB to build an index.
    migrate_timeout: Duration,
    /// What the store knows of the `lapsed` index of tables created
    /// before `leases` (`table::LAPSED_UNASKED` and the others).
    lapsed_index: Arc<std::sync::atomic::AtomicU8>,
}

impl std::fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}
impl DynamoDbStore {
    /// A builder over `client` (configured with its region, endpoint and
    /// credentials) and the table `table`. Errors: `Config` for a table name
    /// DynamoDB would refuse.
    pub fn builder(client: Client, table: impl Into<String>) -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder::new(client, table.into())
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn now(&self) -> SystemTime {
        match &self.clock {
            Some(clock) => clock(),
            None => SystemTime::now(),
        }
    }

    fn err<E>(
        &self,
        e: aws_sdk_dynamodb::error::SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>,
    ) -> StoreError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
    {
        sdk_error(&self.table, e)
    }
}

#[async_trait]
impl IdempotencyStore for DynamoDbStore {
    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        // A few rounds: a takeover that reads the record first writes
        // fenced by the attempt it read, which another claim (or the late
        // completion of a NOT_PERFORMED record) may change first.
        for _ in 0..4 {
            let now = self.now();
            let item = self.claimed_item(req, req.reference, now);
            let values = free(now).set(":rf", blob(req.reference.as_bytes()));
            let Some(old) = self.put_claim(item, &first_claim(), values).await? else {
                return Ok(Claim::Claimed {
                    reference: req.reference,
                });
            };
            let Some(old) = old else {
                // Refused, yet no record: it was deleted in between.
                continue;
            };
            let record = items::record(&old, now)?;
            if record.holds_key(now) {
                return Ok(Claim::Existing { record });
            }
            // NOT_PERFORMED: the same operation tried again within its
            // window keeps its reference.
            let reference = record.takeover_reference(req.reference, now);
            let item = self.claimed_item(req, reference, now);
            let values = free(now)
                .set(":old", num(record.attempt.get()))
                .set(":st", num(record.state.kind().code()));
            let taken = if record.outlives_takeover(req.reference, now) {
                // A new operation takes the key; the one it replaces still
                // reads by its reference until its retention ends.
                self.take_over(item, values, superseded_item(&old, &record))
                    .await?
            } else {
                self.put_claim(item, &takeover(), values).await?.is_none()
            };
            if taken {
                return Ok(Claim::Claimed { reference });
            }
        }
        Err(StoreError::Unavailable(
            "DynamoDB: the record kept changing under the claim; try again".into(),
        ))
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        // One completion, with jobs or without (a network round trip
        // outweighs the second boxed future).
        self.complete_with_follow_ons(key, attempt, response, FollowOns::NONE)
            .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
        let from = [InProgress, Unknown];
        let values = Values::default()
            .set(":ak", num(attempt.get()))
            .states(&from);
        let sent = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(layout::record_key(key)))
            .condition_expression(owned(&from))
            .set_expression_attribute_values(values.into_inner())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(c)) => {
                    fence(c.item().cloned(), attempt, &from)?;
                    Err(StoreError::Fenced)
                }
                _ => Err(self.err(e)),
            },
        }
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        match self.mark(key, attempt, note, false).await? {
            true => Ok(()),
            false => Err(StoreError::Fenced),
        }
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":lu", num(micros(now + lease)))
            .set(":now", num(micros(now)));
        self.fenced(
            key,
            attempt,
            &[InProgress],
            None,
            "SET lu = :lu, ua = :now",
            values,
        )
        .await?
        .map_err(|_| StoreError::Fenced)
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let found = self.by_reference(reference, Some(tenant)).await?;
        Ok(found.into_iter().next())
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }

    // A response has no limit of its own: the record's item, with every
    // other attribute, is at most 400 KB. A transaction holds 100 items,
    // the record's and 99 jobs'; 4 MB, less the record's 400 KB item and 99
    // jobs' keys, for the jobs' payloads.
    fn limits(&self) -> Limits {
        Limits::NONE
            .with_item(ITEM_LIMIT)
            .with_max_follow_ons_per_completion(DYNAMODB_MAX_FOLLOW_ONS)
            .with_max_follow_on_bytes_per_completion(3 * 1024 * 1024)
    }
}

#[async_trait]
impl Upkeep for DynamoDbStore {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.mark(key, attempt, note, true).await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let (not_performed, settle) = match resolution {
            Resolution::Completed { response } => {
                return self
                    .complete_from(
                        key,
                        attempt,
                        &[Unknown],
                        response,
                        Some(note),
                        FollowOns::NONE,
                    )
                    .await;
            }
            Resolution::NotPerformed { note, settle } => (note, settle),
        };
        let now = self.now();
        let settled = micros(now).saturating_sub(micros(SystemTime::UNIX_EPOCH + settle));
        let mut values = Values::default()
            .set(":np", num(NotPerformed.code()))
            .set(":nt", AttributeValue::S(not_performed.to_owned()))
            .set(":now", num(micros(now)))
            .set(":settled", num(settled))
            .set(":xq", num(shard(key.as_bytes()[0])));
        // Into the `expiry` index at its retention end (the purge re-checks
        // the lease).
        let update = match note {
            Some(note) => {
                values = values.set(":rv", AttributeValue::S(note.to_owned()));
                "SET st = :np, nt = :nt, ua = :now, rv = :rv, xq = :xq, xk = ra REMOVE uq"
            }
            None => "SET st = :np, nt = :nt, ua = :now, xq = :xq, xk = ra REMOVE uq, rv",
        };
        // The settle period, judged in the same write: a request still in
        // flight may not show at the processor yet.
        match self
            .fenced(
                key,
                attempt,
                &[Unknown],
                Some("ua <= :settled"),
                update,
                values,
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(old) => Err(StoreError::NotSettled {
                until: items::at(items::number(&old, attr::UPDATED)?) + settle,
            }),
        }
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let mut values = Values::default()
            .set(":nc", num(micros(now + delay)))
            .set(":one", num(1));
        // `nc = :taken`: the deferral answers only the check taken, not one
        // another replica took once the hold ran out. Refused on that
        // condition alone, it is still UNKNOWN and nothing changed.
        if let Some(until) = taken {
            values = values.set(":taken", num(micros(until)));
        }
        Ok(self
            .fenced(
                key,
                attempt,
                &[Unknown],
                taken.map(|_| "nc = :taken"),
                "SET nc = :nc, ck = ck + :one",
                values,
            )
            .await?
            .is_ok())
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let now = self.now();
        let until = micros(now + hold);
        let values = Values::default()
            .set(":nc", num(until))
            .set(":now", num(micros(now)));
        // `nc <= :now`: taken only when due, so of the replicas that listed
        // the record one asks the processor. Refused on that condition
        // alone, it is still UNKNOWN and another replica holds the check.
        Ok(self
            .fenced(
                key,
                attempt,
                &[Unknown],
                Some("nc <= :now"),
                "SET nc = :nc",
                values,
            )
            .await?
            .ok()
            .map(|()| items::at(until)))
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let want = batch.saturating_mul(2);
        // NOT_PERFORMED records, records completed late from there,
        // superseded operations and delivered jobs are in the `expiry`
        // index (and records completed by versions before `leases`); an
        // IN_PROGRESS record past its life has a lapsed lease, so the walk
        // over `leases` finds it; an UNKNOWN one is in `unknown`, whatever
        // its next check (UNKNOWN records are few: each waits for a
        // reconciler or a person). A record completed on time is deleted
        // by its TTL, and no read returns it past its retention.
        let (expiring, lapsed, unknown) = tokio::join!(
            self.due(
                EXPIRY_INDEX,
                "xq = :s AND xk <= :now",
                attr::EXPIRY,
                want,
                now
            ),
            self.lapsed(want, now),
            self.due(
                UNKNOWN_INDEX,
                "uq = :s AND nc <= :now",
                attr::NEXT_CHECK,
                usize::MAX,
                SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 40),
            ),
        );
        let past_retention =
            |item: &Item| items::number(item, attr::RETAIN).is_ok_and(|ra| ra <= micros(now));
        let found = expiring?
            .into_iter()
            .chain(lapsed?.into_iter().filter(past_retention))
            .chain(unknown?.into_iter().filter(past_retention));
        // Records first, then delivered jobs; a record whose lease a
        // heartbeat moved past its retention is not expired yet.
        let mut doomed: Vec<(bool, Item)> = Vec::new();
        for item in found {
            if items::is_record(&item) {
                let settled = matches!(items::state_of(&item)?, Completed | NotPerformed);
                let lease = items::number(&item, attr::LEASE)?;
                if settled || lease <= micros(now) {
                    doomed.push((true, item));
                }
            } else if items::is_job(&item) {
                doomed.push((false, item));
            }
        }
        doomed.sort_by_key(|(record, _)| !record);
        doomed.truncate(batch);
        let deletes = doomed
            .into_iter()
            .map(|(record, item)| self.purge_one(record, item, now));
        let mut deleted = 0;
        for done in join_all(deletes).await {
            deleted += usize::from(done?);
        }
        Ok(deleted)
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        let found = self.lapsed(limit, now).await?;
        found.iter().map(|item| items::record(item, now)).collect()
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        let found = self
            .due(
                UNKNOWN_INDEX,
                "uq = :s AND nc <= :now",
                attr::NEXT_CHECK,
                limit,
                now,
            )
            .await?;
        found.iter().map(|item| items::record(item, now)).collect()
    }
}

#[async_trait]
impl Inspect for DynamoDbStore {
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        // Where `lookup` reads, without the tenant: one query, no scan.
        self.by_reference(reference, None).await
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        let mut found = Vec::new();
        for item in self.scan(RECORDS, None).await? {
            let record = items::record(&item, now)?;
            if !record.is_expired(now) && filter.matches(&record) {
                found.push(record);
            }
        }
        found.sort_by_key(|r| (std::cmp::Reverse(r.claimed_at), r.key.as_bytes().to_owned()));
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let now = self.now();
        let mut counts = StateCounts::default();
        for item in self.scan(RECORDS, None).await? {
            // Past its life, a record is not counted, as it is not read. (A
            // scan is charged by the items' size whatever it projects.)
            let record = items::record(&item, now)?;
            if !record.is_expired(now) {
                counts.add(record.state.kind(), 1);
            }
        }
        Ok(counts)
    }
}
