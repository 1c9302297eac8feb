//! [`DynamoDbStore`]: records and follow-on jobs in one DynamoDB table.
//!
//! One job, the store and its contract; the item keys, attribute names and
//! indexes are in `layout.rs`, reading items back and the SDK's errors in
//! `items.rs`, the builder, the table's creation and `dynamodb://` URLs in
//! `builder.rs`.

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
    ClaimRequest, FollowOn, FollowOnStore, FollowOns, IdempotencyStore, Job, JobFilter, JobId,
    Record, RecordFilter, RecordStateKind, Resolution, StateCounts, StoreError,
};

mod builder;
mod items;
mod layout;

pub(crate) use builder::open_url;
pub use builder::DynamoDbStoreBuilder;
use items::{micros, sdk_error, ttl_secs};
pub use layout::TABLE_DEFINITION;
use layout::{attr, blob, num, shard, Item, EXPIRY_INDEX, LAPSED_INDEX, SHARDS, UNKNOWN_INDEX};

use RecordStateKind::{Completed, InProgress, NotPerformed, Unknown};

/// Where a [`DynamoDbStore`] reads the time.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The sort keys' tags of the records an operator reads: the keys' current
/// records and the superseded operations.
const RECORDS: &[u8] = &[layout::RECORD_TAG, layout::SUPERSEDED_TAG];

/// The most items one `TransactWriteItems` writes.
const TRANSACTION_ITEMS: usize = 100;

/// The most follow-on jobs one completion writes: a transaction's items
/// less the record's.
pub const DYNAMODB_MAX_FOLLOW_ONS: usize = TRANSACTION_ITEMS - 1;

/// Records and follow-on jobs in one DynamoDB table, for servers on AWS
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
/// # Follow-on jobs
///
/// A completion with jobs reads its record (the jobs take the operation's
/// tenant and reference) and then writes the completion and every job in
/// one `TransactWriteItems`: the record's update under the same fencing
/// condition, each job as a `Put` only if absent. A transaction holds at
/// most 100 items, so one completion writes at most
/// [`DYNAMODB_MAX_FOLLOW_ONS`] (99) jobs, and the executor refuses the
/// hundredth at its declaration
/// ([`FollowOnStore::max_follow_ons_per_completion`]); a transaction is also
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
/// - trusts "not performed" up to *d* before the settle period is over.
///
/// Keep the replicas' clocks in sync (NTP, which AWS Lambda and EC2 keep to
/// well under a second), with windows, leases and the settle period far
/// longer than the skew.
///
/// # Expiry
///
/// The purge deletes what is past its life ([`Record::is_expired`]: a
/// record at its retention end, an IN_PROGRESS or UNKNOWN one once its
/// lease ran out too), found through the sparse indexes (`expiry` for
/// COMPLETED and NOT_PERFORMED records, superseded operations and
/// delivered jobs, `lapsed` and `unknown` for the others), with a condition
/// that re-checks the life at the delete. A COMPLETED record answers
/// repeats until its window ends and reads by its reference until its
/// retention ends.
/// DynamoDB's TTL (the attribute `tt`) is only a backstop for COMPLETED
/// records, superseded operations and delivered jobs (at their retention
/// end): it deletes up to days late, and reads still return an item it has
/// not deleted yet. Items written by earlier versions: see `layout.rs`.
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
/// the same request again would be refused again. The SDK's own retries,
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
}

impl std::fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// A record that no longer holds its key ([`Record::holds_key`], at `:now`,
/// `:secs` its whole seconds): COMPLETED past its window, NOT_PERFORMED,
/// or (any state) past its retention with its lease run out. The window of
/// an item an earlier version completed late (COMPLETED without `tt`) is
/// its `te`, as [`items::record`] reads it.
const FREE: &str = "(st = :np OR (ra <= :now AND lu <= :now) \
                    OR (st = :c AND (ea <= :now \
                    OR (attribute_not_exists(tt) AND te <= :secs))))";

