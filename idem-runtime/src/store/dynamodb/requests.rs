//! The requests [`DynamoDbStore`] sends: the conditions its writes are
//! made under, the values they carry, and the calls that build and send
//! them (a claim's put, a takeover's transaction, a fenced update, a
//! completion with its jobs, the purge's delete, the index queries).

use super::jobs::job_item;
use super::*;

/// A record that no longer holds its key ([`Record::holds_key`], at `:now`,
/// `:secs` its whole seconds): COMPLETED past its window, NOT_PERFORMED,
/// or (any state) past its retention with its lease run out. The window of
/// an item an earlier version completed late (COMPLETED without `tt`) is
/// its `te`, as [`items::record`] reads it.
pub(super) const FREE: &str = "(st = :np OR (ra <= :now AND lu <= :now) \
                    OR (st = :c AND (ea <= :now \
                    OR (attribute_not_exists(tt) AND te <= :secs))))";

/// The condition a claim's first write takes the key under, in one round
/// trip: no record, or one that no longer holds its key and is replaced
/// whole, its retention over (or the claim offers its very reference).
/// Any other takeover reads the record first ([`takeover`]).
pub(super) fn first_claim() -> String {
    format!("attribute_not_exists(pk) OR ({FREE} AND (ra <= :now OR rf = :rf))")
}

/// A takeover of the record read, the attempt `:old` in state `:st`: still
/// that record, and still not holding its key.
pub(super) fn takeover() -> String {
    format!("ak = :old AND st = :st AND {FREE}")
}

/// The purge's delete of a record: still past its life at the delete
/// ([`Record::is_expired`]).
pub(super) const RECORD_EXPIRED: &str = "ra <= :now AND (st IN (:c, :np) OR lu <= :now)";

/// A fenced change's condition: the attempt owns the record, in one of the
/// states `:s0`, `:s1`, ….
pub(super) fn owned(states: &[RecordStateKind]) -> String {
    let list: Vec<String> = (0..states.len()).map(|i| format!(":s{i}")).collect();
    format!("ak = :ak AND st IN ({})", list.join(", "))
}