/// The condition a claim's first write takes the key under, in one round
/// trip: no record, or one that no longer holds its key and is replaced
/// whole, its retention over (or the claim offers its very reference).
/// Any other takeover reads the record first ([`takeover`]).
fn first_claim() -> String {
    format!("attribute_not_exists(pk) OR ({FREE} AND (ra <= :now OR rf = :rf))")
}

/// A takeover of the record read, the attempt `:old` in state `:st`: still
/// that record, and still not holding its key.
fn takeover() -> String {
    format!("ak = :old AND st = :st AND {FREE}")
}

/// The purge's delete of a record: still past its life at the delete
/// ([`Record::is_expired`]).
const RECORD_EXPIRED: &str = "ra <= :now AND (st IN (:c, :np) OR lu <= :now)";

/// A fenced change's condition: the attempt owns the record, in one of the
/// states `:s0`, `:s1`, ….
fn owned(states: &[RecordStateKind]) -> String {
    let list: Vec<String> = (0..states.len()).map(|i| format!(":s{i}")).collect();
    format!("ak = :ak AND st IN ({})", list.join(", "))
}

/// What a refused fenced change's old item says ([`store::fence`]):
/// `Fenced` when the record is gone or another attempt owns it,
/// `WrongState` when it is in none of `from`; otherwise the old record, for
/// the caller to judge its own extra condition (a lease, a settle period)
/// against.
fn fence(
    old: Option<Item>,
    attempt: Attempt,
    from: &[RecordStateKind],
) -> Result<Item, StoreError> {
    let Some(old) = old else {
        return Err(StoreError::Fenced);
    };
    let owner = Attempt::from_stored(items::number(&old, attr::ATTEMPT)?);
    store::fence(Some((owner, items::state_of(&old)?)), attempt, from)?;
    Ok(old)
}

/// A write's values, built up by name.
#[derive(Default)]
struct Values(std::collections::HashMap<String, AttributeValue>);

impl Values {
    fn set(mut self, name: &str, value: AttributeValue) -> Self {
        self.0.insert(name.to_owned(), value);
        self
    }

    fn states(mut self, states: &[RecordStateKind]) -> Self {
        for (i, s) in states.iter().enumerate() {
            self.0.insert(format!(":s{i}"), num(s.code()));
        }
        self
    }

    fn into_inner(self) -> Option<std::collections::HashMap<String, AttributeValue>> {
        Some(self.0)
    }
}

/// How a record ends up COMPLETED, whatever state it leaves: its window's
/// end (`ea`) is not moved, so a completion that lands after it (from
/// UNKNOWN or NOT_PERFORMED) frees the key at once; the record goes into
/// the `expiry` index at its retention end, with the TTL backstop then
/// (`te`, the claim's retention end in seconds; its window's end on a
/// record an earlier version claimed).
fn completion(note: Option<Option<&str>>) -> String {
    let mut set = String::from("SET st = :c, rs = :rs, ua = :now, xq = :xq, xk = ra, tt = te");
    let mut remove = String::from(" REMOVE lq, uq");
    match note {
        Some(Some(_)) => set.push_str(", rv = :rv"),
        Some(None) => remove.push_str(", rv"),
        None => {}
    }
    set + &remove
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

    fn err<E, R>(&self, e: aws_sdk_dynamodb::error::SdkError<E, R>) -> StoreError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        sdk_error(&self.table, e)
    }

    /// The item of a new claim of `req` under `reference`, at `now`.
    fn claimed_item(&self, req: &ClaimRequest, reference: Reference, now: SystemTime) -> Item {
        let shard = num(shard(req.key.as_bytes()[0]));
        let deadlines = req.deadlines(now);
        let retain = deadlines.retain_until;
        let mut item = layout::record_key(&req.key);
        let mut put = |name: &str, value| {
            item.insert(name.to_owned(), value);
        };
        put(attr::FINGERPRINT, blob(req.key.fingerprint()));
        put(attr::TENANT, AttributeValue::S(req.tenant.clone()));
        put(attr::TOOL, AttributeValue::S(req.tool.clone()));
        put(attr::REFERENCE, blob(reference.as_bytes()));
        put(attr::ATTEMPT, num(req.attempt.get()));
        put(attr::STATE, num(InProgress.code()));
        put(attr::CLAIMED, num(micros(now)));
        put(attr::UPDATED, num(micros(now)));
        put(attr::LEASE, num(micros(deadlines.lease_until)));
        put(attr::EXPIRES, num(micros(deadlines.expires_at)));
        put(attr::RETAIN, num(micros(retain)));
        // No `nc` nor `ck` until the record is UNKNOWN: read back, they are
        // the claim's time and 0 (a record's bytes are its cost).
        // The TTL a completion sets: the retention's end.
        put(attr::TTL_AT, num(ttl_secs(retain)));
        // In the `lapsed` index only: an IN_PROGRESS record's end of life is
        // found through it (and an UNKNOWN one's through `unknown`), so a
        // claim writes one index, not two.
        put(attr::LAPSED_SHARD, shard);
        item
    }

    /// One `PutItem` of a claim under `condition`: `Ok(None)` written,
    /// `Ok(Some(old))` refused with the record found.
    async fn put_claim(
        &self,
        item: Item,
        condition: &str,
        values: Values,
    ) -> Result<Option<Option<Item>>, StoreError> {
        use aws_sdk_dynamodb::operation::put_item::PutItemError;
        let sent = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .set_expression_attribute_values(values.into_inner())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(None),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Some(c.item().cloned()))
                }
                _ => Err(self.err(e)),
            },
        }
    }

    /// A takeover that keeps the record it replaces: one
    /// `TransactWriteItems` of the new record's `Put` under [`takeover`]
    /// and the superseded operation's. `Ok(false)` when the record changed
    /// since it was read (or another transaction raced it): nothing was
    /// written, and the claim judges the record again.
    async fn take_over(
        &self,
        item: Item,
        values: Values,
        superseded: Item,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
        let built = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let claim = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression(takeover())
            .set_expression_attribute_values(values.into_inner())
            .build()
            .map_err(built)?;
        let kept = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(superseded))
            .build()
            .map_err(built)?;
        let sent = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(claim).build())
            .transact_items(TransactWriteItem::builder().put(kept).build())
            .send()
            .await;
        let e = match sent {
            Ok(_) => return Ok(true),
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) =
            e.as_service_error()
        else {
            return Err(self.err(e));
        };
        let reasons = cancel.cancellation_reasons();
        if let Some(invalid) = items::invalid_transaction(reasons) {
            return Err(invalid);
        }
        let raced = reasons.iter().any(|r| {
            matches!(
                r.code(),
                Some("ConditionalCheckFailed" | "TransactionConflict")
            )
        });
        if raced {
            Ok(false)
        } else {
            Err(self.err(e))
        }
    }

    /// A fenced `UpdateItem` of the record of `key`: `Ok(Ok(()))` written,
    /// `Ok(Err(old))` refused, with the item found (if any).
    async fn update(
        &self,
        key: &IdempotencyKey,
        condition: &str,
        update: &str,
        values: Values,
    ) -> Result<Result<(), Option<Item>>, StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(layout::record_key(key)))
            .condition_expression(condition)
            .update_expression(update)
            .set_expression_attribute_values(values.into_inner())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Ok(())),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Err(c.item().cloned()))
                }
                _ => Err(self.err(e)),
            },
        }
    }

    /// A change of the record of `key` fenced by `attempt` from one of
    /// `from`, with `extra` (if any) in the same condition. `Ok(Err(old))`
    /// when only `extra` refused it.
    async fn fenced(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        from: &[RecordStateKind],
        extra: Option<&str>,
        update: &str,
        values: Values,
    ) -> Result<Result<(), Item>, StoreError> {
        let mut condition = owned(from);
        if let Some(extra) = extra {
            condition = format!("{condition} AND {extra}");
        }
        let values = values.set(":ak", num(attempt.get())).states(from);
        match self.update(key, &condition, update, values).await? {
            Ok(()) => Ok(Ok(())),
            Err(old) => fence(old, attempt, from).map(Err),
        }
    }

    /// The purge's conditional delete of one item it listed (a record
    /// when `record`, else a delivered job): `Ok(true)` deleted,
    /// `Ok(false)` changed since it was listed and not past its life any
    /// more. A record an earlier version left in the `expiry` index at its
    /// window's end (its `xk` short of its retention end) is moved to its
    /// retention end instead, its TTL backstop with it, so that it is
    /// deleted then and does not stand at the index's head until then.
    async fn purge_one(
        &self,
        record: bool,
        item: Item,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
        let key: Item = [attr::PK, attr::SK]
            .into_iter()
            .filter_map(|k| item.get(k).map(|v| (k.to_owned(), v.clone())))
            .collect();
        let (condition, values) = if record {
            let values = Values::default()
                .set(":now", num(micros(now)))
                .set(":c", num(Completed.code()))
                .set(":np", num(NotPerformed.code()));
            (RECORD_EXPIRED, values)
        } else {
            let values = Values::default().set(":now", num(micros(now)));
            ("attribute_exists(dl) AND ku <= :now", values)
        };
        let sent = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(key.clone()))
            .condition_expression(condition)
            .set_expression_attribute_values(values.into_inner())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let old = match sent {
            Ok(_) => return Ok(true),
            Err(e) => match e.as_service_error() {
                // Changed since it was listed (a late completion, a new
                // claim): not expired any more.
                Some(DeleteItemError::ConditionalCheckFailedException(c)) => c.item().cloned(),
                _ => return Err(self.err(e)),
            },
        };
        let Some(old) = old.filter(|_| record) else {
            return Ok(false);
        };
        let (Some(xk), Ok(ra)) = (
            items::opt_number(&old, attr::EXPIRY)?,
            items::number(&old, attr::RETAIN),
        ) else {
            return Ok(false);
        };
        if xk >= ra {
            return Ok(false);
        }
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(key))
            .condition_expression("xk = :xk AND ra = :ra")
            .update_expression("SET xk = :ra, tt = :tt")
            .expression_attribute_values(":xk", num(xk))
            .expression_attribute_values(":ra", num(ra))
            .expression_attribute_values(":tt", num(ttl_secs(items::at(ra))))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(false),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }

    /// The record of `key`, read strongly consistent.
    async fn get(&self, key: &IdempotencyKey) -> Result<Option<Item>, StoreError> {
        let got = self
            .client
            .get_item()
            .table_name(&*self.table)
            .set_key(Some(layout::record_key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err(e))?;
        Ok(got.item)
    }

    /// A completion (`note`: `None` for `complete`, `Some` for a
    /// resolution, which writes its note) from one of `from`, with `jobs` in
    /// the same transaction.
    async fn complete_from(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        from: &[RecordStateKind],
        response: &str,
        note: Option<Option<&str>>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.len() > DYNAMODB_MAX_FOLLOW_ONS {
            return Err(StoreError::Invalid(format!(
                "{} follow-on jobs for one completion: DynamoDB writes at most {} with it (one \
                 transaction of {TRANSACTION_ITEMS} items)",
                jobs.len(),
                DYNAMODB_MAX_FOLLOW_ONS
            )));
        }
        let mut jobs: Vec<&FollowOn> = jobs.iter().collect();
        // A few rounds: the record may change between the read and the
        // write (then the transaction's condition refuses, and the next
        // round judges the new state), and a job that exists already is
        // left out, never replaced.
        for _ in 0..4 {
            let now = self.now();
            let values = |state: RecordStateKind| {
                let mut v = Values::default()
                    .set(":c", num(Completed.code()))
                    .set(":rs", AttributeValue::S(response.to_owned()))
                    .set(":now", num(micros(now)))
                    .set(":ak", num(attempt.get()))
                    .set(":xq", num(shard(key.as_bytes()[0])))
                    .states(&[state]);
                if let Some(Some(note)) = note {
                    v = v.set(":rv", AttributeValue::S(note.to_owned()));
                }
                v
            };
            if jobs.is_empty() {
                // No read: the usual state first, and the refusal's old
                // item tells the state to complete from otherwise (a late
                // completion, from UNKNOWN or NOT_PERFORMED).
                let mut state = from[0];
                for _ in 0..2 {
                    let update = completion(note);
                    match self
                        .update(key, &owned(&[state]), &update, values(state))
                        .await?
                    {
                        Ok(()) => return Ok(()),
                        Err(old) => state = items::state_of(&fence(old, attempt, from)?)?,
                    }
                }
                continue;
            }
            let old = fence(self.get(key).await?, attempt, from)?;
            let state = items::state_of(&old)?;
            let record = items::record(&old, now)?;
            let update = completion(note);
            let condition = owned(&[state]);
            let record_update = Update::builder()
                .table_name(&*self.table)
                .set_key(Some(layout::record_key(key)))
                .condition_expression(&condition)
                .update_expression(&update)
                .set_expression_attribute_values(values(state).into_inner())
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            let mut writes = vec![TransactWriteItem::builder().update(record_update).build()];
            for job in &jobs {
                let id = JobId {
                    tenant: record.tenant.clone(),
                    reference: record.reference,
                    name: job.name().to_owned(),
                };
                let put = Put::builder()
                    .table_name(&*self.table)
                    .set_item(Some(job_item(&id, job.payload(), now)))
                    .condition_expression("attribute_not_exists(pk)")
                    .build()
                    .map_err(|e| StoreError::Invalid(e.to_string()))?;
                writes.push(TransactWriteItem::builder().put(put).build());
            }
            use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(writes))
                .send()
                .await;
            let e = match sent {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) =
                e.as_service_error()
            else {
                return Err(self.err(e));
            };
            let failed = |code: Option<&str>| code == Some("ConditionalCheckFailed");
            let reasons = cancel.cancellation_reasons();
            if let Some(invalid) = items::invalid_transaction(reasons) {
                return Err(invalid);
            }
            if reasons.first().is_some_and(|r| failed(r.code())) {
                // The record changed since the read: judge it again.
                fence(reasons[0].item().cloned(), attempt, from)?;
                continue;
            }
            let existing: Vec<usize> = reasons
                .iter()
                .skip(1)
                .enumerate()
                .filter(|(_, r)| failed(r.code()))
                .map(|(i, _)| i)
                .collect();
            if existing.is_empty() {
                // Cancelled for another reason (a conflicting transaction,
                // throttling): nothing was written.
                return Err(self.err(e));
            }
            let mut i = 0;
            jobs.retain(|_| {
                let keep = !existing.contains(&i);
                i += 1;
                keep
            });
        }
        Err(StoreError::Unavailable(
            "DynamoDB: the record kept changing under the completion; try again".into(),
        ))
    }

    /// The due items of one sparse index over every shard, the earliest
    /// first (by `range`), at most `limit`: `key` is the key condition over
    /// `:s` (the shard) and `:now`.
    async fn due(
        &self,
        index: &str,
        key: &str,
        range: &str,
        limit: usize,
        now: SystemTime,
    ) -> Result<Vec<Item>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit32 = i32::try_from(limit).unwrap_or(i32::MAX);
        let calls = (0..SHARDS).map(|s| {
            self.client
                .query()
                .table_name(&*self.table)
                .index_name(index)
                .key_condition_expression(key)
                .expression_attribute_values(":s", num(s))
                .expression_attribute_values(":now", num(micros(now)))
                .limit(limit32)
                .send()
        });
        let mut found = Vec::new();
        for reply in join_all(calls).await {
            found.extend(reply.map_err(|e| self.err(e))?.items.unwrap_or_default());
        }
        found.sort_by_key(|item| items::number(item, range).unwrap_or(u64::MAX));
        found.truncate(limit);
        Ok(found)
    }

    /// Every item of the table whose sort key starts with one of `tags`
    /// (records and superseded operations, or jobs), read strongly
    /// consistent, page by page: the operator's
    /// reads. The items are told apart here, not by a filter expression: a
    /// scan is charged for every item it reads either way.
    async fn scan(&self, tags: &[u8], projection: Option<&str>) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&*self.table)
                .consistent_read(true)
                .set_projection_expression(projection.map(str::to_owned))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            found.extend(
                page.items
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|item| items::tag(item).is_some_and(|t| tags.contains(&t))),
            );
            start = page.last_evaluated_key;
            if start.is_none() {
                return Ok(found);
            }
        }
    }

    /// A change of job `id`, conditional on `condition`: `Ok(false)` when
    /// the condition refused it.
    async fn job_update(
        &self,
        id: &JobId,
        condition: &str,
        update: &str,
        values: Values,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(layout::job_key(id)))
            .condition_expression(condition)
            .update_expression(update)
            .set_expression_attribute_values(values.into_inner())
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }

    /// A change of a job leased to `attempt` (and not delivered): `Fenced`
    /// when another lease holds it, it is gone or delivered.
    async fn fenced_job(
        &self,
        id: &JobId,
        attempt: Attempt,
        update: &str,
        values: Values,
    ) -> Result<(), StoreError> {
        let values = values.set(":ja", num(attempt.get()));
        let condition = "ja = :ja AND attribute_not_exists(dl)";
        match self.job_update(id, condition, update, values).await? {
            true => Ok(()),
            false => Err(StoreError::Fenced),
        }
    }
}