/// What a refused fenced change's old item says ([`store::fence`]):
/// `Fenced` when the record is gone or another attempt owns it,
/// `WrongState` when it is in none of `from`; otherwise the old record, for
/// the caller to judge its own extra condition (a lease, a settle period)
/// against.
pub(super) fn fence(
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
pub(super) struct Values(std::collections::HashMap<String, AttributeValue>);

impl Values {
    pub(super) fn set(mut self, name: &str, value: AttributeValue) -> Self {
        self.0.insert(name.to_owned(), value);
        self
    }

    pub(super) fn states(mut self, states: &[RecordStateKind]) -> Self {
        for (i, s) in states.iter().enumerate() {
            self.0.insert(format!(":s{i}"), num(s.code()));
        }
        self
    }

    pub(super) fn into_inner(self) -> Option<std::collections::HashMap<String, AttributeValue>> {
        Some(self.0)
    }
}

/// How a record ends up COMPLETED, whatever state it leaves: its window's
/// end (`ea`) is not moved, so a completion that lands after it (from
/// UNKNOWN or NOT_PERFORMED) frees the key at once. No index is written:
/// the record stays in `leases` where its claim put it, and its TTL (`te`,
/// the claim's retention end in seconds; its window's end on a record an
/// earlier version claimed) deletes it. `lq` is removed for a record
/// claimed before `leases` (absent, removing it writes nothing), and the
/// note of an UNKNOWN or NOT_PERFORMED one (a COMPLETED record reads
/// none), so the item holds what the response was judged beside: its
/// tenant, tool and resolution note.
pub(super) fn completion(note: Option<Option<&str>>) -> String {
    let mut set = String::from("SET st = :c, rs = :rs, ua = :now, tt = te");
    let mut remove = String::from(" REMOVE lq, uq, nt");
    match note {
        Some(Some(_)) => set.push_str(", rv = :rv"),
        Some(None) => remove.push_str(", rv"),
        None => {}
    }
    set + &remove
}

/// The values [`FREE`] reads, at `now`.
pub(super) fn free(now: SystemTime) -> Values {
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
pub(super) fn superseded_item(old: &Item, record: &Record) -> Item {
    let mut item = old.clone();
    for name in [
        attr::LEASE_SHARD,
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

impl DynamoDbStore {
    /// The item of a new claim of `req` under `reference`, at `now`.
    pub(super) fn claimed_item(
        &self,
        req: &ClaimRequest,
        reference: Reference,
        now: SystemTime,
    ) -> Item {
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
        // In the `leases` index from now until its delete: the sweep finds
        // it there when its lease ends, and nothing else moves it (a
        // heartbeat does, by `lu`), so the completion writes no index.
        put(attr::LEASE_SHARD, shard);
        item
    }

    /// One `PutItem` of a claim under `condition`: `Ok(None)` written,
    /// `Ok(Some(old))` refused with the record found.
    pub(super) async fn put_claim(
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
    pub(super) async fn take_over(
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
    pub(super) async fn update(
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
    pub(super) async fn fenced(
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
    pub(super) async fn purge_one(
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

    /// The records with `reference` (of `tenant` only, when given) that
    /// are not past their life, the key's current record first: the one
    /// partition the reference names, read strongly consistent (a status
    /// read right after a claim finds it), its record and superseded items
    /// (jobs sort before them). One query, however many records the table
    /// holds.
    pub(super) async fn by_reference(
        &self,
        reference: &Reference,
        tenant: Option<&str>,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.now();
        let mut values = Values::default()
            .set(":pk", layout::partition_of(reference))
            .set(":r", blob(&[layout::RECORD_TAG]))
            .set(":rf", blob(reference.as_bytes()));
        let filter = match tenant {
            Some(tenant) => {
                values = values.set(":tn", AttributeValue::S(tenant.to_owned()));
                "tn = :tn AND rf = :rf"
            }
            None => "rf = :rf",
        };
        let values = values.into_inner();
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND sk >= :r")
                .filter_expression(filter)
                .set_expression_attribute_values(values.clone())
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            // Past its life, a record reads as purged, whether or not its
            // TTL or the purge has deleted it yet.
            for item in page.items.unwrap_or_default() {
                if items::is_record(&item) {
                    let record = items::record(&item, now)?;
                    if !record.is_expired(now) {
                        found.push(record);
                    }
                }
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                return Ok(found);
            }
        }
    }

    /// Every job of the operation `reference`: the items of its record's
    /// partition whose sort key starts with the job tag and the reference,
    /// read strongly consistent. One query, no scan.
    pub(super) async fn jobs_of(&self, reference: &Reference) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND begins_with(sk, :j)")
                .expression_attribute_values(":pk", layout::partition_of(reference))
                .expression_attribute_values(":j", blob(&layout::jobs_prefix(reference)))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            found.extend(page.items.unwrap_or_default());
            start = page.last_evaluated_key;
            if start.is_none() {
                return Ok(found);
            }
        }
    }

    /// The record of `key`, read strongly consistent.
    pub(super) async fn get(&self, key: &IdempotencyKey) -> Result<Option<Item>, StoreError> {
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
    pub(super) async fn complete_from(
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
                "{} follow-ons for one completion: DynamoDB writes at most {} with it (one \
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
                let id = FollowOnId {
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
    pub(super) async fn due(
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
    pub(super) async fn scan(
        &self,
        tags: &[u8],
        projection: Option<&str>,
    ) -> Result<Vec<Item>, StoreError> {
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

    /// The IN_PROGRESS records whose lease ran out at `now`, at most
    /// `limit`, the earliest lease first: the walk over `leases`, and on a
    /// table created before it, the `lapsed` index too.
    pub(super) async fn lapsed(
        &self,
        limit: usize,
        now: SystemTime,
    ) -> Result<Vec<Item>, StoreError> {
        let mut found = self.walk_leases(limit, now).await?;
        if self.has_lapsed_index().await? {
            let listed = self
                .due(
                    LAPSED_INDEX,
                    "lq = :s AND lu <= :now",
                    attr::LEASE,
                    limit,
                    now,
                )
                .await;
            match listed {
                Ok(listed) => found.extend(listed),
                // Deleted by the operator once it was empty: not read again.
                Err(_) if self.lapsed_index_gone().await? => {}
                Err(e) => return Err(e),
            }
            found.sort_by_key(|item| items::number(item, attr::LEASE).unwrap_or(u64::MAX));
            found.truncate(limit);
        }
        Ok(found)
    }

    /// IN_PROGRESS → UNKNOWN with `note`; with `lapsed`, only if the lease
    /// ran out at the write (`Ok(false)` when a heartbeat kept it alive).
    pub(super) async fn mark(
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