/// The values [`FREE`] reads, at `now`.
fn free(now: SystemTime) -> Values {
    let micros = micros(now);
    Values::default()
        .set(":c", num(Completed.code()))
        .set(":np", num(NotPerformed.code()))
        .set(":now", num(micros))
        .set(":secs", num(micros / 1_000_000))
}

/// The superseded operation `old` (read as `record`) becomes when a new
/// operation takes its key: the record as it was, under its own sort key,
/// in the `expiry` index and with the TTL backstop at its retention end,
/// in no other index; its window as it reads.
fn superseded_item(old: &Item, record: &Record) -> Item {
    let mut item = old.clone();
    for name in [
        attr::LAPSED_SHARD,
        attr::UNKNOWN_SHARD,
        attr::DUE_SHARD,
        attr::TTL_AT,
    ] {
        item.remove(name);
    }
    item.extend(layout::superseded_key(&record.key, &record.reference));
    for (name, value) in [
        (attr::EXPIRES, num(micros(record.expires_at))),
        (attr::EXPIRY_SHARD, num(shard(record.key.as_bytes()[0]))),
        (attr::EXPIRY, num(micros(record.retain_until))),
        (attr::TTL, num(ttl_secs(record.retain_until))),
    ] {
        item.insert(name.to_owned(), value);
    }
    item
}

/// A new job's item: due at `now`, no runs, in the `due` index.
fn job_item(id: &JobId, payload: &str, now: SystemTime) -> Item {
    let mut item = layout::job_key(id);
    let now = num(micros(now));
    for (name, value) in [
        (attr::TENANT, AttributeValue::S(id.tenant.clone())),
        (attr::REFERENCE, blob(id.reference.as_bytes())),
        (attr::NAME, AttributeValue::S(id.name.clone())),
        (attr::PAYLOAD, AttributeValue::S(payload.to_owned())),
        (attr::RUNS, num(0)),
        (attr::NEXT_RUN, now.clone()),
        (attr::CREATED, now.clone()),
        (attr::UPDATED, now),
        (attr::DUE_SHARD, num(shard(id.reference.as_bytes()[0]))),
    ] {
        item.insert(name.to_owned(), value);
    }
    item
}

#[async_trait]
impl IdempotencyStore for DynamoDbStore {
    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    // A 400 KB item, less 16 KiB for the record's other attributes.
    fn max_response_bytes(&self) -> Option<usize> {
        Some(384 * 1024)
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
        self.complete_from(
            key,
            attempt,
            &[InProgress, Unknown, NotPerformed],
            response,
            None,
            FollowOns::NONE,
        )
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
    ) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":nc", num(micros(now + delay)))
            .set(":one", num(1));
        self.fenced(
            key,
            attempt,
            &[Unknown],
            None,
            "SET nc = :nc, ck = ck + :one",
            values,
        )
        .await?
        .map_err(|_| StoreError::Fenced)
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
        let now = self.now();
        // The one partition the reference names, strongly consistent: a
        // status read right after a claim finds it. Its record and
        // superseded items (jobs sort before them), the key's current
        // record first.
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND sk >= :r")
                .filter_expression("tn = :tn AND rf = :rf")
                .expression_attribute_values(":pk", layout::partition_of(reference))
                .expression_attribute_values(":r", blob(&[layout::RECORD_TAG]))
                .expression_attribute_values(":tn", AttributeValue::S(tenant.to_owned()))
                .expression_attribute_values(":rf", blob(reference.as_bytes()))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            let found = page.items.unwrap_or_default();
            if let Some(item) = found.iter().find(|item| items::is_record(item)) {
                return Ok(Some(items::record(item, now)?));
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                return Ok(None);
            }
        }
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let want = batch.saturating_mul(2);
        // COMPLETED and NOT_PERFORMED records, superseded operations and
        // delivered jobs are in the `expiry` index; an IN_PROGRESS record past its life has a lapsed
        // lease, so `lapsed` lists it; an UNKNOWN one is in `unknown`,
        // whatever its next check (UNKNOWN records are few: each waits
        // for a reconciler or a person).
        let (expiring, lapsed, unknown) = tokio::join!(
            self.due(
                EXPIRY_INDEX,
                "xq = :s AND xk <= :now",
                attr::EXPIRY,
                want,
                now
            ),
            self.due(
                LAPSED_INDEX,
                "lq = :s AND lu <= :now",
                attr::LEASE,
                want,
                now
            ),
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
        let found = self
            .due(
                LAPSED_INDEX,
                "lq = :s AND lu <= :now",
                attr::LEASE,
                limit,
                now,
            )
            .await?;
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

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        let mut found = Vec::new();
        for item in self.scan(RECORDS, None).await? {
            let record = items::record(&item, now)?;
            if filter.matches(&record) {
                found.push(record);
            }
        }
        found.sort_by_key(|r| (std::cmp::Reverse(r.claimed_at), r.key.as_bytes().to_owned()));
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let mut counts = StateCounts::default();
        for item in self.scan(RECORDS, Some("sk, st")).await? {
            counts.add(items::state_of(&item)?, 1);
        }
        Ok(counts)
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

impl DynamoDbStore {
    /// IN_PROGRESS → UNKNOWN with `note`; with `lapsed`, only if the lease
    /// ran out at the write (`Ok(false)` when a heartbeat kept it alive).
    async fn mark(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
        lapsed: bool,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":u", num(Unknown.code()))
            .set(":nt", AttributeValue::S(note.to_owned()))
            .set(":now", num(micros(now)))
            .set(":zero", num(0))
            .set(":shard", num(shard(key.as_bytes()[0])));
        let update = "SET st = :u, nt = :nt, ua = :now, nc = :now, ck = :zero, uq = :shard \
                      REMOVE lq";
        // The lapse re-checked in the same write: a heartbeat that landed
        // after the sweep listed the record wins.
        let extra = lapsed.then_some("lu <= :now");
        Ok(self
            .fenced(key, attempt, &[InProgress], extra, update, values)
            .await?
            .is_ok())
    }
}

#[async_trait]
impl FollowOnStore for DynamoDbStore {
    async fn complete_and_enqueue(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.complete_from(
            key,
            attempt,
            &[InProgress, Unknown, NotPerformed],
            response,
            None,
            jobs,
        )
        .await
    }

    async fn resolve_and_enqueue(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.complete_from(key, attempt, &[Unknown], response, Some(note), jobs)
            .await
    }

    async fn lease_jobs(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<Job>, StoreError> {
        let Some(names) = lease_names(names, limit) else {
            return Ok(Vec::new());
        };
        let now = self.now();
        let mut due: Vec<Job> = Vec::new();
        for item in self
            .due(
                layout::DUE_INDEX,
                "dq = :s AND nr <= :now",
                attr::NEXT_RUN,
                usize::MAX,
                now,
            )
            .await?
        {
            let job = items::job(&item)?;
            if names.contains(&job.id.name.as_str()) {
                due.push(job);
            }
        }
        due.sort_by_key(due_order);
        let mut leased = Vec::new();
        for job in due {
            if leased.len() >= limit {
                break;
            }
            use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
            // Still live and due at the write: of two dispatchers, the
            // first write moves `nr` past now, and the second's condition
            // refuses.
            let sent = self
                .client
                .update_item()
                .table_name(&*self.table)
                .set_key(Some(layout::job_key(&job.id)))
                .condition_expression("attribute_exists(dq) AND nr <= :now")
                .update_expression("SET ja = :ja, rn = rn + :one, nr = :nr, ua = :now")
                .expression_attribute_values(":now", num(micros(now)))
                .expression_attribute_values(":ja", num(attempt.get()))
                .expression_attribute_values(":one", num(1))
                .expression_attribute_values(":nr", num(micros(now + lease)))
                .return_values(ReturnValue::AllNew)
                .send()
                .await;
            match sent {
                Ok(done) => leased.push(items::job(&done.attributes.unwrap_or_default())?),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                    _ => return Err(self.err(e)),
                },
            }
        }
        sort_leased(&mut leased);
        Ok(leased)
    }

    async fn finish_job(&self, id: &JobId, attempt: Attempt) -> Result<(), StoreError> {
        // Kept as long as its operation's record (current or superseded):
        // until its retention ends, or until the next purge when it is gone
        // already.
        let kept = match self.lookup(&id.tenant, &id.reference).await? {
            Some(record) => record.retain_until,
            None => self.now(),
        };
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":ku", num(micros(kept)))
            .set(":tt", num(ttl_secs(kept)))
            .set(":shard", num(shard(id.reference.as_bytes()[0])));
        let update = "SET dl = :now, ku = :ku, ua = :now, xq = :shard, xk = :ku, tt = :tt \
                      REMOVE ja, dq";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn retry_job(
        &self,
        id: &JobId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":nr", num(micros(now + delay)))
            .set(":er", AttributeValue::S(error.to_owned()));
        let update = "SET nr = :nr, er = :er, ua = :now REMOVE ja";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn bury_job(&self, id: &JobId, attempt: Attempt, error: &str) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":dead", AttributeValue::Bool(true))
            .set(":er", AttributeValue::S(error.to_owned()));
        let update = "SET dd = :dead, er = :er, ua = :now REMOVE ja, dq";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        let mut found = Vec::new();
        for item in self.scan(&[layout::JOB_TAG], None).await? {
            let job = items::job(&item)?;
            if filter.matches(&job) {
                found.push(job);
            }
        }
        found.sort_by_key(listing_order);
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn redrive_job(&self, id: &JobId) -> Result<bool, StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":dead", AttributeValue::Bool(true))
            .set(":zero", num(0))
            .set(":shard", num(shard(id.reference.as_bytes()[0])));
        // Job::redrive's fields: the runs added to the earlier runs (rb),
        // the last error kept as the error before the re-drive (eb; a dead
        // job always has one, written by bury_job), both read before the
        // update.
        let update = "SET nr = :now, rb = if_not_exists(rb, :zero) + rn, rn = :zero, eb = er, \
                      ua = :now, dq = :shard REMOVE dd, ja, er";
        self.job_update(id, "dd = :dead", update, values).await
    }

    async fn count_due_jobs(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let now = self.now();
        let mut counts = BTreeMap::new();
        for item in self
            .due(
                layout::DUE_INDEX,
                "dq = :s AND nr <= :now",
                attr::NEXT_RUN,
                usize::MAX,
                now,
            )
            .await?
        {
            if let Some(AttributeValue::S(name)) = item.get(attr::NAME) {
                *counts.entry(name.clone()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }

    fn max_follow_ons_per_completion(&self) -> Option<usize> {
        Some(DYNAMODB_MAX_FOLLOW_ONS)
    }

    // A 4 MB transaction, less the record's 400 KB item and 99 jobs' keys.
    fn max_follow_on_bytes_per_completion(&self) -> Option<usize> {
        Some(3 * 1024 * 1024)
    }
}
